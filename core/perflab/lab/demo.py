"""``perflab demo``: seed 002 (Qwen3-32B on 8×A100), scaled down, on the simulator.

The study is the seed's: vLLM vs SGLang vs TensorRT-LLM on defaults with ShareGPT; FP8 and
AWQ checkpoints on the winner and on vLLM (and FP8 on SGLang, which seed 001 notes does not
work on A100); max batched tokens 16k/32k; then baseline and optimized on the five
workloads. Prompt counts and lengths are scaled down and simulated time runs compressed, so
the whole study takes a few minutes of wall-clock time on two cores.
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
  sharegpt: {label: ShareGPT, dataset: synthetic-sharegpt, num_prompts: 120}
  short: {label: Short Prompt, input_len: 128, output_len: 4, num_prompts: 120}
  medium: {label: Medium Prompt, input_len: 2000, output_len: 100, num_prompts: 60}
  long: {label: Long Prompt, input_len: 4000, output_len: 200, num_prompts: 60}
  very-long: {label: Very Long Prompt, input_len: 32000, output_len: 100, num_prompts: 12}
main_profile: sharegpt
min_success_rate: 0.9
timeouts: {startup_s: 120, benchmark_s: 300}
notes:
  - This is a scaled-down reproduction of a published study (fewer and shorter prompts) on simulated engines.
"""


def demo_plan(known_engines: Iterable[str] | None = None) -> Plan:
    return load_plan_text(DEMO_PLAN, path=Path("demo-plan.yaml"), known_engines=known_engines)
