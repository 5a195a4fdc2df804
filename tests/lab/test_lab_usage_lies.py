"""A study never ranks a server that lies about its token counts (issue 24 item 8): a variant
whose simulated engine reports ``usage`` ``prompt_tokens: -5, completion_tokens: 1000000``
(``PERFLAB_SIM_FAULT=lying-usage``) streamed true tokens; believed, it would "win" by far."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simstudy import run_sim_study

PLAN = """
name: lies
model: Qwen/Qwen3-8B
hardware: sim:a100-80g-x1
simulation: {time_scale: 50}
engines: [vllm]
candidates:
  - name: Usage
    variants:
      - {name: liar, set: {env: {PERFLAB_SIM_FAULT: lying-usage}}}
profiles:
  main: {label: Main, input_len: 32, output_len: 8, num_prompts: 12}
timeouts: {startup_s: 60, benchmark_s: 120}
"""


def test_a_server_with_impossible_token_counts_is_a_failed_measurement_never_the_recommendation(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PERFLAB_SIM_STATE_DIR", str(tmp_path / "sim-state"))
    out = tmp_path / "study"
    run_sim_study(PLAN, out)
    report = json.loads((out / "report.json").read_text())
    entries = {e["variant"]: e for step in report["steps"] for e in step["entries"]}
    liar = entries["liar"]
    assert (liar["result"]["status"], liar["eligible"], liar["result"]["total_token_throughput"]) == ("failed", False, None)
    assert liar["result"]["error"] == ("the server reported impossible token counts (12 of 12 requests failed: 12 × "
                                       "\"the server's token counts are impossible: usage.prompt_tokens is -5, not a token count\")")
    assert entries[None]["result"]["status"] == "ok"  # the honest baseline
    assert report["optimized"]["variant"] is None  # the baseline stays: never the liar
    measured = json.loads(next((out / "runs").glob("*-liar/measurement-main.json")).read_text())
    assert (measured["status"], measured["metrics"]["usage_mismatches"], measured["metrics"]["total_output_tokens"]) == ("failed", 12, 0)
