"""The keeper: the small process between perflab and an engine, so engines never outlive perflab.

``python -m perflab.lifecycle.keeper --status-fd N --out-fd M --grace S`` with the lifeline
pipe on stdin. Started by :func:`perflab.lifecycle.procs.spawn`, it

1. reads the engine's launch (one JSON line: argv, env, cwd) from the lifeline;
2. forks and lets the first process exit (double fork: the keeper is nobody's child that
   could forget to reap it, and lives in a session of its own, so a SIGHUP or Ctrl-C aimed
   at perflab's terminal does not reach it);
3. makes itself a child subreaper (``prctl(PR_SET_CHILD_SUBREAPER)``, Linux >= 3.4): every
   process of the engine's tree that loses its parent is re-parented to the keeper, which
   reaps it — no zombies, and nothing escapes by double-forking;
4. gives the engine a temporary directory of its own (:func:`private_tmpdir`: ``TMPDIR``
   points into a fresh ``perflab-engine-*`` directory inside the one the engine would have
   used), starts it in a new session with stdout+stderr on ``--out-fd`` and reports
   ``{"keeper": pid, "pid": engine pid, "tmpdir": its directory}`` (or ``{"error": ...,
   "errno": ...}``) on ``--status-fd``, later ``{"pid": engine pid, "exit": status}`` when it
   reaps the engine (``Popen`` convention: negative = killed by that signal);
5. when the lifeline reaches EOF (perflab finished, or died: ``kill -9``, a closed SSH
   session) or the keeper gets SIGTERM/SIGINT/SIGHUP, stops the engine's whole tree with
   :func:`perflab.lifecycle.procs.stop_tree` (the same SIGTERM → grace → SIGKILL policy as a
   normal teardown);
6. exits as soon as its engine tree is gone, removing the engine's temporary directory first:
   what an engine leaves in ``$TMPDIR`` goes with it. vLLM leaves two or three ZMQ IPC
   sockets (``ipc://$TMPDIR/<uuid4>``, ``vllm.utils.network_utils.get_open_zmq_ipc_path``)
   and a ``vllm_dist_<hex>`` FileStore rendezvous file (``get_file_store_init_method``) in
   it per launch, and never removes the file; on a machine that ran the real lane a few
   dozen times, /tmp held thousands of them.

It writes nothing else; it carries no :data:`~perflab.lifecycle.procs.MARKER_ENV`, so marker
scans never mistake it for the engine.
"""

from __future__ import annotations

import argparse
import ctypes
import errno
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from typing import Any

PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>
TICK_S = 0.5  # fallback wake-up; deaths and EOF wake the loop at once
TMP_PREFIX = "perflab-engine-"  # the engine's own temporary directory
# AF_UNIX socket paths hold 107 bytes (sun_path[108] with its NUL, unix(7)); engines put
# sockets named by a uuid4 (36 characters) in $TMPDIR, as vLLM's ipc:// endpoints do
SOCKET_PATH_MAX = 107
SOCKET_NAME_LEN = 36


def kept_caches(env: Mapping[str, str], parent: str) -> dict[str, str]:
    """The variables that keep, where they would have been, the caches engines keep in
    ``$TMPDIR`` from one launch to the next (``parent``: the ``TMPDIR`` the engine would have
    had), so that its own ``TMPDIR`` does not make every launch start cold: PyTorch
    Inductor's compiled kernels (``torch/_inductor/runtime/cache_dir_utils.py``,
    ``default_cache_dir``: ``$TMPDIR/torchinductor_<user>``, the user name with
    ``\\/:*?"<>|`` replaced by ``_``: where ``torch.compile`` keeps them unless told
    otherwise — vLLM 0.32 tells it, under ``~/.cache/vllm``, ``compiler_interface.py``). A
    variable ``env`` sets already is left alone."""
    out: dict[str, str] = {}
    if "TORCHINDUCTOR_CACHE_DIR" not in env:
        user = next((env[k] for k in ("LOGNAME", "USER", "LNAME", "USERNAME") if env.get(k)), None)
        if user is None:
            try:
                import pwd

                user = pwd.getpwuid(os.getuid()).pw_name
            except (ImportError, KeyError):
                user = f"uid_{os.getuid()}"
        out["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(parent, "torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user))
    return out


def private_tmpdir(env: Mapping[str, str]) -> str | None:
    """A new directory for an engine's temporary files, inside the ``TMPDIR`` of its
    environment ``env`` (else the keeper's default temporary directory). None where none
    can be made, or where a socket named like vLLM's would not fit in it when it would have
    fitted in the parent: the engine then uses its ``TMPDIR`` as it is."""
    parent = env.get("TMPDIR") or None
    try:
        tmp = tempfile.mkdtemp(prefix=TMP_PREFIX, dir=parent if parent and os.path.isdir(parent) else None)
    except OSError:
        return None
    if len(os.fsencode(tmp)) + 1 + SOCKET_NAME_LEN > SOCKET_PATH_MAX:
        os.rmdir(tmp)
        return None
    return tmp


