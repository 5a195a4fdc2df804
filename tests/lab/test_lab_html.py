"""report.html: seed 002's study with load curves and the watched summaries and series of
issue #13 (the agreed shape, written here), opened in a real headless Chromium with the network
blocked: every chart renders, nothing is fetched, the report's headings are there, and it prints
without cutting anything."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import anyio
import pytest
from seedkit import SEED_002_PLAN, SeedMeasure, seed_002_key

from perflab.contract.status import Status
from perflab.lab.options import Configuration
from perflab.lab.plan import Profile, load_plan_text
from perflab.lab.report import ReportContext
from perflab.lab.report.html import HTML_NAME, observe_files
from perflab.lab.report.publish import write_report
from perflab.lab.study import ConfigResult, conduct

DISPLAY = {"vllm": "vLLM", "sglang": "SGLang", "trtllm": "TensorRT-LLM"}
A100 = {"accelerators": [{"name": "NVIDIA A100-SXM4-80GB", "memory_total_mib": 81920, "compute_capability": [8, 0],
                          "driver_version": "550.127.05", "kind": "cuda"}] * 8, "host": "sim-host"}
CTX = ReportContext(display=DISPLAY, versions={"vllm": "0.11.0", "sglang": "0.5.5.post1", "trtllm": "1.2.0rc1"},
                    hardware=A100, hardware_spec="sim:a100-80g-x8", simulated=True, time_scale=30.0)
CONCURRENCY = (8, 32, 128)  # the main profile's load curve

# Chromium's flags that work in a container without a display, a GPU, a sandbox or a network
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="session")
def chromium() -> str:
    """Debian's Chromium (apt-get install -y chromium); Playwright drives it, it never downloads one."""
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.fail("chromium is not installed: `apt-get install -y chromium` (report.html's browser test needs it)",
                    pytrace=False)
    return path


class Watched:
    """Seed 002's measurements, each with what the watchers of issue #13 would have added: the
    summaries (the agreed shape) in ``observed``, the samples in the run directory, and on the
    main profile a load curve (three concurrencies, one samples file each)."""

    def __init__(self, study: Path) -> None:
        self.base = SeedMeasure(seed_002_key)
        self.study = study
        self.runs = 0

    async def __call__(self, config: Configuration, profiles: list[Profile], *, step: str, label: str,
                       to_beat: float | None = None) -> dict[str, ConfigResult]:
        out = await self.base(config, profiles, step=step, label=label)
        self.runs += 1
        run = f"runs/{self.runs:03d}-{config.engine}"
        (self.study / run).mkdir(parents=True)
        for name, res in out.items():
            if res.status is not Status.OK:
                continue
            res.run_dir = run
            tps = res.tps or 0.0
            kv = min(0.97, tps / 3000)
            preempt = 412 if config.engine == "vllm" and "max_batched_tokens" not in config.options else 0
            res.observed = {
                "server_metrics": {"source": "/metrics", "samples": 40, "kv_cache_usage": {"peak": kv, "mean": kv * .8},
                                   "running": {"peak": 128, "mean": 97.5}, "waiting": {"peak": 30, "mean": 4.2},
                                   "preemptions": preempt,
                                   # TensorRT-LLM exports no prefix-cache hit rate here: null, shown as such
                                   "prefix_cache_hit_rate": None if config.engine == "trtllm" else 0.63,
                                   "spec_decode_acceptance": None},
                "telemetry": {"source": "nvml", "samples": 40, "devices": list(range(8)),
                              "power_w": {"mean": 2400.0 + tps / 10, "peak": 3100.0},
                              "utilization_pct": {"mean": 88.0, "peak": 100.0}, "memory_used_mib": {"peak": 620000.0},
                              "sm_clock_mhz": {"mean": 1410.0}},
                "energy": {"joules": 123456.7, "output_tokens_per_joule": tps / 2600},
            }
            if name == "sharegpt":
                res.points = [{"load": {"max_concurrency": c},
                               "metrics": {**res.metrics, "total_token_throughput": tps * c / 128,
                                           "output_throughput": tps * c / 256, "mean_ttft_ms": 50.0 + c,
                                           "mean_tpot_ms": 20.0 + c / 2},
                               "slo_met": None} for c in CONCURRENCY]
                for c in CONCURRENCY:
                    self._samples(run, f"observe-{name}-max_concurrency-{c}.json", kv * c / 128, c)
            else:
                self._samples(run, f"observe-{name}.json", kv, 64)
        return out

    def _samples(self, run: str, file: str, kv: float, running: int) -> None:
        series = {"server_metrics": [{"t": float(t), "values": {"kv_cache_usage": kv * min(1.0, t / 5), "running": running,
                                                                 "waiting": max(0, 10 - t), "preemptions_total": t * 3}}
                                     for t in range(12)],
                  # per device, as "<name>.<device index>"
                  "telemetry": [{"t": float(t), "values": {**{f"power_w.{d}": 250.0 + 5 * t for d in range(8)},
                                                           **{f"utilization_pct.{d}": 90.0 for d in range(8)}}}
                                for t in range(12)]}
        (self.study / run / file).write_text(json.dumps(series))


