"""The "Serving Benchmark Result" block and the JSON result.

The block reproduces ``vllm bench serve``'s layout (``{:<40} {:<10}`` lines, trailing blanks
stripped): the throughput lines, then one section per metric. perflab's own runs use vLLM
0.33's labels (``Failed requests:`` always, ``Total token throughput (tok/s):``); blocks read
from the seeds (vLLM 0.11: no ``Failed requests:`` line when none failed, ``Total Token
throughput``) are written back in their own layout (:func:`block_layout`). Sections and lines
beyond vLLM's, all optional:

- the GPUStack ``Latency`` section in seconds (seed 004), percentile metric ``latency``;
- vLLM's ``End-to-end Latency`` section in milliseconds, percentile metric ``e2el``;
- one line per asked percentile; a percentile with no value prints ``N/A`` (seed 004's
  ``P95 TTFT (ms): N/A``).

The JSON uses ``vllm bench serve --save-result`` field names so that existing tooling reads
it; perflab's own additions sit under ``"perflab"``.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from perflab.bench.metrics import BenchMetrics, name_of, percentile_key
from perflab.bench.trace import RequestTrace

WIDTH = 50
BLOCK_TITLE = " Serving Benchmark Result "
# Section order in the block; "latency" (seconds) is seed 004's, "e2el" (ms) is vLLM's.
SECTION_ORDER = ("latency", "ttft", "tpot", "itl", "e2el")
SECTIONS: dict[str, tuple[str, str, str, str, float]] = {
    # name: (header line, line label, unit, field metric, divisor from ms)
    "latency": ("-" * 22 + "Latency" + "-" * 21, "Latency", "s", "e2el", 1000.0),
    "ttft": ("{:-^50}".format("Time to First Token"), "TTFT", "ms", "ttft", 1.0),
    "tpot": ("{:-^50}".format("Time per Output Token (excl. 1st token)"), "TPOT", "ms", "tpot", 1.0),
    "itl": ("{:-^50}".format("Inter-token Latency"), "ITL", "ms", "itl", 1.0),
    "e2el": ("{:-^50}".format("End-to-end Latency"), "E2EL", "ms", "e2el", 1.0),
}
DEFAULT_PERCENTILE_METRICS = ("ttft", "tpot", "itl")
_PCT_KEY = re.compile(r"^p(\d+(?:\.\d+)?)_(?:ttft|tpot|itl|e2el)_ms$")

# Throughput lines: (label, field, format) in block order.
_HEAD_LINES: tuple[tuple[str, str, str], ...] = tuple((label, name_of(get), fmt) for label, get, fmt in (
    ("Successful requests:", lambda m: m.completed, "d"),
    ("Failed requests:", lambda m: m.failed, "d"),
    # perflab's, only when not 0: failed requests whose server-reported token counts cannot be
    # true, and those of them that answered beyond max_tokens (perflab.bench.trace.count_problem)
    ("Impossible token counts (failed):", lambda m: m.usage_mismatches, "d"),
    ("Output beyond max_tokens (failed):", lambda m: m.over_max_tokens, "d"),
    ("Maximum request concurrency:", lambda m: m.max_concurrency, "d"),
    ("Request rate configured (RPS):", lambda m: m.request_rate, ".2f"),
    ("Benchmark duration (s):", lambda m: m.duration, ".2f"),
    ("Total input tokens:", lambda m: m.total_input_tokens, "d"),
    ("Total generated tokens:", lambda m: m.total_output_tokens, "d"),
    ("Request throughput (req/s):", lambda m: m.request_throughput, ".2f"),
    ("Request goodput (req/s):", lambda m: m.request_goodput, ".2f"),
    ("Output token throughput (tok/s):", lambda m: m.output_throughput, ".2f"),
    ("Peak output token throughput (tok/s):", lambda m: m.max_output_tokens_per_s, ".2f"),
    ("Peak concurrent requests:", lambda m: m.max_concurrent_requests, ".2f"),
    ("Total Token throughput (tok/s):", lambda m: m.total_token_throughput, ".2f"),
))
_FAILED, _TOTAL_TPS = name_of(lambda m: m.failed), name_of(lambda m: m.total_token_throughput)
_CHECKS = (name_of(lambda m: m.usage_mismatches), name_of(lambda m: m.over_max_tokens))
_CONCURRENCY, _RATE = name_of(lambda m: m.max_concurrency), name_of(lambda m: m.request_rate)
_GOODPUT = name_of(lambda m: m.request_goodput)
# The two layouts: vLLM 0.33 (vllm/benchmarks/serve.py benchmark(): "Failed requests:"
# always, "Total token throughput (tok/s):") and vLLM 0.11, the seeds' ("Failed requests:"
# never shown, "Total Token throughput (tok/s):"). A metrics dict says which through
# "block_layout" (set by parse_result_block); otherwise a result with vLLM 0.33's
# always-present "rtfx" key (every perflab run, a vllm-bench 0.33 JSON) uses 0.33's.
LAYOUT_033, LAYOUT_011 = "vllm-0.33", "vllm-0.11"


def block_layout(metrics: Mapping[str, Any]) -> str:
    layout = metrics.get("block_layout")
    if layout in (LAYOUT_033, LAYOUT_011):
        return str(layout)
    return LAYOUT_033 if name_of(lambda m: m.rtfx) in metrics else LAYOUT_011


def _line(label: str, value: Any, fmt: str) -> str:
    if value is None:
        text = "N/A"
    elif fmt == "d":
        text = str(int(value))
    else:
        text = format(float(value), fmt)
    return f"{label:<40} {text:<10}".rstrip()


def _shown(key: str, value: Any, layout: str = LAYOUT_011) -> bool:
    if key == _FAILED:
        return layout == LAYOUT_033 or bool(value)
    if key in _CHECKS:
        return bool(value)
    if key in (_CONCURRENCY, _GOODPUT):
        return value is not None
    if key == _RATE:
        return value is not None and value != "inf" and not (isinstance(value, float) and math.isinf(value))
    return True


def _section_percentiles(metrics: Mapping[str, Any], field_metric: str, unit: str, asked: Sequence[float]) -> list[str]:
    """Asked percentiles plus any already in ``metrics`` for this section, in ascending order."""
    keys = {percentile_key(p): float(p) for p in asked}
    suffix = f"_{field_metric}_ms" if unit == "ms" else f"_{field_metric}_s"
    pat = re.compile(r"^p(\d+(?:\.\d+)?)" + re.escape(suffix) + "$")
    for k in metrics:
        m = pat.match(k)
        if m:
            keys.setdefault(m.group(1), float(m.group(1)))
    return [k for k, _ in sorted(keys.items(), key=lambda kv: kv[1])]


def format_result_block(
    metrics: Mapping[str, Any],
    percentiles: Sequence[float] = (99,),
    percentile_metrics: Sequence[str] | None = None,
) -> str:
    """The "Serving Benchmark Result" block of ``metrics`` (vLLM field names).

    :param metrics: as produced by a run or by :func:`parse_result_block`; reads
        ``max_concurrency`` and ``request_rate`` to decide on those lines.
    :param percentiles: percentile lines to print; a percentile with no value in ``metrics``
        prints ``N/A``; percentiles already present in ``metrics`` are printed too.
    :param percentile_metrics: sections, among ``latency`` (seed 004's, seconds), ``ttft``,
        ``tpot``, ``itl``, ``e2el`` (vLLM's, ms). Default: ``metrics["percentile_metrics"]``
        when present, else ttft, tpot, itl.
    """
    if percentile_metrics is None:
        percentile_metrics = tuple(metrics.get("percentile_metrics") or DEFAULT_PERCENTILE_METRICS)
    unknown = set(percentile_metrics) - set(SECTIONS)
    if unknown:
        raise ValueError(f"unknown percentile metric(s) {sorted(unknown)}; known: {', '.join(SECTION_ORDER)}")
    layout = block_layout(metrics)
    lines = ["{s:{c}^{n}}".format(s=BLOCK_TITLE, n=WIDTH, c="=")]
    for label, key, fmt in _HEAD_LINES:
        value = metrics.get(key)
        if key == _FAILED and value is None and layout == LAYOUT_033:
            value = 0
        if _shown(key, value, layout):
            if key == _TOTAL_TPS and layout == LAYOUT_033:
                label = "Total token throughput (tok/s):"
            lines.append(_line(label, value, fmt))
    for name in SECTION_ORDER:
        if name not in percentile_metrics:
            continue
        header, label, unit, fm, divisor = SECTIONS[name]
        lines.append(header)
        sep = "" if unit == "s" else " "
        for stat in ("mean", "median"):
            value = metrics.get(f"{stat}_{fm}_ms")
            lines.append(_line(f"{stat.capitalize()} {label}{sep}({unit}):", None if value is None else value / divisor, ".2f"))
        for pk in _section_percentiles(metrics, fm, "ms", percentiles):
            value = metrics.get(f"p{pk}_{fm}_ms")
            lines.append(_line(f"P{pk} {label}{sep}({unit}):", None if value is None else value / divisor, ".2f"))
    lines.append("=" * WIDTH)
    return "\n".join(lines)


# --------------------------------------------------------------------------- parsing

_NUM = r"(N/A|-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?|inf)"
_BLOCK_RE = re.compile(r"=+\s*Serving Benchmark Result\s*=+(.*?)(?:={50}|$)", re.S)
_SECTION_HEADER_RE = re.compile(r"-{3,}\s*([A-Za-z][A-Za-z0-9 .()\-]*?[A-Za-z)])\s*-{3,}")
_SECTION_BY_HEADER = {
    "Latency": "latency",
    "Time to First Token": "ttft",
    "Time per Output Token (excl. 1st token)": "tpot",
    "Inter-token Latency": "itl",
    "End-to-end Latency": "e2el",
}
_STAT_RE = re.compile(r"(Mean|Median|P\d+(?:\.\d+)?)\s+(Latency|TTFT|TPOT|ITL|E2EL)\s*\((ms|s)\):\s*" + _NUM, re.I)


def _num(text: str) -> float | None:
    if text == "N/A":
        return None
    return float(text)


def parse_result_blocks(text: str) -> list[BenchMetrics]:
    """Every "Serving Benchmark Result" block in ``text`` (a log, a seed, a Markdown page)."""
    return [metrics for _, metrics in result_blocks_at(text)]


def result_blocks_at(text: str) -> list[tuple[int, BenchMetrics]]:
    """Every block in ``text`` with the offset of its title line (``perflab audit`` says where)."""
    return [(m.start(), _parse_body(m.group(1))) for m in _BLOCK_RE.finditer(text)]


def parse_result_block(text: str) -> BenchMetrics:
    """The first "Serving Benchmark Result" block in ``text``, as vLLM-named metrics.

    Works on the block as printed and on text whose line breaks were lost (seed 004). ``N/A``
    becomes ``None``; seconds (seed 004's Latency section) become ``*_e2el_ms``. The sections
    found are listed in ``percentile_metrics`` so that :func:`format_result_block` gives the
    same block back.
    """
    blocks = parse_result_blocks(text)
    if not blocks:
        raise ValueError("no 'Serving Benchmark Result' block found")
    return blocks[0]


def _parse_body(body: str) -> BenchMetrics:
    out: dict[str, Any] = {}
    for label, key, fmt in _HEAD_LINES:
        # Case matters: "Output token throughput" must not match "Peak output token ...".
        # vLLM main spells "Total token throughput", 0.11 (the seeds) "Total Token".
        pat = re.escape(label).replace("Token", "[Tt]oken")
        m = re.search(pat + r"\s*" + _NUM, body)
        if m is None:
            continue
        value = _num(m.group(1))
        if value is not None and fmt == "d" and not math.isinf(value):
            value = int(value)
        out[key] = value
    sections: list[str] = []
    headers = list(_SECTION_HEADER_RE.finditer(body))
    for i, h in enumerate(headers):
        name = _SECTION_BY_HEADER.get(" ".join(h.group(1).split()))
        if name is None:
            continue
        sections.append(name)
        end = headers[i + 1].start() if i + 1 < len(headers) else len(body)
        for m in _STAT_RE.finditer(body, h.end(), end):
            stat, _label, unit, raw = m.groups()
            value = _num(raw)
            if value is not None and unit.lower() == "s":
                value = value * 1000.0
            fm = SECTIONS[name][3]
            key = stat.lower() if stat.lower() in ("mean", "median") else "p" + stat[1:]
            out[f"{key}_{fm}_ms"] = value
    out["percentile_metrics"] = sections
    newer = "Total token throughput" in body or re.search(r"Failed requests:\s*0\b", body) is not None
    out["block_layout"] = LAYOUT_033 if newer else LAYOUT_011
    return BenchMetrics.from_json(out)


# --------------------------------------------------------------------------- the result


@dataclass(frozen=True)
class Stall:
    """Why a benchmark stopped early: no byte on any open stream for ``stall_s``.

    Durations are in the engine's time (real seconds × the simulator's time scale), as the
    ``stall_s`` option. ``stage`` is ``"run"`` (the timed run) or ``"warm-up"``.
    """

    stall_s: float  # the watchdog's threshold
    idle_s: float  # time since the last byte on any open stream when it fired
    in_flight: int  # streams open then (failed with the error "stalled")
    completed: int  # requests that had completed before
    stage: str = "run"

    def message(self) -> str:
        return (f"the benchmark stalled: no token on any of {self.in_flight} open stream(s) for "
                f"{self.idle_s:.0f} s (--stall-s {self.stall_s:g}) during the {self.stage}; "
                f"{self.completed} request(s) had completed")

    def to_json(self) -> dict[str, Any]:
        return {"stall_s": self.stall_s, "idle_s": self.idle_s, "in_flight": self.in_flight,
                "completed": self.completed, "stage": self.stage}



@dataclass
class BenchResult:
    """What one benchmark run measured against one endpoint set: made by a bench backend
    (the built-in client, ``vllm bench serve``, a plugin's), judged by the lab executor into
    a :class:`~perflab.lab.store.ProfileMeasurement`.

    ``metrics`` holds the ``vllm bench serve --save-result`` fields (without the per-request
    lists): ``completed``, ``failed``, ``total_input_tokens``, ``total_output_tokens``,
    ``request_throughput``, ``output_throughput``, ``total_token_throughput``,
    ``mean_ttft_ms``, ``median_ttft_ms``, ``p99_ttft_ms``, ..., ``max_output_tokens_per_s``,
    ``max_concurrent_requests``, plus the run's settings (``backend``, ``model_id``,
    ``num_prompts``, ``request_rate``, ``burstiness``, ``max_concurrency`` ...).

    ``cancelled``: the run was stopped through its cancel event; such a result only comes
    attached to :class:`perflab.bench.cancel.BenchCancelled` and covers the requests sent
    before the stop (those cut short count as failed, error ``"cancelled"``).

    ``stall``: the stall watchdog stopped the run (:class:`Stall`); the result is returned
    (not raised) and covers the requests sent before it fired — those open then count as
    failed with the error ``"stalled"``. Not a full measurement: callers check ``stalled``.
    """

    metrics: BenchMetrics
    errors: list[str] = field(default_factory=list)  # the first failed requests' errors
    requests: list[RequestTrace] = field(default_factory=list)  # per request, in send order
    info: dict[str, Any] = field(default_factory=dict)  # perflab's details (tokenizer, workers, ...)
    percentiles: tuple[float, ...] = (99,)
    percentile_metrics: tuple[str, ...] = DEFAULT_PERCENTILE_METRICS
    cancelled: bool = False
    stall: Stall | None = None  # set when the stall watchdog stopped the run

    def __post_init__(self) -> None:
        self.metrics = BenchMetrics.of(self.metrics)  # a result file's metrics are read as the record

    @property
    def stalled(self) -> bool:
        return self.stall is not None

    @property
    def success_rate(self) -> float:
        done = int(self.metrics.completed or 0)
        total = done + int(self.metrics.failed or 0)
        return done / total if total else 0.0

    def format_block(self, percentiles: Sequence[float] | None = None) -> str:
        """The block with exactly ``percentiles`` (default: the run's) in each section."""
        asked = self.percentiles if percentiles is None else tuple(percentiles)
        keep = {percentile_key(p) for p in asked}
        metrics = {k: v for k, v in self.metrics.items() if not ((m := _PCT_KEY.match(k)) and m.group(1) not in keep)}
        return format_result_block(metrics, asked, self.percentile_metrics)

    def to_json(self, *, detailed: bool = False) -> dict[str, Any]:
        """The ``--save-result`` JSON; ``detailed`` adds vLLM's ``--save-detailed`` lists."""
        out = self.metrics.to_json()
        out.pop("block_layout", None)
        reqs = self.requests
        # vLLM 0.33 keeps these three without --save-detailed (vllm/benchmarks/serve.py:
        # they are not in its list of "fields with too many data points")
        out["latencies"] = [r.latency if r.success else 0.0 for r in reqs]
        out["queue_times"] = [r.queue_time for r in reqs]
        out.setdefault(name_of(lambda m: m.rtfx), 0.0)
        out["errors"] = list(self.errors)
        if detailed:
            out["input_lens"] = [r.input_tokens for r in reqs]
            out["output_lens"] = [r.output_tokens if r.success else 0 for r in reqs]
            out["ttfts"] = [r.ttft for r in reqs]
            out["itls"] = [r.itl for r in reqs]
            out["start_times"] = [r.start for r in reqs]
            out["generated_texts"] = [r.generated_text for r in reqs]
            out["errors"] = [r.error for r in reqs]
        out["perflab"] = dict(self.info)
        return out

    def default_filename(self) -> str:
        """vLLM's name: ``{label}-{rate}qps[-concurrency{N}]-{model}-{date}.json``."""
        m = self.metrics
        label = m.label or m.backend or "perflab"
        conc = f"-concurrency{m.max_concurrency}" if m.max_concurrency is not None else ""
        model = str(m.model_id or "model").rstrip("/").split("/")[-1]
        date = m.date or datetime.now().strftime("%Y%m%d-%H%M%S")
        rate = m.request_rate if name_of(lambda m: m.request_rate) in m else "inf"
        return f"{label}-{rate}qps{conc}-{model}-{date}.json"

    def save(self, result_dir: str | Path | None = None, filename: str | None = None, *, detailed: bool = False) -> Path:
        directory = Path(result_dir) if result_dir else Path.cwd()
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / (filename or self.default_filename())
        path.write_text(json.dumps(self.to_json(detailed=detailed), indent=None) + "\n", encoding="utf-8")
        return path
