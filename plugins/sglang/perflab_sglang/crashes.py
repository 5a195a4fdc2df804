"""Named reasons SGLang dies, matched in its log.

Signatures are tried in order (most specific first); for the first signature found, the
first matching line (the root cause, not a later wrapper error) is quoted.
"""

from __future__ import annotations

import re

from perflab.contract.crashes import Signature

V = "https://github.com/sgl-project/sglang/blob/v0.5.5.post1/python/sglang/srt"

#: most specific first; perflab.contract.crashes.SHARED_SIGNATURES (model not found) are tried after these
SIGNATURES: tuple[Signature, ...] = (
    Signature(
        "fp8-unsupported-gpu",
        re.compile(r"type fp8e4nv not supported in this architecture|fp8e4nv data type is not supported on CUDA arch"),
        "SGLang's FP8 Triton kernels need an SM89+ GPU (Ada/Hopper); this GPU has no FP8 support",
        "serve the BF16 checkpoint, or use vLLM (Marlin W8A16 FP8 on A100)",
        "https://github.com/sgl-project/sglang/issues/5871",
    ),
    Signature(
        "kv-cache-no-memory",
        re.compile(r"Not enough memory\. Please try to increase --mem-fraction-static"),
        "no GPU memory is left for the KV cache after loading the weights",
        "raise mem_fraction (--mem-fraction-static), or add GPUs (tp)",
        f"{V}/model_executor/model_runner.py",
    ),
    Signature(
        "kv-cache-too-small",
        re.compile(r"Memory pool size is too small"),
        "the KV cache pool cannot hold even one request",
        "raise mem_fraction, lower max_model_len, or add GPUs (tp)",
        f"{V}/managers/tp_worker.py",
    ),
    Signature(
        "cuda-oom",
        re.compile(r"CUDA out of memory|torch\.OutOfMemoryError|OutOfMemoryError: CUDA|CUDA error: out of memory"),
        "a CUDA allocation failed: the GPU ran out of memory",
        "lower mem_fraction, max_num_seqs or chunked prefill size, or add GPUs (tp)",
        "https://pytorch.org/docs/stable/generated/torch.cuda.OutOfMemoryError.html",
    ),
    Signature(
        "nccl-error",
        re.compile(
            r"NCCL error|ncclUnhandledCudaError|ncclSystemError|ncclInternalError|ncclInvalidUsage|ncclRemoteError"
            r"|DistBackendError|Watchdog caught collective operation timeout"
        ),
        "a collective (NCCL) operation between the tensor-parallel workers failed",
        "check NCCL_DEBUG=INFO output, P2P/NVLink topology and /dev/shm size; try NCCL_P2P_DISABLE=1",
        "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/troubleshooting.html",
    ),
    Signature(
        "cuda-illegal-memory-access",
        re.compile(r"CUDA error: an illegal memory access was encountered|cudaErrorIllegalAddress"),
        "a CUDA kernel accessed invalid memory while serving; the scheduler died and SGLang killed its "
        "process tree (a kernel bug for this model, quantization or GPU)",
        "rerun with CUDA_LAUNCH_BLOCKING=1 to find the kernel; try --disable-cuda-graph or another attention backend",
        "https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__TYPES.html",
    ),
    Signature(
        "rendezvous-timeout",
        re.compile(r"Timed out after \d+ seconds waiting for clients|The client socket has timed out after \d+ms "
                   r"while trying to connect to"),
        "the node ranks never all met at --dist-init-addr (a rank did not start, or cannot reach rank 0's address)",
        "check that every node started, reaches rank 0's --dist-init-addr HOST:PORT, and that the port is open",
        "https://github.com/pytorch/pytorch/blob/v2.8.0/torch/csrc/distributed/c10d/TCPStore.cpp",
    ),
    Signature(
        "peer-rank-lost",
        re.compile(r"Connection closed by peer"),
        "another node rank of the group died, so the collectives failed on this one",
        "see the other node ranks' logs (engine-node<R>.log) for the first cause",
        "https://github.com/facebookincubator/gloo/blob/main/gloo/transport/tcp/pair.cc",
    ),
    Signature(
        "address-in-use",
        re.compile(r"(?i)address already in use|EADDRINUSE|Port is already in use"),
        "the server (or one of SGLang's internal ZMQ/NCCL ports) could not bind: the port is taken",
        "stop whatever holds the port (a previous run's workers?) or choose another port",
        f"{V}/server_args.py",
    ),
)
