"""Energy and cost of a measurement (issue #13): what the accelerators' telemetry and the plan's
price turn a benchmark into.

* **Energy** (J) = ∫ power dt over the benchmark, summed over the launch's devices. The
  samples cover more than the benchmark (before its first request the client loads its
  tokenizer and sends the plan's warm-up requests, after its last it computes its metrics):
  the idle power (the lowest sampled) over the bench's ``duration``, plus what the devices drew
  above idle from the first sample to the last — the difference of NVML's energy counters
  where the samples have them, else the trapezoid over their power — less the warm-up's
  share of it (in proportion to the requests). In simulation the samples' time is the
  simulated engines' model time (``engine_t``), the clock the bench measures simulated
  durations on. **Output tokens per joule** = total output tokens / joules.
* **Cost** per million output tokens = ``per_accelerator_hour`` × accelerators × duration (h)
  / output tokens × 10⁶, from the plan's ``cost: {per_accelerator_hour: 2.50, currency: USD}``
  (:class:`Cost`); it needs no telemetry.

:func:`observed_extras` gives a measurement's ``energy`` and ``cost`` entries (the executor
calls it once per measurement); :func:`summary_lines` and :func:`result_lines` are what the
report shows of them.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from perflab.bench.metrics import BenchMetrics
from perflab.observe import Sample, timed_run
from perflab.observe.telemetry import ENERGY, ENGINE_T, POWER, UTILIZATION, per_device, total_power_w
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


def _time(s: Sample) -> float:
    """A sample's engine time: the simulated engines' model time where it carries it."""
    return float(s.values.get(ENGINE_T, s.t))


def _power_series(samples: Sequence[Sample]) -> list[tuple[float, float]]:
    """(engine time, watts summed over the devices) of the samples with power."""
    return sorted((_time(s), p) for s in samples if (p := total_power_w(s.values)) is not None)


def _trapezoid(pts: Sequence[tuple[float, float]]) -> float:
    return sum((t1 - t0) * (p0 + p1) / 2 for (t0, p0), (t1, p1) in itertools.pairwise(pts))


def watched_energy(samples: Sequence[Sample]) -> tuple[float, float] | None:
    """(joules, engine seconds) from the first sample to the last: the difference of the
    devices' energy counters where every sample has them (NVML ``energy_mj``: exact, whatever
    happened between samples), else the trapezoid over their power. None with fewer than two
    samples."""
    timed = sorted(samples, key=_time)
    if len(timed) < 2:
        return None
    first, last = timed[0], timed[-1]
    span = _time(last) - _time(first)
    counters = [per_device(s.values, ENERGY) for s in (first, last)]
    if counters[0] and counters[0].keys() == counters[1].keys() and \
            all(per_device(s.values, ENERGY).keys() == counters[0].keys() for s in timed):
        return sum(counters[1][d] - counters[0][d] for d in counters[0]) / 1000.0, span
    pts = _power_series(timed)
    if len(pts) < 2:
        return None
    return _trapezoid(pts), pts[-1][0] - pts[0][0]


def energy(samples: Sequence[Sample], duration_s: float | None, output_tokens: float | None, *,
           requests: int | None = None, warmup_requests: int = 0) -> dict[str, float] | None:
    """``{"joules", "output_tokens_per_joule"}`` of a benchmark of ``duration_s`` engine seconds
    (None without power or a duration), and ``uncertainty_pct`` where the samples carry
    utilization: how far off the idle estimate may put the joules (:func:`idle_error`).

    The samples run from before the first request (the client loads its tokenizer and dataset)
    to after the last (it computes its metrics), the devices idle meanwhile: the benchmark's
    energy is the idle power (the lowest sampled) over its ``duration_s`` plus what the devices
    drew above idle over the watch. That includes the plan's ``warmup_requests`` (the workload's
    first prompt, sent just before the timed run, inside the watch): the excess is shared in
    proportion, ``requests`` / (``requests`` + ``warmup_requests``) of it the benchmark's. A
    watch shorter than the benchmark (its last sample before the end) has its excess scaled to
    the duration; a single sample gives its power for the whole benchmark.

    Where samples were taken as the timed run began and ended (``Sample.mark``, the lab's
    :class:`perflab.observe.TimedRun`), the watch is cut to them: the loading, the warm-up and
    the metrics are outside it, no share is estimated, and the idle power (still the lowest
    sample of the whole watch) only counts for the few moments between a mark and the run."""
    if not duration_s or duration_s <= 0 or not math.isfinite(duration_s):
        return None
    pts, every = _power_series(samples), samples  # the idle estimate looks at every sample
    cut = timed_run(samples)
    if cut is not None:
        # readings where the timed run began and ended (perflab.observe.TimedRun): what the
        # loading, the warm-up and the metrics drew is outside the watch, nothing to share out
        samples, warmup_requests = cut, 0
    watched = watched_energy(samples)
    idle_error_w, exposure_s = None, 0.0
    if watched is None or watched[1] <= 0:
        if not pts:
            return None
        joules = pts[-1][1] * duration_s
    else:
        drawn, span = watched
        idle_w = min((p for _, p in pts), default=0.0)
        stretch = duration_s / span if span < duration_s else 1.0
        share = requests / (requests + warmup_requests) if requests and warmup_requests > 0 else 1.0
        excess = (drawn - idle_w * span) * stretch
        joules = idle_w * duration_s + max(0.0, excess) * share
        idle_error_w = idle_error(every)
        # how much the joules move per watt the idle estimate is off
        exposure_s = abs(duration_s - span * stretch * share) if excess > 0 else duration_s
    if joules <= 0:
        return None
    out = {"joules": round(joules, 1), "output_tokens_per_joule": round(float(output_tokens or 0) / joules, 4)}
    if idle_error_w is not None:
        out["uncertainty_pct"] = round(100 * idle_error_w * exposure_s / joules, 2)
    return out


def idle_error(samples: Sequence[Sample]) -> float | None:
    """At most how many watts the idle power (the lowest sampled) may be above the devices' true
    idle (None: the samples carry no utilization). A sample's power is its period's mean, and a
    device that ran kernels for ``u`` % of the period (its utilization, a whole percent: up to
    ``u + 1``) drew at most that share of its full draw above idle on top of idle — the
    highest power the watch sampled stands for the full draw. The error is never below: no
    sample is below idle. Over a watch much longer than the benchmark (the client loading,
    warm-up, at the simulator's time scale many engine seconds) this is most of what an
    energy figure can be off by (``uncertainty_pct``: ``perflab compare`` adds it to the noise)."""
    timed = [(s, p) for s in samples if (p := total_power_w(s.values)) is not None]
    if not timed:
        return None
    low, _ = min(timed, key=lambda sp: sp[1])
    util = per_device(low.values, UTILIZATION)
    power_low = per_device(low.values, POWER)
    if not util or util.keys() != power_low.keys():
        return None
    peak: dict[int, float] = {}
    for s, _ in timed:
        for d, w in per_device(s.values, POWER).items():
            peak[d] = max(peak.get(d, w), w)
    return sum(min(1.0, (util[d] + 1) / 100) * max(0.0, peak[d] - power_low[d]) for d in util)


def cost(price: Cost | None, accelerators: int, duration_s: float | None, output_tokens: float | None) -> dict[str, Any] | None:
    """``{"per_million_output_tokens", "currency", "per_accelerator_hour"}`` (None without a
    price, a duration or output tokens)."""
    if price is None or not duration_s or duration_s <= 0 or not output_tokens:
        return None
    total = price.per_accelerator_hour * max(1, accelerators) * duration_s / 3600.0
    return {"per_million_output_tokens": round(total / float(output_tokens) * 1e6, 4),
            "currency": price.currency, "per_accelerator_hour": price.per_accelerator_hour}


def observed_extras(samples: Mapping[str, Sequence[Sample]], metrics: Mapping[str, Any] | None, price: Cost | None,
                    accelerators: int, warmup_requests: int = 0) -> dict[str, Any]:
    """A measurement's ``energy`` and ``cost`` (each only when it can be computed);
    ``warmup_requests``: the plan's ``warmup``, sent inside the watched time (:func:`energy`)."""
    m = BenchMetrics.of(metrics or {})
    duration, tokens = m.duration, m.total_output_tokens
    sent = int(m.completed or 0) + int(m.failed or 0)
    out: dict[str, Any] = {}
    e = energy(samples.get(TELEMETRY) or [], duration, tokens, requests=sent or None, warmup_requests=warmup_requests)
    if e is not None:
        out["energy"] = e
    c = cost(price, accelerators, duration, tokens)
    if c is not None:
        out["cost"] = c
    return out


# --------------------------------------------------------------------------- the report


def _result(res: Any) -> Any:
    return getattr(res, "result", res)  # an Entry or a ConfigResult


#: what :func:`efficiency_text` may show: (the observed key, its name, what its figure is)
EFFICIENCY_FIGURES: tuple[tuple[str, str, str], ...] = (
    ("energy", "energy", "output tokens per joule of accelerator energy"),
    ("cost", "cost", "cost per million output tokens"),
)


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
        n = len(t.get("devices") or [])
        lines.append(f"# Power ({t.get('source')}, {n} device{'s' if n != 1 else ''}): mean {t['power_w']['mean']:.0f} W, "
                     f"peak {t['power_w']['peak']:.0f} W; utilization mean {util.get('mean', 0):.0f} %")
    if e := obs.get("energy"):
        within = f" ±{u:.0f} %" if (u := e.get("uncertainty_pct")) is not None and u >= 0.5 else ""
        lines.append(f"# Energy: {e['joules']:.0f} J{within}, {e['output_tokens_per_joule']:.3g} output tokens/J")
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
        # name only the figures shown: a study without a price has no cost to explain
        shown = [(name, unit) for key, name, unit in EFFICIENCY_FIGURES
                 if any((getattr(_result(x), "observed", None) or {}).get(key) for x in (baseline, optimized))]
        lines.append(f"{' and '.join(n for n, _ in shown).capitalize()} on the main profile: baseline {b or 'n/a'} → "
                     f"optimized {o or 'n/a'} ({'; '.join(u for _, u in shown)}).")
    if not any_energy:
        any_telemetry = any((getattr(r, "observed", None) or {}).get(TELEMETRY) for r in measured)
        lines.append("No accelerator power was recorded (the devices do not report it), so there are no energy figures."
                     if any_telemetry else
                     "No accelerator telemetry was recorded (NVML / npu-smi did not answer on this machine), "
                     "so there are no power or energy figures.")
    if price is None and any_energy:
        lines.append("Give the plan a `cost: {per_accelerator_hour: ..., currency: USD}` to see the cost per million output tokens.")
    return lines
