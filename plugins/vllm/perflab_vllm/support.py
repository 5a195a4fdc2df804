"""What vLLM cannot do on the given hardware, known before launching it.

Only knowledge with a source: vLLM's quantization registry and capability checks, and its
FP8 documentation. What needs the model's config (attention heads vs. tp, context length)
is not known here and is left to the crash classifier.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from packaging.version import InvalidVersion, Version
from perflab.errors import PerflabError
from perflab.types import HardwareSnapshot, ServeConfig, Unsupported

from perflab_vllm.flags import EngineOption, expert_parallel_enabled, option_args

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
    return out
