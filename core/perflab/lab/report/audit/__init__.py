"""``perflab audit``: are published benchmark results consistent with themselves?

It reads perflab study directories (``report.json`` and ``report.md``; without them the
results in the study's Store), ``vllm bench serve
--save-result`` JSON files (perflab's ``bench --save-result`` writes the same), and Markdown
study pages in the seeds' format (their "Serving Benchmark Result" blocks, parsed by
:func:`perflab.bench.result.result_blocks_at`, and their tables with ``(+x%)`` changes), and
applies :data:`perflab.lab.report.audit.rules.RULES` to each result and table row. Every report perflab
writes is audited the same way before it is written (:func:`audit_report`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perflab.bench.metrics import BenchMetrics, name_of
from perflab.contract.errors import UsageError
from perflab.lab.report.audit.rules import RULE_NAMES, RULES, ResultView, check_result, check_table_row

__all__ = ["RULES", "RULE_NAMES", "Audit", "Finding", "audit_paths", "audit_report", "audit_written_report", "markdown_section"]

# the per-request lists of a --save-result JSON that the rules use (min/max, exact TPOT)
DETAIL_KEYS = ("latencies", "ttfts", "itls", "output_lens", "errors")


@dataclass(frozen=True)
class Finding:
    rule: str
    where: str  # file:line and what (block, table row, result)
    message: str

    def to_json(self) -> dict[str, str]:
        return {"rule": self.rule, "where": self.where, "message": self.message}


@dataclass(frozen=True)
class Audit:
    sources: tuple[str, ...] = ()
    results: int = 0  # benchmark results checked
    rows: int = 0  # table rows with a change checked
    findings: tuple[Finding, ...] = field(default_factory=tuple)

    @property
    def clean(self) -> bool:
        return not self.findings

    def __add__(self, other: Audit) -> Audit:
        return Audit(self.sources + other.sources, self.results + other.results, self.rows + other.rows,
                     self.findings + other.findings)

    def to_json(self) -> dict[str, Any]:
        return {"clean": self.clean, "sources": list(self.sources), "results_checked": self.results,
                "table_rows_checked": self.rows, "rules": list(RULE_NAMES),
                "findings": [f.to_json() for f in self.findings]}


def _findings(r: ResultView, where: str) -> tuple[Finding, ...]:
    return tuple(Finding(i.rule, where, i.message) for i in check_result(r))


# --------------------------------------------------------------------------- Markdown pages

# a Markdown heading (two to six #) at a line start or, on a page whose newlines were lost,
# after a space; one # is a comment in a script box
_HEADING_RE = re.compile(r"(?:^|(?<=\s))#{2,6}[ \t]+([^\n#`|]+)", re.M)
_ROW_START_RE = re.compile(r"\|")
_ROW_RE = re.compile(r"\|((?:[^|]*\|){2,})")


def _line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def _heading_before(text: str, offset: int) -> str:
    last = None
    for m in _HEADING_RE.finditer(text, 0, offset):
        last = m
    if last is None:
        return ""
    title = last.group(1).strip()
    title = re.split(r"\s+-\s+|\s{2,}", title)[0]  # a page whose newlines were lost (seed 004)
    return title[:60]


def _table_rows(text: str) -> Iterator[tuple[int, list[str]]]:
    """``(offset, cells)`` of every Markdown table row whose cells carry figures.

    Cells may hold ``<br>``-joined lines, or real line breaks in a page whose other newlines
    were lost (seed 004): a row is ``| a | b | c |`` with at least one ``Label: number`` cell,
    read wherever it starts."""
    seen_end = -1
    for m in _ROW_START_RE.finditer(text):
        if m.start() < seen_end:
            continue
        row = _ROW_RE.match(text, m.start())
        if not row:
            continue
        cells = row.group(1).split("|")[:-1]
        # stop at a blank cell pair that joins two rows of a collapsed page ("| |")
        for k, c in enumerate(cells):
            if k and not c.strip():
                cells = cells[:k]
                break
        if len(cells) < 3 or not any(":" in c and re.search(r"\d", c) for c in cells[1:]):
            continue
        seen_end = m.start() + 1 + sum(len(c) + 1 for c in cells)
        yield m.start(), [c.strip() for c in cells]


SECTION_TITLE = "### Consistency check"
_OWN_SECTION_RE = re.compile(re.escape(SECTION_TITLE) + r".*?(?=\n#|\n---\n|\Z)", re.S)


def audit_markdown(text: str, name: str, *, blocks: bool = True) -> Audit:
    """A page's result blocks (``blocks``) and table changes. A perflab report's blocks are
    rendered from its report.json, where each repeat is checked on its own (a block shows
    their mean, for which no identity holds): its page is read for the tables only."""
    from perflab.bench.result import LAYOUT_011, result_blocks_at

    # a perflab report's own findings table quotes numbers: blank it (offsets, lines kept)
    text = _OWN_SECTION_RE.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)
    findings: list[Finding] = []
    found = result_blocks_at(text) if blocks else []
    for i, (offset, metrics) in enumerate(found, 1):
        heading = _heading_before(text, offset)
        where = f"{name}:{_line_of(text, offset)} block {i}" + (f" ({heading})" if heading else "")
        # vLLM 0.11's layout (the seeds): vLLM counted the peak; 0.33's is also perflab's
        counting = "buckets" if metrics.get("block_layout") == LAYOUT_011 else "unknown"
        findings += _findings(ResultView(metrics, printed=True, peak_counting=counting), where)
    rows = 0
    for offset, cells in _table_rows(text):
        checked, issues = check_table_row(cells)
        rows += checked
        label = re.sub(r"[*_]", "", cells[0]).strip()
        heading = _heading_before(text, offset)
        where = f"{name}:{_line_of(text, offset)} table" + (f" ({heading})" if heading else "") + f" row '{label}'"
        findings += [Finding(i.rule, where, i.message) for i in issues]
    return Audit((name,), len(found), rows, tuple(findings))


# --------------------------------------------------------------------------- JSON results


def _is_bench_json(data: Any) -> bool:
    return isinstance(data, Mapping) and name_of(lambda m: m.duration) in data and name_of(lambda m: m.completed) in data


def audit_bench_json(data: Mapping[str, Any], name: str) -> Audit:
    """A ``vllm bench serve --save-result`` JSON (or perflab's, which has a ``perflab`` part)."""
    ours = isinstance(data.get("perflab"), Mapping) and data["perflab"].get("client") != "vllm-bench"
    details = {k: data[k] for k in DETAIL_KEYS if isinstance(data.get(k), list) and data[k]}
    metrics = BenchMetrics.from_json(data)
    num_prompts = metrics.num_prompts if isinstance(metrics.num_prompts, int) else None
    r = ResultView(metrics, peak_counting="exact" if ours else "buckets", num_prompts=num_prompts, details=details or None)
    return Audit((name,), 1, 0, _findings(r, name))


def study_results(report: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any], int | None]]:
    """``(where, metrics, num_prompts)`` of every measurement in a report.json: each repeat on
    its own (``metrics`` is then their mean, which no identity holds for), each load point."""

    def of(where: str, res: Any) -> Iterator[tuple[str, Mapping[str, Any], int | None]]:
        if not isinstance(res, Mapping) or not isinstance(res.get("metrics"), Mapping):
            return
        n = res.get("num_prompts")
        repeats = [x for x in res.get("repeats") or [] if isinstance(x, Mapping)]
        if len(repeats) > 1:
            for k, rep in enumerate(repeats, 1):
                yield f"{where} repeat {k}", rep, n
        else:
            yield where, res["metrics"], n
        for p in res.get("points") or []:
            if not isinstance(p, Mapping):
                continue
            load = ", ".join(f"{k}={v}" for k, v in (p.get("load") or {}).items())
            reps = [x for x in p.get("repeats") or [] if isinstance(x, Mapping)]
            runs: list[Any] = reps if len(reps) > 1 else [p.get("metrics")]
            for k, rep in enumerate(runs, 1):
                if isinstance(rep, Mapping):
                    yield f"{where} load {load}" + (f" repeat {k}" if len(reps) > 1 else ""), rep, None

    for i, step in enumerate(report.get("steps") or []):
        for entry in step.get("entries") or []:
            res = entry.get("result") or {}
            label = entry.get("label") or entry.get("name") or "?"
            for profile, r in (entry.get("results") or {}).items() if isinstance(entry.get("results"), Mapping) else ():
                yield from of(f"step {i + 1} '{label}' {profile}", r)
            yield from of(f"step {i + 1} '{label}'", res)
    for case in report.get("cases") or []:
        prof = case.get("profile") or "?"
        for side in ("baseline", "optimized"):
            yield from of(f"{prof} {side}", case.get(side))
    for side in ("baseline", "optimized"):
        part = report.get(side)
        if isinstance(part, Mapping):
            yield from of(f"{side} '{part.get('label', '')}'", part.get("result"))


