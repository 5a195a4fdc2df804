"""What TensorRT-LLM is known not to do on some hardware, said before anything is launched."""

from __future__ import annotations

import re

from perflab.types import HardwareSnapshot, ServeConfig, Unsupported

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
_FP8_MODEL = re.compile(r"(?i)(?:^|[-_./])fp8(?:$|[-_.])")
_AWQ_MODEL = re.compile(r"(?i)(?:^|[-_./])awq(?:$|[-_.])")


def is_fp8(config: ServeConfig) -> bool:
    return (config.quantization or "").lower() in FP8_QUANTIZATIONS or bool(_FP8_MODEL.search(config.model))


def is_awq(config: ServeConfig) -> bool:
    return "awq" in (config.quantization or "").lower() or bool(_AWQ_MODEL.search(config.model))


def check(config: ServeConfig, hardware: HardwareSnapshot) -> list[Unsupported]:
    out: list[Unsupported] = []
    pytorch_backend = config.options.get("backend") in (None, "pytorch")
    if is_fp8(config):
        old = [a for a in hardware.select(config.devices, "cuda") if a.sm is not None and a.sm < FP8_MIN_SM]
        if old:
            what = (
                f"quantization={config.quantization}"
                if config.quantization
                else f"model={config.model} (FP8 checkpoint)"
            )
            out.append(
                Unsupported(
                    what,
                    f"{old[0].name} is SM{old[0].sm}; TensorRT-LLM's FP8 block-scaling GEMM needs SM{FP8_MIN_SM}+ "
                    "(RuntimeError: Unsupported SM version for FP8 block scaling GEMM)",
                    source=FP8_SOURCE,
                )
            )
    if is_awq(config) and pytorch_backend:
        out.append(
            Unsupported(
                f"quantization={config.quantization}"
                if config.quantization
                else f"model={config.model} (AWQ checkpoint)",
                "the PyTorch backend loads ModelOpt-quantized checkpoints; an AutoAWQ checkpoint "
                "(qweight/qzeros/scales) fails with KeyError: 'weight' (seed 002)",
                source=AWQ_SOURCE,
                severity="warning",
            )
        )
    return out
