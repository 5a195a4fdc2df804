"""Processes: start an engine through a keeper, notice its exit at once, stop all it spawned.

**Start.** Every engine is started by a small keeper program (:mod:`perflab.lifecycle.keeper`,
``python -m perflab.lifecycle.keeper``): it double-forks away from perflab, makes itself a
child subreaper, starts the engine in a session of its own and holds a *lifeline* pipe from
perflab. When perflab dies in any way (``kill -9``, a closed SSH session) the pipe closes and
the keeper stops the engine's whole tree with the same policy as a normal teardown. The
keeper reports the engine's pid and, later, its exit status over a status pipe;
:class:`KeptProcess` is perflab's handle on it (a ``Popen``-like ``pid``/``poll()``).

**Find.** Engines do not stay in one neat process: vLLM's workers survive the death of their
parent, MindIE kills its own process group on failure, a worker may start a new session.
So teardown collects the union of

* the process group / session of the leader (its own session, started by the keeper),
* every descendant seen while the engine ran (snapshotted periodically),
* every process carrying this launch's environment marker (:data:`MARKER_ENV`), which
  descendants inherit even after re-parenting or ``setsid()``,

checking process identity (pid + start time, via psutil) so a recycled pid is never hit.

**Stop** (:func:`stop_tree`, the one policy used by the supervisor, the keeper and
``perflab kill``): SIGTERM the *leader only* and let it stop its own children (vLLM and
llama.cpp forward the signal to their workers; a second SIGTERM makes llama.cpp skip its
cleanup: "Received second interrupt, terminating immediately", tools/server/server.cpp);
after the leader exited, SIGTERM each straggler that has not had one yet and give it a short
grace (nobody else is left to stop it); SIGKILL what remains once its grace is over — the
processes that clean up after the others (:data:`CLEANUP_PROCESSES`) last, once they had a
moment to do it. Every process gets at most one SIGTERM, and every SIGKILL is reported.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import anyio
import psutil

#: Environment variable set in every engine's environment; see :class:`Marker`.
MARKER_ENV = "PERFLAB_INSTANCE"
MARKER_VERSION = "pl1"

#: A child still alive after its leader exited has nobody left to stop it: it gets this long
#: after its SIGTERM (or the whole grace, if that is shorter), not the full grace.
ORPHAN_GRACE_S = 1.0
#: After SIGKILL, how long to wait for the kernel to finish the processes: it frees a killed
#: process's memory before the process is gone, and a vLLM CPU worker's GiBs of KV cache on a
#: loaded host took longer than 3 s. Spent only while something is still exiting.
KILL_WAIT_S = 10.0
#: Processes that clean up after the others, matched in their command line: Python's
#: multiprocessing resource tracker (``from multiprocessing.resource_tracker import main``)
#: ignores SIGTERM and SIGINT, and once every process holding its pipe is gone it unlinks the
#: shared memory (``/dev/shm/psm_*``) and semaphores (``sem.mp-*``) they leaked; SIGKILLed
#: with them, it leaves those behind (vLLM's: 160 MiB segments). They get SIGKILL last, after
#: the others are gone and :data:`CLEANUP_WAIT_S` to finish on their own.
CLEANUP_PROCESSES = ("multiprocessing.resource_tracker import main",)
CLEANUP_WAIT_S = 5.0  # ends as soon as the cleaners are done (a loaded host is slower)
KEEPER_START_TIMEOUT_S = 30.0  # the keeper reports the engine's pid (or why it could not start it)
EXIT_REPORT_TIMEOUT_S = 2.0  # after the pidfd fired, how long the keeper may take to report the status
UNKNOWN_EXIT = 255  # exit status when the keeper died before it could report it


# ================================================================ the marker


@dataclass(frozen=True)
class Marker:
    """The value of :data:`MARKER_ENV`: whose engine this is, scoped to a study and a run.

    ``pl1:<token>:<owner pid>-<owner start ms>:<run>:<study dir>`` — the study directory is
    last (it may contain ``:``). ``perflab ps``/``perflab kill`` match the study directory and
    run exactly (never "any marker"), and call an engine an orphan only when the perflab
    process that started it (pid *and* start time) is gone.
    """

    token: str
    owner_pid: int
    owner_start_ms: int
    run: str
    study: str

    @classmethod
    def new(cls, study: str | Path, run: str) -> Marker:
        me = psutil.Process()
        return cls(secrets.token_hex(8), me.pid, int(me.create_time() * 1000), _clean(run),
                   str(Path(study).resolve()))

    def __str__(self) -> str:
        return f"{MARKER_VERSION}:{self.token}:{self.owner_pid}-{self.owner_start_ms}:{self.run}:{self.study}"

    @classmethod
    def parse(cls, value: str | None) -> Marker | None:
        if not value:
            return None
        parts = value.split(":", 4)
        if len(parts) != 5 or parts[0] != MARKER_VERSION:
            return None
        owner_pid, _, owner_start = parts[2].partition("-")
        try:
            return cls(parts[1], int(owner_pid), int(owner_start), parts[3], parts[4])
        except ValueError:
            return None

    def owner_alive(self) -> bool:
        """Whether the perflab process that started this engine still runs (same pid and start)."""
        try:
            p = psutil.Process(self.owner_pid)
            return abs(int(p.create_time() * 1000) - self.owner_start_ms) <= 10 and _alive(p)
        except psutil.Error:
            return False


def _clean(run: str) -> str:
    return "".join(c if c.isalnum() or c in "-_.+" else "_" for c in run) or "run"


# ================================================================ a deliberate stop

#: written by ``perflab kill`` into the run directory of each engine it is about to stop,
#: before any signal: the perflab that runs the study finds it when the engine dies and records
#: the run ``interrupted`` (a stop it was told about), never as the configuration's crash
STOP_REQUEST = "stop-requested.json"


def request_stop(marker: Marker, by: str = "perflab kill") -> Path | None:
    """Record in the engine's run directory (``<study>/runs/<run>``; a replica's run is
    ``<run>.replica-N``) that the stop about to come is deliberate; None when the marker names
    no lab run directory (a ``perflab launch``: nothing records that run)."""
    run_dir = Path(marker.study) / "runs" / marker.run.split(".", 1)[0]
    if not run_dir.is_dir():
        return None
    path = run_dir / STOP_REQUEST
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"by": by, "pid": os.getpid(), "time": time.time()}), encoding="utf-8")
    os.replace(tmp, path)  # whole or absent: the study reads it the moment its engine dies
    return path


def stop_requested(run_dir: Path) -> str | None:
    """Why the run's engine was stopped deliberately ("stopped by `perflab kill` (pid N)"), or
    None when nobody asked (:func:`request_stop`)."""
    try:
        data = json.loads((Path(run_dir) / STOP_REQUEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return f"stopped by `{data.get('by') or 'perflab kill'}` (pid {data.get('pid', '?')})"


# ================================================================ start through the keeper


class Leader(Protocol):
    """What the tracker needs of an engine's leader (``Popen`` and :class:`KeptProcess` fit)."""

    pid: int

    def poll(self) -> int | None: ...


