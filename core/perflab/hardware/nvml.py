"""Built-in hardware probe for NVIDIA GPUs, through NVML (the ``nvidia-ml-py`` package).

NVML is the library ``nvidia-smi`` itself uses, so names, UUIDs and memory figures are the
ones users know. ``pynvml`` is imported inside the hook: importing this module (which every
``perflab`` command does, to register the hook) must stay cheap. In simulation
(an activated environment naming an NVML stand-in, :mod:`perflab.hardware.standins`) the same code reads perflab-sim's ``NvmlShim``, an
object with pynvml's function names, so the probe runs unchanged against the simulator.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from perflab.contract.hookspecs import hookimpl
from perflab.contract.types import Accelerator
from perflab.hardware import emulation

_MIB = 1024 * 1024


def _text(value: Any) -> str:
    """NVML strings are ``bytes`` in older nvidia-ml-py releases and in ctypes struct fields
    (``nvmlPciInfo_t.busId``), ``str`` in newer function returns."""
    if isinstance(value, (bytes, bytearray)):
        value = bytes(value).decode("utf-8", "replace")
    return str(value).rstrip("\x00").strip()


def cuda_version_string(version: int) -> str:
    """NVML's integer CUDA driver version as users write it: 12040 -> "12.4".

    Same arithmetic as pynvml's NVML_CUDA_DRIVER_VERSION_MAJOR/MINOR (major*1000 + minor*10).
    """
    return f"{version // 1000}.{(version % 1000) // 10}"


def load_nvml(env: Mapping[str, str]) -> Any | None:
    emulated = emulation.nvml(env)
    if emulated is not None:
        return emulated
    try:
        import pynvml
    except ImportError:  # nvidia-ml-py not installed: no NVML, not an error
        return None
    return pynvml


def read_gpus(nvml: Any, source: str = "nvml") -> list[Accelerator] | None:
    """Every GPU ``nvml`` (the pynvml module, or anything with its function names) reports.

    Returns ``None`` when NVML cannot start (no library, no driver): that machine has no
    NVIDIA GPU as far as perflab is concerned. Errors after a successful start propagate, so
    ``perflab hardware`` shows them. Fields a driver may not support are left ``None``.
    """
    nvml_error: type[BaseException] = getattr(nvml, "NVMLError", Exception)
    try:
        nvml.nvmlInit()
    except nvml_error:  # NVMLError_LibraryNotFound, NVMLError_DriverNotLoaded, ...
        return None
    try:

        def optional(fn_name: str, *args: Any) -> Any:
            fn = getattr(nvml, fn_name, None)
            if fn is None:  # an nvidia-ml-py too old to know the call
                return None
            try:
                return fn(*args)
            except nvml_error:  # NVMLError_NotSupported / FunctionNotFound on older drivers
                return None

        driver = optional("nvmlSystemGetDriverVersion")
        driver_version = _text(driver) if driver is not None else None
        cuda = optional("nvmlSystemGetCudaDriverVersion")
        cuda_driver_version = cuda_version_string(int(cuda)) if cuda else None
        gpus: list[Accelerator] = []
        for index in range(int(nvml.nvmlDeviceGetCount())):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            uuid = optional("nvmlDeviceGetUUID", handle)
            capability = optional("nvmlDeviceGetCudaComputeCapability", handle)
            pci = optional("nvmlDeviceGetPciInfo", handle)
            bus_id = getattr(pci, "busId", None) if pci is not None else None
            gpus.append(
                Accelerator(
                    vendor="nvidia",
                    kind="cuda",
                    index=index,
                    name=_text(nvml.nvmlDeviceGetName(handle)),
                    memory_total_mib=int(memory.total) // _MIB,
                    memory_used_mib=int(memory.used) // _MIB,
                    uuid=_text(uuid) if uuid is not None else None,
                    compute_capability=(int(capability[0]), int(capability[1])) if capability else None,
                    driver_version=driver_version,
                    cuda_driver_version=cuda_driver_version,
                    bus_id=_text(bus_id) if bus_id else None,
                    source=source,
                )
            )
        return gpus
    finally:
        try:
            nvml.nvmlShutdown()
        except nvml_error:
            pass


@hookimpl
def perflab_probe_hardware(env: Mapping[str, str]) -> list[Accelerator] | None:
    nvml = load_nvml(env)
    if nvml is None:
        return None
    return read_gpus(nvml, source="sim" if emulation.machine(env) else "nvml")
