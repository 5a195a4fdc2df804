"""Where a study's runs execute: the backend interface, and the local backend (issue #14).

The driver (:class:`perflab.lab.run.runner.LiveMeasure`, in the ``perflab run`` process) is the
only writer of the study store. For each launch it opens a run (``Store.begin_run``), hands
a backend a :class:`Ticket` — the run id and directory, the configuration, its profiles and
its :class:`Demand` (accelerator kind and chip, devices per node, nodes) — and consumes the
backend's stream of events as they come:

``Placed``    the node and devices the run got (before anything is launched);
``State``     the run's state changed (``waiting`` for devices, ``running``, ``done``);
``Measured``  one profile's measurement, as soon as it exists: the driver stores it at once,
              so an interrupt later in the same launch cannot lose it;
``Point``     one load point of a curve (a sweep, a max-load search), measured or reused from
              an interrupted run: the driver stores a measured one at once, so a resume
              measures only the curve's other points;
``Files``     files the run wrote on a node without the study directory (a remote backend's
              agent stages them there): the driver writes them into the run directory
              (:mod:`perflab.lab.run.backends.shipping`);
``Finished``  the run's final :class:`~perflab.lab.store.RunRecord`;
``Lost``      the run was lost (a remote agent or node died): the driver records it as
              ``interrupted`` — never as a result — and may re-queue the ticket.

The stream is a callback (``sink(event)``), called in the driver's event loop, and
:meth:`Backend.run` returns once the run is over. A fault of the environment or of perflab
itself (a busy device, a full disk, a plugin bug) is raised from :meth:`Backend.run` as
today's :class:`~perflab.lab.run.executor.Executor` raises it; a cancellation (Ctrl-C) cancels
:meth:`Backend.run`, which tears its engines down before it re-raises.

:class:`LocalBackend` runs today's executor in this process. Its :class:`DeviceLedger` holds
the hardware snapshot's accelerators and gives each run a disjoint device set (first fit, in
the order the tickets came); the devices are passed as the configuration's devices, so the
plugins keep writing ``CUDA_VISIBLE_DEVICES`` / ``ASCEND_RT_VISIBLE_DEVICES`` / ``npuDeviceIds``.
With ``parallel`` > 1 several runs share the machine at once (``perflab run --parallel``);
:func:`perflab.lab.study.conduct` submits the configurations of one step together.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import anyio
import structlog

from perflab.lab.accuracy import AccuracyJob
from perflab.lab.options import Configuration
from perflab.lab.plan import Profile
from perflab.lab.store import ProfileMeasurement, RunRecord

log = structlog.get_logger("perflab.lab")

AUTO = "auto"  # --parallel auto: as many runs at once as fit the devices


# --------------------------------------------------------------------------- ticket and events


@dataclass(frozen=True)
class Demand:
    """What a run needs of a machine: ``per_node`` devices of ``kind`` (``cuda``, ``ascend``;
    None: no accelerator, e.g. a CPU engine) on each of ``nodes`` nodes; ``chip`` narrows
    the kind to a model (``A100-SXM4-80GB``) where a backend has several; ``devices``: the
    device ids the configuration pins (its ``devices`` option), else any free ones."""

    kind: str | None
    per_node: int
    nodes: int = 1
    chip: str | None = None
    devices: tuple[int, ...] | None = None
    port: int | None = None  # a fixed port the configuration pins (two such runs cannot overlap)


@dataclass(frozen=True)
class Ticket:
    """One launch of one configuration, as the driver hands it to a backend."""

    run_id: int
    run_dir: Path
    config: Configuration
    profiles: tuple[Profile, ...]
    label: str
    demand: Demand
    to_beat: float | None = None  # the early stop's figure to beat on the main profile
    # the load points interrupted runs of this configuration finished, by profile name then
    # point (Store.points): the executor measures only the others
    known_points: Mapping[str, Mapping[str, ProfileMeasurement]] = field(default_factory=dict)
    # the plan's accuracy measurement, after the profiles in the same launch (None: none)
    accuracy: AccuracyJob | None = None

    def run_kw(self) -> dict[str, Any]:
        """The keywords of ``Executor.run`` besides the configuration and profiles."""
        return {"label": self.label, "to_beat": self.to_beat,
                **({"accuracy": self.accuracy} if self.accuracy is not None else {})}


@dataclass(frozen=True)
class Placed:
    node: str
    devices: tuple[int, ...]


@dataclass(frozen=True)
class State:
    state: str  # "waiting" (for devices) | "running" | "done"


@dataclass(frozen=True)
class Measured:
    profile: str
    measurement: ProfileMeasurement


@dataclass(frozen=True)
class Point:
    profile: str
    point: str  # perflab.lab.run.executor.point_name: "max_concurrency=16"
    measurement: ProfileMeasurement
    reused: bool = False  # taken from Ticket.known_points, not measured by this run


@dataclass(frozen=True)
class FilePart:
    """Bytes of one file of a run, shipped from the node that wrote it (perflab.lab.run.backends.shipping).

    ``path``: relative to the run directory, ``/``-separated (the driver refuses one that would
    land outside it). ``whole``: a record (JSON) shipped whole: its parts go into a temp file
    that the ``last`` part renames into place (atomic); else the bytes are written at
    ``offset`` of the file itself (a log growing; offset 0 starts it afresh)."""

    path: str
    data: bytes
    offset: int = 0
    whole: bool = False
    last: bool = True


@dataclass(frozen=True)
class Files:
    """Files the run wrote on a node that the driver writes into the run directory."""

    parts: tuple[FilePart, ...]
    node: str = ""


@dataclass(frozen=True)
class Finished:
    record: RunRecord


@dataclass(frozen=True)
class Lost:
    reason: str


Event = Placed | State | Measured | Point | Files | Finished | Lost
Sink = Callable[[Event], None]


class Backend(Protocol):
    """Runs tickets. ``parallel``: how many runs it may hold at once (1: one at a time)."""

    parallel: int

    def demand(self, config: Configuration) -> Demand: ...

    def room(self, demand: Demand) -> int:
        """How many more runs of ``demand`` would start right now (0 while any run waits):
        the study fills idle slots with work it already knows (the baseline's final
        measurements) — never one a queued run would take."""

    async def run(self, ticket: Ticket, sink: Sink) -> None: ...


# --------------------------------------------------------------------------- the device ledger


@dataclass
class _Waiter:
    demand: Demand
    granted: anyio.Event = field(default_factory=anyio.Event)
    devices: tuple[int, ...] = ()


class DeviceLedger:
    """Which of the machine's accelerators each running run holds; first fit, in order.

    ``slots``: at most this many runs at once (``--parallel N``). A demand for more devices
    of a kind than the machine has is not held back (the executor refuses it with the
    reason); one without an accelerator takes only a slot."""

    def __init__(self, devices: dict[str, tuple[int, ...]], slots: int) -> None:
        self.devices = {k: tuple(sorted(v)) for k, v in devices.items()}
        self.slots = max(1, slots)
        self.held: dict[str, set[int]] = {k: set() for k in self.devices}
        self.ports: set[int] = set()
        self.running = 0
        self._queue: list[_Waiter] = []

    def _fit(self, d: Demand) -> tuple[int, ...] | None:
        if self.running >= self.slots or (d.port is not None and d.port in self.ports):
            return None
        if d.kind is None or d.kind not in self.devices:
            return ()
        pool, held = self.devices[d.kind], self.held[d.kind]
        if d.devices is not None:  # pinned by the configuration
            if any(x in held for x in d.devices):
                return None
            return tuple(d.devices)
        need = d.per_node * d.nodes
        if need > len(pool):
            return ()  # can never fit: the executor refuses it (replicas × TP > devices)
        free = [x for x in pool if x not in held]
        if len(free) < need:
            return None
        # first fit: the first run of ``need`` consecutive free devices, else the first free ones
        for i in range(len(pool) - need + 1):
            block = pool[i : i + need]
            if not any(x in held for x in block):
                return tuple(block)
        return tuple(free[:need])

    def _grant(self) -> None:
        for w in list(self._queue):
            got = self._fit(w.demand)
            if got is None:
                continue
            w.devices = got
            if w.demand.kind in self.held:
                self.held[w.demand.kind].update(got)
            if w.demand.port is not None:
                self.ports.add(w.demand.port)
            self.running += 1
            self._queue.remove(w)
            w.granted.set()

    async def acquire(self, demand: Demand, on_wait: Callable[[], None] | None = None) -> tuple[int, ...]:
        w = _Waiter(demand)
        self._queue.append(w)
        self._grant()
        if not w.granted.is_set():
            if on_wait is not None:
                on_wait()
            try:
                await w.granted.wait()
            except BaseException:
                if w in self._queue:
                    self._queue.remove(w)
                else:  # granted while being cancelled
                    self.release(demand, w.devices)
                raise
        return w.devices

    def capacity(self, demand: Demand) -> int:
        """How many runs of ``demand`` the machine holds at once when nothing else runs."""
        return DeviceLedger(self.devices, self.slots).room(demand)

    def room(self, demand: Demand) -> int:
        """How many more runs of ``demand`` would start right now: 0 while any run waits
        (what is queued comes first), else how many fit the free slots and devices."""
        if self._queue:
            return 0
        held = {k: set(v) for k, v in self.held.items()}
        ports, running, n = set(self.ports), self.running, 0
        try:
            while (got := self._fit(demand)) is not None:  # each takes a slot: bounded
                n += 1
                self.running += 1
                if demand.kind in self.held:
                    self.held[demand.kind].update(got)
                if demand.port is not None:
                    self.ports.add(demand.port)
        finally:
            self.held, self.ports, self.running = held, ports, running
        return n

    def release(self, demand: Demand, devices: Sequence[int]) -> None:
        if demand.kind in self.held:
            self.held[demand.kind].difference_update(devices)
        if demand.port is not None:
            self.ports.discard(demand.port)
        self.running -= 1
        self._grant()


# --------------------------------------------------------------------------- the local backend


def auto_parallel(devices: dict[str, tuple[int, ...]]) -> int:
    """``--parallel auto``: no more runs at once than the largest kind has devices (the
    ledger then fits them); 1 on a machine without accelerators."""
    return max([len(v) for v in devices.values()] or [1])


class LocalBackend:
    """Runs tickets on this machine with today's :class:`~perflab.lab.run.executor.Executor`,
    ``parallel`` at a time on disjoint device sets."""

    node = "local"

    def __init__(self, ctx: Any, *, parallel: int | str = 1, on_event: Any = None,
                 executor_factory: Callable[[], Any] | None = None) -> None:
        from perflab.lab.run.executor import Executor
        from perflab.observe.telemetry import Telemetry

        self.ctx = ctx  # None: a stand-in executor without a machine (tests)
        self.on_event = on_event or (lambda kind, **kw: None)
        by_kind: dict[str, list[int]] = {}
        for a in ctx.hardware.accelerators if ctx is not None else ():
            if a.kind != "cpu":  # the host CPU is shared by every run, not a device to hand out
                by_kind.setdefault(a.kind, []).append(a.index)
        self.devices = {k: tuple(v) for k, v in by_kind.items()}
        self.parallel = auto_parallel(self.devices) if parallel == AUTO else max(1, int(parallel))
        self.ledger = DeviceLedger(self.devices, self.parallel)
        # one executor per run (its callbacks and its waiting benchmark threads are the run's);
        # a test may pass a stand-in
        self._factory = executor_factory or (lambda: Executor(self.ctx, on_event=self.on_event))
        self._stale: list[Any] = []
        self._reset_noted: set[str] = set()
        # the study's accelerator telemetry (perflab.observe.telemetry): NVML opened once, what
        # is missing said once, whichever run meets it
        self.telemetry = Telemetry(ctx.env, ctx.hardware.accelerators) if ctx is not None else None

    def demand(self, config: Configuration) -> Demand:
        if self.ctx is None:
            return Demand(kind=None, per_node=1)
        sc = config.serve_config()
        kinds = self.ctx.pm.engine(config.engine).info.accelerators
        kind = next((k for k in kinds if k in self.devices), None)
        return Demand(kind=kind, per_node=max(1, sc.world_size) * max(1, config.replicas), devices=sc.devices,
                      port=sc.port)

    def room(self, demand: Demand) -> int:
        """How many more runs of ``demand`` would start now (:meth:`DeviceLedger.room`)."""
        return self.ledger.room(demand)

    def capacity(self, demand: Demand) -> int:
        """How many runs of ``demand`` it holds at once when idle (:meth:`DeviceLedger.capacity`)."""
        return self.ledger.capacity(demand)

    async def run(self, ticket: Ticket, sink: Sink) -> None:
        demand = ticket.demand

        def waiting() -> None:
            sink(State("waiting"))
            self.on_event("queued", label=ticket.label)

        # the supervisor's events (engine.state) name the run they belong to: several run at once
        with structlog.contextvars.bound_contextvars(run_label=ticket.label, run_id=ticket.run_id):
            await self._run(ticket, sink, demand, waiting)

    async def _run(self, ticket: Ticket, sink: Sink, demand: Demand, waiting: Callable[[], None]) -> None:
        devices = await self.ledger.acquire(demand, waiting)
        try:
            sink(Placed(self.node, devices))
            sink(State("running"))
            ex = self._factory()
            ex.on_measured = lambda name, m: sink(Measured(name, m))
            ex.on_point = lambda name, point, m, reused: sink(Point(name, point, m, reused))
            ex.known_points = ticket.known_points
            if hasattr(ex, "_stale"):
                # what the study's executors share: benchmark threads that outlived their
                # cancellation (the next launch waits for them, whoever started them) and the
                # engines whose missing prefix-cache reset is already noted
                ex._stale, ex._reset_noted = self._stale, self._reset_noted
            if hasattr(ex, "telemetry") and self.telemetry is not None:
                ex.telemetry = self.telemetry
            if hasattr(ex, "placement") and self.parallel > 1:
                # the ledger's devices become the configuration's devices (the plugin writes
                # CUDA_VISIBLE_DEVICES etc.); one at a time, the engine's default selection
                # stays what it always was (the first devices: the same ones the ledger gives)
                ex.placement = devices if devices and demand.devices is None else None
            rec = await ex.run(ticket.config, list(ticket.profiles), ticket.run_dir, **ticket.run_kw())
            sink(Finished(rec))
            sink(State("done"))
        finally:
            self.ledger.release(demand, devices)


def parse_parallel(value: str) -> int | str:
    """``--parallel``: a positive count or ``auto`` (a user mistake is one line)."""
    from perflab.contract.errors import UsageError

    if value == AUTO:
        return AUTO
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise UsageError(f"--parallel {value}: expected a positive number or 'auto'")
    return n


__all__ = [
    "AUTO",
    "Backend",
    "Demand",
    "DeviceLedger",
    "FilePart",
    "Files",
    "Finished",
    "LocalBackend",
    "Lost",
    "Measured",
    "Placed",
    "Point",
    "State",
    "Ticket",
    "auto_parallel",
    "parse_parallel",
]