def _study(tmp_path: Path, measure: Any = None) -> tuple[Any, dict[str, Path]]:
    plan = load_plan_text(SEED_002_PLAN)
    measure = measure or Watched(tmp_path)
    o = anyio.run(lambda: conduct(plan, measure, display=lambda e: DISPLAY.get(e, e)))
    return o, write_report(o, CTX, tmp_path)


def _md_headings(md: str) -> list[str]:
    """report.md's headings, outside its code blocks (``# Load ...`` lines in result blocks are comments)."""
    out, fenced = [], False
    for line in md.splitlines():
        if line.strip().startswith("```"):
            fenced = not fenced
        elif not fenced and (m := re.match(r"^(#{1,4}) (.+)$", line)):
            out.append(m[2].strip())
    return out


def _open(chromium: str, page_path: Path, check: Any) -> Any:
    """Open ``page_path`` in headless Chromium with every request but the page itself refused;
    ``check(page)``'s value, with the requests that tried to leave and the console's errors."""
    from playwright.sync_api import sync_playwright

    url = page_path.resolve().as_uri()
    left: list[str] = []
    errors: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(viewport={"width": 1280, "height": 900})

            def gate(route: Any) -> None:
                if route.request.url == url:
                    route.continue_()
                else:
                    left.append(route.request.url)
                    route.abort()

            context.route("**/*", gate)
            page = context.new_page()
            page.on("request", lambda r: None if r.url == url or r.url.startswith("data:") else left.append(r.url))
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(url, wait_until="load")
            value = check(page)
        finally:
            browser.close()
    return value, sorted(set(left)), errors


CHARTS_JS = """() => ({
  images: [...document.images].map(i => ({alt: i.alt, complete: i.complete, width: i.naturalWidth,
                                           height: i.naturalHeight, data: i.src.startsWith('data:')})),
  svgs: [...document.querySelectorAll('svg')].map(s => s.getBoundingClientRect().width * s.getBoundingClientRect().height),
  headings: [...document.querySelectorAll('h1, h2, h3, h4')].map(h => h.textContent.trim()),
  links: [...document.querySelectorAll('[href], [src]')].map(e => e.getAttribute('href') || e.getAttribute('src'))
                                                         .filter(u => !u.startsWith('#') && !u.startsWith('data:')),
})"""

PRINT_JS = """() => {
  // print CSS alone shows a collapsed box's content (::details-content); the script then opens them
  const collapsed = [...document.querySelectorAll('details:not([open])')];
  const shown = collapsed.filter(d => d.getBoundingClientRect().height > 1.5 * d.querySelector('summary').getBoundingClientRect().height).length;
  window.dispatchEvent(new Event('beforeprint'));
  const width = document.documentElement.clientWidth;
  const over = [...document.querySelectorAll('img, figure, table, pre')]
    .filter(e => e.getBoundingClientRect().right > width + 1)
    .map(e => e.tagName + ' ' + (e.alt || e.textContent.slice(0, 40)));
  return {over, scroll: document.documentElement.scrollWidth, width, collapsed: collapsed.length, shown,
          closed: document.querySelectorAll('details:not([open])').length,
          details: document.querySelectorAll('details').length};
}"""


