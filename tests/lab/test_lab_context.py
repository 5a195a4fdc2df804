"""Workloads and context limits: the lab refuses what cannot fit, MindIE serves the seed-000
workloads (its template's maxSeqLen 2560 failed them 100 %), and a profile whose requests
fail says why in the report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from perflab.cli import main as perflab_main
from perflab.lab.options import Configuration
from perflab.lab.plan import load_plan
from perflab.lab.run.preflight import model_context, tokens_needed, too_long

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_seed_000_workloads_fit_every_engine_default_on_the_simulator() -> None:
    plan = load_plan(EXAMPLES / "seed-000-qwen3-30b-a3b-910b.yaml")
    assert model_context(plan.model, simulated=True) == 40960  # Qwen3-30B-A3B max_position_embeddings
    needs = {p.name: tokens_needed(p) for p in plan.profiles}
    assert needs["long"] == 4200 and needs["very-long"] == 32100 and needs["sharegpt"] is None
    for engine in plan.engines:
        assert too_long(plan.engine_defaults(engine), list(plan.profiles), 40960) == {}


def test_a_workload_longer_than_the_context_is_refused_with_the_reason() -> None:
    plan = load_plan(EXAMPLES / "seed-000-qwen3-30b-a3b-910b.yaml")
    capped = Configuration("mindie", {"model": plan.model, "max_model_len": 8192})
    refused = too_long(capped, list(plan.profiles), 40960)
    assert sorted(refused) == ["very-long"]
    assert "32100 prompt + output tokens" in refused["very-long"] and "8192-token context limit (max_model_len)" in refused["very-long"]
    # an unknown model context refuses nothing (the engine decides)
    assert too_long(Configuration("vllm", {"model": "x"}), list(plan.profiles), None) == {}


def test_model_context_from_local_weights(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"text_config": {"max_position_embeddings": 131072}}))
    assert model_context(str(tmp_path), simulated=False) == 131072
    assert model_context("org/not-cached", simulated=False, env={"HF_HUB_CACHE": str(tmp_path / "hub")}) is None


PLAN = """
name: mindie-very-long
model: {id: Qwen/Qwen3-30B-A3B}
hardware: sim:910b3-x8
simulation: {time_scale: 300}
engines: [mindie]
serve: {tp: 2}
candidates:
  - name: Template Limits
    # MindIE's own template values (config_template.json), what seed 000 ran with
    set: {extra_args: ["BackendConfig.ModelDeployConfig.maxSeqLen=2560",
                       "BackendConfig.ModelDeployConfig.maxInputTokenLen=2048",
                       "BackendConfig.ScheduleConfig.maxIterTimes=512"]}
profiles:
  very-long: {label: Very Long Prompt, input_len: 32000, output_len: 100, num_prompts: 2, seed: 42}
  too-long: {label: Too Long, input_len: 40000, output_len: 1000, num_prompts: 2}
main_profile: very-long
timeouts: {device_wait_s: 0}
"""


@pytest.mark.slow
def test_mindie_serves_the_very_long_workload_and_failures_are_explained(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(PLAN)
    out = tmp_path / "study"
    try:
        perflab_main(["run", str(plan), "--out", str(out), "--no-live"])
    except SystemExit as exc:  # only a failure exits
        pytest.fail(f"perflab run exited {exc.code}")
    report = json.loads((out / "report.json").read_text())
    (default, template) = report["steps"][0]["entries"] + report["steps"][1]["entries"]
    assert default["result"]["status"] == "ok" and default["result"]["success_rate"] == 1.0
    assert template["result"]["success_rate"] == 0.0
    assert "2 of 2 requests failed" in template["result"]["error"] and "maximum context length is 2560" in template["result"]["error"]
    md = (out / "report.md").read_text()
    assert "maximum context length is 2560" in md  # the reason, not just a percentage
    very_long, too_long_case = report["conclusion"]
    assert very_long["baseline_success_rate"] == 1.0 and very_long["baseline_failures"] is None
    assert too_long_case["baseline_total_token_throughput"] is None
    assert "41000 prompt + output tokens" in too_long_case["baseline_failures"]
    # the recommended command shows the keys perflab set, not a path inside the study
    script = report["recommended_command"]
    assert str(out) not in script and 'MIES_CONFIG_JSON_PATH="$PWD/config.json"' in script
    assert "BackendConfig.ModelDeployConfig.maxSeqLen = 40960" in script
