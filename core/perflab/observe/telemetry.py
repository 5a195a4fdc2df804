"""Accelerator telemetry during a benchmark (issue #13): power, utilization, memory in use and
the SM clock of the devices a launch holds, sampled through NVML on NVIDIA GPUs and through
``npu-smi`` on Huawei Ascend NPUs.

The sources are the ones ``perflab hardware`` probes with (:mod:`perflab.hardware.nvml`'s
``load_nvml``: pynvml, or the NVML stand-in an activated environment names,
:mod:`perflab.hardware.standins`; :mod:`perflab.hardware.npusmi`'s ``npu-smi`` found on the
environment's ``PATH``, the simulator's stand-in in simulation), so telemetry runs unchanged
against the simulator. Every call blocks, so it runs in a worker thread.

NVML calls (nvidia-ml-py, the NVML API reference): ``nvmlDeviceGetPowerUsage`` (milliwatts,
the board), ``nvmlDeviceGetUtilizationRates`` (``gpu``: percent of the last sample period a
kernel ran), ``nvmlDeviceGetMemoryInfo`` (bytes used), ``nvmlDeviceGetClockInfo(NVML_CLOCK_SM)``
(MHz; optional: NOT_SUPPORTED on some boards), ``nvmlDeviceGetTotalEnergyConsumption``
(millijoules since the driver loaded, Volta and later: the energy between two samples exactly,
whatever happened between them).

``npu-smi`` (Huawei's tool; the formats as its sources print them — Ascend's open driver tree,
npu-smi ``show_ascend_card_info`` and ``show_ascend_chip_power_info`` — and as the captures in
tests/fixtures/npu-smi/ show): ``npu-smi info -t power -i <NPU ID>`` prints ``NPU ID`` and
``Chip Count``, then per chip ``NPU Real-time Power(W) : 93.6`` (``Rated Power Dissipation(W)``
on the 310) followed by ``Chip ID : 0``, then the Mcu's ``Power Dissipation(W)`` followed by
``Chip Name : MCU`` (the only power a 310P card reports: its chips answer "not supported");
``npu-smi info -t usages -i <NPU ID>`` gives per chip ``Aicore Usage Rate(%)``,
``HBM Capacity(MB)`` and ``HBM Usage Rate(%)`` (``DDR ...`` on chips without HBM).

Telemetry that cannot be had — no NVML, no ``npu-smi``, a CPU engine, a call that fails — is
said once per study (a structlog warning; the report notes that no telemetry was recorded)
and never fails a measurement: the watcher then samples nothing.
"""

from __future__ import annotations

import os
import shutil
import statistics
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.to_thread
import structlog

from perflab.hardware.standins import DEVICE_CLOCK_ENV, standin
from perflab.observe import Sample

log = structlog.get_logger(__name__)

KEY = "telemetry"
NVML = "nvml"
NPU_SMI = "npu-smi"
# npu-smi takes a while per call (seconds on a busy 8-card server): sample it at most this
# often in real seconds, whatever the sampling loop asks
NPU_SMI_MIN_WALL_S = 0.5
NPU_SMI_TIMEOUT_S = 10.0
# the per-sample values, each as "<name>.<device index>"
POWER, UTILIZATION, MEMORY, SM_CLOCK = "power_w", "utilization_pct", "memory_used_mib", "sm_clock_mhz"
ENERGY = "energy_mj"  # NVML's total energy counter (millijoules since the driver loaded; Volta and later)
# where the engines keep their own clock (standins.DEVICE_CLOCK_ENV: a simulated machine) each sample also carries it:
# the clock the bench measures simulated durations on, which a host that falls behind the time
# scale makes differ from the sample's wall-based ``t`` (perflab.observe.energy uses it)
ENGINE_T = "engine_t"
# what npu-smi calls a chip's power, by chip type (see the module docstring)
NPU_POWER_KEYS = ("NPU Real-time Power(W)", "Rated Power Dissipation(W)", "Power Dissipation(W)")
_MIB = 1024 * 1024


class TelemetryUnavailable(RuntimeError):
    """Why no telemetry can be had (said once a study)."""


def per_device(values: Mapping[str, float], name: str) -> dict[int, float]:
    """``{device: value}`` of one quantity in a sample's values (``power_w.3`` -> {3: ...})."""
    out: dict[int, float] = {}
    for k, v in values.items():
        head, _, index = k.rpartition(".")
        if head == name and index.isdigit():
            out[int(index)] = float(v)
    return out


def total_power_w(values: Mapping[str, float]) -> float | None:
    """The devices' power summed, in one sample (None: no power in it)."""
    got = per_device(values, POWER)
    return sum(got.values()) if got else None


