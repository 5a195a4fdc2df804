"""``perflab run``: a whole study, unattended, resumable, safe to interrupt.

The runner resolves the hardware, opens the study directory's store, and runs
:func:`perflab.lab.study.conduct` with a ``measure`` that first looks in the store (a
configuration measured by an earlier invocation is reused) and otherwise hands it to a
backend (:mod:`perflab.lab.run.backends.local`: the local one runs the
:class:`~perflab.lab.run.executor.Executor` here, ``--parallel`` configurations of a step at once)
and stores what the backend streams back. Ctrl-C (SIGINT) or SIGTERM cancels the study: every
engine is torn down, what was measured stays in the store, and the same command resumes.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sqlite3
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

from perflab import redact
from perflab.contract.errors import HookDeadlineExceeded, PerflabError, UnknownEngine
from perflab.contract.status import Status
from perflab.contract.types import to_jsonable
from perflab.hardware.emulation import MACHINE_STATE_ENV
from perflab.lab.accuracy import ACCURACY_PROFILE
from perflab.lab.exits import RunExit, interrupted_status, outcome_status
from perflab.lab.options import Configuration
from perflab.lab.plan import Plan, Profile, engines_of
from perflab.lab.report import report_context
from perflab.lab.report.publish import write_report
from perflab.lab.report.stored import StoreMeasure, profile_key, stored_outcome
from perflab.lab.run.backends.local import Event, Files, Finished, LocalBackend, Lost, Measured, Placed, Point, Ticket
from perflab.lab.run.backends.shipping import receive
from perflab.lab.run.executor import LabContext, key_salt, study_environment, study_time_scale
from perflab.lab.store import ProfileMeasurement, RunRecord, Store, write_json
from perflab.lab.store.integrity import (
    PLAN_IDENTITY_META,
    MachineNotReady,
    PlanMismatch,
    StudyLock,
    archive_study,
    as_fault,
    check_plan,
    out_dir_fault,
    plan_identity,
    write_fault,
)
from perflab.lab.study import ConfigResult, StudyOutcome, conduct
from perflab.plugins import PluginManager


@dataclass
class RunSummary:
    outcome: StudyOutcome | None
    study_dir: Path
    report: dict[str, Path]
    interrupted: bool
    exit_code: int
    measured: int  # runs launched in this invocation
    reused: int  # measurements taken from earlier invocations
    # Store.engine_hours(): {"spent", "full_method_estimate", "saved_pct"} of the whole study
    engine_hours: dict[str, float] = dataclasses.field(default_factory=dict)
    archived: Path | None = None  # --replace: where the earlier study in study_dir was moved


class LiveMeasure(StoreMeasure):
    """``measure`` that runs what the store does not have yet, through a backend
    (:mod:`perflab.lab.run.backends.local`); it is the driver: the only writer of the store, it stores
    each profile's measurement as the backend streams it. Several calls may run at once (a
    study step's configurations, when the backend's ``parallel`` > 1)."""

    def __init__(self, store: Store, salt: Mapping[str, Any], backend: Any, *, retry_failed: bool,
                 on_event: Any, log: Any, plan: Plan | None = None) -> None:
        super().__init__(store, salt, retry_failed, plan=plan)
        self.rerun_stopped = plan is not None and not plan.decision.early_stop
        self.search_writable = True  # the driver: it asks for and tells method: search's trials
        if not hasattr(backend, "demand"):  # an executor (or a stand-in): run it in-process, one at a time
            executor = backend
            backend = LocalBackend(None, executor_factory=lambda: executor)
        self.backend = backend
        self.on_event = on_event
        self.log = log
        self.launched = 0
        self.reused = 0
        self._step = ""
        # (step, label, config key) whose result was announced: a configuration looked up again
        # in the same step (the baseline a max_regression guard measured before the engine
        # step) is not announced a second time
        self._announced: set[tuple[str, str, str]] = set()

    @property
    def concurrent(self) -> bool:
        """Whether the study may submit a step's configurations at once."""
        return int(getattr(self.backend, "parallel", 1)) > 1

    def room(self, config: Configuration) -> int:
        """How many more runs of ``config`` the backend would start right now (0 while any
        run waits): the study fills such idle slots with work it knows already."""
        room = getattr(self.backend, "room", None)
        return int(room(self.backend.demand(config))) if room is not None and self.concurrent else 0

    def capacity(self, config: Configuration) -> int:
        """How many runs of ``config`` the backend holds at once when idle (1: one at a time)."""
        capacity = getattr(self.backend, "capacity", None)
        return max(1, int(capacity(self.backend.demand(config)))) if capacity is not None and self.concurrent else 1

    async def __call__(self, config: Configuration, profiles: Sequence[Profile], *, step: str, label: str,
                       to_beat: float | None = None, background: bool = False) -> dict[str, ConfigResult]:
        """Measure what the store lacks; ``to_beat`` (the current best's ranking figure on the
        main profile) lets the executor stop a configuration early once it has clearly lost.
        ``background``: work of a later step dispatched into a slot the current step leaves
        free (the baseline's final measurements): it does not begin its step."""
        if step != self._step and not background:
            self._step = step
            self.on_event("step", title=step)
            self.log.info("lab.step", step=step)
        ckey = config.key(self.salt)
        todo = [p for p in profiles if self.lookup(config, p) is None]
        accuracy = self.accuracy_todo(config, profiles)
        announce = (self._step, label, ckey)
        repeat = not todo and accuracy is None and announce in self._announced  # nothing to run, already said
        requeued = False
        for _ in range(len(profiles) + 3):  # a mid-benchmark crash leaves the rest for a fresh launch
            accuracy = self.accuracy_todo(config, profiles)
            if not todo and accuracy is None:
                break
            self.on_event("measure", label=label, engine=config.engine)
            run_id, run_dir = self.store.begin_run(ckey, config.engine, config.canonical(), step, label, [p.name for p in todo])
            self.log.info("lab.run", run_id=run_id, step=step, label=label, engine=config.engine,
                          options=config.canonical()["options"], profiles=[p.name for p in todo], dir=str(run_dir))
            self.launched += 1
            # the load points an interrupted curve finished: the executor measures only the others
            known = {p.name: pts for p in todo
                     if (pts := self.store.points(ckey, profile_key(self.plan, p), stopped=not self.rerun_stopped))}
            rec = await self._launch(Ticket(run_id, run_dir, config, tuple(todo), label, self.backend.demand(config),
                                            to_beat, known, accuracy), ckey, may_requeue=not requeued)
            if rec is None:  # lost with its node or agent: recorded interrupted; once more, elsewhere
                requeued = True
                todo = [p for p in todo if self.lookup(config, p) is None]  # what was streamed is kept
                self.on_event("requeued", label=label)
                continue
            if rec.state is Status.INTERRUPTED:  # the machine was not ready (a port taken), or the engine was stopped
                raise MachineNotReady(f"{label}: {rec.error}; the run is recorded interrupted (no result) — "
                                      f"re-run the same command to resume")
            if rec.leftovers:
                raise MachineNotReady(
                    f"the teardown of {label} left something behind: {'; '.join(rec.leftovers)} — the study stopped "
                    f"so the next configuration is not measured on a dirty machine; clean up and re-run to resume",
                    leftovers=rec.leftovers)
            self.log.info("lab.run-finished", run_id=run_id, label=label, state=rec.state,
                          measured=sorted(rec.measurements), cause=rec.cause.name if rec.cause else None)
            if not rec.measurements:
                break  # refused or died before serving: that decides every profile
            todo = [p for p in todo if p.name not in rec.measurements]
        out: dict[str, ConfigResult] = {}
        for p in profiles:
            res = self.lookup(config, p) or ConfigResult(Status.PENDING)
            out[p.name] = res
            if res.reused and not repeat:  # counted once, as it is announced once
                self.reused += 1
        main = out[profiles[0].name]
        if not repeat:
            self._announced.add(announce)
            self.on_event("result", label=label, status=main.status, reused=main.reused, summary=result_summary(profiles, out))
        return out

    async def _launch(self, ticket: Ticket, ckey: str, *, may_requeue: bool = False) -> RunRecord | None:
        """Hand ``ticket`` to the backend and store what it streams; the run's final record.
        None: the run was lost (a remote agent or node died) and the backend re-queues lost
        tickets (``requeue_lost``): the run is recorded ``interrupted``, the caller launches
        the rest once more."""
        run_id, run_dir, label = ticket.run_id, ticket.run_dir, ticket.label
        by_name = {p.name: p for p in ticket.profiles}
        saved: set[str] = set()
        final: list[RunRecord] = []
        lost: list[str] = []

        def sink(ev: Event) -> None:
            if isinstance(ev, Measured):  # stored at once: an interrupt later in the launch cannot lose it
                self.store.add_measurement(run_id, ckey, self._key(ticket, ev.profile, by_name), ev.profile,
                                           ev.measurement)
                saved.add(ev.profile)
            elif isinstance(ev, Point):  # a curve's load point: kept even if the curve is interrupted
                if ev.reused:
                    self.reused += 1
                else:
                    self.store.add_point(run_id, ckey, profile_key(self.plan, by_name[ev.profile]), ev.profile,
                                         ev.point, ev.measurement)
            elif isinstance(ev, Placed):
                self.log.info("lab.placed", run_id=run_id, label=label, node=ev.node, devices=list(ev.devices))
                if self.concurrent:  # which run is where matters once several share the machine
                    self.on_event("placed", label=label, node=ev.node, devices=list(ev.devices))
            elif isinstance(ev, Files):  # written on a node without the study directory: the driver writes them
                for refused in receive(run_dir, ev):
                    self.log.warning("lab.files-refused", run_id=run_id, label=label, node=ev.node, reason=refused)
            elif isinstance(ev, Finished):
                final.append(ev.record)
            elif isinstance(ev, Lost):
                lost.append(ev.reason)

        try:
            await self.backend.run(ticket, sink)
        except Exception as exc:
            # the environment (a busy device, a full disk) or perflab itself (a plugin or
            # client bug) failed, not the configuration: recorded as interrupted with the
            # reason — never a result, never reused — and the study stops
            fault = as_fault(exc, self.store.dir)
            reason = str(fault) if fault is not None else f"perflab error: {type(exc).__name__}: {exc}"
            self.log.exception("lab.run-error", run_id=run_id, label=label, reason=reason)
            self._interrupted(run_id, run_dir, reason)
            if fault is not None:
                raise fault from None
            if isinstance(exc, HookDeadlineExceeded):  # a plugin's fault, named as such
                raise PerflabError(f"{exc} while measuring {label}; the run is recorded as interrupted; everything "
                                   f"measured is kept — fix or disable the plugin (PERFLAB_DISABLE_PLUGINS={exc.plugin}) "
                                   "and re-run the same command to resume") from exc
            raise PerflabError(f"perflab failed while measuring {label} ({type(exc).__name__}: {exc}); "
                               f"the run is recorded as interrupted (traceback in {self.store.dir / 'study.log'}); "
                               f"everything measured is kept — re-run the same command to resume") from exc
        except BaseException:
            self._interrupted(run_id, run_dir, None)
            self.log.warning("lab.run-interrupted", run_id=run_id, label=label)
            raise
        if lost or not final:
            reason = lost[0] if lost else "the backend ended the run without a record"
            self._interrupted(run_id, run_dir, reason)
            if lost and may_requeue and getattr(self.backend, "requeue_lost", False):
                self.log.warning("lab.run-lost", run_id=run_id, label=label, reason=reason, requeued=True,
                                 kept=sorted(saved))
                return None
            raise MachineNotReady(f"{label}: the run was lost ({reason}); everything measured is kept — re-run the "
                                  f"same command to resume")
        rec = final[0]
        self._save(run_id, ckey, rec, ticket, saved)
        return rec

    def _key(self, ticket: Ticket, name: str, by_name: Mapping[str, Profile]) -> str:
        """The store's key of a measurement a run streamed: its profile's, or its accuracy job's."""
        if name == ACCURACY_PROFILE:
            if ticket.accuracy is None:
                raise ValueError(f"{ticket.label}: an accuracy measurement the run was not asked for")
            return ticket.accuracy.key()
        return profile_key(self.plan, by_name[name])

    def _interrupted(self, run_id: int, run_dir: Path, reason: str | None) -> None:
        """Best effort: the disk may be the fault."""
        try:
            self.store.mark_interrupted(run_id, reason)
            write_json(run_dir / "outcome.json", {"state": Status.INTERRUPTED, "error": reason})
        except (OSError, sqlite3.Error) as exc:
            self.log.warning("lab.record-interrupted-failed", run_id=run_id, error=str(exc))

    def _save(self, run_id: int, ckey: str, rec: RunRecord, ticket: Ticket, saved: set[str]) -> None:
        for p in ticket.profiles:
            m = rec.measurements.get(p.name)
            if m is not None and p.name not in saved:
                self.store.add_measurement(run_id, ckey, profile_key(self.plan, p), p.name, m)
        m = rec.measurements.get(ACCURACY_PROFILE)
        if ticket.accuracy is not None and m is not None and ACCURACY_PROFILE not in saved:
            self.store.add_measurement(run_id, ckey, ticket.accuracy.key(), ACCURACY_PROFILE, m)
        self.store.finish_run(run_id, rec)