class KeptProcess:
    """perflab's handle on an engine started by a keeper: ``pid`` is the engine's leader.

    ``poll()`` reads the keeper's reports (non-blocking, thread-safe); ``returncode`` follows
    ``Popen``'s convention (negative: killed by that signal). :meth:`close_lifeline` tells the
    keeper that perflab is done with the engine (closing it early makes the keeper stop it).
    """

    def __init__(self, keeper_pid: int, pid: int, status_fd: int, lifeline_fd: int, tmpdir: str | None = None) -> None:
        self.keeper_pid = keeper_pid
        self.pid = pid
        self.tmpdir = tmpdir  # the engine's own TMPDIR, removed by the keeper once the tree is gone
        self.returncode: int | None = None
        self.status_fd = status_fd
        self._lifeline_fd: int | None = lifeline_fd
        self._buf = b""
        self._eof = False
        self._lock = threading.Lock()

    def poll(self) -> int | None:
        with self._lock:
            self._read()
            if self.returncode is None and self._eof and not _pid_running(self.pid):
                self.returncode = UNKNOWN_EXIT  # the keeper died before it could report
            return self.returncode

    def _read(self) -> None:
        while not self._eof:
            try:
                chunk = os.read(self.status_fd, 65536)
            except BlockingIOError:
                break
            except OSError:
                self._eof = True
                break
            if not chunk:
                self._eof = True
                break
            self._buf += chunk
        while b"\n" in self._buf:
            line, _, self._buf = self._buf.partition(b"\n")
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if isinstance(msg, dict) and msg.get("pid") == self.pid and "exit" in msg:
                self.returncode = int(msg["exit"])

    @property
    def keeper_gone(self) -> bool:
        with self._lock:
            self._read()
            return self._eof

    def close_lifeline(self) -> None:
        with self._lock:
            if self._lifeline_fd is not None:
                os.close(self._lifeline_fd)
                self._lifeline_fd = None

    def close(self) -> None:
        self.close_lifeline()
        with self._lock:
            if self.status_fd >= 0:
                os.close(self.status_fd)
                self.status_fd = -1
                self._eof = True


