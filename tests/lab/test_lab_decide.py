"""Deciding like a platform engineer (issue #12): ranking by ``decide_by``, noise-aware adoption,
the Pareto frontier, stopped-early results, and what report.json carries — on a fake measure
whose numbers are written here (the decisions are the code under test, not the numbers)."""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest

from perflab.contract.status import Status
from perflab.lab.options import Configuration
from perflab.lab.plan import Profile, load_plan_text
from perflab.lab.report import ReportContext, build_json, pareto_data, pareto_front, render_markdown
from perflab.lab.report.publish import write_report
from perflab.lab.study import ConfigResult, conduct

CTX = ReportContext(display={"vllm": "vLLM", "sglang": "SGLang"}, simulated=True, hardware_spec="sim:h100-80g-x1",
                    engine_hours={"spent": 0.42, "full_method_estimate": 0.71, "saved_pct": 40.8})

PLAN = """
model: Qwen/Qwen3.5-9B
engines: [vllm, sglang]
baseline: {{engine: vllm}}
{decision}
candidates:
  - name: Max Num Seqs
    variants:
      - {{name: Seqs 512, set: {{max_num_seqs: 512}}}}
profiles:
  sharegpt: {{label: ShareGPT, dataset: synthetic-sharegpt, num_prompts: 200{sweep}}}
"""

SLO = "slo: {tpot_ms: 50, percentile: 99}"


def _metrics(tps: float, goodput: float, p99_tpot: float, mean_tpot: float | None = None) -> dict[str, Any]:
    return {"completed": 200, "failed": 0, "total_token_throughput": tps, "output_throughput": tps / 2,
            "request_goodput": goodput, "p99_tpot_ms": p99_tpot, "mean_tpot_ms": mean_tpot or p99_tpot * 0.8}


class Fake:
    """A measure answering from a table: name -> ConfigResult; records each call's to_beat."""

    def __init__(self, table: dict[str, ConfigResult]) -> None:
        self.table = table
        self.calls: list[tuple[str, float | None]] = []

    @staticmethod
    def name(config: Configuration) -> str:
        return config.engine + ("+512" if config.options.get("max_num_seqs") == 512 else "")

    async def __call__(self, config: Configuration, profiles: list[Profile], *, step: str, label: str,
                       to_beat: float | None = None) -> dict[str, ConfigResult]:
        self.calls.append((self.name(config), to_beat))
        return {p.name: self.table.get(self.name(config), ConfigResult(Status.PENDING)) for p in profiles}


def _conduct(decision: str, table: dict[str, ConfigResult], sweep: str = ""):
    plan = load_plan_text(PLAN.format(decision=decision, sweep=sweep))
    fake = Fake(table)
    o = anyio.run(lambda: conduct(plan, fake, display=lambda e: CTX.name(e)))
    return o, fake


# vLLM: the most tokens/s, but a slow p99 TPOT (few requests meet 50 ms, a low capacity);
# SGLang: fewer tokens/s, fast TPOT (more requests meet it, a higher capacity)
TABLE = {
    "vllm": ConfigResult(Status.OK, _metrics(2000.0, 3.0, 80.0), 200, capacity=8.0),
    "sglang": ConfigResult(Status.OK, _metrics(1700.0, 6.5, 40.0), 200, capacity=24.0),
    "vllm+512": ConfigResult(Status.OK, _metrics(2100.0, 2.0, 95.0), 200, capacity=4.0),
    "sglang+512": ConfigResult(Status.OK, _metrics(1650.0, 7.0, 38.0), 200, capacity=32.0),
}


@pytest.mark.parametrize(("decision", "engine", "adopted", "to_beat"), [
    ("decide_by: throughput", "vLLM", True, 2000.0),  # vLLM 2100 > 2000
    (f"decide_by: goodput\n{SLO}", "SGLang", True, 6.5),  # SGLang Seqs 512: 7.0 > 6.5 req/s
    (f"decide_by: max-load\n{SLO}", "SGLang", True, 24.0),  # 32 > 24
])
def test_each_decide_by_ranks_and_passes_to_beat(decision, engine, adopted, to_beat):
    o, fake = _conduct(decision, TABLE)
    step1, step2 = o.steps
    assert step1.chosen.label == engine
    assert step2.adopted is adopted
    # the engine step: nothing to beat first, then the first engine's figure; the candidate
    # step: the current best's figure
    assert fake.calls[0][1] is None
    assert fake.calls[2] == (fake.calls[2][0], to_beat)
    assert all(b is None for _, b in fake.calls[3:])  # the other profiles: no early stop


