"""The simulator's prefix cache: a gain where prompts share prefixes, none where they don't.

Seed 004's configuration (vLLM 0.17.1, Qwen3.5-9B, one H100, max_model_len 32768) with prefix
caching on and off, driven offline (:func:`perflab_sim.scheduler.simulate`) with the prompts
the benchmark client sends, hashed as the simulated engine hashes them — deterministic, no
host timing involved. vLLM V1 turns prefix caching on by default (``EngineArgs``:
``enable_prefix_caching`` None -> True), so seed 004's "Prefix Cache" candidate sets what the
baseline already has; the gain shows against ``--no-enable-prefix-caching``.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence

import pytest
from perflab.bench.datasets import Sample, build_samples
from perflab.bench.request import BenchRequest
from perflab.bench.tokenizer import WhitespaceTokenizer
from perflab_sim import perfmodel, runtime, scheduler, tokenizer
from perflab_sim.frontends import sglang, vllm
from perflab_sim.env import ENGINE_VERSIONS_ENV, HARDWARE_ENV

ENV = {HARDWARE_ENV: "h100-80g-x1", ENGINE_VERSIONS_ENV: "vllm=0.17.1,sglang=0.5.9"}
SEED004 = ["serve", "Qwen/Qwen3.5-9B", "--max-model-len", "32768"]


@pytest.fixture
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(cfg, samples: Sequence[Sample], concurrency: int = 64) -> scheduler.OfflineResult:  # type: ignore[no-untyped-def]
    p = runtime.deployment(cfg, ENV)
    cost = perfmodel.build_cost_model(p.model, p.machine.chip, p.knobs)
    hashes = [tokenizer.block_hashes(s.prompt, cfg.block_size) if cfg.prefix_caching else () for s in samples]
    work = [(0.0, tokenizer.count_text(s.prompt), s.output_len) for s in samples]
    return scheduler.simulate(work, cost, p.knobs, p.memory.kv_capacity_tokens, max_concurrency=concurrency, hashes=hashes)


def _samples(**kw: object) -> list[Sample]:
    return build_samples(BenchRequest(base_urls=("http://127.0.0.1:1",), model="m", **kw), WhitespaceTokenizer())  # type: ignore[arg-type]


def test_vllm_and_sglang_turn_prefix_caching_on_by_default(free_port: int) -> None:
    port = ["--port", str(free_port)]
    assert vllm.parse([*SEED004, *port], ENV).prefix_caching is True
    assert vllm.parse([*SEED004, "--no-enable-prefix-caching", *port], ENV).prefix_caching is False
    sg = ["--model-path", "Qwen/Qwen3.5-9B", "--port", str(free_port)]
    assert sglang.parse(sg, ENV).prefix_caching is True
    assert sglang.parse([*sg, "--disable-radix-cache"], ENV).prefix_caching is False


def test_shared_prefixes_gain_and_distinct_prompts_do_not(free_port: int) -> None:
    on = vllm.parse([*SEED004, "--port", str(free_port)], ENV)
    off = vllm.parse([*SEED004, "--no-enable-prefix-caching", "--port", str(free_port)], ENV)
    # 4 system prompts of 2048 tokens shared by 200 requests, each with 128 tokens of its own
    shared = _samples(dataset="prefix-repetition", num_prompts=200, prefix_repetition_prefix_len=2048,
                      prefix_repetition_suffix_len=128, prefix_repetition_num_prefixes=4, prefix_repetition_output_len=64)
    # seed 004's throughput profile, shortened: random 1024-token prompts, nothing shared
    distinct = _samples(dataset="random", num_prompts=200, random_input_len=1024, random_output_len=128, seed=42)
    hit, miss = _run(on, shared), _run(off, shared)
    gain = hit.total_token_throughput / miss.total_token_throughput
    same = _run(on, distinct).total_token_throughput / _run(off, distinct).total_token_throughput
    assert gain > 2.0, gain  # ~2.8: all but the first few prefills of each prefix are skipped; the decode remains
    assert hit.mean_ttft < 0.95 * miss.mean_ttft
    assert same == pytest.approx(1.0, abs=0.01), same
    # the conversation so far is a shared prefix too
    turns = _samples(dataset="multi-turn", num_prompts=200, multi_turn_turns=5, multi_turn_input_len=256,
                     multi_turn_output_len=64)
    assert _run(on, turns, 16).total_token_throughput > 1.1 * _run(off, turns, 16).total_token_throughput


def test_a_prefix_is_found_while_its_first_request_still_runs(free_port: int) -> None:
    """vLLM hashes a block once it is full: a prompt arriving while the first request with its
    prefix still decodes skips that prefix (the simulator shares the compute, not the block)."""
    cfg = vllm.parse([*SEED004, "--port", str(free_port)], ENV)
    p = runtime.deployment(cfg, ENV)
    sched = scheduler.Scheduler(perfmodel.build_cost_model(p.model, p.machine.chip, p.knobs), p.knobs,
                                p.memory.kv_capacity_tokens)
    prefix = tuple(range(1, 9))  # 8 full blocks of 16 tokens
    first = scheduler.SimRequest(8 * 16 + 5, 50, block_hashes=prefix)
    sched.add(first)
    sched.step()
    assert first.decoding and first.cached_tokens == 0
    second = scheduler.SimRequest(8 * 16 + 5, 3, block_hashes=prefix)
    sched.add(second)
    sched.step()
    assert first in sched.running and second.cached_tokens == 8 * 16
    assert second.blocks == first.blocks == 9  # each holds its own blocks
    while sched.step() is not None:
        pass
    assert not sched._running and first.finished_at and second.finished_at  # nothing left marked running