def audit_report_json(report: Mapping[str, Any], name: str) -> Audit:
    seen: set[str] = set()
    findings: list[Finding] = []
    count = 0
    for where, metrics, n in study_results(report):
        key = json.dumps(BenchMetrics.of(metrics).to_json(), sort_keys=True)
        if key in seen:  # the same measurement shown in a step, a case and the conclusion
            continue
        seen.add(key)
        count += 1
        # perflab's lab measures with its own client: exact peak concurrency
        findings += _findings(ResultView(BenchMetrics.of(metrics), peak_counting="exact", num_prompts=n),
                              f"{name} {where}")
    return Audit((name,), count, 0, tuple(findings))


def audit_report(report: Mapping[str, Any], markdown: str, name: str = "report") -> Audit:
    """What a report perflab is about to write says about itself: its results and its page."""
    return audit_report_json(report, f"{name}.json") + audit_markdown(markdown, f"{name}.md", blocks=False)


def audit_written_report(markdown: str, report: dict[str, Any]) -> str:
    """Audit a report about to be written: adds ``audit`` to ``report`` (report.json) and
    returns ``markdown`` with its "Consistency check" section before the footer."""
    result = audit_report(report, markdown)
    report["audit"] = result.to_json()
    head, sep, footer = markdown.rpartition("\n---\n")
    section = "\n".join(markdown_section(result))
    return f"{head}\n\n{section}{sep}{footer}" if sep else f"{markdown.rstrip()}\n\n{section}"