def summarize(samples: Sequence[Sample], source: str, devices: Sequence[int]) -> dict[str, Any] | None:
    """The agreed summary: ``{"source", "samples", "devices", "power_w": {"mean", "peak"} (sum
    over the devices), "utilization_pct": {"mean", "peak"} (mean over the devices),
    "memory_used_mib": {"peak"} (sum over the devices), "sm_clock_mhz": {"mean"} | None}``."""
    if not samples:
        return None

    def series(name: str, combine: Any) -> list[float]:
        out = []
        for s in samples:
            got = per_device(s.values, name)
            if got:
                out.append(combine(got.values()))
        return out

    def mean_peak(xs: list[float]) -> dict[str, float] | None:
        return {"mean": round(statistics.fmean(xs), 2), "peak": round(max(xs), 2)} if xs else None

    power = series(POWER, sum)
    util = series(UTILIZATION, statistics.fmean)
    memory = series(MEMORY, sum)
    clock = series(SM_CLOCK, statistics.fmean)
    return {
        "source": source,
        "samples": len(samples),
        "devices": list(devices),
        "power_w": mean_peak(power),
        "utilization_pct": mean_peak(util),
        "memory_used_mib": {"peak": round(max(memory), 1)} if memory else None,
        "sm_clock_mhz": {"mean": round(statistics.fmean(clock), 1)} if clock else None,
    }


# --------------------------------------------------------------------------- NVML


def read_nvml(nvml: Any, devices: Sequence[int], missing: dict[str, str] | None = None) -> dict[str, float]:
    """One reading of ``devices`` through ``nvml`` (pynvml or the shim; initialised). A quantity
    the driver does not give (NOT_SUPPORTED: power and utilization of MIG instances, the clock
    of some boards) is left out and named in ``missing`` (quantity -> why); nothing at all
    raises."""
    nvml_error: type[BaseException] = getattr(nvml, "NVMLError", Exception)
    sm = getattr(nvml, "NVML_CLOCK_SM", 1)
    reads: tuple[tuple[str, Any], ...] = (
        (POWER, lambda h: nvml.nvmlDeviceGetPowerUsage(h) / 1000.0),  # milliwatts
        (UTILIZATION, lambda h: float(nvml.nvmlDeviceGetUtilizationRates(h).gpu)),
        (MEMORY, lambda h: int(nvml.nvmlDeviceGetMemoryInfo(h).used) / _MIB),
        (SM_CLOCK, lambda h: float(nvml.nvmlDeviceGetClockInfo(h, sm))),
        (ENERGY, lambda h: float(nvml.nvmlDeviceGetTotalEnergyConsumption(h))),
    )
    values: dict[str, float] = {}
    for d in devices:
        handle = nvml.nvmlDeviceGetHandleByIndex(d)
        for name, read in reads:
            try:
                values[f"{name}.{d}"] = read(handle)
            except nvml_error as exc:
                if missing is not None:
                    missing.setdefault(name, f"NVML: {exc}")
    if not values:
        raise TelemetryUnavailable(f"NVML gave no reading ({'; '.join(sorted(set((missing or {}).values()))) or 'no device'})")
    return values


# --------------------------------------------------------------------------- npu-smi


def _int_or_none(text: str | None) -> int | None:
    try:
        return int(str(text).strip()) if text is not None else None
    except ValueError:  # "NA"
        return None


def _float_or_none(text: str | None) -> float | None:
    try:
        return float(str(text).strip()) if text is not None else None
    except ValueError:
        return None


@dataclass(frozen=True)
class PowerReading:
    """``npu-smi info -t power -i N``: watts per chip id, and the card's (its Mcu's) watts."""

    chips: Mapping[int, float]
    card_w: float | None = None
    chip_count: int | None = None

    def of(self, chip_id: int) -> float | None:
        """A chip's power; on cards whose chips report none (310P: only the Mcu answers), the
        card's power shared evenly by its chips."""
        if chip_id in self.chips:
            return self.chips[chip_id]
        if not self.chips and self.card_w is not None:
            return self.card_w / max(1, self.chip_count or 1)
        return None


