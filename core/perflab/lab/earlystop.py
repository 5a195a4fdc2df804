"""Early stop: end a measured profile once the configuration has clearly lost, or once it is
over-saturated (issue #12 item 6; plan key ``early_stop``, ``perflab run --no-early-stop``).

The benchmark client reports its counts every :data:`perflab.bench.drive.OBSERVE_S` real
seconds (:class:`~perflab.bench.drive.Observation`); :class:`EarlyStop` cuts them into windows
of :data:`WINDOW_S` real seconds and decides from the windows, never from one chunk:

*lost* (only when the study ranks by throughput and gives a figure to beat)
    The *steady-state rate* is the rate of streamed events (about one per output token) per
    engine second in the windows while between :data:`STEADY_FROM` and :data:`STEADY_UNTIL` of
    the requests have ended (after the warm window, before the tail). A whole-run
    ``total_token_throughput`` and a steady rate are different figures, so the figure to beat
    is compared at the same *stage* (share of the requests ended) of a complete run of the
    same workload in this study (:class:`Calibration`; before one exists, *lost* never
    fires): each steady window gives an estimate of the whole-run throughput,
    ``reference whole-run throughput × this window's rate / the reference's rate at this
    stage`` (the most favourable reference when there are several). The run stops when,
    over at least :data:`MIN_WINDOWS` windows, the upper confidence bound
    ``mean + Z·stdev/√k`` of these estimates is below the figure to beat by more than
    ``margin_pct`` (the plan's ``min_improvement_pct``, at least :data:`MIN_MARGIN_PCT`).
    The confidence bound, the margin and the most favourable reference all err on the
    side of measuring on.

*over-saturated* (every measured profile, when requests arrive over time)
    For :data:`SATURATION_WINDOWS` windows in a row while requests are still arriving, the
    queue (arrived and not ended) grew and the mean latency of the requests that ended
    (arrival to end, queueing included) grew too, and the queue at least doubled: arrivals
    outrun the engine and latency grows without bound (guidellm's over-saturation stop).
    A profile that sends every request at once (the seeds' ``request_rate: inf``) never has
    a growing queue, so this never fires on it.

Window durations are engine seconds: the engine's own clock when the stream carries one
(``Observation.model_t``, perflab's simulator's model clock), else real seconds × the time
scale the client measures with.

A stop sets the benchmark's cancel event: the client ends the run as a cancelled one
(no request or thread left behind) and the measurement is ``stopped-early`` with
:attr:`EarlyStop.decided` — the figures that decided — never a failure.
"""

from __future__ import annotations

import dataclasses
import math
import threading
from dataclasses import dataclass, field
from typing import Any

from perflab.bench.drive import Observation

WINDOW_S = 0.25  # real seconds per window
STEADY_FROM = 0.05  # fraction of the requests ended before the steady state starts (warm window)
STEADY_UNTIL = 0.6  # ... and after which the tail starts (lost is not decided in the tail)
MIN_WINDOWS = 4
Z = 3.0  # one-sided: ~99.9 % for a normal mean
# the least a configuration must be below the figure to beat. An early window predicts a
# whole run only roughly: engines differ in how their rate evolves over a run (prefill-heavy
# start, decode-heavy middle), and on the demo the stopped configurations' estimates were
# 11-19 % below what their complete runs measured (docs/user-guide.md) — the margin must
# cover that, or a configuration slightly better than the best could be stopped
MIN_MARGIN_PCT = 20.0
SATURATION_WINDOWS = 4


@dataclass
class Calibration:
    """Per workload (profile key): the window curves of complete runs of this study — each
    its whole-run ``total_token_throughput`` and its steady windows as (stage, rate), the
    stage being the share of the requests ended — so that a running benchmark is compared
    with a complete one at the same stage of the same workload (a run's early windows are
    slower than its middle: comparing them with a whole-run figure would be biased)."""

    curves: dict[str, list[tuple[float, list[tuple[float, float]]]]] = field(default_factory=dict)
    keep: int = 3

    def add(self, profile_key: str, stop: EarlyStop, whole: float | None) -> None:
        curve = stop.stages()
        if whole and whole > 0 and len(curve) >= 2:
            self.curves.setdefault(profile_key, []).append((float(whole), curve))
            del self.curves[profile_key][:-self.keep]

    def get(self, profile_key: str) -> list[tuple[float, list[tuple[float, float]]]]:
        return self.curves.get(profile_key, [])


def _at(curve: list[tuple[float, float]], stage: float) -> float | None:
    """The curve's rate at ``stage`` (linear between its points; None outside them)."""
    for (s0, r0), (s1, r1) in zip(curve, curve[1:], strict=False):
        if s0 <= stage <= s1:
            return r0 if s1 == s0 else r0 + (r1 - r0) * (stage - s0) / (s1 - s0)
    return None


@dataclass
class _Window:
    t: float  # real seconds at its end
    rate: float  # events per engine second
    queue: int
    latency_ms: float | None  # mean latency of the requests that ended in it (engine ms)
    ended: int  # requests ended by its end
    arrived: int
    stage: float = 0.0  # the share of the requests ended in its middle
    elapsed: float = 0.0  # engine seconds of the timed run at its end
    events: int = 0  # events received by its end


