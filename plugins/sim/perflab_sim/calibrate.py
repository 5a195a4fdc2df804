"""Calibration of the simulator against the seeds (``python -m perflab_sim.calibrate``).

Two suites, both offline (the scheduler and performance model run to completion in simulated
time, no server):

- ``roofline``: the seeds' ShareGPT benchmark (1000 requests sent at once) through the
  performance model with the engine factors suggested in docs/simulator.md — checks the
  hardware constants of :mod:`perflab_sim.catalog`;
- ``engines``: the seeds' own serving commands parsed by the simulated engines' front ends
  (their flags, defaults, efficiency factors and KV admission policies), on the seeds'
  workloads: ShareGPT for every seed that measured it, seed 002's four random workloads
  (128/4, 2000/100, 4000/200, 32000/100 at request rate inf) and seed 004's other GPUStack
  profiles. ``--demo`` uses the scaled-down prompt counts of ``perflab demo`` instead of the
  seed's.

Each row prints the simulated total token throughput next to the seed's, their ratio, and the
simulated mean TTFT / TPOT (with the seed's TPOT where it was measured).
"""

from __future__ import annotations

import argparse
import math
import random
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from perflab import models
from perflab_sim import catalog, perfmodel
from perflab_sim.config import SimEngineConfig
from perflab_sim.env import HARDWARE_ENV
from perflab_sim.scheduler import OfflineResult, simulate


def _lognormal_lengths(n: int, seed: int, means: tuple[float, float], sigmas: tuple[float, float],
                       to_int: Callable[[float], int]) -> list[tuple[float, int, int]]:
    """``n`` requests arriving at once, (0.0, prompt tokens, output tokens): log-normal lengths
    with ``means`` and ``sigmas`` (prompt, output), made whole by ``to_int``, kept as vLLM's
    ShareGPT sample filter keeps them (both >= 4, prompt <= 1024, prompt + output <= 2048)."""
    rng = random.Random(seed)
    mu_in, mu_out = (math.log(m) - s * s / 2 for m, s in zip(means, sigmas, strict=True))
    out: list[tuple[float, int, int]] = []
    while len(out) < n:
        a, b = to_int(rng.lognormvariate(mu_in, sigmas[0])), to_int(rng.lognormvariate(mu_out, sigmas[1]))
        if 4 <= a <= 1024 and b >= 4 and a + b <= 2048:
            out.append((0.0, a, b))
    return out


def sharegpt_like(n: int = 1000, seed: int = 0, mean_in: float = 217.0, mean_out: float = 201.0) -> list[tuple[float, int, int]]:
    """(arrival, prompt tokens, output tokens) shaped like ``vllm bench serve``'s ShareGPT
    sample: log-normal lengths with the seeds' means (217 in / 201 out per request), prompts
    and outputs of at least 4 tokens, prompt <= 1024, prompt + output <= 2048, all arriving
    at once (request rate inf)."""
    return _lognormal_lengths(n, seed, (mean_in, mean_out), (1.0, 1.0), int)


@dataclass(frozen=True)
class Case:
    label: str
    model: str
    machine: str
    seed_total_tps: float | None  # the seed's "Total Token throughput", None if not measured
    knobs: dict[str, object] = field(default_factory=dict)


# Seed numbers: tests/fixtures/seeds/seed_results.json (ShareGPT rows).
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


def roofline_rows() -> list[tuple[str, str, OfflineResult, float | None, float | None]]:
    workload = sharegpt_like()
    return [(case.label, "ShareGPT", run_case(case, workload), case.seed_total_tps, None) for case in CASES]


# engines: the seeds' commands through the front ends ------------------------------------------


def synthetic_sharegpt(n: int = 1000, seed: int = 0) -> list[tuple[float, int, int]]:
    """ShareGPT-like lengths as perflab.bench's ``synthetic-sharegpt`` draws them (means 217 /
    202 tokens, log-normal sigmas 0.9 / 0.8, vLLM's filter), all arriving at once."""
    return _lognormal_lengths(n, seed, (217.0, 202.0), (0.9, 0.8), round)


@dataclass(frozen=True)
class Workload:
    label: str
    prompts: int
    input_len: int | None = None  # None: ShareGPT-like lengths
    output_len: int | None = None
    max_concurrency: int | None = None  # None: no limit
    demo_prompts: int | None = None  # the prompt count ``perflab demo`` uses (lab/demo.py)
    request_rate: float | None = None  # requests per second, evenly spaced; None: all at once

    def requests(self, demo: bool = False) -> list[tuple[float, int, int]]:
        n = self.demo_prompts if demo and self.demo_prompts else self.prompts
        if self.input_len is None or self.output_len is None:
            out = synthetic_sharegpt(n)
        else:
            out = [(0.0, self.input_len, self.output_len)] * n
        if self.request_rate:
            out = [(i / self.request_rate, p, o) for i, (_, p, o) in enumerate(out)]
        return out


