"""The simulated engines' Prometheus ``/metrics``, under the engines' own metric names.

The values are what the simulated engine did: token counters equal the tokens it served,
request counters the requests it finished, gauges its scheduler's state at scrape time.
Latency histograms are in simulated seconds (equal to wall seconds at time scale 1).

The exposition is written by ``prometheus_client`` (the library the engines use themselves), so
the text format — ``# HELP``/``# TYPE``, ``_total``/``_created`` samples, ``le`` buckets —
is the engines' byte for byte.

Sources:

- vLLM 0.32.0 (``vllm/v1/metrics/loggers.py``, ``PrometheusStatLogger``): names, help texts,
  labels ``engine`` (the data-parallel rank) and ``model_name`` (first served name), the
  ``finished_reason`` label of ``vllm:request_success``, the bucket boundaries (token
  histograms: ``build_1_2_5_buckets(max_model_len)``). Checked against a real vLLM 0.32.0's
  ``/metrics`` (``tests/fixtures/real/vllm-0.32.0-cpu/metrics-idle.txt``).
- SGLang (``python/sglang/srt/metrics/collector.py``, ``SchedulerMetricsCollector`` and
  ``TokenizerMetricsCollector``; docs/references/production_metrics.md): ``sglang:*`` names,
  label ``model_name``.
- TensorRT-LLM (``tensorrt_llm/metrics/collector.py``, ``MetricsCollector``): ``trtllm_*`` names,
  labels ``model_name``, ``engine_type``; trtllm-serve serves them on ``/prometheus/metrics``.
- MindIE: its Prometheus interface (MindIE Service "服务监控指标查询接口(普罗格式)", GET /metrics on
  ``metricsPort``; MindIE-LLM's PrometheusMetrics, prometheus_metrics.cpp): unprefixed names,
  label ``model_name``; its prefix hit-rate gauge is cumulative (all radix matches so far).

The engine's state metrics follow what the simulated engine does: the KV-cache usage its KV
blocks (cached blocks no request holds count as free, as vLLM's block pool counts them), the
preemption counter (SGLang: retractions) its preemptions, the prefix-cache counters (or hit-rate
gauge) its prefix hits, the speculative-decoding counters (or acceptance gauge) its draws. The
SGLang and TensorRT-LLM rate gauges are the rate since the previous scrape (the engines set them
from their latest batches / log interval), unchanged when nothing was scheduled in between.
vLLM registers its speculative-decoding counters only with a speculative config (``+spec``).

The families (names, help texts, kinds, buckets) are data: perflab_sim/data/metrics.json.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

# vllm/v1/metrics/loggers.py (0.32.0): the buckets of the latency histograms
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
               80.0)
LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
                   480.0, 960.0, 1920.0, 7680.0)
PREEMPTION_BUCKETS = (1, 2, 3, 4, 5, 10, 20)
N_BUCKETS = (1, 2, 5, 10, 20)
FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")  # vLLM 0.32's label values


def buckets_1_2_5(maximum: int) -> tuple[float, ...]:
    """vLLM's ``build_1_2_5_buckets``: 1, 2, 5, 10, 20, 50, ... up to ``maximum``."""
    out: list[float] = []
    exponent = 0
    while True:
        for m in (1, 2, 5):
            value = m * 10**exponent
            if value > maximum:
                return tuple(out)
            out.append(float(value))
        exponent += 1


@dataclass(frozen=True)
class Family:
    """One metric family an engine exports: the attribute :class:`EngineMetrics` updates it
    through, its type, name and help text; a histogram's buckets (``TOKEN_BUCKETS``: 1-2-5 up
    to the model's length); ``by_reason``: labelled with ``finished_reason`` too."""

    attr: str
    kind: type[Gauge] | type[Counter] | type[Histogram]
    name: str
    help: str
    buckets: tuple[float, ...] | None = None
    by_reason: bool = False
    spec_only: bool = False  # registered only when speculative decoding is on


TOKEN_BUCKETS: tuple[float, ...] = ()  # a histogram of token counts: buckets_1_2_5(max_model_len)
_KINDS: dict[str, type[Gauge] | type[Counter] | type[Histogram]] = {"gauge": Gauge, "counter": Counter, "histogram": Histogram}
_BUCKETS = {"ttft": TTFT_BUCKETS, "itl": ITL_BUCKETS, "latency": LATENCY_BUCKETS, "preemption": PREEMPTION_BUCKETS,
            "n": N_BUCKETS, "tokens": TOKEN_BUCKETS}


