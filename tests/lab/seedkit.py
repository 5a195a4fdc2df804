"""The seeds' own numbers as a fake ``measure`` for the lab's tests.

``tests/fixtures/seeds/seed_results.json`` holds every configuration the seeds measured, with
its result block's numbers. :class:`SeedMeasure` answers the study's measure calls from those
records, so the study logic and the report writer can be checked against the seeds' own
tables without launching anything.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from perflab.contract.status import Status
from perflab.lab.options import Configuration
from perflab.lab.plan import Profile
from perflab.lab.study import ConfigResult

SEEDS = Path(__file__).resolve().parents[1] / "fixtures" / "seeds"

# seed record metric names -> vLLM --save-result names (what perflab.bench produces)
_RENAME = {
    "successful_requests": "completed",
    "duration_s": "duration",
    "total_generated_tokens": "total_output_tokens",
    "peak_output_throughput": "max_output_tokens_per_s",
    "peak_concurrent_requests": "max_concurrent_requests",
}


def seed_records() -> dict[str, dict[str, Any]]:
    recs = json.loads((SEEDS / "seed_results.json").read_text())
    return {r["id"]: r for r in recs}


def seed_summaries() -> dict[str, Any]:
    return json.loads((SEEDS / "seed_summaries.json").read_text())


def vllm_metrics(record: dict[str, Any], num_prompts: int | None = None) -> dict[str, Any]:
    m = {_RENAME.get(k, k): v for k, v in (record.get("metrics") or {}).items() if v is not None}
    m.setdefault("failed", (num_prompts - m["completed"]) if num_prompts else 0)
    return m


def seed_result(record: dict[str, Any], num_prompts: int, replicas: int = 1) -> ConfigResult:
    """A ConfigResult as the store would return it for one seed record."""
    if record["outcome"] == "crash":
        return ConfigResult(Status.CRASHED, cause={"name": "seed", "explanation": "crashed in the seed", "line": record["error"]},
                      script=record["command"], log="runs/x/engine.log", num_prompts=num_prompts)
    metrics = vllm_metrics(record, num_prompts)
    if replicas > 1:  # the seeds report one instance's numbers "x2"; perflab aggregates
        for k in ("total_token_throughput", "output_throughput", "request_throughput", "completed",
                  "total_input_tokens", "total_output_tokens"):
            metrics[k] = metrics[k] * replicas
        metrics["failed"] = 0
        num_prompts *= replicas
    return ConfigResult(Status.OK, metrics=metrics, num_prompts=num_prompts, script=record["command"], replicas=replicas)


Key = Callable[[Configuration, Profile], str | None]


class SeedMeasure:
    """A ``measure`` answering from seed records; ``key(config, profile)`` names the record."""

    def __init__(self, key: Key) -> None:
        self.key = key
        self.records = seed_records()
        self.calls: list[tuple[Configuration, tuple[str, ...], str, str]] = []

    async def __call__(self, config: Configuration, profiles: Sequence[Profile], *, step: str, label: str,
                       to_beat: float | None = None) -> dict[str, ConfigResult]:  # a fake: to_beat is ignored
        self.calls.append((config, tuple(p.name for p in profiles), step, label))
        out = {}
        for p in profiles:
            rid = self.key(config, p)
            out[p.name] = seed_result(self.records[rid], p.num_prompts, config.replicas) if rid else ConfigResult(Status.PENDING)
        return out


SEED_002_PLAN = """
name: seed-002
title: Optimizing Qwen3-32B Throughput on NVIDIA A100 GPUs
model: {id: Qwen/Qwen3-32B, name: Qwen3-32B}
hardware: sim:a100-80g-x8
engines: [vllm, sglang, trtllm]
engine_serve:
  vllm: {max_model_len: 32768}
baseline: {engine: vllm, label: vLLM without any optimizations}
candidates:
  - name: Quantization
    engines: [winner, vllm]
    variants:
      - {name: FP8, set: {model: Qwen/Qwen3-32B-FP8}}
      - {name: AWQ, set: {model: Qwen/Qwen3-32B-AWQ}}
  - name: Max Batched Token Numbers
    variants:
      - {name: "16k", set: {max_batched_tokens: 16384}}
      - {name: "32k", set: {max_batched_tokens: 32768}}
profiles:
  sharegpt: {label: ShareGPT, dataset: synthetic-sharegpt, num_prompts: 1000}
  short: {label: Short Prompt, input_len: 128, output_len: 4, num_prompts: 1000}
  medium: {label: Medium Prompt, input_len: 2000, output_len: 100, num_prompts: 500}
  long: {label: Long Prompt, input_len: 4000, output_len: 200, num_prompts: 500}
  very-long: {label: Very Long Prompt, input_len: 32000, output_len: 100, num_prompts: 100}
main_profile: sharegpt
"""

_002_RANDOM = {"very-long": 0, "long": 1, "medium": 2, "short": 3}


def seed_002_key(config: Configuration, profile: Profile) -> str | None:
    """Which seed-002 record a configuration/profile of SEED_002_PLAN is."""
    e, o = config.engine, config.options
    model = o["model"]
    if profile.name != "sharegpt":
        if e == "vllm" and model == "Qwen/Qwen3-32B" and "max_batched_tokens" not in o:
            return f"002-{9 + _002_RANDOM[profile.name]:02d}"
        if e == "trtllm" and model == "Qwen/Qwen3-32B" and "max_batched_tokens" not in o:
            return f"002-{13 + _002_RANDOM[profile.name]:02d}"
        return None
    table = {
        ("vllm", "Qwen/Qwen3-32B", None): "002-00",
        ("sglang", "Qwen/Qwen3-32B", None): "002-01",
        ("trtllm", "Qwen/Qwen3-32B", None): "002-02",
        ("trtllm", "Qwen/Qwen3-32B-FP8", None): "002-03",
        ("trtllm", "Qwen/Qwen3-32B-AWQ", None): "002-04",
        ("vllm", "Qwen/Qwen3-32B-FP8", None): "002-05",
        ("vllm", "Qwen/Qwen3-32B-AWQ", None): "002-06",
        ("trtllm", "Qwen/Qwen3-32B", 16384): "002-07",
        ("trtllm", "Qwen/Qwen3-32B", 32768): "002-08",
    }
    return table.get((e, model, o.get("max_batched_tokens")))
