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

import threading
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
TIMED_WAIT_S = 2.0  # the most the bench waits for the reading at its timed run's start or end (TimedRun)
START, END = "start", "end"  # Sample.mark: where the timed run began and ended

# the keys of a measurement's ``observed`` mapping, as report.json shows them per measured profile:
# the engine's metrics summary, the accelerators' telemetry summary, energy, and cost
OBSERVED_KEYS = ("server_metrics", "telemetry", "energy", "cost")


@dataclass(frozen=True)
class Sample:
    """One reading: ``t`` engine seconds since the benchmark began; ``values`` by name;
    ``mark``: taken where the timed run began (``"start"``) or ended (``"end"``), :class:`TimedRun`."""

    t: float
    values: Mapping[str, float]
    mark: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"t": round(self.t, 3), "values": dict(self.values)}
        if self.mark is not None:
            out["mark"] = self.mark
        return out


def timed_run(samples: Sequence[Sample]) -> list[Sample] | None:
    """The samples from the one marked where the timed run began to the one marked where it
    ended (to the last, without an end mark), in time order; None without a start mark or
    without a sample after it (:class:`TimedRun`)."""
    ordered = sorted(samples, key=lambda s: s.t)
    first = next((i for i, s in enumerate(ordered) if s.mark == START), None)
    last = next((i for i, s in enumerate(ordered) if s.mark == END), len(ordered) - 1)
    return ordered[first:last + 1] if first is not None and last > first else None


class TimedRun:
    """Readings exactly where the benchmark's timed run begins and ends. The bench's thread
    calls :meth:`begin` just before its first timed request (the client has loaded its
    tokenizer and dataset and sent the warm-up) and :meth:`end` right after its last
    response (before it computes its metrics), and waits each time, at most
    :data:`TIMED_WAIT_S` real seconds, until :func:`watch` has sampled every watcher (those
    samples carry ``mark``). The energy of the timed run is then the devices' counters from one
    mark to the other (:mod:`perflab.observe.energy`), not an estimate of what the loading, the
    warm-up and the metrics drew."""

    MARKS = (START, END)

    def __init__(self, wait_s: float | None = None) -> None:
        self.asked = {m: threading.Event() for m in self.MARKS}
        self.done = {m: threading.Event() for m in self.MARKS}
        self.wait_s = TIMED_WAIT_S if wait_s is None else wait_s

    def begin(self) -> None:
        """In the bench's thread, before the first timed request."""
        self._ask(START)

    def end(self) -> None:
        """In the bench's thread, after the last response."""
        self._ask(END)

    def _ask(self, mark: str) -> None:
        self.asked[mark].set()
        self.done[mark].wait(self.wait_s)

    def release(self) -> None:
        """Nothing will sample any more: no call waits."""
        for e in self.done.values():
            e.set()


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

    def series_json(self, engine_clock: str | None = None) -> dict[str, Any]:
        """The samples on the benchmark's own time axis: ``t`` in engine seconds since its timed
        run began (the ``start`` mark; the loading and the warm-up before it are negative).
        The sampling clock is the host's times the time scale; the simulated engines' model
        clock, which the bench times the benchmark on, runs behind it while the host is loaded
        and catches up when the engine idles: a 236 s benchmark's samples spanned 69 s to 563 s.
        ``engine_clock``: the value key some watcher's samples carry the engines' own clock in
        (the simulator's ``engine_t``, :mod:`perflab.observe.telemetry`); where every sampling
        moment has it, the axis is that clock."""
        return {k: [s.to_json() for s in v] for k, v in on_benchmark_axis(self.samples, engine_clock).items()}


def on_benchmark_axis(samples: Mapping[str, Sequence[Sample]], engine_clock: str | None = None) -> dict[str, list[Sample]]:
    """``samples`` (by watcher key, sampled together: one ``t`` per sampling moment) with ``t``
    from the timed run's start mark, on the engines' clock where every moment carries it in
    ``engine_clock`` (:meth:`Watching.series_json`); as they are without a start mark."""
    moments = {s.t for got in samples.values() for s in got}
    engine: dict[float, float] = {}
    if engine_clock is not None:
        for got in samples.values():
            for s in got:
                if engine_clock in s.values:
                    engine.setdefault(s.t, float(s.values[engine_clock]))
    clock = engine if moments and moments <= engine.keys() else {t: t for t in moments}
    start = next((s.t for got in samples.values() for s in got if s.mark == START), None)
    if start is None:
        return {k: list(v) for k, v in samples.items()}
    origin = clock[start]
    return {k: [Sample(clock[s.t] - origin, s.values, s.mark) for s in v] for k, v in samples.items()}


async def watch(watchers: Sequence[Watcher], into: Watching, *, time_scale: float = 1.0,
                clock: Callable[[], float] = time.monotonic, period_s: float = PERIOD_S,
                min_wall_s: float = MIN_WALL_S, timed: TimedRun | None = None) -> None:
    """Sample every watcher until cancelled (run it in the benchmark's task group and cancel
    it when the benchmark ends). ``time_scale``: engine seconds per real second (the
    simulator's; 1 on real engines) — the samples' ``t`` is in engine seconds. ``timed``:
    sample once more, marked, when the bench asks as its timed run begins and ends."""
    if not watchers:
        if timed is not None:
            timed.release()
        return
    start = clock()
    wait = max(period_s / max(time_scale, 1e-9), min_wall_s)
    live = list(watchers)

    async def sample_all(mark: str | None = None) -> None:
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
                into.samples.setdefault(w.key, []).append(Sample(t, dict(values), mark))

    marks = list(TimedRun.MARKS) if timed is not None else []
    try:
        while live:
            await sample_all()
            # waiting for the next mark is the period's sleep: a mark is sampled at once
            while timed is not None and marks and await anyio.to_thread.run_sync(
                    timed.asked[marks[0]].wait, wait, abandon_on_cancel=True):
                mark = marks.pop(0)
                await sample_all(mark)
                timed.done[mark].set()
            if not marks:
                await anyio.sleep(wait)
    finally:
        if timed is not None:
            timed.release()  # nothing more will be sampled on request: the bench must not wait
        # one last reading when the benchmark ends (cancelled): counters then cover all of it,
        # not up to one period less (at the simulator's x40, a period is 8 engine seconds)
        with anyio.CancelScope(shield=True), anyio.move_on_after(FINAL_SAMPLE_S):
            await sample_all()

