"""Where the accuracy measurement sits in a configuration's launch (issue 25): after its
profiles, so the benchmarks measure a fresh engine, exactly as the same study without the gate
does; and a configuration whose main profile the early stop cut short is still scored, on the
engine that stopped benchmark left behind. Real simulated engines, the real accuracy runner
(no scripted endpoint): these are the requests that once found a simulated engine frozen."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from simstudy import run_sim_study

# speculative decoding: its simulated acceptance draws follow the engine's arrivals, so any
# request before a benchmark (accuracy first) would change that benchmark's figures
SPEC_PLAN = """
name: acc-order
model: Qwen/Qwen3-8B
hardware: sim:a100-80g-x1
simulation: {time_scale: 50}
engines: [vllm]
candidates:
  - name: Speculative decoding
    variants:
      - {name: ngram, set: {speculative_config: {method: ngram, num_speculative_tokens: 4}}}
profiles:
  main: {label: Main, input_len: 256, output_len: 128, num_prompts: 100, max_concurrency: 16}
timeouts: {startup_s: 60, benchmark_s: 300}
"""

# the early stop's plan (tests/lab/test_lab_early_stop.py), one variant: a quarter of the
# batch clearly loses and is stopped early; on another checkpoint, so its task is scored too
# (a batch cap alone is lossless: agreement only)
STOP_PLAN = """
name: acc-after-stop
model: {id: Qwen/Qwen3-32B, name: Qwen3-32B}
hardware: sim:a100-80g-x8
simulation: {time_scale: 40}
engines: [vllm]
engine_serve:
  vllm: {max_model_len: 32768}
candidates:
  - name: Batch cap
    variants:
      - {name: "AWQ, 8 sequences", set: {model: Qwen/Qwen3-32B-AWQ, max_num_seqs: 8}}
profiles:
  sharegpt: {label: ShareGPT, dataset: synthetic-sharegpt, num_prompts: 500}
timeouts: {startup_s: 120, benchmark_s: 300}
# bounded: an engine that stopped answering fails the measurement, never hangs the test
accuracy: {task: perflab_arith, limit: 20, timeout_s: 120}
"""


def _entries(out: Path) -> dict[str, dict[str, Any]]:
    report = json.loads((out / "report.json").read_text())
    return {e["label"]: e for s in report["steps"] for e in s["entries"]}


@pytest.mark.slow
def test_the_gate_leaves_every_benchmark_figure_as_the_study_without_it_measures_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PERFLAB_SIM_STATE_DIR", str(tmp_path / "sim-state"))
    plain = run_sim_study(SPEC_PLAN, tmp_path / "plain", early_stop=False)
    gated = run_sim_study(SPEC_PLAN + "accuracy: {task: null}\n", tmp_path / "gated", early_stop=False)
    assert plain.exit_code == gated.exit_code == 0
    without, with_gate = _entries(tmp_path / "plain"), _entries(tmp_path / "gated")
    assert set(without) == set(with_gate) == {"vLLM", "vLLM ngram"}
    for label, entry in with_gate.items():
        assert entry["accuracy"]["agreement"] is not None  # measured, in the same launch
        ours, theirs = entry["result"]["metrics"], without[label]["result"]["metrics"]
        for key in ("completed", "total_output_tokens", "duration", "output_throughput", "mean_ttft_ms",
                    "mean_tpot_ms", "p99_itl_ms"):
            # the same to the model clock stamps' resolution (a microsecond)
            assert ours[key] == pytest.approx(theirs[key], rel=1e-4), (label, key)


@pytest.mark.slow
def test_a_configuration_stopped_early_is_still_scored_after_its_profiles(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PERFLAB_SIM_STATE_DIR", str(tmp_path / "sim-state"))
    out = tmp_path / "study"
    summary = run_sim_study(STOP_PLAN, out)
    assert summary.exit_code == 0
    entries = _entries(out)
    stopped = entries["vLLM AWQ, 8 sequences"]
    assert stopped["result"]["status"] == "stopped-early"
    for entry in entries.values():
        acc = entry["accuracy"]
        assert acc["simulated"] is True and acc["score"] is not None and acc["samples"] == 20, acc
        assert acc["agreement"] is not None
    # the measurement came after the profile, on the engine the stopped benchmark left
    run = next((out / "runs").glob("*-8-sequences"))
    bench = run / "measurement-sharegpt.json"
    accuracy = next(run.glob("measurement-accuracy*.json"))
    assert bench.stat().st_mtime_ns <= accuracy.stat().st_mtime_ns