def keeper_argv(status_fd: int, out_fd: int, grace: float) -> list[str]:
    return [sys.executable, "-m", "perflab.lifecycle.keeper", "--status-fd", str(status_fd),
            "--out-fd", str(out_fd), "--grace", f"{grace:g}"]


def spawn(argv: Sequence[str], env: Mapping[str, str], cwd: str | None, *, grace: float,
          keeper_env: Mapping[str, str] | None = None) -> tuple[KeptProcess, int]:
    """Start ``argv`` through a keeper, stdout+stderr on one pipe; return (handle, read fd).

    Raises ``OSError`` (e.g. ``FileNotFoundError``) when the engine cannot be started. The
    read end is non-blocking so the output pump can drain it from the event loop. The
    keeper's own environment is ``keeper_env`` (default: perflab's) without the marker, so
    a marker scan never finds the keeper.
    """
    out_r, out_w = os.pipe()  # non-inheritable by default (PEP 446); pass_fds makes them so
    status_r, status_w = os.pipe()
    life_r, life_w = os.pipe()
    kenv = {k: v for k, v in (keeper_env if keeper_env is not None else os.environ).items() if k != MARKER_ENV}
    spec = json.dumps({"argv": list(argv), "env": dict(env), "cwd": cwd}).encode() + b"\n"
    try:
        try:
            intermediate = subprocess.Popen(
                keeper_argv(status_w, out_w, grace),
                stdin=life_r,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env=kenv,
                start_new_session=True,  # neither the terminal's SIGINT nor a SIGHUP of perflab's session
                close_fds=True,
                pass_fds=(status_w, out_w),
            )
        finally:
            os.close(life_r)
            os.close(status_w)
            os.close(out_w)
        try:
            _write_all(life_w, spec)
        except BrokenPipeError:
            pass  # the keeper failed before reading it: its report (or its absence) says why
        intermediate.wait()  # it forks the keeper and exits at once: reaped, no zombie
        first = _read_first_report(status_r, KEEPER_START_TIMEOUT_S)
    except BaseException:
        for fd in (out_r, status_r, life_w):
            _close_quietly(fd)
        raise
    if first is None or "error" in first:
        for fd in (out_r, status_r, life_w):
            _close_quietly(fd)
        if first is None:
            raise OSError(f"the perflab keeper did not start {argv[0]!r} (exit status {intermediate.returncode})")
        raise OSError(int(first.get("errno") or 0), str(first.get("error")), str(first.get("filename") or argv[0]))
    os.set_blocking(status_r, False)
    os.set_blocking(out_r, False)
    tmpdir = first.get("tmpdir")
    proc = KeptProcess(int(first["keeper"]), int(first["pid"]), status_r, life_w,
                       tmpdir if isinstance(tmpdir, str) else None)
    return proc, out_r


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _read_first_report(fd: int, timeout: float) -> dict[str, Any] | None:
    import select

    buf = b""
    deadline = time.monotonic() + timeout
    while b"\n" not in buf:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            continue
        chunk = os.read(fd, 4096)
        if not chunk:
            return None
        buf += chunk
    try:
        msg = json.loads(buf.partition(b"\n")[0])
    except ValueError:
        return None
    return msg if isinstance(msg, dict) else None


