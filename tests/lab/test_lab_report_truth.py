"""Issue #24, items 9-11: what a report and the progress lines show is what was measured —
stopped-early blocks whose counts agree and which say once why they stopped (9), the price
of a decision in latency (10), and progress and time series that show what they claim (11)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import anyio
import pytest

from perflab.bench.trace import CANCELLED
from perflab.contract.errors import UsageError
from perflab.contract.status import Status
from perflab.lab.options import Configuration
from perflab.lab.plan import Profile, load_plan_text
from perflab.lab.report import ReportContext, _entry_lines, build_json, render_markdown
from perflab.lab.report.publish import write_report
from perflab.lab.study import ConfigResult, Entry, conduct, stopped_early_text
from perflab.observe import END, START, Sample, Watching

# --------------------------------------------------------------------------- 9: stopped-early blocks


def _partial(completed: int, cut: int, other_failed: int = 0, never: int = 0) -> Any:
    """A cancelled run's partial BenchResult as the client makes it (duck-typed)."""
    ok = [SimpleNamespace(success=True, error=None)] * completed
    cancelled = [SimpleNamespace(success=False, error=CANCELLED)] * cut
    broken = [SimpleNamespace(success=False, error="HTTP 500")] * other_failed
    metrics = {"completed": completed, "failed": cut + other_failed, "duration": 44.874, "num_prompts": 1000,
               "total_input_tokens": 51474, "total_output_tokens": 31987, "request_throughput": completed / 44.874,
               "output_throughput": 31987 / 44.874, "total_token_throughput": (51474 + 31987) / 44.874,
               "mean_tpot_ms": 83.1, "rtfx": 0.0}
    return SimpleNamespace(metrics=metrics, requests=ok + cancelled + broken,
                           info={"cancelled": True, "requests_not_recorded": never})


# the early stop's decision, made when 233 requests had completed (the demo's TensorRT-LLM 16k)
DECIDED = {"reason": "lost", "completed": 233, "num_prompts": 1000, "elapsed_s": 44.771, "estimated_full_s": 216.593,
           "forecast_token_throughput": 1847.3, "forecast_end_s": 214.95, "to_beat": 1872.11, "limit": 1872.11}


def _stopped_entry(partial: Any) -> Entry:
    from perflab.lab.run.executor import stopped_early_record

    metrics, info = stopped_early_record(DECIDED, partial, 1000)
    res = ConfigResult(Status.STOPPED_EARLY, metrics, 1000, stopped_early=info)
    return Entry("TensorRT-LLM 16k", Configuration("trtllm", {"model": "m"}), res,
                 note=f"Stopped early: {stopped_early_text(info)}")


def test_a_stopped_block_counts_requests_cut_short_as_no_failure_and_agrees_with_its_sentence() -> None:
    """Demo: "Failed requests: 765" for requests the stop cut short, "Successful requests: 235"
    against "after 233 of 1000", and "Stopped early" twice in the block."""
    block = "\n".join(_entry_lines(_stopped_entry(_partial(235, 760, other_failed=3, never=2)), ReportContext()))
    assert "Successful requests:                     235" in block
    assert "Failed requests:                         3" in block  # only those that failed on their own
    assert block.count("Stopped early") == 1
    (sentence,) = [line for line in block.splitlines() if "Stopped early" in line]
    assert "after 235 of 1000 requests completed (45 of ~217 s; 760 in flight were cut short, 2 never sent)" in sentence
    assert "233" not in block  # the decision's count, two requests before the client stopped
    # the partial throughput, above what the run could reach, is named as the measured part's only
    assert "could reach at most 1847 tok/s, below the 1872 it needed to be adopted" in sentence
    assert "the 1859.90 tok/s measured is the rate of those 45 s only, not the full run's" in sentence


def test_a_stopped_record_keeps_the_decisions_counts_for_diagnosis() -> None:
    from perflab.lab.run.executor import stopped_early_record

    metrics, info = stopped_early_record(DECIDED, _partial(235, 765), 1000)
    assert metrics is not None and metrics["failed"] == 0 and metrics["completed"] == 235
    assert info["decided_at"] == {"completed": 233, "elapsed_s": 44.771}
    assert info["completed"] == 235 and info["elapsed_s"] == 44.874 and info["cut_short"] == 765
    assert info["never_sent"] == 0 and DECIDED["completed"] == 233  # the decision itself is not changed
    assert stopped_early_record(DECIDED, None, 1000) == (None, DECIDED)


