"""A plan's ``engine_versions``: the version each engine's commands are built for, recorded
with each run and said in the report (the choice itself: tests/test_engine_versions.py)."""

from __future__ import annotations

from pathlib import Path

from simstudy import run_sim_study

from perflab.lab.store import Store


def test_a_study_records_the_plans_version_with_each_run(tmp_path: Path) -> None:
    """On the simulated A100 (SGLang 0.5.5.post1 installed) a plan builds SGLang's commands for
    0.5.9: each run records 0.5.9, the study warns about the mismatch, the report says so."""
    plan = """
name: versions
model: Qwen/Qwen3-8B
hardware: sim:a100-80g-x8
simulation: {time_scale: 50}
engines: [sglang]
engine_versions: {sglang: "0.5.9"}
serve: {speculative_config: {method: ngram, num_speculative_tokens: 4, prompt_lookup_max: 6}}
profiles:
  main: {input_len: 32, output_len: 16, num_prompts: 4}
timeouts: {startup_s: 60, benchmark_s: 120}
"""
    out = tmp_path / "study"
    assert run_sim_study(plan, out).exit_code == 0
    store = Store(out)
    assert store.get_meta("versions") == {"sglang": "0.5.9"}
    assert store.get_meta("version_origins") == {"sglang": "plan"}
    runs = store.db.execute("SELECT version FROM runs").fetchall()
    assert runs and {r[0] for r in runs} == {"0.5.9"}
    warning = "sglang's commands are built for 0.5.9 (the plan's engine_versions), but 0.5.5.post1 is installed here"
    assert warning in (out / "study.log").read_text()
    assert "- SGLang: v0.5.9 (commands built for the plan's engine_versions)" in (out / "report.md").read_text()