def _families() -> dict[str, tuple[tuple[str, ...], tuple[Family, ...]]]:
    """perflab_sim/data/metrics.json: per flavour, its labels and its families as rows
    ``[attribute, kind, name, help]``; kind ``gauge``, ``counter`` or ``histogram:BUCKETS``,
    ``+reason`` where it is labelled with ``finished_reason`` too, ``+spec`` where the engine
    registers it only with speculative decoding."""
    data = json.loads(resources.files("perflab_sim").joinpath("data/metrics.json").read_text())
    out = {}
    for flavour, entry in data.items():
        families = []
        for attr, spec, name, help_ in entry["families"]:
            kind, _, buckets = spec.partition(":")
            kind, *flags = kind.split("+")
            families.append(Family(attr, _KINDS[kind], name, help_, _BUCKETS[buckets] if buckets else None,
                                   "reason" in flags, "spec" in flags))
        out[flavour] = (tuple(entry["labels"]), tuple(families))
    return out


# flavour -> (labels, families), in the order the engine registers them (the exposition's order)
FAMILIES = _families()

@dataclass(frozen=True)
class Finished:
    """One finished request, as the metrics see it (times in simulated seconds)."""

    rank: int
    reason: str  # "stop" | "length" | "abort"
    prompt_tokens: int
    generated: int
    max_tokens: int
    ttft_s: float | None
    e2e_s: float
    queue_s: float
    prefill_s: float
    preemptions: int
    cached_tokens: int


@dataclass(frozen=True)
class Snapshot:
    """One data-parallel rank's scheduler state at scrape time."""

    running: int
    waiting: int
    kv_usage: float  # 0..1
    kv_used_tokens: int
    prefix_queries: int
    prefix_hits: int
    preemptions: int
    spec_drafts: int = 0  # verification steps of a sequence with drafts
    spec_draft_tokens: int = 0  # draft tokens proposed
    spec_accepted: int = 0  # draft tokens accepted


#: the scheduler's running totals the counters mirror (the counter's attribute = the field)
TOTALS = ("prefix_queries", "prefix_hits", "preemptions", "spec_drafts", "spec_draft_tokens", "spec_accepted")


