"""Named reasons TensorRT-LLM dies, matched in trtllm-serve's log.

Signatures are tried in order (most specific first); for the first signature found, the
first matching line (the root cause, not a later MPI/wrapper error) is quoted.
"""

from __future__ import annotations

import re

from perflab.contract.crashes import Signature

REPO = "https://github.com/NVIDIA/TensorRT-LLM/blob/main"

#: most specific first; perflab.contract.crashes.SHARED_SIGNATURES (model not found) are tried after these
SIGNATURES: tuple[Signature, ...] = (
    Signature(
        "fp8-block-scaling-unsupported-sm",
        re.compile(r"Unsupported SM version for FP8 block scaling GEMM"),
        "the checkpoint uses block-scaled FP8 weights and this GPU's SM version has no FP8 "
        "block-scaling GEMM kernel (Ada/Hopper/Blackwell only)",
        "serve the BF16 checkpoint on this GPU, or use vLLM (Marlin W8A16 FP8 on A100)",
        f"{REPO}/cpp/tensorrt_llm/thop/fp8BlockScalingGemm.cpp",
    ),
    Signature(
        "checkpoint-key-missing",
        re.compile(r"KeyError: 'weight'"),
        "the checkpoint lacks the 'weight' tensors TensorRT-LLM's linear layers load; AutoAWQ/GPTQ "
        "checkpoints store qweight/qzeros/scales, which the PyTorch backend does not read",
        "use the unquantized model or a ModelOpt-quantized checkpoint (e.g. nvidia/...-FP8, -NVFP4)",
        f"{REPO}/tensorrt_llm/_torch/modules/linear.py",
    ),
    Signature(
        "cuda-oom",
        re.compile(
            r"CUDA out of memory|torch\.OutOfMemoryError|OutOfMemoryError: CUDA|CUDA error: out of memory"
            r"|cudaErrorMemoryAllocation|CUDA_ERROR_OUT_OF_MEMORY|\[TensorRT-LLM\]\[ERROR\].*out of memory"
        ),
        "a CUDA allocation failed: the GPU ran out of memory",
        "lower mem_fraction (--kv_cache_free_gpu_memory_fraction), max_batch_size or max_num_tokens, or add GPUs (tp)",
        "https://pytorch.org/docs/stable/generated/torch.cuda.OutOfMemoryError.html",
    ),
    Signature(
        "nccl-error",
        re.compile(
            r"NCCL error|ncclUnhandledCudaError|ncclSystemError|ncclInternalError|ncclInvalidUsage|ncclRemoteError"
            r"|DistBackendError"
        ),
        "a collective (NCCL) operation between the tensor-parallel ranks failed",
        "check NCCL_DEBUG=INFO output, P2P/NVLink topology and /dev/shm size; try NCCL_P2P_DISABLE=1",
        "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/troubleshooting.html",
    ),
    Signature(
        "address-in-use",
        # launch_server(): raise RuntimeError(f"Failed to bind socket to {host}:{port}: {e}")
        re.compile(r"Failed to bind socket to|(?i:address already in use)|EADDRINUSE"),
        "trtllm-serve could not bind its port: it is taken",
        "stop whatever holds the port (a previous run's MPI workers?) or choose another port",
        f"{REPO}/tensorrt_llm/commands/serve.py",
    ),
)
