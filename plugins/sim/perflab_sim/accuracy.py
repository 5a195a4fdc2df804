"""The simulated engines' accuracy model: how well each simulated model answers perflab's
shipped task (:mod:`perflab.accuracy.tasks`), and what each quantization method, KV-cache
dtype and speculative method does to its answers. Every figure is declared once, here, with
the published source it comes from; :mod:`perflab_sim.answers` applies them to the text the
engines write, and docs/simulator.md ("The accuracy model") lists them.

Two kinds of effect:

- **score drop** (points on the shipped task, gsm8k's format and metric): the difference a
  model card or engine doc reports between the BF16 model and the optimized one on GSM8K
  (lm-evaluation-harness, strict-match), applied to the simulated model's base score. A
  method whose published score is *higher* than the BF16 one drops 0 (the simulator never
  rewards a lossy option);
- **divergence** (agreement with the baseline's greedy answers): the fraction of greedy
  answers to the agreement prompts that change, where in the answer the change starts, and
  the per-token log-probability shift. No engine or model card publishes these for the
  methods below, so they are perflab's assumptions, ordered as the literature orders them
  (Dutta et al., "Accuracy is Not All You Need", NeurIPS 2024, arXiv:2407.09141: 8-bit
  weights flip few answers, 4-bit weights many) and sized so that an 8-bit method stays
  within a 10-point margin of the noise floor on 32 prompts and a 4-bit one does not.

Real engines are not batch-invariant (the :data:`BATCH` effect): the same greedy request can
come out different when other requests share its batch, late in the answer. A speculative
method is lossless under greedy sampling (vLLM's rejection sampler accepts a draft token only
where it equals the target model's own choice) but changes the shapes the kernels see, so it
diverges like batching does.
"""

from __future__ import annotations

from dataclasses import dataclass

REDHAT_W4A16 = "https://huggingface.co/RedHatAI/Qwen3-32B-quantized.w4a16"
REDHAT_FP8_8B = "https://huggingface.co/RedHatAI/Qwen3-8B-FP8-dynamic"
REDHAT_FP8_30B = "https://huggingface.co/RedHatAI/Qwen3-30B-A3B-FP8-dynamic"
REDHAT_W8A8 = "https://huggingface.co/RedHatAI/Qwen2.5-7B-Instruct-quantized.w8a8"
LLMC_FP8_KV = "https://github.com/vllm-project/llm-compressor/blob/main/examples/quantization_kv_cache/README.md"
VLLM_KV_DOC = "https://docs.vllm.ai/en/latest/features/quantization/quantized_kvcache/"
VLLM_SPEC_DOC = "https://docs.vllm.ai/en/latest/features/spec_decode/#lossless-guarantees-of-speculative-decoding"
NONDETERMINISM = "https://thinkingmachines.ai/blog/defeating-nondeterminism-in-llm-inference/"
FLIPS = "https://arxiv.org/abs/2407.09141"


@dataclass(frozen=True)
class BaseScore:
    """A simulated model's skill: its score (points) on the shipped task at BF16."""

    score: float
    source: str
    figure: str


@dataclass(frozen=True)
class Effect:
    """What one serving option does to a model's answers."""

    name: str  # how reports and docs name it
    drop: float  # points of score lost on the shipped task
    diverge: float  # fraction (0..1) of greedy agreement answers that change
    late: bool  # True: a changed answer changes in its second half (batch-like); False: anywhere
    logprob_noise: float  # nats: the largest per-token shift of the returned log-probabilities
    source: str  # where the score figure comes from (URL)
    figure: str  # the published figure the drop is derived from


# The simulated models' base scores: RedHat's BF16 evaluations of the Qwen3 models on GSM8K
# (5-shot, strict-match, lm-evaluation-harness on vLLM) in their quantized models' cards. The
# shipped task is easier than GSM8K; taking GSM8K's score is perflab's assumption: the
# simulated model is as good at it as at GSM8K.
BASE_SCORES: dict[str, BaseScore] = {
    "Qwen/Qwen3-32B": BaseScore(87.64, REDHAT_W4A16, "Qwen3-32B GSM-8K (5-shot, strict-match) 87.64"),
    "Qwen/Qwen3-8B": BaseScore(75.97, REDHAT_FP8_8B, "Qwen3-8B GSM-8K (5-shot, strict-match) 75.97"),
    "Qwen/Qwen3-30B-A3B": BaseScore(87.26, REDHAT_FP8_30B, "Qwen3-30B-A3B GSM-8K (5-shot, strict-match) 87.26"),
}
# Models without a published figure in these sources: Qwen3-32B's, an assumption.
DEFAULT_BASE = "Qwen/Qwen3-32B"

