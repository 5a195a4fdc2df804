"""What SGLang is known not to do on some hardware, said before anything is launched."""

from __future__ import annotations

from perflab.contract.plugin_base import checkpoint_tagged, min_sm_refusal
from perflab.contract.types import HardwareSnapshot, ServeConfig, Unsupported

# Seed 001: "Running SGLang with FP8 quantization on A100 GPUs does not work." SGLang's FP8
# Triton kernels use the fp8e4nv type, which Triton supports only from SM89 (Ada/Hopper):
# "type fp8e4nv not supported in this architecture" (sgl-project/sglang#5871, #12887).
FP8_SOURCE = "https://github.com/sgl-project/sglang/issues/5871"
FP8_MIN_SM = 89
FP8_QUANTIZATIONS = frozenset({"fp8", "w8a8_fp8", "modelopt_fp8", "w4afp8"})


def is_fp8(config: ServeConfig) -> bool:
    """FP8 weights asked for, either as a quantization or by a pre-quantized checkpoint id."""
    return config.quantization in FP8_QUANTIZATIONS or checkpoint_tagged(config.model, "fp8")


def check(config: ServeConfig, hardware: HardwareSnapshot) -> list[Unsupported]:
    if not is_fp8(config):
        return []
    return min_sm_refusal(config, hardware, FP8_MIN_SM, "FP8",
                          f"SGLang's FP8 kernels need SM{FP8_MIN_SM}+ (seed 001: SGLang FP8 does not work on A100)",
                          FP8_SOURCE)
