"""Warm-up and cache state between measurements (issue #12 item 4).

The prefix-cache reset is the optional ``perflab_cache_reset`` hook: the plugins declare it
(vLLM ``POST /reset_prefix_cache``, served only with ``VLLM_SERVER_DEV_MODE=1``; SGLang
``/flush_cache``), the simulated engines answer it as the real ones do, and the executor sends
it before each measured benchmark, so a second run of the same prompts finds nothing cached.
The warm-up requests reach the engine but not the results.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import anyio
import httpx
import pytest
import structlog.testing

from perflab.contract.status import Status
from perflab.contract.types import CacheReset, LaunchSpec
from perflab.lab.decide import Decision
from perflab.lab.options import Configuration
from perflab.lab.plan import Profile, Timeouts
from perflab.lab.run.executor import Executor, LabContext, reset_prefix_cache
from perflab_sim.env import ENGINE_VERSIONS_ENV, STATE_ENV, TIME_SCALE_ENV
from perflab_sim.perfmodel import CostModel, Knobs
from perflab_sim.scheduler import Scheduler, SimRequest

SIM_HW = "sim:h100-80g-x1"
TIME_SCALE = 20.0
DEV_MODE = {"VLLM_SERVER_DEV_MODE": "1"}


@asynccontextmanager
async def simulated(tmp_path: Path, engine: str, extra_env: Mapping[str, str] = {}) -> AsyncIterator[Any]:
    from perflab.contract.types import ServeConfig
    from perflab.hardware import resolve
    from perflab.plugins import load
    from perflab.supervisor import EngineInstance

    state = tmp_path / f"sim-state-{engine}"
    state.mkdir(exist_ok=True)
    pm = load()
    # vLLM as the captured real one (tests/fixtures/real/vllm-0.32.0-cpu)
    env = {**os.environ, TIME_SCALE_ENV: str(TIME_SCALE), STATE_ENV: str(state), ENGINE_VERSIONS_ENV: "vllm=0.32.0"}
    hw, env = resolve(pm, SIM_HW, env)
    config = ServeConfig(model="Qwen/Qwen3-8B", extra_env=dict(extra_env))
    async with EngineInstance(pm, engine, config, hardware=hw, env=env, workdir=tmp_path / f"run-{engine}", grace=2.0,
                         startup_timeout=60) as inst:
        assert inst.outcome.state == "ready", inst.outcome.to_json()
        yield SimpleNamespace(inst=inst, pm=pm, hw=hw, env=env, config=config)
    assert inst.outcome.state == "done" and inst.outcome.leftovers == []


def _counter(text: str, name: str) -> float:
    """The sum of a Prometheus counter's samples (all label sets)."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name + "{") or line.startswith(name + " "))


async def _metrics(base_url: str) -> str:
    async with httpx.AsyncClient(trust_env=False) as client:
        return (await client.get(base_url + "/metrics")).text


# --------------------------------------------------------------------------- the hook


def test_plugins_declare_their_prefix_cache_reset() -> None:
    from perflab.plugins import load

    pm = load()
    launch = LaunchSpec(engine="x", argv=("x",), host="127.0.0.1", port=1, served_model_name="m")
    answers = {e: pm.engine(e).engine.cache_reset(launch) for e in ("vllm", "vllm-ascend", "sglang", "trtllm", "mindie")}
    assert answers["vllm"] == answers["vllm-ascend"]  # the same API server
    assert (answers["vllm"].method, answers["vllm"].path, answers["vllm"].success_field) == ("POST", "/reset_prefix_cache", "success")
    assert "VLLM_SERVER_DEV_MODE=1" in answers["vllm"].missing_hint
    assert (answers["sglang"].method, answers["sglang"].path) == ("POST", "/flush_cache")
    assert answers["trtllm"] is None and answers["mindie"] is None
    assert all(a is None or a.source for a in answers.values())  # cited
    from perflab.contract.errors import UnknownEngine

    with pytest.raises(UnknownEngine):
        pm.engine("no-such-engine")


def test_the_simulated_engines_answer_resets_as_the_real_ones(tmp_path: Path) -> None:
    async def go() -> dict[str, Any]:
        out: dict[str, Any] = {}
        async with simulated(tmp_path, "vllm", DEV_MODE) as s:
            out["vllm dev"] = await reset_prefix_cache(s.pm, "vllm", s.inst.launch, s.inst.base_url)
            async with httpx.AsyncClient(trust_env=False) as client:
                resp = await client.post(s.inst.base_url + "/reset_prefix_cache")
                out["vllm body"] = (resp.status_code, resp.json())
                out["vllm GET"] = (await client.get(s.inst.base_url + "/reset_prefix_cache")).status_code
            out["vllm dev log"] = Path(s.inst.outcome.log).read_text()
        async with simulated(tmp_path, "vllm") as s:
            out["vllm"] = await reset_prefix_cache(s.pm, "vllm", s.inst.launch, s.inst.base_url)
        async with simulated(tmp_path, "sglang") as s:
            out["sglang"] = await reset_prefix_cache(s.pm, "sglang", s.inst.launch, s.inst.base_url)
            async with httpx.AsyncClient(trust_env=False) as client:
                resp = await client.get(s.inst.base_url + "/flush_cache")
                out["sglang GET"] = (resp.status_code, resp.text)
        return out

    out = anyio.run(go)
    assert out["vllm dev"] is None  # reset
    assert out["vllm body"] == (200, {"success": True})
    assert out["vllm GET"] == 405  # an APIRoute declared POST
    # the real server's warning and route list (vllm/entrypoints/serve/__init__.py, launcher.py)
    assert "SECURITY WARNING: Development endpoints are enabled!" in out["vllm dev log"]
    assert "Route: /reset_prefix_cache, Methods: POST" in out["vllm dev log"]
    assert out["vllm"].missing and "VLLM_SERVER_DEV_MODE=1" in out["vllm"].text  # not registered without dev mode
    assert out["sglang"] is None
    assert out["sglang GET"][0] == 200 and out["sglang GET"][1].startswith("Cache flushed.")


