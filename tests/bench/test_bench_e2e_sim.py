"""End to end: a simulated vLLM launched by perflab's supervisor, benchmarked by perflab.

The simulator tokenizes by whitespace and tells clients so (``x-perflab-time-scale``), so
the client picks the whitespace tokenizer and input lengths are exact: 200 prompts of 128
tokens are 25600 input tokens. Simulated time runs 20x faster than real time; the client
reads the scale from the same header and reports simulated durations.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pytest

from perflab.bench import BenchRequest, parse_result_block, run_benchmark
from perflab.cli import main

SIM_HW = "sim:h100-80g-x1"
TIME_SCALE = 20.0


@asynccontextmanager
async def simulated_vllm(tmp_path: Path) -> AsyncIterator[Any]:
    from perflab.contract.types import ServeConfig
    from perflab.hardware import resolve
    from perflab.plugins import load
    from perflab.supervisor import EngineInstance

    state = tmp_path / "sim-state"  # our own simulated device memory: other runs must not collide
    state.mkdir()
    pm = load()
    env = {**os.environ, "PERFLAB_SIM_TIME_SCALE": str(TIME_SCALE), "PERFLAB_SIM_STATE_DIR": str(state)}
    hw, env = resolve(pm, SIM_HW, env)
    config = ServeConfig(model="Qwen/Qwen3-8B")
    async with EngineInstance(pm, "vllm", config, hardware=hw, env=env, workdir=tmp_path / "run", grace=2.0, startup_timeout=60) as inst:
        assert inst.outcome.state == "ready", inst.outcome.to_json()
        yield inst
    assert inst.outcome.state == "done" and inst.outcome.leftovers == []


def test_200_random_prompts_128_16_at_concurrency_32(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out: dict[str, Any] = {}

    def cli(*args: str) -> Callable[[], None]:
        return lambda: main(["bench", *args])

    async def go() -> None:
        async with simulated_vllm(tmp_path) as inst:
            model = inst.launch.served_model_name
            req = BenchRequest(base_urls=(inst.base_url,), model=model, random_input_len=128, random_output_len=16,
                               num_prompts=200, max_concurrency=32, ignore_eos=True)
            out["result"] = await run_benchmark(req)
            common = ("--base-url", inst.base_url, "--model", model, "--random-input-len", "128", "--random-output-len", "16",
                      "--num-prompts", "200", "--max-concurrency", "32", "--ignore-eos")
            # The CLI blocks its thread: keep the supervisor's event loop free meanwhile.
            await anyio.to_thread.run_sync(cli(*common))
            out["block"] = capsys.readouterr().out
            await anyio.to_thread.run_sync(cli(*common, "--json", "--workers", "2"))
            out["json"] = capsys.readouterr().out

    anyio.run(go)
    r = out["result"]
    m = r.metrics
    assert m["completed"] == 200 and m["failed"] == 0
    assert m["total_input_tokens"] == 25600 and m["total_output_tokens"] == 3200
    assert r.info["tokenizer"] == "whitespace" and r.info["simulated"] is True and r.info["time_scale"] == TIME_SCALE
    assert r.info["prompt_len_mismatches"] == 0  # the simulator counted every prompt as we did
    assert 1 <= m["max_concurrent_requests"] <= 32
    assert m["mean_ttft_ms"] > 0 and m["mean_tpot_ms"] > 0 and m["max_output_tokens_per_s"] >= m["output_throughput"] * 0.5

    with capsys.disabled():
        print("\n" + r.format_block())
    block = parse_result_block(out["block"])
    assert block["completed"] == 200 and block["total_input_tokens"] == 25600 and block["max_concurrency"] == 32
    j = json.loads(out["json"])
    assert j["completed"] == 200 and j["total_input_tokens"] == 25600 and j["total_output_tokens"] == 3200
    assert j["perflab"]["workers"] == 2 and j["max_concurrency"] == 32
    with capsys.disabled():
        print(json.dumps({k: j[k] for k in ("completed", "total_input_tokens", "total_output_tokens", "request_throughput",
                                            "mean_ttft_ms", "mean_tpot_ms", "max_output_tokens_per_s", "max_concurrent_requests")}))


def test_sharegpt_and_completions_on_the_simulator(tmp_path: Path) -> None:
    data = Path(__file__).parent / "data" / "sharegpt_small.json"

    async def go() -> Any:
        async with simulated_vllm(tmp_path) as inst:
            req = BenchRequest(base_urls=(inst.base_url,), model=inst.launch.served_model_name, backend="openai",
                               dataset="sharegpt", dataset_path=str(data), num_prompts=16, request_rate=50.0, ignore_eos=True,
                               percentiles=(50, 95, 99))
            return await run_benchmark(req)

    r = anyio.run(go)
    m = r.metrics
    assert m["completed"] == 16 and r.info["prompt_len_mismatches"] == 0
    assert m["total_output_tokens"] == sum(t.output_tokens for t in r.requests)
    assert m["total_input_tokens"] == r.info["total_input_tokens_client"]
    assert "P95 TTFT (ms):" in r.format_block()
