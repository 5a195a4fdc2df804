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
from collections.abc import Iterable, Mapping, Sequence

from perflab.bench.trace import RequestTrace

METRIC_NAMES = ("ttft", "tpot", "itl", "e2el")


def percentile(values: Sequence[float], p: float) -> float:
    """numpy.percentile(values, p) with the default linear method; 0 for no values."""
    if not values:
        return 0.0
    xs = sorted(values)
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
) -> dict[str, float | int | None]:
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

    out: dict[str, float | int | None] = {
        "duration": duration_s,
        "completed": len(ok),
        "failed": failed,
        "total_input_tokens": total_input,
        "total_output_tokens": total_output,
        "request_throughput": len(ok) / duration_s,
        "request_goodput": good / duration_s if goodput else None,
        "output_throughput": total_output / duration_s,
        "total_token_throughput": (total_input + total_output) / duration_s,
        "max_output_tokens_per_s": peak_output_tokens_per_s(ok),
        "max_concurrent_requests": peak_concurrency(ok),
        "rtfx": 0.0,  # vLLM 0.33: input audio seconds / duration (ASR); text prompts have none
    }
    series = {"ttft": ttfts, "tpot": tpots, "itl": itls, "e2el": e2els}
    for name in METRIC_NAMES:
        values = series[name]
        out[f"mean_{name}_ms"] = mean(values) * 1000
        out[f"median_{name}_ms"] = percentile(values, 50) * 1000
        out[f"std_{name}_ms"] = std(values) * 1000
        for p in percentiles:
            out[f"p{percentile_key(p)}_{name}_ms"] = percentile(values, p) * 1000
    return out
