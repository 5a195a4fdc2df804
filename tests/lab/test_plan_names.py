"""Profile, candidate and variant names may hold any text ('/', '..', spaces): file names derive
from them through one function (perflab.lab.store.file_stem), safe and one per name; a study
with such names runs to the end (it used to fail mid-study with FileNotFoundError)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from simstudy import run_sim_study

from perflab.lab.plan import load_plan_text
from perflab.lab.store import file_stem

HOSTILE = ["a/b", "a b", "A-B", "..", ".", "", "../../etc/passwd", "x" * 300, "ünï/cödé", "abc-0123456789ab", "-", "a\nb"]


def test_every_name_gets_a_safe_file_stem_of_its_own() -> None:
    stems = [file_stem(n) for n in [*HOSTILE, "sharegpt", "short_prompt"]]
    assert len(set(stems)) == len(stems)  # one per name: 'a/b', 'a b', 'A-B' never share a file
    assert len({s.lower() for s in stems}) == len(stems)  # not even on a case-insensitive disk
    for s in stems:
        assert s and "/" not in s and "\0" not in s and not s.startswith(".") and ".." not in s and len(s) <= 60
    assert file_stem("sharegpt") == "sharegpt"  # plain names keep their files' names


def test_candidate_and_variant_names_holding_a_slash_resolve_exactly() -> None:
    plan = load_plan_text("""
model: m
engines: [vllm]
candidates:
  - {name: a/b, variants: [{name: c, set: {max_num_seqs: 8}}]}
  - {name: a, variants: [{name: b/c, set: {max_num_seqs: 16}}]}
combinations:
  - {name: both, of: [a/b/c]}
profiles: {p: {input_len: 8, output_len: 2}}
""", known_engines=["vllm"])
    cand, var = plan.variant("a/b/c")
    assert (cand.name, var.name) in {("a/b", "c"), ("a", "b/c")}
    assert plan.variant("a/b/c") == plan.variant("a/b/c")


PLAN = """
name: odd-names
model: Qwen/Qwen3-8B
hardware: sim:a100-80g-x8
simulation: {time_scale: 50}
engines: [vllm]
candidates:
  - name: "Seqs / ../x"
    variants:
      - {name: "../../64 seqs", set: {max_num_seqs: 64}}
profiles:
  "a/b ..": {input_len: 64, output_len: 8, num_prompts: 12, max_concurrency: 4}
  "a b": {input_len: 32, output_len: 8, num_prompts: 8, max_concurrency: 4}
timeouts: {startup_s: 60, benchmark_s: 120}
early_stop: false
"""


@pytest.mark.slow
def test_a_study_whose_names_hold_any_text_runs_to_the_end(tmp_path: Path) -> None:
    out = tmp_path / "study"
    summary = run_sim_study(PLAN, out)
    report = json.loads((out / "report.json").read_text())
    assert report["complete"] is True, report
    measured: set[str] = set()
    for run in (out / "runs").iterdir():
        for name in json.loads((run / "config.json").read_text())["profiles"]:
            assert (run / f"bench-{file_stem(name)}.json").is_file(), sorted(p.name for p in run.iterdir())
            assert (run / f"measurement-{file_stem(name)}.json").is_file()
            measured.add(name)
    assert measured == {"a/b ..", "a b"}
    assert "../../64 seqs" in (out / "report.md").read_text()
    # nothing was written outside the study
    assert sorted(p.name for p in tmp_path.iterdir()) == ["study"]
    assert summary is not None
