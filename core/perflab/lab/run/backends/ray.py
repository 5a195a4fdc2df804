"""The Ray backend: a study's runs on the nodes of a Ray cluster (issue #14, item 3).

Imported only for ``perflab run --executor ray`` (the ``perflab[ray]`` extra); nothing else in
perflab imports Ray.

How a study runs on Ray
-----------------------
* :meth:`RayCluster.connect` joins the cluster (``--ray-address``; without one, a local Ray is
  started for the study and stopped with it) and asks every alive node, with a task pinned
  to it, for its :func:`node_report`: the hardware snapshot probed *on that node*, its machine
  class, and its perflab, plugin and engine versions. The study uses the nodes of the plan's
  machine: a node labelled ``perflab.io/sim=NAME`` is the simulated machine ``sim:NAME``
  (each simulated node its own spec, so one host can stand for an A100 node and an H100
  node); an unlabelled node is probed for real (``auto``). Refused before the study starts,
  with one line: no node of the plan's machine; nodes of that kind in more than one machine
  class (A100 and H100 results never mix: the store's keys are salted with the class,
  :func:`perflab.lab.run.executor.key_salt`); a perflab or plugin version different from the
  driver's, or engine versions that differ between nodes; a demand of the plan's engines that
  the nodes' Ray resources can never meet.
* :class:`RayBackend` gives each ticket one placement group (one bundle of the demand's
  devices, ``STRICT_PACK``: one node; ``bundle_label_selector`` keeps it on the study's
  machine). A task in that bundle (:func:`granted`) reads the device ids Ray reserved
  (``ray.get_runtime_context().get_accelerator_ids()``); the node's :class:`Agent` actor (one
  per node for the study's life, started at its first run: a fresh Ray worker and perflab's
  import cost seconds per launch) runs today's :class:`~perflab.lab.run.executor.Executor` against
  its node's snapshot with those ids as the configuration's devices, so the plugins keep
  writing ``CUDA_VISIBLE_DEVICES`` / ``ASCEND_RT_VISIBLE_DEVICES``. The placement group holds
  the devices until the run is over.
  The engine's environment has no inherited ``RAY_*`` / ``*_VISIBLE_DEVICES``
  (:data:`perflab.lab.run.executor.INHERITED_NOT_PASSED`).
* The agent's ``run`` is a Ray streaming generator: every event (placed, running, each
  measured profile, the final record) reaches the driver as it happens; the driver is the
  only writer of the study store (:class:`perflab.lab.run.runner.LiveMeasure`).
* A lost agent or node (``RayActorError``, ``NodeDiedError``...) is a :class:`~perflab.lab.run.backends.local.Lost`
  event: the driver records the run ``interrupted`` (never crashed), keeps the profiles
  already streamed and hands the ticket back once (``requeue_lost``); the next placement
  excludes the lost node. A cancellation (Ctrl-C) asks the agent to tear the run's engines
  down (``Agent.stop``; an agent that does not answer within ``STOP_GRACE_S`` is killed) and
  removes the placement group; the engines run under perflab's keeper
  (:mod:`perflab.lifecycle.keeper`), so even a killed agent leaves none behind, and the agents
  end with the driver.
* No shared filesystem is needed: an agent never writes into the study directory (its node
  may not see it). It runs the executor into a private stage on its node
  (:class:`perflab.lab.run.backends.shipping.Stage`, under the node's temp dir, named by study and run) and
  ships the run's files back as :class:`~perflab.lab.run.backends.local.Files` events — when the engine
  is ready, with each measured profile, and at the end — so a lost node loses only what it
  wrote since; the driver writes them into the run directory. The stage is removed when the
  run is over (failed or cancelled too). Always, not only where the study directory is out
  of sight: one path for every cluster, the driver stays the study's only writer, and a node
  cannot mistake a directory of its own at the same path for the driver's. The engines'
  ``PERFLAB_INSTANCE`` markers still name the driver's study (``perflab ps``/``kill`` on a
  node find them by it). The simulator's per-node state lives in the node's directory of the
  study too (:func:`perflab.lab.run.backends.shipping.study_stage`), removed from every node at the end
  of the study (:meth:`RayCluster.close`).
* Multi-node engines (a configuration with ``nodes`` N > 1, issue #14 item 5): the demand is
  N nodes of ``devices_per_node`` devices; the placement group has one bundle per node,
  ``STRICT_SPREAD`` (never two ranks on one node). Bundle k is node rank k: a task in it
  (:func:`granted`) says its node, the device ids Ray reserved there and the node's address
  (Ray's node IP). Rank 0's agent runs the executor and the :class:`~perflab.supervisor_group.EngineGroup`
  (rank 0 serves and is probed there; ``--dist-init-addr`` / ``--data-parallel-address`` is
  rank 0's node IP); rank k >= 1 is a :class:`RemoteRank`: node k's agent starts it
  (:meth:`Agent.rank_start`) as an :class:`~perflab.supervisor.EngineInstance` of its own,
  under that node's keeper, marker, devices and environment, and says when it dies and why
  (its cause classified there, from its log) and tears it down when asked; the rank runs in
  a stage of its own there, whose files (``engine-node<k>.log``, its launch record) the
  driver fetches once the group is down (:meth:`Agent.rank_files`). Any rank dying
  is the group's crash ("node rank 1: ..."), every rank torn down on every node. A node lost
  while its group runs ends the run as lost (``interrupted``, re-queued once, never
  crashed), and the driver tears the run's ranks down on every surviving node
  (:meth:`Agent.stop_ranks`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import socket
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import ray
import ray.exceptions
import structlog
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

from perflab.contract.errors import UsageError
from perflab.contract.status import Status
from perflab.contract.types import CrashCause, GroupNode
from perflab.lab.options import Configuration
from perflab.lab.plan import Plan
from perflab.lab.run.backends.local import (
    Demand,
    Files,
    Finished,
    LocalBackend,
    Lost,
    Measured,
    Placed,
    Point,
    Sink,
    State,
    Ticket,
)
from perflab.lab.run.backends.shipping import Stage, forget_study, study_stage
from perflab.lab.run.executor import (
    LabContext,
    engine_environment,
    key_salt,
    launch_environment,
    study_environment,
    study_time_scale,
)
from perflab.plugins import PluginManager
from perflab.supervisor import LaunchOutcome
from perflab.supervisor_group import GroupPlacement, RankLaunch

log = structlog.get_logger("perflab.lab")

SIM_LABEL = "perflab.io/sim"  # a node label: this node is the simulated machine sim:<value>
NODE_ID_LABEL = "ray.io/node-id"  # Ray's own label of every node (ray/_private/ray_constants.py)
# perflab's accelerator kinds as Ray's resources: "GPU" (ray/_private/accelerators/nvidia_gpu.py)
# and "NPU", Ray's Ascend resource (ray/_private/accelerators/npu.py,
# NPUAcceleratorManager.get_resource_name; Ray 2.60.0)
RAY_RESOURCE = {"cuda": "GPU", "ascend": "NPU"}
# what ends an agent without it saying so: the run is lost, not a result
LOST = (ray.exceptions.RayActorError, ray.exceptions.NodeDiedError, ray.exceptions.ObjectLostError,
        ray.exceptions.OwnerDiedError, ray.exceptions.WorkerCrashedError, ray.exceptions.LocalRayletDiedError,
        ray.exceptions.RaySystemError)
STOP_GRACE_S = 30.0  # a cancelled agent's engines' teardown, before the agent is killed
FORGET_S = 10.0  # the nodes' removal of the study's directory there, when the study ends
# a finished run's placement group is kept this long for the next run of the same shape (the
# next step's configurations are dispatched milliseconds after the step's last run ends); Ray
# retries a placement group it could not place at once only about every second (measured,
# Ray 2.60.0: a group created right after another was removed, or waiting behind it, is
# ready 0.7-1.0 s later), so removing and re-creating cost a second per queued launch
PG_LINGER_S = 2.0


class ClusterRefused(UsageError):
    """The cluster cannot run this study (one line, before anything is launched)."""


# --------------------------------------------------------------------------- what a node reports


def node_spec(labels: Mapping[str, str]) -> str:
    """The hardware spec a node stands for: ``sim:NAME`` from its label, else ``auto``."""
    name = labels.get(SIM_LABEL)
    return f"sim:{name}" if name else "auto"


def _node_env(plan: Plan, study_dir: Path, node_id: str, state: Path | None = None) -> dict[str, str]:
    """The environment a node resolves its hardware with and launches engines from.
    ``state``: where the simulator's per-node state goes (default: the node's directory of
    the study, :func:`perflab.lab.run.backends.shipping.study_stage` — never the study directory, which the
    node may not see)."""
    from perflab.hardware.emulation import MACHINE_STATE_ENV

    env = engine_environment(os.environ)  # not Ray's RAY_* / *_VISIBLE_DEVICES (the probe sees the whole node)
    if plan.hardware != "auto":
        # each activated node is its own machine: its own state (a simulated node's
        # device-memory registry), on the node
        env[MACHINE_STATE_ENV] = str((state or study_stage(study_dir) / "sim-state") / node_id[:12])
        Path(env[MACHINE_STATE_ENV]).mkdir(parents=True, exist_ok=True)
    return study_environment(plan, study_dir, env)


def _activate(pm: PluginManager, plan: Plan, study_dir: Path, node_id: str, spec: str) -> dict[str, str]:
    """The node's engine environment (a simulated node's stand-ins first on PATH), as
    :func:`perflab.hardware.resolve` activates it (``perflab_activate_hardware``)."""
    from perflab.hardware import activate

    env = _node_env(plan, study_dir, node_id)
    return env if spec == "auto" else activate(pm, spec, env)


def _probe(pm: PluginManager, plan: Plan, study_dir: Path, node_id: str, spec: str) -> tuple[Any, dict[str, str], dict[str, str | None]]:
    from perflab.hardware import probe
    from perflab.lab.plan import engines_of

    env = _activate(pm, plan, study_dir, node_id, spec)  # as perflab.hardware.resolve does
    snapshot = probe(pm, env)
    versions = {e: pm.engine(e).engine.version(env) for e in engines_of(plan)}
    return snapshot, env, versions


def software(pm: PluginManager) -> dict[str, Any]:
    """perflab's and its plugins' versions: every node must run the driver's."""
    import perflab

    return {"perflab": perflab.__version__,
            "plugins": {r.name: r.version for r in sorted(pm.records, key=lambda r: r.name)}}