def test_throughput_and_slo_choose_differently_and_the_report_says_why():
    tp, _ = _conduct("decide_by: throughput", TABLE)
    ml, _ = _conduct(f"decide_by: max-load\n{SLO}", TABLE)
    assert tp.optimized.config.engine == "vllm" and ml.optimized.config.engine == "sglang"
    md = render_markdown(ml, CTX)
    slo = md[md.index("## Service-level objective"):md.index("## Experimental Setup")]
    assert "ranked by capacity: the highest request rate on the main profile at which p99 TPOT ≤ 50 ms" in slo
    assert "| Configuration | Capacity (req/s) | p99 TPOT (ms, limit 50) | SLO |" in slo
    assert "| vLLM | 8.00 req/s | 80.00 | missed |" in slo
    assert "| SGLang | 24.00 req/s | 40.00 | met |" in slo
    assert "Of the figures above, vLLM has the highest total token throughput (2000.00 tok/s): deciding by throughput would favour it; " \
        "under the SLO, SGLang Seqs 512 is the choice." in slo
    assert "| Optimization Option | Capacity Improvement | Details |" in md
    assert "Recommended configuration for optimizing the highest load meeting the service-level objective" in md
    assert "p99 TPOT(ms): 38.00 (limit 50, met)" in md  # the conclusion shows the percentile next to the limit
    # the throughput plan's report has no SLO section and keeps the seeds' words
    md_tp = render_markdown(tp, CTX)
    assert "## Service-level objective" not in md_tp and "| Throughput Improvement |" in md_tp


def _noisy(tps: float, spread: float) -> ConfigResult:
    m = _metrics(tps, 1.0, 40.0)
    reps = [{**m, "total_token_throughput": tps * f} for f in (1 - spread / 100, 1.0, 1 + spread / 100)]
    return ConfigResult(Status.OK, m, 200, repeats=reps, noise={"total_token_throughput": spread * 0.8165})


@pytest.mark.parametrize(("spread", "adopted"), [(4.0, False), (0.5, True)])
def test_gain_within_the_measured_noise_is_not_adopted(spread, adopted):
    """+3% over the current best: adopted when the repeats spread by ±0.4%, not when by ±3.3%."""
    table = {"vllm": _noisy(2000.0, spread), "sglang": _noisy(1000.0, spread), "vllm+512": _noisy(2060.0, spread)}
    o, _ = _conduct("repeats: 3\nmin_improvement_pct: 1", table)
    step = o.steps[1]
    assert round(step.vs_base_pct, 1) == 3.0
    assert step.adopted is adopted and step.within_noise is (not adopted)
    if not adopted:
        assert "within noise (±4.6% measured over 3 repeats), not adopted" in step.statement
        assert "vLLM Seqs 512 (2060.00 tok/s ±3.3%)" in step.statement  # mean and spread
        row = build_json(o, CTX)["summary"][1]
        assert row["detail"].endswith("within noise, not adopted") and not row["adopted"]
        assert o.optimized.config == load_plan_text(PLAN.format(decision="", sweep="")).engine_defaults("vllm")
    md = render_markdown(o, CTX)
    assert "# Mean of 3 repeats; spread (relative standard deviation): total_token_throughput ±" in md
    assert f"Total TPS: 2000.00 ±{spread * 0.8165:.1f}%" in md  # the conclusion: mean and spread


def test_the_minimum_improvement_still_applies_without_noise():
    """One repeat (no spread measured): the seeds' rule alone."""
    table = {"vllm": ConfigResult(Status.OK, _metrics(2000.0, 1, 40), 200),
             "sglang": ConfigResult(Status.OK, _metrics(1000.0, 1, 40), 200),
             "vllm+512": ConfigResult(Status.OK, _metrics(2010.0, 1, 40), 200)}
    o, _ = _conduct("min_improvement_pct: 1", table)
    assert not o.steps[1].adopted and not o.steps[1].within_noise
    assert o.steps[1].statement.startswith("Result: no improvement")


def test_stopped_early_is_shown_with_its_figures_never_as_a_failure():
    lost = ConfigResult(Status.STOPPED_EARLY, _metrics(900.0, 1, 40), 200,
                        stopped_early={"reason": "lost", "throughput": 900.0, "to_beat": 2000.0, "confidence": 0.99})
    o, _ = _conduct("decide_by: throughput", {**TABLE, "vllm+512": lost})
    step = o.steps[1]
    assert not step.adopted and step.entries[0].note == "Stopped early: lost (throughput 900, to_beat 2000, confidence 0.99)"
    md = render_markdown(o, CTX)
    assert "# Stopped early (measured, not a failure): lost (throughput 900, to_beat 2000, confidence 0.99)" in md
    assert "failed" not in build_json(o, CTX)["summary"][1]["detail"]
    assert build_json(o, CTX)["summary"][1]["detail"].startswith("not adopted; vLLM Seqs 512: Stopped early: lost")
    assert "Engine-hours: 0.42 spent" in md and "about 0.71 (41% saved by stopping early)" in md
    # the step's only variant stopped early: it lost, it did not fail to produce a result
    assert step.statement == ("Result: no improvement; vLLM Seqs 512 stopped early, unable to be adopted over the "
                              "current best vLLM (2000.00 tok/s); keeping vLLM.")


