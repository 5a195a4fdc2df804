"""The NVIDIA probe against fake NVML objects (pynvml's function names) and the real pynvml."""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass, field
from typing import Any

import pytest

from perflab.contract.types import Accelerator
from perflab.hardware import nvml

GIB = 1024**3


class FakeNVMLError(Exception):
    pass


class FakeLibraryNotFound(FakeNVMLError):
    pass


class FakeNotSupported(FakeNVMLError):
    pass


@dataclass
class FakeGpu:
    name: str
    uuid: str
    total: int
    used: int
    cc: tuple[int, int] | None
    bus: bytes


@dataclass
class FakeNvml:
    """pynvml's surface as the probe uses it; ``as_bytes`` mimics old nvidia-ml-py releases."""

    gpus: list[FakeGpu]
    as_bytes: bool = False
    init_error: type[Exception] | None = None
    driver: str = "550.54.15"
    cuda: int | None = 12040
    calls: list[str] = field(default_factory=list)
    NVMLError = FakeNVMLError

    def _s(self, v: str) -> Any:
        return v.encode() if self.as_bytes else v

    def nvmlInit(self) -> None:
        self.calls.append("init")
        if self.init_error is not None:
            raise self.init_error("NVML Shared Library Not Found")

    def nvmlShutdown(self) -> None:
        self.calls.append("shutdown")

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> FakeGpu:
        return self.gpus[i]

    def nvmlDeviceGetName(self, h: FakeGpu) -> Any:
        return self._s(h.name)

    def nvmlDeviceGetUUID(self, h: FakeGpu) -> Any:
        return self._s(h.uuid)

    def nvmlDeviceGetMemoryInfo(self, h: FakeGpu) -> Any:
        return types.SimpleNamespace(total=h.total, used=h.used, free=h.total - h.used)

    def nvmlDeviceGetCudaComputeCapability(self, h: FakeGpu) -> tuple[int, int]:
        if h.cc is None:
            raise FakeNotSupported("Not Supported")
        return h.cc

    def nvmlSystemGetDriverVersion(self) -> Any:
        return self._s(self.driver)

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        if self.cuda is None:
            raise FakeNotSupported("Function Not Found")
        return self.cuda

    def nvmlDeviceGetPciInfo(self, h: FakeGpu) -> Any:
        return types.SimpleNamespace(busId=h.bus + b"\x00")  # ctypes char arrays are bytes


A100 = FakeGpu("NVIDIA A100-SXM4-80GB", "GPU-5f3c1a2b-0000-1111-2222-333344445555", 80 * GIB, 3 * GIB + 512 * 1024**2, (8, 0), b"00000000:07:00.0")
H100 = FakeGpu("NVIDIA H100 80GB HBM3", "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee", 81559 * 1024**2, 0, (9, 0), b"00000000:18:00.0")


@pytest.mark.parametrize("as_bytes", [False, True])
def test_reads_every_field(as_bytes: bool) -> None:
    fake = FakeNvml([A100, H100], as_bytes=as_bytes)
    gpus = nvml.read_gpus(fake)
    assert gpus == [
        Accelerator(
            vendor="nvidia", kind="cuda", index=0, name="NVIDIA A100-SXM4-80GB", memory_total_mib=81920,
            memory_used_mib=3584, uuid="GPU-5f3c1a2b-0000-1111-2222-333344445555", compute_capability=(8, 0),
            driver_version="550.54.15", cuda_driver_version="12.4", bus_id="00000000:07:00.0", source="nvml",
        ),
        Accelerator(
            vendor="nvidia", kind="cuda", index=1, name="NVIDIA H100 80GB HBM3", memory_total_mib=81559,
            memory_used_mib=0, uuid="GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee", compute_capability=(9, 0),
            driver_version="550.54.15", cuda_driver_version="12.4", bus_id="00000000:18:00.0", source="nvml",
        ),
    ]
    assert gpus[0].sm == 80
    assert fake.calls == ["init", "shutdown"]


