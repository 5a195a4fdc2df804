"""The measurement machinery on the simulator: a launch measures the max-load search on the
main profile, another a sweep, each point repeated — and the runs' engine-seconds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from simstudy import run_sim_study

from perflab.lab.exits import RunExit
from perflab.lab.run.executor import MAX_PROBES

PLAN = """
name: measure-sim
model: Qwen/Qwen3-8B
hardware: sim:a100-80g-x1
simulation: {time_scale: 50}
engines: [vllm]
decide_by: max-load
search: max_concurrency
slo: {tpot_ms: 40, percentile: 90}
repeats: 2
profiles:
  main: {label: Main, input_len: 256, output_len: 32, num_prompts: 48}
  curve: {label: Curve, input_len: 256, output_len: 32, num_prompts: 32, sweep: {max_concurrency: [1, 16]}}
timeouts: {startup_s: 60, benchmark_s: 120}
"""


@pytest.mark.slow
def test_search_sweep_and_repeats_in_one_launch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from perflab.lab.store import Store

    monkeypatch.setenv("PERFLAB_SIM_STATE_DIR", str(tmp_path / "sim-state"))
    out = tmp_path / "study"
    summary = run_sim_study(PLAN, out)
    assert summary.exit_code == 0
    run_dir = next((out / "runs").glob("001-*"))

    main = json.loads((run_dir / "measurement-main.json").read_text())
    assert main["status"] == "ok"
    points = main["points"]
    loads = [p["load"]["max_concurrency"] for p in points]
    assert loads == sorted(loads) and 2 <= len(loads) <= MAX_PROBES
    for p in points:
        # the SLO's percentile and vLLM's goodput are in every probe's metrics
        assert "p90_tpot_ms" in p["metrics"] and p["metrics"]["request_goodput"] is not None
        assert p["slo_met"] == (p["metrics"]["p90_tpot_ms"] <= 40)
        assert len(p["repeats"]) == 2 and "total_token_throughput" in p["noise"]
    met = [p["load"]["max_concurrency"] for p in points if p["slo_met"]]
    failed = [p["load"]["max_concurrency"] for p in points if not p["slo_met"]]
    assert met, "one request at a time meets a 40 ms TPOT on the simulated A100"
    assert main["capacity"] == max(met)
    assert not failed or min(failed) > main["capacity"]  # latency grows with the load
    top = next(p for p in points if p["load"]["max_concurrency"] == main["capacity"])
    assert main["metrics"] == top["metrics"]  # metrics: the highest load meeting the SLO

    curve_file = next((out / "runs").glob("*/measurement-curve.json"))  # the baseline's launch
    curve = json.loads(curve_file.read_text())
    assert [p["load"] for p in curve["points"]] == [{"max_concurrency": 1}, {"max_concurrency": 16}]
    assert curve["metrics"] == curve["points"][-1]["metrics"]  # the highest load's
    assert len(curve["repeats"]) == 2
    tput = [r["total_token_throughput"] for r in curve["repeats"]]
    assert curve["metrics"]["total_token_throughput"] == pytest.approx(sum(tput) / 2)
    assert (curve_file.parent / "bench-curve-max_concurrency-16-r2.json").is_file()

    from perflab import models
    from perflab_sim import perfmodel

    # the simulated engine's start-up (its weights at LOAD_GIB_S, then INIT_S) and teardown
    weights_gib = perfmodel.weight_bytes(models.lookup("Qwen/Qwen3-8B"), None) / perfmodel.GIB
    lifecycle = weights_gib / perfmodel.LOAD_GIB_S + perfmodel.INIT_S + perfmodel.TEARDOWN_S
    store = Store(out)
    rows = store.runs()
    for row in rows:  # launch to teardown, x1 accelerator, in engine time, whatever the host's pace:
        # the engine's start-up and teardown, each benchmark's run and warm-up (one request of
        # 256 + 32 tokens: about a second each) on the engine's model clock
        assert row["accelerators"] == 1
        files = list((out / row["dir"]).glob("bench-*.json"))
        benches = sum(json.loads(f.read_text())["metrics"]["duration"] for f in files)
        assert benches > 0
        assert benches + lifecycle <= row["engine_seconds"] <= benches + lifecycle + len(files) * 2.0
    assert store.engine_hours()["spent"] == pytest.approx(sum(r["engine_seconds"] for r in rows) / 3600, abs=1e-4)
    row = rows[0]
    res = store.lookup(row["config_key"], next(iter({m["profile_key"] for m in store.measurements() if m["profile"] == "main"})))
    assert res is not None and res.capacity == main["capacity"] and res.points == points
    store.close()


SATURATED = """
name: saturated
profiles:
  main: {label: Main, input_len: 512, output_len: 128, num_prompts: 2000, request_rate: 20}
