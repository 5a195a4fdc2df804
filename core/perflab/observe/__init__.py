"""What perflab watches while it measures (issue #13): the engine's own metrics and the
accelerators' telemetry, sampled during every measured benchmark.

A :class:`Watcher` is one source — an engine's Prometheus endpoint, NVML, ``npu-smi`` — that
the executor samples about every :data:`PERIOD_S` engine seconds (never more often than
:data:`MIN_WALL_S` real seconds) while a benchmark runs, and that summarizes its samples when
the benchmark ends. The samples are written to the run directory
(``observe-<profile><suffix>.json``: ``{watcher key: [{"t": engine s, "values": {...}}]}``);
the summaries go into the measurement's ``observed`` mapping under the watcher's :attr:`key`
(``server_metrics``, ``telemetry``), next to what is derived from them and the benchmark's own
figures (``energy``, ``cost``). A watcher that cannot sample (no endpoint, no
NVML) says so once and never fails a measurement.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import anyio
import structlog

log = structlog.get_logger(__name__)

PERIOD_S = 1.0  # engine seconds between samples (AIPerf scrapes every 333 ms of wall time)
MIN_WALL_S = 0.2  # ... but never more often than this in real seconds (the simulator runs x40)
FINAL_SAMPLE_S = 5.0  # the most the last reading, taken as the benchmark ends, may take

# the keys of a measurement's ``observed`` mapping, as report.json shows them per measured profile:
# the engine's metrics summary, the accelerators' telemetry summary, energy, and cost
OBSERVED_KEYS = ("server_metrics", "telemetry", "energy", "cost")


@dataclass(frozen=True)
class Sample:
    """One reading: ``t`` engine seconds since the benchmark began; ``values`` by name."""

    t: float
    values: Mapping[str, float]

    def to_json(self) -> dict[str, Any]:
        return {"t": round(self.t, 3), "values": dict(self.values)}


@runtime_checkable
class Watcher(Protocol):
    """One source sampled during a benchmark."""

    key: str  # where its summary goes in ``ProfileMeasurement.observed``

    async def sample(self) -> Mapping[str, float] | None:
        """One reading now (None: nothing this time; raising is logged once and ends this watcher)."""
        ...

    def summarize(self, samples: Sequence[Sample]) -> dict[str, Any] | None:
        """What the report shows of the samples (None: nothing worth showing)."""
        ...


@dataclass
class Watching:
    """The samples of one benchmark, by watcher key, and the watchers that gave up (and why)."""

    samples: dict[str, list[Sample]] = field(default_factory=dict)
    gave_up: dict[str, str] = field(default_factory=dict)

    def summaries(self, watchers: Sequence[Watcher]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for w in watchers:
            got = self.samples.get(w.key) or []
            try:
                s = w.summarize(got)
            except Exception as exc:  # a summary is an explanation, never a failure
                log.warning("observe.summary-failed", watcher=w.key, error=f"{type(exc).__name__}: {exc}")
                s = None
            if s is not None:
                out[w.key] = s
        return out

    def series_json(self) -> dict[str, Any]:
        return {k: [s.to_json() for s in v] for k, v in self.samples.items()}


async def watch(watchers: Sequence[Watcher], into: Watching, *, time_scale: float = 1.0,
                clock: Callable[[], float] = time.monotonic, period_s: float = PERIOD_S,
                min_wall_s: float = MIN_WALL_S) -> None:
    """Sample every watcher until cancelled (run it in the benchmark's task group and cancel
    it when the benchmark ends). ``time_scale``: engine seconds per real second (the
    simulator's; 1 on real engines) — the samples' ``t`` is in engine seconds."""
    if not watchers:
        return
    start = clock()
    wait = max(period_s / max(time_scale, 1e-9), min_wall_s)
    live = list(watchers)

    async def sample_all() -> None:
        t = (clock() - start) * time_scale
        for w in list(live):
            try:
                values = await w.sample()
            except Exception as exc:
                into.gave_up[w.key] = f"{type(exc).__name__}: {exc}"
                log.warning("observe.watcher-gave-up", watcher=w.key, error=into.gave_up[w.key])
                live.remove(w)
                continue
            if values:
                into.samples.setdefault(w.key, []).append(Sample(t, dict(values)))

    try:
        while live:
            await sample_all()
            await anyio.sleep(wait)
    finally:
        # one last reading when the benchmark ends (cancelled): counters then cover all of it,
        # not up to one period less (at the simulator's x40, a period is 8 engine seconds)
        with anyio.CancelScope(shield=True), anyio.move_on_after(FINAL_SAMPLE_S):
            await sample_all()