# --------------------------------------------------------------------------- 11: progress and series


def test_the_progress_line_of_several_profiles_names_each_profile() -> None:
    """"benchmarking Very Long Prompt" was followed by "✓ Baseline: 1660.51 tok/s", the reused
    main profile's figure."""
    from perflab.lab.run.runner import result_summary

    plan = load_plan_text("""
name: p
model: m
hardware: sim:a100-80g-x8
engines: [vllm]
profiles:
  sharegpt: {label: ShareGPT, input_len: 10, output_len: 10, num_prompts: 10}
  very-long: {label: Very Long Prompt, input_len: 32000, output_len: 100, num_prompts: 3}
""", path=Path("p.yaml"))
    main = ConfigResult(Status.OK, {"total_token_throughput": 1660.51}, 10, reused=True)
    long = ConfigResult(Status.OK, {"total_token_throughput": 812.25}, 3)
    text = result_summary(plan.profiles, {"sharegpt": main, "very-long": long})
    assert text == "ShareGPT: 1660.51 tok/s (reused); Very Long Prompt: 812.25 tok/s"
    assert result_summary(plan.profiles[:1], {"sharegpt": main}) == "1660.51 tok/s (reused)"


def test_engine_metrics_series_are_on_the_benchmarks_own_time_axis(tmp_path: Path) -> None:
    """A 235.89 s benchmark's engine metrics showed running > 0 from 69 s to 563 s: the samples
    counted from before the warm-up, on the host's clock times the time scale, which a loaded
    host running the simulator behind its scale stretches. Measured in the demo (runs/001-vllm,
    ShareGPT, 235.89 s): on the engines' clock running > 0 spans 17.7 s to 245.1 s (the end mark,
    where the client had read the last response on a loaded host, at 494 s)."""
    from perflab.lab.report.html import load_series
    from perflab.observe.telemetry import ENGINE_T

    w = Watching()
    wall = [0.0, 30.0, 69.0, 300.0, 400.0, 563.0, 570.0]  # the sampling clock (host time × scale)
    engine = [980.0, 990.0, 1000.0, 1100.0, 1240.0, 1494.0, 1500.0]  # the engines' model clock
    running = [0.0, 0.0, 8.0, 64.0, 1.0, 0.0, 0.0]
    marks = [None, None, START, None, None, END, None]
    w.samples["server_metrics"] = [Sample(t, {"running": r}, m) for t, r, m in zip(wall, running, marks, strict=True)]
    w.samples["telemetry"] = [Sample(t, {"power_w.0": 300.0, ENGINE_T: e}, m)
                              for t, e, m in zip(wall, engine, marks, strict=True)]
    series = w.series_json(ENGINE_T)["server_metrics"]
    assert [s["t"] for s in series] == [-20.0, -10.0, 0.0, 100.0, 240.0, 494.0, 500.0]
    # without the engines' clock: the sampling clock, from the timed run's start
    del w.samples["telemetry"]
    assert [s["t"] for s in w.series_json(ENGINE_T)["server_metrics"]] == [-69.0, -39.0, 0.0, 231.0, 331.0, 494.0, 501.0]
    w.samples["telemetry"] = [Sample(t, {"power_w.0": 300.0, ENGINE_T: e}, m)
                              for t, e, m in zip(wall, engine, marks, strict=True)]
    run = tmp_path / "run"
    run.mkdir()
    (run / "observe-long.json").write_text(json.dumps(w.series_json(ENGINE_T)))
    charted, _ = load_series(run, "long")
    # the chart shows the timed run, from 0 where it began to where it ended
    assert [t for t, _ in charted["server_metrics"]] == [0.0, 100.0, 240.0, 494.0]


# --------------------------------------------------------------------------- 10: a decision's price

PLAN = """
model: Qwen/Qwen3-32B
engines: [vllm, trtllm]
baseline: {{engine: vllm}}
{extra}
candidates:
  - name: Max Num Seqs
    variants:
      - {{name: Seqs 512, set: {{max_num_seqs: 512}}}}
profiles:
  sharegpt: {{label: ShareGPT, dataset: synthetic-sharegpt, num_prompts: 200}}
  short: {{label: Short Prompt, input_len: 128, output_len: 4, num_prompts: 200}}
"""
CTX = ReportContext(display={"vllm": "vLLM", "trtllm": "TensorRT-LLM"})


