"""The simulated machines: what ``--hardware sim:NAME`` can name.

Each machine is a number of identical accelerators. A chip carries what the stand-in tools
print (NVML name, compute capability, npu-smi name, memory, bus ids) and what the performance
model needs (peak compute, memory bandwidth, interconnect bandwidth, plus the sustained
fraction of those peaks real inference kernels reach, calibrated in docs/simulator.md).

Peak figures are the vendors' datasheet numbers for *dense* math (no 2:4 sparsity):

- NVIDIA A100 SXM4 80GB: NVIDIA A100 Tensor Core GPU datasheet (2021),
  https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf
  BF16 312 TFLOPS, INT8 624 TOPS, no FP8 tensor cores (FP8 arrived with Hopper), HBM2e
  2,039 GB/s, 80 GB, NVLink 600 GB/s, compute capability 8.0.
- NVIDIA H100 SXM5 80GB (HBM3): NVIDIA H100 Tensor Core GPU datasheet (2023),
  https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet
  BF16 989.4 TFLOPS, FP8 1,978.9 TFLOPS, INT8 1,978.9 TOPS (the sheet's 1,979/3,958 figures
  are "with sparsity"; dense is half), HBM3 3.35 TB/s, 80 GB, NVLink 900 GB/s, compute
  capability 9.0.
- Huawei Ascend 910B3 (Atlas 800I/800T A2): Huawei publishes per-server figures only; the
  per-chip figures used by the Atlas 800T A2 technical white paper and public summaries of it
  are FP16/BF16 313 TFLOPS, INT8 626 TOPS for the 910B3, 64 GB HBM2e at 1.6 TB/s, HCCS
  392 GB/s chip-to-chip. No FP8 tensor units (FP8 arrives with the 950 series).
  https://e.huawei.com/en/products/computing/ascend/atlas-800t-a2
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from perflab.contract.errors import UsageError


@dataclass(frozen=True)
class ChipSpec:
    vendor: str  # "nvidia" | "huawei"
    kind: str  # "cuda" | "ascend"
    name: str  # as the vendor tool prints it: NVML name / npu-smi "Name" column
    memory_mib: int  # NVML total MiB / npu-smi "HBM-Usage(MB)" capacity
    baseline_used_mib: int  # what an idle device reports as used
    bf16_tflops: float
    fp8_tflops: float | None  # None: no FP8 tensor cores
    int8_tops: float
    hbm_gbps: float
    interconnect_gbps: float  # NVLink / HCCS, per device, both directions together
    compute_capability: tuple[int, int] | None = None  # CUDA only
    # Sustained fractions of the peaks that serving kernels reach (calibration, see
    # docs/simulator.md): decode reads weights and KV at hbm_efficiency x hbm_gbps, dense
    # GEMMs run at mfu x peak, all-reduce moves data at link_efficiency x interconnect/2.
    hbm_efficiency: float = 0.75
    mfu: float = 0.55
    # Prefill attention (FlashAttention kernels) sustains its own fraction of the BF16 peak;
    # None: the same as mfu.
    attention_mfu: float | None = None
    link_efficiency: float = 0.6
    collective_latency_us: float = 8.0  # fixed cost of one all-reduce
    # npu-smi details (Ascend only)
    aicore_count: int | None = None
    temperature_c: int = 40
    # Power and clocks (perflab_sim.load): an idle chip draws power_w, a fully busy,
    # compute-bound one max_power_w (the datasheet's maximum / TDP); the SM (AI Core) clock is
    # sm_clock_mhz while it has work, idle_sm_clock_mhz when it has none.
    power_w: float = 90.0
    max_power_w: float = 400.0
    sm_clock_mhz: int = 1410
    idle_sm_clock_mhz: int = 210


@dataclass(frozen=True)
class Machine:
    name: str
    chip: ChipSpec
    count: int
    driver_version: str  # NVIDIA driver / Ascend npu-smi version
    cuda_version: str | None = None  # "12.4" (CUDA machines)
    bus_ids: tuple[str, ...] = ()
    # (engine, version) the simulated engines report by default: the seeds' versions for the
    # machine (PERFLAB_SIM_ENGINE_VERSIONS overrides them, see perflab_sim.engine_versions)
    engine_versions: tuple[tuple[str, str], ...] = ()

    @property
    def kind(self) -> str:
        return self.chip.kind

    @property
    def is_cuda(self) -> bool:
        return self.chip.kind == "cuda"

    @property
    def is_ascend(self) -> bool:
        return self.chip.kind == "ascend"

    @property
    def cuda_driver_version_int(self) -> int:
        """NVML's encoding: 12.4 -> 12040."""
        if self.cuda_version is None:
            return 0
        major, minor = (int(x) for x in self.cuda_version.split(".")[:2])
        return major * 1000 + minor * 10

    def uuid(self, index: int) -> str:
        """Stable per machine name and index, in the vendor's format."""
        u = uuid.uuid5(uuid.NAMESPACE_URL, f"perflab-sim/{self.name}/{index}")
        if self.is_cuda:
            return f"GPU-{u}"
        # npu-smi's VDie ID: five groups of eight hex digits
        h = (u.hex + uuid.uuid5(u, "die").hex).upper()
        return " ".join(h[i : i + 8] for i in range(0, 40, 8))

    def bus_id(self, index: int) -> str:
        return self.bus_ids[index % len(self.bus_ids)]