def test_a_busy_engine_refuses_the_reset_as_vllm_and_sglang_do() -> None:
    sched = Scheduler(CostModel.__new__(CostModel), Knobs(prefix_caching=True), 16 * 64)
    sched._cache[("held", 0)] = None
    sched.running.append(SimRequest(32, 4))
    assert sched.reset_prefix_cache() is False and sched._cache  # vLLM: blocks held by a running request
    sched.running.clear()
    sched.waiting.append(SimRequest(32, 4))
    assert sched.reset_prefix_cache(refuse_waiting=True) is False  # SGLang: a request waits
    free = sched.free_blocks
    assert sched.reset_prefix_cache() is True and not sched._cache and sched.free_blocks == free + 1


# --------------------------------------------------------------------------- the executor


def _ctx(s: Any, warmup: int) -> LabContext:
    plan = SimpleNamespace(timeouts=Timeouts(benchmark_s=120.0), decision=Decision(warmup=warmup), min_improvement_pct=0.0,
                           cost=None)
    return LabContext(pm=s.pm, plan=plan, hardware=s.hw, env=s.env, time_scale=TIME_SCALE)  # type: ignore[arg-type]


# the client's one-token test request before each run, one per endpoint (perflab.bench.runner._probe)
PROBES = 1
PROFILE = Profile(name="small", label="Small", input_len=64, output_len=4, num_prompts=6, max_concurrency=1, seed=7)


async def _measure_twice(tmp_path: Path, extra_env: Mapping[str, str], warmup: int) -> dict[str, Any]:
    """The same profile measured twice in one launch: the engine's counters around each."""
    async with simulated(tmp_path, "vllm", extra_env) as s:
        ex = Executor(_ctx(s, warmup))
        config = Configuration("vllm", {"model": "Qwen/Qwen3-8B"})
        seen: list[dict[str, float]] = []
        measured = []
        for i in range(2):
            before = await _metrics(s.inst.base_url)
            m = await ex._benchmark([s.inst], config, PROFILE, tmp_path, f"run {i}")
            after = await _metrics(s.inst.base_url)
            measured.append(m)
            seen.append({name: _counter(after, name) - _counter(before, name)
                         for name in ("vllm:request_success_total", "vllm:prefix_cache_hits_total")})
        return {"seen": seen, "measured": measured}


def test_reset_between_measurements_and_warmup_excluded(tmp_path: Path) -> None:
    with structlog.testing.capture_logs() as logs:
        out = anyio.run(_measure_twice, tmp_path, DEV_MODE, 8)
    first, second = out["seen"]
    for m in out["measured"]:
        assert m.status is Status.OK and m.metrics["completed"] == PROFILE.num_prompts
    # the engine served the 8 warm-up requests too; the results count only the measured ones
    assert first["vllm:request_success_total"] == second["vllm:request_success_total"] == PROBES + 8 + PROFILE.num_prompts
    # reset before each: the second run of the same prompts finds what the first found, no more
    assert second["vllm:prefix_cache_hits_total"] == first["vllm:prefix_cache_hits_total"]
    assert not [e for e in logs if e["event"].startswith("lab.cache-reset")]


def test_without_a_reset_the_first_measurement_warms_the_second_and_it_is_noted_once(tmp_path: Path) -> None:
    with structlog.testing.capture_logs() as logs:
        out = anyio.run(_measure_twice, tmp_path, {}, 0)
    first, second = out["seen"]
    assert first["vllm:request_success_total"] == PROBES + PROFILE.num_prompts  # warmup 0: no other request
    # the same prompts again, nothing reset: every full block of them is a hit now
    assert second["vllm:prefix_cache_hits_total"] >= first["vllm:prefix_cache_hits_total"] + PROFILE.num_prompts * 3 * 16
    notes = [e for e in logs if e["event"] == "lab.cache-reset-unavailable"]
    assert len(notes) == 1 and "VLLM_SERVER_DEV_MODE=1" in notes[0]["why"]
    assert not [e for e in logs if e["event"] == "lab.cache-reset-failed"]


def test_a_failed_reset_is_a_warning_not_a_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import perflab_vllm

    # the engine refuses it (405: a GET-only path): the measurement goes on
    monkeypatch.setattr(perflab_vllm.VLLM, "prefix_cache_reset", CacheReset("/health", "DELETE"))
    with structlog.testing.capture_logs() as logs:
        out = anyio.run(_measure_twice, tmp_path, {}, 2)
    assert all(m.status is Status.OK for m in out["measured"])
    failed = [e for e in logs if e["event"] == "lab.cache-reset-failed"]
    assert len(failed) == 2 and "405" in failed[0]["why"] and failed[0]["profile"] == "small"
