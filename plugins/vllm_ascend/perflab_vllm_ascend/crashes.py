"""Naming why a vLLM-Ascend server died: NPU and HCCL failures, then vLLM's own causes.

One scan over the log for the first root cause of either kind (see perflab_vllm.crashes).
"""

from __future__ import annotations

from perflab.contract.types import CrashCause
from perflab_vllm.crashes import VLLM_ROOT_CAUSES, VLLM_WRAPPERS, CrashPattern, classify, pattern

ASCEND_ROOT_CAUSES: tuple[CrashPattern, ...] = (
    pattern(
        "npu-out-of-memory",
        # torch_npu's allocator: "RuntimeError: NPU out of memory. Tried to allocate 3.47 GiB
        # (NPU 0; 60.97 GiB total capacity; ...)" (vllm-ascend#1987, #19)
        r"NPU out of memory",
        "an NPU ran out of memory (weights, activations or graph capture did not fit)",
        "lower --mem-fraction if other processes share the NPU, otherwise use more NPUs (--tp), a "
        "smaller --max-num-seqs / --max-batched-tokens, or a W8A8 checkpoint (--quantization ascend)",
        "https://github.com/vllm-project/vllm-ascend/issues/1987",
    ),
    pattern(
        "hccl-error",
        # torch_npu: "HCCL function error: hcclCommInitRootInfoConfig(...), error code is 1" and
        # "ERR02200 DIST call hccl api failed." (vllm-ascend#2712, #3008); CANN's HCCL error codes
        # are EIxxxx, e.g. "EI0009: ... Transport init error" (vllm-ascend#3162).
        r"HCCL function error|DIST call hccl api failed|[Hh]cclCommInitRootInfo|\bEI\d{4}\b",
        "collective communication between the NPUs (HCCL) failed",
        "check the NPUs' links (hccn_tool), that no other job holds the devices, that "
        "ASCEND_RT_VISIBLE_DEVICES / --devices match the parallel sizes, and HCCL_* settings such "
        "as HCCL_OP_EXPANSION_MODE",
        "https://github.com/vllm-project/vllm-ascend/issues/2712",
    ),
    pattern(
        "quantization-unsupported-platform",
        # vllm/platforms/interface.py verify_quantization() with NPUPlatform.supported_quantization
        r"quantization is currently not supported in npu",
        "vLLM-Ascend does not accept this quantization method",
        "use --quantization ascend with a ModelSlim W8A8/W4A8 checkpoint (or compressed-tensors)",
        "https://github.com/vllm-project/vllm-ascend/blob/main/vllm_ascend/platform.py",
    ),
)


def classify_ascend(log_tail: str) -> CrashCause | None:
    return classify(log_tail, ASCEND_ROOT_CAUSES + VLLM_ROOT_CAUSES, VLLM_WRAPPERS)
