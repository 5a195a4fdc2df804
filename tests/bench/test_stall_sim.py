"""The stall watchdog against perflab's simulator with the fault ``hang-after:N``: after N
completed requests its scheduler stops stepping while the process, its port and its health
path stay up — open streams just go silent, as a wedged engine's do."""

from __future__ import annotations

import json
import os
import sqlite3
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from perflab.bench import BenchRequest, run_benchmark
from perflab.bench.runner import SIM_STALL_FLOOR_S

TIME_SCALE = 20.0
STALL_S = 60.0  # engine seconds: 3 real seconds at scale 20


@pytest.mark.slow
def test_bench_on_a_hung_simulator_ends_stalled_within_stall_s_plus_10(tmp_path: Path) -> None:
    from perflab.contract.types import ServeConfig
    from perflab.hardware import resolve
    from perflab.plugins import load
    from perflab.supervisor import EngineInstance

    state = tmp_path / "sim-state"
    state.mkdir()
    out: dict[str, Any] = {}

    async def go() -> None:
        pm = load()
        env = {**os.environ, "PERFLAB_SIM_TIME_SCALE": str(TIME_SCALE), "PERFLAB_SIM_STATE_DIR": str(state),
               "PERFLAB_SIM_FAULT": "hang-after:5"}
        hw, env = resolve(pm, "sim:h100-80g-x1", env)
        async with EngineInstance(pm, "vllm", ServeConfig(model="Qwen/Qwen3-8B"), hardware=hw, env=env,
                             workdir=tmp_path / "run", grace=2.0, startup_timeout=60) as inst:
            assert inst.outcome.state == "ready", inst.outcome.to_json()
            req = BenchRequest(base_urls=(inst.base_url,), model=inst.launch.served_model_name, random_input_len=32,
                               random_output_len=64, num_prompts=40, max_concurrency=8, stall_s=STALL_S)
            t0 = time.monotonic()
            out["result"] = await run_benchmark(req)
            out["wall_s"] = time.monotonic() - t0
            out["alive"] = not inst.died.is_set()
        assert inst.outcome.state == "done" and inst.outcome.leftovers == []

    anyio.run(go)
    result = out["result"]
    stall = result.stall
    assert stall is not None and result.stalled and out["alive"]
    # the sim hangs after the step in which its 5th request (the probe is its 1st) completes;
    # requests finishing in that same step complete too
    assert 1 <= stall.completed < 40 - 8 and stall.in_flight == 8
    assert result.metrics["completed"] == stall.completed
    # engine seconds; on a simulator the watchdog waits at least SIM_STALL_FLOOR_S real seconds
    waited = max(STALL_S, SIM_STALL_FLOOR_S * TIME_SCALE)
    assert waited <= stall.idle_s <= waited + 10
    assert out["wall_s"] * TIME_SCALE <= waited + 10 + 60  # + the requests before the hang (~10-30 s)
    assert result.metrics["failed"] == 8
    assert {t.error for t in result.requests if not t.success} == {"stalled"}
    assert result.info["requests_not_recorded"] == 40 - 8 - result.metrics["completed"]


STALL_PLAN = """
name: stalls
model: Qwen/Qwen3-8B
hardware: sim:a100-80g-x1
simulation: {time_scale: 50}
engines: [vllm]
candidates:
  - name: Faults
    variants:
      - {name: hang, set: {env: {PERFLAB_SIM_FAULT: "hang-after:3"}}}
      - {name: "64", set: {max_num_seqs: 64}}
profiles:
  main: {label: Main, input_len: 32, output_len: 32, num_prompts: 20, max_concurrency: 4}
timeouts: {startup_s: 60, benchmark_s: 120, stall_s: 30}
# no warm-up: the fault must strike in the measured run (with warm-up requests it strikes
# there, and the stall's stage is "warm-up" with no measured request)
warmup: 0
"""


@pytest.mark.slow
def test_the_lab_names_a_stalled_configuration(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from perflab.lab.plan import load_plan_text
    from perflab.lab.progress import StudyProgress
    from perflab.lab.run.runner import run_study
    from perflab.plugins import load

    monkeypatch.setenv("PERFLAB_SIM_STATE_DIR", str(tmp_path / "sim-state"))
    plan = load_plan_text(STALL_PLAN, path="stalls.yaml")
    out = tmp_path / "study"
    with open(os.devnull, "w") as sink:
        progress = StudyProgress("stalls (test)", live=False, stream=sink)
        summary = anyio.run(lambda: run_study(load(), plan, out, progress=progress))
    o = summary.outcome
    assert o is not None and o.complete
    entries = {e.label: e.result for e in o.steps[1].entries}
    assert entries["vLLM 64"].status == "ok"
    hung = entries["vLLM hang"]
    assert hung.status == "stalled", hung
    assert "the benchmark stalled: no token on any of 4 open stream(s)" in (hung.error or "")
    cause = hung.cause or {}
    assert cause["name"] == "benchmark-stalled" and cause["line"]  # the engine's last log line
    assert "(--stall-s 30)" in cause["explanation"]  # the plan's timeouts.stall_s
    assert cause["health"] == "GET /health 200"  # alive and answering its health path
    with sqlite3.connect(out / "study.db") as con:
        (state, run_dir, took), = con.execute("SELECT state, dir, finished - started FROM runs WHERE label = 'vLLM hang'")
    assert state == "stalled"
    # 30 engine seconds (timeouts.stall_s) are 0.6 real seconds at scale 50: launch, stall, teardown well under the budget
    assert took < 60, took
    saved = json.loads((out / run_dir / "bench-main.json").read_text())
    assert saved["status"] == "stalled" and saved["metrics"]["failed"] == 4
    assert "# Stalled [benchmark-stalled]" in (out / "report.md").read_text()
