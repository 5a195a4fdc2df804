"""Energy and cost of a measurement (issue #13): what the accelerators' telemetry and the plan's
price turn a benchmark into.

* **Energy** (J) = ∫ power dt over the benchmark, power summed over the launch's devices: the
  trapezoid over the telemetry samples' engine-time ``t``, over the bench's ``duration``
  placed where the devices drew the most energy (:func:`benchmark_window`: before the first
  request the client loads its tokenizer and warms up, after the last it computes its
  metrics, the devices idle meanwhile). In simulation the samples' time is the simulated
  engines' model time (``engine_t``), the clock the bench measures simulated durations on.
  **Output tokens per joule** = total output tokens / joules.
* **Cost** per million output tokens = ``per_accelerator_hour`` × accelerators × duration (h)
  / output tokens × 10⁶, from the plan's ``cost: {per_accelerator_hour: 2.50, currency: USD}``
  (:class:`Cost`); it needs no telemetry.

:func:`observed_extras` gives a measurement's ``energy`` and ``cost`` entries (the executor
calls it once per measurement); :func:`summary_lines` and :func:`result_lines` are what the
report shows of them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from perflab.observe import Sample
from perflab.observe.telemetry import ENGINE_T, total_power_w
from perflab.observe.telemetry import KEY as TELEMETRY

COST_KEYS = ("per_accelerator_hour", "currency")
DEFAULT_CURRENCY = "USD"


@dataclass(frozen=True)
class Cost:
    """The plan's ``cost:``: what one accelerator costs per hour."""

    per_accelerator_hour: float
    currency: str = DEFAULT_CURRENCY

    def to_json(self) -> dict[str, Any]:
        return {"per_accelerator_hour": self.per_accelerator_hour, "currency": self.currency}


def _power_series(samples: Sequence[Sample]) -> list[tuple[float, float]]:
    """(engine time, watts) of the samples with power: the simulated engines' model time where
    a sample carries it (``engine_t``), else the sample's ``t``."""
    return sorted((float(s.values.get(ENGINE_T, s.t)), p) for s in samples if (p := total_power_w(s.values)) is not None)


def _integral(pts: Sequence[tuple[float, float]], a: float, b: float) -> float:
    """∫ from ``a`` to ``b`` of the piecewise-linear power through ``pts`` (held constant
    before the first and after the last point)."""
    if b <= a:
        return 0.0

    def at(t: float) -> float:
        if t <= pts[0][0]:
            return pts[0][1]
        if t >= pts[-1][0]:
            return pts[-1][1]
        for (t0, p0), (t1, p1) in zip(pts, pts[1:], strict=False):
            if t0 <= t <= t1:
                return p0 if t1 == t0 else p0 + (p1 - p0) * (t - t0) / (t1 - t0)
        return pts[-1][1]

    knots = [a, *(t for t, _ in pts if a < t < b), b]
    return sum((t1 - t0) * (at(t0) + at(t1)) / 2 for t0, t1 in zip(knots, knots[1:], strict=False))


def benchmark_window(pts: Sequence[tuple[float, float]], duration_s: float) -> tuple[float, float]:
    """Where the benchmark's ``duration_s`` lie among the samples: the watch runs from before
    the first request (the client loads its tokenizer and dataset, sends its warm-up requests)
    to after the last (it computes its metrics), with the devices idle at both ends, so the
    benchmark is the ``duration_s``-long stretch in which they drew the most energy. The
    stretch is searched on a grid of 1/200 of the samples' span and on every sample time."""
    t0, t1 = pts[0][0], pts[-1][0]
    if t1 - t0 <= duration_s:
        return t1 - duration_s, t1  # the whole span, the first power held before it
    step = (t1 - t0 - duration_s) / 200
    starts = {t0 + i * step for i in range(201)}
    starts |= {t for t, _ in pts if t + duration_s <= t1} | {t - duration_s for t, _ in pts if t - duration_s >= t0}
    best = max(sorted(starts), key=lambda a: _integral(pts, a, a + duration_s))
    return best, best + duration_s


def energy(samples: Sequence[Sample], duration_s: float | None, output_tokens: float | None) -> dict[str, float] | None:
    """``{"joules", "output_tokens_per_joule"}`` of a benchmark of ``duration_s`` engine seconds
    (None without power samples or a duration): the trapezoid over its window among the
    samples (:func:`benchmark_window`)."""
    pts = _power_series(samples)
    if not pts or not duration_s or duration_s <= 0 or not math.isfinite(duration_s):
        return None
    a, b = benchmark_window(pts, duration_s)
    joules = _integral(pts, a, b)
    if joules <= 0:
        return None
    return {"joules": round(joules, 1),
            "output_tokens_per_joule": round(float(output_tokens or 0) / joules, 4)}