def markdown_section(audit: Audit) -> list[str]:
    """The report's "Consistency check" section."""
    out = [SECTION_TITLE, ""]
    what = f"{audit.results} benchmark results and {audit.rows} table changes"
    if audit.clean:
        out.append(f"`perflab audit` found no inconsistency in {what} ({', '.join(RULE_NAMES)}).")
    else:
        out += [f"`perflab audit` found {len(audit.findings)} inconsistencies in {what}:", "",
                "| Rule | Where | Finding |", "|------|-------|---------|"]
        out += [f"| {f.rule} | {f.where} | {f.message} |" for f in audit.findings]
    return [*out, ""]


# --------------------------------------------------------------------------- paths


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from None


def audit_store(path: Path) -> Audit:
    """A study without a written report (still running, or never reported): its results and
    page as `perflab report` would write them, built in memory from the Store (study.db)."""
    import anyio

    from perflab.lab.report import build_json, render_markdown, report_context
    from perflab.lab.report.stored import stored_outcome
    from perflab.lab.store import Store

    store = Store.open_existing(path)  # a one-line UsageError when it is no study
    try:
        outcome = anyio.run(stored_outcome, store)
        ctx = report_context(store)
        data = json.loads(json.dumps(build_json(outcome, ctx)))
        markdown = render_markdown(outcome, ctx)
    finally:
        store.close()
    return audit_report(data, markdown, name=str(path / "report"))


def audit_path(path: Path) -> Audit:
    if path.is_dir():
        report = path / "report.json"
        if not report.is_file():
            return audit_store(path)
        out = audit_path(report)
        md = path / "report.md"
        return out + (audit_markdown(_read(md), str(md), blocks=False) if md.is_file() else Audit())
    if not path.exists():
        raise UsageError(f"cannot read {path}: no such file or directory")
    text = _read(path)
    if path.suffix.lower() == ".json":
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise UsageError(f"{path}: not valid JSON ({exc})") from None
        if _is_bench_json(data):
            return audit_bench_json(data, str(path))
        if isinstance(data, Mapping) and ("steps" in data or "cases" in data):
            return audit_report_json(data, str(path))
        raise UsageError(f"{path}: neither a vllm bench serve result (no 'duration'/'completed') nor a perflab report.json")
    return audit_markdown(text, str(path))  # a page with nothing to check counts 0 results


def audit_paths(paths: Iterable[Path | str]) -> Audit:
    out = Audit()
    for p in paths:
        out = out + audit_path(Path(p))
    return out
