"""``report.html``: the study's report as one self-contained page, readable offline and printable.

One source of truth: the page is report.md's own Markdown (:func:`perflab.lab.report.render_markdown`)
rendered by Python-Markdown (tables; report.md's GitHub callouts and ``<details>`` boxes as the
seeds' admonitions and PyMdown's collapsible ``???`` blocks, through
:func:`perflab.lab.report.blocks.to_pymdown`, with fenced code inside them), plus what a page can show and Markdown cannot: the load curves of the
profiles measured at several loads, and per profile the engine metrics and accelerator telemetry
sampled while each configuration ran (issue #13; the summaries of
:data:`perflab.observe.OBSERVED_KEYS` from the results, the series from
``runs/<run>/observe-<profile><suffix>.json``). Nothing is fetched: the CSS is inline, chart.png
and pareto.png are embedded as data: URIs, the other charts are SVG data: URIs written without a
plotting library (:mod:`perflab.lab.report.svgchart`), and the only script opens the collapsed
boxes for printing.
"""

from __future__ import annotations

import base64
import glob
import hashlib
import html
import json
import mimetypes
import re
from collections.abc import Iterator, Mapping, Sequence
from importlib import resources
from pathlib import Path
from string import Template
from typing import TYPE_CHECKING, Any
from xml.etree import ElementTree

import markdown
from markdown.extensions import Extension
from markdown.inlinepatterns import HTML_RE, HtmlInlineProcessor
from markdown.treeprocessors import Treeprocessor

from perflab import redact
from perflab.bench.metrics import name_of
from perflab.lab.decide import LoadKind
from perflab.lab.report.blocks import to_pymdown
from perflab.lab.store import file_stem
from perflab.observe import OBSERVED_KEYS, Sample, timed_run
from perflab.observe.telemetry import ENGINE_T

if TYPE_CHECKING:
    from perflab.lab.report import ReportContext
    from perflab.lab.study import ConfigResult, StudyOutcome

HTML_NAME = "report.html"

#: Python-Markdown extensions for report.md's syntax (its boxes in PyMdown's, blocks.to_pymdown): pipe
#: tables, ``!!! note`` admonitions, ``??? info "title"`` collapsible boxes (pymdownx.details) holding fenced code (pymdownx.superfences),
#: heading ids and the table of contents (toc)
MD_EXTENSIONS: tuple[str, ...] = ("tables", "admonition", "pymdownx.details", "pymdownx.superfences", "toc")

#: the inline HTML tags report.md's text may use (its coloured changes, line breaks in table
#: cells); any other ``<...>`` in the text (``File "<frozen runpy>"`` in a crash line, an engine's
#: ``<script>``) is shown as text, never interpreted
INLINE_TAGS = frozenset({"span", "br", "b", "strong", "i", "em", "code", "sub", "sup", "small", "mark", "s", "del",
                         "ins", "kbd"})

#: the load curves' panels: (the benchmark's metric, axis label); with an SLO, its percentiles follow
LOAD_FIGURES: tuple[tuple[str, str], ...] = (
    (name_of(lambda m: m.total_token_throughput), "Total token throughput (tok/s)"),
    (name_of(lambda m: m.mean_ttft_ms), "Mean TTFT (ms)"),
    (name_of(lambda m: m.mean_tpot_ms), "Mean TPOT (ms)"),
)

#: how the report names each watched key (perflab.observe.OBSERVED_KEYS; others by their key)
TITLES: Mapping[str, str] = {"server_metrics": "Engine metrics", "telemetry": "Accelerator telemetry",
                             "energy": "Energy", "cost": "Cost"}

#: what a summary says about itself rather than a measured figure: shown in the table's caption
_META = ("source", "samples", "devices", "currency")

#: unit suffixes of the summaries' and series' names (``power_w``, ``utilization_pct``)
_UNITS: Mapping[str, str] = {"_w": "W", "_pct": "%", "_mib": "MiB", "_mhz": "MHz", "_ms": "ms", "_s": "s"}

#: most panels of one series chart (the samples file keeps the rest)
MAX_PANELS = 12


# --------------------------------------------------------------------------- the page


