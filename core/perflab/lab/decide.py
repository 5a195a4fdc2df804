"""How a study decides: the plan's ``decide_by``, ``slo``, ``search``, ``repeats``, ``warmup``
and ``early_stop`` keys, declared once here and read by the plan parser, the executor (what to
measure) and the study (how to rank).

``decide_by``
    ``throughput`` — the seeds' method and the default: total token throughput of the main
    profile; ``goodput`` — requests per second meeting every SLO (vLLM's definition,
    ``vllm bench serve --goodput``); ``max-load`` — per configuration, the highest load
    (``search``: ``request_rate`` or ``max_concurrency``) whose chosen percentile meets the
    SLO, found in one launch by bracketing and bisecting (``vllm bench sweep serve_sla``).
``slo``
    ``{ttft_ms, tpot_ms, e2el_ms, percentile}``, any subset of the limits; the percentile
    (default 99) is the one compared with the limits.
``repeats``
    each measurement is run this many times in the same launch; a candidate is adopted only
    when its gain exceeds both ``min_improvement_pct`` and the measured noise.
``warmup``
    requests sent before each measured profile, excluded from the results.
``early_stop``
    a measured profile may stop when the configuration has clearly lost or is over-saturated
    (``perflab run --no-early-stop`` turns it off).
``guards``
    what a recommendation must not cost in latency (:class:`Guards`): absolute limits on latency
    metrics of the main profile and the most each may regress against the baseline, which make a
    configuration ineligible, and the regression (``latency_regression_pct``, default 10 %)
    beyond which the report flags a latency metric of the recommendation on any profile.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from perflab.bench.metrics import name_of

__all__ = ["DEFAULT_WARMUP", "DecideBy", "Decision", "Guards", "LoadKind", "Regression", "Slo", "SloCheck",
           "is_latency_metric", "latency_regressions", "pct_name"]

#: Warm-up requests before each measured profile: enough to compile/capture the first batch
#: shapes and fill connection pools, small enough to cost seconds (AIPerf's default warm-up
#: is a request count too; vLLM's bench has ``--num-warmups``).
DEFAULT_WARMUP = 8


class DecideBy(StrEnum):
    """What ranks configurations."""

    THROUGHPUT = "throughput"
    GOODPUT = "goodput"
    MAX_LOAD = "max-load"

    @property
    def metric(self) -> str:
        """The metrics key (or derived figure) a configuration is ranked by."""
        if self is DecideBy.THROUGHPUT:
            return name_of(lambda m: m.total_token_throughput)
        return name_of(lambda m: m.request_goodput) if self is DecideBy.GOODPUT else "capacity"

    @property
    def needs_slo(self) -> bool:
        return self is not DecideBy.THROUGHPUT


class LoadKind(StrEnum):
    """The load axis a sweep or a max-load search moves along (a profile key)."""

    REQUEST_RATE = "request_rate"
    MAX_CONCURRENCY = "max_concurrency"


#: SLO plan key -> (the latency the bench reports, vLLM's --goodput name)
SLO_METRICS: Mapping[str, tuple[str, str]] = {
    "ttft_ms": ("ttft_ms", "ttft"),
    "tpot_ms": ("tpot_ms", "tpot"),
    "e2el_ms": ("e2el_ms", "e2el"),
}
SLO_KEYS = (*SLO_METRICS, "percentile")


@dataclass(frozen=True)
class SloCheck:
    """One SLO limit against what was measured (``measured`` None: the metric is missing)."""

    key: str  # "tpot_ms"
    limit: float
    measured: float | None
    percentile: float

    @property
    def met(self) -> bool:
        return self.measured is not None and self.measured <= self.limit

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "limit": self.limit, "measured": self.measured, "percentile": self.percentile,
                "met": self.met}


@dataclass(frozen=True)
class Slo:
    """Latency limits in milliseconds at one percentile."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2el_ms: float | None = None
    percentile: float = 99.0

    def limits(self) -> dict[str, float]:
        return {k: v for k in SLO_METRICS if (v := getattr(self, k)) is not None}

    def __bool__(self) -> bool:
        return bool(self.limits())

    def metric_key(self, key: str) -> str:
        """The bench metrics key of ``key`` at this percentile: ``p99_tpot_ms``."""
        return f"p{pct_name(self.percentile)}_{SLO_METRICS[key][0]}"

    def goodput(self) -> tuple[tuple[str, float], ...]:
        """The bench request's ``goodput`` (vLLM's ``--goodput ttft:500 tpot:50``)."""
        return tuple((SLO_METRICS[k][1], v) for k, v in self.limits().items())

    def check(self, metrics: Mapping[str, Any] | None) -> tuple[SloCheck, ...]:
        """Each limit against ``metrics`` (a bench result's metrics with this percentile)."""
        out = []
        for key, limit in self.limits().items():
            value = (metrics or {}).get(self.metric_key(key))
            measured = float(value) if isinstance(value, (int, float)) and not math.isnan(value) else None
            out.append(SloCheck(key, limit, measured, self.percentile))
        return tuple(out)

    def met(self, metrics: Mapping[str, Any] | None) -> bool:
        """Every limit met (an SLO without limits is always met)."""
        return all(c.met for c in self.check(metrics))

    def to_json(self) -> dict[str, Any]:
        return {**self.limits(), "percentile": self.percentile}