@pytest.mark.slow  # about 6 s: the charts and a browser
def test_report_html_renders_in_chromium(tmp_path, chromium):
    o, paths = _study(tmp_path)
    assert paths["html"] == tmp_path / HTML_NAME and "pareto" in paths
    md = paths["markdown"].read_text()

    def check(page: Any) -> Any:
        seen = page.evaluate(CHARTS_JS)
        # printed on A4 (190 mm between the margins at 96 dpi): nothing wider than the page
        page.emulate_media(media="print")
        page.set_viewport_size({"width": 718, "height": 1000})
        printed = page.evaluate(PRINT_JS)
        pdf = page.pdf(format="A4")
        return seen, printed, pdf

    (seen, printed, pdf), left, errors = _open(chromium, paths["html"], check)
    assert left == [], f"the page tried to fetch {left}"
    assert errors == [], errors
    assert seen["links"] == []  # nothing refers outside the page

    # every chart rendered: chart.png, pareto.png, the load curve, and per profile the engine
    # metrics and the telemetry over time (5 profiles × 2 watchers)
    images = seen["images"]
    broken = [i["alt"] for i in images if not (i["complete"] and i["width"] > 0 and i["height"] > 0 and i["data"])]
    assert broken == []
    alts = [i["alt"] for i in images]
    assert alts[0] == "seed-002" and "Pareto frontier" in alts and "Load curves: ShareGPT" in alts
    over_time = [a for a in alts if " over time: " in a]
    assert len(over_time) == 10 and "Engine metrics over time: Very Long Prompt" in over_time
    assert all(area > 0 for area in seen["svgs"])

    # report.md's headings, in report.md's order, then the page's own sections
    heads = seen["headings"]
    wanted = _md_headings(md)
    assert len(wanted) > 15 and wanted[0] == "Optimizing Qwen3-32B Throughput on NVIDIA A100 GPUs"
    positions = [heads.index(h) for h in wanted]
    assert positions == sorted(positions)
    assert heads.index("Other Benchmark Cases") < heads.index("Load Curves") < heads.index("Engine Metrics and Telemetry")
    for h in ("Load Curves", "Engine Metrics and Telemetry", "Engine metrics (source: /metrics)",
              "Accelerator telemetry (source: nvml; devices: 0, 1, 2, 3, 4, 5, 6, 7)", "Energy"):
        assert h in heads, h
    assert not any(h.startswith("Cost") for h in heads)  # no cost in the plan: no section

    assert printed["over"] == [] and printed["scroll"] <= printed["width"] + 1, printed
    assert printed["details"] > 20 and printed["closed"] == 0  # printing opens every collapsed box
    assert printed["collapsed"] > 20 and printed["shown"] == printed["collapsed"]
    assert pdf.startswith(b"%PDF") and len(pdf) > 50_000


@pytest.mark.slow  # about 3 s on an idle machine: ten series charts
def test_report_html_tables_and_absent_keys(tmp_path):
    """The summaries' figures as the agreed shape has them (a null is a dash), and nothing at all
    for what no result has: a study without watchers has neither section."""
    o, paths = _study(tmp_path)
    page = paths["html"].read_text()
    assert "<th>kv cache usage peak</th>" in page and "<th>power (W) mean</th>" in page
    assert "<th>memory used (MiB) peak</th>" in page and "<th>output tokens per joule</th>" in page
    assert "<td>412</td>" in page  # vLLM's preemptions
    def row(label: str) -> str:
        m = re.search(rf"<tr>\s*<td>{re.escape(label)}</td>(.*?)</tr>", page, re.S)
        assert m, label
        return m[1]

    assert "<td>0.630</td>" in row("vLLM")  # the prefix-cache hit rate
    assert "<td>–</td>" in row("TensorRT-LLM") and "<td>–</td>" not in row("vLLM")  # TensorRT-LLM's: null, a dash
    assert "<td>412</td>" in row("Baseline: vLLM without any optimizations")
    assert "spec decode" not in page  # null everywhere: not exported by any engine, no column
    assert not re.search(r"""(src|href)=["'](?!data:|#)""", page)  # nothing but data: URIs and anchors
    # the main profile's samples files, lowest load first
    run = tmp_path / "runs" / "001-vllm"
    assert [p.name for p in observe_files(run, "sharegpt")] == [f"observe-sharegpt-max_concurrency-{c}.json"
                                                                 for c in CONCURRENCY]

    plain = tmp_path / "plain"
    plain.mkdir()
    _, paths = _study(plain, SeedMeasure(seed_002_key))
    page = paths["html"].read_text()
    assert "Engine Metrics and Telemetry" not in page and "Load Curves" not in page and "Engine metrics" not in page
    assert page.count("<img ") == 1  # chart.png only