def render_html(markdown_text: str, o: StudyOutcome, ctx: ReportContext, directory: Path) -> str:
    """The page for report.md's text ``markdown_text`` of the study in ``directory``."""
    from perflab import __version__
    from perflab.lab.report import title_of

    body, sep, footer = markdown_text.rpartition("\n---\n")  # the footer stays last
    if not sep:
        body, footer = markdown_text, ""
    extra = [*load_curves_section(o, ctx), *observed_section(o, ctx, directory)]
    text = to_pymdown(body.rstrip("\n")) + "\n\n" + "\n".join(extra) + (f"\n---\n{footer}" if sep else "")
    md = markdown.Markdown(extensions=[*MD_EXTENSIONS, _EmbedImages(directory), _InlineTags()],
                           extension_configs={"toc": {"toc_depth": "2-3"}})
    content = md.convert(text)
    source = resources.files("perflab.lab.report").joinpath("templates/report.html").read_text(encoding="utf-8")
    # the page's own script is the only one allowed to run (by its hash, in the page's CSP)
    script = re.search(r"<script>(.*?)</script>", source, re.S)
    if script is None:
        raise RuntimeError("perflab's templates/report.html lost its print script (a broken install?)")
    digest = base64.b64encode(hashlib.sha256(script[1].encode("utf-8")).digest()).decode("ascii")
    page = Template(source).substitute(title=html.escape(title_of(o, ctx)), toc=md.toc,  # type: ignore[attr-defined]
                                       body=content, generator=html.escape(f"perflab {__version__}"),
                                       script_hash=f"sha256-{digest}")
    return redact.scrub(page)


def write_html(markdown_text: str, o: StudyOutcome, ctx: ReportContext, directory: Path) -> Path:
    """Write ``report.html`` into ``directory`` atomically; return its path."""
    from perflab.lab.store import write_atomic

    return write_atomic(directory / HTML_NAME, render_html(markdown_text, o, ctx, directory))


class _EmbedImagesProcessor(Treeprocessor):
    """Every ``<img>`` of the Markdown (chart.png, pareto.png, front.svg) becomes a data: URI of the file
    beside the report; one that is not there (or not a local file) becomes its alt text."""

    def __init__(self, md: markdown.Markdown, directory: Path) -> None:
        super().__init__(md)
        self.directory = directory

    def run(self, root: ElementTree.Element) -> None:
        for img in root.iter("img"):
            src = img.get("src", "")
            if src.startswith("data:"):
                continue
            path = self.directory / src
            if "://" not in src and not src.startswith("/") and path.is_file():
                img.set("src", data_uri(path.read_bytes(), mimetypes.guess_type(path.name)[0] or "image/png"))
                continue
            alt = img.get("alt") or src
            img.tag, img.text = "em", f"[{alt}: {src} is missing]"
            img.attrib.clear()


class _EmbedImages(Extension):
    def __init__(self, directory: Path) -> None:
        super().__init__()
        self.directory = directory

    def extendMarkdown(self, md: markdown.Markdown) -> None:  # noqa: N802 (Python-Markdown's name)
        md.treeprocessors.register(_EmbedImagesProcessor(md, self.directory), "perflab-embed-images", 1)  # after inline


class _InlineTagsProcessor(HtmlInlineProcessor):
    """Python-Markdown's inline HTML, for :data:`INLINE_TAGS` only; any other tag stays text."""

    # InlineProcessor's signature, which its stubs declare over Pattern's with the same ignore
    def handleMatch(  # type: ignore[override]  # noqa: N802 (its name)
            self, m: re.Match[str], data: str) -> tuple[Any, int | None, int | None]:
        tag = re.match(r"</?([A-Za-z][A-Za-z0-9]*)", m.group(1))
        if tag is not None and tag[1].lower() in INLINE_TAGS:
            return super().handleMatch(m, data)
        return m.group(1), m.start(0), m.end(0)  # as text: escaped when written


class _InlineTags(Extension):
    def extendMarkdown(self, md: markdown.Markdown) -> None:  # noqa: N802
        md.inlinePatterns.register(_InlineTagsProcessor(HTML_RE, md), "html", 90)  # replaces the built-in one


def data_uri(data: bytes | str, mime: str) -> str:
    raw = data.encode("utf-8") if isinstance(data, str) else data
    return f"data:{mime};base64,{base64.b64encode(raw).decode('ascii')}"


def figure(svg: str, caption: str, alt: str) -> str:
    """A chart as Markdown's raw HTML: an SVG data: URI with its caption."""
    return (f'<figure><img src="{data_uri(svg, "image/svg+xml")}" alt="{html.escape(alt)}">'
            f"<figcaption>{html.escape(caption)}</figcaption></figure>")


# --------------------------------------------------------------------------- load curves


