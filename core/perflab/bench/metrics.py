"""Benchmark metrics with ``vllm bench serve``'s definitions and ``--save-result`` names.

Source: vllm/benchmarks/serve.py, ``calculate_metrics`` (vLLM 0.11 and main), and
vllm/benchmarks/lib/endpoint_request_func.py. Per successful request:

- TTFT: first chunk that carries output (:func:`perflab.bench.trace.has_streamed_output`,
  vLLM 0.33's rule) − request start;
- TPOT: (latency − TTFT) / (output tokens − 1), only for requests with more than one output
  token (for goodput a request with one token has TPOT 0);
- ITL: every gap between consecutive chunks that carry output;
- E2EL: last chunk that carries output − request start;

over the run: request/output/total token throughput = count / benchmark duration,
goodput = requests meeting every SLO / duration. Statistics are numpy's: mean, population
std, median and percentiles with linear interpolation; an empty list gives 0.

Two deliberate differences (docs/benchmark.md lists them all):

- peak concurrent requests is the exact maximum of overlapping [start, end) intervals (a
  sweep line); vLLM 0.33 counts a request in every one-second bucket it touches, so requests
  that follow each other within a second read as concurrent (64 for a limit of 32);
- ``max_output_tokens_per_s`` adds each chunk's *tokens* to its one-second bucket, where
  vLLM adds 1 per chunk (vLLM issue 37666) — with multi-token chunks (speculative decoding,
  stream intervals) vLLM's "peak" can fall below the average.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, cast

from perflab.bench.trace import RequestTrace

METRIC_NAMES = ("ttft", "tpot", "itl", "e2el")


def _setting() -> Any:
    """One of the run's settings, which ``vllm bench serve`` writes beside the figures, each
    one even without a value (``null``)."""
    return field(default=None, metadata={"group": "setting", "always": True})


def _figure(*, always: bool = False) -> Any:
    """A figure over the run; ``always``: written even without a value (``null``)."""
    return field(default=None, metadata={"group": "figure", "always": always})


def _stat() -> Any:
    """A statistic of one per-request metric, in ms."""
    return field(default=None, metadata={"group": "stat"})


def _check() -> Any:
    """perflab's count of requests that failed a check."""
    return field(default=None, metadata={"group": "check"})


@dataclass(frozen=True, eq=False)
class BenchMetrics(Mapping[str, Any]):
    """One benchmark's metrics: ``vllm bench serve --save-result``'s fields (without its
    per-request lists) and perflab's additions, each name declared once, here.

    Fields are in the order a run writes them, so :meth:`to_json` gives today's files byte for
    byte. A record read from a file (:meth:`from_json`) keeps exactly the keys it had, in their
    order: a key the file lacks is None here and stays absent in :meth:`to_json`; a key that is
    no field (another percentile, ``p90_ttft_ms``; a parsed block's ``percentile_metrics`` and
    ``block_layout``; a newer vLLM's key) is kept in ``extra``. It reads as a read-only mapping
    by those keys for the code that picks a metric by a name it computes (an SLO's
    ``p99_tpot_ms``, the repeats' mean); code that means one metric reads its field.
    """

    # the run's settings, as vLLM writes them beside the figures (request_rate: "inf" or a number)
    date: str | None = _setting()
    endpoint_type: str | None = _setting()
    backend: str | None = _setting()
    label: str | None = _setting()
    model_id: str | None = _setting()
    tokenizer_id: str | None = _setting()
    num_prompts: int | None = _setting()
    request_rate: float | str | None = _setting()
    burstiness: float | None = _setting()
    max_concurrency: int | None = _setting()
    # the figures (counts are ints as measured; the mean of repeats may make them fractional)
    duration: float | None = _figure()
    completed: float | None = _figure()
    failed: float | None = _figure()
    total_input_tokens: float | None = _figure()
    total_output_tokens: float | None = _figure()
    request_throughput: float | None = _figure()
    request_goodput: float | None = _figure(always=True)  # None without goodput SLOs
    output_throughput: float | None = _figure()
    total_token_throughput: float | None = _figure()
    max_output_tokens_per_s: float | None = _figure()
    max_concurrent_requests: float | None = _figure()
    rtfx: float | None = _figure()
    # per request metric (METRIC_NAMES): mean, median, population std and vLLM's default
    # percentile (99) in ms; other percentiles are kept in ``extra`` (percentile_name)
    mean_ttft_ms: float | None = _stat()
    median_ttft_ms: float | None = _stat()
    std_ttft_ms: float | None = _stat()
    p99_ttft_ms: float | None = _stat()
    mean_tpot_ms: float | None = _stat()
    median_tpot_ms: float | None = _stat()
    std_tpot_ms: float | None = _stat()
    p99_tpot_ms: float | None = _stat()
    mean_itl_ms: float | None = _stat()
    median_itl_ms: float | None = _stat()
    std_itl_ms: float | None = _stat()
    p99_itl_ms: float | None = _stat()
    mean_e2el_ms: float | None = _stat()
    median_e2el_ms: float | None = _stat()
    std_e2el_ms: float | None = _stat()
    p99_e2el_ms: float | None = _stat()
    # perflab's: failed requests whose server-reported token counts cannot be true, and those of
    # them that answered beyond max_tokens (perflab.bench.trace.count_problem)
    usage_mismatches: int | None = _check()
    over_max_tokens: int | None = _check()
    # not metrics: the keys that are no field, and the keys present, in order
    extra: Mapping[str, Any] = field(default_factory=dict, metadata={"internal": True})
    order: tuple[str, ...] | None = field(default=None, metadata={"internal": True})

    def __post_init__(self) -> None:
        if self.order is None:
            # built from fields: the fields set, and those vLLM always writes with their group
            # (all the settings once one is set; request_goodput once a figure is)
            own = [f for f in fields(self) if not f.metadata.get("internal")]
            groups = {f.metadata["group"] for f in own if getattr(self, f.name) is not None}
            given = tuple(f.name for f in own if getattr(self, f.name) is not None
                          or (f.metadata.get("always", False)
                          and f.metadata["group"] in groups))
            object.__setattr__(self, "order", given + tuple(k for k in self.extra if k not in given))

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> BenchMetrics:
        """The record of a result's metrics as a file holds them (every key kept, in order)."""
        known = {k: v for k, v in data.items() if k in FIELD_NAMES}
        extra = {k: v for k, v in data.items() if k not in FIELD_NAMES}
        return cls(**known, extra=extra, order=tuple(data))

    @classmethod
    def of(cls, data: Mapping[str, Any]) -> BenchMetrics:
        """``data`` as a record: itself when it is one, else read as :meth:`from_json` reads."""
        return data if isinstance(data, BenchMetrics) else cls.from_json(data)

    def to_json(self) -> dict[str, Any]:
        """The metrics as vLLM's result file and perflab's store write them."""
        return {k: self[k] for k in self}

    def merged(self, other: Mapping[str, Any]) -> BenchMetrics:
        """These metrics with ``other``'s keys set (new keys after the present ones)."""
        return BenchMetrics.from_json({**self.to_json(), **other})

    def percentile(self, metric: str, p: float) -> float | None:
        """``p``-th percentile of ``metric`` (ttft, tpot, itl, e2el) in ms, None when not measured."""
        v = self.get(percentile_name(metric, p))
        return float(v) if isinstance(v, (int, float)) else None

    def __getitem__(self, key: str) -> Any:
        if key not in self:
            raise KeyError(key)
        return getattr(self, key) if key in FIELD_NAMES else self.extra[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.order or ())

    def __len__(self) -> int:
        return len(self.order or ())

    def __contains__(self, key: object) -> bool:
        return key in (self.order or ())

    def __repr__(self) -> str:
        return f"BenchMetrics({self.to_json()!r})"