def _close_quietly(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)  # type: ignore[attr-defined,unused-ignore]
    except (AttributeError, OSError):  # not Linux >= 5.3, or already gone
        return None


def _pid_running(pid: int) -> bool:
    try:
        return _alive(psutil.Process(pid))
    except psutil.Error:
        return False


async def wait_exit(proc: KeptProcess | subprocess.Popen[bytes], poll_interval: float = 0.02) -> int:
    """Return the exit code as soon as the engine's leader exits.

    On Linux a pidfd of the engine's pid becomes readable the instant it dies (it is the
    keeper's child, not ours, but a pidfd works for any process), so this costs nothing while
    it waits and notices the death at once; the status then comes from the keeper, which
    reaps it. Elsewhere it polls every 20 ms.
    """
    rc = proc.poll()
    if rc is not None:
        return rc
    fd = _pidfd(proc.pid)
    if fd is not None:
        try:
            await anyio.wait_readable(fd)
        finally:
            os.close(fd)
    if isinstance(proc, KeptProcess):
        deadline = time.monotonic() + EXIT_REPORT_TIMEOUT_S
        while (rc := proc.poll()) is None:
            if fd is not None and time.monotonic() > deadline:
                return UNKNOWN_EXIT
            if proc.status_fd >= 0 and not proc.keeper_gone:
                with anyio.move_on_after(poll_interval if fd is None else EXIT_REPORT_TIMEOUT_S):
                    await anyio.wait_readable(proc.status_fd)
            else:
                await anyio.sleep(poll_interval)
        return rc
    while (rc := proc.poll()) is None:
        await anyio.sleep(poll_interval)
    return rc


# ================================================================ find


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True


def _cleans_up(p: psutil.Process) -> bool:
    """Whether ``p`` is one of :data:`CLEANUP_PROCESSES`."""
    try:
        cmd = " ".join(p.cmdline())
    except psutil.Error:
        return False
    return any(tag in cmd for tag in CLEANUP_PROCESSES)


def describe(p: psutil.Process) -> str:
    try:
        cmd = " ".join(" ".join(p.cmdline()).split())[:120] or p.name()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        cmd = "?"
    return f"pid {p.pid} ({cmd})"