def test_pareto_front():
    pts = [(10.0, 100.0), (20.0, 80.0), (15.0, 70.0), (30.0, 20.0), (5.0, 100.0), (30.0, 10.0), (25.0, 20.0)]
    # (15, 70) is dominated by (20, 80); (5, 100) by (10, 100); (30, 10) by (30, 20); (25, 20) too
    assert pareto_front(pts) == [0, 1, 3]
    assert pareto_front([]) == []
    assert pareto_front([(1.0, 1.0), (1.0, 1.0)]) == [1] or pareto_front([(1.0, 1.0), (1.0, 1.0)]) == [0]


def _curve(points: list[tuple[int, float, float]], capacity: float | None = None) -> ConfigResult:
    """(max_concurrency, output tok/s, mean TPOT ms) per load point."""
    pts = [{"load": {"max_concurrency": c}, "metrics": {"output_throughput": o, "mean_tpot_ms": t,
                                                       "total_token_throughput": 2 * o, "p99_tpot_ms": t * 1.2},
            "repeats": [], "noise": {}, "slo_met": t * 1.2 <= 50} for c, o, t in points]
    last = pts[-1]["metrics"]
    return ConfigResult(Status.OK, {**last, "completed": 200, "failed": 0, "request_goodput": 1.0}, 200,
                        points=pts, capacity=capacity)


def test_pareto_data_crossing_curves_and_files(tmp_path):
    """A high-batch configuration with more tokens/s at high load but a slower TPOT against one
    that is faster per user: both are on the frontier, and the chart is a PNG."""
    table = {
        "vllm": _curve([(1, 100.0, 10.0), (16, 1200.0, 20.0), (64, 2400.0, 60.0)], capacity=16),
        "sglang": _curve([(1, 90.0, 11.0), (16, 1100.0, 22.0), (64, 2000.0, 45.0)], capacity=64),
        "vllm+512": _curve([(1, 80.0, 12.5), (16, 1000.0, 30.0), (64, 2600.0, 80.0)], capacity=1),
        "sglang+512": _curve([(1, 95.0, 10.5), (16, 1150.0, 21.0), (64, 2100.0, 47.0)], capacity=64),
    }
    sweep = ", sweep: {max_concurrency: [1, 16, 64]}"
    o, _ = _conduct(f"decide_by: max-load\nsearch: max_concurrency\n{SLO}", table, sweep)
    (prof,) = pareto_data(o)
    assert prof["profile"] == "sharegpt"
    assert [c["label"] for c in prof["configurations"]] == ["vLLM", "SGLang", "SGLang Seqs 512"]  # as measured
    vllm = prof["configurations"][0]
    assert vllm["accelerators"] == 1 and vllm["points"][0] == {
        "load": {"max_concurrency": 1}, "per_user": 100.0, "per_accelerator": 100.0, "slo_met": True, "pareto": True}
    # per user (x) / per accelerator (y): vLLM 100/100, 50/1200, 16.7/2400; SGLang 90.9/90,
    # 45.5/1100, 22.2/2000; SGLang Seqs 512 95.2/95, 47.6/1150, 21.3/2100 — vLLM's first two
    # dominate the SGLangs' first two; at 64 concurrent requests each trades speed for tokens
    assert prof["on_frontier"] == ["vLLM", "SGLang Seqs 512", "SGLang"]
    front = [(f["label"], f["load"]["max_concurrency"]) for f in prof["frontier"]]
    assert front == [("vLLM", 64), ("SGLang Seqs 512", 64), ("SGLang", 64), ("vLLM", 16), ("vLLM", 1)]
    paths = write_report(o, CTX, tmp_path)
    png = paths["pareto"].read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    data = json.loads(paths["json"].read_text())
    assert data["decide_by"] == "max-load" and data["slo"] == {"tpot_ms": 50.0, "percentile": 99.0}
    assert data["pareto"][0]["on_frontier"] == ["vLLM", "SGLang Seqs 512", "SGLang"]
    assert data["engine_hours"] == {"spent": 0.42, "full_method_estimate": 0.71, "saved_pct": 40.8}
    md = paths["markdown"].read_text()
    assert "![Pareto frontier](pareto.png)" in md and "The curves cross" in md
    assert "| Configuration | Capacity (concurrent requests) |" in md


def test_no_pareto_without_load_curves(tmp_path):
    o, _ = _conduct("decide_by: throughput", TABLE)
    paths = write_report(o, CTX, tmp_path)
    assert "pareto" not in paths and not (tmp_path / "pareto.png").exists()
    data = json.loads(paths["json"].read_text())
    assert data["pareto"] == [] and data["decide_by"] == "throughput" and data["slo"] is None


def test_engines_closer_than_the_noise_are_said_to_be_indistinguishable():
    table = {"vllm": _noisy(2000.0, 4.0), "sglang": _noisy(1960.0, 4.0), "vllm+512": _noisy(1000.0, 4.0)}
    o, _ = _conduct("repeats: 3", table)
    assert o.steps[0].chosen.label == "vLLM"  # still the higher mean: someone must be chosen
    assert "(vLLM leads SGLang by +2.0%, within the measured noise of ±4.6%: the engines are indistinguishable here)" \
        in o.steps[0].statement