def machine_class(plan: Plan, snapshot: Any) -> str:
    """What the store's keys are salted with for this machine (``key_salt``'s hardware)."""
    salt = key_salt(plan.hardware, plan.time_scale, snapshot.simulated, snapshot.accelerators)  # only its hardware is read
    return json.dumps(salt["hardware"])


def node_report(plan: Plan, study_dir: str, spec: str) -> dict[str, Any]:
    """Run on a node (a task pinned to it): what the driver checks before the study starts."""
    from perflab.contract.types import to_jsonable
    from perflab.plugins import load

    pm = load()
    node_id = ray.get_runtime_context().get_node_id()
    snapshot, _, versions = _probe(pm, plan, Path(study_dir), node_id, spec)
    return {"node_id": node_id, "host": socket.gethostname(), "spec": spec, "snapshot": snapshot,
            "hardware": to_jsonable(snapshot), "class": machine_class(plan, snapshot), "engines": versions,
            **software(pm)}


# --------------------------------------------------------------------------- the agent


@dataclass(frozen=True)
class Note:
    """The executor's progress events (launch, benchmark, progress, teardown): for the
    driver's progress display only, never stored."""

    kind: str
    fields: dict[str, Any]


@dataclass(frozen=True)
class RankLost:
    """From rank 0's agent: the node of another rank of its group was lost (the driver
    records the run lost and excludes that node from the re-queued placement)."""

    node_id: str
    reason: str


@dataclass(frozen=True)
class Bundle:
    """What one bundle of a run's placement group got: its node, the device ids Ray reserved
    there, the node's address (Ray's node IP: where other nodes reach it) and host name."""

    node_id: str
    devices: tuple[int, ...]
    address: str
    host: str

    @property
    def name(self) -> str:
        return f"{self.host}/{self.node_id[:8]}"


def granted(resource: str) -> Bundle:
    """Run as a task in a run's placement group, asking for the whole bundle: the node and the
    device ids Ray reserved for the run (``get_accelerator_ids``). The placement group keeps
    them reserved for the run until the driver removes it."""
    ctx = ray.get_runtime_context()
    return Bundle(ctx.get_node_id(), tuple(sorted(int(x) for x in ctx.get_accelerator_ids().get(resource, []))),
                  ray.util.get_node_ip_address(), socket.gethostname())


