"""What TensorRT-LLM is known not to do on some hardware, said before anything is launched."""

from __future__ import annotations

from perflab.contract.plugin_base import checkpoint_tagged, min_sm_refusal, weights_what
from perflab.contract.types import HardwareSnapshot, ServeConfig, Unsupported

# cpp/tensorrt_llm/thop/fp8BlockScalingGemm.cpp dispatches on the SM version (89 Ada, 90
# Hopper, 100/120 Blackwell; early 1.x releases only 90) and otherwise fails with
# TORCH_CHECK(false, "Unsupported SM version for FP8 block scaling GEMM") — seed 002's crash
# of `trtllm-serve Qwen/Qwen3-32B-FP8` on A100 (SM80). Qwen's -FP8 checkpoints are block-scaled.
FP8_SOURCE = "https://github.com/NVIDIA/TensorRT-LLM/blob/main/cpp/tensorrt_llm/thop/fp8BlockScalingGemm.cpp"
FP8_MIN_SM = 89
FP8_QUANTIZATIONS = frozenset({"fp8", "fp8_block_scales"})
# tensorrt_llm/_torch/modules/linear.py loads `weights[0]['weight']`; an AutoAWQ checkpoint
# stores qweight/qzeros/scales instead, hence seed 002's `KeyError: 'weight'`.
AWQ_SOURCE = "https://github.com/NVIDIA/TensorRT-LLM/blob/main/tensorrt_llm/_torch/modules/linear.py"


def is_fp8(config: ServeConfig) -> bool:
    return (config.quantization or "").lower() in FP8_QUANTIZATIONS or checkpoint_tagged(config.model, "fp8")


def is_awq(config: ServeConfig) -> bool:
    return "awq" in (config.quantization or "").lower() or checkpoint_tagged(config.model, "awq")


def check(config: ServeConfig, hardware: HardwareSnapshot) -> list[Unsupported]:
    out: list[Unsupported] = []
    pytorch_backend = config.options.get("backend") in (None, "pytorch")
    if is_fp8(config):
        out += min_sm_refusal(config, hardware, FP8_MIN_SM, "FP8",
                              f"TensorRT-LLM's FP8 block-scaling GEMM needs SM{FP8_MIN_SM}+ "
                              "(RuntimeError: Unsupported SM version for FP8 block scaling GEMM)", FP8_SOURCE)
    if is_awq(config) and pytorch_backend:
        out.append(
            Unsupported(
                weights_what(config, "AWQ"),
                "the PyTorch backend loads ModelOpt-quantized checkpoints; an AutoAWQ checkpoint "
                "(qweight/qzeros/scales) fails with KeyError: 'weight' (seed 002)",
                source=AWQ_SOURCE,
                severity="warning",
            )
        )
    return out
