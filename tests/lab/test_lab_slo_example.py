"""examples/seed-004-slo.yaml, scaled down, end to end on the simulator: deciding by throughput
and by the TPOT objective (max-load) choose different configurations, and the report carries
decide_by, slo and pareto, with a valid pareto.png (issue #12, "Must show")."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import anyio
import pytest

from perflab.lab.decide import DecideBy
from perflab.lab.plan import Plan, load_plan

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "seed-004-slo.yaml"


def _twin() -> Plan:
    """The example with one engine, the batch-cap variant only, and fewer prompts: the same
    decision keys, configurations and SLO."""
    plan = load_plan(EXAMPLE)
    assert plan.decision.decide_by is DecideBy.MAX_LOAD and plan.decision.slo.tpot_ms == 25
    seqs = plan.candidates[0]
    cand = dataclasses.replace(seqs, variants=tuple(v for v in seqs.variants if v.name == "Seqs 32"))
    # many more prompts than concurrent requests: at concurrency = num_prompts every request
    # arrives at once, prefills first and decodes in one batch, and TPOT says nothing of the load
    main = dataclasses.replace(plan.main, num_prompts=512, max_concurrency=64)
    curve = next(p for p in plan.profiles if p.sweep is not None)
    curve = dataclasses.replace(curve, num_prompts=64, sweep=dataclasses.replace(curve.sweep, values=(8, 64)))
    # time scale 40, the demo's: the benchmarks' figures are on the engines' model clock (the
    # server-clock protocol), so the decisions are the same as at 10, in half the wall time
    return dataclasses.replace(plan, engines=("vllm",), candidates=(cand,), profiles=(main, curve),
                               decision=dataclasses.replace(plan.decision, warmup=2),
                               time_scale=40.0)


def _study(plan: Plan, out: Path):
    from perflab.lab.progress import StudyProgress
    from perflab.lab.run.runner import run_study
    from perflab.plugins import load

    with open(os.devnull, "w") as sink:
        progress = StudyProgress(plan.name, live=False, stream=sink)
        return anyio.run(lambda: run_study(load(), plan, out, progress=progress))


@pytest.mark.slow
def test_throughput_and_tpot_objective_choose_differently(tmp_path):
    plan = _twin()
    by_slo = _study(plan, tmp_path / "slo")
    throughput = dataclasses.replace(plan, decision=dataclasses.replace(plan.decision, decide_by=DecideBy.THROUGHPUT))
    by_tps = _study(throughput, tmp_path / "tps")

    def why(o):
        return [(e.label, e.result.summary(), e.result.capacity) for s in o.steps for e in s.entries]

    # throughput: the batch cap costs tokens/s at 64 concurrent requests, not adopted
    assert by_tps.outcome.optimized.label == "vLLM", why(by_tps.outcome)
    assert not by_tps.outcome.steps[1].adopted
    # the TPOT objective: the batch cap keeps p99 TPOT under 25 ms at every load probed, the
    # defaults do not above some 60 concurrent requests: a higher capacity, adopted
    assert by_slo.outcome.optimized.label == "vLLM Seqs 32", why(by_slo.outcome)
    seqs32 = by_slo.outcome.steps[1].entries[0].result
    defaults = by_slo.outcome.steps[0].entries[0].result
    assert seqs32.capacity > defaults.capacity

    data = json.loads((tmp_path / "slo" / "report.json").read_text())
    assert data["decide_by"] == "max-load" and data["slo"] == {"tpot_ms": 25.0, "percentile": 99.0}
    assert data["engine_hours"]["spent"] > 0
    profiles = {p["profile"]: p for p in data["pareto"]}
    assert set(profiles) == {"sharegpt", "interactive"}  # the search's probes, and the sweep
    curve = profiles["interactive"]
    assert [len(c["points"]) for c in curve["configurations"]] == [2, 2]
    assert curve["frontier"] and set(curve["on_frontier"]) <= {c["label"] for c in curve["configurations"]}
    md = (tmp_path / "slo" / "report.md").read_text()
    assert "## Service-level objective" in md and "![Pareto frontier](pareto.png)" in md
    assert "deciding by throughput would favour it" in md

    import matplotlib.image

    png = tmp_path / "slo" / "pareto.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    height, width, _ = matplotlib.image.imread(png).shape
    assert width > 500 and height > 300
    assert json.loads((tmp_path / "tps" / "report.json").read_text())["decide_by"] == "throughput"