@dataclass(frozen=True)
class RayGroup:
    """A multi-node run's placement, handed to rank 0's agent: rank k on ``bundles[k]``'s
    node, started there by ``agents[k]`` (k >= 1)."""

    bundles: tuple[Bundle, ...]
    agents: tuple[Any, ...]  # Ray actor handles of the nodes' agents, rank order

    @property
    def nodes(self) -> tuple[GroupNode, ...]:
        return tuple(GroupNode(k, b.address, b.host, b.devices or None) for k, b in enumerate(self.bundles))

    @property
    def name(self) -> str:
        """The nodes as the study log shows them: rank 0's first."""
        return "+".join(b.name for b in self.bundles)


class RemoteRank:
    """Rank k >= 1 of a group whose EngineGroup runs here (rank 0's agent), started on its own
    node by that node's agent (:meth:`Agent.rank_start`): the group's
    :class:`~perflab.supervisor_group.RankHandle` for a rank on another node. ``lost`` says
    why its node or agent was lost (Ray's error): the group then ends, and the run is lost,
    not crashed."""

    def __init__(self, agent: Any, key: str, rank: RankLaunch, bundle: Bundle, run_dir: Path) -> None:
        self.agent = agent
        self.key = key
        self.rank = rank
        self.bundle = bundle
        self.run_dir = run_dir  # the driver's run directory: the rank's node stages its files for it
        self.outcome = LaunchOutcome(engine=rank.engine, version=rank.version, workdir=rank.workdir)
        self.launch: Any = rank.launch
        self.died = anyio.Event()
        self.lost: str | None = None
        self._tg: anyio.abc.TaskGroup | None = None
        self._stopping = False
        self._stop_started = False
        self._stopped = anyio.Event()

    @property
    def pid(self) -> int | None:
        return self.outcome.pid

    async def __aenter__(self) -> RemoteRank:
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        try:
            self.outcome = await self.agent.rank_start.remote(self.key, self.rank, self.run_dir)
        except LOST as exc:
            self._lose(exc)
        except BaseException as exc:
            await self._close(exc)
            if isinstance(exc, ray.exceptions.RayTaskError):
                raise exc.as_instanceof_cause() from None
            raise
        else:
            if self.outcome.state == Status.READY:
                self._tg.start_soon(self._watch)
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> bool | None:
        return await self._close(exc)

    async def _close(self, exc: BaseException | None) -> bool | None:
        with anyio.CancelScope(shield=True):
            await self.teardown()
        assert self._tg is not None
        self._tg.cancel_scope.cancel()
        await self._tg.__aexit__(None, None, None)
        return None

    def _lose(self, exc: BaseException) -> None:
        """The rank's node or agent is gone (its keeper stopped the rank there, if the node is up)."""
        self.lost = f"node {self.bundle.name} (node rank {self.rank.rank}) was lost ({type(exc).__name__})"
        self.outcome.cause = CrashCause("node-lost", self.lost, source="perflab")
        if self.outcome.state not in (Status.DONE,) and not Status(self.outcome.state).is_failure:
            self.outcome.state = Status.CRASHED
        self.died.set()

    async def _watch(self) -> None:
        """Wait, on the rank's node, for it to exit: a death unasked is the group's crash."""
        try:
            died, outcome = await self.agent.rank_wait.remote(self.key)
        except LOST as exc:
            if not self._stopping:
                self._lose(exc)
            return
        if outcome is not None:
            self.outcome = outcome
        if died and not self._stopping:
            self.died.set()

    def expect_exit(self) -> None:
        self._stopping = True
        try:
            self.agent.rank_expect_exit.remote(self.key)  # not awaited: teardown follows
        except Exception:  # the agent is gone: the teardown says so
            pass

    async def teardown(self) -> None:
        """Stop the rank on its node (its EngineInstance's teardown there: the process tree,
        ports, device memory checked there); idempotent. A node lost meanwhile is noted."""
        self._stopping = True
        if self._stop_started:
            await self._stopped.wait()
            return
        self._stop_started = True
        with anyio.CancelScope(shield=True):
            try:
                with anyio.move_on_after(self.rank.grace + STOP_GRACE_S) as scope:
                    outcome = await self.agent.rank_stop.remote(self.key)
                    if outcome is not None:
                        self.outcome = outcome
                if scope.cancelled_caught:
                    self.outcome.leftovers.append(f"the agent on {self.bundle.name} did not confirm the teardown "
                                                  f"within {self.rank.grace + STOP_GRACE_S:g} s")
            except LOST as exc:
                if self.lost is None and Status(self.outcome.state) == Status.READY:
                    self._lose(exc)
            finally:
                self._stopped.set()

    def kill_now(self) -> None:
        try:
            self.agent.rank_kill.remote(self.key)
        except Exception:  # best effort at exit: the node's keeper stops it with its agent
            pass