# Quantization methods (the simulator's normalised names, perflab.models / frontends).
_INT4 = Effect(
    "INT4 weights (W4A16)", drop=round(87.64 - 85.97, 2), diverge=0.35, late=False, logprob_noise=0.08,
    source=REDHAT_W4A16,
    figure="Qwen3-32B 87.64 -> Qwen3-32B-quantized.w4a16 (GPTQ, group 128) 85.97 on GSM-8K (5-shot, strict-match)")
_FP8 = Effect(
    "FP8 weights and activations", drop=round(87.26 - 86.73, 2), diverge=0.04, late=False, logprob_noise=0.02,
    source=REDHAT_FP8_30B,
    figure="Qwen3-30B-A3B 87.26 -> Qwen3-30B-A3B-FP8-dynamic 86.73 on GSM-8K (5-shot, strict-match)")
_INT8 = Effect(
    "INT8 weights (and activations)", drop=0.0, diverge=0.04, late=False, logprob_noise=0.02,
    source=REDHAT_W8A8,
    figure="Qwen2.5-7B-Instruct 80.36 -> Qwen2.5-7B-Instruct-quantized.w8a8 80.74 on GSM-8K (5-shot, strict-match): no loss")
QUANTIZATION: dict[str, Effect] = {
    "fp8": _FP8,
    "w8a8": _INT8,
    "gptq-int8": _INT8,
    "awq": _INT4,
    "gptq-int4": _INT4,
    "gptq": _INT4,
}
# A method the table does not name is taken to be as lossy as 4-bit weights: the gate must not
# pass an optimization nobody measured.
UNKNOWN_QUANTIZATION = _INT4

KV_CACHE: dict[str, Effect] = {
    "fp8": Effect(
        "FP8 KV cache", drop=0.0, diverge=0.04, late=False, logprob_noise=0.03, source=LLMC_FP8_KV,
        figure=("Meta-Llama-3-8B-Instruct with FP8 weights, activations and KV cache (kv_cache_dtype=fp8) scores 0.7763 "
                "on GSM-8K (5-shot, strict-match); vLLM's docs: FP8 E4M3 'typically only minimally degrades inference "
                f"accuracy' ({VLLM_KV_DOC})")),
}
for _alias in ("fp8_e4m3", "fp8_e5m2", "fp8_inc", "int8"):
    KV_CACHE[_alias] = KV_CACHE["fp8"]

# Non-batch-invariance: the same greedy request, alone or in a batch, returns answers that
# agree early and may part late (Thinking Machines: 1000 greedy completions of one prompt on
# vLLM under varying load gave 80 distinct texts, identical for their first 102 tokens).
BATCH = Effect(
    "batch non-invariance", drop=0.0, diverge=0.06, late=True, logprob_noise=0.002, source=NONDETERMINISM,
    figure="Qwen3-235B-A22B-Instruct-2507, temperature 0, 1000 completions: 80 unique, first difference at token 103")

SPECULATIVE = Effect(
    "speculative decoding (greedy)", drop=0.0, diverge=BATCH.diverge, late=True, logprob_noise=BATCH.logprob_noise,
    source=VLLM_SPEC_DOC,
    figure="lossless under greedy sampling up to the numerics of batched verification (vLLM's docs)")


def base_score(model: str) -> BaseScore:
    """The base score of the simulated model ``model`` (its canonical Hugging Face id)."""
    return BASE_SCORES.get(model) or BASE_SCORES[DEFAULT_BASE]


def quantization_effect(quant: str | None) -> Effect | None:
    if quant is None or quant.lower() in ("none", "bf16", "fp16", "auto"):
        return None
    return QUANTIZATION.get(quant.lower(), UNKNOWN_QUANTIZATION)


def kv_cache_effect(kv_cache_dtype: str | None) -> Effect | None:
    kv = (kv_cache_dtype or "auto").lower()
    if kv in ("auto", "bf16", "bfloat16", "fp16", "float16", "half", "float32"):
        return None
    return KV_CACHE.get(kv, KV_CACHE["fp8"] if kv.startswith("fp8") else UNKNOWN_QUANTIZATION)


def speculative_effect(spec_method: str | None) -> Effect | None:
    return SPECULATIVE if spec_method else None


@dataclass(frozen=True)
class Profile:
    """The accuracy of one simulated serving configuration."""

    model: str  # the base model's canonical id (the answers' identity)
    base: BaseScore
    effects: tuple[Effect, ...]  # the configuration's own (quantization, KV cache, speculative)

    @property
    def score(self) -> float:
        """Points on the shipped task: the base score less every effect's drop."""
        return max(0.0, self.base.score - sum(e.drop for e in self.effects))


def profile(model: str, quant: str | None, kv_cache_dtype: str | None, spec_method: str | None) -> Profile:
    effects = tuple(e for e in (quantization_effect(quant), kv_cache_effect(kv_cache_dtype),
                                speculative_effect(spec_method)) if e is not None)
    return Profile(model, base_score(model), effects)