def load_curves_section(o: StudyOutcome, ctx: ReportContext) -> list[str]:
    """Per profile measured at several loads (a sweep, a max-load search's probes): the
    benchmark's figures against the load, one line per configuration."""
    from perflab.lab.report import results_by_profile
    from perflab.lab.report.svgchart import load_curves_svg
    from perflab.lab.study import slo_label

    slo = o.plan.decision.slo
    figures: list[tuple[str, str, float | None]] = [(k, y, None) for k, y in LOAD_FIGURES]
    if slo:
        figures += [(slo.metric_key(k), f"{slo_label(k, slo.percentile)} (ms)", v) for k, v in slo.limits().items()]
    out: list[str] = []
    by_profile = results_by_profile(o)
    for prof in o.plan.profiles:
        curves = [(label, res.points) for label, _, res in by_profile[prof.name]
                  if res.status.measured and len(res.points) >= 2]
        if not curves:
            continue
        loads = list(dict.fromkeys(k for _, pts in curves for p in pts for k in (p.get("load") or {})))
        load_name = " / ".join(k.replace("_", " ") for k in loads) or "load"
        svg = load_curves_svg(prof.label + (" — simulated" if ctx.simulated else ""), load_name, curves, figures)
        slo_text = "; a cross marks a load that missed the SLO, a dashed line its limit" if slo else ""
        out += [f"### {prof.label}", "",
                figure(svg, f"{prof.label}: {', '.join(y for _, y, _ in figures)} against the {load_name}, one "
                       f"line per configuration{slo_text}.", f"Load curves: {prof.label}"),
                ""]
    return ["## Load Curves", "", *out] if out else []


# --------------------------------------------------------------------------- engine metrics and telemetry


def observed_section(o: StudyOutcome, ctx: ReportContext, directory: Path) -> list[str]:
    """Per profile: a table per watched key of each configuration's summary, and the samples
    over time; nothing for a key no result has (an engine or a machine that does not export it)."""
    from perflab.lab.report import results_by_profile

    out: list[str] = []
    by_profile = results_by_profile(o)
    for prof in o.plan.profiles:
        rows = [(label, res) for label, _, res in by_profile[prof.name] if res.status.measured]
        part: list[str] = []
        for key in OBSERVED_KEYS:
            part += summary_table(key, [(label, res.observed.get(key)) for label, res in rows])
        part += series_charts(prof.name, prof.label, rows, directory)
        if part:
            out += [f"### {prof.label}", "", *part]
    if not out:
        return []
    return ["## Engine Metrics and Telemetry", "",
            "What the engines reported on their metrics endpoints and what the accelerators' telemetry read "
            "while each configuration was measured; the samples are in each run's `observe-<profile>.json`.", "",
            *out]


