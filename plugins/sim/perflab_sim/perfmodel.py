"""The performance model of a continuous-batching engine on a simulated accelerator.

Pure functions of (model shape, chip, engine knobs). The scheduler (:mod:`perflab_sim.scheduler`)
decides what one step computes; :meth:`CostModel.step_time` says how long that step takes:

- **weights**: every step reads the weights once, ``bytes/param x params / (tp x pp)`` over
  sustained HBM bandwidth. MoE models read the dense part always and, of the routed experts,
  the fraction that the step's tokens activate: ``1 - (1 - k/E)^tokens``, which grows with
  the batch towards all of them.
- **KV cache**: decode attention reads every running sequence's context, ``kv bytes/token x
  context tokens``, over the same bandwidth.
- **compute**: ``2 x active params`` FLOPs per token processed (prefill tokens and decode
  tokens alike; under speculative decoding each sequence verifies ``k + 1`` positions) plus
  prefill attention ``4 x layers x q_heads x head_dim x context`` per token, over sustained peak
  for the weights' number format (FP8 only where the chip has FP8 units; otherwise a
  weight-only kernel at a BF16 rate with a dequantisation penalty).
- a step takes ``max(memory time, compute time)`` (the roofline) plus tensor-parallel
  all-reduces (two per layer, ring algorithm, latency + bytes over link bandwidth), MoE
  all-to-all under expert parallelism, draft-model time under speculative decoding, and the
  engine's fixed per-step overhead.

Engine differences enter only through the knobs' efficiency factors and overhead (chosen by
the front ends). Calibration against the seeds: docs/simulator.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from perflab.models import ModelSpec
from perflab_sim.catalog import ChipSpec, Machine

GIB = 1024**3

# Weight bytes per parameter by checkpoint format. 4-bit formats carry one fp16 scale (and
# zero point) per group of 128 weights.
_BYTES_PER_PARAM = {
    None: 2.0,
    "bf16": 2.0,
    "fp16": 2.0,
    "fp8": 1.0,
    "w8a8": 1.0,
    "gptq-int8": 1.0,
    "awq": 0.53,
    "gptq-int4": 0.53,
    "gptq": 0.53,
}

# Default acceptance rate per proposed token, by speculative method (typical published
# figures on chat data; the seeds' MTP run accepted most of 4 drafts).
_SPEC_ACCEPTANCE = {"mtp": 0.75, "eagle": 0.7, "eagle3": 0.75, "draft_model": 0.7, "ngram": 0.35, "medusa": 0.6}


def bytes_per_param(quant: str | None) -> float:
    return _BYTES_PER_PARAM.get(quant, 2.0)


def kv_dtype_bytes(kv_cache_dtype: str | None) -> float:
    kv = (kv_cache_dtype or "auto").lower()
    if kv.startswith("fp8") or kv in ("int8", "int8_e4m3"):
        return 1.0
    return 2.0


def compute_tflops(chip: ChipSpec, quant: str | None) -> float:
    """Peak dense TFLOPS the GEMMs of a checkpoint in ``quant`` run at on ``chip``.

    FP8 uses FP8 tensor cores only where they exist (Hopper); elsewhere (A100, 910B) engines
    run FP8 checkpoints as weight-only W8A16 (vLLM's Marlin kernels), dequantising to BF16:
    the weights shrink, the math does not get faster and pays a dequantisation penalty.
    """
    if quant == "fp8":
        return chip.fp8_tflops if chip.fp8_tflops else chip.bf16_tflops * 0.75
    if quant == "w8a8":
        return chip.int8_tops * 0.85  # per-token activation quantisation costs a little
    if quant in ("awq", "gptq-int4", "gptq", "gptq-int8"):
        return chip.bf16_tflops * 0.8  # W4A16 / W8A16 weight-only kernels
    return chip.bf16_tflops


def expected_tokens_per_step(spec_tokens: int, acceptance: float) -> float:
    """Tokens a sequence emits per verification step with ``spec_tokens`` drafts, each accepted
    with probability ``acceptance`` given the previous ones were: ``(1 - a^(k+1)) / (1 - a)``."""
    if spec_tokens <= 0:
        return 1.0
    if acceptance >= 1.0:
        return float(spec_tokens + 1)
    return (1.0 - acceptance ** (spec_tokens + 1)) / (1.0 - acceptance)


def default_acceptance(method: str | None) -> float:
    return _SPEC_ACCEPTANCE.get((method or "").lower(), 0.6)


def expert_fraction(tokens: int, num_experts: int, experts_per_token: int) -> float:
    """Expected fraction of routed experts that ``tokens`` tokens activate (uniform routing)."""
    if num_experts <= 0 or tokens <= 0:
        return 0.0
    return 1.0 - (1.0 - experts_per_token / num_experts) ** tokens


# Bytes of peak activation memory per token of the token budget and per unit of hidden size,
# reserved before the KV cache: the engines size their KV cache after a profiling forward pass
# of ``max_batched_tokens`` tokens (vLLM ``Worker.determine_available_memory``; TensorRT-LLM's
# KV-cache estimation run). 24 fits vLLM; engines with their own figure set ``activation_bytes``.
ACTIVATION_BYTES = 24.0


@dataclass(frozen=True)
class Knobs:
    """The engine configuration the model depends on (one data-parallel rank)."""

    tp: int = 1
    pp: int = 1
    ep: int = 1  # > 1: routed experts split across ranks instead of tensor-sliced
    quant: str | None = None
    kv_cache_dtype: str = "auto"
    mem_fraction: float = 0.9
    max_model_len: int | None = None  # None: the model's context length
    max_num_seqs: int = 256
    max_batched_tokens: int = 8192
    chunked_prefill: bool = True
    prefix_caching: bool = False
    spec_method: str | None = None
    spec_tokens: int = 0
    spec_acceptance: float | None = None  # None: the method's default
    efficiency: float = 1.0
    decode_efficiency: float = 1.0
    prefill_efficiency: float = 1.0
    overhead_ms: float = 0.5
    block_size: int = 16
    # bytes of peak activations (and runtime buffers sized by the token budget) per token of
    # max_batched_tokens and per unit of the model's hidden size: reserved before the KV cache
    activation_bytes: float = ACTIVATION_BYTES
    # how KV blocks are handed out (perflab_sim.scheduler): "max_utilization" (vLLM: as
    # tokens are computed, preempting when out) or "guaranteed_no_evict" (TensorRT-LLM)
    capacity_policy: str = "max_utilization"

    @property
    def devices(self) -> int:
        return self.tp * self.pp

    @property
    def acceptance(self) -> float:
        return self.spec_acceptance if self.spec_acceptance is not None else default_acceptance(self.spec_method)


def weight_bytes(model: ModelSpec, quant: str | None) -> float:
    return model.params_b * 1e9 * bytes_per_param(quant)


def kv_bytes_per_token(model: ModelSpec, kv_cache_dtype: str = "auto", tp: int = 1, pp: int = 1) -> float:
    """KV-cache bytes one token occupies on one device: K and V for each attention layer of
    this pipeline stage, for the KV heads of this tensor-parallel rank (heads are replicated
    when there are fewer than ``tp``)."""
    heads = max(1, math.ceil(model.kv_heads / tp))
    layers = math.ceil(model.attention_layers / pp)
    return 2.0 * layers * heads * model.head_dim * kv_dtype_bytes(kv_cache_dtype)


@dataclass(frozen=True)
class MemoryPlan:
    """Where one device's memory goes (GiB) and what that leaves for the KV cache."""

    total_gib: float
    budget_gib: float  # mem_fraction x total
    weights_gib: float
    reserve_gib: float  # activations, graphs, communication buffers
    kv_gib: float
    kv_bytes_per_token: float
    kv_capacity_tokens: int  # tokens of KV cache this rank holds
    max_model_len: int

    @property
    def fits(self) -> bool:
        """The weights and the runtime reserve fit in the budget, leaving some KV cache."""
        return self.kv_gib > 0 and self.kv_capacity_tokens >= 16

    @property
    def max_len_fits(self) -> bool:
        """One request of ``max_model_len`` tokens fits in the KV cache (vLLM's startup check)."""
        return self.kv_capacity_tokens >= self.max_model_len

    @property
    def needed_kv_gib_for_max_len(self) -> float:
        return self.max_model_len * self.kv_bytes_per_token / GIB

    @property
    def used_mib(self) -> int:
        """Device memory the engine holds once loaded: its whole budget (engines preallocate)."""
        return int(self.budget_gib * 1024)

    def reason(self) -> str:
        if not self.fits:
            return (
                f"model weights take {self.weights_gib:.2f} GiB and the runtime {self.reserve_gib:.2f} GiB per device, "
                f"more than the {self.budget_gib:.2f} GiB budget (memory fraction x {self.total_gib:.2f} GiB)"
            )
        if not self.max_len_fits:
            return (
                f"max model len {self.max_model_len} needs {self.needed_kv_gib_for_max_len:.2f} GiB of KV cache, "
                f"only {self.kv_gib:.2f} GiB available"
            )
        return "fits"


# The engine's start-up and teardown on its model clock (engine seconds), what a launch costs
# besides its benchmarks: each rank reads its shard of the weights (safetensors from local NVMe
# or the page cache, in parallel across ranks) at LOAD_GIB_S, then the engine initialises —
# memory profiling, KV-cache allocation, CUDA/ACL graph capture, warm-up compilation — for
# INIT_S (vLLM logs 20-60 s for "init engine (profile, create kv cache, warmup model)" on one
# GPU); teardown frees the devices in TEARDOWN_S. The host's pace never enters: the simulated
# process starts in well under a second whatever it reports (perflab_sim.lifecycle).
LOAD_GIB_S = 2.0
INIT_S = 40.0
TEARDOWN_S = 5.0


def startup_s(memory: MemoryPlan) -> float:
    """Engine seconds from launch to serving: loading one rank's weights, then initialising."""
    return memory.weights_gib / LOAD_GIB_S + INIT_S


def reserve_gib(model: ModelSpec, max_batched_tokens: int, activation_bytes: float, devices: int) -> float:
    """What a rank keeps before its KV cache: peak activations of a ``max_batched_tokens``
    forward pass, sampler logits, CUDA graphs / ACL graphs and non-torch allocations, and
    communication buffers when sharded (GiB). The simulated TensorRT-LLM's runtime sizes its
    memory fraction with the same figure (``frontends/trtllm.py``)."""
    return 1.0 + max_batched_tokens * model.hidden * activation_bytes / GIB + (0.5 if devices > 1 else 0.0)


def memory_plan(model: ModelSpec, chip: ChipSpec, knobs: Knobs) -> MemoryPlan:
    total = chip.memory_mib / 1024.0
    budget = knobs.mem_fraction * total
    devices = knobs.devices
    weights = weight_bytes(model, knobs.quant) / devices / GIB
    if knobs.spec_method in ("mtp", "eagle", "eagle3") and knobs.spec_tokens > 0:
        # one extra decoder layer (MTP head / EAGLE draft layer) in the checkpoint's format
        weights += model.params_b * 1e9 / model.layers * bytes_per_param(knobs.quant) / devices / GIB
    reserve = reserve_gib(model, knobs.max_batched_tokens, knobs.activation_bytes, devices)
    kv_gib = budget - weights - reserve
    per_token = kv_bytes_per_token(model, knobs.kv_cache_dtype, knobs.tp, knobs.pp)
    capacity = int(max(0.0, kv_gib) * GIB / per_token)
    capacity -= capacity % knobs.block_size
    return MemoryPlan(
        total_gib=total,
        budget_gib=budget,
        weights_gib=weights,
        reserve_gib=reserve,
        kv_gib=kv_gib,
        kv_bytes_per_token=per_token,
        kv_capacity_tokens=capacity,
        max_model_len=knobs.max_model_len or model.context_len,
    )


@dataclass(frozen=True)
class StepShape:
    """What one scheduler step computes."""

    decode_seqs: int = 0  # sequences generating this step
    decode_context: int = 0  # sum of their context lengths (KV read by attention)
    prefill_tokens: int = 0  # prompt tokens computed this step (all chunks)
    prefill_attention: float = 0.0  # sum over prefill tokens of the context each attends to


@dataclass(frozen=True)
class CostModel:
    """Per-step costs of one engine rank, precomputed so ``step_time`` is a few multiplications."""

    dense_read_s: float  # read the always-used weights once
    expert_read_s: float  # read all routed experts once (MoE)
    num_experts: int
    experts_per_token: int
    kv_read_s_per_token: float  # read one context token's KV cache
    decode_s_per_token: float  # GEMM time of one decode position
    prefill_s_per_token: float  # GEMM time of one prompt token
    attention_s_per_token_ctx: float  # prefill attention time per (token x context token)
    comm_s_per_step: float  # fixed collective latency per step
    comm_s_per_token: float  # collective bytes per token processed
    overhead_s: float
    spec_tokens: int
    draft_s_per_step: float

    @property
    def positions_per_decode_seq(self) -> int:
        return 1 + self.spec_tokens

    def split(self, shape: StepShape) -> tuple[float, float]:
        """(memory s, compute s) of one step with ``shape``: the time its weight and KV reads
        take at the sustained bandwidth, and its GEMMs and attention at the sustained FLOPs
        (the step takes the longer of the two, plus collectives, drafting and overhead)."""
        tokens = shape.decode_seqs * self.positions_per_decode_seq + shape.prefill_tokens
        if tokens <= 0:
            return 0.0, 0.0
        frac = expert_fraction(tokens, self.num_experts, self.experts_per_token) if self.num_experts else 0.0
        mem = self.dense_read_s + self.expert_read_s * frac + self.kv_read_s_per_token * shape.decode_context
        compute = (
            self.decode_s_per_token * shape.decode_seqs * self.positions_per_decode_seq
            + self.prefill_s_per_token * shape.prefill_tokens
            + self.attention_s_per_token_ctx * shape.prefill_attention
        )
        return mem, compute

    def step_time(self, shape: StepShape) -> float:
        """Seconds one step with ``shape`` takes (simulated time)."""
        tokens = shape.decode_seqs * self.positions_per_decode_seq + shape.prefill_tokens
        if tokens <= 0:
            return 0.0
        mem, compute = self.split(shape)
        draft = self.draft_s_per_step if shape.decode_seqs else 0.0
        return max(mem, compute) + self.comm_s_per_step + self.comm_s_per_token * tokens + draft + self.overhead_s


def build_cost_model(model: ModelSpec, chip: ChipSpec, knobs: Knobs) -> CostModel:
    devices = knobs.devices
    pp_eff = 1.0 if knobs.pp == 1 else 0.85  # pipeline bubbles
    eff = max(knobs.efficiency, 1e-3)
    bw = chip.hbm_gbps * 1e9 * chip.hbm_efficiency * eff * knobs.decode_efficiency * pp_eff
    bpp = bytes_per_param(knobs.quant)
    dense_bytes = model.dense_params_b * 1e9 * bpp / devices
    expert_bytes = model.expert_params_b * 1e9 * bpp / devices
    ep_imbalance = 1.15 if knobs.ep > 1 and model.is_moe else 1.0  # the busiest rank sets the pace
    flops = compute_tflops(chip, knobs.quant) * 1e12 * chip.mfu * eff * pp_eff
    # attention runs in BF16 whatever the weights' format, at its own sustained fraction
    attention_mfu = chip.attention_mfu if chip.attention_mfu is not None else chip.mfu
    attn_peak = chip.bf16_tflops * 1e12 * attention_mfu * eff * pp_eff
    per_token_flops = 2.0 * model.active_params_b * 1e9 / devices
    if model.is_moe:
        # under expert parallelism the busiest rank sets the pace of the routed experts
        dense_share = model.dense_params_b / model.active_params_b
        per_token_flops *= dense_share + (1 - dense_share) * ep_imbalance
    attn_flops = 4.0 * model.attention_layers * model.q_heads * model.head_dim / devices
    kv_token = kv_bytes_per_token(model, knobs.kv_cache_dtype, knobs.tp, knobs.pp)
    # Tensor parallelism: two all-reduces of the hidden state per layer (ring: 2(n-1)/n of the
    # data over each link). Expert parallelism swaps the MoE layer's all-reduce for an
    # all-to-all dispatch + combine of each token's top-k expert inputs.
    comm_fixed = 0.0
    comm_token = 0.0
    if knobs.tp > 1:
        link = chip.interconnect_gbps / 2 * 1e9 * chip.link_efficiency
        n = knobs.tp
        comm_fixed = 2 * model.layers * chip.collective_latency_us * 1e-6
        comm_token = 2 * model.layers * (2 * (n - 1) / n) * model.hidden * 2 / link
        if knobs.ep > 1 and model.is_moe:
            a2a = 2 * model.layers * model.experts_per_token * model.hidden * 2 * (n - 1) / n / link / 2
            comm_token += a2a
            comm_fixed += 2 * model.layers * chip.collective_latency_us * 1e-6
    draft = 0.0
    if knobs.spec_tokens > 0 and knobs.spec_method not in (None, "ngram"):
        # each draft token runs one decoder layer plus the LM head, latency bound
        draft = knobs.spec_tokens * (dense_bytes / model.layers * 2 / bw + 0.15e-3)
    elif knobs.spec_tokens > 0:
        draft = knobs.spec_tokens * 0.05e-3  # n-gram lookup on the CPU
    return CostModel(
        dense_read_s=dense_bytes / bw,
        expert_read_s=expert_bytes * ep_imbalance / bw,
        num_experts=model.num_experts,
        experts_per_token=model.experts_per_token,
        kv_read_s_per_token=kv_token / bw,
        decode_s_per_token=per_token_flops / (flops * knobs.decode_efficiency),
        prefill_s_per_token=per_token_flops / (flops * knobs.prefill_efficiency),
        attention_s_per_token_ctx=attn_flops / (attn_peak * knobs.prefill_efficiency),
        comm_s_per_step=comm_fixed / eff,
        comm_s_per_token=comm_token / eff,
        overhead_s=knobs.overhead_ms / 1000.0,
        spec_tokens=max(0, knobs.spec_tokens),
        draft_s_per_step=draft,
    )


@dataclass(frozen=True)
class Deployment:
    """What the simulated engine runs on: model, machine, devices, knobs and memory (declared
    here, with the knobs and memory plan, so the lifecycle below the runtime can name it)."""

    model: ModelSpec
    machine: Machine
    devices: tuple[int, ...]  # all devices the engine uses (tp x pp x dp)
    knobs: Knobs
    memory: MemoryPlan
    max_model_len: int

    @property
    def world_size(self) -> int:
        return len(self.devices)