@pytest.mark.parametrize(("value", "text"), [(12040, "12.4"), (11080, "11.8"), (12020, "12.2"), (13000, "13.0")])
def test_cuda_version_string(value: int, text: str) -> None:
    assert nvml.cuda_version_string(value) == text


@pytest.mark.parametrize("error", [FakeLibraryNotFound, FakeNVMLError])
def test_nvml_that_cannot_start_means_no_gpu(error: type[Exception]) -> None:
    fake = FakeNvml([A100], init_error=error)
    assert nvml.read_gpus(fake) is None


def test_unsupported_optional_fields_are_left_empty() -> None:
    old = FakeGpu("Tesla K80", "GPU-k80", 12 * GIB, 0, None, b"00000000:04:00.0")
    fake = FakeNvml([old], cuda=None)
    (gpu,) = nvml.read_gpus(fake) or []
    assert (gpu.compute_capability, gpu.cuda_driver_version, gpu.sm) == (None, None, None)
    assert gpu.driver_version == "550.54.15"


def test_error_after_start_propagates_and_still_shuts_down() -> None:
    class Lost(FakeNvml):
        def nvmlDeviceGetMemoryInfo(self, h: FakeGpu) -> Any:
            raise FakeNVMLError("GPU is lost")

    fake = Lost([A100])
    with pytest.raises(FakeNVMLError, match="GPU is lost"):
        nvml.read_gpus(fake)
    assert fake.calls == ["init", "shutdown"]


def test_missing_nvidia_ml_py_is_not_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    assert nvml.perflab_probe_hardware(env={}) is None


def test_real_pynvml_on_this_machine() -> None:
    """No NVIDIA driver: None. A GPU machine: one Accelerator per device NVML counts."""
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        assert nvml.perflab_probe_hardware(env={}) is None
        return
    try:
        count = pynvml.nvmlDeviceGetCount()
    finally:
        pynvml.nvmlShutdown()
    gpus = nvml.perflab_probe_hardware(env={})
    assert gpus is not None and len(gpus) == count
    for i, g in enumerate(gpus):
        assert (g.index, g.vendor, g.kind, g.source) == (i, "nvidia", "cuda", "nvml")
        assert g.memory_total_mib > 1024 and g.uuid and g.uuid.startswith("GPU-")
        assert g.compute_capability is not None and g.compute_capability[0] >= 3
        assert g.driver_version and g.cuda_driver_version and g.bus_id


def test_simulation_reads_the_shim(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}

    class Shim(FakeNvml):
        def __init__(self, env: Any) -> None:
            seen["env"] = env
            super().__init__([A100, A100])

    monkeypatch.setitem(sys.modules, "perflab_sim.nvml", types.SimpleNamespace(NvmlShim=Shim))
    from perflab_sim import machine_env

    env = machine_env("a100-80g-x2")
    gpus = nvml.perflab_probe_hardware(env=env)
    assert seen["env"] is env
    assert gpus is not None and [(g.index, g.source) for g in gpus] == [(0, "sim"), (1, "sim")]


def test_module_import_stays_cheap() -> None:
    """Registering the hook must not load NVML (every perflab command imports this module)."""
    import subprocess

    code = "import sys, perflab.hardware.nvml; print('pynvml' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "False"


def test_simulation_with_the_real_shim() -> None:
    """Every catalog machine through perflab's own NVML stand-in: CUDA machines show their
    GPUs (labelled "sim"), Ascend machines none."""
    from perflab_sim import catalog, machine_env

    for name in catalog.names():
        machine = catalog.get(name)
        gpus = nvml.perflab_probe_hardware(env=machine_env(name))
        if not machine.is_cuda:
            assert gpus == [], name
            continue
        assert gpus is not None and len(gpus) == machine.count, name
        assert [g.index for g in gpus] == list(range(machine.count))
        assert {g.source for g in gpus} == {"sim"} and len({g.uuid for g in gpus}) == machine.count
        assert all(g.compute_capability and g.memory_total_mib > 0 and g.bus_id and g.cuda_driver_version for g in gpus)