def test_missing_chart_is_said_not_broken(tmp_path):
    """A chart that is not beside the report (deleted, or report.md copied elsewhere) is named, not a broken image."""
    from perflab.lab.report.html import render_html

    o, paths = _study(tmp_path, SeedMeasure(seed_002_key))
    (tmp_path / "chart.png").unlink()
    page = render_html(paths["markdown"].read_text(), o, CTX, tmp_path)
    assert "<img " not in page and "[seed-002: chart.png is missing]" in page


SWEEP_PLAN = """
name: tiny-sweep
model: Qwen/Qwen3-8B
hardware: sim:a100-80g-x8
simulation: {time_scale: 50}
engines: [vllm]
slo: {tpot_ms: 30, percentile: 99}
profiles:
  main: {label: Main, input_len: 64, output_len: 16, num_prompts: 12, sweep: {max_concurrency: [2, 8]}}
timeouts: {startup_s: 60, benchmark_s: 120}
"""


@pytest.mark.slow  # about 8 s: a simulated study, then a browser
def test_run_and_report_html_on_the_simulator(tmp_path, chromium, capsys):
    """`perflab run` writes report.html; `perflab report DIR --html` rewrites it and prints its path;
    the page of a real (simulated) study with a load sweep renders in Chromium."""
    from simstudy import run_sim_study

    from perflab.cli import main

    out = tmp_path / "study"
    summary = run_sim_study(SWEEP_PLAN, out)
    assert summary.report["html"] == out / HTML_NAME and summary.report["html"].is_file()
    (out / HTML_NAME).unlink()

    capsys.readouterr()
    main(["report", str(out), "--html"])
    assert capsys.readouterr().out.strip() == str(out / HTML_NAME) and (out / HTML_NAME).is_file()
    with pytest.raises(SystemExit) as exc:
        main(["report", str(out), "--html", "--json"])
    err = capsys.readouterr().err
    assert exc.value.code != 0 and err.count("\n") == 1 and "choose one" in err  # one line

    seen, left, errors = _open(chromium, out / HTML_NAME, lambda page: page.evaluate(CHARTS_JS))
    assert left == [] and errors == []
    # (the simulated engines' metrics and accelerators' telemetry, issue #13, are sampled in every study)
    assert [i["alt"] for i in seen["images"]] == ["tiny-sweep", "Pareto frontier", "Load curves: Main",
                                                  "Engine metrics over time: Main",
                                                  "Accelerator telemetry over time: Main"]
    assert all(i["complete"] and i["width"] > 0 for i in seen["images"])
    assert "Mean TPOT (ms), p99 TPOT (ms) against the max concurrency" in (out / HTML_NAME).read_text()  # the SLO's panel
    heads = _md_headings((out / "report.md").read_text())
    assert seen["headings"][:len(heads)] == heads and seen["headings"][len(heads)] == "Load Curves"


def test_names_and_devices():
    """Figures are named from the agreed keys with their units; a sample's per-device values
    become one mean per quantity (one line per configuration, whatever the accelerators)."""
    from perflab.lab.report.html import flatten, header, per_device_mean

    assert header("power_w.mean") == "power (W) mean" and header("kv_cache_usage.peak") == "kv cache usage peak"
    assert header("memory_used_mib.peak") == "memory used (MiB) peak" and header("preemptions") == "preemptions"
    assert header("power_w per device") == "power (W) per device"
    assert per_device_mean({"power_w.0": 100.0, "power_w.1": 300.0, "utilization_pct.0": 50.0, "running": 3.0,
                            "engine_t": 12.5}) == \
        {"running": 3.0, "power_w per device": 200.0, "utilization_pct per device": 50.0}
    summary = {"source": "nvml", "samples": 3, "devices": [0], "power_w": {"mean": 1.0, "peak": 2.0}, "sm_clock_mhz": None}
    assert list(flatten(summary)) == [("power_w.mean", 1.0), ("power_w.peak", 2.0), ("sm_clock_mhz", None)]