def _m(tps: float, mean_tpot: float, p99_tpot: float, mean_ttft: float = 100.0) -> dict[str, Any]:
    return {"completed": 200, "failed": 0, "total_token_throughput": tps, "mean_tpot_ms": mean_tpot,
            "median_tpot_ms": mean_tpot, "p99_tpot_ms": p99_tpot, "mean_ttft_ms": mean_ttft,
            "median_ttft_ms": mean_ttft, "p99_ttft_ms": mean_ttft * 2}


class Fake:
    """A measure answering from a table: (name, profile) -> metrics (the decisions are under test)."""

    def __init__(self, table: dict[tuple[str, str], dict[str, Any]]) -> None:
        self.table = table

    async def __call__(self, config: Configuration, profiles: list[Profile], *, step: str, label: str,
                       to_beat: float | None = None) -> dict[str, ConfigResult]:
        name = config.engine + ("+512" if config.options.get("max_num_seqs") == 512 else "")
        return {p.name: ConfigResult(Status.OK, self.table[(name, p.name)], 200) for p in profiles}


# seed 002's price: the optimized engine wins ShareGPT's throughput and triples Short Prompt's mean TPOT
TABLE = {("vllm", "sharegpt"): _m(1660.0, 100.0, 150.0), ("vllm", "short"): _m(2900.0, 683.79, 700.0),
         ("trtllm", "sharegpt"): _m(1870.0, 90.0, 160.0), ("trtllm", "short"): _m(3200.0, 2220.74, 2500.0),
         ("trtllm+512", "sharegpt"): _m(2000.0, 95.0, 250.0, 130.0), ("trtllm+512", "short"): _m(3300.0, 2300.0, 2600.0),
         ("vllm+512", "sharegpt"): _m(1500.0, 100.0, 150.0)}


def _conduct(extra: str = ""):
    plan = load_plan_text(PLAN.format(extra=extra))
    return anyio.run(lambda: conduct(plan, Fake(TABLE), display=CTX.name))


def test_the_recommendations_latency_regressions_are_flagged_in_the_table_html_and_json(tmp_path: Path) -> None:
    """Seed 002: mean TPOT 683.79 → 2220.74 ms on Short Prompt with no mark anywhere."""
    o = _conduct()
    assert o.optimized is not None and o.optimized.label == "TensorRT-LLM Seqs 512"
    md = render_markdown(o, CTX)
    (short,) = [line for line in md.splitlines() if line.startswith("| **Short Prompt**")]
    assert "Mean TPOT(ms): 2300.00 <span style=\"background-color:#fbcaca;\">(+236.4%)</span>" in short
    assert "⚠ Latency worse than the baseline by more than 10%: mean TPOT +236.4%" in short
    (share,) = [line for line in md.splitlines() if line.startswith("| **ShareGPT**")]
    assert "p99 TPOT +66.7%" in share and "mean TTFT +30.0%" in share and "mean TPOT" not in share.split("⚠")[1]
    data = build_json(o, CTX)
    rows = {c["profile"]: c["latency_regressions"] for c in data["conclusion"]}
    assert {r["metric"] for r in rows["short"]} >= {"mean_tpot_ms", "p99_tpot_ms"}
    assert next(r for r in rows["short"] if r["metric"] == "mean_tpot_ms") == {
        "metric": "mean_tpot_ms", "baseline": 683.79, "measured": 2300.0, "change_pct": 236.36}
    assert data["latency_regression_pct"] == 10.0
    paths = write_report(o, CTX, tmp_path)
    assert "⚠ Latency worse than the baseline by more than 10%" in paths["html"].read_text()
    # the threshold is the plan's
    o = _conduct("guards: {latency_regression_pct: 300}")
    assert "⚠" not in render_markdown(o, CTX)


def test_guards_make_a_configuration_ineligible_and_say_why() -> None:
    o = _conduct("guards: {p99_tpot_ms: 200, max_regression: {mean_ttft_ms: 0.2}}")
    step = o.steps[1]
    (e,) = step.entries
    assert not e.eligible and not step.adopted
    assert "guard p99_tpot_ms ≤ 200 ms: p99 TPOT 250.00 ms" in e.note
    assert "guard max_regression.mean_ttft_ms ≤ 20%: mean TTFT +30.0% vs the baseline (100.00 → 130.00 ms)" in e.note
    assert "excluded by the plan's guards: TensorRT-LLM Seqs 512 (guard p99_tpot_ms" in step.statement
    assert o.optimized is not None and o.optimized.label == "TensorRT-LLM"  # the step's best is not adopted
    md = render_markdown(o, CTX)
    (row,) = [line for line in md.splitlines() if line.startswith("| Max Num Seqs |")]
    assert "guard p99_tpot_ms ≤ 200 ms: p99 TPOT 250.00 ms" in row
    # an engine past a limit is not chosen either
    o = _conduct("guards: {p99_tpot_ms: 155}")
    assert o.steps[0].chosen is not None and o.steps[0].chosen.label == "vLLM"
    assert "excluded by the plan's guards: TensorRT-LLM (guard p99_tpot_ms ≤ 155 ms" in o.steps[0].statement


