"""The simulator's version-dependent behaviour (perflab_sim/data/version_factors.json): the
invented vLLM 0.12.0 decode regression that ``perflab compare`` is tested against."""

from __future__ import annotations

import os

import pytest

from perflab_sim import perfmodel, runtime, scheduler
from perflab_sim.frontends import common, sglang, vllm

CLEAN_ENV = {"PATH": os.environ.get("PATH", "")}  # no activated simulator (its dist-info) on the path


def _env(versions: str | None = None) -> dict[str, str]:
    env = {**CLEAN_ENV, "PERFLAB_SIM_HARDWARE": "a100-80g-x1"}
    if versions:
        env["PERFLAB_SIM_ENGINE_VERSIONS"] = versions
    return env


def _serve(env: dict[str, str]):  # type: ignore[no-untyped-def]
    return vllm.parse(["serve", "Qwen/Qwen3-8B"], env)


def test_vllm_0_12_0_decodes_slower_and_prefills_alike():
    old, new = _serve(_env()), _serve(_env("vllm=0.12.0"))
    assert (old.engine_version, new.engine_version) == ("0.11.0", "0.12.0")
    assert new.decode_efficiency == pytest.approx(old.decode_efficiency * 0.9)
    assert (new.prefill_efficiency, new.efficiency, new.scheduler_overhead_ms) == (
        old.prefill_efficiency, old.efficiency, old.scheduler_overhead_ms)
    # the engine's log says the difference is the simulator's invention
    said = [line for line in new.startup_lines if "0.12.0" in line and "not a claim about the real" in line]
    assert len(said) == 1 and not any("not a claim" in line for line in old.startup_lines)


def test_only_the_listed_release_changes():
    base = _serve(_env())
    for version in ("0.12.1", "0.11.2"):
        assert _serve(_env(f"vllm={version}")).decode_efficiency == base.decode_efficiency
    # another engine at the same version string is not vLLM
    assert common.version_factors("sglang", "0.12.0", common.Factors(decode=1.0)).decode == 1.0
    s_old = sglang.parse(["--model-path", "Qwen/Qwen3-8B"], _env())
    s_new = sglang.parse(["--model-path", "Qwen/Qwen3-8B"], _env("vllm=0.12.0"))
    assert s_old.decode_efficiency == s_new.decode_efficiency


def test_the_regression_shows_in_decode_time_not_in_prefill_time():
    """Through the scheduler: a decode-heavy load ~10 % slower, a compute-bound prefill not."""

    def run(cfg, env, workload):  # type: ignore[no-untyped-def]
        p = runtime.deployment(cfg, env)
        cost = perfmodel.build_cost_model(p.model, p.machine.chip, p.knobs)
        return scheduler.simulate(workload, cost, p.knobs, p.memory.kv_capacity_tokens)

    decode_heavy = [(0.0, 64, 256)] * 16
    old_env, new_env = _env(), _env("vllm=0.12.0")
    old = run(_serve(old_env), old_env, decode_heavy)
    new = run(_serve(new_env), new_env, decode_heavy)
    assert new.total_token_throughput / old.total_token_throughput == pytest.approx(0.9, abs=0.03)
    prefill = [(0.0, 2048, 1)]
    assert run(_serve(new_env), new_env, prefill).duration == pytest.approx(
        run(_serve(old_env), old_env, prefill).duration, rel=0.01)

