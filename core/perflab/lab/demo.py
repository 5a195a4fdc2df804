"""``perflab demo``: seed 002 (Qwen3-32B on 8×A100), scaled down, on the simulator.

The study is the seed's: vLLM vs SGLang vs TensorRT-LLM on defaults with ShareGPT; FP8 and
AWQ checkpoints on the winner and on vLLM (and FP8 on SGLang, which seed 001 notes does not
work on A100); max batched tokens 16k/32k; then baseline and optimized on the five
workloads. ShareGPT keeps the seed's 1000 prompts, the other workloads the seed's lengths with
fewer prompts, and simulated time runs 40 times faster than real time, so the whole study
takes about two minutes of wall-clock time on two cores.

The plan's accuracy gate scores every configuration on perflab's shipped task and compares its
greedy answers with its engine's reference (perflab.lab.accuracy): the simulated AWQ checkpoint
loses more than a point and is rejected. Without lm-evaluation-harness (``perflab[accuracy]``)
the demo keeps the agreement check only, and says so.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from perflab.lab.plan import Plan, load_plan_text

DEMO_PLAN = """\
# perflab demo: seed 002_df97046e8f66ab3a.txt, scaled down, on simulated engines.
name: demo-qwen3-32b-a100
title: Optimizing Qwen3-32B Throughput on NVIDIA A100 GPUs (perflab demo)
model:
  id: Qwen/Qwen3-32B
  name: Qwen3-32B
hardware: sim:a100-80g-x8
simulation:
  time_scale: 40          # simulated seconds per wall-clock second
engines: [vllm, sglang, trtllm]
engine_serve:
  vllm: {max_model_len: 32768}     # seed 002: vllm serve Qwen/Qwen3-32B --max-model-len 32768
baseline:
  engine: vllm
  label: vLLM without any optimizations
candidates:
  - name: Quantization
    engines: [winner, vllm]
    variants:
      - name: FP8
        set: {model: Qwen/Qwen3-32B-FP8}
        engines: [winner, vllm, sglang]
      - name: AWQ
        set: {model: Qwen/Qwen3-32B-AWQ}
  - name: Max Batched Token Numbers
    variants:
      - {name: "16k", set: {max_batched_tokens: 16384}}
      - {name: "32k", set: {max_batched_tokens: 32768}}
profiles:
  # ShareGPT keeps the seed's 1000 prompts (the engines' ranking needs a full batch); the
  # other workloads keep the seed's lengths with fewer prompts
  sharegpt: {label: ShareGPT, dataset: synthetic-sharegpt, num_prompts: 1000}
  short: {label: Short Prompt, input_len: 128, output_len: 4, num_prompts: 200, seed: 42}
  medium: {label: Medium Prompt, input_len: 2000, output_len: 100, num_prompts: 50, seed: 42}
  long: {label: Long Prompt, input_len: 4000, output_len: 200, num_prompts: 30, seed: 42}
  very-long: {label: Very Long Prompt, input_len: 32000, output_len: 100, num_prompts: 3, seed: 42}
main_profile: sharegpt
min_success_rate: 0.9
# an illustrative on-demand price per A100-hour: the report shows cost per million output tokens
cost: {per_accelerator_hour: 2.50, currency: USD}
timeouts: {startup_s: 120, benchmark_s: 300}
# the accuracy gate: every configuration scored on the shipped offline task (all 200 items: a
# half-point resolution) and its greedy answers compared with its engine's reference; a drop of
# more than a point below the baseline's score, or agreement below the reference's noise floor
# by more than 10 points, rejects it
accuracy:
  task: perflab_arith
  max_drop: 1.0
  timeout_s: 300
notes:
  - This is a scaled-down reproduction of a published study (fewer prompts on the random workloads) on simulated engines.
"""


TASK_LINE = "  task: perflab_arith\n"


def harness_missing() -> str | None:
    """Why the demo cannot score its task (lm-eval is not installed), or None."""
    from perflab.accuracy.harness import ensure_available
    from perflab.contract.errors import PerflabError

    try:
        ensure_available()
    except PerflabError as exc:
        return str(exc)
    return None


def demo_plan(known_engines: Iterable[str] | None = None) -> Plan:
    text = DEMO_PLAN
    if harness_missing() is not None:  # agreement needs no extra: the demo still gates on it
        text = text.replace(TASK_LINE, "  task: null  # lm-evaluation-harness is not installed: agreement only\n")
    return load_plan_text(text, path=Path("demo-plan.yaml"), known_engines=known_engines)