# Each chip: what the vendor tools print; memory; datasheet peaks (module docstring); the
# sustained fractions of them (calibrated); npu-smi details.
A100_SXM4_80GB = ChipSpec(
    vendor="nvidia", kind="cuda", name="NVIDIA A100-SXM4-80GB", compute_capability=(8, 0),
    memory_mib=81920, baseline_used_mib=4,
    bf16_tflops=312.0, fp8_tflops=None, int8_tops=624.0, hbm_gbps=2039.0, interconnect_gbps=600.0,
    hbm_efficiency=0.75, mfu=0.5,
    # datasheet: max TDP 400 W, boost clock 1410 MHz; idle: what an idle A100 SXM4 typically
    # reports (nvidia-smi), 210 MHz its lowest supported graphics clock
    power_w=55.0, max_power_w=400.0, sm_clock_mhz=1410, idle_sm_clock_mhz=210,
    # FlashAttention-2 forward, causal, head dim 128, long sequences: ~70% of the A100's BF16
    # peak (Dao 2023, "FlashAttention-2", Fig. 5), above what a whole serving forward pass
    # sustains; seed 002's 32000-token prompts (1798 tok/s, vLLM) need it.
    attention_mfu=0.65,
)

H100_SXM5_80GB = ChipSpec(
    vendor="nvidia", kind="cuda", name="NVIDIA H100 80GB HBM3", compute_capability=(9, 0),
    memory_mib=81559, baseline_used_mib=1,
    bf16_tflops=989.4, fp8_tflops=1978.9, int8_tops=1978.9, hbm_gbps=3350.0, interconnect_gbps=900.0,
    hbm_efficiency=0.7, mfu=0.45,
    # datasheet: max TDP up to 700 W (configurable), max boost clock 1980 MHz; idle as above
    power_w=70.0, max_power_w=700.0, sm_clock_mhz=1980, idle_sm_clock_mhz=210,
)