class Agent:
    """A Ray actor on one node, for the study's life: today's executor against the node's own
    snapshot, one per run (async: several runs of a step at once on the node's devices)."""

    def __init__(self, plan: Plan, study_dir: str, spec: str, reports: Mapping[str, Mapping[str, Any]]) -> None:
        from perflab.plugins import load

        self.pm = load()
        self.node_id = ray.get_runtime_context().get_node_id()
        # the snapshot and versions this node reported before the study (node_report): not
        # probed again for every run
        report = reports[self.node_id]
        snapshot, versions = report["snapshot"], dict(report["engines"])
        env = _activate(self.pm, plan, Path(study_dir), self.node_id, spec)
        self.ctx = LabContext(self.pm, plan, snapshot, env, versions, study_time_scale(plan, env))
        self.node = f"{socket.gethostname()}/{self.node_id[:8]}"
        self._tasks: dict[int, asyncio.Task[Any]] = {}  # run id -> its executor's run
        self._ranks: dict[str, _HeldRank] = {}  # "<run id>:<rank>" -> a group's rank started on this node
        self._stages: dict[int, Stage] = {}  # run id -> its stage (perflab.lab.run.backends.shipping)
        self._rank_stages: dict[str, Stage] = {}  # "<run id>:<rank>" -> a rank's stage, until shipped

    async def run(self, ticket: Ticket, devices: tuple[int, ...],
                  group: RayGroup | None = None) -> AsyncIterator[Any]:
        """One run; ``group``: a multi-node run's placement, this node being rank 0's.

        The executor runs into a stage on this node (:class:`perflab.lab.run.backends.shipping.Stage`),
        never into the driver's study directory (which this node may not see); what it writes
        there goes to the driver as Files events when the engine is ready, with each measured
        profile and at the end. The stage is removed when the run is over, however it ends."""
        from perflab.lab.run.executor import Executor

        stage = self._stages[ticket.run_id] = Stage(ticket.run_dir, node=self.node, suffix=f"@{self.node_id[:12]}")
        task: asyncio.Future[Any] | None = None
        try:
            yield Placed(self.node if group is None else group.name, devices)
            yield State("running")
            queue: asyncio.Queue[Any] = asyncio.Queue()
            ex = Executor(self.ctx, on_event=lambda kind, **kw: queue.put_nowait(Note(kind, kw)))
            ex.on_measured = lambda name, m: queue.put_nowait(Measured(name, m))
            ex.on_point = lambda name, point, m, reused: queue.put_nowait(Point(name, point, m, reused))
            ex.known_points = ticket.known_points
            ex.placement = devices if devices and ticket.demand.devices is None else None
            ex.study_dir = ticket.run_dir.parent.parent  # the engines' markers name the driver's study
            remotes: list[RemoteRank] = []
            if group is not None:
                def start_rank(node: GroupNode, rank: RankLaunch) -> RemoteRank:
                    remote = RemoteRank(group.agents[node.rank], f"{ticket.run_id}:{node.rank}", rank,
                                        group.bundles[node.rank], ticket.run_dir)
                    remotes.append(remote)
                    return remote

                ex.group = GroupPlacement(group.nodes, start_rank)
            held_back: list[Measured] = []  # a group's failed measurements: a lost node's make none
            task = self._tasks[ticket.run_id] = asyncio.ensure_future(
                ex.run(ticket.config, list(ticket.profiles), stage.path, **ticket.run_kw()))

            def passed(ev: Any) -> list[Any]:
                """What of ``ev`` goes to the driver now, with the files worth keeping by then."""
                if group is not None and isinstance(ev, Measured) and Status(ev.measurement.status).is_failure:
                    held_back.append(ev)
                    return []
                if isinstance(ev, (Measured, Point)) or (isinstance(ev, Note) and ev.kind == "benchmark"):
                    return [*stage.ship(), ev]  # the profile's records (or the launch) first
                return [ev]

            while True:
                getter = asyncio.ensure_future(queue.get())
                done, _ = await asyncio.wait({task, getter}, return_when=asyncio.FIRST_COMPLETED)
                if getter in done:
                    for out in passed(getter.result()):
                        yield out
                    continue
                getter.cancel()
                break
            while not queue.empty():
                for out in passed(queue.get_nowait()):
                    yield out
            self._tasks.pop(ticket.run_id, None)
            for files in stage.ship(final=True):  # everything, also when the executor failed
                yield files
            lost = next((r for r in remotes if r.lost), None)
            if lost is not None:  # a rank's node was lost: nothing the group did after is a result
                if not task.cancelled():
                    task.exception()  # retrieved: whatever the group did after, the run is lost, not failed
                yield RankLost(lost.bundle.node_id, f"the Ray agent on node {lost.bundle.node_id[:8]} was lost: {lost.lost}")
                return
            rec = task.result()  # the executor's own error, raised to the driver as itself
            if rec.log is not None:
                rec.log = stage.driver(rec.log)  # where the driver has it
            for ev in held_back:
                yield ev
            yield Finished(rec)
            yield State("done")
        finally:
            if task is not None and not task.done():  # the engines come down before their directory goes
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
            self._tasks.pop(ticket.run_id, None)
            self._stages.pop(ticket.run_id, None)
            stage.remove()

    async def stop(self, run_id: int) -> None:
        """Cancel a run: the executor tears its engines down, as on Ctrl-C locally; its stage goes."""
        task = self._tasks.pop(run_id, None)
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        stage = self._stages.pop(run_id, None)
        if stage is not None:
            stage.remove()

    # ----------------------------------------------------------------- a group's rank on this node

    async def rank_start(self, key: str, rank: RankLaunch, run_dir: Path) -> LaunchOutcome:
        """Start rank ``rank.rank`` of a group on this node (an EngineInstance under this node's
        keeper, with this node's snapshot and environment and the rank's devices here); its
        outcome once it runs (``ready``) or failed to start. It is held until
        :meth:`rank_stop` (or this agent's end). It runs in a stage of its own on this node
        (``run_dir``: the driver's run directory), shipped by :meth:`rank_files`."""
        from perflab.supervisor import EngineInstance

        stage = self._rank_stages[key] = Stage(run_dir, node=self.node,
                                               suffix=f".node{rank.rank}@{self.node_id[:12]}")
        rank = dataclasses.replace(rank, workdir=stage.path, launch=_relocate(rank.launch, rank.workdir, stage.path))
        inst = EngineInstance(
            self.pm, rank.engine, rank.config, hardware=self.ctx.hardware, env=launch_environment(self.ctx),
            workdir=rank.workdir, startup_timeout=rank.startup_timeout, version=rank.version, log_name=rank.log_name,
            grace=rank.grace, scope=rank.scope, launch=rank.launch, serving=rank.serving)
        held = self._ranks[key] = _HeldRank(inst)
        held.task = asyncio.ensure_future(held.hold())
        started = asyncio.ensure_future(held.started.wait())
        await asyncio.wait({held.task, started}, return_when=asyncio.FIRST_COMPLETED)
        started.cancel()
        if held.task.done():
            held.task.result()  # its error, raised to rank 0's agent
        return self._as_driver(key, inst.outcome)

    def _as_driver(self, key: str, outcome: LaunchOutcome) -> LaunchOutcome:
        """A rank's outcome with its paths where the driver has them (its stage's files are
        shipped into the run directory)."""
        stage = self._rank_stages.get(key)
        if stage is None:
            return outcome
        out = dataclasses.replace(outcome)
        out.workdir = stage.run_dir
        if out.log is not None:
            out.log = Path(stage.driver(out.log))
        return out

    async def rank_wait(self, key: str) -> tuple[bool, LaunchOutcome | None]:
        """Until the rank dies unasked (True) or is torn down (False); its outcome then."""
        held = self._ranks.get(key)
        if held is None:
            return False, None
        await _first_of(held.inst.died, held.ended)
        return held.inst.died.is_set(), self._as_driver(key, held.inst.outcome)

    def rank_expect_exit(self, key: str) -> None:
        held = self._ranks.get(key)
        if held is not None:
            held.inst.expect_exit()

    async def rank_stop(self, key: str) -> LaunchOutcome | None:
        """Tear the rank down (as EngineInstance does: the tree, its ports, device memory); its
        final outcome."""
        held = self._ranks.get(key)
        if held is None:
            return None
        held.inst.expect_exit()
        held.stop.set()
        if held.task is not None:
            await asyncio.gather(held.task, return_exceptions=True)
        self._ranks.pop(key, None)
        return self._as_driver(key, held.inst.outcome)

    def rank_kill(self, key: str) -> None:
        held = self._ranks.get(key)
        if held is not None:
            held.inst.kill_now()

    async def stop_ranks(self, run_id: int) -> int:
        """Tear down every rank of run ``run_id`` still on this node (the driver, when the run's
        rank 0 or its agent is gone, or on Ctrl-C); how many there were."""
        keys = [k for k in self._ranks if k.split(":")[0] == str(run_id)]
        await asyncio.gather(*(self.rank_stop(k) for k in keys), return_exceptions=True)
        return len(keys)

    async def rank_files(self, run_id: int) -> AsyncIterator[Files]:
        """The files of run ``run_id``'s ranks on this node (the driver, once they are torn
        down: :meth:`stop_ranks`), as Files events; their stages are removed after."""
        keys = sorted(k for k in self._rank_stages if k.split(":")[0] == str(run_id))
        try:
            for key in keys:
                if key in self._ranks:  # still running (the driver stops them first): shipped as it is
                    log.warning("lab.rank-files-early", key=key)
                for files in self._rank_stages[key].ship(final=True):
                    yield files
        finally:
            for key in keys:
                stage = self._rank_stages.pop(key, None)
                if stage is not None and key not in self._ranks:
                    stage.remove()

    def ranks(self) -> list[str]:
        """The keys of the ranks this agent holds (tests: nothing is left after a run)."""
        return sorted(self._ranks)