class EarlyStop:
    """The observer of one benchmark run (called in the benchmark's thread)."""

    def __init__(self, *, num_prompts: int, cancel: threading.Event,
                 to_beat: float | None = None, reference: list[tuple[float, list[tuple[float, float]]]] | None = None,
                 margin_pct: float = MIN_MARGIN_PCT, saturation: bool = True) -> None:
        self.n = max(1, num_prompts)
        self.scale = 1.0  # engine seconds per real second: each observation says
        self.cancel = cancel
        self.to_beat = to_beat
        # a copy: the study's calibration list grows with this very run once it completes, and
        # the diagnostics (to_json) must show the references the decision was made against
        self.reference = list(reference or [])
        self.margin_pct = max(margin_pct, MIN_MARGIN_PCT)
        self.saturation = saturation
        self.windows: list[_Window] = []
        self._last: Observation | None = None
        self._mark: Observation | None = None  # the observation that began the current window
        self.decided: dict[str, Any] | None = None
        self._model0: float | None = None  # the first model-clock stamp seen (the simulator's)


    def __call__(self, obs: Observation) -> None:
        if self.decided is not None:
            return
        self._last = obs
        if self._model0 is None and obs.model_t is not None:
            self._model0 = obs.model_t
        self.scale = obs.time_scale  # the scale the bench client measures with (the server's own)
        if self._mark is None:
            self._mark = Observation(0.0, 0, 0, 0, 0, 0, 0.0)
        m = self._mark
        if obs.t - m.t < WINDOW_S:
            return
        if obs.model_t is not None and m.model_t is not None:  # the engine's own clock: host load does not move it
            dt = obs.model_t - m.model_t
            if dt <= 0:
                return  # no step stamped in this window yet: widen it
        else:
            dt = (obs.t - m.t) * self.scale
        ended_new = obs.completed - m.completed
        latency = (obs.latency_s - m.latency_s) / ended_new * self.scale * 1000 if ended_new > 0 else None
        ended = obs.completed + obs.failed
        stage = (ended + m.completed + m.failed) / 2 / self.n
        self.windows.append(_Window(obs.t, (obs.events - m.events) / dt if dt > 0 else 0.0,
                                    obs.arrived - ended, latency, ended, obs.arrived, stage,
                                    self.elapsed_s(), obs.events))
        self._mark = obs
        self._decide()

    # ------------------------------------------------------------------ figures

    def steady_windows(self) -> list[_Window]:
        """The windows of the steady state: after the warm window, before the tail (a window
        counts when it ended in that range and began after the warm window)."""
        out = []
        prev_ended = 0
        for w in self.windows:
            if prev_ended >= STEADY_FROM * self.n and w.ended <= STEADY_UNTIL * self.n:
                out.append(w)
            prev_ended = w.ended
        return out

    def stages(self) -> list[tuple[float, float]]:
        """(stage, rate) of the steady windows, by stage (what calibrates later runs)."""
        return sorted((w.stage, w.rate) for w in self.steady_windows())

    def estimates(self) -> list[float]:
        """Per steady window: the whole-run throughput it points at, against the most
        favourable reference (each reference curve gives whole × rate / its rate at the same
        stage; the largest is kept)."""
        out = []
        for w in self.steady_windows():
            got = [whole * w.rate / ref for whole, curve in self.reference
                   if (ref := _at(curve, w.stage)) is not None and ref > 0]
            if got:
                out.append(max(got))
        return out

    def elapsed_s(self) -> float:
        """Engine seconds of the timed run so far: on the engine's own clock when the stream
        carries one (the simulator's: host load does not move it), else real seconds × scale."""
        last = self._last
        if last is not None and last.model_t is not None and self._model0 is not None:
            return last.model_t - self._model0
        return (last.t if last is not None else 0.0) * self.scale

    def to_json(self) -> dict[str, Any]:
        """Every window, the steady estimates and the decision (the run's ``earlystop-*.json``)."""
        return {"num_prompts": self.n, "to_beat": self.to_beat, "margin_pct": self.margin_pct,
                "references": len(self.reference), "decided": self.decided,
                "windows": [dataclasses.asdict(w) for w in self.windows], "estimates": self.estimates()}

    def _stop(self, reason: str, **figures: Any) -> None:
        last = self._last
        self.decided = {"reason": reason, "completed": last.completed if last else 0, "num_prompts": self.n,
                        "elapsed_s": round(self.elapsed_s(), 3), "estimated_full_s": round(self.estimated_full_s(), 3),
                        **figures}
        self.cancel.set()

    def _decide(self) -> None:
        if self.to_beat is not None and self.reference:
            xs = self.estimates()
            if len(xs) >= MIN_WINDOWS:
                k = len(xs)
                mean = sum(xs) / k
                sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (k - 1))
                upper = mean + Z * sd / math.sqrt(k)
                limit = self.to_beat * (1 - self.margin_pct / 100)
                if upper < limit:
                    self._stop("lost", estimated_token_throughput=round(mean, 2), upper_bound=round(upper, 2),
                               to_beat=round(self.to_beat, 2), limit=round(limit, 2), windows=k,
                               margin_pct=self.margin_pct, confidence_z=Z, references=len(self.reference))
                    return
        if self.saturation and len(self.windows) > SATURATION_WINDOWS:
            last = self.windows[-(SATURATION_WINDOWS + 1):]
            if last[-1].arrived >= self.n:
                return  # every request has arrived: the queue can only drain from here
            lat = [w.latency_ms for w in last]
            growing = all(b.queue > a.queue for a, b in zip(last, last[1:], strict=False))
            slower = all(a is not None and b is not None and b > a for a, b in zip(lat, lat[1:], strict=False))
            if growing and slower and last[-1].queue >= 2 * max(1, last[0].queue):
                self._stop("over-saturated", queue=[w.queue for w in last],
                           latency_ms=[round(x or 0.0, 1) for x in lat], windows=len(last),
                           window_s=round(WINDOW_S * self.scale, 3))

    def estimated_full_s(self) -> float:
        """The engine seconds the whole run would have taken (extrapolated by the share of
        requests ended)."""
        last = self._last
        ended = (last.completed + last.failed) if last is not None else 0
        return self.elapsed_s() * self.n / ended if ended else self.elapsed_s()
