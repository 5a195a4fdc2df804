"""Early stop in a whole simulated study, against the same study without it: the same
recommendation, and far fewer engine-hours, because the configurations that clearly lost
stopped early (recorded as stopped-early with the figures that decided, never as failures).

The plan is the demo's first steps, small: vLLM on its defaults, then two serving options
that cap the batch (8 and 16 sequences) and clearly lose to it on 500 ShareGPT-like
conversations — a full measurement of each takes several times the default's."""

from __future__ import annotations

from pathlib import Path

import pytest

from simstudy import run_sim_study

PLAN = """
name: early-stop
model: {id: Qwen/Qwen3-32B, name: Qwen3-32B}
hardware: sim:a100-80g-x8
simulation: {time_scale: 40}
engines: [vllm]
engine_serve:
  vllm: {max_model_len: 32768}
candidates:
  - name: Batch cap
    variants:
      - {name: "8 sequences", set: {max_num_seqs: 8}}
      - {name: "16 sequences", set: {max_num_seqs: 16}}
profiles:
  sharegpt: {label: ShareGPT, dataset: synthetic-sharegpt, num_prompts: 500}
timeouts: {startup_s: 120, benchmark_s: 300}
"""


@pytest.mark.slow
def test_early_stop_keeps_the_decision_and_saves_engine_hours(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PERFLAB_SIM_STATE_DIR", str(tmp_path / "sim-state"))
    on = run_sim_study(PLAN, tmp_path / "on")
    off = run_sim_study(PLAN, tmp_path / "off", early_stop=False)
    assert on.exit_code == off.exit_code == 0
    assert on.outcome.optimized.label == off.outcome.optimized.label == "vLLM"

    stopped = [e for e in on.outcome.steps[1].entries if e.result.status == "stopped-early"]
    assert stopped, "a configuration with a quarter of the batch clearly lost"
    for e in stopped:
        info = e.result.stopped_early
        # what decided: the bound on its steady state, or the forecast of its open requests
        figure = info.get("bound_token_throughput", info.get("forecast_token_throughput"))
        assert info["reason"] == "lost" and figure is not None and figure < info["limit"]
        assert info["completed"] < info["num_prompts"]
        assert not e.result.status.is_failure
    assert all(e.result.status == "ok" for e in off.outcome.steps[1].entries)  # --no-early-stop: all measured

    # the early-stopped study spent at least 30 % fewer engine-hours than the full one, and
    # its own estimate of the full method is of the same order as what the full one spent
    assert on.engine_hours["spent"] <= 0.7 * off.engine_hours["spent"]
    assert off.engine_hours["saved_pct"] == 0.0
    assert on.engine_hours["saved_pct"] > 0
    assert 0.5 < on.engine_hours["full_method_estimate"] / off.engine_hours["spent"] < 2.0