@pytest.mark.parametrize(("guards", "message"), [
    ("guards: [p99_tpot_ms]", "guards: expected a mapping"),
    ("guards: {p99_tpot: 200}", "guards.p99_tpot: unknown key; expected a latency metric"),
    ("guards: {p150_tpot_ms: 200}", "guards.p150_tpot_ms: unknown key"),
    ("guards: {p99_tpot_ms: fast}", "guards.p99_tpot_ms: expected a positive number of milliseconds, got a string"),
    ("guards: {p99_tpot_ms: 0}", "guards.p99_tpot_ms: expected a positive number of milliseconds"),
    ("guards: {max_regression: 0.2}", "guards.max_regression: expected a mapping"),
    ("guards: {max_regression: {mean_ttft: 0.2}}", "guards.max_regression.mean_ttft: unknown metric"),
    ("guards: {max_regression: {mean_ttft_ms: [1]}}", "guards.max_regression.mean_ttft_ms: expected a non-negative"),
    ("guards: {latency_regression_pct: -1}", "guards.latency_regression_pct: expected a non-negative percentage"),
])
def test_guards_are_checked_when_the_plan_is_read(guards: str, message: str) -> None:
    with pytest.raises(UsageError) as err:
        load_plan_text(PLAN.format(extra=guards))
    assert message in str(err.value) and "\n" not in str(err.value)


def test_guards_are_read_with_the_percentiles_they_need() -> None:
    plan = load_plan_text(PLAN.format(extra="guards: {p95_ttft_ms: 900, max_regression: {p90_tpot_ms: 0.1}}"))
    g = plan.decision.guards
    assert g.limits == (("p95_ttft_ms", 900.0),) and g.max_regression == (("p90_tpot_ms", 0.1),)
    assert g.percentiles() == (90.0, 95.0) and g.latency_regression_pct == 10.0


def test_a_guard_reading_what_the_bench_does_not_report_by_default_asks_for_it_and_keys_it() -> None:
    """A guard on p95 or on e2el asks the bench for it, and the stored measurement's key says
    so: a study resumed with such a guard measures again rather than calling it "not measured"."""
    from types import SimpleNamespace as NS

    from perflab.lab.report.stored import profile_key
    from perflab.lab.run.executor import Executor

    plain = load_plan_text(PLAN.format(extra=""))
    p99 = load_plan_text(PLAN.format(extra="guards: {p99_tpot_ms: 900}"))
    e2el = load_plan_text(PLAN.format(extra="guards: {p95_ttft_ms: 900, max_regression: {mean_e2el_ms: 0.1}}"))
    prof = plain.profiles[0]
    assert profile_key(p99, prof) == profile_key(plain, prof)  # the defaults already hold p99 TPOT
    assert profile_key(e2el, prof) != profile_key(plain, prof)

    ex = Executor.__new__(Executor)
    ex.ctx = NS(plan=e2el, time_scale=1.0, simulated=False, pm=NS(engines={}))  # no engine: every extension
    ex._env = lambda: {}  # type: ignore[method-assign]
    inst = NS(launch=NS(served_model_name="m", argv=[], env={}), base_url="http://127.0.0.1:1")
    req = ex._bench_request([inst], e2el.baseline_config(), e2el.profiles[0], "x")
    assert 95.0 in req.percentiles and "e2el" in req.percentile_metrics


def test_a_pending_block_does_not_claim_the_configuration_never_ran() -> None:
    """A run cut off by a killed perflab is pending too, with its finished points kept: the
    block says the measurement did not finish, not that it never started."""
    from perflab.lab.report import result_block

    text = result_block(ConfigResult(Status.PENDING))
    assert "before this configuration ran" not in text
    assert "did not finish" in text or "measurement finished" in text and "resume" in text