def pct_name(p: float) -> str:
    """vLLM's percentile key spelling: 99 -> "99", 99.9 -> "99.9"."""
    return str(int(p)) if float(p).is_integer() else f"{p:g}"


#: a latency metric of a benchmark result, as vLLM names it: ``mean_tpot_ms``, ``p99_ttft_ms``
LATENCY_METRIC = re.compile(r"^(?P<stat>mean|median|p(?P<pct>\d+(?:\.\d+)?))_(?P<kind>ttft|tpot|itl|e2el)_ms$")
#: the regression beyond which a latency metric of the recommendation is flagged (percent)
DEFAULT_LATENCY_REGRESSION_PCT = 10.0
GUARD_KEYS = ("latency_regression_pct", "max_regression")  # beside the metrics' own limits


def is_latency_metric(key: Any) -> bool:
    """``key`` names a latency metric a benchmark reports (a percentile in (0, 100])."""
    m = LATENCY_METRIC.match(key) if isinstance(key, str) else None
    return m is not None and (m["pct"] is None or 0.0 < float(m["pct"]) <= 100.0)


def latency_label(metric: str) -> str:
    """``p99 TPOT`` for ``p99_tpot_ms``, ``mean TTFT`` for ``mean_ttft_ms``."""
    m = LATENCY_METRIC.match(metric)
    return f"{m['stat']} {m['kind'].upper()}" if m else metric


def _latency(metrics: Mapping[str, Any] | None, key: str) -> float | None:
    v = (metrics or {}).get(key)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


@dataclass(frozen=True)
class Regression:
    """One latency metric worse than the baseline's by ``change_pct`` percent."""

    metric: str
    baseline: float
    measured: float
    change_pct: float

    def text(self) -> str:
        """``mean TPOT +224.8%`` (the figures themselves are in report.json)."""
        return f"{latency_label(self.metric)} {self.change_pct:+.1f}%"

    def to_json(self) -> dict[str, Any]:
        return {"metric": self.metric, "baseline": self.baseline, "measured": self.measured,
                "change_pct": round(self.change_pct, 2)}


def latency_regressions(metrics: Mapping[str, Any] | None, baseline: Mapping[str, Any] | None,
                        threshold_pct: float) -> list[Regression]:
    """Every latency metric (mean, median and percentiles of TTFT, TPOT, ITL, E2EL) both results
    have that is higher in ``metrics`` than in ``baseline`` by more than ``threshold_pct``."""
    out = []
    for key in metrics or {}:
        if not LATENCY_METRIC.match(key):
            continue
        new, old = _latency(metrics, key), _latency(baseline, key)
        if new is None or old is None or old <= 0:
            continue
        change = (new / old - 1.0) * 100.0
        if change > threshold_pct:
            out.append(Regression(key, old, new, change))
    return out


