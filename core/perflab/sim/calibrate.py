"""Calibration of the performance model against the seeds (``python -m perflab.sim.calibrate``).

Runs the seeds' ShareGPT benchmark (1000 requests sent at once) offline through the scheduler
and performance model, and prints the simulated total token throughput next to the seed's.
The engine factors here are the ones suggested to the front ends (docs/simulator.md); the
front ends own the final values.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from perflab.sim import catalog, models, perfmodel
from perflab.sim.scheduler import OfflineResult, simulate


def sharegpt_like(n: int = 1000, seed: int = 0, mean_in: float = 217.0, mean_out: float = 201.0) -> list[tuple[float, int, int]]:
    """(arrival, prompt tokens, output tokens) shaped like ``vllm bench serve``'s ShareGPT
    sample: log-normal lengths with the seeds' means (217 in / 201 out per request), prompts
    and outputs of at least 4 tokens, prompt <= 1024, prompt + output <= 2048, all arriving
    at once (request rate inf)."""
    rng = random.Random(seed)
    sigma = 1.0
    out: list[tuple[float, int, int]] = []
    while len(out) < n:
        p = int(rng.lognormvariate(math.log(mean_in) - sigma * sigma / 2, sigma))
        o = int(rng.lognormvariate(math.log(mean_out) - sigma * sigma / 2, sigma))
        if p < 4 or o < 4 or p > 1024 or p + o > 2048:
            continue
        out.append((0.0, p, o))
    return out


@dataclass(frozen=True)
class Case:
    label: str
    model: str
    machine: str
    seed_total_tps: float | None  # the seed's "Total Token throughput", None if not measured
    knobs: dict[str, object] = field(default_factory=dict)


# Seed numbers: /work/shared/fixtures/seeds/seed_results.json (ShareGPT rows).
CASES: tuple[Case, ...] = (
    Case("A100 Qwen3-32B vLLM", "Qwen/Qwen3-32B", "a100-80g-x1", 1730.98, {"max_model_len": 32768}),
    Case("A100 Qwen3-32B TensorRT-LLM", "Qwen/Qwen3-32B", "a100-80g-x1", 2054.21,
         {"efficiency": 1.15, "max_num_seqs": 2048, "max_batched_tokens": 8192}),
    Case("A100 Qwen3-32B SGLang", "Qwen/Qwen3-32B", "a100-80g-x1", 1398.38, {"efficiency": 0.85, "mem_fraction": 0.88}),
    # Marlin W8A16 GEMMs lose to BF16 ones at large decode batches
    Case("A100 Qwen3-32B-FP8 vLLM", "Qwen/Qwen3-32B-FP8", "a100-80g-x1", 1563.33, {"quant": "fp8", "decode_efficiency": 0.75}),
    Case("A100 Qwen3-32B-AWQ vLLM", "Qwen/Qwen3-32B-AWQ", "a100-80g-x1", 1767.21, {"quant": "awq"}),
    Case("8xA100 Qwen3-235B-A22B-2507 vLLM tp8", "Qwen/Qwen3-235B-A22B-Instruct-2507", "a100-80g-x8", 3792.50,
         {"tp": 8, "max_model_len": 40960, "efficiency": 0.7}),
    Case("8xA100 Qwen3-235B-A22B-2507-FP8 vLLM tp4", "Qwen/Qwen3-235B-A22B-Instruct-2507-FP8", "a100-80g-x8",
         3019.19, {"tp": 4, "quant": "fp8", "max_model_len": 40960, "efficiency": 0.7}),
    Case("910B Qwen3-30B-A3B MindIE tp2", "Qwen/Qwen3-30B-A3B", "910b3-x8", 4712.47,
         {"tp": 2, "max_num_seqs": 200, "efficiency": 0.85}),
    # vLLM-Ascend 0.9.1 runs eagerly (no graph mode): a large fixed cost per step
    Case("910B Qwen3-30B-A3B vLLM-Ascend tp2", "Qwen/Qwen3-30B-A3B", "910b3-x8", 1227.19,
         {"tp": 2, "efficiency": 0.6, "overhead_ms": 100.0}),
    Case("H100 Qwen3.5-9B vLLM", "Qwen/Qwen3.5-9B", "h100-80g-x1", 11527.14, {"max_model_len": 32768, "efficiency": 0.85}),
)


def run_case(case: Case, workload: list[tuple[float, int, int]] | None = None,
             max_concurrency: int | None = None) -> OfflineResult:
    model = models.lookup(case.model)
    chip = catalog.get(case.machine).chip
    knobs = perfmodel.Knobs(**case.knobs)  # type: ignore[arg-type]
    plan = perfmodel.memory_plan(model, chip, knobs)
    cost = perfmodel.build_cost_model(model, chip, knobs)
    return simulate(workload or sharegpt_like(), cost, knobs, plan.kv_capacity_tokens, max_concurrency=max_concurrency)


def main() -> None:
    workload = sharegpt_like()
    print(f"{'case':44s} {'sim tok/s':>10s} {'seed tok/s':>10s} {'ratio':>6s} {'TTFT s':>7s} {'TPOT ms':>8s}")
    for case in CASES:
        r = run_case(case, workload)
        seed = case.seed_total_tps
        ratio = f"{r.total_token_throughput / seed:6.2f}" if seed else "     -"
        print(f"{case.label:44s} {r.total_token_throughput:10.0f} {seed or 0:10.0f} {ratio} "
              f"{r.mean_ttft:7.1f} {r.mean_tpot * 1000:8.1f}")


if __name__ == "__main__":
    main()
