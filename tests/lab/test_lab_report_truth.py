"""Issue #24, items 9-11: what a report and the progress lines show is what was measured —
stopped-early blocks whose counts agree and which say once why they stopped (9), the price
of a decision in latency (10), and progress and time series that show what they claim (11)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from perflab.bench.cancel import CANCELLED
from perflab.lab.executor import stopped_early_record
from perflab.lab.options import Configuration
from perflab.lab.report import _entry_lines, ReportContext
from perflab.lab.study import ConfigResult, Entry, stopped_early_text
from perflab.observe import END, START, Sample, Watching
from perflab.status import Status

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
    from perflab.lab.plan import load_plan_text
    from perflab.lab.runner import result_summary

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
    counted from before the warm-up, on the host's clock times the time scale (a host behind
    the simulator's scale stretches it)."""
    from perflab.lab.html import load_series

    w = Watching()
    w.samples["server_metrics"] = [Sample(0.0, {"running": 0.0}), Sample(30.0, {"running": 1.0}),
                                   Sample(69.0, {"running": 8.0}, START), Sample(300.0, {"running": 64.0}),
                                   Sample(563.0, {"running": 1.0}, END), Sample(570.0, {"running": 0.0})]
    series = w.series_json(235.89)["server_metrics"]
    ts = {s.get("mark"): s["t"] for s in series}
    assert ts[START] == 0.0 and ts[END] == 235.89
    assert series[0]["t"] < 0  # the loading and the warm-up, before the timed run
    run = tmp_path / "run"
    run.mkdir()
    (run / "observe-long.json").write_text(json.dumps(w.series_json(235.89)))
    charted, _ = load_series(run, "long")
    times = [t for t, _ in charted["server_metrics"]]
    assert times[0] == 0.0 and abs(times[-1] - 235.89) < 1e-6  # the chart shows the timed run, 0 to its duration