@dataclass(frozen=True)
class Guards:
    """The plan's ``guards:`` — what makes a configuration ineligible for adoption whatever
    its ranking figure: ``limits`` (a latency metric of the main profile above this many ms)
    and ``max_regression`` (a latency metric worse than the baseline's on the main profile by
    more than this fraction); and ``latency_regression_pct``, the regression beyond which the
    report flags a latency metric of the recommendation (every profile; not a guard by itself)."""

    limits: tuple[tuple[str, float], ...] = ()
    max_regression: tuple[tuple[str, float], ...] = ()
    latency_regression_pct: float = DEFAULT_LATENCY_REGRESSION_PCT

    def __bool__(self) -> bool:
        return bool(self.limits or self.max_regression)

    def percentiles(self) -> tuple[float, ...]:
        """The percentiles the guards read (the bench is asked for them)."""
        out = set()
        for key, _ in (*self.limits, *self.max_regression):
            m = LATENCY_METRIC.match(key)
            if m and m["pct"]:
                out.add(float(m["pct"]))
        return tuple(sorted(out))

    def metrics(self) -> tuple[str, ...]:
        """The latency kinds the guards read (ttft, tpot, itl, e2el): the bench is asked for them."""
        out = []
        for key, _ in (*self.limits, *self.max_regression):
            m = LATENCY_METRIC.match(key)
            if m and m["kind"] not in out:
                out.append(m["kind"])
        return tuple(out)

    def violations(self, metrics: Mapping[str, Any] | None, baseline: Mapping[str, Any] | None) -> list[str]:
        """Why ``metrics`` (the main profile's) break a guard, one phrase each (none: eligible).
        A metric a guard reads that was not measured breaks it (nothing passes unchecked); a
        regression guard without the baseline's figure waits for it (the baseline is measured
        first on the main profile when its engine is in ``engines``)."""
        out = []
        for key, limit in self.limits:
            v = _latency(metrics, key)
            if v is None:
                out.append(f"guard {key} ≤ {limit:g} ms: {latency_label(key)} not measured")
            elif v > limit:
                out.append(f"guard {key} ≤ {limit:g} ms: {latency_label(key)} {v:.2f} ms")
        for key, frac in self.max_regression:
            v, b = _latency(metrics, key), _latency(baseline, key)
            if baseline is None:
                continue
            if v is None or b is None:
                out.append(f"guard max_regression.{key} ≤ {frac * 100:g}%: {latency_label(key)} not measured")
            elif b > 0 and (v / b - 1.0) > frac:
                out.append(f"guard max_regression.{key} ≤ {frac * 100:g}%: {latency_label(key)} "
                           f"{(v / b - 1.0) * 100:+.1f}% vs the baseline ({b:.2f} → {v:.2f} ms)")
        return out

    def to_json(self) -> dict[str, Any]:
        return {**dict(self.limits), "max_regression": dict(self.max_regression) or None,
                "latency_regression_pct": self.latency_regression_pct}


@dataclass(frozen=True)
class Decision:
    """The plan's decision keys (defaults: the seeds' method)."""

    decide_by: DecideBy = DecideBy.THROUGHPUT
    slo: Slo = Slo()
    search: LoadKind = LoadKind.REQUEST_RATE
    repeats: int = 1
    warmup: int = DEFAULT_WARMUP
    early_stop: bool = True
    guards: Guards = Guards()

    def to_json(self) -> dict[str, Any]:
        return {"decide_by": str(self.decide_by), "slo": self.slo.to_json() if self.slo else None,
                "search": str(self.search), "repeats": self.repeats, "warmup": self.warmup,
                "early_stop": self.early_stop, "guards": self.guards.to_json()}
