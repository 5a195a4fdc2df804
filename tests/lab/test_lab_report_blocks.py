"""report.md's boxes in plain Markdown (GitHub renders them; MkDocs' ``!!!``/``???`` showed there
as literal text), and report.html's boxes still the seeds' admonitions and PyMdown details."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import anyio
from markdown_it import MarkdownIt

from perflab.lab.plan import load_plan_text
from perflab.lab.report import ReportContext, render_markdown
from perflab.lab.report.blocks import callout, details, to_pymdown
from perflab.lab.report.html import render_html
from perflab.lab.study import conduct

DISPLAY = {"vllm": "vLLM", "sglang": "SGLang", "trtllm": "TensorRT-LLM"}
A100 = {"accelerators": [{"name": "NVIDIA A100-SXM4-80GB", "memory_total_mib": 81920, "compute_capability": [8, 0],
                          "driver_version": "550.127.05", "kind": "cuda"}] * 8, "host": "sim-host"}
CTX = ReportContext(display=DISPLAY, versions={"vllm": "0.11.0", "sglang": "0.5.5.post1", "trtllm": "1.2.0rc1"},
                    hardware=A100, hardware_spec="sim:a100-80g-x8", simulated=True, time_scale=30.0,
                    stop_reason="the disk filled up", leftovers=("pid 12 still holds port 8000",))


def _report(seed_002, seed_measure, tmp_path: Path) -> tuple[str, str]:
    text, key = seed_002
    plan = load_plan_text(text)
    o = anyio.run(lambda: conduct(plan, seed_measure(key), display=lambda e: DISPLAY.get(e, e)))
    md = render_markdown(o, CTX)
    return md, render_html(md, o, CTX, tmp_path)


def _outside_code(md: str) -> list[str]:
    out, fenced = [], False
    for line in md.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced:
            out.append(line)
    return out


def test_report_md_has_no_mkdocs_only_syntax_and_github_renders_its_boxes(seed_002, seed_measure, tmp_path):
    md, _ = _report(seed_002, seed_measure, tmp_path)
    lines = _outside_code(md)
    assert not [x for x in lines if x.startswith(("!!!", "???"))]
    assert "> [!WARNING]\n> **Simulated study**\n>\n> Every number" in md
    assert "> [!CAUTION]\n> **The study stopped**\n>\n> the disk filled up\n> - pid 12 still holds port 8000" in md
    assert "> [!NOTE]\n> 1. " in md
    assert '<details class="tip" open><summary>Serving Command</summary>\n\n```bash\ntrtllm-serve Qwen/Qwen3-32B' in md
    assert md.count("<details") == md.count("</details>") == md.count("<summary>") > 20

    # a CommonMark renderer (GitHub's Markdown is CommonMark's superset): the callouts are quotes with
    # their bold title, each box holds real code blocks, and no box's syntax is left as text
    page = MarkdownIt("commonmark").render(md)
    assert "<blockquote>\n<p>[!WARNING]\n<strong>Simulated study</strong></p>" in page
    assert re.search(r'<details class="info"><summary>Serving script</summary>\n<pre><code class="language-bash">', page)
    assert re.search(r'<details class="info"><summary>Benchmark result</summary>\n<pre><code>', page)
    assert "???" not in page and "!!!" not in page


def test_report_html_keeps_the_seeds_look(seed_002, seed_measure, tmp_path):
    md, page = _report(seed_002, seed_measure, tmp_path)
    assert '<div class="admonition warning">\n<p class="admonition-title">Simulated study</p>' in page
    assert '<div class="admonition danger">\n<p class="admonition-title">The study stopped</p>' in page
    assert '<div class="admonition note">\n<p class="admonition-title">Note</p>\n<ol>' in page
    assert '<details class="tip" open="open">\n<summary>Serving Command</summary>\n<div class="highlight"><pre>' in page
    assert page.count('<details class="info">\n<summary>') == md.count('<details class="info">') > 20
    assert "[!WARNING]" not in page and "[!NOTE]" not in page and "&lt;details" not in page

    # report.md's forms are the seeds' syntax, block for block
    assert "<details" not in to_pymdown(md) and "> [!" not in to_pymdown(md)


def test_the_forms_turn_back_into_pymdown_exactly():
    assert to_pymdown("\n".join(callout("warning", "Incomplete study", ["Re-run it.", "", "Twice."]))) == (
        '!!! warning "Incomplete study"\n    Re-run it.\n\n    Twice.')
    assert to_pymdown("\n".join(callout("note", None, ["1. a", "2. b"]))) == "!!! note\n    1. a\n    2. b"
    box = details("info", "Serving script", "```bash\nvllm serve m\n\n# </details> in the code\n```")
    assert to_pymdown("x\n" + "\n".join(box) + "\ny") == (
        'x\n??? info "Serving script"\n    ```bash\n    vllm serve m\n\n    # </details> in the code\n    ```\ny')
    assert to_pymdown("\n".join(details("tip", "A & B", "text", open_=True))) == '???+ tip "A & B"\n    text'
    # a quote in a code block stays code
    code = "```\n> [!WARNING]\n> **not a box**\n```"
    assert to_pymdown(code) == code


def test_an_incomplete_study_says_so_in_a_callout(seed_002, seed_measure, tmp_path):
    text, key = seed_002
    plan = load_plan_text(text)
    o = anyio.run(lambda: conduct(plan, seed_measure(key), display=lambda e: DISPLAY.get(e, e)))
    md = render_markdown(dataclasses.replace(o, complete=False), CTX)
    assert "> [!WARNING]\n> **Incomplete study**\n>\n> Some configurations were not measured" in md
