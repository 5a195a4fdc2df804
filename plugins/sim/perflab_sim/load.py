"""How busy each simulated device is, and the power, utilization and clock that follow from it.

A serving simulated engine (:class:`perflab_sim.runtime.Engine`) counts, per device, the model
seconds its steps kept the device busy, and of those the seconds its tensor cores computed
and its HBM streamed (the step's split, :meth:`perflab_sim.perfmodel.CostModel.split`). Every
:data:`PUBLISH_S` wall seconds it publishes the counters of now and of the previous publication
to ``<PERFLAB_SIM_STATE_DIR>/load/<pid>.json`` (written atomically; an entry counts while its
process lives, as the memory registry's do, :mod:`perflab_sim.state`). The NVML shim and the
``npu-smi`` stand-in read the last interval: that is the simulated driver's sample period, as
NVML's utilization is "percent of time over the past sample period during which one or more
kernels was executing" with a period "between 1 second and 1/6 second depending on the
product" (NVML API reference, ``nvmlUtilization_t``) — here 1/6 s of wall time.

The model (docs/simulator.md "Power and utilization"):

* utilization ``u`` = busy model seconds / model seconds of the interval (0..1);
* compute share ``c`` and memory share ``m`` = the seconds of the interval the tensor cores and
  the HBM were busy (a decode step is mostly memory, a long prefill mostly compute);
* power = idle + (max − idle) × (0.6 u + 0.4 c): a busy chip draws most of its power whatever
  it does, a compute-bound one up to its maximum (TDP);
* SM clock: the chip's maximum while it has work, its idle clock when it has none;
* memory in use is what the engines registered (:mod:`perflab_sim.state`), not this module's.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perflab_sim import state
from perflab_sim.catalog import ChipSpec

PUBLISH_S = 1 / 6  # wall seconds between publications: NVML's shortest sample period
BUSY_POWER_SHARE = 0.6  # of (max - idle): what a busy chip draws whatever its step does
COMPUTE_POWER_SHARE = 0.4  # ... and what its tensor cores add when they compute all the time
SUBDIR = "load"


@dataclass(frozen=True)
class DeviceLoad:
    """One device over the last sample period: fractions of the period, 0..1."""

    busy: float = 0.0
    compute: float = 0.0
    memory: float = 0.0

    def power_w(self, chip: ChipSpec) -> float:
        activity = BUSY_POWER_SHARE * self.busy + COMPUTE_POWER_SHARE * self.compute
        return chip.power_w + (chip.max_power_w - chip.power_w) * min(1.0, activity)

    def sm_clock_mhz(self, chip: ChipSpec) -> int:
        return chip.sm_clock_mhz if self.busy > 0 else chip.idle_sm_clock_mhz


class LoadMeter:
    """The counters of one engine process: per device, busy / compute / memory model seconds."""

    def __init__(self, devices: Sequence[int], ranks: int) -> None:
        self.devices = tuple(devices)
        ranks = max(1, ranks)
        per = max(1, len(self.devices) // ranks)
        # data-parallel rank r runs on its own slice of the devices (tp x pp of them)
        self.rank_devices = [self.devices[r * per:(r + 1) * per] or self.devices for r in range(ranks)]
        self.busy = {d: 0.0 for d in self.devices}
        self.compute = {d: 0.0 for d in self.devices}
        self.memory = {d: 0.0 for d in self.devices}
        self._prev: dict[str, object] | None = None

    def step(self, rank: int, duration: float, mem_s: float, compute_s: float) -> None:
        """A step of ``duration`` model seconds ran on ``rank``'s devices."""
        if duration <= 0:
            return
        for d in self.rank_devices[rank % len(self.rank_devices)]:
            self.busy[d] += duration
            self.compute[d] += min(compute_s, duration)
            self.memory[d] += min(mem_s, duration)

    def snapshot(self, model_now: float) -> dict[str, object]:
        return {"t": model_now, "busy": [self.busy[d] for d in self.devices],
                "compute": [self.compute[d] for d in self.devices], "memory": [self.memory[d] for d in self.devices]}

    def publish(self, directory: Path, model_now: float, pid: int | None = None, period: bool = True) -> Path:
        """Write now's counters and the previous periodic publication's for the readers.
        ``period`` False: an extra publication (the engine going idle, so that a reading right
        after a burst of work sees all of it) that does not start a new sample period."""
        pid = os.getpid() if pid is None else pid
        now = self.snapshot(model_now)
        entry = {"pid": pid, "create_time": state.create_time(pid), "devices": list(self.devices),
                 "prev": self._prev or now, "now": now}
        if period or self._prev is None:
            self._prev = now
        target = directory / SUBDIR
        target.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target, prefix=f".{pid}.", suffix=".tmp")
        with os.fdopen(fd, "w") as fh:
            json.dump(entry, fh)
        path = target / f"{pid}.json"
        os.replace(tmp, path)
        return path