def parse_power(text: str) -> PowerReading:
    """Parse ``npu-smi info -t power -i N`` (chips whose power reads ``NA`` left out)."""
    from perflab.hardware.npusmi_parse import parse_key_values, parse_per_chip

    header, chips = parse_per_chip(text)
    per_chip: dict[int, float] = {}
    for chip_id, f in chips.items():
        watts = next((w for k in NPU_POWER_KEYS if (w := _float_or_none(f.get(k))) is not None), None)
        if watts is not None:
            per_chip[chip_id] = watts
    card = None
    for block in parse_key_values(text):
        if block.get("Chip Name", "").lower() == "mcu":
            card = next((w for k in NPU_POWER_KEYS if (w := _float_or_none(block.get(k))) is not None), None)
    return PowerReading(per_chip, card, _int_or_none(header.get("Chip Count")))


def parse_usage(text: str) -> dict[int, dict[str, float]]:
    """``npu-smi info -t usages -i N``: per chip id, AI Core utilization (%) and memory in use
    (MiB: capacity × usage rate, HBM where the chip has it, else DDR)."""
    from perflab.hardware.npusmi_parse import parse_per_chip

    _, chips = parse_per_chip(text)
    out: dict[int, dict[str, float]] = {}
    for chip_id, f in chips.items():
        got: dict[str, float] = {}
        aicore = _float_or_none(f.get("Aicore Usage Rate(%)"))
        if aicore is not None:
            got[UTILIZATION] = aicore
        hbm = _int_or_none(f.get("HBM Capacity(MB)"))
        cap, rate = (hbm, _int_or_none(f.get("HBM Usage Rate(%)"))) if hbm else \
            (_int_or_none(f.get("DDR Capacity(MB)")), _int_or_none(f.get("DDR Usage Rate(%)")))
        if cap and rate is not None:
            got[MEMORY] = cap * rate / 100.0
        out[chip_id] = got
    return out


@dataclass(frozen=True)
class Chip:
    """An Ascend device as the engines number it (``index``: the logic id) and as npu-smi asks for it."""

    index: int
    npu_id: int
    chip_id: int


def read_npu_smi(exe: str, env: Mapping[str, str], chips: Sequence[Chip]) -> dict[str, float]:
    """One reading of ``chips``: ``npu-smi info -t power|usages -i <NPU ID>`` per NPU."""
    from concurrent.futures import ThreadPoolExecutor

    from perflab.hardware.npusmi import run_npu_smi

    npus = sorted({c.npu_id for c in chips})
    with ThreadPoolExecutor(max_workers=min(16, 2 * len(npus))) as pool:  # npu-smi is slow, not busy
        power = {n: pool.submit(run_npu_smi, exe, ["info", "-t", "power", "-i", str(n)], env, NPU_SMI_TIMEOUT_S) for n in npus}
        usage = {n: pool.submit(run_npu_smi, exe, ["info", "-t", "usages", "-i", str(n)], env, NPU_SMI_TIMEOUT_S) for n in npus}
        power_by = {n: parse_power(f.result()) for n, f in power.items()}
        usage_by = {n: parse_usage(f.result()) for n, f in usage.items()}
    values: dict[str, float] = {}
    for c in chips:
        watts = power_by[c.npu_id].of(c.chip_id)
        if watts is not None:
            values[f"{POWER}.{c.index}"] = watts
        for name, v in usage_by[c.npu_id].get(c.chip_id, {}).items():
            values[f"{name}.{c.index}"] = v
    return values


# --------------------------------------------------------------------------- the watcher


@dataclass
class TelemetryWatcher:
    """The :class:`perflab.observe.Watcher` of one benchmark's devices."""

    source: str
    devices: tuple[int, ...]
    telemetry: Telemetry
    key: str = KEY
    _last_wall: float = field(default=-1e9, repr=False)

    async def sample(self) -> Mapping[str, float] | None:
        if self.source == NPU_SMI and time.monotonic() - self._last_wall < NPU_SMI_MIN_WALL_S:
            return None  # the last reading ended less than NPU_SMI_MIN_WALL_S ago
        try:
            return await anyio.to_thread.run_sync(self.telemetry.read, self.source, self.devices)
        finally:
            self._last_wall = time.monotonic()

    def summarize(self, samples: Sequence[Sample]) -> dict[str, Any] | None:
        return summarize(samples, self.source, self.devices)