ASCEND_910B3 = ChipSpec(
    vendor="huawei", kind="ascend", name="910B3",
    memory_mib=65536, baseline_used_mib=3161,  # tests/fixtures/npu-smi/910B3_info.txt, idle chip
    bf16_tflops=313.0, fp8_tflops=None, int8_tops=626.0, hbm_gbps=1600.0, interconnect_gbps=392.0,
    hbm_efficiency=0.55, mfu=0.4, link_efficiency=0.5, collective_latency_us=20.0,
    aicore_count=20, power_w=93.6, temperature_c=40,
    # idle power: tests/fixtures/npu-smi/910B3_info.txt; Huawei publishes no per-chip maximum
    # for the 910B3 — 400 W is the figure public summaries give for the 910B family (an
    # assumption, docs/simulator.md); AI Core clock 1800 MHz as `-t common` prints it
    max_power_w=400.0, sm_clock_mhz=1800, idle_sm_clock_mhz=1800,
)

# PCI bus ids as on the vendors' 8-device servers (DGX A100, DGX H100, Atlas 800 A2).
_DGX_A100_BUS = tuple(f"00000000:{b}:00.0" for b in ("07", "0F", "47", "4E", "87", "90", "B7", "BD"))
_DGX_H100_BUS = tuple(f"00000000:{b}:00.0" for b in ("18", "2A", "3A", "5D", "9A", "AB", "BA", "DB"))
_ATLAS_BUS = tuple(f"0000:{b}:00.0" for b in ("C1", "81", "41", "01", "C2", "82", "42", "02"))

# Engine versions of the seeds (their "Engine Version" sections): 001/002 on A100 (vLLM
# 0.11.0, SGLang 0.5.5.post1, TensorRT-LLM 1.2.0rc1), 004 on H100 (vLLM 0.17.1, SGLang 0.5.9;
# TensorRT-LLM as on A100), 000/003 on 910B (vLLM / vLLM-Ascend 0.9.1, MindIE 2.1.RC1).
_A100_ENGINES = (("vllm", "0.11.0"), ("sglang", "0.5.5.post1"), ("trtllm", "1.2.0rc1"))
_H100_ENGINES = (("vllm", "0.17.1"), ("sglang", "0.5.9"), ("trtllm", "1.2.0rc1"))
_ASCEND_ENGINES = (("vllm", "0.9.1"), ("vllm-ascend", "0.9.1"), ("mindie", "2.1.RC1"))
# Which engines each kind of machine runs (what PERFLAB_SIM_ENGINE_VERSIONS may set there).
ENGINES_BY_KIND = {"cuda": ("vllm", "sglang", "trtllm"), "ascend": ("vllm", "vllm-ascend", "mindie")}

_NV_DRIVER = "550.127.05"  # an R550 production branch driver; it reports CUDA 12.4
_NPU_SMI = "23.0.1"  # as in tests/fixtures/npu-smi/910B3_info.txt

CATALOG: dict[str, Machine] = {
    m.name: m
    for m in (
        Machine("a100-80g-x1", A100_SXM4_80GB, 1, _NV_DRIVER, "12.4", _DGX_A100_BUS, _A100_ENGINES),
        Machine("a100-80g-x8", A100_SXM4_80GB, 8, _NV_DRIVER, "12.4", _DGX_A100_BUS, _A100_ENGINES),
        Machine("h100-80g-x1", H100_SXM5_80GB, 1, _NV_DRIVER, "12.4", _DGX_H100_BUS, _H100_ENGINES),
        Machine("h100-80g-x8", H100_SXM5_80GB, 8, _NV_DRIVER, "12.4", _DGX_H100_BUS, _H100_ENGINES),
        Machine("910b3-x1", ASCEND_910B3, 1, _NPU_SMI, None, _ATLAS_BUS, _ASCEND_ENGINES),
        Machine("910b3-x8", ASCEND_910B3, 8, _NPU_SMI, None, _ATLAS_BUS, _ASCEND_ENGINES),
    )
}


def names() -> list[str]:
    return sorted(CATALOG)


def get(name: str) -> Machine:
    """The catalog machine called ``name``; a one-line UsageError naming the choices if none."""
    try:
        return CATALOG[name]
    except KeyError:
        raise UsageError(f"unknown simulated hardware {name!r} (choose one of: {', '.join(names())})") from None
