"""Processes: start an engine in its own session, notice its exit at once, kill all it spawned.

Engines do not stay in one neat process: vLLM's workers survive the death of their parent
and get re-parented to init, MindIE kills its own process group on failure, and a worker may
even start a new session. So teardown does not trust one mechanism; it collects the union of

* the process group / session of the leader (started with ``start_new_session=True``),
* every descendant seen while the engine ran (snapshotted periodically),
* every process carrying this launch's environment marker (:data:`MARKER_ENV`), which
  descendants inherit even after re-parenting or ``setsid()``,

and signals each of them, checking process identity (pid + start time, via psutil) so a
recycled pid is never hit.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence

import anyio
import psutil

#: Environment variable set (with a per-launch token) in every engine's environment.
MARKER_ENV = "PERFLAB_INSTANCE"


def spawn(argv: Sequence[str], env: Mapping[str, str], cwd: str | None) -> tuple[subprocess.Popen[bytes], int]:
    """Start ``argv`` in a new session with stdout+stderr on one pipe; return (process, read fd).

    The read end is non-blocking so the output pump can drain it from the event loop.
    """
    read_fd, write_fd = os.pipe()  # non-inheritable by default (PEP 446)
    try:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=write_fd,
            stderr=write_fd,
            env=dict(env),
            cwd=cwd,
            start_new_session=True,  # own session and process group: signal it as a whole
            close_fds=True,
        )
    except BaseException:
        os.close(read_fd)
        raise
    finally:
        os.close(write_fd)
    os.set_blocking(read_fd, False)
    return proc, read_fd


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)  # type: ignore[attr-defined,unused-ignore]
    except (AttributeError, OSError):  # not Linux >= 5.3, or already reaped
        return None


async def wait_exit(proc: subprocess.Popen[bytes], poll_interval: float = 0.02) -> int:
    """Return the exit code as soon as ``proc`` exits (and reap it).

    On Linux a pidfd becomes readable the instant the process dies, so this costs nothing
    while it waits and notices the death at once; elsewhere it polls every 20 ms.
    """
    rc = proc.poll()
    if rc is not None:
        return rc
    fd = _pidfd(proc.pid)
    if fd is None:
        while (rc := proc.poll()) is None:
            await anyio.sleep(poll_interval)
        return rc
    try:
        while True:
            await anyio.wait_readable(fd)
            rc = proc.poll()
            if rc is not None:
                return rc
            await anyio.sleep(0)  # readable but not yet reapable: let the kernel finish
    finally:
        os.close(fd)


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True


def describe(p: psutil.Process) -> str:
    try:
        cmd = " ".join(p.cmdline())[:120] or p.name()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        cmd = "?"
    return f"pid {p.pid} ({cmd})"


class ProcessTracker:
    """Everything one launch started, found by group, session, ancestry and env marker."""

    def __init__(self, leader: subprocess.Popen[bytes], marker: str | None) -> None:
        self.leader = leader
        self.pgid = leader.pid  # start_new_session: pgid == sid == leader pid
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
        leader_reaped = self.leader.poll() is not None
        for p in psutil.process_iter():
            if p.pid in self._me or p.pid in self.known:
                continue
            # Once the leader is reaped, a live process with its pid is a stranger that got
            # the recycled number (the kernel keeps it reserved while it names a group/session).
            if leader_reaped and p.pid == self.pgid:
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
        self.leader.poll()  # reap our own child so it does not linger as a zombie
        return [p for p in self.known.values() if _alive(p)]

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

    def signal(self, sig: int) -> None:
        if self.group_alive():
            try:
                os.killpg(self.pgid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        for p in self.alive():
            try:
                p.send_signal(sig)  # psutil checks the pid still names the same process
            except (psutil.NoSuchProcess, psutil.AccessDenied, ProcessLookupError):
                pass

    def kill_now(self) -> None:
        """SIGKILL everything known, synchronously (atexit / third Ctrl-C)."""
        self.signal(signal.SIGKILL)


async def _wait_gone(tracker: ProcessTracker, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if not tracker.alive():
            return True
        if time.monotonic() >= deadline:
            return False
        await anyio.sleep(0.02)


async def terminate(tracker: ProcessTracker, grace: float, kill_wait: float = 3.0) -> list[str]:
    """SIGTERM everything, wait ``grace`` seconds, SIGKILL what is left, reap.

    Returns one message per process still alive at the end (normally none).
    """
    await anyio.to_thread.run_sync(tracker.scan_all)
    if tracker.alive():
        tracker.signal(signal.SIGTERM)
        await _wait_gone(tracker, grace)
    # Re-scan: a process may have been spawned or re-parented while we waited.
    for _ in range(3):
        await anyio.to_thread.run_sync(tracker.scan_all)
        if not tracker.alive():
            break
        tracker.signal(signal.SIGKILL)
        await _wait_gone(tracker, kill_wait)
    tracker.leader.poll()
    return [f"{describe(p)} still alive after SIGKILL" for p in tracker.alive()]