def withdraw(directory: Path, pid: int | None = None) -> None:
    pid = os.getpid() if pid is None else pid
    with contextlib.suppress(FileNotFoundError):
        (directory / SUBDIR / f"{pid}.json").unlink()


def _entries(directory: Path | None) -> list[dict[str, Any]]:
    """The live entries (those of dead processes are deleted)."""
    if directory is None or not (directory / SUBDIR).is_dir():
        return []
    out = []
    for path in sorted((directory / SUBDIR).glob("*.json")):
        try:
            entry = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # being replaced: the next reader sees it
        if not state.alive(entry):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            continue
        out.append(entry)
    return out


def model_time(directory: Path | None, devices: Sequence[int] | None = None) -> float | None:
    """The serving engines' model time (:mod:`perflab_sim.clock`; engines on one host share its
    origin) at their latest publication — not run on by the wall clock since: the NVML shim's
    energy counter and a telemetry sample's ``engine_t`` (:mod:`perflab.observe.telemetry`)
    read the same value unless a publication lands between them, which the sampler checks.
    None without a serving engine. The bench measures simulated durations on this clock.
    ``devices``: only the engines on them (engines' clocks part when the host falls behind)."""
    times = []
    for e in _entries(directory):
        try:
            if devices is not None and not set(e["devices"]) & set(devices):
                continue
            times.append(float(e["now"]["t"]))
        except (KeyError, TypeError, ValueError):
            continue
    return max(times) if times else None


def energy_mj(chip: ChipSpec, directory: Path | None, devices: Sequence[int]) -> dict[int, int]:
    """NVML's total energy counter (millijoules) per device: the idle power over the model
    clock (:func:`model_time`) plus what the serving engines' steps drew above it, from their
    counters (the power model of this module, integrated). Monotonic while the engines live —
    all a measurement, which reads it twice in one engine's life, needs; an engine's share
    goes when it exits (NVML's counts since the driver loaded)."""
    span = chip.max_power_w - chip.power_w
    out = {}
    for d in devices:
        t = model_time(directory, [d])
        out[d] = chip.power_w * (t if t is not None else time.monotonic())
    for e in _entries(directory):
        try:
            now = e["now"]
            for i, d in enumerate(e["devices"]):
                if d in out:
                    out[d] += span * (BUSY_POWER_SHARE * float(now["busy"][i]) + COMPUTE_POWER_SHARE * float(now["compute"][i]))
        except (KeyError, TypeError, ValueError, IndexError):
            continue
    return {d: round(j * 1000) for d, j in out.items()}


def _fraction(entry: Mapping[str, object], key: str, i: int, dt: float) -> float:
    now, prev = entry["now"], entry["prev"]
    delta = float(now[key][i]) - float(prev[key][i])  # type: ignore[index]
    return max(0.0, min(1.0, delta / dt))


def device_loads(directory: Path | None, devices: Sequence[int]) -> dict[int, DeviceLoad]:
    """Each device's load over its engines' last sample period (0 without a serving engine);
    entries of dead processes are deleted."""
    out = {d: DeviceLoad() for d in devices}
    for entry in _entries(directory):
        try:
            dt = float(entry["now"]["t"]) - float(entry["prev"]["t"])
            for i, d in enumerate(entry["devices"]):
                if d not in out or dt <= 0:
                    continue
                got = out[d]
                out[d] = DeviceLoad(min(1.0, got.busy + _fraction(entry, "busy", i, dt)),
                                    min(1.0, got.compute + _fraction(entry, "compute", i, dt)),
                                    min(1.0, got.memory + _fraction(entry, "memory", i, dt)))
        except (KeyError, TypeError, ValueError, IndexError):
            continue  # a malformed entry says nothing about the load
    return out
