"""The simulated engine's model clock: the time its performance model says it is.

A simulated engine's steps take the performance model's durations (``StepResult.duration``),
and the schedulers' ``now`` add them up: that is the engine's *model time*. Wall time only
paces it (a step of 50 ms is delivered 50 ms / time scale after the previous one), so a host
that falls behind — another process on the cores, a flood of HTTP chunks at a high time
scale — delays deliveries but never changes the model's numbers. Every streamed step carries
its model time (``: perflab-server-clock <t> <arrival>``, :func:`perflab.bench.serverclock.format_clock`),
and perflab's bench client, when the lab knows the engine is simulated, measures TTFT, TPOT,
ITL, E2EL and the run's duration from those stamps instead of its own receive times
(docs/simulator.md "Reproducible time").

The mapping between the two clocks is an anchor ``(wall, model)``: ``model(w) = model +
(w - wall) × scale``. It starts at ``(monotonic(), monotonic() × scale)``, so engines on one
host share an origin (a benchmark across replicas compares their stamps). When a delivery is
late by more than :data:`perflab_sim.faults.MAX_LAG_S`, or the engine goes idle, the anchor
moves to the model time reached: wall time lost by the host is not model time.

A request is stamped on arrival with ``model(now)`` kept between the last event delivered and
the next one due (it joins the batch after that event, as a request reaching a real engine
during a step waits for the next), so a late host never makes a request arrive "after" steps
that have not been delivered yet.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from perflab_sim.faults import MAX_LAG_S


class ModelClock:
    """Model time of one engine (all its data-parallel schedulers share it)."""

    def __init__(self, scale: float, wall: Callable[[], float] = time.monotonic) -> None:
        self.scale = scale
        self._wall = wall
        w = wall()
        self._anchor_wall = w
        self._anchor_model = w * scale
        self.last = self._anchor_model  # model time of the last event delivered
        self.lost_s = 0.0  # wall seconds the host fell behind beyond MAX_LAG_S

    def model_at(self, wall: float) -> float:
        return self._anchor_model + (wall - self._anchor_wall) * self.scale

    def wall_at(self, model: float) -> float:
        return self._anchor_wall + (model - self._anchor_model) / self.scale

    def now(self, horizon: float | None = None) -> float:
        """Model time now, never before the last event delivered nor after ``horizon`` (the
        next event due, if any)."""
        m = self.model_at(self._wall())
        if horizon is not None and m > horizon:
            m = horizon
        return m if m > self.last else self.last

    def delivered(self, model: float) -> None:
        """An event due at ``model`` is being delivered now: a delivery later than
        MAX_LAG_S moves the anchor (that wall time is lost, not model time)."""
        w = self._wall()
        late = w - self.wall_at(model)
        if late > MAX_LAG_S:
            self.lost_s += late - MAX_LAG_S
            self._anchor_wall, self._anchor_model = w - MAX_LAG_S, model
        if model > self.last:
            self.last = model

    def resume(self, model: float) -> None:
        """Model time was held at ``model`` (a burst of arrivals): it runs on from there now."""
        self._anchor_wall, self._anchor_model = self._wall(), model
        if model > self.last:
            self.last = model

    def idle(self) -> None:
        """Nothing to do: model time runs on with wall time from the last event delivered."""
        w = self._wall()
        if self.model_at(w) > self.last:
            self._anchor_wall, self._anchor_model = w, self.last


__all__ = ["ModelClock"]
