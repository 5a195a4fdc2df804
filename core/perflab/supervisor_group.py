"""A multi-node engine supervised as one: one :class:`~perflab.supervisor.EngineInstance` per node
rank, started from the plugin's ``build_group_launch``.

The group keeps the supervisor's promises for every rank (each rank is an ``EngineInstance``:
its exit awaited, its process tree and ports checked at teardown) and adds what a group needs:

* the ranks that serve no HTTP (``node_rank`` >= 1) start first, so they are waiting at the
  rendezvous when rank 0 opens it; rank 0 starts last and is the only one probed for readiness
  (it becomes ready only once every rank joined);
* any rank dying is the group's crash: the group's cause is that rank's own cause (the plugin's
  crash classifier on that rank's log, ``engine-node<R>.log``), the group's :attr:`died` is
  set, and every other rank is torn down at once;
* teardown stops every rank (rank 0 first), and the group's leftovers are the ranks'.

Locally the "nodes" are processes on this machine: every rank's address is ``127.0.0.1``, the
rendezvous port is a free port, and each rank gets its own slice of the devices (the devices
a node would have). A backend that places ranks on real nodes passes :class:`GroupNode` s and
a ``start_rank`` (:class:`GroupPlacement`): the group then supervises a rank through a
:class:`RankHandle` — start it, know when it died and why (its cause from its own log's crash
signatures, classified where it runs), tear it down. :class:`~perflab.supervisor.EngineInstance`
is the local handle; the Ray backend's is :class:`perflab.lab.run.backends.ray.RemoteRank`, a rank
started by another node's agent. Rank 0 always runs here: it serves and is probed here.
See docs/reliability.md, "Multi-node groups".
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

import anyio
import structlog

from perflab.contract.errors import UnsupportedOption
from perflab.contract.status import Status
from perflab.contract.types import GroupNode, HardwareSnapshot, LaunchSpec, NodeGroup, ServeConfig, Unsupported
from perflab.lifecycle.ports import pick_free_port
from perflab.plugins import PluginManager
from perflab.supervisor import DEFAULT_GRACE_S, EngineInstance, LaunchOutcome, in_thread

log = structlog.get_logger("perflab.supervisor")

LOCAL_ADDRESS = "127.0.0.1"


def rank_log(rank: int) -> str:
    """The log of node rank ``rank`` in the run directory (rank 0 keeps ``engine.log``)."""
    return "engine.log" if rank == 0 else f"engine-node{rank}.log"


@dataclass
class GroupOutcome(LaunchOutcome):
    """The group's outcome (rank 0's launch, the first dead rank's cause) and each rank's."""

    nodes: list[LaunchOutcome] = field(default_factory=list)
    failed_rank: int | None = None  # the rank whose death crashed the group

    def to_json(self) -> dict[str, Any]:
        out = super().to_json()
        out["failed_rank"] = self.failed_rank
        out["nodes"] = [n.to_json() for n in self.nodes]
        return out


def local_nodes(config: ServeConfig, hardware: HardwareSnapshot, kinds: Sequence[str]) -> tuple[GroupNode, ...]:
    """``config.nodes`` ranks on this machine: address 127.0.0.1, each with its own slice of
    ``config.devices`` (default: the first ``world_size`` devices of ``kinds``); UnsupportedOption
    when the machine has too few devices to stand for that many nodes."""
    n, per = config.node_count, config.devices_per_node
    pool = [a.index for a in hardware.accelerators if a.kind in kinds]
    devices = list(config.devices) if config.devices is not None else pool
    if not pool:  # nothing probed: the engines' defaults
        return tuple(GroupNode(r, LOCAL_ADDRESS, "localhost") for r in range(n))
    if len(devices) < n * per:
        raise UnsupportedOption(
            "perflab", f"nodes={n}",
            f"{n} local nodes of {per} device(s) each need {n * per} devices, {len(devices)} available here")
    return tuple(GroupNode(r, LOCAL_ADDRESS, "localhost", tuple(devices[r * per:(r + 1) * per])) for r in range(n))


@dataclass(frozen=True)
class RankLaunch:
    """What starting one rank (>= 1) of a group takes, wherever it runs: all plain data, so a
    backend can hand it to the rank's node (the node adds its own plugins, hardware snapshot
    and environment)."""

    rank: int
    engine: str
    config: ServeConfig  # the group's config with this node's devices
    launch: LaunchSpec  # the plugin's launch of this rank (build_group_launch)
    workdir: Path  # the run directory (a Ray agent runs the rank in a stage of its node's: perflab.lab.run.backends.shipping)
    log_name: str
    scope: tuple[str, str]  # (study, run id) of the rank's PERFLAB_INSTANCE marker
    version: str | None
    startup_timeout: float | None
    grace: float

    @property
    def serving(self) -> bool:
        return self.rank == 0


class RankHandle(Protocol):
    """One rank of a group as the group supervises it (:class:`EngineInstance` is one):
    ``async with`` starts it (``outcome.state`` ``ready`` once it runs) and tears it down;
    ``died`` is set when it exits unasked, with ``outcome.cause`` its own cause; ``lost``
    (a remote rank only) says its node or agent was lost rather than the rank crashing."""

    outcome: LaunchOutcome
    died: anyio.Event
    launch: LaunchSpec | None

    @property
    def pid(self) -> int | None: ...

    async def __aenter__(self) -> Any: ...

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> bool | None: ...

    def expect_exit(self) -> None: ...

    async def teardown(self) -> None: ...

    def kill_now(self) -> None: ...


# starts rank >= 1 on its node (a remote handle), or None: here, as an EngineInstance
RankStarter = Callable[[GroupNode, RankLaunch], "RankHandle | None"]


@dataclass(frozen=True)
class GroupPlacement:
    """Where a backend placed a group's ranks: one node each (rank order, rank 0 here), and
    how a rank on another node is started."""

    nodes: tuple[GroupNode, ...]
    start_rank: RankStarter | None = None


def lost_reason(rank: RankHandle) -> str | None:
    """Why a rank's node or agent was lost (a remote rank's ``lost``), else None."""
    return getattr(rank, "lost", None)


class EngineGroup:
    """The ranks of one multi-node launch, as one engine. Use as ``async with``; it answers
    what the lab asks an :class:`EngineInstance` (``outcome``, ``launch``, ``base_url``,
    ``readiness``, ``died``, ``teardown()``) for the group, with rank 0 serving.

    :param nodes: the nodes to run on (default: :func:`local_nodes`, processes on this machine).
    :param start_rank: starts a rank >= 1 on its node (:data:`RankStarter`; default: here).
    The other parameters are :class:`EngineInstance`'s.
    """

    def __init__(
        self,
        pm: PluginManager,
        engine: str,
        config: ServeConfig,
        *,
        hardware: HardwareSnapshot,
        env: Mapping[str, str],
        workdir: Path,
        startup_timeout: float | None = None,
        version: str | None = None,
        grace: float = DEFAULT_GRACE_S,
        scope: tuple[str | Path, str] | None = None,
        nodes: Sequence[GroupNode] | None = None,
        start_rank: RankStarter | None = None,
        force: bool = False,
    ) -> None:
        self.pm = pm
        self.engine = engine
        self.config = config
        self.hardware = hardware
        self.env = dict(env)
        self.workdir = Path(workdir)
        self.startup_timeout = startup_timeout
        self.grace = grace
        self.scope = scope
        self.force = force
        self._nodes = tuple(nodes) if nodes is not None else None
        self._start_rank = start_rank
        self.outcome = GroupOutcome(engine=engine, version=version, workdir=self.workdir)
        self.ranks: list[Any] = []  # RankHandle s, rank order (rank 0: an EngineInstance here)
        self.group: NodeGroup | None = None
        self.died = anyio.Event()
        self._dead = anyio.Event()  # a rank died (set before `died`, also during startup)
        self._stack: AsyncExitStack | None = None
        self._tg: anyio.abc.TaskGroup | None = None
        self._stopping = False  # the group is being torn down: deaths from here on are expected

    # ------------------------------------------------------------------ what the lab reads

    @property
    def serving(self) -> EngineInstance | None:
        return self.ranks[0] if self.ranks else None

    @property
    def lost(self) -> str | None:
        """Why a rank's node was lost while the group ran (its run is interrupted, not crashed)."""
        return next((why for why in map(lost_reason, self.ranks) if why), None)

    @property
    def launch(self) -> LaunchSpec | None:
        return self.outcome.launch

    @property
    def rank_launches(self) -> list[LaunchSpec]:
        """Every rank's launch, in rank order (the serving script shows them all)."""
        return [inst.launch for inst in self.ranks if inst.launch is not None]

    @property
    def base_url(self) -> str | None:
        return self.serving.base_url if self.serving is not None else None

    @property
    def readiness(self) -> Any:
        return self.serving.readiness if self.serving is not None else None

    @property
    def pid(self) -> int | None:
        return self.serving.pid if self.serving is not None else None

    # ------------------------------------------------------------------ context manager

    async def __aenter__(self) -> EngineGroup:
        self._stack = AsyncExitStack()
        await self._stack.__aenter__()
        try:
            self._tg = await self._stack.enter_async_context(anyio.create_task_group())
            self._stack.callback(self._tg.cancel_scope.cancel)  # after every rank is torn down
            await self._start()
        except BaseException as exc:
            await self._exit(exc)
            raise
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> bool | None:
        return await self._exit(exc)

    async def _exit(self, exc: BaseException | None) -> bool | None:
        assert self._stack is not None
        if exc is not None and isinstance(exc, anyio.get_cancelled_exc_class()):
            self.outcome.interrupted = True  # Ctrl-C: every rank is torn down, nothing is a result
        try:
            with anyio.CancelScope(shield=True):
                await self.teardown()
        finally:
            handled = await self._stack.__aexit__(type(exc) if exc else None, exc, exc.__traceback__ if exc else None)
        self._collect()
        return handled

    # ------------------------------------------------------------------ start

    def _transition(self, state: Status, **kw: Any) -> None:
        self.outcome.state = state
        self.outcome.transitions.append((state, time.time()))
        log.info("engine.group-state", engine=self.engine, state=str(state), **kw)

    def _refuse(self, what: str, why: str, source: str = "perflab") -> None:
        self.outcome.reasons = (*self.outcome.reasons, Unsupported(what, why, source=source))
        self._transition(Status.UNSUPPORTED, reasons=[f"{what}: {why}"])

    async def _start(self) -> None:
        o = self.outcome
        self._transition(Status.PREFLIGHT, workdir=str(self.workdir), nodes=self.config.node_count)
        rec = self.pm.engine(self.engine)
        if o.version is None:
            o.version = await in_thread(rec.engine.version, self.env)
        problems = await in_thread(rec.check_support, self.config, self.hardware, o.version)
        o.reasons = tuple(u for u in problems if u.severity != "warning")
        o.warnings = tuple(u for u in problems if u.severity == "warning")
        if o.reasons and not self.force:
            self._transition(Status.UNSUPPORTED, reasons=[f"{u.what}: {u.why}" for u in o.reasons])
            return
        try:
            nodes = self._nodes or local_nodes(self.config, self.hardware, rec.info.accelerators)
        except UnsupportedOption as exc:
            self._refuse(exc.option, exc.why)
            return
        host = self.config.host
        port = self.config.port or pick_free_port(host)
        rendezvous = pick_free_port(nodes[0].address)
        while rendezvous == port:
            rendezvous = pick_free_port(nodes[0].address)
        self.group = NodeGroup(nodes, rendezvous)
        config = self.config.replace(port=port, nodes=self.group.size)
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            specs = await in_thread(rec.build_group_launch, config, self.hardware, self.group, self.workdir, o.version)
        except UnsupportedOption as exc:
            self._refuse(exc.option, exc.why, rec.provider)
            return
        # rank 0 hosts the rendezvous: its port is rank 0's to bind and to free
        specs[0] = dataclasses.replace(specs[0], extra_ports=(*specs[0].extra_ports, rendezvous))
        o.launch = specs[0]
        study, run = self.scope if self.scope is not None else (self.workdir, "engine")
        self.ranks = [self._rank(node, RankLaunch(
            node.rank, self.engine, config.replace(devices=node.devices), spec, self.workdir, rank_log(node.rank),
            (str(study), run if node.rank == 0 else f"{run}.node{node.rank}"), o.version, self.startup_timeout,
            self.grace)) for node, spec in zip(self.group.nodes, specs, strict=True)]
        self._transition(Status.LAUNCHING, nodes=self.group.size, rendezvous=f"{nodes[0].address}:{rendezvous}")
        assert self._stack is not None and self._tg is not None
        for inst in [*self.ranks[1:], self.ranks[0]]:  # the joining ranks first, the serving rank last
            rank = self.ranks.index(inst)
            await self._stack.enter_async_context(inst)
            self._tg.start_soon(self._watch_rank, rank)
            if inst.outcome.state != Status.READY:
                if not self._dead.is_set():
                    self._rank_failed(rank)
                return
            if self._dead.is_set():
                return
        o.log = self.ranks[0].outcome.log
        o.pid = self.ranks[0].pid
        o.ready_s = self.ranks[0].outcome.ready_s
        self._transition(Status.READY, base_url=self.base_url, nodes=self.group.size)

    def _rank(self, node: GroupNode, r: RankLaunch) -> RankHandle:
        """Rank ``node.rank``'s handle: started by ``start_rank`` on its node, else here."""
        if node.rank > 0 and self._start_rank is not None:
            remote = self._start_rank(node, r)
            if remote is not None:
                return remote
        return EngineInstance(
            self.pm, r.engine, r.config, hardware=self.hardware, env=self.env, workdir=r.workdir,
            startup_timeout=r.startup_timeout, version=r.version, log_name=r.log_name, grace=r.grace, scope=r.scope,
            launch=r.launch, serving=r.serving, abort=self._dead if r.serving else None,
        )

    # ------------------------------------------------------------------ watching

    async def _watch_rank(self, rank: int) -> None:
        inst = self.ranks[rank]
        await inst.died.wait()
        if not self._dead.is_set() and not self._stopping:
            self._rank_failed(rank)
            # every other rank goes down now (a real group would hang or die in a collective)
            for other in self.ranks:
                if other is not inst:
                    other.expect_exit()  # its own end (its peer gone) is a consequence, not a cause
                    assert self._tg is not None
                    self._tg.start_soon(other.teardown)

    def _rank_failed(self, rank: int) -> None:
        """The group failed because of rank ``rank``: its state and cause are the group's."""
        inst = self.ranks[rank]
        ro = inst.outcome
        o = self.outcome
        o.failed_rank = rank
        # the rank's own cause (its log, its engine's classifier), saying which rank it was
        o.cause = dataclasses.replace(ro.cause, explanation=f"node rank {rank}: {ro.cause.explanation}") if ro.cause else None
        o.reasons = (*o.reasons, *ro.reasons)
        o.exit_code = ro.exit_code
        o.log = ro.log if rank else (ro.log or o.log)
        if o.launch is None:
            o.launch = ro.launch
        state = ro.state if Status(ro.state).is_failure else Status.CRASHED
        where = f"node rank {rank}" + (" (serving)" if rank == 0 else "")
        if lost_reason(inst):  # its node is gone: nothing about the configuration, the run is interrupted
            o.interrupted = True
            o.notes.append(f"{where}: {lost_reason(inst)}")
        o.notes.append(f"{where} {state}: " + (f"{ro.cause.name}: {ro.cause.explanation}" if ro.cause else "no cause"))
        self._transition(state, rank=rank, cause=ro.cause.name if ro.cause else None)
        self._dead.set()
        self.died.set()

    # ------------------------------------------------------------------ teardown

    async def teardown(self) -> None:
        """Stop every rank, the serving one first. Idempotent (each rank's teardown is)."""
        self._stopping = True
        for inst in self.ranks:  # a rank whose peer is already gone may exit by itself now
            inst.expect_exit()
        with anyio.CancelScope(shield=True):
            for inst in self.ranks:
                await inst.teardown()
        self._collect()
        state = Status(self.outcome.state)
        if not state.is_failure and state != Status.DONE:
            self._transition(Status.DONE, started=state != Status.PREFLIGHT)

    def _collect(self) -> None:
        o = self.outcome
        o.nodes = [inst.outcome for inst in self.ranks]
        o.leftovers = [f"node rank {r}: {msg}" for r, inst in enumerate(self.ranks) for msg in inst.outcome.leftovers]
        o.killed = [k for inst in self.ranks for k in inst.outcome.killed]
        o.interrupted = o.interrupted or any(inst.outcome.interrupted for inst in self.ranks)
        o.teardown_s = max((inst.outcome.teardown_s or 0.0 for inst in self.ranks), default=None)

    def kill_now(self) -> None:
        for inst in self.ranks:
            inst.kill_now()
