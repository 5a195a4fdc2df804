"""Named reasons MindIE dies, matched in its console log (MINDIE_LOG_TO_STDOUT=1).

Strings from Ascend/MindIE-LLM: mindie_llm/text_generator/generator.py (NPU OOM and KV-cache
warmup failures), src/server/endpoint/http_wrapper/http_server.cpp (ports),
src/config_manager/config_manager_impl.cpp (config checks), src/utils/safe_io.cpp (files),
src/server/daemon/llm_daemon.cpp (endpoint start). MindIE's own text for the prefix-cache
crash of seed 000 is not public: any log line that names prefix cache together with
"not support"/"unsupported"/error/exception/fail is taken as that cause.

Signatures are tried in order (most specific first); for the first signature found, the
first matching line is quoted.
"""

from __future__ import annotations

import re

from perflab.contract.crashes import Signature, first_signature
from perflab.contract.types import CrashCause

REPO = "https://github.com/Ascend/MindIE-LLM/blob/master"




SIGNATURES: tuple[Signature, ...] = (
    Signature(
        "prefix-cache-unsupported",
        re.compile(
            r"(?i)prefix[ _-]?cache\S*[^\n]*(not support|unsupported|error|exception|fail)"
            r"|(?i:not support|unsupported)[^\n]*prefix[ _-]?cache"
        ),
        "MindIE failed with prefix caching enabled: the model does not support it (seed 000: Qwen3-30B-A3B)",
        "serve without prefix caching, or use vLLM-Ascend for prefix caching on this model",
        f"{REPO}/docs/zh/user_guide/feature/prefix_cache.md",
    ),
    Signature(
        "kv-cache-insufficient",
        re.compile(r"Warmup failed\. This could be caused by setting both `max_prefill_tokens`"),
        "the KV cache left after loading the weights cannot hold one maximum-length request",
        "lower max_model_len or max_batched_tokens (maxPrefillTokens), raise mem_fraction (NPU_MEMORY_FRACTION), or add NPUs",
        f"{REPO}/mindie_llm/text_generator/generator.py",
    ),
    Signature(
        "npu-oom",
        re.compile(
            r"NPU out of memory|Warmup failed due to NPU out of memory|Device out of memory \(OOM\) reported by PyTorch"
        ),
        "an NPU allocation failed: the NPU ran out of memory",
        "lower mem_fraction (NPU_MEMORY_FRACTION), max_num_seqs or max_batched_tokens, or add NPUs (tp)",
        f"{REPO}/mindie_llm/text_generator/generator.py",
    ),
    Signature(
        "hccl-error",
        re.compile(
            r"HCCL function error|HCCL error|(?i:\bhccl\w*\b[^\n]*\b(error|failed|failure|timeout|timed out)\b)"
        ),
        "a collective (HCCL) operation between the NPUs failed",
        "check `npu-smi info` for faulty chips and that no other job holds the NPUs; "
        "ASCEND_SLOG_PRINT_TO_STDOUT=1 ASCEND_GLOBAL_LOG_LEVEL=3 show HCCL's own messages",
        f"{REPO}/mindie_llm/text_generator/generator.py",
    ),
    Signature(
        "address-in-use",
        re.compile(
            r"Management or Business or Metrics Http server listen port is occupied"
            r"|Failed to listen .*please check if (business|management) ip and (metrics )?port are legal"
            r"|(?i:address already in use)"
        ),
        "MindIE could not bind its business, management or metrics port: one is taken",
        "free the three ports (port, port+1, port+2) or choose another port",
        f"{REPO}/src/server/endpoint/http_wrapper/http_server.cpp",
    ),
    Signature(
        "config-invalid",
        re.compile(
            r"The value of maxPrefillTokens should not be less than maxInputTokenLen"
            r"|The value of ScheduleParam\.maxIterTimes can not be 0"
            r"|The value of modelParam\.cpuMemSize can not be 0"
            r"|Model instance type is invalid"
        ),
        "MindIE rejected config.json",
        "fix the quoted key (see the MindIE service parameter documentation)",
        f"{REPO}/src/config_manager/config_manager_impl.cpp",
    ),
    Signature(
        "model-not-found",
        re.compile(r"Failed to open file: \S*config\.json"),
        "the model weights directory (modelWeightPath) has no readable config.json",
        "MindIE needs a local weights directory: pass its absolute path as the model",
        f"{REPO}/src/utils/safe_io.cpp",
    ),
    Signature(
        "endpoint-init-failed",
        re.compile(r"Failed to init endpoint!"),
        "MindIE's daemon could not start its endpoint; the root cause is earlier in the log",
        "read the lines above; set MINDIE_LOG_LEVEL=DEBUG for more detail",
        f"{REPO}/src/server/daemon/llm_daemon.cpp",
    ),
)


def classify(log_tail: str, signatures: tuple[Signature, ...] = SIGNATURES) -> CrashCause | None:
    return first_signature(log_tail, signatures)