def result_summary(profiles: Sequence[Profile], results: Mapping[str, ConfigResult]) -> str:
    """The progress line's summary of one measure call: the figure alone when it measured one
    profile; with several, each profile named with its own figure (the baseline's final launch
    measures the other profiles beside its reused main one: its main figure alone read as
    the last profile's)."""

    def one(res: ConfigResult) -> str:
        return res.summary() + (" (reused)" if res.reused else "")

    if len(profiles) == 1:
        return one(results[profiles[0].name])
    return "; ".join(f"{p.label}: {one(results[p.name])}" for p in profiles)


def _display_names(pm: PluginManager, engines: Sequence[str]) -> dict[str, str]:
    out = {}
    for e in engines:
        try:
            out[e] = pm.engine(e).info.display_name
        except UnknownEngine:  # an engine whose plugin is gone: show its name as is
            out[e] = e
    return out


def write_study_report(study_dir: Path) -> tuple[StudyOutcome, dict[str, Path]]:
    """``perflab report``: rebuild the decisions from the store and write the report."""
    store = Store.open_existing(study_dir)
    try:
        outcome = anyio.run(stored_outcome, store)
        paths = write_report(outcome, report_context(store), store.dir)
    except (OSError, sqlite3.Error) as exc:  # a read-only or full study directory: one line naming the file
        fault = write_fault(exc, store.dir)
        if fault is None:
            raise
        raise fault from None
    finally:
        store.close()
    return outcome, paths


