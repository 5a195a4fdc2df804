"""An NVML stand-in with pynvml's function names, for simulated CUDA machines.

:class:`NvmlShim` answers the calls perflab's NVML probe makes the way pynvml does on the
catalog machine: strings as ``str`` (nvidia-ml-py's ``convertStrBytes``), memory and PCI info
as pynvml's own ctypes structures (field types exactly as on a real host), errors as
``pynvml.NVMLError`` with NVML's error codes. Memory in use is the idle baseline plus what
running simulated engines registered (:mod:`perflab_sim.state`); utilization, power and the SM
clock follow what the engines on the device are doing (:mod:`perflab_sim.load`). Ascend machines have no
NVIDIA devices: ``nvmlDeviceGetCount()`` is 0.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from perflab_sim import catalog, load, state
from perflab_sim.env import HARDWARE_ENV

_MIB = 1024 * 1024

try:  # nvidia-ml-py is a perflab dependency; its structs and errors keep the shim faithful
    import pynvml as _pynvml

    NVMLError: type[Exception] = _pynvml.NVMLError
    _ERROR_UNINITIALIZED = _pynvml.NVML_ERROR_UNINITIALIZED
    _ERROR_INVALID_ARGUMENT = _pynvml.NVML_ERROR_INVALID_ARGUMENT
    _ERROR_NOT_SUPPORTED = _pynvml.NVML_ERROR_NOT_SUPPORTED
except ImportError:  # pragma: no cover - only without nvidia-ml-py
    _pynvml = None

    class NVMLError(Exception):  # type: ignore[no-redef]
        def __init__(self, value: int) -> None:
            self.value = value
            super().__init__({1: "Uninitialized", 2: "Invalid Argument", 3: "Not Supported"}.get(
                value, f"NVML Error with code {value}"))

    _ERROR_UNINITIALIZED = 1
    _ERROR_INVALID_ARGUMENT = 2
    _ERROR_NOT_SUPPORTED = 3


@dataclass(frozen=True)
class _Handle:
    index: int


@dataclass
class _Memory:  # used only without nvidia-ml-py
    total: int
    free: int
    used: int


@dataclass
class _Utilization:  # used only without nvidia-ml-py
    gpu: int
    memory: int


@dataclass
class _Pci:  # used only without nvidia-ml-py
    busId: bytes  # noqa: N815 - pynvml's field name
    domain: int
    bus: int
    device: int


class NvmlShim:
    """pynvml's API for the catalog machine named by ``PERFLAB_SIM_HARDWARE`` in ``env``."""

    NVMLError = NVMLError

    def __init__(self, env: Mapping[str, str]) -> None:
        name = env.get(HARDWARE_ENV)
        if not name:
            raise ValueError(f"{HARDWARE_ENV} is not set: not in simulation")
        self.machine = catalog.get(name)
        self.state_dir = state.state_dir(env)
        self._initialised = 0

    # lifecycle ---------------------------------------------------------------------------
    def nvmlInit(self) -> None:  # noqa: N802 - pynvml's names
        self._initialised += 1

    def nvmlShutdown(self) -> None:  # noqa: N802
        if self._initialised == 0:
            raise NVMLError(_ERROR_UNINITIALIZED)
        self._initialised -= 1

    def _check(self) -> None:
        if self._initialised == 0:
            raise NVMLError(_ERROR_UNINITIALIZED)

    def _device(self, handle: Any) -> int:
        self._check()
        if not isinstance(handle, _Handle) or not 0 <= handle.index < self._count():
            raise NVMLError(_ERROR_INVALID_ARGUMENT)
        return handle.index

    def _count(self) -> int:
        return self.machine.count if self.machine.is_cuda else 0

    # system ------------------------------------------------------------------------------
    def nvmlSystemGetDriverVersion(self) -> str:  # noqa: N802
        self._check()
        return self.machine.driver_version

    def nvmlSystemGetCudaDriverVersion(self) -> int:  # noqa: N802
        self._check()
        return self.machine.cuda_driver_version_int

    # devices -----------------------------------------------------------------------------
    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        self._check()
        return self._count()

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:  # noqa: N802
        self._check()
        if not 0 <= int(index) < self._count():
            raise NVMLError(_ERROR_INVALID_ARGUMENT)
        return _Handle(int(index))

    def nvmlDeviceGetName(self, handle: Any) -> str:  # noqa: N802
        self._device(handle)
        return self.machine.chip.name

    def nvmlDeviceGetUUID(self, handle: Any) -> str:  # noqa: N802
        return self.machine.uuid(self._device(handle))

    def nvmlDeviceGetCudaComputeCapability(self, handle: Any) -> tuple[int, int]:  # noqa: N802
        self._device(handle)
        cc = self.machine.chip.compute_capability
        assert cc is not None  # CUDA catalog chips all have one
        return cc

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> Any:  # noqa: N802
        index = self._device(handle)
        chip = self.machine.chip
        used_mib = chip.baseline_used_mib + state.used_mib(self.state_dir, [index])[index]
        total = chip.memory_mib * _MIB
        used = min(total, used_mib * _MIB)
        if _pynvml is None:
            return _Memory(total=total, free=total - used, used=used)
        memory = _pynvml.c_nvmlMemory_t()
        memory.total, memory.free, memory.used = total, total - used, used
        return memory

    # telemetry (perflab_sim.load: what the simulated engines on the device are doing) -------
    def _load(self, handle: Any) -> load.DeviceLoad:
        index = self._device(handle)
        return load.device_loads(self.state_dir, [index])[index]

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:  # noqa: N802
        """Percent of the last sample period a kernel ran (``gpu``) and memory was read or
        written (``memory``), as ``nvmlUtilization_t``."""
        got = self._load(handle)
        gpu, mem = round(100 * got.busy), round(100 * got.memory)
        if _pynvml is None:
            return _Utilization(gpu=gpu, memory=mem)
        rates = _pynvml.c_nvmlUtilization_t()
        rates.gpu, rates.memory = gpu, mem
        return rates

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:  # noqa: N802
        """Board power in milliwatts (NVML's unit)."""
        return round(self._load(handle).power_w(self.machine.chip) * 1000)

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int:  # noqa: N802
        """Energy in millijoules (NVML's counter, Volta and later), :func:`perflab_sim.load.energy_mj`."""
        index = self._device(handle)
        return load.energy_mj(self.machine.chip, self.state_dir, [index])[index]

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int:  # noqa: N802
        self._device(handle)
        return round(self.machine.chip.max_power_w * 1000)

    def nvmlDeviceGetClockInfo(self, handle: Any, clock_type: int) -> int:  # noqa: N802
        """Current clock in MHz: NVML_CLOCK_GRAPHICS (0) and NVML_CLOCK_SM (1) follow the load;
        NVML_CLOCK_MEM (2) is not simulated (NVMLError NOT_SUPPORTED, as on drivers that lack it)."""
        got = self._load(handle)
        if int(clock_type) in (0, 1):
            return got.sm_clock_mhz(self.machine.chip)
        raise NVMLError(_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any:  # noqa: N802
        bus_id = self.machine.bus_id(self._device(handle))
        domain, bus, rest = bus_id.split(":")
        device = int(rest.split(".")[0], 16)
        if _pynvml is None:
            return _Pci(busId=bus_id.encode(), domain=int(domain, 16), bus=int(bus, 16), device=device)
        info = _pynvml.nvmlPciInfo_t()
        info.busId = bus_id.encode()
        info.busIdLegacy = bus_id[-12:].encode()  # "0000:07:00.0", the legacy short form
        info.domain, info.bus, info.device = int(domain, 16), int(bus, 16), device
        return info