SHAREGPT = Workload("ShareGPT", 1000, demo_prompts=1000)
SHAREGPT_512 = Workload("ShareGPT (512 concurrent)", 1000, max_concurrency=512)
SHORT = Workload("Short Prompt 128/4", 1000, 128, 4, demo_prompts=200)
MEDIUM = Workload("Medium Prompt 2000/100", 500, 2000, 100, demo_prompts=50)
LONG = Workload("Long Prompt 4000/200", 500, 4000, 200, demo_prompts=30)
VERY_LONG = Workload("Very Long Prompt 32000/100", 100, 32000, 100, demo_prompts=3)
# seed 004's GPUStack profiles (rate 1000 is all at once for 1000 requests)
THROUGHPUT_512 = Workload("Throughput 1024/128 (512 conc.)", 1000, 1024, 128, max_concurrency=512)
LONG_CONTEXT = Workload("Long Context 32000/100 at 1/s", 100, 32000, 100, request_rate=1.0)
GENERATION_HEAVY = Workload("Generation Heavy 1000/2000 at 1/s", 200, 1000, 2000, request_rate=1.0)


@dataclass(frozen=True)
class EngineCase:
    label: str
    machine: str
    engine: str  # front end: vllm | sglang | trtllm
    argv: tuple[str, ...]
    # (workload, seed total tok/s, seed mean TPOT ms or None)
    seeds: tuple[tuple[Workload, float, float | None], ...]


# tests/fixtures/seeds/studies/*.txt and tests/fixtures/seeds/seed_results.json
ENGINE_CASES: tuple[EngineCase, ...] = (
    EngineCase("002 vLLM Qwen3-32B", "a100-80g-x1", "vllm", ("serve", "Qwen/Qwen3-32B", "--max-model-len", "32768"), (
        (SHAREGPT, 1730.98, 149.67), (SHORT, 2656.71, 528.57), (MEDIUM, 2521.38, 143.23),
        (LONG, 1837.08, 96.19), (VERY_LONG, 1798.45, 67.87))),
    EngineCase("002 TensorRT-LLM Qwen3-32B", "a100-80g-x1", "trtllm", ("Qwen/Qwen3-32B",), ((SHAREGPT, 2054.21, 89.01),)),
    # seed 002's command names Qwen3-14B for 16384, a slip: the study, its numbers and 32768 are Qwen3-32B
    EngineCase("002 TensorRT-LLM Qwen3-32B max_num_tokens 16384", "a100-80g-x1", "trtllm",
               ("Qwen/Qwen3-32B", "--max_num_tokens=16384"), ((SHAREGPT, 1897.50, 79.75),)),
    EngineCase("002 TensorRT-LLM Qwen3-32B max_num_tokens 32768", "a100-80g-x1", "trtllm",
               ("Qwen/Qwen3-32B", "--max_num_tokens=32768"), ((SHAREGPT, 1627.65, 66.22),)),
    EngineCase("002 TensorRT-LLM Qwen3-32B optimized", "a100-80g-x1", "trtllm",
               ("Qwen/Qwen3-32B", "--max_seq_len=40960", "--enable_chunked_prefill"), (
        (SHORT, 3535.54, 1885.18), (MEDIUM, 2715.90, 145.49), (LONG, 2037.67, 100.09), (VERY_LONG, 1580.36, 47.37))),
    EngineCase("002 SGLang Qwen3-32B", "a100-80g-x1", "sglang", ("--model-path", "Qwen/Qwen3-32B"), ((SHAREGPT, 1398.38, 75.11),)),
    EngineCase("002 vLLM Qwen3-32B-FP8", "a100-80g-x1", "vllm", ("serve", "Qwen/Qwen3-32B-FP8"), ((SHAREGPT, 1563.33, 339.76),)),
    EngineCase("002 vLLM Qwen3-32B-AWQ", "a100-80g-x1", "vllm", ("serve", "Qwen/Qwen3-32B-AWQ"), ((SHAREGPT, 1767.21, 302.45),)),
    EngineCase("001 vLLM Qwen3-235B-A22B-2507 tp8", "a100-80g-x8", "vllm",
               ("serve", "Qwen/Qwen3-235B-A22B-Instruct-2507", "-tp", "8"), ((SHAREGPT, 3792.50, None),)),
    EngineCase("001 SGLang Qwen3-235B-A22B-2507 tp8", "a100-80g-x8", "sglang",
               ("--model-path", "Qwen/Qwen3-235B-A22B-Instruct-2507", "--tp-size", "8"), ((SHAREGPT, 4635.31, None),)),
    EngineCase("000 vLLM-Ascend Qwen3-30B-A3B tp2", "910b3-x8", "vllm", ("serve", "Qwen/Qwen3-30B-A3B", "-tp", "2"),
               ((SHAREGPT, 1227.19, None),)),
    EngineCase("004 vLLM Qwen3.5-9B", "h100-80g-x1", "vllm",
               ("serve", "Qwen/Qwen3.5-9B", "--reasoning-parser=qwen3", "--max-model-len=32768"), (
        (SHAREGPT_512, 11527.14, 15.12), (THROUGHPUT_512, 29822.16, 34.63), (LONG_CONTEXT, 32416.84, 10.21),
        (GENERATION_HEAVY, 2973.42, 0.33))),
    EngineCase("004 SGLang Qwen3.5-9B", "h100-80g-x1", "sglang",
               ("--model-path", "Qwen/Qwen3.5-9B", "--reasoning-parser=qwen3", "--context-length=32768"), ((SHAREGPT_512, 6499.41, 138.86),)),
)