class PidLeader:
    """A leader known only by pid (``perflab kill``: the engine is not perflab's child)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        try:
            self._p: psutil.Process | None = psutil.Process(pid)
        except psutil.Error:
            self._p = None

    def poll(self) -> int | None:
        return None if self._p is not None and _alive(self._p) else UNKNOWN_EXIT


class ProcessTracker:
    """Everything one launch started, found by group, session, ancestry and env marker."""

    def __init__(self, leader: Leader, marker: str | None) -> None:
        self.leader = leader
        self.pgid = leader.pid  # its own session: pgid == sid == leader pid
        self.marker = marker
        self.known: dict[int, psutil.Process] = {}
        self._me = {os.getpid(), os.getppid()}
        try:
            self._add(psutil.Process(leader.pid))
        except psutil.NoSuchProcess:
            pass

    def _add(self, p: psutil.Process) -> None:
        if p.pid in self._me:
            return
        old = self.known.get(p.pid)
        if old is not None and _alive(old):
            return  # keep the identity we saw first; a recycled pid is a different process
        self.known[p.pid] = p

    def scan_tree(self) -> None:
        """Add the live descendants of every known live process (cheap; run periodically)."""
        for p in list(self.known.values()):
            if not _alive(p):
                continue
            try:
                for c in p.children(recursive=True):
                    self._add(c)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue

    def scan_all(self) -> None:
        """Descendants, plus every process in the leader's group/session or with the marker."""
        self.scan_tree()
        leader_gone = self.leader.poll() is not None
        for p in psutil.process_iter():
            if p.pid in self._me or p.pid in self.known:
                continue
            # Once the leader is gone, a live process with its pid is a stranger that got
            # the recycled number (the kernel keeps it reserved while it names a group/session).
            if leader_gone and p.pid == self.pgid:
                continue
            try:
                if os.getsid(p.pid) == self.pgid or os.getpgid(p.pid) == self.pgid:
                    self._add(p)
                    continue
            except OSError:
                continue
            if self.marker is not None:
                try:
                    if p.environ().get(MARKER_ENV) == self.marker:
                        self._add(p)
                except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
                    continue
        self.scan_tree()

    def alive(self) -> list[psutil.Process]:
        self.leader.poll()
        return [p for p in self.known.values() if _alive(p)]

    def leader_alive(self) -> bool:
        p = self.known.get(self.leader.pid)
        return p is not None and self.leader.poll() is None and _alive(p)

    def group_alive(self) -> bool:
        """Whether some process we know is still in the leader's process group.

        Guards killpg: once the group is empty its number may be reused by strangers.
        """
        for p in self.alive():
            try:
                if os.getpgid(p.pid) == self.pgid:
                    return True
            except OSError:
                continue
        return False

    def kill_now(self, spare: Sequence[psutil.Process] = ()) -> list[psutil.Process]:
        """SIGKILL everything known (group and each process) but ``spare``, synchronously;
        return whom. With processes to spare, the group is not signalled as a whole."""
        spared = {p.pid for p in spare}
        hit = [p for p in self.alive() if p.pid not in spared]
        if self.group_alive() and not spared:
            try:
                os.killpg(self.pgid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for p in hit:
            try:
                p.send_signal(signal.SIGKILL)  # psutil checks the pid still names the same process
            except (psutil.NoSuchProcess, psutil.AccessDenied, ProcessLookupError):
                pass
        return hit


# ================================================================ stop


@dataclass
class StopReport:
    """What :func:`stop_tree` did: whom it signalled, whom it had to SIGKILL, what survived."""

    sigterm: list[int] = field(default_factory=list)  # pids, in order; each at most once
    killed: list[str] = field(default_factory=list)  # "pid N (cmd): why" for each SIGKILL
    leftovers: list[str] = field(default_factory=list)  # still alive after SIGKILL
    leader_exited_s: float | None = None  # SIGTERM -> leader gone

    @property
    def clean(self) -> bool:
        return not self.killed and not self.leftovers


def _term(p: psutil.Process, report: StopReport) -> None:
    if p.pid in report.sigterm:
        return
    try:
        p.send_signal(signal.SIGTERM)
    except (psutil.NoSuchProcess, psutil.AccessDenied, ProcessLookupError):
        return
    report.sigterm.append(p.pid)


def _wait(cond: Callable[[], bool], timeout: float, sleep: Callable[[float], None], step: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() >= deadline:
            return False
        sleep(step)
    return True


def stop_tree(tracker: ProcessTracker, grace: float, *, orphan_grace: float = ORPHAN_GRACE_S,
              kill_wait: float = KILL_WAIT_S, sleep: Callable[[float], None] = time.sleep) -> StopReport:
    """Stop everything ``tracker`` finds, the way real servers stop (blocking; see the module doc).

    1. SIGTERM the leader alone; wait up to ``grace`` for it to exit (it stops its children).
    2. SIGTERM each survivor that has not had one; if the leader exited, they are orphans and
       get ``min(orphan_grace, grace)``; if the leader is still alive, the grace is spent.
    3. SIGKILL what is left (reported in :attr:`StopReport.killed`), re-scanning for anything
       spawned or re-parented meanwhile; the first time, :data:`CLEANUP_PROCESSES` are spared
       and get :data:`CLEANUP_WAIT_S` after the others are gone to finish on their own.
    """
    report = StopReport()
    tracker.scan_all()
    t0 = time.monotonic()
    if tracker.leader_alive():
        _term(tracker.known[tracker.leader.pid], report)
        if _wait(lambda: not tracker.leader_alive(), grace, sleep):
            report.leader_exited_s = time.monotonic() - t0
    tracker.scan_all()
    if tracker.leader_alive():
        leader_stuck = True
        orphan_deadline = time.monotonic()
    else:
        leader_stuck = False
        left = tracker.alive()
        for p in left:
            _term(p, report)
        wait = min(orphan_grace, grace)
        orphan_deadline = time.monotonic() + wait if left else time.monotonic()
    _wait(lambda: not tracker.alive(), max(0.0, orphan_deadline - time.monotonic()), sleep)
    for attempt in range(3):
        tracker.scan_all()
        alive = tracker.alive()
        if not alive:
            break
        names = {p.pid: describe(p) for p in alive}  # before SIGKILL: a dead process has no cmdline
        # the first time, the processes that clean up after the others are spared: once the
        # others are gone they finish on their own (CLEANUP_PROCESSES), else the next round
        # kills them — also when they are all that is left: on a busy host a tracker may still
        # be unlinking when the orphans' grace ends
        cleaners = [p for p in alive if _cleans_up(p)] if attempt == 0 else []
        for p in tracker.kill_now(spare=cleaners):
            if p.pid == tracker.leader.pid:
                why = f"did not exit within the {grace:g} s grace after SIGTERM"
            elif leader_stuck and p.pid not in report.sigterm:
                why = f"still running when its leader was SIGKILLed after the {grace:g} s grace"
            elif p.pid in report.sigterm:
                why = f"outlived its leader and did not exit within {min(orphan_grace, grace):g} s of SIGTERM"
            else:
                why = "appeared during teardown"
            report.killed.append(f"{names.get(p.pid) or describe(p)}: {why}")
        if cleaners:
            spared = {p.pid for p in cleaners}
            _wait(lambda: all(p.pid in spared for p in tracker.alive()), kill_wait, sleep)  # noqa: B023 - called now
            _wait(lambda: not tracker.alive(), CLEANUP_WAIT_S, sleep)
            continue
        _wait(lambda: not tracker.alive(), kill_wait, sleep)
    tracker.leader.poll()
    report.leftovers = [f"{describe(p)} still alive after SIGKILL" for p in tracker.alive()]
    return report


async def terminate(tracker: ProcessTracker, grace: float, *, orphan_grace: float = ORPHAN_GRACE_S,
                    kill_wait: float = KILL_WAIT_S) -> StopReport:
    """:func:`stop_tree` off the event loop (its waits are short sleeps in a worker thread)."""
    return await anyio.to_thread.run_sync(
        lambda: stop_tree(tracker, grace, orphan_grace=orphan_grace, kill_wait=kill_wait))


# ================================================================ perflab ps / perflab kill


@dataclass(frozen=True)
class RunningEngine:
    """One engine perflab started that is still running, found by its marker."""

    marker: Marker
    marker_value: str
    pid: int  # the leader: the marked process whose parent is not marked (the earliest, if several)
    pids: tuple[int, ...]  # every live process carrying the marker
    keeper_pid: int | None  # the leader's parent, when it is a perflab keeper
    ports: tuple[int, ...]  # TCP ports the engine's processes listen on
    started: float  # the leader's start (time.time())
    command: str
    owner_alive: bool

    @property
    def orphan(self) -> bool:
        """Nobody stops it any more: the perflab that started it is gone."""
        return not self.owner_alive

    def to_json(self) -> dict[str, object]:
        return {
            "study": self.marker.study, "run": self.marker.run, "pid": self.pid, "pids": list(self.pids),
            "keeper_pid": self.keeper_pid, "ports": list(self.ports), "started": self.started,
            "age_s": round(time.time() - self.started, 1), "command": self.command,
            "owner_pid": self.marker.owner_pid, "owner_alive": self.owner_alive, "orphan": self.orphan,
            "marker": self.marker_value,
        }


def _is_keeper(pid: int) -> bool:
    try:
        return "perflab.lifecycle.keeper" in psutil.Process(pid).cmdline()
    except psutil.Error:
        return False


def find_engines() -> list[RunningEngine]:
    """Every live process whose environment carries a perflab marker, grouped by marker.

    Only processes of users we may read (``/proc/PID/environ``) are seen: one's own. A process
    that rewrote its environment area (vLLM's ``VLLM::EngineCore`` sets its title with
    setproctitle, which leaves ``/proc/PID/environ`` empty) is counted through the leader's
    session instead.
    """
    groups: dict[str, list[psutil.Process]] = {}
    by_session: dict[int, list[psutil.Process]] = {}
    me = os.getpid()
    for p in psutil.process_iter():
        if p.pid == me:
            continue
        try:
            by_session.setdefault(os.getsid(p.pid), []).append(p)
        except OSError:
            pass
        try:
            value = p.environ().get(MARKER_ENV)
            if value and Marker.parse(value) is not None and _alive(p):
                groups.setdefault(value, []).append(p)
        except (psutil.Error, OSError):
            continue
    found = []
    for value, members in groups.items():
        marker = Marker.parse(value)
        assert marker is not None
        pids = {p.pid for p in members}
        roots = []
        for p in members:
            try:
                if p.ppid() not in pids:
                    roots.append(p)
            except psutil.Error:
                continue
        if not roots:
            continue
        leader = min(roots, key=lambda p: p.create_time())
        for p in by_session.get(leader.pid, []):  # its session (the keeper started it in its own)
            if p.pid not in pids and _alive(p):
                members.append(p)
                pids.add(p.pid)
        ports: set[int] = set()
        for p in members:
            try:
                for c in p.net_connections(kind="inet"):
                    if c.status == psutil.CONN_LISTEN and c.laddr:
                        ports.add(c.laddr.port)
            except (psutil.Error, OSError):
                continue
        try:
            parent = leader.ppid()
            started = leader.create_time()
        except psutil.Error:
            continue
        served = _served_ports(leader, value)
        if served:
            ports = set(served)  # the serving port(s), not the engine's internal listeners (ZMQ, NCCL)
        found.append(RunningEngine(
            marker=marker, marker_value=value, pid=leader.pid, pids=tuple(sorted(pids)),
            keeper_pid=parent if _is_keeper(parent) else None, ports=tuple(sorted(ports)), started=started,
            command=describe(leader).partition(" (")[2].rstrip(")"), owner_alive=marker.owner_alive(),
        ))
    return sorted(found, key=lambda e: (e.marker.study, e.marker.run, e.started))


def _served_ports(leader: psutil.Process, marker: str) -> tuple[int, ...]:
    """The ports of the launch.json beside the engine (its cwd) that names this marker."""
    try:
        cwd = Path(leader.cwd())
    except (psutil.Error, OSError):
        return ()
    for path in (*cwd.glob("launch.json"), *cwd.glob("*.launch.json")):
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(record, dict) and record.get("marker") == marker and isinstance(record.get("port"), int):
            return (record["port"], *[p for p in record.get("extra_ports") or () if isinstance(p, int)])
    return ()


def stop_engine(engine: RunningEngine, grace: float) -> StopReport:
    """Stop a running engine found by :func:`find_engines` with the teardown policy."""
    tracker = ProcessTracker(PidLeader(engine.pid), engine.marker_value)
    return stop_tree(tracker, grace)