async def run_study(
    pm: PluginManager,
    plan: Plan,
    out_dir: Path,
    *,
    retry_failed: bool = False,
    progress: Any = None,
    argv: list[str] | None = None,
    parallel: int | str = 1,
    executor: str = "local",
    ray_address: str | None = None,
    replace: bool = False,
) -> RunSummary:
    """Run (or resume) a study; write its report unless interrupted. Holds the study lock
    for its whole life; an environment or storage fault raises its one-line PerflabError
    after recording what happened (never as a configuration's result). ``plan.hardware`` is
    the machine (``perflab run --hardware`` has replaced the plan's own). ``parallel``: how
    many configurations of one step may run at once on disjoint devices (``"auto"``: as many
    as fit; :class:`perflab.lab.run.backends.local.LocalBackend`). ``executor="ray"``: the runs go to the
    nodes of a Ray cluster (``ray_address``; None: a local Ray for the study;
    :mod:`perflab.lab.run.backends.ray`). The directory belongs to one plan: another plan's study
    there is refused (:class:`~perflab.lab.store.integrity.PlanMismatch`, exit 2) unless ``replace``,
    which moves it aside to ``<out>.replaced-<time>`` first (as it does a study of this plan)."""
    from perflab.lab.run.preflight import refuse_owned_flags

    refuse_owned_flags(pm, plan)  # a plan error: refused before the study directory exists
    out_dir = Path(out_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        lock = StudyLock(out_dir)
        lock.acquire()  # one writer per study: a second run exits 2 naming this pid
    except OSError as exc:  # --out under a regular file, in /proc, read-only: one line, nothing written
        raise out_dir_fault(exc, out_dir) from None
    cluster = None
    try:
        lock, archived = _claim(out_dir, plan, lock, replace=replace)
        if executor == "ray":  # join Ray and check its nodes for this study (perflab.lab.run.backends.ray)
            from perflab.lab.run.backends.ray import RayCluster

            cluster = await anyio.to_thread.run_sync(RayCluster.connect, pm, plan, out_dir, ray_address)
        summary = await _run_locked(pm, plan, out_dir, retry_failed=retry_failed, progress=progress, argv=argv,
                                    parallel=parallel, cluster=cluster)
        return dataclasses.replace(summary, archived=archived)
    except (OSError, sqlite3.Error) as exc:  # a storage fault outside a run (meta, plan copy, report)
        fault = as_fault(exc, out_dir)
        if fault is None:
            raise
        raise fault from None
    finally:
        if cluster is not None:
            cluster.close()
        lock.release()


def _claim(out_dir: Path, plan: Plan, lock: StudyLock, *, replace: bool) -> tuple[StudyLock, Path | None]:
    """Make ``out_dir`` this plan's study (the caller holds ``lock`` on it): refuse another
    plan's study, or with ``replace`` archive whatever study is there. Returns the lock now
    held and where the earlier study went (None: nothing was moved)."""
    remedy = ("choose another --out for it, or add --replace to move the old study aside "
              f"(to {out_dir.name}.replaced-<time>) and start afresh")
    try:
        exists = check_plan(out_dir, plan, remedy=remedy)
    except PlanMismatch:
        if not replace:
            raise
        exists = True
    if not (replace and exists):
        return lock, None
    archived = archive_study(out_dir)  # the lock file moves with it, still held: no writer slips in between
    fresh = StudyLock(out_dir)
    fresh.acquire()
    lock.release()
    # said at once: the move happened even if the new study fails later
    print(f"perflab: --replace: the earlier study in {out_dir} was moved to {archived}", file=sys.stderr)
    return fresh, archived


async def _run_locked(pm: PluginManager, plan: Plan, out_dir: Path, *, retry_failed: bool, progress: Any,
                      argv: list[str] | None, parallel: int | str = 1, cluster: Any = None) -> RunSummary:
    from perflab.hardware import resolve
    from perflab.lab.progress import StudyProgress
    from perflab.lab.store.studylog import study_logging
    from perflab.supervisor import signal_guard

    redact.register(redact.secrets_in(plan))  # env / --api-key values: written as *** everywhere
    redact.private_dir(out_dir)  # 0700 when the plan holds a secret
    base_env = study_environment(plan, out_dir, os.environ)
    snapshot, env = await anyio.to_thread.run_sync(resolve, pm, plan.hardware, base_env)
    if MACHINE_STATE_ENV in base_env:
        Path(base_env[MACHINE_STATE_ENV]).mkdir(parents=True, exist_ok=True)
    time_scale = study_time_scale(plan, env)
    engines = engines_of(plan)
    choices = {e: await anyio.to_thread.run_sync(pm.engine(e).choose_version, env, plan.engine_versions.get(e), "plan")
               for e in engines}
    # the version each engine's commands are built for, recorded with every run: the plan's
    # engine_versions, else the installed one (None: not installed, the plugin builds for its newest)
    versions = {e: c.version if c.origin == "plan" else c.installed for e, c in choices.items()}
    if cluster is not None:  # the study's machine is the Ray nodes': their own snapshot and versions
        snapshot = cluster.snapshot
        versions = {**cluster.versions, **{e: v for e, v in plan.engine_versions.items() if e in versions}}
    version_notes = [note for c in choices.values() for note in c.notes]
    display = _display_names(pm, engines)

    store = Store(out_dir)
    salt = key_salt(plan.hardware, time_scale, snapshot.simulated, snapshot.accelerators, versions)
    suffix = plan.path.suffix if plan.path is not None and plan.path.suffix else ".yaml"
    plan_copy = store.dir / f"plan{suffix}"
    if plan.path is not None and plan.path.is_file() and plan.path.resolve() != plan_copy.resolve():
        redact.write_text(plan_copy, redact.scrub_plan(plan.path.read_text(encoding="utf-8")))
    elif plan.text:
        redact.write_text(plan_copy, redact.scrub_plan(plan.text))
    for key, value in {
        "plan_text": redact.scrub_plan(plan.text), "plan_path": str(plan.path.resolve() if plan.path and plan.path.exists() else plan_copy),
        "hardware": to_jsonable(snapshot), "hardware_spec": plan.hardware, "simulated": snapshot.simulated,
        "time_scale": time_scale, "versions": versions, "display": display, "salt": salt, "last_state": "running",
        "version_origins": {e: "plan" if e in plan.engine_versions else "installed" for e in engines},
        "stop_reason": None, "leftovers": [], PLAN_IDENTITY_META: plan_identity(plan),
    }.items():
        store.set_meta(key, value)
    write_json(store.dir / "hardware.json", to_jsonable(snapshot))
    store.begin_session(argv)

    header = f"{plan.name} · {plan.display_model} · {plan.hardware}"
    if snapshot.simulated and time_scale != 1.0:
        header += f" (simulated, time ×{time_scale:g})"
    ui = progress or StudyProgress(header)
    ctx = LabContext(pm, plan, snapshot, env, versions, time_scale)
    outcome: StudyOutcome | None = None
    interrupted = False
    signal_status = 0
    stopped: PerflabError | None = None
    t0 = time.monotonic()
    with ui, study_logging(store.dir, ui.log_listener) as log:
        log.info("lab.start", plan=str(plan.path), out=str(store.dir), hardware=plan.hardware, simulated=snapshot.simulated,
                 time_scale=time_scale, versions=versions, retry_failed=retry_failed)
        for note in version_notes:
            log.warning("lab.engine-version", warning=note)
        backend: LocalBackend
        if cluster is not None:
            from perflab.lab.run.backends.ray import RayBackend

            backend = RayBackend(ctx, cluster, on_event=ui.event)
            log.info("lab.ray", nodes=cluster.names, machine=plan.hardware, parallel=backend.parallel)
            # a demand no node can meet is refused before the study starts
            cluster.check([(display.get(e, e), backend.demand(plan.engine_defaults(e))) for e in plan.engines]
                          + [("the baseline", backend.demand(plan.baseline_config()))])
        else:
            backend = LocalBackend(ctx, parallel=parallel, on_event=ui.event)
        if backend.parallel > 1:
            log.info("lab.parallel", parallel=backend.parallel, devices={k: list(v) for k, v in backend.devices.items()})
        measure = LiveMeasure(store, salt, backend, retry_failed=retry_failed, on_event=ui.event, log=log, plan=plan)
        rejected: set[str] = set()

        def on_rejected(label: str, note: str) -> None:
            if label not in rejected:  # the study judges an entry again when it ranks a step
                rejected.add(label)
                ui.event("rejected", label=label, note=note)

        try:
            async with signal_guard() as guard:
                outcome = await conduct(plan, measure, display=lambda e: display.get(e, e), on_rejected=on_rejected)
            interrupted = guard.interrupted
            signal_status = guard.exit_code
        except PerflabError as exc:  # the environment or perflab stopped the study
            stopped = exc
            log.error("lab.stopped", reason=str(exc))
        state = "interrupted" if interrupted else "stopped" if stopped is not None else "done"
        try:
            store.end_session(state)
            store.set_meta("last_state", state)
            if stopped is not None:
                store.set_meta("stop_reason", str(stopped))
                store.set_meta("leftovers", getattr(stopped, "leftovers", []))
        except (OSError, sqlite3.Error) as exc:  # the disk may be what stopped it
            log.warning("lab.end-not-recorded", error=str(exc))
        log.info("lab.end", state=state, launched=measure.launched, reused=measure.reused,
                 elapsed_s=round(time.monotonic() - t0, 1))
    if stopped is not None:
        if isinstance(stopped, MachineNotReady):
            # what was measured, and why it stopped, in the report too
            try:
                await _write_partial_report(store)
            except Exception as exc:  # the report is a courtesy here; the error line is the message
                log.warning("lab.partial-report-failed", error=f"{type(exc).__name__}: {exc}")
        store.close()
        raise stopped
    paths: dict[str, Path] = {}
    # RunExit: OK only when the baseline and the recommendation were measured; interrupted:
    # 128 + the signal (signal_guard's own status)
    exit_code = (signal_status or interrupted_status(signal.SIGINT)) if interrupted else (
        outcome_status(outcome) if outcome is not None else RunExit.ERROR)
    if not interrupted and outcome is not None:
        rctx = report_context(store)
        paths = write_report(outcome, rctx, store.dir)
    hours = store.engine_hours()
    store.close()
    return RunSummary(outcome if not interrupted else None, store.dir, paths, interrupted, exit_code,
                      measure.launched, measure.reused, hours)


async def _write_partial_report(store: Store) -> dict[str, Path]:
    outcome = await stored_outcome(store)
    return write_report(outcome, report_context(store), store.dir)


def default_out(plan: Plan) -> Path:
    return Path("perflab-studies") / plan.name


def print_summary(summary: RunSummary, stream: Any = None) -> None:
    stream = stream or sys.stdout
    if summary.interrupted:
        print(f"perflab: interrupted; everything measured so far is kept in {summary.study_dir}. "
              f"Re-run the same command to resume.", file=sys.stderr)
        return
    o = summary.outcome
    if o is not None and o.optimized is not None:
        print(f"Optimized: {o.optimized.label} (baseline: {o.baseline.label})", file=stream)
    print(f"Runs launched: {summary.measured}; measurements reused from earlier runs: {summary.reused}", file=stream)
    h = summary.engine_hours
    if h:
        print(f"Engine-hours: {h['spent']:.3f} spent; the full method would have spent about "
              f"{h['full_method_estimate']:.3f} (early stop saved {h['saved_pct']:.1f}%)", file=stream)
    for kind, path in summary.report.items():
        print(f"{kind.capitalize():9s} {path}", file=stream)
    if summary.exit_code:  # a study that ran but did not measure what its answer needs says so, and how it exits
        from perflab.lab.exits import describe
        from perflab.lab.report import not_eligible

        # measured but excluded (the accuracy gate, a guard): the line says so, not only the report
        why = not_eligible(o) if o is not None and o.optimized is None else []
        # a failed accuracy run is kept as the benchmarks' failures are: say how to measure it again
        retry = any(e.accuracy is not None and e.accuracy.get("gate") == "not measured"
                    for s in (o.steps if o is not None else ()) for e in s.entries)
        print(f"perflab: {describe(summary.exit_code)[1]} (exit {int(summary.exit_code)})"
              + (f": no measured configuration is eligible: {'; '.join(why)}" if why else "")
              + ("; --retry-failed measures the failed accuracy runs again" if why and retry else "")
              + f"; see {summary.study_dir / 'report.md'}", file=sys.stderr)


__all__ = [
    "LiveMeasure",
    "ProfileMeasurement",
    "RunSummary",
    "default_out",
    "print_summary",
    "run_study",
    "write_study_report",
]
