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
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

__all__ = ["DEFAULT_WARMUP", "DecideBy", "Decision", "LoadKind", "Slo", "SloCheck"]

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
        return {"throughput": "total_token_throughput", "goodput": "request_goodput", "max-load": "capacity"}[self.value]

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
        return f"p{_pct_name(self.percentile)}_{SLO_METRICS[key][0]}"

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


def _pct_name(p: float) -> str:
    """vLLM's percentile key spelling: 99 -> "99", 99.9 -> "99.9"."""
    return str(int(p)) if float(p).is_integer() else f"{p:g}"


@dataclass(frozen=True)
class Decision:
    """The plan's decision keys (defaults: the seeds' method)."""

    decide_by: DecideBy = DecideBy.THROUGHPUT
    slo: Slo = Slo()
    search: LoadKind = LoadKind.REQUEST_RATE
    repeats: int = 1
    warmup: int = DEFAULT_WARMUP
    early_stop: bool = True

    def to_json(self) -> dict[str, Any]:
        return {"decide_by": str(self.decide_by), "slo": self.slo.to_json() if self.slo else None,
                "search": str(self.search), "repeats": self.repeats, "warmup": self.warmup,
                "early_stop": self.early_stop}
