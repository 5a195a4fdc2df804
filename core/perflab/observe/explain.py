"""Why a step's candidate won or lost, in the engine's own metrics (issue #13).

A step's report text says how the candidate it adopted (or rejected) differs from the current
best in the ``server_metrics`` summaries (:mod:`perflab.observe.metrics`) — only the changes
large enough to explain something: "preemptions 412 → 0", "prefix hit rate 0 % → 63 %",
"KV-cache peak 100 % → 71 %".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from perflab.observe.metrics import KEY


def _pct(v: float) -> str:
    return f"{v * 100:.0f} %"


def _count(v: float) -> str:
    return f"{v:,.0f}" if abs(v) >= 10 or float(v).is_integer() else f"{v:.1f}"


@dataclass(frozen=True)
class Shown:
    """One figure of the summary the explanation may cite: its words, where it is in the
    summary, how it is written, and when a change of it is notable."""

    words: str
    path: tuple[str, ...]
    fmt: Callable[[float], str]
    notable: Callable[[float, float], bool]


def _fraction_moved(points: float) -> Callable[[float, float], bool]:
    """A 0..1 figure that moved by at least ``points`` (0.10: ten percentage points)."""
    return lambda a, b: abs(a - b) >= points


def _count_moved(least: float, ratio: float) -> Callable[[float, float], bool]:
    """A count that changed by a factor of at least ``ratio`` and by at least ``least``."""

    def notable(a: float, b: float) -> bool:
        lo, hi = sorted((a, b))
        return hi - lo >= least and (lo == 0 or hi / lo >= ratio)

    return notable


#: what a step's explanation may cite, in the order it is cited
SHOWN = (
    Shown("preemptions", ("preemptions",), _count, _count_moved(10, 1.5)),
    Shown("prefix hit rate", ("prefix_cache_hit_rate",), _pct, _fraction_moved(0.10)),
    Shown("KV-cache peak", ("kv_cache_usage", "peak"), _pct, _fraction_moved(0.10)),
    Shown("waiting requests (mean)", ("waiting", "mean"), _count, _count_moved(2, 1.5)),
    Shown("running requests (mean)", ("running", "mean"), _count, _count_moved(2, 1.25)),
    Shown("speculative acceptance", ("spec_decode_acceptance",), _pct, _fraction_moved(0.10)),
)


def _get(summary: Mapping[str, Any], path: tuple[str, ...]) -> float | None:
    value: Any = summary
    for key in path:
        if not isinstance(value, Mapping):
            return None
        value = value.get(key)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def changes(before: Mapping[str, Any] | None, after: Mapping[str, Any] | None) -> list[str]:
    """The notable changes from one ``server_metrics`` summary to another, as report text
    ("preemptions 412 → 0"); empty when either is missing or nothing moved much."""
    if not before or not after:
        return []
    out = []
    for s in SHOWN:
        a, b = _get(before, s.path), _get(after, s.path)
        if a is not None and b is not None and s.notable(a, b):
            out.append(f"{s.words} {s.fmt(a)} → {s.fmt(b)}")
    return out


def explain_step(step: Any) -> str:
    """One line for a step's report text: how its adopted or rejected candidate differs from the
    current best in the engine's metrics ("" when there is nothing to say)."""
    base, chosen = getattr(step, "base", None), getattr(step, "chosen", None)
    if base is None or chosen is None or chosen is base:
        return ""
    moved = changes(base.result.observed.get(KEY), chosen.result.observed.get(KEY))
    if not moved:
        return ""
    return f"Engine metrics, {chosen.label} vs {base.label}: " + "; ".join(moved) + "."
