"""The engine supervisor: preflight, launch, wait until it really serves, watch it, tear it down.

perflab's promise is here: never hang (every wait has a deadline), never miss a crash (the
process' exit is awaited, not polled at the next health check), never leave a process or a
port behind (the whole process group, session and marked descendants are killed, and the
ports and accelerator memory are checked afterwards)::

    async with EngineInstance(pm, "vllm", config, hardware=hw, env=env, workdir=run_dir) as engine:
        if engine.outcome.state is not Status.READY:
            print(engine.outcome.to_json())   # unsupported / crashed / timeout, already torn down
        else:
            ...  # benchmark engine.base_url; engine.died is set the moment it exits
    # here it is torn down: engine.outcome.state is "done" (or "crashed"), teardown_s is set

States (:class:`perflab.contract.status.Status`; ``LaunchOutcome.transitions`` records each with its time)::

    preflight -> launching -> waiting-ready -> ready -> tearing-down -> done
        |            |              |            |
    unsupported   crashed     crashed/timeout  crashed

A failed run keeps its failure state after teardown (the transitions show the teardown).
See docs/lifecycle.md.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar, TypeVarTuple

import anyio
import httpx
import psutil
import structlog

from perflab import redact
from perflab.contract.crashes import is_notable
from perflab.contract.errors import HookDeadlineExceeded, UnsupportedOption
from perflab.contract.status import Status
from perflab.contract.types import (
    CrashCause,
    HardwareSnapshot,
    LaunchSpec,
    Readiness,
    ServeConfig,
    Unsupported,
    to_jsonable,
)
from perflab.hardware import CPU_KIND
from perflab.lifecycle import procs, registry
from perflab.lifecycle.output import OutputPump
from perflab.lifecycle.ports import (
    connect_host,
    pick_free_port,
    port_is_free,
    port_owners,
    taken_ports,
    wait_ports_free,
)
from perflab.lifecycle.ports import (
    held as ports_held,
)
from perflab.lifecycle.ports import (
    hold as ports_hold,
)
from perflab.lifecycle.ports import (
    unhold as ports_unhold,
)
from perflab.lifecycle.readiness_probe import Kick, ProbeRefused, ProbeState, http_probes_pass, poll_until_ready
from perflab.lifecycle.registry import install_signal_handlers, signal_guard, teardown_all
from perflab.plugins import PluginManager

__all__ = [
    "STATES",
    "EngineInstance",
    "LaunchOutcome",
    "install_signal_handlers",
    "pick_free_port",
    "signal_guard",
    "teardown_all",
]

log = structlog.get_logger("perflab.supervisor")

STATES = Status.supervisor_states()  # a launch's states (the facts of each: perflab.contract.status)

DEFAULT_GRACE_S = 10.0
PORT_RELEASE_WAIT_S = 3.0  # after every process is gone the kernel frees listeners at once
MEMORY_SETTLE_S = 5.0  # drivers release device memory shortly after the process dies
MEMORY_TOLERANCE = 0.03  # of a device's total memory
TRACK_INTERVAL_S = 1.0  # how often descendants are snapshotted while the engine runs
PORT_PICK_TRIES = 5
# the crash signature (the plugins' perflab_crash_signatures) of an engine that could not bind
# its port: another process holds it (the lab relaunches on a fresh port, then calls it an
# environment fault: perflab.lab.run.executor)
ADDRESS_IN_USE = "address-in-use"
# After ready: the HTTP probes are repeated every HEALTH_INTERVAL_S. Failing answers (an HTTP
# error status or a refused connection) for HEALTH_FAIL_S in a row (and HEALTH_FAILS probes)
# end the run as crashed although the process lives: vLLM 0.32 answers /health with 503 once
# its EngineCore is dead (forever with VLLM_KEEP_ALIVE_ON_ENGINE_DEATH=1). A probe that only
# times out is an engine too busy to answer (a CPU engine under load), so it needs
# HEALTH_TIMEOUT_FAIL_S of silence.
HEALTH_INTERVAL_S = 1.0
HEALTH_FAILS = 3
HEALTH_FAIL_S = 2.0
HEALTH_TIMEOUT_FAIL_S = 60.0


@dataclass
class LaunchOutcome:
    """Everything that happened to one launch, kept up to date by its :class:`EngineInstance`;
    ``to_json()`` is what ``perflab launch --json`` prints."""

    state: Status = Status.PREFLIGHT
    cause: CrashCause | None = None
    reasons: tuple[Unsupported, ...] = ()  # errors that refused it
    warnings: tuple[Unsupported, ...] = ()
    log: Path | None = None
    ready_s: float | None = None  # launch -> ready (generation answered)
    teardown_s: float | None = None
    transitions: list[tuple[Status, float]] = field(default_factory=list)  # (state, time.time())
    launch: LaunchSpec | None = None
    version: str | None = None
    leftovers: list[str] = field(default_factory=list)  # teardown problems
    # -- more detail
    engine: str | None = None
    workdir: Path | None = None
    pid: int | None = None
    exit_code: int | None = None  # negative: killed by that signal
    exited_at: float | None = None  # time.time() the exit was noticed
    ready_log_s: float | None = None  # launch -> the engine's own "ready" line (informative)
    interrupted: bool = False  # cancelled (Ctrl-C) before it finished
    notes: list[str] = field(default_factory=list)  # teardown facts worth knowing (not problems)
    killed: list[str] = field(default_factory=list)  # processes that needed SIGKILL at teardown, and why
    keeper_pid: int | None = None  # the keeper that started the engine (perflab.lifecycle.keeper)

    @property
    def ok(self) -> bool:
        """It served: it got ready and did not crash."""
        return self.ready_s is not None and self.state in (Status.READY, Status.TEARING_DOWN, Status.DONE)

    @property
    def reason(self) -> str | None:
        """One line saying why it did not serve (None when it did)."""
        if self.state is Status.UNSUPPORTED and self.reasons:
            return "; ".join(f"{u.what}: {u.why}" for u in self.reasons)
        if self.cause is not None and self.state in (Status.CRASHED, Status.TIMEOUT):
            text = self.cause.explanation
            if self.cause.line and self.cause.line not in text:
                text += f": {self.cause.line.strip()}"
            return text
        return None

    def to_json(self) -> dict[str, Any]:
        return redact.redact_obj({
            "state": self.state,
            "cause": self.cause.name if self.cause else None,
            "reason": self.reason,
            "log": str(self.log) if self.log else None,
            "ready_s": _round(self.ready_s),
            "teardown_s": _round(self.teardown_s),
            "engine": self.engine,
            "version": self.version,
            "crash": to_jsonable(self.cause),
            "reasons": to_jsonable(list(self.reasons)),
            "warnings": to_jsonable(list(self.warnings)),
            "leftovers": list(self.leftovers),
            "notes": list(self.notes),
            "killed": list(self.killed),
            "keeper_pid": self.keeper_pid,
            "exit_code": self.exit_code,
            "pid": self.pid,
            "ready_log_s": _round(self.ready_log_s),
            "interrupted": self.interrupted,
            "base_url": _connectable_url(self.launch) if self.launch else None,
            "workdir": str(self.workdir) if self.workdir else None,
            "launch": to_jsonable(self.launch),
            "transitions": [{"state": s, "time": t} for s, t in self.transitions],
        })


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 3)


def _connectable_url(spec: LaunchSpec) -> str:
    host = connect_host(spec.host)
    return f"http://[{host}]:{spec.port}" if ":" in host else f"http://{host}:{spec.port}"


def _memory_by_device(
    snapshot: HardwareSnapshot, kinds: tuple[str, ...], devices: tuple[int, ...] | None
) -> dict[tuple[str, int], tuple[int, int]]:
    # Only the devices this engine uses: replicas run side by side on disjoint devices, and
    # another replica's memory is not this one's leftover. Never the host CPU's RAM (kind
    # "cpu", perflab.hardware.cpu): every process on the machine uses it, so a change there
    # says nothing about this engine; its processes are checked one by one instead.
    return {
        (a.kind, a.index): (a.memory_used_mib, a.memory_total_mib)
        for a in snapshot.accelerators
        if a.kind in kinds and a.kind != CPU_KIND and (devices is None or a.index in devices)
    }


T = TypeVar("T")
Ts = TypeVarTuple("Ts")


async def in_thread(fn: Callable[[*Ts], T], *args: *Ts) -> T:
    """Run blocking plugin code (it may run ``engine --version``) off the event loop;
    Ctrl-C does not wait for it."""
    return await anyio.to_thread.run_sync(fn, *args, abandon_on_cancel=True)


@dataclass(frozen=True)
class SupervisionSettings:
    """How an :class:`EngineInstance` supervises its launch (its keyword options, kept as given)."""

    force: bool
    startup_timeout: float | None
    log_name: str
    grace: float
    check_memory: bool
    memory_settle_s: float
    on_started: Callable[[int], None] | None


class EngineInstance:
    """One supervised engine. Use as ``async with``; see the module docstring.

    ``__aenter__`` never raises for an unsupported configuration, a crash or a timeout: it
    sets :attr:`outcome` (and has already torn down). It raises only for usage errors
    (unknown engine) and plugin bugs, after cleaning up.

    :param pm: the plugin manager.
    :param engine: registered engine name.
    :param config: serving options; ``config.port=None`` picks a free port.
    :param hardware: the snapshot preflight checks against.
    :param env: the environment to launch with (from :func:`perflab.hardware.resolve`).
    :param workdir: the run directory (engine.log, launch.json, config files).
    :param force: launch even if preflight found errors.
    :param startup_timeout: seconds to become ready (default: the plugin's Readiness).
    :param version: engine version (default: asked through the plugin).
    :param grace: seconds between SIGTERM and SIGKILL at teardown.
    :param check_memory: compare accelerator memory with the pre-launch baseline.
    :param on_started: called with the leader's pid right after it started.
    :param scope: (study directory, run id) put in the engine's ``PERFLAB_INSTANCE`` marker,
        which ``perflab ps``/``perflab kill`` match (default: the workdir and the log's name).
    :param launch: a launch already built (one rank of a multi-node group,
        :class:`perflab.supervisor_group.EngineGroup`, which did the preflight): it is started
        as it is, without the plugin's preflight or ``build_launch``.
    :param serving: False for a rank that serves no HTTP (a multi-node group's rank >= 1): it
        is ``ready`` once started, never probed, and its launch's main port is not its own.
    :param abort: an event that ends the wait for readiness (another rank of the group died).
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
        force: bool = False,
        startup_timeout: float | None = None,
        version: str | None = None,
        log_name: str = "engine.log",
        grace: float = DEFAULT_GRACE_S,
        check_memory: bool = True,
        memory_settle_s: float = MEMORY_SETTLE_S,
        on_started: Callable[[int], None] | None = None,
        scope: tuple[str | Path, str] | None = None,
        launch: LaunchSpec | None = None,
        serving: bool = True,
        abort: anyio.Event | None = None,
    ) -> None:
        self.pm = pm
        self.engine = engine
        self.config = config
        self.hardware = hardware
        self.env = dict(env)
        redact.register_config(config)  # its secrets are written as *** from here on
        redact.register_env(self.env)
        self.workdir = Path(workdir)
        self.settings = SupervisionSettings(force, startup_timeout, log_name, grace, check_memory, memory_settle_s,
                                            on_started)
        # beside a non-default log name (replicas sharing a run directory), its own record
        self.launch_record = self.workdir / (
            "launch.json" if log_name == "engine.log" else f"{Path(log_name).stem}.launch.json")
        self.outcome = LaunchOutcome(engine=engine, version=version, workdir=self.workdir)
        self.launch: LaunchSpec | None = None
        self.base_url: str | None = None
        self.readiness: Readiness | None = None
        self.died = anyio.Event()
        # PERFLAB_INSTANCE: scoped to a study and a run (default: the run directory itself)
        study, run = scope if scope is not None else (self.workdir, Path(log_name).stem)
        self.marker = str(procs.Marker.new(study, run))
        self._proc: procs.KeptProcess | None = None
        self._tracker: procs.ProcessTracker | None = None
        self._pump: OutputPump | None = None
        self._exited = anyio.Event()
        self._stopping = False
        self._launched_mono: float | None = None
        self._baseline: HardwareSnapshot | None = None
        self._bg_scopes: list[tuple[anyio.CancelScope, anyio.Event]] = []
        self._tg: anyio.abc.TaskGroup | None = None
        self._teardown_started = False
        self._teardown_done = anyio.Event()
        self._kick = Kick()  # the ready line wakes the readiness probe
        self._unhealthy = False  # the health watch ended the run (the process was alive)
        self._given = launch
        self.serving = serving
        self._abort = abort

    # ================================================================ context manager

    async def __aenter__(self) -> EngineInstance:
        # The helper tasks (output pump, exit watcher, tree tracker) live in a task group
        # that spans the caller's body. Exceptions are kept out of it so that the caller
        # gets them unwrapped (a task group would turn them into an ExceptionGroup).
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        try:
            await self._start()
        except BaseException as exc:
            await self._close(exc)
            raise
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        return await self._close(exc)

    async def _close(self, exc: BaseException | None) -> bool | None:
        """Tear down (shielded), stop the helper tasks, leave the task group."""
        cancelled = exc is not None and isinstance(exc, anyio.get_cancelled_exc_class())
        if cancelled:
            self.outcome.interrupted = True
        with anyio.CancelScope(shield=True):
            await self.teardown()
        assert self._tg is not None
        self._tg.cancel_scope.cancel()
        if cancelled:
            assert exc is not None
            return await self._tg.__aexit__(type(exc), exc, exc.__traceback__)
        await self._tg.__aexit__(None, None, None)
        return None  # any exception of the body propagates as it is

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    # ================================================================ states

    def _transition(self, state: Status, **kw: Any) -> None:
        assert state in STATES, state
        self.outcome.state = state
        self.outcome.transitions.append((state, time.time()))
        log.info("engine.state", engine=self.engine, state=str(state), **kw)

    def _since_launch(self) -> float | None:
        return None if self._launched_mono is None else time.monotonic() - self._launched_mono

    # ================================================================ start

    async def _start(self) -> None:
        o = self.outcome
        self._transition(Status.PREFLIGHT, workdir=str(self.workdir))
        rec = self.pm.engine(self.engine)  # UnknownEngine: a usage error, raised
        if o.version is None:
            o.version = await in_thread(rec.engine.version, self.env)
        problems = [] if self._given is not None else await in_thread(
            rec.check_support, self.config, self.hardware, o.version)
        o.reasons = tuple(u for u in problems if u.severity != "warning")
        o.warnings = tuple(u for u in problems if u.severity == "warning")
        for w in o.warnings:
            log.warning("engine.preflight-warning", engine=self.engine, what=w.what, why=w.why)
        if o.reasons and not self.settings.force:
            self._transition(Status.UNSUPPORTED, reasons=[f"{u.what}: {u.why}" for u in o.reasons])
            return
        if o.reasons:
            log.warning("engine.forced", engine=self.engine, reasons=[f"{u.what}: {u.why}" for u in o.reasons])

        self.workdir.mkdir(parents=True, exist_ok=True)
        spec = await self._build_spec()
        if spec is None:
            return
        self.launch = o.launch = spec
        redact.register_launch(spec)
        self.base_url = _connectable_url(spec) if self.serving else None
        self.readiness = await in_thread(rec.readiness, spec) if self.serving else None
        self._write_files(spec)

        if self.settings.check_memory and self.hardware.accelerators:
            self._baseline = await in_thread(self._probe_hardware)

        self._transition(Status.LAUNCHING, argv=redact.redact_argv(spec.argv), port=spec.port)
        if not await self._spawn(spec):
            return
        if not self.serving:
            # a rank without HTTP: running is all there is to know (the serving rank's readiness
            # says the group joined); its exit is still watched
            if not self._exited.is_set():
                o.ready_s = self._since_launch()
                self._transition(Status.READY, pid=self._proc.pid if self._proc else None, serving=False)
            return
        self._transition(Status.WAITING_READY, pid=self._proc.pid if self._proc else None, base_url=self.base_url)
        assert self.readiness is not None
        if await self._wait_ready(self.readiness):
            o.ready_s = self._since_launch()
            self._transition(Status.READY, ready_s=_round(o.ready_s), base_url=self.base_url)
            self._background(self._watch_health)
            await self._check_served_version()
        else:
            await self.teardown()

    async def _check_served_version(self) -> None:
        """Cross-check the version detected before launch with the one the engine serves."""
        check = self.readiness.served_version_check if self.readiness else None
        if check is None or self.base_url is None:
            return
        try:
            with anyio.fail_after(10):
                warning = await check(self.base_url, self.outcome.version)
        except Exception as exc:  # a plugin's check must never fail a launch that serves
            warning = f"the served-version check failed: {type(exc).__name__}: {exc}"
        if warning:
            self.outcome.warnings = (*self.outcome.warnings, Unsupported("version", warning, severity="warning"))
            log.warning("engine.version-mismatch", engine=self.engine, warning=warning)

    async def _build_spec(self) -> LaunchSpec | None:
        """Choose the port(s), build the launch; None (with the outcome set) if it cannot start."""
        o = self.outcome
        if self._given is not None:
            taken = taken_ports(self._given.host, self._own_ports(self._given))
            if taken:
                self._port_in_use(taken)
                return None
            return self._given
        config = self.config
        if config.node_count > 1:  # never one node's launch for a multi-node config, silently
            o.reasons = (*o.reasons, Unsupported(f"nodes={config.nodes}", "a multi-node launch runs as an EngineGroup "
                                                 "(perflab.supervisor_group), one EngineInstance per node rank",
                                                 source="perflab"))
            self._transition(Status.UNSUPPORTED, reasons=[f"nodes={config.nodes}: needs an EngineGroup"])
            return None
        rec = self.pm.engine(self.engine)
        picked = config.port is None
        for _ in range(PORT_PICK_TRIES if picked else 1):
            if picked:
                config = self.config.replace(port=pick_free_port(self.config.host))
            elif not port_is_free(config.host, config.port):  # type: ignore[arg-type]
                self._port_in_use([config.port])  # type: ignore[list-item]
                return None
            try:
                spec: LaunchSpec = await in_thread(rec.build_launch, config, self.hardware, self.workdir, o.version)
            except UnsupportedOption as exc:
                o.reasons = (*o.reasons, Unsupported(exc.option, exc.why, source=rec.provider))
                self._transition(Status.UNSUPPORTED, reasons=[str(exc)])
                return None
            # a port another engine of this study was given counts as taken: it may be loading
            # and not have bound it yet (perflab run --parallel)
            taken = taken_ports(spec.host, spec.ports) + ports_held(spec.ports)
            if not taken:
                ports_hold(spec.ports)  # released when it is torn down
                return spec
            if not picked:
                self._port_in_use(taken)
                return None
        self._port_in_use(taken)
        return None

    def _own_ports(self, spec: LaunchSpec) -> tuple[int, ...]:
        """The ports this process binds: a rank that serves no HTTP has only the extra ones."""
        return spec.ports if self.serving else spec.extra_ports

    def _port_in_use(self, ports: list[int]) -> None:
        host = self.config.host
        owners = port_owners(ports)
        who = ", ".join(f"{p.port} by pid {p.pid} ({p.name})" for p in owners if p.pid) or "by another process"
        self.outcome.cause = CrashCause(
            "port-in-use",
            f"port(s) {', '.join(map(str, ports))} on {host} already in use ({who}); nothing was started",
            hint="choose another --port, or stop what holds it",
            source="perflab",
        )
        self._transition(Status.CRASHED, cause="port-in-use", ports=ports)

    def _write_files(self, spec: LaunchSpec) -> None:
        for f in spec.files:
            path = Path(f.path)
            path = path if path.is_absolute() else self.workdir / path
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(f.content, encoding="utf-8")
            path.chmod(f.mode if redact.scrub(f.content) == f.content else 0o600)  # holds a secret: owner only
        record = {
            "engine": spec.engine,
            "argv": redact.redact_argv(spec.argv),
            "env": redact.redact_env(self._env_additions(spec)),
            "files": [f.path for f in spec.files],
            "cwd": self._cwd(spec),
            "host": spec.host,
            "port": spec.port,
            "extra_ports": list(spec.extra_ports),
            "served_model_name": spec.served_model_name,
            "base_url": self.base_url,
            "version": self.outcome.version,
            "warnings": list(spec.warnings),
        }
        redact.write_text(self.launch_record, json.dumps(redact.redact_obj(record), indent=2) + "\n")

    def _env_additions(self, spec: LaunchSpec) -> dict[str, str]:
        # extra_env is merged too, so an option is never lost if a plugin forgets it; the
        # plugin's own env wins.
        return {**self.config.extra_env, **spec.env}

    def _cwd(self, spec: LaunchSpec) -> str:
        if spec.cwd is None:
            return str(self.workdir)
        cwd = Path(spec.cwd)
        return str(cwd if cwd.is_absolute() else self.workdir / cwd)

    def _probe_hardware(self) -> HardwareSnapshot:
        from perflab.hardware import probe

        return probe(self.pm, self.env)

    async def _spawn(self, spec: LaunchSpec) -> bool:
        o = self.outcome
        log_path = self.workdir / self.settings.log_name
        o.log = log_path
        env = {**self.env, **self._env_additions(spec), procs.MARKER_ENV: self.marker}
        try:
            # Through the keeper (perflab.lifecycle.keeper): if perflab dies, it stops the engine.
            # Not abandoned on cancellation: the handle (and its lifeline) must not be lost.
            proc, fd = await anyio.to_thread.run_sync(
                lambda: procs.spawn(spec.argv, env, self._cwd(spec), grace=self.settings.grace))
        except OSError as exc:
            log_path.write_text(f"[perflab] could not start {spec.argv[0]}: {exc}\n", encoding="utf-8")
            missing = isinstance(exc, FileNotFoundError)
            # a simulated machine puts on PATH only the engines its simulator serves
            unsimulated = missing and self.hardware.simulated
            o.cause = CrashCause(
                "engine-not-simulated" if unsimulated else "spawn-failed",
                f"the simulated machine has no {spec.argv[0]!r}: perflab's simulator does not simulate {spec.engine}"
                if unsimulated else f"could not start {spec.argv[0]!r}: {exc.strerror or exc}",
                hint="run this engine on real hardware (--hardware auto)" if unsimulated
                else "is the engine installed and on PATH?" if missing else "",
                source="perflab",
            )
            self._transition(Status.CRASHED, cause=o.cause.name)
            return False
        self._launched_mono = time.monotonic()
        self._proc = proc
        o.pid = proc.pid
        o.keeper_pid = proc.keeper_pid
        self._tracker = procs.ProcessTracker(proc, self.marker)
        registry.register(self)
        self._record_pids(proc)
        patterns = self.readiness.ready_log_patterns if self.readiness else ()
        self._pump = OutputPump(fd, log_path, patterns=patterns, on_pattern=self._on_ready_line)
        if self.settings.on_started is not None:
            self.settings.on_started(proc.pid)
        self._background(self._pump.run)
        self._background(self._watch_exit)
        self._background(self._track_descendants)
        return True

    def _record_pids(self, proc: procs.KeptProcess) -> None:
        """Add the engine's pid, its keeper and its marker to launch.json (``perflab ps``/``kill``)."""
        path = self.launch_record
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            record = {}
        record.update({"pid": proc.pid, "keeper_pid": proc.keeper_pid, "marker": self.marker,
                       "tmpdir": proc.tmpdir, "started": time.time()})
        path.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")

    def _background(self, fn: Callable[[], Any]) -> None:
        scope = anyio.CancelScope()
        done = anyio.Event()
        self._bg_scopes.append((scope, done))

        async def run() -> None:
            try:
                with scope:
                    await fn()
            except Exception as exc:  # never let a helper task cancel the caller's body
                log.exception("engine.internal-error", engine=self.engine, task=getattr(fn, "__name__", "?"))
                self.outcome.notes.append(f"internal error in {getattr(fn, '__name__', '?')}: {exc!r}")
            finally:
                done.set()

        assert self._tg is not None
        self._tg.start_soon(run)

    def _on_ready_line(self, pattern: str, line: str) -> None:
        if self.outcome.ready_log_s is None:
            self.outcome.ready_log_s = self._since_launch()
            log.info("engine.ready-line", engine=self.engine, after_s=_round(self.outcome.ready_log_s), line=line[:200])
        self._kick.set()  # probe now, not at the next poll

    # ================================================================ watching

    async def _watch_exit(self) -> None:
        assert self._proc is not None
        rc = await procs.wait_exit(self._proc)
        o = self.outcome
        o.exit_code = rc
        o.exited_at = time.time()
        if self._stopping:
            self._exited.set()
            return
        # No await from here to `died.set()`: whoever wakes on `died` sees the cause. Any exit
        # perflab did not ask for is a crash, code 0 included (vLLM 0.32's API server exits 0
        # after its engine-core watchdog fires).
        if self._pump is not None:
            self._pump.read_available()  # the engine's last words are already in the pipe
        cause = self._classify(rc)
        if self._unhealthy:
            # Already ended by the health watch; the exit may have printed the real cause.
            if o.cause is None or (o.cause.name == "engine-unhealthy" and cause.name not in ("unknown",)):
                o.cause = cause
            if self._pump is not None:
                self._pump.note(f"engine exited with code {rc} after its health check failed")
            self._exited.set()
            return
        o.cause = cause
        stopped_by = self._stop_requested()
        if stopped_by is not None:
            # `perflab kill` said so in the run directory before its signal: a deliberate stop,
            # not "exited with code 0 although perflab did not stop it" (the lab records the
            # run interrupted; the progress line and study.log say the same)
            if self._pump is not None:
                self._pump.note(f"engine exited with code {rc}: {stopped_by}")
            self._transition(Status.CRASHED, exit_code=rc, cause="stopped", explanation=stopped_by,
                             stopped_by=stopped_by)
            self.died.set()
            self._exited.set()
            return
        if self._pump is not None:
            self._pump.note(f"engine exited with code {rc}: {o.cause.name}: {o.cause.explanation}")
        self._transition(Status.CRASHED, exit_code=rc, cause=o.cause.name, explanation=o.cause.explanation, line=o.cause.line)
        self.died.set()
        self._exited.set()

    def _stop_requested(self) -> str | None:
        """Why the engine was stopped deliberately (:func:`perflab.lifecycle.procs.request_stop`
        writes into the run directory: the workdir, or its parent for a replica's), else None."""
        for d in (self.workdir, self.workdir.parent):
            why = procs.stop_requested(d)
            if why is not None:
                return why
        return None

    def _classify(self, rc: int | None) -> CrashCause:
        """The plugin's cause from the whole output's notable lines and the tail."""
        text = self._pump.scan_text() if self._pump is not None else ""
        try:
            return self.pm.engine(self.engine).classify_crash(rc, text)
        except Exception as exc:  # a broken classifier must not hide the crash
            return CrashCause("unknown", f"the engine exited with code {rc} (crash classifier failed: {exc!r})")

    async def _watch_health(self) -> None:
        """After ready: the process may live on while the engine is dead (vLLM's API server
        answers 503 with its EngineCore gone). Repeat the HTTP probes; see HEALTH_*."""
        readiness, launch = self.readiness, self.launch
        if readiness is None or launch is None or not readiness.http:
            return
        host = connect_host(launch.host)
        fails = 0
        since: float | None = None
        only_timeouts = True
        # the key readiness sent: vLLM's --api-key guards /v1/models, and a 401 is no death
        headers = redact.auth_headers(launch.argv, {**self.env, **self._env_additions(launch)})
        async with httpx.AsyncClient(trust_env=False, headers=headers) as client:
            while not self._exited.is_set() and not self._stopping:
                state = ProbeState()
                if await http_probes_pass(client, host, launch, readiness, state):
                    fails, since, only_timeouts = 0, None, True
                else:
                    fails += 1
                    since = since if since is not None else time.monotonic()
                    only_timeouts = only_timeouts and "no answer within" in (state.last_error or "")
                    needed = HEALTH_TIMEOUT_FAIL_S if only_timeouts else HEALTH_FAIL_S
                    failing_s = time.monotonic() - since
                    if only_timeouts and failing_s >= HEALTH_FAIL_S and self._death_in_log():
                        # probes time out (the API server is swamped by open streams: the real
                        # vLLM with 1000+ streams when its EngineCore died) and the engine has
                        # already said why: no need to wait for minutes of silence
                        needed = HEALTH_FAIL_S
                    if fails >= HEALTH_FAILS and failing_s >= needed:
                        if self._exited.is_set() or self._stopping:
                            return
                        self._declare_unhealthy(state.last_error or "probe failed", failing_s)
                        return
                with anyio.move_on_after(HEALTH_INTERVAL_S):
                    await self._exited.wait()

    def _death_in_log(self) -> bool:
        """The engine's output already names a cause (a root line the plugin or the core knows)."""
        if self._pump is None:
            return False
        self._pump.read_available()
        return self._classify(None).name != "unknown"

    def _declare_unhealthy(self, last_error: str, failing_s: float) -> None:
        o = self.outcome
        if self._pump is not None:
            self._pump.read_available()
        found = self._classify(None)
        if found.name == "unknown":
            found = CrashCause(
                "engine-unhealthy",
                f"the engine process is alive but its health check has failed for {failing_s:.1f} s "
                f"after it was ready (last: {last_error})",
                line=found.line,
                hint="see the engine log; vLLM answers /health with 503 once its engine core died",
                source="perflab",
            )
        o.cause = found
        o.notes.append(f"health check failing for {failing_s:.1f} s while the process lived: {last_error}")
        self._unhealthy = True
        if self._pump is not None:
            self._pump.note(f"health check failing for {failing_s:.1f} s ({last_error}): {found.name}: {found.explanation}")
        self._transition(Status.CRASHED, cause=found.name, explanation=found.explanation, line=found.line, health=last_error)
        self.died.set()

    async def _track_descendants(self) -> None:
        # Snapshot the tree while the parent lives: a worker re-parented after a crash
        # is no longer a descendant, but it stays in `known`.
        assert self._tracker is not None
        while not self._exited.is_set():
            await anyio.to_thread.run_sync(self._tracker.scan_tree)
            with anyio.move_on_after(TRACK_INTERVAL_S):
                await self._exited.wait()

    async def _wait_ready(self, readiness: Readiness) -> bool:
        assert self.launch is not None
        timeout = self.settings.startup_timeout if self.settings.startup_timeout is not None else readiness.startup_timeout_s
        state = ProbeState()
        ready = False
        refused: ProbeRefused | None = None
        headers = redact.auth_headers(self.launch.argv, {**self.env, **self._env_additions(self.launch)})
        async with httpx.AsyncClient(trust_env=False, headers=headers) as client:
            with anyio.move_on_after(timeout):
                async with anyio.create_task_group() as tg:

                    async def probe() -> None:
                        nonlocal ready, refused
                        assert self.launch is not None
                        try:
                            await poll_until_ready(
                                client, connect_host(self.launch.host), self.launch, readiness, state, kick=self._kick
                            )
                            ready = True
                        except ProbeRefused as exc:
                            refused = exc
                        tg.cancel_scope.cancel()

                    async def exited() -> None:
                        await self._exited.wait()
                        tg.cancel_scope.cancel()

                    async def aborted() -> None:
                        assert self._abort is not None
                        await self._abort.wait()
                        tg.cancel_scope.cancel()

                    tg.start_soon(probe)
                    tg.start_soon(exited)
                    if self._abort is not None:
                        tg.start_soon(aborted)
        if self._exited.is_set():
            return False  # _watch_exit set "crashed" and the cause
        if self._abort is not None and self._abort.is_set() and not ready:
            return False  # the group's cause is another rank's
        if ready:
            return True
        if refused is not None:
            self.outcome.cause = self._probe_refused_cause(refused)
            if self._pump is not None:
                self._pump.note(f"generation probe failed: {refused.error}")
            self._transition(Status.TIMEOUT, cause=self.outcome.cause.name, last_error=refused.error)
            return False
        self.outcome.cause = self._timeout_cause(timeout, state)
        if self._pump is not None:
            self._pump.note(f"not ready within {timeout:g} s: {self.outcome.cause.explanation}")
        self._transition(Status.TIMEOUT, after_s=timeout, cause=self.outcome.cause.name, last_error=state.last_error)
        return False

    def _probe_refused_cause(self, refused: ProbeRefused) -> CrashCause:
        auth = refused.status in (401, 403)
        what = "the one-token generation" if refused.generation else "a readiness probe"
        return CrashCause(
            "generation-probe-failed" if refused.generation else "probe-refused",
            f"the engine answers but refused {what} "
            + ("(authentication required; not retried)" if auth else f"{refused.attempts} times in a row")
            + f": {refused.error}",
            line=self._root_line(last_resort=False),  # the answer is quoted in the explanation
            hint="the engine wants an API key (vLLM's --api-key guards /v1/*): run it without one"
            if auth
            else "see the engine log; the served model name or the generation path may not match",
            source="perflab",
        )

    def _root_line(self, *, last_resort: bool = True) -> str | None:
        """The most specific line the output offers: a named cause's line, else (with
        ``last_resort``) the last line of the tail that is not an INFO/DEBUG line."""
        if self._pump is None:
            return None
        found = self._classify(None)
        if found.line:
            return found.line
        if last_resort:
            return next((ln for ln in reversed(self._pump.tail) if is_notable(ln)), None)
        return None

    def _timeout_cause(self, timeout: float, state: ProbeState) -> CrashCause:
        last_line = self._root_line()
        if state.http_ok and self.readiness is not None and self.readiness.generation_path:
            return CrashCause(
                "generation-probe-failed",
                f"health checks passed but no one-token generation succeeded within {timeout:g} s "
                f"(last: {state.last_error})",
                line=last_line,
                hint="the engine answers its health path while unable to generate (dead scheduler?)",
                source="perflab",
            )
        return CrashCause(
            "startup-timeout",
            f"not serving within {timeout:g} s (last probe: {state.last_error or 'none completed'})",
            line=last_line,
            hint="raise --startup-timeout if the model is large, else see the engine log",
            source="perflab",
        )

    # ================================================================ teardown

    def expect_exit(self) -> None:
        """perflab is about to stop this engine (its group is being torn down, and a rank may
        exit before it is signalled, its peer gone): from now on its exit is no crash."""
        self._stopping = True

    async def teardown(self) -> None:
        """Stop the engine and everything it spawned; check ports and memory. Idempotent;
        safe to call from the body, from ``__aexit__`` and concurrently."""
        if self._teardown_started:
            await self._teardown_done.wait()
            return
        self._teardown_started = True
        try:
            with anyio.CancelScope(shield=True):
                await self._teardown()
        finally:
            self._teardown_done.set()

    async def _teardown(self) -> None:
        try:
            await self._stop_and_check()
        finally:
            if self.launch is not None:
                ports_unhold(self.launch.ports)

    async def _stop_and_check(self) -> None:
        o = self.outcome
        prior = o.state
        if self._proc is None or self._tracker is None:
            # Nothing started (unsupported, port in use, spawn failed, or cancelled in preflight).
            if not prior.terminal:
                self._transition(Status.DONE, started=False)
            if self.launch is not None:
                await self._teardown_hooks(self.launch)
            return
        t0 = time.monotonic()
        self._stopping = True
        self._transition(Status.TEARING_DOWN, pid=self._proc.pid, grace_s=self.settings.grace)
        stopped = await procs.terminate(self._tracker, self.settings.grace)
        o.leftovers.extend(stopped.leftovers)
        if stopped.killed:
            o.killed.extend(stopped.killed)
            o.notes.append(f"SIGKILL was needed for {len(stopped.killed)} process(es): " + "; ".join(stopped.killed))
            log.warning("engine.sigkilled", engine=self.engine, killed=stopped.killed)
        if self._proc.poll() is not None and o.exit_code is None:
            o.exit_code = self._proc.returncode
        await self._stop_background()
        self._proc.close()  # the lifeline: the keeper finds no tree left and exits
        registry.unregister(self)
        assert self.launch is not None
        await self._check_ports(self.launch)
        if self._baseline is not None:
            await self._check_memory(self._baseline)
        await self._teardown_hooks(self.launch)
        o.teardown_s = time.monotonic() - t0
        if not prior.is_failure:
            self._transition(Status.DONE, teardown_s=_round(o.teardown_s), leftovers=o.leftovers)
        else:
            o.state = prior  # a failed run stays failed; its transitions show the teardown
            log.info("engine.torn-down", engine=self.engine, state=prior, teardown_s=_round(o.teardown_s), leftovers=o.leftovers)
        for msg in o.leftovers:
            log.warning("engine.leftover", engine=self.engine, problem=msg)

    async def _stop_background(self) -> None:
        # Give the pump a moment to read the last lines (workers may still hold the pipe
        # until they are dead, which they are now), then stop every helper task.
        if self._pump is not None:
            with anyio.move_on_after(0.5):
                while not self._pump.eof:
                    self._pump.read_available()
                    if self._pump.eof:
                        break
                    await anyio.sleep(0.02)
        for scope, _ in self._bg_scopes:
            scope.cancel()
        with anyio.move_on_after(2.0):  # the pump must leave wait_readable() before its fd closes
            for _, done in self._bg_scopes:
                await done.wait()
        self._exited.set()
        if self._pump is not None:
            self._pump.close()

    async def _check_ports(self, spec: LaunchSpec) -> None:
        lost = self.outcome.cause is not None and self.outcome.cause.name == ADDRESS_IN_USE
        if lost:
            # the engine never bound its port: whoever holds it took it first — the crash's
            # cause (the lab's environment fault), not something this launch left behind
            taken = taken_ports(spec.host, self._own_ports(spec))
        else:
            taken = await wait_ports_free(spec.host, self._own_ports(spec), PORT_RELEASE_WAIT_S)
        if not taken:
            return
        assert self._tracker is not None
        ours = {pid for pid in self._tracker.known}
        for owner in port_owners(taken):
            if lost and not (owner.pid is not None and (owner.pid in ours or self._has_marker(owner.pid))):
                continue
            if owner.pid is not None and (owner.pid in ours or self._has_marker(owner.pid)):
                try:
                    psutil.Process(owner.pid).kill()
                    action = "killed it"
                except psutil.Error as exc:
                    action = f"could not kill it: {exc}"
                self.outcome.leftovers.append(
                    f"port {owner.port} was still bound by pid {owner.pid} ({owner.name}) started by this launch; {action}"
                )
            elif owner.pid is not None:
                self.outcome.leftovers.append(
                    f"port {owner.port} is still bound by pid {owner.pid} ({owner.name}), not started by this launch"
                )
        still = await wait_ports_free(spec.host, taken, 1.0)
        known = {o.port for o in port_owners(still)}
        for port in still:
            if port not in known and not lost:
                self.outcome.leftovers.append(f"port {port} on {spec.host} is still bound (owner not visible)")

    def _has_marker(self, pid: int) -> bool:
        try:
            return psutil.Process(pid).environ().get(procs.MARKER_ENV) == self.marker
        except (psutil.Error, OSError):
            return False

    async def _check_memory(self, baseline: HardwareSnapshot) -> None:
        kinds = self.pm.engine(self.engine).info.accelerators
        before = _memory_by_device(baseline, kinds, self.config.devices)
        deadline = time.monotonic() + self.settings.memory_settle_s
        while True:
            after_snap = await anyio.to_thread.run_sync(self._probe_hardware)
            after = _memory_by_device(after_snap, kinds, self.config.devices)
            problems = []
            for key, (used_before, total) in sorted(before.items()):
                if key not in after:
                    continue
                used_after = after[key][0]
                tolerance = max(MEMORY_TOLERANCE * total, 64)
                if used_after - used_before > tolerance:
                    problems.append(
                        f"{key[0]}:{key[1]} uses {used_after} MiB after teardown, {used_before} MiB before launch "
                        f"(tolerance {tolerance:.0f} MiB)"
                    )
            if not problems or time.monotonic() >= deadline:
                break
            await anyio.sleep(0.25)
        for p in problems:
            self.outcome.leftovers.append(f"accelerator memory not released: {p}")

    async def _teardown_hooks(self, spec: LaunchSpec) -> None:
        # In a worker thread: a slow hook (each waits at most its deadline) must not stall the
        # event loop, where the other launches of a parallel study are being supervised.
        await anyio.to_thread.run_sync(self._call_teardown_hooks, spec)

    def _call_teardown_hooks(self, spec: LaunchSpec) -> None:
        rec = self.pm.engines.get(self.engine)
        if rec is None:
            return
        try:
            rec.engine.teardown(spec, self.workdir)
        except HookDeadlineExceeded as exc:  # what it should have cleaned may still be there
            self.outcome.leftovers.append(str(exc))
        except Exception as exc:
            self.outcome.leftovers.append(f"teardown hook of plugin {rec.plugin} failed: {type(exc).__name__}: {exc}")

    def kill_now(self) -> None:
        """SIGKILL everything this launch started, synchronously (atexit, third Ctrl-C)."""
        if self._tracker is not None:
            try:
                self._tracker.scan_tree()
            except (psutil.Error, OSError):  # best effort at exit: kill what is already known
                pass
            self._tracker.kill_now()
        if self._proc is not None:
            self._proc.close_lifeline()