class Telemetry:
    """The study's telemetry sources: NVML (initialised on first use, shut down by :meth:`close`)
    and ``npu-smi``. :meth:`watcher` gives each benchmark its watcher; what cannot be had is
    logged once (:attr:`problems`) and gives no watcher. Each launch :meth:`held` it while it
    runs; the last one to let go closes it (a backend's concurrent launches share one)."""

    def __init__(self, env: Mapping[str, str], accelerators: Sequence[Any]) -> None:
        self.env = dict(env)
        self.accelerators = list(accelerators)  # perflab.contract.types.Accelerator of the study's machine
        self.problems: dict[str, str] = {}  # source -> why it gives nothing (said once)
        self._nvml: Any = None
        self._nvml_open = False
        self._holders = 0  # launches running with it (held)
        # readings run in worker threads, those of concurrent launches side by side
        self._lock = threading.Lock()

    # sources -----------------------------------------------------------------------------
    def _say_once(self, source: str, why: str) -> None:
        with self._lock:
            if source in self.problems:
                return
            self.problems[source] = why
        log.warning("observe.telemetry-unavailable", source=source, why=why)

    def _open_nvml(self) -> Any:
        with self._lock:
            return self._nvml if self._nvml_open else self._start_nvml()

    def _start_nvml(self) -> Any:
        from perflab.hardware.nvml import load_nvml

        nvml = load_nvml(self.env)
        if nvml is None:
            raise TelemetryUnavailable("nvidia-ml-py is not installed")
        try:
            nvml.nvmlInit()
        except getattr(nvml, "NVMLError", Exception) as exc:
            raise TelemetryUnavailable(f"NVML did not start ({exc})") from None
        self._nvml, self._nvml_open = nvml, True
        return nvml

    def _chips(self, devices: Sequence[int]) -> list[Chip]:
        by_index = {a.index: a for a in self.accelerators if a.kind == "ascend"}
        out = []
        for d in devices:
            a = by_index.get(d)
            npu = getattr(a, "npu_id", None)
            chip = getattr(a, "chip_id", None)
            out.append(Chip(d, int(npu) if npu is not None else d, int(chip) if chip is not None else 0))
        return out

    def read(self, source: str, devices: Sequence[int]) -> dict[str, float]:
        """One reading (blocking: run it in a thread). A failure disables the source for the
        rest of the study, said once."""
        if source in self.problems:
            return {}
        clock = standin(self.env, DEVICE_CLOCK_ENV)
        if clock is None:
            return self._read(source, devices)
        # engines keeping their own clock (a simulated machine): the reading and its engine_t
        # must see one publication of that clock (the NVML stand-in's energy counter counts
        # idle power over it)
        for _ in range(3):
            before = clock(self.env, devices)
            values = self._read(source, devices)
            after = clock(self.env, devices)
            if before == after:
                break
        if values and after is not None:
            values[ENGINE_T] = after
        return values

    def _read(self, source: str, devices: Sequence[int]) -> dict[str, float]:
        try:
            if source == NVML:
                missing: dict[str, str] = {}
                values = read_nvml(self._open_nvml(), devices, missing)
                for name, why in missing.items():  # the rest still comes: said once, not fatal
                    self._say_once(f"{source}:{name}", why)
            else:
                exe = shutil.which("npu-smi", path=self.env.get("PATH", os.defpath))
                if exe is None:
                    raise TelemetryUnavailable("npu-smi is not on PATH")
                values = read_npu_smi(exe, self.env, self._chips(devices))
        except Exception as exc:  # telemetry never fails a study
            why = str(exc) if isinstance(exc, TelemetryUnavailable) else f"{type(exc).__name__}: {exc}"
            self._say_once(source, why)
            return {}
        return values

    def watcher(self, devices_by_kind: Mapping[str, Sequence[int]]) -> TelemetryWatcher | None:
        """The watcher of a launch's devices (``{kind: [indices]}``); None when none can be had."""
        for kind, devices in devices_by_kind.items():
            if not devices:
                continue
            if kind == "cuda":
                source = NVML
            elif kind == "ascend":
                source = NPU_SMI
            else:
                self._say_once(kind, f"no accelerator telemetry for {kind} devices")
                continue
            if source in self.problems:
                continue
            return TelemetryWatcher(source, tuple(devices), self)
        return None

    @contextmanager
    def held(self) -> Iterator[Telemetry]:
        """Held by one launch from its start to the end of its teardown, however it ends
        (done, crashed, cancelled): when the last holder lets go, :meth:`close` shuts NVML
        down (``nvmlShutdown``); a later launch opens it again on its first reading. The
        sources' problems stay said once for the study."""
        with self._lock:
            self._holders += 1
        try:
            yield self
        finally:
            with self._lock:
                self._holders -= 1
                if self._holders == 0:
                    self._close()

    def close(self) -> None:
        """Shut NVML down, if it was opened (``npu-smi`` is a command: nothing stays open)."""
        with self._lock:
            self._close()

    def _close(self) -> None:  # under self._lock
        if self._nvml_open:
            self._nvml_open = False
            try:
                self._nvml.nvmlShutdown()
            except Exception:  # noqa: BLE001 - shutting down: nothing left to report
                pass
