"""perflab's speculative config (vLLM's ``--speculative-config`` keys) as TensorRT-LLM's
``speculative_config`` LLM-API option (written to the ``--extra_llm_api_options`` YAML).

Keys from tensorrt_llm/llmapi/llm_args.py of the 1.x releases (``DecodingBaseConfig.from_dict``
dispatches on ``decoding_type``): MTP (``num_nextn_predict_layers``), Eagle (``max_draft_len``,
``speculative_model_dir``), NGram (``max_draft_len``, ``max_matching_ngram_size``), DraftTarget
(``max_draft_len``, ``speculative_model_dir``); all four support the PyTorch backend.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from perflab.contract.errors import UnsupportedOption
from perflab.contract.plugin_base import refuse_unknown

LLM_ARGS = "https://github.com/NVIDIA/TensorRT-LLM/blob/main/tensorrt_llm/llmapi/llm_args.py"

#: vLLM method name -> TensorRT-LLM decoding_type
METHODS: dict[str, str] = {
    "mtp": "MTP",
    "deepseek_mtp": "MTP",
    "qwen3_next_mtp": "MTP",
    "glm4_moe_mtp": "MTP",
    "mimo_mtp": "MTP",
    "eagle": "Eagle",
    "eagle3": "Eagle",
    "ngram": "NGram",
    "draft_model": "DraftTarget",
}
KNOWN_KEYS = frozenset({"method", "model", "num_speculative_tokens", "prompt_lookup_max"})


def speculative_config(spec: Mapping[str, Any]) -> dict[str, Any]:
    refuse_unknown("trtllm", spec, KNOWN_KEYS, "speculative_config key(s)",
                   f"perflab maps only {', '.join(sorted(KNOWN_KEYS))} to TensorRT-LLM's speculative_config ({LLM_ARGS})")
    method = spec.get("method") or ("draft_model" if spec.get("model") else None)
    decoding_type = METHODS.get(str(method).lower()) if method else None
    if decoding_type is None:
        raise UnsupportedOption(
            "trtllm",
            f"speculative_config.method={method!r}",
            f"TensorRT-LLM's PyTorch backend speculates with MTP, Eagle, NGram, DraftTarget; perflab maps {', '.join(sorted(METHODS))}",
        )
    k = spec.get("num_speculative_tokens")
    if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
        raise UnsupportedOption(
            "trtllm", f"speculative_config.num_speculative_tokens={k!r}", "expected a positive integer"
        )
    out: dict[str, Any] = {"decoding_type": decoding_type}
    model = spec.get("model")
    if decoding_type == "MTP":
        if model is not None:
            raise UnsupportedOption("trtllm", "speculative_config.model", "MTP uses the target model's own MTP layers")
        if k is not None:
            out["num_nextn_predict_layers"] = k
    else:
        if k is None:
            raise UnsupportedOption(
                "trtllm", "speculative_config", f"{decoding_type} needs num_speculative_tokens (max_draft_len)"
            )
        out["max_draft_len"] = k
        if decoding_type == "NGram":
            if model is not None:
                raise UnsupportedOption("trtllm", "speculative_config.model", "NGram speculation uses no draft model")
        elif model is None:
            raise UnsupportedOption("trtllm", "speculative_config", f"{decoding_type} needs a draft 'model'")
        else:
            out["speculative_model_dir"] = str(model)
    if spec.get("prompt_lookup_max") is not None:
        if decoding_type != "NGram":
            raise UnsupportedOption("trtllm", "speculative_config.prompt_lookup_max", "only used by ngram")
        out["max_matching_ngram_size"] = spec["prompt_lookup_max"]
    return out