def test_text_that_looks_like_html_stays_text(tmp_path):
    """report.md's coloured spans and <br> are HTML; a crash line's `<frozen runpy>` or an
    engine's `<script>` is text (shown, never run: the page's CSP allows its own script only)."""
    from perflab.lab.report.html import render_html

    o, paths = _study(tmp_path, SeedMeasure(seed_002_key))
    md = paths["markdown"].read_text().replace(
        "## Optimization Objective",
        '| a |\n|---|\n| Crash: File "<frozen runpy>", line 1 <script>alert(1)</script> |\n\n## Optimization Objective')
    page = render_html(md, o, CTX, tmp_path)
    assert 'File "&lt;frozen runpy&gt;", line 1 &lt;script&gt;alert(1)&lt;/script&gt;' in page
    assert '<span style="background-color:lightgreen;">(+18.7%)</span><br>' in page
    assert page.count("<script>") == 1 and "script-src 'sha256-" in page and not re.search(r"script-src[^;\"]*unsafe-inline", page)


CHARTS_NOTE = "charts need `pip install 'perflab[charts]'`"


def test_report_without_matplotlib_says_what_its_charts_need(tmp_path, monkeypatch):
    """matplotlib made unimportable (perflab installed without its charts extra): the report is
    written; where chart.png and pareto.png would be, report.md and report.html say in one line
    what draws them; report.html's own charts (load curves, samples over time) need no matplotlib."""
    import sys

    for name in ["matplotlib", *(m for m in sys.modules if m.startswith("matplotlib."))]:
        monkeypatch.setitem(sys.modules, name, None)
    (tmp_path / "chart.png").write_bytes(b"an earlier run's chart")  # would show other figures: removed
    _, paths = _study(tmp_path)
    assert set(paths) == {"markdown", "json", "html"}
    assert not (tmp_path / "chart.png").exists() and not (tmp_path / "pareto.png").exists()
    md = paths["markdown"].read_text()
    assert "](chart.png)" not in md and "](pareto.png)" not in md
    lines = [line for line in md.splitlines() if CHARTS_NOTE in line]
    assert lines == [f"*seed-002: {CHARTS_NOTE}*", f"*Pareto frontier: {CHARTS_NOTE}*"]
    page = paths["html"].read_text()
    assert page.count("charts need <code>pip install 'perflab[charts]'</code>") == 2
    assert "is missing]" not in page
    svgs = re.findall(r'<img src="data:image/svg\+xml;base64,[^"]+" alt="([^"]+)"', page)
    assert "Load curves: ShareGPT" in svgs and len([a for a in svgs if " over time: " in a]) == 10


def test_png_charts_are_drawn_again_only_when_their_figures_change(tmp_path, monkeypatch):
    """chart.png carries the digest of what it was drawn from: writing the report of the same
    figures again (a re-run of a finished study, `perflab report` twice) draws nothing."""
    import dataclasses

    import matplotlib.figure

    from perflab.lab.report.chart import DIGEST_KEY, png_text

    o, paths = _study(tmp_path, SeedMeasure(seed_002_key))
    first, digest = paths["chart"].read_bytes(), png_text(paths["chart"])[DIGEST_KEY]
    assert len(digest) == 64

    def no_drawing(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("chart.png was drawn again for the same figures")

    with monkeypatch.context() as m:
        m.setattr(matplotlib.figure, "Figure", no_drawing)
        assert write_report(o, CTX, tmp_path)["chart"].read_bytes() == first
    again = write_report(o, dataclasses.replace(CTX, simulated=False), tmp_path)  # its title changes
    assert again["chart"].read_bytes() != first and png_text(again["chart"])[DIGEST_KEY] != digest
