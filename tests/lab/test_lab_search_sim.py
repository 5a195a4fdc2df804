"""Issue 29, the engines' part, on the simulator through the CLI: a search interrupted with
Ctrl-C resumes without launching a finished trial again, and a search plan with candidates
finds what the seeds' method misses. The space is the small one of test_lab_search (2 engines
x 3 x 3), whose ground truth (every point measured to the end) is its fixture."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from test_lab_e2e import _interrupt_after_runs, _perflab, _rows, _tagged, _wait
from test_lab_search import FIXTURE

TRUTH = json.loads(FIXTURE.read_text(encoding="utf-8"))


def _key(point: dict) -> str:
    return json.dumps(point, sort_keys=True)


FIGURES = {_key(p["point"]): p["value"] for p in TRUTH["points"]}


@pytest.mark.slow
def test_sigint_mid_search_then_resume_continues_its_trials(tmp_path: Path) -> None:
    plan = tmp_path / "search.yaml"
    plan.write_text("name: resumed\n" + TRUTH["plan"].replace("method: grid\n", "method: search\ntuning: {seed: 0}\n"))
    out = tmp_path / "study"
    db = out / "study.db"
    tag = uuid.uuid4().hex
    proc = _perflab(["run", str(plan), "--out", str(out), "--no-live"], tag, tmp_path)
    rc, err = _interrupt_after_runs(proc, db, 2, 180)  # two trials finished, the next running
    assert rc == 130, err
    assert _tagged(tag) == [], "engine processes survived the interrupt"
    finished = {r[0] for r in _rows(db, "SELECT config_key FROM runs WHERE state = 'done'")}
    labels = {r[0] for r in _rows(db, "SELECT label FROM runs WHERE state = 'done'")}
    assert len(finished) >= 2

    rc, text, err = _wait(_perflab(["run", str(plan), "--out", str(out), "--no-live", "--json"], tag, tmp_path), 300)
    assert rc == 0, err
    assert json.loads(text)["complete"]
    # nothing finished before the interrupt was launched again
    again = {r[0] for r in _rows(db, "SELECT config_key FROM runs WHERE session_id = 2")}
    assert again and not again & finished
    report = json.loads((out / "report.json").read_text())
    step = report["steps"][0]
    trials = [e["trial"] for e in step["entries"]]
    first = [t for t, e in zip(trials, step["entries"], strict=True) if e["label"] in labels]
    assert len(first) >= 2, "the first session's trials are not in the resumed search"
    # the trial numbers continue: the resumed session's trials come after the first session's
    later = [t for t in trials if t not in first]
    assert later and min(t["number"] for t in later) > max(t["number"] for t in first)
    points = [_key(t["point"]) for t in trials]
    assert len(points) == len(set(points)) == step["search"]["trials_asked"]  # each point once, all asked
    # what each complete trial measured is the grid's ground truth for its point (the simulator
    # is deterministic, to its clock's jitter): the resumed search's figures are an uninterrupted one's
    for t in trials:
        if t["state"] == "complete":
            assert t["value"] == pytest.approx(FIGURES[_key(t["point"])], rel=1e-3), t
    gap = (TRUTH["best"]["value"] - step["search"]["best"]["value"]) / TRUTH["best"]["value"] * 100
    assert gap <= 2.0, step["search"]["best"]


@pytest.mark.slow
def test_a_search_plan_with_candidates_finds_what_the_seeds_method_misses(tmp_path: Path) -> None:
    """Every engine serves at most 32 sequences by the plan's serve; the seeds' method tries
    the engines, then its one candidate (more batched tokens), and stops there. The search
    over the space (where max_num_seqs is a dimension) reaches the grid's best: the report
    states both figures, the gain and each method's engine-hours, and recommends the search's."""
    from simstudy import run_sim_study

    text = TRUTH["plan"].replace("method: grid\n", "method: search\ntuning: {seed: 0}\nserve: {max_num_seqs: 32}\n"
                                 "candidates:\n  - {name: Max Batched Tokens, set: {max_batched_tokens: 32768}}\n")
    summary = run_sim_study(text, tmp_path / "seeded")
    steps = summary.outcome.steps
    assert [s.kind for s in steps] == ["engine", "candidate", "search"]
    vs = steps[2].search["vs_seeds"]
    assert vs["recommended"] == "search" and vs["gain_pct"] > 5, vs
    assert vs["search_best"]["value"] >= TRUTH["best"]["value"] * 0.98
    assert vs["seeds_engine_hours"] > 0 and vs["search_engine_hours"] > 0
    assert summary.outcome.optimized.label == vs["search_best"]["label"]
    md = (tmp_path / "seeded" / "report.md").read_text()
    assert "| Seeds' method | " in md and "recommended: the search's best." in md
    html = (tmp_path / "seeded" / "report.html").read_text()
    assert "Seeds&#x27; method" in html or "Seeds' method" in html


ENGINE_OPTIONS_GRID = """
name: engine-options
model: Qwen/Qwen3-8B
hardware: sim:a100-80g-x8
simulation: {time_scale: 10000}
engines: [vllm, sglang]
method: grid
space:
  engine_options: {vllm: {block_size: [16, 32]}, sglang: {schedule_policy: [lpm]}}
profiles:
  main: {input_len: 64, output_len: 16, num_prompts: 12}
"""


@pytest.mark.slow
def test_engine_options_in_the_space_reach_the_engine_or_are_refused_before_launch(tmp_path: Path) -> None:
    """vLLM's block_size reaches its command line (the plugin maps it to --block-size); the
    SGLang plugin maps no schedule_policy, so SGLang's point is refused without a launch."""
    plan = tmp_path / "grid.yaml"
    plan.write_text(ENGINE_OPTIONS_GRID)
    out = tmp_path / "study"
    rc, _, err = _wait(_perflab(["run", str(plan), "--out", str(out), "--no-live", "--json"], uuid.uuid4().hex, tmp_path), 300)
    assert rc == 0, err
    step = json.loads((out / "report.json").read_text())["steps"][0]
    states = {e["label"]: e["trial"]["state"] for e in step["entries"]}
    assert states == {"vLLM block_size=16": "complete", "vLLM block_size=32": "complete",
                      "SGLang schedule_policy=lpm": "unsupported"}, states
    assert step["search"]["points"] == 3
    scripts = [r[0] for r in _rows(out / "study.db", "SELECT script FROM runs WHERE engine = 'vllm' AND script IS NOT NULL")]
    assert any("--block-size 32" in s for s in scripts) and any("--block-size 16" in s for s in scripts), scripts
    refused = _rows(out / "study.db", "SELECT reasons, script, log FROM runs WHERE engine = 'sglang'")
    assert len(refused) == 1 and "schedule_policy" in refused[0][0]
    assert refused[0][1:] == (None, None)  # refused before launch: no serving script, no engine log