async def _first_of(*events: asyncio.Event) -> None:
    """Until any of ``events`` is set (the waits on the others are cancelled)."""
    waits = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()


def _relocate(launch: Any, old: Path, new: Path) -> Any:
    """A rank's launch, built on rank 0's node for its stage ``old``, with paths inside that
    stage moved into this node's stage ``new`` (its files, its working directory, argv and
    environment values naming them)."""
    if launch is None or old == new:
        return launch
    before, after = str(old), str(new)

    def move(text: str) -> str:
        return after + text[len(before):] if text == before or text.startswith(before + "/") else text

    return dataclasses.replace(
        launch, argv=tuple(move(a) for a in launch.argv), env={k: move(v) for k, v in launch.env.items()},
        cwd=move(launch.cwd) if launch.cwd else launch.cwd,
        files=tuple(dataclasses.replace(f, path=move(f.path)) for f in launch.files))


class _HeldRank:
    """A group's rank on this node: its EngineInstance, entered and exited in one task
    (:meth:`hold`), which lives until the rank is stopped or dies."""

    def __init__(self, inst: Any) -> None:
        self.inst = inst
        self.started = asyncio.Event()
        self.stop = asyncio.Event()
        self.ended = asyncio.Event()
        self.task: asyncio.Task[Any] | None = None

    async def hold(self) -> None:
        try:
            async with self.inst:
                self.started.set()
                if self.inst.outcome.state == Status.READY:
                    await _first_of(self.inst.died, self.stop)
            # torn down here (a rank that died is cleaned up on its node at once)
        finally:
            self.started.set()
            self.ended.set()


# --------------------------------------------------------------------------- the cluster


def bundles(demand: Demand, resource: str | None) -> list[dict[str, float]]:
    """One bundle per node of the demand's devices; a demand without a Ray resource (a CPU
    engine, or one no node can hold — the executor refuses it with its reason, as locally)
    takes a sliver of a CPU so it is still placed on a node of the study's machine."""
    one = {resource: float(demand.per_node)} if resource else {"CPU": 0.01}
    return [dict(one) for _ in range(max(1, demand.nodes))]


def _remove(pg: Any) -> None:
    """Give a placement group back to Ray; after the driver left Ray, its groups are gone."""
    try:
        remove_placement_group(pg)
    except Exception as exc:  # Ray is shut down (the study ended): it removed the job's groups
        log.debug("lab.ray-pg-remove", error=str(exc))


def strategy(demand: Demand) -> str:
    return "STRICT_SPREAD" if demand.nodes > 1 else "STRICT_PACK"


def local_node(pm: PluginManager, plan: Plan, study_dir: Path) -> dict[str, Any]:
    """``ray.init`` arguments of the local Ray started without ``--ray-address``: for a
    simulated plan, the simulated machine's devices as Ray resources and its label (Ray would
    find no GPU on this host); for real hardware, Ray's own detection."""
    if not plan.hardware.startswith("sim:"):
        return {}
    from perflab.hardware import resolve

    snapshot, _ = resolve(pm, plan.hardware, _node_env(plan, study_dir, "local", study_dir / "sim-state"))
    counts: dict[str, float] = {}
    for a in snapshot.accelerators:
        if a.kind in RAY_RESOURCE:
            counts[RAY_RESOURCE[a.kind]] = counts.get(RAY_RESOURCE[a.kind], 0.0) + 1
    return {"num_gpus": int(counts.pop("GPU", 0)), "resources": counts, "labels": {SIM_LABEL: plan.hardware[4:]}}


