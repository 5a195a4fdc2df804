"""perflab's speculative config (vLLM's ``--speculative-config`` keys) as SGLang flags.

SGLang v0.5.5.post1 ``server_args.py``: ``--speculative-algorithm`` takes EAGLE, EAGLE3, NEXTN
(rewritten to EAGLE in ``_handle_speculative_decoding``; the MTP heads of DeepSeek/Qwen3-Next
style models), STANDALONE (a separate draft model) or NGRAM. A chain of ``k`` draft tokens is
``--speculative-num-steps k --speculative-eagle-topk 1 --speculative-num-draft-tokens k+1``:
with topk 1 SGLang forces num_draft_tokens = num_steps + 1 anyway.

The n-gram settings changed spelling in 0.5.10 (perflab_sglang.VERSIONS): vLLM's
``prompt_lookup_max``/``_min`` are the match windows up to 0.5.9 and have no equivalent after;
``max_trie_depth`` (SGLang's own) is ``--speculative-ngram-branch-length`` up to 0.5.9 and
``--speculative-ngram-max-trie-depth`` from 0.5.10.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from perflab.contract.errors import UnsupportedOption
from perflab.contract.plugin_base import refuse_unknown
from perflab_sglang import VERSIONS

SERVER_ARGS = "https://github.com/sgl-project/sglang/blob/v0.5.5.post1/python/sglang/srt/server_args.py"

#: vLLM method name -> SGLang --speculative-algorithm
METHODS: dict[str, str] = {
    "eagle": "EAGLE",
    "eagle3": "EAGLE3",
    "mtp": "NEXTN",
    "nextn": "NEXTN",
    "deepseek_mtp": "NEXTN",
    "qwen3_next_mtp": "NEXTN",
    "ernie_mtp": "NEXTN",
    "glm4_moe_mtp": "NEXTN",
    "mimo_mtp": "NEXTN",
    "ngram": "NGRAM",
    "draft_model": "STANDALONE",
    "standalone": "STANDALONE",
}

#: keys perflab understands (vLLM spellings, plus SGLang-native tree settings)
KNOWN_KEYS = frozenset(
    {
        "method",
        "model",
        "num_speculative_tokens",
        "prompt_lookup_max",
        "prompt_lookup_min",
        "num_steps",
        "eagle_topk",
        "num_draft_tokens",
        "max_trie_depth",
    }
)


def _int(spec: Mapping[str, Any], key: str) -> int | None:
    value = spec.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UnsupportedOption("sglang", f"speculative_config.{key}={value!r}", "expected a positive integer")
    return value


def _ngram_flag(key: str, version: str | None) -> str:
    return VERSIONS.how("sglang", f"speculative_config.{key}", version)


def speculative_args(spec: Mapping[str, Any], version: str | None = None) -> list[str]:
    """SGLang ``version``'s flags (None: the newest perflab maps) for ``spec``."""
    refuse_unknown("sglang", spec, KNOWN_KEYS, "speculative_config key(s)",
                   f"SGLang's speculative flags cover only {', '.join(sorted(KNOWN_KEYS))} ({SERVER_ARGS})")
    method = spec.get("method")
    if method is None:
        if spec.get("model") is None:
            raise UnsupportedOption(
                "sglang", "speculative_config", "needs 'method' (eagle, eagle3, mtp, ngram, draft_model)"
            )
        method = "draft_model"  # a draft model without a method is vLLM's draft-model mode
    algorithm = METHODS.get(str(method).lower())
    if algorithm is None:
        raise UnsupportedOption(
            "sglang",
            f"speculative_config.method={method!r}",
            f"SGLang's --speculative-algorithm accepts EAGLE, EAGLE3, NEXTN, STANDALONE, NGRAM; "
            f"perflab maps {', '.join(sorted(METHODS))}",
        )
    args = ["--speculative-algorithm", algorithm]
    model = spec.get("model")
    if model is not None:
        if algorithm == "NGRAM":
            raise UnsupportedOption("sglang", "speculative_config.model", "NGRAM speculation uses no draft model")
        args += ["--speculative-draft-model-path", str(model)]
    elif algorithm in ("EAGLE", "EAGLE3", "STANDALONE"):
        raise UnsupportedOption("sglang", f"speculative_config.method={method!r}", "needs a draft 'model'")

    k = _int(spec, "num_speculative_tokens")
    steps, topk, draft = _int(spec, "num_steps"), _int(spec, "eagle_topk"), _int(spec, "num_draft_tokens")
    lookup_max, lookup_min = _int(spec, "prompt_lookup_max"), _int(spec, "prompt_lookup_min")
    depth = _int(spec, "max_trie_depth")
    if algorithm == "NGRAM":
        if steps is not None or topk is not None:
            raise UnsupportedOption(
                "sglang", "speculative_config num_steps/eagle_topk", "not used by NGRAM speculation"
            )
        # NGRAM drafts num_draft_tokens tokens per step (default: the max match window).
        draft = draft if draft is not None else k
        if draft is not None:
            args += ["--speculative-num-draft-tokens", str(draft)]
        if lookup_max is not None:
            args += [_ngram_flag("prompt_lookup_max", version), str(lookup_max)]
        if lookup_min is not None:
            args += [_ngram_flag("prompt_lookup_min", version), str(lookup_min)]
        if depth is not None:
            if depth < 2:  # "param_.max_trie_depth must be greater than 1" (0.5.23 kernels/jit/csrc/ngram_corpus/ngram.cpp)
                raise UnsupportedOption("sglang", f"speculative_config.max_trie_depth={depth}", "must be at least 2")
            args += [_ngram_flag("max_trie_depth", version), str(depth)]
        return args
    if lookup_max is not None or lookup_min is not None:
        raise UnsupportedOption("sglang", "speculative_config.prompt_lookup_*", f"only used by ngram, not {method}")
    if depth is not None:
        raise UnsupportedOption("sglang", "speculative_config.max_trie_depth", f"only used by ngram, not {method}")
    if k is not None:
        if steps is not None and steps != k:
            raise UnsupportedOption("sglang", "speculative_config", "num_speculative_tokens and num_steps disagree")
        steps = k
        topk = 1 if topk is None else topk
        draft = k + 1 if draft is None else draft
    # SGLang requires steps/topk/draft-tokens all set or all unset (auto_choose_speculative_params).
    given = [v is not None for v in (steps, topk, draft)]
    if any(given) and not all(given):
        raise UnsupportedOption(
            "sglang",
            "speculative_config",
            "set num_speculative_tokens, or all of num_steps, eagle_topk, num_draft_tokens",
        )
    if steps is not None:
        args += [
            "--speculative-num-steps",
            str(steps),
            "--speculative-eagle-topk",
            str(topk),
            "--speculative-num-draft-tokens",
            str(draft),
        ]
    return args