def flatten(summary: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """``{"kv_cache_usage": {"peak": .9}}`` → ``("kv_cache_usage.peak", .9)``, in order."""
    for k, v in summary.items():
        if not prefix and k in _META:
            continue
        if isinstance(v, Mapping):
            yield from flatten(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}", v


def header(path: str) -> str:
    """``power_w.mean`` → ``power (W) mean``; ``kv_cache_usage.peak`` → ``kv cache usage peak``;
    ``power_w per device`` → ``power (W) per device``."""
    first, *rest = path.split(".")
    head, _, tail = first.partition(" ")
    for suffix, unit in _UNITS.items():
        if head.endswith(suffix):
            head = f"{head.removesuffix(suffix)} ({unit})"
            break
    return " ".join([head.replace("_", " "), *([tail] if tail else []), *rest])


def fmt(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        a = abs(value)
        return f"{value:,.0f}" if a >= 100 else f"{value:.2f}" if a >= 1 else f"{value:.3f}"
    return _cell(str(value))


def _cell(text: str) -> str:
    return html.escape(text).replace("|", "\\|").replace("\n", " ")


def _meta_text(value: Any) -> str:
    """``[0, 1, 2]`` → ``0, 1, 2``; ``"nvml"`` → ``nvml``."""
    if isinstance(value, (list, tuple)):
        return ", ".join(str(v) for v in value)
    return str(value)


def summary_table(key: str, rows: Sequence[tuple[str, Any]]) -> list[str]:
    """A Markdown table of one watched key's summaries, a column per figure any of them has."""
    have = [(label, s) for label, s in rows if isinstance(s, Mapping) and s]
    if not have:
        return []
    # a figure every result has as null is one the engine does not export: no column
    columns = list(dict.fromkeys(p for _, s in have for p, v in flatten(s) if v is not None))
    meta = []
    for m in _META:
        if m == "samples":  # a count per result, not worth a caption
            continue
        values = list(dict.fromkeys(_meta_text(s[m]) for _, s in have if s.get(m) is not None))
        if values:
            meta.append(f"{m}: {' / '.join(values)}")
    title = TITLES.get(key, key.replace("_", " ").capitalize())
    out = [f"#### {title}" + (f" ({_cell('; '.join(meta))})" if meta else ""), ""]
    if not columns:
        return []
    out += ["| Configuration | " + " | ".join(_cell(header(c)) for c in columns) + " |",
            "|---" * (len(columns) + 1) + "|"]
    for label, s in have:
        flat = dict(flatten(s))
        out.append(f"| {_cell(label)} | " + " | ".join(fmt(flat.get(c)) for c in columns) + " |")
    return [*out, ""]


#: ``observe-<profile><suffix>.json``: the suffix is the executor's (a sweep's or search's load
#: ``-<kind>-<value>``, a repeat's ``-r<n>``; perflab.lab.run.executor.Executor._repeated)
def _observe_re(profile: str) -> re.Pattern[str]:
    kinds = "|".join(re.escape(str(k)) for k in LoadKind)
    return re.compile(rf"^observe-{re.escape(file_stem(profile))}(?:-(?P<kind>{kinds})-(?P<value>[0-9.e+]+))?"
                      rf"(?:-r(?P<rep>\d+))?\.json$")


def observe_files(run_dir: Path, profile: str) -> list[Path]:
    """A run's samples files of one profile, in the order they were measured (loads lowest
    first, repeats in order)."""
    pat = _observe_re(profile)
    found = []
    for p in run_dir.glob(f"observe-{glob.escape(file_stem(profile))}*.json") if run_dir.is_dir() else ():
        m = pat.match(p.name)
        if m:
            found.append((float(m["value"]) if m["value"] else -1.0, int(m["rep"] or 0), p))
    return [p for *_, p in sorted(found)]


_DEVICE = re.compile(r"^(?P<name>.+)\.(?P<device>\d+)$")


def per_device_mean(values: Mapping[str, float]) -> dict[str, float]:
    """A telemetry sample's ``<name>.<device index>`` values (``power_w.3``) as one value per
    name, the mean over the devices (``power_w per device``): one line per configuration
    whatever the number of accelerators; other values as they are."""
    out: dict[str, float] = {}
    devices: dict[str, list[float]] = {}
    for k, v in values.items():
        if k == ENGINE_T:  # the simulated engines' clock a sample carries (for energy), not a figure
            continue
        m = _DEVICE.match(k)
        if m:
            devices.setdefault(m["name"], []).append(v)
        else:
            out[k] = v
    for name, vs in devices.items():
        out[f"{name} per device"] = sum(vs) / len(vs)
    return out


def load_series(run_dir: Path, profile: str) -> tuple[dict[str, list[tuple[float, dict[str, float]]]], list[float]]:
    """A configuration's samples on one profile, by watcher key, its benchmarks laid end to end
    (the times where one ended), from the files :func:`observe_files` finds."""
    series: dict[str, list[tuple[float, dict[str, float]]]] = {}
    offset, boundaries = 0.0, []
    for path in observe_files(run_dir, profile):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue  # a damaged samples file hides its chart, never the report
        end = offset
        for key, samples in (data.items() if isinstance(data, dict) else ()):
            got = [Sample(float(s["t"]), s.get("values") or {}, s.get("mark"))
                   for s in (samples if isinstance(samples, list) else ())
                   if isinstance(s, dict) and isinstance(s.get("t"), (int, float))]
            # the timed run only, from 0 where it began: the loading and the warm-up before it
            # and the last reading after it are not the benchmark the chart's axis claims
            timed = timed_run(got)
            if timed is not None:
                got = [Sample(s.t - timed[0].t, s.values, s.mark) for s in timed]
            for s in got:
                values = per_device_mean({k: float(v) for k, v in s.values.items()
                                          if isinstance(v, (int, float)) and not isinstance(v, bool)})
                series.setdefault(key, []).append((offset + s.t, values))
                end = max(end, offset + s.t)
        if offset:
            boundaries.append(offset)
        offset = end
    return series, boundaries


def series_charts(profile: str, profile_label: str, rows: Sequence[tuple[str, ConfigResult]], directory: Path) -> list[str]:
    """Per watcher key, one chart of the samples over time: a panel per value, a line per configuration."""
    from perflab.lab.report.svgchart import series_svg

    per_key: dict[str, list[tuple[str, list[tuple[float, dict[str, float]]]]]] = {}
    bounds: dict[str, list[float]] = {}
    for label, res in rows:
        if not res.run_dir:
            continue
        series, b = load_series(directory / res.run_dir, profile)
        for key, samples in series.items():
            per_key.setdefault(key, []).append((label, samples))
        bounds[label] = b
    keys = [k for k in OBSERVED_KEYS if k in per_key] + [k for k in per_key if k not in OBSERVED_KEYS]
    out: list[str] = []
    for key in keys:
        names = list(dict.fromkeys(n for _, samples in per_key[key] for _, v in samples for n in v))
        if not names:
            continue
        shown = names[:MAX_PANELS]
        title = f"{TITLES.get(key, key)} over time: {profile_label}"
        more = f" ({len(names) - len(shown)} more values are in the samples files)" if len(names) > len(shown) else ""
        svg = series_svg(title, per_key[key], shown, boundaries=bounds, titles={n: header(n) for n in shown})
        out += [figure(svg, f"{title}; one line per configuration, in engine seconds since its benchmark began; "
                       f"dotted lines: where one benchmark of the launch ended and the next began{more}.", title), ""]
    return out
