"""The simulated engine's process lifecycle: startup (faults that strike at start, the memory
checks, workers holding device memory, loading, binding), the ready lines, and the exit
(SIGTERM/SIGINT within ``EXIT_DEADLINE_S``, failures by exit status or by signal).

:class:`EngineLifecycle` is the part of :class:`perflab_sim.runtime.Engine` that does this; the
engine adds the schedulers it serves from once ready (:meth:`EngineLifecycle.start_serving`).
The lines printed on a failure are the front end's (:class:`perflab_sim.config.EngineBehaviour`),
else vLLM's defaults below.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from perflab.bench.serverclock import LIFECYCLE_FILE_ENV, LIFECYCLE_HEADER, TIME_SCALE_HEADER, format_lifecycle
from perflab_sim import group, perfmodel, state, worker
from perflab_sim.config import EngineBehaviour, SimEngineConfig
from perflab_sim.faults import EXIT_DEADLINE_S, Faults
from perflab_sim.server import HttpServer

if TYPE_CHECKING:
    from perflab_sim.perfmodel import Deployment
    from perflab_sim.routing import HttpApi

# vLLM's lines for the failures, used where the front end sets none
CRASH_AT_START_LINES = (
    "Traceback (most recent call last):",
    '  File "perflab/sim/runtime.py", line 1, in <module>',
    "RuntimeError: Engine core initialization failed. See root cause above. (simulated crash-at-start)",
)
CRASH_LINES = (
    "ERROR [core.py] EngineCore encountered a fatal error.",
    "Traceback (most recent call last):",
    '  File "perflab/sim/runtime.py", line 1, in run_busy_loop',
    "RuntimeError: CUDA error: an illegal memory access was encountered (simulated crash-after)",
)
OOM_LINES = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {need_gib:.2f} GiB. "
    "GPU 0 has a total capacity of {total_gib:.2f} GiB of which {budget_gib:.2f} GiB may be used.",
)
INSUFFICIENT_MEMORY_LINES = (
    "ValueError: Free memory on device ({free_gib:.2f}/{total_gib:.2f} GiB) on startup is less than "
    "desired GPU memory utilization ({fraction}, {requested_gib:.2f} GiB). Decrease GPU memory "
    "utilization or reduce GPU memory used by other processes.",
)
# uvicorn's wording (uvicorn/server.py startup)
BIND_ERROR_LINES = ("ERROR:    [Errno {errno}] error while attempting to bind on address ('{host}', {port}): {reason}",)


def say(lines: Sequence[str], stream: Any = None) -> None:
    out = sys.stdout if stream is None else stream
    for line in lines:
        print(line, file=out, flush=True)


def fill(lines: Sequence[str], **values: Any) -> list[str]:
    """Fill ``{name}`` fields; a line that is not a template (braces of its own) stays as is."""
    out = []
    for line in lines:
        try:
            out.append(str(line).format(**values))
        except (KeyError, IndexError, ValueError, AttributeError):
            out.append(str(line))
    return out


def die_by_signal(sig: int) -> None:
    """End this process by ``sig`` (its default action), without leaving a core file."""
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    except (ImportError, ValueError, OSError):
        pass
    if sig not in (signal.SIGKILL, signal.SIGSTOP):  # those two cannot be caught anyway
        signal.signal(sig, signal.SIG_DFL)
    os.kill(os.getpid(), sig)
    time.sleep(1.0)  # delivery is asynchronous for a few signals; never fall through at once


class EngineLifecycle:
    """Startup, readiness and exit of one simulated engine process."""

    cfg: SimEngineConfig
    behaviour: EngineBehaviour
    deployment: Deployment
    faults: Faults
    scale: float
    env: Mapping[str, str]
    api: HttpApi

    def __init__(self) -> None:
        self.state_dir = state.state_dir(self.env)
        self.ready = False
        self.crashing = False
        self.exit_code = 0
        self.workers: list[subprocess.Popen[bytes]] = []
        self.servers: list[HttpServer] = []
        self.tasks: list[asyncio.Task[None]] = []
        self.stop: asyncio.Event | None = None
        self.stopping = threading.Event()  # set by the signal handler: the exit deadline runs
        self.die_signal: int | None = None  # the engine fails by this signal, not an exit status
        self.rendezvous: group.Rendezvous | None = None  # rank 0 of a multi-node group

    def start_serving(self) -> list[asyncio.Task[None]]:
        """Once ready: the tasks that serve (the engine's schedulers)."""
        raise NotImplementedError

    async def main(self) -> int:
        loop = asyncio.get_running_loop()
        self.stop = asyncio.Event()
        if self.faults.ignore_sigterm:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        else:
            stop = self.stop

            def on_signal(signum: int, frame: object) -> None:
                # A Python-level handler runs in the main thread even when it is stuck in
                # synchronous code or a blocked write, where a loop callback would not.
                if not self.stopping.is_set():
                    self.stopping.set()
                    threading.Thread(target=self._exit_deadline, name="exit-deadline", daemon=True).start()
                with contextlib.suppress(RuntimeError):  # the loop may be closed already
                    loop.call_soon_threadsafe(stop.set)

            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, on_signal)
        try:
            return await self._run()
        finally:
            await self._cleanup()

    def _exit_deadline(self) -> None:
        """Watchdog thread: end the process EXIT_DEADLINE_S after the stop signal if the
        orderly shutdown has not. Prints nothing (stdout may be the reason it is stuck)."""
        time.sleep(EXIT_DEADLINE_S)
        if not self.faults.orphan_workers:
            for w in self.workers:
                with contextlib.suppress(OSError):
                    w.kill()
            for w in self.workers:
                with contextlib.suppress(subprocess.TimeoutExpired, OSError):
                    w.wait(timeout=0.2)
                if self.state_dir is not None:
                    state.unregister(self.state_dir, w.pid)
        if self.state_dir is not None and self.cfg.workers <= 0:
            state.unregister(self.state_dir)
        os._exit(self.exit_code)

    async def _pause(self, seconds: float) -> bool:
        """Sleep ``seconds`` real seconds; True if a stop signal came meanwhile."""
        assert self.stop is not None
        if seconds <= 0:
            return self.stop.is_set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stop.wait(), seconds)
        return self.stop.is_set()

    async def _run(self) -> int:
        cfg, behaviour = self.cfg, self.behaviour
        mem = self.deployment.memory
        if self.faults.crash_at_start:
            say(behaviour.crash_at_start_lines or CRASH_AT_START_LINES, sys.stderr)
            return self._failed(1)
        if not mem.fits:
            say(fill(behaviour.oom_lines or OOM_LINES, need_gib=mem.weights_gib + mem.reserve_gib,
                     total_gib=mem.total_gib, budget_gib=mem.budget_gib), sys.stderr)
            return self._failed(1)
        short = self._short_device()
        if short is not None:
            device, free_gib = short
            say(fill(behaviour.insufficient_memory_lines or INSUFFICIENT_MEMORY_LINES, free_gib=free_gib,
                     total_gib=mem.total_gib, fraction=cfg.mem_fraction, requested_gib=mem.budget_gib, device=device),
                sys.stderr)
            return self._failed(1)
        await self._hold_memory()
        if cfg.fail_lines:
            if await self._pause(cfg.fail_after_s):
                return 0
            say(cfg.fail_lines, sys.stderr)
            return self._failed(cfg.fail_exit_code)
        if cfg.nnodes > 1 and cfg.node_rank > 0:
            return await self._run_joined()
        if behaviour.bind_before_load and not await self._bind():
            return self._failed(1, behaviour.bind_error_signal)
        if await self._pause(cfg.load_time_s + self.faults.slow_start_s):
            return 0
        if cfg.nnodes > 1:
            code = await self._host_rendezvous()
            if code is not None:
                return code
        if not behaviour.bind_before_load:
            if self.faults.ready_then_bind_fail:
                say(cfg.ready_lines)
            if not await self._bind():
                return self._failed(1, behaviour.bind_error_signal)
        self.ready = True
        say(cfg.ready_lines)
        self.tasks = self.start_serving()
        if self.rendezvous is not None:
            self.tasks += [asyncio.create_task(self.rendezvous.report(lambda: int(getattr(self, "completed", 0)))),
                           asyncio.create_task(self._watch_peers())]
        assert self.stop is not None
        await self.stop.wait()
        if not self.crashing:
            say(cfg.shutdown_lines)
        return self.exit_code

    # ------------------------------------------------------------ multi-node (perflab_sim.group)

    async def _host_rendezvous(self) -> int | None:
        """Rank 0: open the rendezvous and wait for every other rank; an exit status if that fails."""
        cfg, b = self.cfg, self.behaviour
        assert cfg.rendezvous is not None and self.stop is not None
        host, port = cfg.rendezvous
        rdv = group.Rendezvous(host, port, cfg.nnodes - 1)
        try:
            await rdv.open()
        except OSError as exc:
            reason = (os.strerror(exc.errno) if exc.errno else str(exc)).lower()
            say(fill(b.bind_error_lines or BIND_ERROR_LINES, errno=exc.errno, host=host, port=port, reason=reason),
                sys.stderr)
            return self._failed(1)
        self.rendezvous = rdv
        joined = asyncio.create_task(rdv.wait_joined(cfg.rendezvous_timeout_s))
        stopped = asyncio.create_task(self.stop.wait())
        await asyncio.wait({joined, stopped}, return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        if self.stop.is_set():
            joined.cancel()
            return 0
        if not joined.result():
            say(fill(b.rendezvous_timeout_lines or group.RENDEZVOUS_TIMEOUT_LINES, host=host, port=port,
                     timeout_s=cfg.rendezvous_timeout_s, joined=len(rdv.peers) + 1, expected=cfg.nnodes), sys.stderr)
            return self._failed(1)
        return None

    async def _watch_peers(self) -> None:
        """Rank 0 serving: a joined rank's connection ending is its death, and the group's."""
        assert self.rendezvous is not None and self.rendezvous.lost is not None
        rank = await self.rendezvous.lost
        # the loss surfaces at the next collective, not at once (a real rank may hang there for
        # NCCL's watchdog timeout): by then the group's supervisor has seen the dead rank itself
        if await self._pause(group.PEER_LOST_DELAY_S):
            return
        host, port = self.cfg.rendezvous or (self.cfg.host, 0)
        say(fill(self.behaviour.peer_lost_lines or group.PEER_LOST_LINES, host=host, port=port, rank=rank), sys.stderr)
        self.crashing = True
        self._failed(1)
        assert self.stop is not None
        self.stop.set()

    async def _run_joined(self) -> int:
        """A rank >= 1: "load", join rank 0, then follow rank 0 until stopped or it is gone.
        It serves no HTTP; ``crash-after:N`` counts rank 0's finished requests."""
        cfg, b = self.cfg, self.behaviour
        assert cfg.rendezvous is not None and self.stop is not None
        host, port = cfg.rendezvous
        # it loads, then joins: a slow rank (slow-start:S) keeps rank 0 waiting at the rendezvous
        if await self._pause(cfg.load_time_s + self.faults.slow_start_s):
            return 0
        conn = await group.join(host, port, cfg.node_rank, cfg.rendezvous_timeout_s, self.stop)
        if conn is None:
            if self.stop.is_set():
                return 0
            say(fill(b.join_timeout_lines or group.JOIN_TIMEOUT_LINES, host=host, port=port,
                     timeout_ms=int(cfg.rendezvous_timeout_s * 1000)), sys.stderr)
            return self._failed(1)
        reader, writer = conn
        self.ready = True

        def on_completed(n: int) -> None:
            crash_after = self.faults.crash_after
            if crash_after is not None and n >= crash_after and not self.crashing:
                self.crash()

        following = asyncio.create_task(group.follow(reader, on_completed))
        stopped = asyncio.create_task(self.stop.wait())
        await asyncio.wait({following, stopped}, return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        following.cancel()
        if self.stop.is_set():
            # stopped, or crashed (crash-after): the connection ends with the process, as a
            # real rank's sockets do
            return self.exit_code
        writer.close()
        if await self._pause(group.PEER_LOST_DELAY_S):
            return 0
        say(fill(b.peer_lost_lines or group.PEER_LOST_LINES, host=host, port=port, rank=0), sys.stderr)
        return self._failed(1)

    def _failed(self, code: int, die_signal: int | str | None = "fail") -> int:
        """Exit status ``code`` — or, where the engine dies by a signal when it fails
        (``behaviour.fail_signal``: MindIE's killpg(SIGKILL)/abort(), SGLang's
        kill_process_tree), that signal: the workers are killed, then this process gets it."""
        sig = self.behaviour.fail_signal if die_signal == "fail" else die_signal
        if sig:
            self.die_signal = int(sig)
        self.exit_code = code
        self._failed_start()
        return code

    def _failed_start(self) -> None:
        """A start that fails costs, on the model clock, what a start costs: real engines' start
        failures mostly surface once loading or profiling is done (out of memory while loading,
        a KV cache too small for max_model_len after profiling, a kernel at warm-up). Written
        where the lab asks (LIFECYCLE_FILE_ENV; rank 0 only), since no response carries it."""
        path = self.env.get(LIFECYCLE_FILE_ENV)
        if self.ready or not path or self.cfg.node_rank > 0:
            return
        with contextlib.suppress(OSError):
            Path(path).write_text(format_lifecycle(perfmodel.startup_s(self.deployment.memory), perfmodel.TEARDOWN_S),
                                  encoding="utf-8")

    def _short_device(self) -> tuple[int, float] | None:
        """A device whose free memory is below the budget (another engine holds memory)."""
        chip = self.deployment.machine.chip
        held = state.used_mib(self.state_dir, self.deployment.devices)
        for d in self.deployment.devices:
            free = chip.memory_mib - chip.baseline_used_mib - held[d]
            if free < self.deployment.memory.used_mib:
                return d, free / 1024
        return None

    async def _hold_memory(self) -> None:
        devices = list(self.deployment.devices)
        mib = self.deployment.memory.used_mib
        n = self.cfg.workers
        if n <= 0:
            if self.state_dir is not None:
                state.register(self.state_dir, self.cfg.engine, self._own_name(), devices, [mib] * len(devices))
            return
        for k in range(n):
            mine = devices[k::n]
            title = self.cfg.worker_title.format(rank=k, tp_rank=k % self.cfg.tp, dp_rank=k // self.cfg.tp)
            self.workers.append(
                worker.spawn(title, self.cfg.engine, mine, [mib] * len(mine), self.state_dir,
                             self.faults.ignore_sigterm, self.env)
            )
        if self.state_dir is not None:  # ready means memory is held: wait for the workers' entries
            deadline = time.monotonic() + 10.0
            pending = {w.pid for w in self.workers}
            while pending and time.monotonic() < deadline and not (self.stop and self.stop.is_set()):
                pending = {pid for pid in pending if not (self.state_dir / f"{pid}.json").exists()}
                if any(w.poll() is not None for w in self.workers):
                    break
                if pending:
                    await asyncio.sleep(0.01)

    def _own_name(self) -> str:
        """How process tables (npu-smi's) name this process."""
        if self.behaviour.process_name:
            return self.behaviour.process_name
        name = Path(sys.argv[0]).name if sys.argv and sys.argv[0] not in ("", "-c", "-m") else ""
        return name or "python"

    async def _bind(self) -> bool:
        cfg = self.cfg
        # the start-up and teardown the model says this deployment takes: the lab counts them in
        # engine-hours instead of the host's wall time x the scale
        lifecycle = format_lifecycle(perfmodel.startup_s(self.deployment.memory), perfmodel.TEARDOWN_S)
        common = {"server": "perflab-sim", TIME_SCALE_HEADER: f"{self.scale:g}", LIFECYCLE_HEADER: lifecycle}
        ports = [cfg.port, *cfg.extra_ports]
        # ports bound on an address of their own (MindIE's management and metrics ports
        # listen on managementIpAddress)
        hosts = self.behaviour.port_hosts
        host, port = cfg.host, cfg.port
        try:
            if self.faults.bind_fail or self.faults.ready_then_bind_fail:
                raise OSError(98, "address already in use")
            for port in ports:
                host = hosts.get(port, cfg.host)
                server = HttpServer(self.api.handler_for(port), common,
                                    self.api.log_access if self.behaviour.access_log else None)
                await server.start(host, port)
                self.servers.append(server)
        except OSError as exc:
            # asyncio wraps the bind error in its own message: keep the system's reason only
            reason = (os.strerror(exc.errno) if exc.errno else str(exc)).lower()
            say(fill(self.behaviour.bind_error_lines or BIND_ERROR_LINES, errno=exc.errno, host=host, port=port,
                     reason=reason), sys.stderr)
            return False
        return True

    async def _cleanup(self) -> None:
        for task in self.tasks:
            task.cancel()
        if self.rendezvous is not None:
            self.rendezvous.close()
        for server in self.servers:
            server.close()
        if self.die_signal is not None and not self.faults.orphan_workers:
            # the engine takes its process tree down with it (MindIE: killpg SIGKILL before
            # its own abort(); SGLang: kill_process_tree)
            for w in self.workers:
                with contextlib.suppress(OSError):
                    w.kill()
        if not self.faults.orphan_workers:
            await self._stop_workers()
        if self.state_dir is not None and self.cfg.workers <= 0:
            state.unregister(self.state_dir)

    async def _stop_workers(self) -> None:
        alive = [w for w in self.workers if w.poll() is None]
        for w in alive:
            with contextlib.suppress(ProcessLookupError):
                w.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 0.6
        while any(w.poll() is None for w in alive) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        for w in alive:
            if w.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    w.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    w.wait(timeout=1.0)

    def crash(self) -> None:
        say(self.behaviour.crash_lines or CRASH_LINES, sys.stderr)
        self.crashing = True
        self._failed(1)
        assert self.stop is not None
        self.stop.set()