def engine_config(case: EngineCase, env: dict[str, str] | None = None) -> SimEngineConfig:
    """The SimEngineConfig the simulated engine builds from the seed's command."""
    from perflab_sim.frontends import sglang, trtllm, vllm

    env = env if env is not None else {HARDWARE_ENV: case.machine}
    if case.engine == "vllm":
        return vllm.parse([*case.argv, "--port", "0"], env)  # port 0: vLLM's busy-port check always passes
    if case.engine == "sglang":
        return sglang.parse(list(case.argv), env)
    if case.engine == "trtllm":
        return trtllm.parse(list(case.argv), env)
    raise ValueError(f"no front end {case.engine!r}")


def run_engine(cfg: SimEngineConfig, machine: str, workload: list[tuple[float, int, int]],
               max_concurrency: int | None = None) -> OfflineResult:
    """``workload`` through the scheduler and cost model of the engine configuration ``cfg``."""
    from perflab_sim import runtime

    p = runtime.deployment(cfg, {HARDWARE_ENV: machine})
    cost = perfmodel.build_cost_model(p.model, p.machine.chip, p.knobs)
    return simulate(workload, cost, p.knobs, p.memory.kv_capacity_tokens, max_concurrency=max_concurrency)


def engine_rows(demo: bool = False, only: str | None = None) -> list[tuple[str, str, OfflineResult, float | None, float | None]]:
    rows: list[tuple[str, str, OfflineResult, float | None, float | None]] = []
    for case in ENGINE_CASES:
        if only and only.lower() not in case.label.lower():
            continue
        cfg = engine_config(case)
        for workload, seed_tps, seed_tpot in case.seeds:
            result = run_engine(cfg, case.machine, workload.requests(demo), workload.max_concurrency)
            rows.append((case.label, workload.label, result, seed_tps, seed_tpot))
    return rows


def print_rows(rows: Sequence[tuple[str, str, OfflineResult, float | None, float | None]]) -> None:
    print(f"{'case':40s} {'workload':28s} {'sim tok/s':>9s} {'seed tok/s':>10s} {'ratio':>5s} "
          f"{'TTFT s':>7s} {'TPOT ms':>8s} {'seed TPOT':>9s}")
    for label, workload, r, seed, seed_tpot in rows:
        ratio = f"{r.total_token_throughput / seed:5.2f}" if seed else "    -"
        stpot = f"{seed_tpot:9.1f}" if seed_tpot else "        -"
        print(f"{label:40s} {workload:28s} {r.total_token_throughput:9.0f} {seed or 0:10.0f} {ratio} "
              f"{r.mean_ttft:7.1f} {r.mean_tpot * 1000:8.1f} {stpot}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m perflab_sim.calibrate",
        description="Compare the simulator's offline throughput with the seeds' measurements.",
    )
    parser.add_argument("--suite", choices=("roofline", "engines", "all"), default="all",
                        help="roofline: performance-model constants with suggested engine factors (ShareGPT); "
                        "engines: the seeds' commands through the simulated engines' front ends, on the seeds' "
                        "workloads (default: all)")
    parser.add_argument("--case", metavar="TEXT", help="only engine cases whose label contains TEXT")
    parser.add_argument("--demo", action="store_true",
                        help="random workloads with the prompt counts of `perflab demo` instead of the seed's")
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.suite in ("roofline", "all") and not args.case:
        print("== roofline: performance model, suggested engine factors, ShareGPT (1000 at once)")
        print_rows(roofline_rows())
    if args.suite in ("engines", "all"):
        counts = "perflab demo's prompt counts" if args.demo else "the seeds' prompt counts"
        print(f"== engines: the seeds' commands through the simulated engines ({counts})")
        print_rows(engine_rows(args.demo, args.case))
    return 0


if __name__ == "__main__":
    sys.exit(main())