class EngineMetrics:
    """Counters and histograms an engine updates as it serves; ``render()`` is ``/metrics``."""

    # the gauges every flavour's family table declares (set by name in __init__)
    running: Gauge
    waiting: Gauge
    kv_usage: Gauge
    hit_rate: Gauge

    def __init__(self, engine: str, model_name: str, ranks: int, max_model_len: int, spec: bool = False) -> None:
        self.engine = engine
        self.model_name = model_name
        self.ranks = ranks
        self.spec = spec
        self.registry = CollectorRegistry(auto_describe=False)
        self._seen: dict[tuple[str, int], int] = {}  # scheduler totals already counted
        self._window: dict[str, tuple[int, int]] = {}  # a rate gauge's totals at the previous scrape
        self.flavour = {"vllm": "vllm", "vllm-ascend": "vllm", "sglang": "sglang", "trtllm": "trtllm"}.get(
            engine, "mindie"
        )
        self._build(max(2, max_model_len))

    # ---------------------------------------------------------------------------- families
    def _build(self, max_model_len: int) -> None:
        """Register the flavour's families (:data:`FAMILIES`) as attributes."""
        labels, families = FAMILIES[self.flavour]
        tokens = buckets_1_2_5(max_model_len)
        for f in families:
            if f.spec_only and not self.spec:
                continue
            names = [*labels, "finished_reason"] if f.by_reason else list(labels)
            kw: dict[str, Any] = {"registry": self.registry}
            if f.kind is Histogram:
                kw["buckets"] = tokens if f.buckets == TOKEN_BUCKETS else f.buckets
            setattr(self, f.attr, f.kind(f.name, f.help, names, **kw))
        self._init_children()

    def _labels(self, rank: int) -> dict[str, str]:
        if self.flavour == "vllm":
            return {"engine": str(rank), "model_name": self.model_name}
        if self.flavour == "trtllm":
            return {"model_name": self.model_name, "engine_type": "trtllm"}
        return {"model_name": self.model_name}

    def _init_children(self) -> None:
        """Create every labelled series up front, as the engines do (zeros before traffic)."""
        for rank in range(self.ranks if self.flavour == "vllm" else 1):
            lab = self._labels(rank)
            for name, metric in vars(self).items():
                if isinstance(metric, (Counter, Gauge, Histogram)) and name not in ("success",):
                    metric.labels(**lab)
            if hasattr(self, "success"):
                for reason in FINISHED_REASONS if self.flavour == "vllm" else ("stop", "length", "abort"):
                    self.success.labels(**lab, finished_reason=reason)

    def _rank(self, rank: int) -> dict[str, str]:
        return self._labels(rank if self.flavour == "vllm" else 0)

    # ---------------------------------------------------------------------------- events
    def token_interval(self, rank: int, seconds: float) -> None:
        """Time between two outputs of one request (an inter-token latency)."""
        h = getattr(self, "h_itl", None)
        if h is not None:
            h.labels(**self._rank(rank)).observe(max(0.0, seconds))

    def finished(self, f: Finished) -> None:
        lab = self._rank(f.rank)
        # the flavour's counters and histograms (an attribute it lacks is skipped)
        counted = (("prompt_tokens", f.prompt_tokens), ("generation_tokens", f.generated),
                   ("cached_tokens", f.cached_tokens), ("requests", 1))
        for attr, amount in counted:
            counter = getattr(self, attr, None)
            if counter is not None:
                counter.labels(**lab).inc(amount)
        if hasattr(self, "success"):
            self.success.labels(**lab, finished_reason=f.reason).inc()
        if f.reason == "abort" and self.flavour == "vllm":
            return  # vLLM observes the request histograms for finished requests only
        decode_s = max(0.0, f.e2e_s - (f.ttft_s or f.e2e_s))
        observed = (
            ("h_ttft", f.ttft_s), ("h_e2e", f.e2e_s), ("h_queue", f.queue_s),
            ("h_tpot", decode_s / (f.generated - 1) if f.generated > 1 else 0.0),
            ("h_prompt", f.prompt_tokens), ("h_generation", f.generated), ("h_max_tokens", f.max_tokens), ("h_n", 1),
            ("h_inference", max(0.0, f.e2e_s - f.queue_s)), ("h_prefill", f.prefill_s), ("h_decode", decode_s),
            ("h_preemptions", f.preemptions),
        )
        for attr, value in observed:
            histogram = getattr(self, attr, None)
            if histogram is not None and value is not None:
                histogram.labels(**lab).observe(value)

    # ---------------------------------------------------------------------------- scrape
    def _mirror(self, attr: str, rank: int, lab: dict[str, str], total: int) -> None:
        """Bring a counter up to the scheduler's running total."""
        counter = getattr(self, attr, None)
        seen = self._seen.get((attr, rank), 0)
        if counter is not None and total > seen:
            counter.labels(**lab).inc(total - seen)
            self._seen[(attr, rank)] = total

    def _rate(self, attr: str, lab: dict[str, str], part: int, whole: int) -> None:
        """A rate gauge over what happened since the previous scrape (unchanged if nothing did)."""
        gauge = getattr(self, attr, None)
        if gauge is None:
            return
        part0, whole0 = self._window.get(attr, (0, 0))
        if whole > whole0:
            gauge.labels(**lab).set((part - part0) / (whole - whole0))
        self._window[attr] = (part, whole)

    def render(self, snapshots: Sequence[Snapshot]) -> bytes:
        """The exposition text, gauges set from ``snapshots`` (one per data-parallel rank)."""
        if self.flavour == "vllm":
            for rank, s in enumerate(snapshots):
                lab = self._labels(rank)
                self.running.labels(**lab).set(s.running)
                self.waiting.labels(**lab).set(s.waiting)
                self.kv_usage.labels(**lab).set(s.kv_usage)
                for attr in TOTALS:  # counters mirror the scheduler's own running totals
                    self._mirror(attr, rank, lab, getattr(s, attr))
        else:
            lab = self._labels(0)
            self.running.labels(**lab).set(sum(s.running for s in snapshots))
            self.waiting.labels(**lab).set(sum(s.waiting for s in snapshots))
            self.kv_usage.labels(**lab).set(max((s.kv_usage for s in snapshots), default=0.0))
            if hasattr(self, "used_tokens"):
                self.used_tokens.labels(**lab).set(sum(s.kv_used_tokens for s in snapshots))
            totals = {attr: sum(getattr(s, attr) for s in snapshots) for attr in TOTALS}
            for attr, total in totals.items():
                self._mirror(attr, 0, lab, total)
            if self.flavour == "mindie":  # RadixMatchDataCollect: all matches so far
                queries = totals["prefix_queries"]
                self.hit_rate.labels(**lab).set(totals["prefix_hits"] / queries if queries else 0.0)
            else:
                self._rate("hit_rate", lab, totals["prefix_hits"], totals["prefix_queries"])
                self._rate("spec_accept_rate", lab, totals["spec_accepted"], totals["spec_draft_tokens"])
        return generate_latest(self.registry)
