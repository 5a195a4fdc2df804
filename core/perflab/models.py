"""Model facts, declared once: the shapes of the models perflab knows, looked up by Hugging Face id.

Facts about a model (its layers, heads, context length, parameter count), not about a
simulator: the lab's preflight reads the context length of a model it cannot find on disk
(:mod:`perflab.lab.run.preflight`), and perflab-sim serves these models (its performance model
reads the shapes).

A name resolves by its last path component, case-insensitively, so the Hugging Face id
(``Qwen/Qwen3-32B``), a bare name (``Qwen3-30B-A3B``, as in MindIE configs) and a local weight
directory (``/model/Qwen3-32B-W8A8``) all find the same entry. A quantization suffix
(``-FP8``, ``-AWQ``, ``-W8A8``, ``-GPTQ-Int4``, ``-GPTQ-Int8``) selects the quantized variant
of the base model.

Shapes come from each model's ``config.json`` on Hugging Face (num_hidden_layers,
hidden_size, num_attention_heads, num_key_value_heads, head_dim, max_position_embeddings,
num_experts, num_experts_per_tok, moe_intermediate_size), e.g.
https://huggingface.co/Qwen/Qwen3-32B/blob/main/config.json and the model cards' parameter
counts. Expert parameters are layers x experts x 3 x hidden x moe_intermediate.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class ModelSpec:
    name: str  # canonical Hugging Face id of the base model
    params_b: float  # total parameters, billions
    active_params_b: float  # parameters used per token (== params_b for dense models)
    layers: int
    hidden: int
    q_heads: int
    kv_heads: int
    head_dim: int
    context_len: int  # max_position_embeddings (native, no YaRN)
    is_moe: bool = False
    expert_params_b: float = 0.0  # MoE: parameters inside routed experts
    num_experts: int = 0
    experts_per_token: int = 0
    kv_layers: int | None = None  # layers with a KV cache (hybrid models); None: all
    quant: str | None = None  # "fp8" | "awq" | "w8a8" | "gptq-int4" | "gptq-int8" | None
    mtp_layers: int = 0  # multi-token-prediction heads shipped with the weights

    @property
    def attention_layers(self) -> int:
        return self.layers if self.kv_layers is None else self.kv_layers

    @property
    def dense_params_b(self) -> float:
        """Parameters every token touches (attention, embeddings, shared layers)."""
        return self.params_b - self.expert_params_b


class UnknownModel(LookupError):
    """The name matches no simulated model. ``hf_message`` is what Hugging Face's loaders
    print for a repository that does not exist, for front ends to reproduce."""

    def __init__(self, name: str) -> None:
        self.model = name
        super().__init__(f"unknown model {name!r} (simulated models: {', '.join(known_names())})")

    @property
    def hf_message(self) -> str:
        # transformers' wording (utils/hub.py, cached_file) for a missing repo
        return (
            f"OSError: {self.model} is not a local folder and is not a valid model identifier listed on "
            "'https://huggingface.co/models'\nIf this is a private repository, make sure to pass a token having "
            "permission to this repo either by logging in with `hf auth login` or by passing `token=<your_token>`"
        )


_BASE: tuple[ModelSpec, ...] = (
    ModelSpec("Qwen/Qwen3-8B", 8.19, 8.19, 36, 4096, 32, 8, 128, 40960),
    ModelSpec("Qwen/Qwen3-14B", 14.8, 14.8, 40, 5120, 40, 8, 128, 40960),
    ModelSpec("Qwen/Qwen3-32B", 32.8, 32.8, 64, 5120, 64, 8, 128, 40960),
    # 48 x 128 x 3 x 2048 x 768 = 29.0 B expert parameters; 8 of 128 experts per token
    ModelSpec(
        "Qwen/Qwen3-30B-A3B", 30.5, 3.3, 48, 2048, 32, 4, 128, 40960,
        is_moe=True, expert_params_b=29.0, num_experts=128, experts_per_token=8,
    ),
    # 94 x 128 x 3 x 4096 x 1536 = 227 B expert parameters
    ModelSpec(
        "Qwen/Qwen3-235B-A22B", 235.0, 22.0, 94, 4096, 64, 4, 128, 40960,
        is_moe=True, expert_params_b=227.0, num_experts=128, experts_per_token=8,
    ),
    ModelSpec(
        "Qwen/Qwen3-235B-A22B-Instruct-2507", 235.0, 22.0, 94, 4096, 64, 4, 128, 262144,
        is_moe=True, expert_params_b=227.0, num_experts=128, experts_per_token=8,
    ),
    # Hybrid: Gated DeltaNet (linear attention, no KV cache) in 3 of every 4 layers, full
    # attention every 4th (full_attention_interval=4): 8 of 32 layers keep a KV cache.
    ModelSpec(
        "Qwen/Qwen3.5-9B", 9.0, 9.0, 32, 4096, 16, 4, 256, 262144,
        kv_layers=8, mtp_layers=1,
    ),
)

# suffix (lower case) -> normalised quantization
_QUANT_SUFFIXES: tuple[tuple[str, str], ...] = (
    ("-gptq-int4", "gptq-int4"),
    ("-gptq-int8", "gptq-int8"),
    ("-fp8", "fp8"),
    ("-awq", "awq"),
    ("-w8a8", "w8a8"),
)

_BY_KEY = {m.name.split("/")[-1].lower(): m for m in _BASE}


def known_names() -> list[str]:
    return [m.name for m in _BASE]


def _basename(name: str) -> str:
    return re.split(r"[\\/]", name.rstrip("/\\"))[-1]


def lookup(name: str) -> ModelSpec:
    """The simulated model ``name`` refers to (HF id, bare name or local path)."""
    key = _basename(name).lower()
    quant = None
    for suffix, q in _QUANT_SUFFIXES:
        if key.endswith(suffix):
            key, quant = key[: -len(suffix)], q
            break
    base = _BY_KEY.get(key)
    if base is None:
        raise UnknownModel(name)
    return replace(base, quant=quant) if quant else base
