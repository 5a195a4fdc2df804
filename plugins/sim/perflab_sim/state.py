"""Simulated device memory in use, shared by every process of a simulated machine.

A running simulated engine process (the server, and each worker it spawns) registers the
device memory it holds as one JSON file per process in ``PERFLAB_SIM_STATE_DIR``, named by its
pid: ``{"pid", "create_time", "engine", "name", "devices": [...], "mib": [...]}`` (``mib[i]`` MiB
on ``devices[i]``). The stand-in ``npu-smi`` and the NVML shim add the live entries to the
device's idle baseline. An entry counts while its process lives — the same pid *and* the same
creation time, so a recycled pid does not resurrect a dead engine's memory — and is deleted
once its process is gone. So memory returns to baseline only when every process holding it
has exited: a leaked worker keeps its memory "used", as on a real GPU.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

from perflab_sim.env import STATE_ENV


@dataclass(frozen=True)
class Holder:
    """One process holding simulated device memory."""

    pid: int
    engine: str
    name: str  # process name as a process table shows it
    devices: tuple[int, ...]
    mib: tuple[int, ...]

    def on(self, device: int) -> int:
        return sum(m for d, m in zip(self.devices, self.mib, strict=True) if d == device)


def state_dir(env: Mapping[str, str] | None = None) -> Path | None:
    value = (os.environ if env is None else env).get(STATE_ENV)
    return Path(value) if value else None


def create_time(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None


def register(
    directory: Path,
    engine: str,
    name: str,
    devices: Sequence[int],
    mib: Sequence[int],
    pid: int | None = None,
) -> Path:
    """Record that process ``pid`` (default: this one) holds ``mib[i]`` MiB on ``devices[i]``."""
    pid = os.getpid() if pid is None else pid
    directory.mkdir(parents=True, exist_ok=True)
    entry = {
        "pid": pid,
        "create_time": create_time(pid),
        "engine": engine,
        "name": name,
        "devices": [int(d) for d in devices],
        "mib": [int(m) for m in mib],
    }
    path = directory / f"{pid}.json"
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{pid}.", suffix=".tmp")
    with os.fdopen(fd, "w") as fh:
        json.dump(entry, fh)
    os.replace(tmp, path)  # readers never see a half-written entry
    return path


def unregister(directory: Path, pid: int | None = None) -> None:
    pid = os.getpid() if pid is None else pid
    with contextlib.suppress(FileNotFoundError):
        (directory / f"{pid}.json").unlink()


def alive(entry: Mapping[str, object]) -> bool:
    pid = int(entry.get("pid", -1))  # type: ignore[call-overload]
    if pid <= 0 or not psutil.pid_exists(pid):
        return False
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False  # exited, not yet reaped by its parent: holds no device memory
        created = proc.create_time()
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False
    except psutil.AccessDenied:
        return True
    recorded = entry.get("create_time")
    return recorded is None or abs(float(recorded) - created) < 0.05  # type: ignore[arg-type]


def holders(directory: Path | None) -> list[Holder]:
    """Live entries in ``directory``; stale ones (dead or recycled pids) are deleted."""
    if directory is None or not directory.is_dir():
        return []
    found: list[Holder] = []
    for path in sorted(directory.glob("*.json")):
        try:
            entry = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # vanished or being replaced: the next reader sees it
        if not alive(entry):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            continue
        found.append(
            Holder(
                pid=int(entry["pid"]),
                engine=str(entry.get("engine", "")),
                name=str(entry.get("name", "python")),
                devices=tuple(int(d) for d in entry.get("devices", [])),
                mib=tuple(int(m) for m in entry.get("mib", [])),
            )
        )
    return found


def used_mib(directory: Path | None, devices: Iterable[int]) -> dict[int, int]:
    """MiB held by live simulated processes on each of ``devices`` (not counting the baseline)."""
    live = holders(directory)
    return {d: sum(h.on(d) for h in live) for d in devices}