FIELD_NAMES: frozenset[str] = frozenset(f.name for f in fields(BenchMetrics) if not f.metadata.get("internal"))
"""The record's metric and setting names: the only declaration of them."""
SETTING_NAMES: frozenset[str] = frozenset(f.name for f in fields(BenchMetrics) if f.metadata.get("group") == "setting")
"""The run's settings among them (``model_id``, ``request_rate`` ...): not measured figures."""


def read_metrics(data: Mapping[str, Any] | None) -> BenchMetrics | None:
    """Stored metrics (None: none measured) as the record."""
    return None if data is None else BenchMetrics.of(data)


def metrics_json(metrics: BenchMetrics | None) -> dict[str, Any] | None:
    """The record as stored (None: none measured)."""
    return None if metrics is None else metrics.to_json()


class _NameProbe:
    """Stands for a record in :func:`name_of`: reading a field gives its name back."""

    def __getattr__(self, name: str) -> str:
        if name not in FIELD_NAMES:
            raise AttributeError(name)
        return name


def name_of(get: Callable[[BenchMetrics], object]) -> str:
    """The key of the field ``get`` reads: ``name_of(lambda m: m.mean_tpot_ms) == "mean_tpot_ms"``.

    For tables and keys that name a metric (compare's headline list, report.html's load
    curves, the result block's lines): the name comes from the field, which mypy checks where
    the getter is written."""
    name = get(cast(BenchMetrics, _NameProbe()))
    if not isinstance(name, str):
        raise TypeError("name_of: the getter must read one field of BenchMetrics")
    return name


def percentile_name(metric: str, p: float) -> str:
    """vLLM's key of a percentile: ``percentile_name("tpot", 99) == "p99_tpot_ms"``."""
    return f"p{percentile_key(p)}_{metric}_ms"


def stat_name(stat: str, metric: str) -> str:
    """vLLM's key of a statistic (mean, median, std) of ``metric``: ``mean_ttft_ms``."""
    return f"{stat}_{metric}_ms"


def percentile(values: Sequence[float], p: float) -> float:
    """numpy.percentile(values, p) with the default linear method; 0 for no values."""
    return sorted_percentile(sorted(values), p)


def sorted_percentile(xs: Sequence[float], p: float) -> float:
    """:func:`percentile` of values already sorted (one sort serves every percentile)."""
    if not xs:
        return 0.0
    if len(xs) == 1:
        return float(xs[0])
    rank = (len(xs) - 1) * p / 100.0
    lo = math.floor(rank)
    hi = min(lo + 1, len(xs) - 1)
    frac = rank - lo
    return float(xs[lo] + (xs[hi] - xs[lo]) * frac)


def mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values) if values else 0.0


def std(values: Sequence[float]) -> float:
    """Population standard deviation, as numpy.std."""
    if not values:
        return 0.0
    m = mean(values)
    return math.sqrt(math.fsum((v - m) ** 2 for v in values) / len(values))


def percentile_key(p: float) -> str:
    """vLLM's spelling of a percentile in field names: 99 -> "99", 99.9 -> "99.9"."""
    return str(int(p)) if int(p) == p else str(p)


def peak_output_tokens_per_s(traces: Iterable[RequestTrace]) -> float:
    """The largest number of output tokens received in one one-second bucket.

    Buckets start at the earliest request start, as in vLLM; each chunk contributes the
    tokens it carried (``chunk_tokens``), or the request's tokens spread evenly over its
    chunks when the per-chunk split is unknown.
    """
    ok = [t for t in traces if t.success and t.chunk_times]
    if not ok:
        return 0.0
    origin = min(t.start for t in ok)
    buckets: dict[int, float] = {}
    for t in ok:
        n = len(t.chunk_times)
        weights = t.chunk_tokens if t.chunk_tokens is not None and len(t.chunk_tokens) == n else None
        even = t.output_tokens / n
        for i, rel in enumerate(t.chunk_times):
            b = int(t.start + rel - origin)
            buckets[b] = buckets.get(b, 0.0) + (weights[i] if weights is not None else even)
    return max(buckets.values())


def peak_concurrency(traces: Iterable[RequestTrace]) -> int:
    """Most successful requests in flight at once, over half-open [start, start + E2EL)."""
    events: list[tuple[float, int]] = []
    for t in traces:
        if t.success:
            events.append((t.start, 1))
            events.append((t.start + t.latency, -1))
    events.sort()  # at equal times -1 sorts before +1: an end frees its slot first
    cur = peak = 0
    for _, delta in events:
        cur += delta
        peak = max(peak, cur)
    return peak


def compute_metrics(
    traces: Sequence[RequestTrace],
    duration_s: float,
    *,
    percentiles: Sequence[float] = (99,),
    goodput: Mapping[str, float] | None = None,
) -> BenchMetrics:
    """The ``vllm bench serve --save-result`` metric fields for one run.

    :param traces: every request sent (failed ones included), times in seconds.
    :param duration_s: the benchmark duration (first dispatch to last completion).
    :param percentiles: the percentiles to report (``p99_ttft_ms`` ...).
    :param goodput: SLOs in milliseconds: ``{"ttft": 500, "tpot": 50, "e2el": 20000}``.
    """
    if duration_s <= 0:
        raise ValueError("benchmark duration must be positive")
    ok = [t for t in traces if t.success]
    failed = len(traces) - len(ok)
    ttfts = [t.ttft for t in ok]
    e2els = [t.latency for t in ok]
    itls = [gap for t in ok for gap in t.itl]
    tpots: list[float] = []
    all_tpots: list[float] = []  # 0 for single-token outputs, used by goodput only
    for t in ok:
        tpot = 0.0
        if t.output_tokens > 1:
            tpot = (t.latency - t.ttft) / (t.output_tokens - 1)
            tpots.append(tpot)
        all_tpots.append(tpot)
    total_input = sum(t.input_tokens for t in ok)
    total_output = sum(t.output_tokens for t in ok)

    good = 0
    if goodput:
        limits = {k: v / 1000.0 for k, v in goodput.items()}
        for t, tpot in zip(ok, all_tpots, strict=True):
            figures = {"ttft": t.ttft, "tpot": tpot, "e2el": t.latency}
            if all(figures[k] <= limit for k, limit in limits.items()):
                good += 1

    head = BenchMetrics(
        duration=duration_s,
        completed=len(ok),
        failed=failed,
        total_input_tokens=total_input,
        total_output_tokens=total_output,
        request_throughput=len(ok) / duration_s,
        request_goodput=good / duration_s if goodput else None,
        output_throughput=total_output / duration_s,
        total_token_throughput=(total_input + total_output) / duration_s,
        max_output_tokens_per_s=peak_output_tokens_per_s(ok),
        max_concurrent_requests=peak_concurrency(ok),
        rtfx=0.0,  # vLLM 0.33: input audio seconds / duration (ASR); text prompts have none
    )
    out = head.to_json()  # the settings belong to the run (perflab.bench.runner), not here
    series = {"ttft": ttfts, "tpot": tpots, "itl": itls, "e2el": e2els}
    for name in METRIC_NAMES:
        values = series[name]
        ordered = sorted(values)
        out[stat_name("mean", name)] = mean(values) * 1000
        out[stat_name("median", name)] = sorted_percentile(ordered, 50) * 1000
        out[stat_name("std", name)] = std(values) * 1000
        for p in percentiles:
            out[percentile_name(name, p)] = sorted_percentile(ordered, p) * 1000
    return BenchMetrics.from_json(out)