def cost(price: Cost | None, accelerators: int, duration_s: float | None, output_tokens: float | None) -> dict[str, Any] | None:
    """``{"per_million_output_tokens", "currency", "per_accelerator_hour"}`` (None without a
    price, a duration or output tokens)."""
    if price is None or not duration_s or duration_s <= 0 or not output_tokens:
        return None
    total = price.per_accelerator_hour * max(1, accelerators) * duration_s / 3600.0
    return {"per_million_output_tokens": round(total / float(output_tokens) * 1e6, 4),
            "currency": price.currency, "per_accelerator_hour": price.per_accelerator_hour}


def observed_extras(samples: Mapping[str, Sequence[Sample]], metrics: Mapping[str, Any] | None, price: Cost | None,
                    accelerators: int) -> dict[str, Any]:
    """A measurement's ``energy`` and ``cost`` (each only when it can be computed)."""
    m = metrics or {}
    duration, tokens = m.get("duration"), m.get("total_output_tokens")
    out: dict[str, Any] = {}
    e = energy(samples.get(TELEMETRY) or [], duration, tokens)
    if e is not None:
        out["energy"] = e
    c = cost(price, accelerators, duration, tokens)
    if c is not None:
        out["cost"] = c
    return out


# --------------------------------------------------------------------------- the report


def _result(res: Any) -> Any:
    return getattr(res, "result", res)  # an Entry or a ConfigResult


def efficiency_text(res: Any) -> str | None:
    """``0.412 tok/J · 2.07 USD/M tok`` of a result (None: neither was measured)."""
    r = _result(res)
    if r is None:
        return None
    obs = getattr(r, "observed", None) or {}
    parts = []
    if (e := obs.get("energy")) and e.get("output_tokens_per_joule") is not None:
        parts.append(f"{e['output_tokens_per_joule']:.3g} tok/J")
    if (c := obs.get("cost")) and c.get("per_million_output_tokens") is not None:
        parts.append(f"{c['per_million_output_tokens']:.3g} {c.get('currency', DEFAULT_CURRENCY)}/M tok")
    return " · ".join(parts) or None


def result_lines(res: Any) -> list[str]:
    """What a result block adds: ``# Power ...``, ``# Energy ...``, ``# Cost ...`` lines."""
    r = _result(res)
    obs = getattr(r, "observed", None) or {}
    lines: list[str] = []
    t = obs.get(TELEMETRY)
    if t and t.get("power_w"):
        util = t.get("utilization_pct") or {}
        lines.append(f"# Power ({t.get('source')}, {len(t.get('devices') or [])} devices): mean {t['power_w']['mean']:.0f} W, "
                     f"peak {t['power_w']['peak']:.0f} W; utilization mean {util.get('mean', 0):.0f} %")
    if e := obs.get("energy"):
        lines.append(f"# Energy: {e['joules']:.0f} J, {e['output_tokens_per_joule']:.3g} output tokens/J")
    if c := obs.get("cost"):
        lines.append(f"# Cost: {c['per_million_output_tokens']:.3g} {c['currency']} per million output tokens "
                     f"({c['per_accelerator_hour']:g} {c['currency']}/accelerator-hour)")
    return lines


def step_lines(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """Below the summary table: each step's best variant in output tokens per joule and cost
    (the rows' ``energy_cost``); nothing when no step has either."""
    parts = [f"{r['option']} {r['energy_cost']}" for r in rows if r.get("energy_cost")]
    return ["", "Energy and cost of each step's best variant (main profile): " + "; ".join(parts) + "."] if parts else []


def summary_lines(baseline: Any, optimized: Any, results: Sequence[Any], price: Cost | None) -> list[str]:
    """The conclusion's lines on energy and cost: baseline vs optimized on the main profile, or
    a note once when no telemetry was recorded anywhere."""
    measured = [r for r in (_result(x) for x in results) if r is not None and getattr(r, "metrics", None)]
    if not measured:
        return []
    lines: list[str] = []
    any_energy = any((getattr(r, "observed", None) or {}).get("energy") for r in measured)
    b, o = efficiency_text(baseline), efficiency_text(optimized) if optimized is not None else None
    if b or o:
        lines.append(f"Energy and cost on the main profile: baseline {b or 'n/a'} → optimized {o or 'n/a'}"
                     " (output tokens per joule of accelerator energy; cost per million output tokens).")
    if not any_energy:
        any_telemetry = any((getattr(r, "observed", None) or {}).get(TELEMETRY) for r in measured)
        lines.append("No accelerator power was recorded (the devices do not report it), so there are no energy figures."
                     if any_telemetry else
                     "No accelerator telemetry was recorded (NVML / npu-smi did not answer on this machine), "
                     "so there are no power or energy figures.")
    if price is None and any_energy:
        lines.append("Give the plan a `cost: {per_accelerator_hour: ..., currency: USD}` to see the cost per million output tokens.")
    return lines