def check_reports(plan: Plan, here: Mapping[str, Any], reports: Sequence[Mapping[str, Any]]) -> None:
    """Refuse, with one line, nodes of several machine classes, a node whose perflab or plugins
    differ from the driver's (``here``: :func:`software`), engine versions that differ between nodes."""
    classes = sorted({r["class"] for r in reports})
    if len(classes) > 1:
        raise ClusterRefused(f"the cluster's {plan.hardware} nodes are of {len(classes)} machine classes "
                             f"({'; '.join(classes)}): results of different machines never mix — run the study "
                             f"on nodes of one class")
    for r in reports:
        if {k: r[k] for k in here} != here:
            raise ClusterRefused(f"node {r['host']}/{r['node_id'][:8]} runs perflab {r['perflab']} with plugins "
                                 f"{r['plugins']}; this driver runs perflab {here['perflab']} with {here['plugins']} "
                                 f"— install the same versions everywhere")
        if r["engines"] != reports[0]["engines"]:
            raise ClusterRefused(f"engine versions differ between nodes: {reports[0]['host']}/"
                                 f"{reports[0]['node_id'][:8]} has {reports[0]['engines']}, {r['host']}/"
                                 f"{r['node_id'][:8]} has {r['engines']}")


class RayCluster:
    """The driver's view of the cluster: the study's nodes, checked, and their snapshot."""

    def __init__(self, plan: Plan, study_dir: Path, reports: list[dict[str, Any]], nodes: list[dict[str, Any]],
                 started: bool) -> None:
        self.plan = plan
        self.study_dir = study_dir
        self.reports = reports
        self.snapshot = reports[0]["snapshot"]
        self.versions: dict[str, str | None] = dict(reports[0]["engines"])
        self.spec = reports[0]["spec"]
        self.selector = {SIM_LABEL: self.spec[4:]} if self.spec.startswith("sim:") else {}
        # Ray's resources of the study's nodes: {node id: {"GPU": 8.0, ...}}
        self.resources = {n["NodeID"]: dict(n.get("Resources") or {}) for n in nodes
                          if n["NodeID"] in {r["node_id"] for r in reports}}
        self.started = started
        self.names = [f"{r['host']}/{r['node_id'][:8]}" for r in reports]  # what the study log shows
        self.by_node = {r["node_id"]: {"snapshot": r["snapshot"], "engines": r["engines"]} for r in reports}

    @classmethod
    def connect(cls, pm: PluginManager, plan: Plan, study_dir: Path, address: str | None) -> RayCluster:
        """Join (or start) Ray and check its nodes for this study; blocking (run it in a thread)."""
        study_dir = study_dir.resolve()
        if not ray.is_initialized():
            # without an address: a local Ray for this study (this machine, one node), stopped with it
            ray.init(address=address, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING,
                     configure_logging=False, namespace="perflab",
                     **(local_node(pm, plan, study_dir) if address is None else {}))
        started = address is None
        alive = [n for n in ray.nodes() if n.get("Alive")]
        mine = [n for n in alive if node_spec(n.get("Labels") or {}) == (plan.hardware if plan.hardware.startswith("sim:") else "auto")]
        if not mine:
            seen = sorted({node_spec(n.get("Labels") or {}) for n in alive})
            raise ClusterRefused(f"no Ray node is the plan's machine {plan.hardware} (the cluster's nodes: "
                                 f"{', '.join(seen) or 'none'}; a simulated node carries the label {SIM_LABEL}=NAME)")
        refs = [ray.remote(node_report).options(
            num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote(
                plan, str(study_dir), node_spec(n.get("Labels") or {})) for n in mine]
        reports = ray.get(refs)
        check_reports(plan, software(pm), reports)
        return cls(plan, study_dir, reports, alive, started)

    def capacity(self, resource: str) -> float:
        return max([r.get(resource, 0.0) for r in self.resources.values()] or [0.0])

    def total(self, resource: str) -> float:
        return sum(r.get(resource, 0.0) for r in self.resources.values())

    def check(self, demands: Sequence[tuple[str, Demand]]) -> None:
        """Refuse a demand no node can ever meet (it would wait forever), before the study starts."""
        for label, d in demands:
            res = RAY_RESOURCE.get(d.kind or "")
            if res is None:
                continue
            have = sum(1 for r in self.resources.values() if r.get(res, 0.0) >= d.per_node)
            known = sum(1 for a in self.snapshot.accelerators if a.kind == d.kind)
            if d.per_node <= known and have < max(1, d.nodes):
                raise ClusterRefused(
                    f"{label} needs {d.per_node} {res} on {d.nodes} node(s) of {self.plan.hardware}; the cluster's "
                    f"nodes offer at most {self.capacity(res):g} {res} ({len(self.resources)} node(s)) — start Ray "
                    f"with --num-gpus / --resources '{{\"NPU\": N}}' matching the machine")

    def close(self) -> None:
        """Remove the study's directory on every node still there (its stages, the simulator's
        per-node state; bounded: a lost node does not answer), then leave Ray."""
        if not ray.is_initialized():
            return
        try:
            alive = {n["NodeID"] for n in ray.nodes() if n.get("Alive")}
            refs = [ray.remote(forget_study).options(
                num_cpus=0, max_retries=0, scheduling_strategy=NodeAffinitySchedulingStrategy(r["node_id"], soft=False),
            ).remote(self.study_dir) for r in self.reports if r["node_id"] in alive]
            ray.wait(refs, num_returns=len(refs), timeout=FORGET_S)
        except Exception as exc:  # best effort: the study is over
            log.warning("lab.ray-forget-failed", error=str(exc))
        finally:
            ray.shutdown()


# --------------------------------------------------------------------------- the backend


class RayBackend(LocalBackend):
    """Runs tickets on the cluster's nodes of the study's machine; as many at once as Ray
    can place (``parallel``: the study's devices in all, so a step's configurations are all
    submitted and Ray's placement groups queue what does not fit yet)."""

    requeue_lost = True  # LiveMeasure hands a lost ticket back once

    def __init__(self, ctx: LabContext, cluster: RayCluster, *, on_event: Any = None) -> None:
        super().__init__(ctx, parallel=1, on_event=on_event)
        self.cluster = cluster
        n = sum(int(self.cluster.total(res)) for res in RAY_RESOURCE.values())
        self.parallel = max(n, len(cluster.resources), 1)
        self.lost_nodes: list[str] = []
        self.agent = ray.remote(Agent)
        # Ray runs a task that asks for GPUs in a fresh worker process each time unless told
        # otherwise (max_calls defaults to 1 for GPU tasks, to free the GPU memory a task may
        # have kept); this one only reads the ids Ray assigned, so its worker is kept and the
        # next launch's placement does not wait for a new process and its imports
        self.granted = ray.remote(max_calls=0)(granted)
        self._agents: dict[str, Any] = {}  # node id -> its agent (one per node of the study's machine)
        self._held: dict[int, tuple[str | None, Demand]] = {}  # run id -> (its node, None: not placed yet)
        # placement groups of finished runs, kept for a run of the same shape (PG_LINGER_S), and
        # the runs whose own group Ray has not placed yet, by shape: a finished run hands its
        # group to the first of them instead of removing it
        self._idle: list[tuple[Any, Any, asyncio.TimerHandle]] = []  # (shape, group, its removal)
        self._waiting: dict[Any, list[asyncio.Future[Any]]] = {}
        # every node's agent, and a worker for :func:`granted`, started now in the background: a
        # new Ray worker and perflab's import take about a second, kept off the first runs' path
        for node_id in cluster.resources:
            self._agent(node_id)
            self.granted.options(num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)).remote("")

    def capacity(self, demand: Demand) -> int:
        """How many single-node runs of ``demand`` the cluster's nodes (those not lost) hold at
        once when idle (a multi-node group: one)."""
        res = RAY_RESOURCE.get(demand.kind or "")
        if res is None or demand.nodes > 1:
            return 1
        return max(1, sum(int(have.get(res, 0.0) // max(1, demand.per_node))
                          for node, have in self.cluster.resources.items() if node not in self.lost_nodes))

    def room(self, demand: Demand) -> int:
        """How many more single-node runs of ``demand`` Ray would place right now, from this
        study's own runs on the nodes' resources: the placed ones where they are, those
        still being placed first fit (0 when one of them cannot fit: it waits; 0 beside a
        multi-node group, whose other nodes are not counted here)."""
        res = RAY_RESOURCE.get(demand.kind or "")
        if res is None or demand.nodes > 1 or any(d.nodes > 1 for _, d in self._held.values()):
            return 0
        free = {node: have.get(res, 0.0) for node, have in self.cluster.resources.items() if node not in self.lost_nodes}
        pending = []
        for node, d in self._held.values():
            if RAY_RESOURCE.get(d.kind or "") != res:
                continue
            if node is None:
                pending.append(d)
            elif node in free:
                free[node] -= d.per_node
        for d in pending:
            node = next((n for n, left in free.items() if left >= d.per_node), None)
            if node is None:
                return 0
            free[node] -= d.per_node
        return sum(int(left // max(1, demand.per_node)) for left in free.values() if left > 0)

    @staticmethod
    async def _rank_files(agent: Any, run_id: int, sink: Sink) -> None:
        """The files of a group's ranks on ``agent``'s node, into the run directory."""
        try:
            async for ref in agent.rank_files.remote(run_id):
                sink(await ref)
        except LOST:  # the node is gone, and its ranks' files with it
            pass
        except Exception as exc:  # never in the way of the run's end: its files are the loss
            log.warning("lab.rank-files-failed", run_id=run_id, error=f"{type(exc).__name__}: {exc}")

    def _agent(self, node_id: str) -> Any:
        agent = self._agents.get(node_id)
        if agent is None:
            agent = self._agents[node_id] = self.agent.options(
                num_cpus=0, max_restarts=0, max_task_retries=0,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
            ).remote(self.ctx.plan, str(self.cluster.study_dir), self.cluster.spec, self.cluster.by_node)
        return agent

    def _selector(self) -> dict[str, str]:
        sel = dict(self.cluster.selector)
        if self.lost_nodes:  # re-queued: another node than the one lost
            sel[NODE_ID_LABEL] = f"!{self.lost_nodes[-1]}"
        return sel

    def demand(self, config: Configuration) -> Demand:
        """A multi-node configuration (``nodes`` N > 1) needs N nodes of ``devices_per_node``
        devices each (per replica), not N x that on one node."""
        d = super().demand(config)
        sc = config.serve_config()
        if sc.node_count <= 1:
            return d
        return dataclasses.replace(d, per_node=max(1, sc.devices_per_node) * max(1, config.replicas),
                                   nodes=sc.node_count)

    # ------------------------------------------------ placement groups, reused

    def _claim(self, shape: Any) -> Any:
        """An idle placement group of ``shape`` (None: none; then the idle groups of other
        shapes go back to Ray, whose resources the new group may need)."""
        for i, (k, pg, timer) in enumerate(self._idle):
            if k == shape:
                del self._idle[i]
                timer.cancel()
                return pg
        self._release_idle()
        return None

    def _lose(self, node_id: str) -> None:
        """``node_id`` is gone: no run goes there again, and idle groups (maybe there) go back."""
        self.lost_nodes.append(node_id)
        self._agents.pop(node_id, None)
        self._release_idle()

    def _release_idle(self) -> None:
        while self._idle:
            _, pg, timer = self._idle.pop()
            timer.cancel()
            _remove(pg)

    def _expire(self, pg: Any) -> None:
        for i, (_, held, _) in enumerate(self._idle):
            if held is pg:
                del self._idle[i]
                _remove(pg)
                return

    def _give_back(self, shape: Any, pg: Any, reusable: bool) -> None:
        """A run's placement group, once the run is over: to a run of the same shape waiting
        for Ray, else kept idle for :data:`PG_LINGER_S`; removed when the run did not end
        cleanly (its node lost, the study cancelled) or a node was lost meanwhile."""
        if reusable:
            for fut in self._waiting.get(shape, []):
                if not fut.done():
                    fut.set_result(pg)
                    return
            handle = asyncio.get_running_loop().call_later(PG_LINGER_S, self._expire, pg)
            self._idle.append((shape, pg, handle))
            return
        remove_placement_group(pg)

    async def _placed(self, shape: Any, pg: Any, sink: Sink, label: str) -> Any:
        """``pg`` once Ray placed it, or a finished run's group of the same shape handed over
        first (then ``pg``, still queued in Ray, is removed): the group the run holds."""
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        waiting = self._waiting.setdefault(shape, [])
        waiting.append(fut)
        ready = asyncio.ensure_future(pg.ready())
        try:
            done, _ = await asyncio.wait({ready, fut}, timeout=1.0, return_when=asyncio.FIRST_COMPLETED)
            if not done:
                sink(State("waiting"))
                self.on_event("queued", label=label)
                await asyncio.wait({ready, fut}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:  # cancelled: a group handed over meanwhile goes back to Ray too
            if fut.done() and not fut.cancelled():
                remove_placement_group(fut.result())
            raise
        finally:
            waiting.remove(fut)
            if not waiting:
                self._waiting.pop(shape, None)
            if not fut.done():
                fut.cancel()
            if not ready.done():
                ready.cancel()
        if fut.done() and not fut.cancelled():
            remove_placement_group(pg)  # queued (or placed just now): back to Ray
            return fut.result()
        return pg

    def _nodes_left(self, resource: str | None, demand: Demand) -> int:
        """How many of the study's nodes, not lost, could hold one bundle of ``demand``."""
        return sum(1 for n, r in self.cluster.resources.items()
                   if n not in self.lost_nodes and (resource is None or r.get(resource, 0.0) >= demand.per_node))

    async def run(self, ticket: Ticket, sink: Sink) -> None:
        d = ticket.demand
        res = RAY_RESOURCE.get(d.kind or "")
        known = sum(1 for a in self.ctx.hardware.accelerators if a.kind == d.kind)
        if res is not None and (d.per_node > known or d.per_node > self.cluster.capacity(res)):
            res = None  # never fits: the executor refuses it with its reason, as a local run does
        n = max(1, d.nodes)
        if n > 1 and self._nodes_left(res, d) < n:  # a lost node left too few for this group: it would wait forever
            sink(Lost(f"{n} nodes of {self.ctx.plan.hardware} are needed, {self._nodes_left(res, d)} are left "
                      f"(lost: {', '.join(x[:8] for x in self.lost_nodes)})"))
            return
        ticket = dataclasses.replace(ticket, run_dir=ticket.run_dir.resolve(), demand=d)
        shape = (json.dumps(bundles(d, res), sort_keys=True), strategy(d), json.dumps(self._selector(), sort_keys=True))
        pg = self._claim(shape)
        agent = None
        rank_agents: list[Any] = []  # a group's ranks >= 1: their nodes' agents
        node_id: str | None = None
        reusable = True  # the group goes to the next run of its shape (unless the run ends otherwise)
        self._held[ticket.run_id] = (None, d)
        try:
            how, t0 = "reused", anyio.current_time()
            if pg is None:
                own = placement_group(bundles(d, res), strategy=strategy(d), name=f"perflab-run-{ticket.run_id}",
                                      bundle_label_selector=[self._selector() for _ in range(n)])
                pg = own
                pg = await self._placed(shape, own, sink, ticket.label)
                how = "created" if pg is own else "handed over"
            log.info("lab.ray-placement", run_id=ticket.run_id, group=how, waited_s=round(anyio.current_time() - t0, 3))

            def opts(index: int) -> dict[str, Any]:
                o: dict[str, Any] = {
                    "scheduling_strategy": PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=index),
                    "num_cpus": 0, "max_retries": 0,
                }
                if res == "GPU":
                    o["num_gpus"] = d.per_node
                elif res is not None:
                    o["resources"] = {res: d.per_node}
                return o

            node_id = ray.util.placement_group_table(pg).get("bundles_to_node_id", {}).get(0)
            self._held[ticket.run_id] = (node_id or "?", d)
            try:
                # the devices Ray reserved for this run: a task holding the whole bundle says which
                # (one per bundle: bundle k is node rank k of a multi-node group)
                got: list[Bundle] = list(await asyncio.gather(*(self.granted.options(**opts(k)).remote(res or "")
                                                                for k in range(n))))
                node_id = got[0].node_id
                agent = self._agent(node_id)
                group = None
                if n > 1:
                    rank_agents = [self._agent(b.node_id) for b in got[1:]]
                    group = RayGroup(tuple(got), (agent, *rank_agents))
                    log.info("lab.ray-group", run_id=ticket.run_id, nodes=[b.name for b in got],
                             addresses=[b.address for b in got], devices=[list(b.devices) for b in got])
                gen = agent.run.remote(ticket, got[0].devices, group)
                async for ref in gen:
                    ev = await ref
                    if isinstance(ev, Note):
                        self.on_event(ev.kind, **ev.fields)
                        continue
                    if isinstance(ev, RankLost):  # another rank's node: rank 0's agent is alive
                        self._lose(ev.node_id)
                        ev = Lost(ev.reason)
                    reusable = reusable and not isinstance(ev, Lost)
                    sink(ev)
            except ray.exceptions.RayTaskError as exc:  # the executor's own error: raised as itself
                raise exc.as_instanceof_cause() from None
            except LOST as exc:
                reusable = False
                if node_id:
                    self._lose(node_id)
                reason = f"the Ray agent on node {(node_id or '?')[:8]} was lost ({type(exc).__name__})"
                sink(Lost(reason))
        except BaseException:
            if agent is not None:  # Ctrl-C / the study stopped: this run's engines come down first
                stopped = False
                with anyio.CancelScope(shield=True), anyio.move_on_after(STOP_GRACE_S):
                    try:
                        await agent.stop.remote(ticket.run_id)
                        stopped = True
                    except Exception:  # the agent is gone already: its keeper took the engines down
                        pass
                if not stopped and node_id is not None:  # the keeper stops the engines of a killed agent
                    ray.kill(agent, no_restart=True)
                    self._agents.pop(node_id, None)
            reusable = False
            raise
        finally:
            # a group's ranks on the other nodes: normally torn down by rank 0's group already;
            # after a lost rank 0 or a cancelled run, here (a lost node's agent is gone, and
            # its keeper stopped its rank)
            if rank_agents:
                with anyio.CancelScope(shield=True), anyio.move_on_after(STOP_GRACE_S):
                    await asyncio.gather(*(a.stop_ranks.remote(ticket.run_id) for a in rank_agents),
                                         return_exceptions=True)
                    # their logs come back from their nodes (a lost node's are gone with it)
                    await asyncio.gather(*(self._rank_files(a, ticket.run_id, sink) for a in rank_agents))
            self._held.pop(ticket.run_id, None)
            if pg is not None:
                self._give_back(shape, pg, reusable and node_id is not None and node_id not in self.lost_nodes)


__all__ = ["SIM_LABEL", "Agent", "Bundle", "ClusterRefused", "RankLost", "RayBackend", "RayCluster", "RayGroup", "RemoteRank", "check_reports", "node_report"]