engines: [vllm]
engine_serve: {vllm: {max_num_seqs: 4}}
model: Qwen/Qwen3-8B
hardware: sim:a100-80g-x1
simulation: {time_scale: 20}
timeouts: {startup_s: 60, benchmark_s: 120}
"""


@pytest.mark.slow
def test_an_over_saturated_engine_stops_early_and_it_is_not_a_failure(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """20 requests/s against an engine that ends ~2/s with 4 sequences at a time: the queue and
    the latency grow window after window, and the measurement stops long before its 100 s
    of arrivals (engine time), with the figures that decided."""
    monkeypatch.setenv("PERFLAB_SIM_STATE_DIR", str(tmp_path / "sim-state"))
    out = tmp_path / "study"
    summary = run_sim_study(SATURATED, out)
    # measured (not a failure), but no configuration served the load: nothing to recommend
    assert summary.exit_code == RunExit.RECOMMENDATION_NOT_MEASURED
    m = json.loads(next((out / "runs").glob("001-*/measurement-main.json")).read_text())
    assert m["status"] == "stopped-early"
    info = m["stopped_early"]
    assert info["reason"] == "over-saturated"
    assert info["queue"] == sorted(info["queue"]) and info["latency_ms"] == sorted(info["latency_ms"])
    assert info["elapsed_s"] < 60 and info["completed"] < 200
    assert info["estimated_full_s"] > 5 * info["elapsed_s"]
    assert summary.engine_hours["saved_pct"] > 50


def test_launch_clock_counts_the_model_clock_on_the_simulator_and_wall_time_on_a_real_engine(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from perflab.bench.serverclock import format_lifecycle, parse_lifecycle
    from perflab.lab.run.executor import LaunchClock

    assert parse_lifecycle(format_lifecycle(47.625, 5.0)) == (47.625, 5.0)
    assert parse_lifecycle("47.6") is None and parse_lifecycle("a b") is None and parse_lifecycle("-1 5") is None

    def bench(duration: float, **info: object) -> SimpleNamespace:
        return SimpleNamespace(metrics=SimpleNamespace(duration=duration), info=info)

    # a simulated launch at x1000 that took 9 wall seconds, 4 of them two benchmarks' host work
    sim = LaunchClock()
    sim.benchmark(bench(1000.0, clock="model", time_scale=1000.0, warmup_s=0.5, lifecycle_s=[47.5, 5.0]), 2.5)
    sim.benchmark(bench(500.0, clock="model", time_scale=1000.0, lifecycle_s=[47.5, 5.0]), 2.5)
    sim.unclocked_s += 0.1  # the accuracy gate: 0.1 wall seconds
    assert sim.engine_seconds(9.0, 1000.0) == pytest.approx(47.5 + 5.0 + 1000.5 + 500.0 + 100.0)
    assert sim.engine_seconds(9.0, None) == 9.0  # a real engine: its wall time, whatever it said
    # a simulated engine that never answered: what it wrote its failed start cost, else its
    # wall time x the scale
    failed = LaunchClock(reported=tmp_path / "engine-lifecycle.txt")
    assert failed.engine_seconds(0.3, 1000.0) == pytest.approx(300.0)
    (tmp_path / "engine-lifecycle.txt").write_text(format_lifecycle(47.5, 5.0))
    assert failed.engine_seconds(0.3, 1000.0) == pytest.approx(52.5)


ONE = """
name: one-launch
model: {{id: Qwen/Qwen3-32B, name: Qwen3-32B}}
hardware: sim:a100-80g-x1
simulation: {{time_scale: {scale}}}
engines: [vllm, sglang]
engine_serve:
  vllm: {{max_model_len: 8192}}
  sglang: {{max_batched_tokens: 16384}}
profiles:
  main: {{label: Main, input_len: 256, output_len: 32, num_prompts: 48}}
"""


@pytest.mark.slow
def test_a_simulated_launch_costs_the_same_engine_hours_at_any_time_scale(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """At x100 the host's start of an engine (a second or two of wall time) would count
    100-200 engine seconds, at x5000 5000-10000: on the model clock both cost the same, a
    start that fails (SGLang: 16384 batched tokens leave no room for the KV cache) too."""
    from perflab import models
    from perflab.lab.store import Store
    from perflab_sim import perfmodel

    monkeypatch.setenv("PERFLAB_SIM_STATE_DIR", str(tmp_path / "sim-state"))
    weights_gib = perfmodel.weight_bytes(models.lookup("Qwen/Qwen3-32B"), None) / perfmodel.GIB
    lifecycle = weights_gib / perfmodel.LOAD_GIB_S + perfmodel.INIT_S + perfmodel.TEARDOWN_S
    seconds = []
    for scale in (100, 5000):
        out = tmp_path / f"x{scale}"
        run_sim_study(ONE.format(scale=scale), out)
        store = Store(out)
        rows = store.runs()
        store.close()
        assert [r["state"] for r in rows] == ["done", "crashed"]
        seconds.append([r["engine_seconds"] for r in rows])
    assert seconds[0] == pytest.approx(seconds[1], rel=0.01)
    assert lifecycle < seconds[0][0] < lifecycle + 20  # vLLM: its start-up, teardown and a few seconds of benchmark
    assert seconds[0][1] == pytest.approx(lifecycle, abs=0.01)  # SGLang: a failed start costs a start