def set_child_subreaper() -> bool:
    """``prctl(PR_SET_CHILD_SUBREAPER, 1)`` through libc; False where unavailable."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


class Keeper:
    def __init__(self, status_fd: int, out_fd: int, grace: float) -> None:
        self.status_fd = status_fd
        self.out_fd = out_fd
        self.grace = grace
        self.engine: subprocess.Popen[bytes] | None = None
        self.engine_rc: int | None = None
        self.stop_requested = False
        self.stopped = False
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)

    # ---------------------------------------------------------------- reporting

    def report(self, msg: dict[str, Any]) -> None:
        try:
            os.write(self.status_fd, json.dumps(msg).encode() + b"\n")
        except OSError:
            pass  # perflab is gone: nobody to tell

    # ---------------------------------------------------------------- reaping

    def reap(self) -> bool:
        """Reap every exited child; False once the keeper has no child left."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return False
            if pid == 0:
                return True
            if self.engine is not None and pid == self.engine.pid:
                rc = os.waitstatus_to_exitcode(status)
                self.engine_rc = rc
                self.engine.returncode = rc  # it is reaped: Popen must not wait for it again
                self.report({"pid": pid, "exit": rc})

    def poll_engine(self) -> int | None:
        self.reap()
        return self.engine_rc

    # ---------------------------------------------------------------- the loop

    def _on_signal(self, signum: int, frame: Any) -> None:
        if signum != signal.SIGCHLD:
            self.stop_requested = True

    def run(self, spec: dict[str, Any]) -> int:
        env = dict(spec["env"])
        tmp = private_tmpdir(env)
        if tmp is not None:
            env.update(kept_caches(env, os.path.dirname(tmp)))
            env["TMPDIR"] = tmp
        try:
            return self._run(spec, env)
        finally:
            if tmp is not None:  # the engine's tree is gone (or never started): nothing uses it
                shutil.rmtree(tmp, ignore_errors=True)

    def _run(self, spec: dict[str, Any], env: dict[str, str]) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD):
            signal.signal(sig, self._on_signal)
        signal.set_wakeup_fd(self.wake_w, warn_on_full_buffer=False)
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        try:
            self.engine = subprocess.Popen(
                list(spec["argv"]),
                stdin=subprocess.DEVNULL,
                stdout=self.out_fd,
                stderr=self.out_fd,
                env=env,
                cwd=spec.get("cwd"),
                start_new_session=True,  # its own session and process group
                close_fds=True,
            )
        except OSError as exc:
            self.report({"error": exc.strerror or str(exc), "errno": exc.errno, "filename": exc.filename})
            return 1
        finally:
            os.close(self.out_fd)
        self.report({"keeper": os.getpid(), "pid": self.engine.pid, "tmpdir": env.get("TMPDIR")})

        from perflab.lifecycle.procs import MARKER_ENV, ProcessTracker, stop_tree

        marker = env.get(MARKER_ENV)
        lifeline_open = True
        while True:
            if not self.reap():
                return 0  # the engine's tree is gone
            if self.stop_requested and not self.stopped:
                self.stopped = True
                tracker = ProcessTracker(_Leader(self), marker)
                stop_tree(tracker, self.grace, sleep=self._sleep)
                continue
            fds = [self.wake_r] + ([0] if lifeline_open else [])
            try:
                ready, _, _ = select.select(fds, [], [], TICK_S)
            except InterruptedError:
                continue
            if self.wake_r in ready:
                try:
                    while os.read(self.wake_r, 512):
                        pass
                except BlockingIOError:
                    pass
            if 0 in ready:
                try:
                    data = os.read(0, 4096)
                except OSError:
                    data = b""
                if not data:  # EOF: perflab closed it, or perflab died
                    lifeline_open = False
                    self.stop_requested = True

    def _sleep(self, s: float) -> None:
        # Reap while waiting: a process the keeper is the parent of stays a zombie (and so
        # "alive" to nobody, but present) until reaped.
        self.reap()
        select.select([self.wake_r], [], [], s)
        try:
            while os.read(self.wake_r, 512):
                pass
        except BlockingIOError:
            pass
        self.reap()


class _Leader:
    def __init__(self, keeper: Keeper) -> None:
        assert keeper.engine is not None
        self.pid = keeper.engine.pid
        self._keeper = keeper

    def poll(self) -> int | None:
        return self._keeper.poll_engine()


def _read_spec() -> dict[str, Any]:
    buf = b""
    while b"\n" not in buf:
        chunk = os.read(0, 65536)
        if not chunk:
            raise SystemExit(2)  # perflab went away before telling what to start
        buf += chunk
    line, _, rest = buf.partition(b"\n")
    if rest:
        raise SystemExit(2)  # nothing but EOF may follow on the lifeline
    spec = json.loads(line)
    if not isinstance(spec, dict) or not isinstance(spec.get("argv"), list) or not spec["argv"]:
        raise SystemExit(2)
    return spec


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m perflab.lifecycle.keeper")
    ap.add_argument("--status-fd", type=int, required=True)
    ap.add_argument("--out-fd", type=int, required=True)
    ap.add_argument("--grace", type=float, required=True)
    args = ap.parse_args(argv)
    spec = _read_spec()
    if os.fork() != 0:
        os._exit(0)  # the first process: perflab reaps it at once
    set_child_subreaper()
    try:
        return Keeper(args.status_fd, args.out_fd, args.grace).run(spec)
    except Exception as exc:  # noqa: BLE001 - a keeper must report, never hang silently
        try:
            os.write(args.status_fd, json.dumps({"error": f"keeper failed: {exc!r}", "errno": errno.EIO}).encode() + b"\n")
        except OSError:
            pass
        return 1


if __name__ == "__main__":
    sys.exit(main())
