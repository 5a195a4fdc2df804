"""Resuming an interrupted curve (issue #24, item 3): the load points a sweep or a max-load
search finished before Ctrl-C are kept, counted as reused, and never measured again; the
resumed curve decides what an uninterrupted one decides (simulator, small plans)."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
from pathlib import Path
from typing import Any

import anyio
import pytest

from perflab.lab.progress import StudyProgress

SWEEP_PLAN = """
name: resume-sweep
model: Qwen/Qwen3-8B
hardware: sim:a100-80g-x1
simulation: {time_scale: 50}
engines: [vllm]
profiles:
  main: {label: Main, input_len: 32, output_len: 8, num_prompts: 10}
  curve: {label: Curve, input_len: 64, output_len: 64, num_prompts: 48, sweep: {max_concurrency: [1, 2, 4, 8, 16]}}
timeouts: {startup_s: 60, benchmark_s: 600}
"""

# TPOT grows with the load on the simulated A100 (about 11.53 ms at 4 concurrent requests,
# 11.64 ms at 16): the search brackets 4..16, then interpolates
SEARCH_PLAN = """
name: resume-search
model: Qwen/Qwen3-8B
hardware: sim:a100-80g-x1
simulation: {time_scale: 50}
engines: [vllm]
decide_by: max-load
search: max_concurrency
slo: {tpot_ms: 11.6, percentile: 99}
profiles:
  main: {label: Main, input_len: 64, output_len: 64, num_prompts: 48, max_concurrency: 4}
timeouts: {startup_s: 60, benchmark_s: 600}
"""


class Watching(StudyProgress):
    """A quiet progress display that records each benchmark begun ("Curve (max_concurrency 4)")
    and sends this process SIGINT — Ctrl-C — when the ``stop_at``-th one of ``profile`` begins."""

    def __init__(self, profile: str, stop_at: int | None = None) -> None:
        super().__init__("test", live=False, stream=open(os.devnull, "w"))  # noqa: SIM115 (closed in __exit__)
        self.profile, self.stop_at = profile, stop_at
        self.begun: list[str] = []

    def event(self, kind: str, **kw: Any) -> None:
        if kind == "benchmark" and str(kw.get("profile", "")).startswith(self.profile + " ("):
            self.begun.append(str(kw["profile"]))
            if self.stop_at is not None and len(self.begun) == self.stop_at:
                os.kill(os.getpid(), signal.SIGINT)
        super().event(kind, **kw)

    def __exit__(self, *exc: Any) -> Any:
        try:
            return super().__exit__(*exc)
        finally:
            self.stream.close()


def _run(plan_text: str, out: Path, progress: Watching) -> Any:
    from perflab.lab.plan import load_plan_text
    from perflab.lab.run.runner import run_study
    from perflab.plugins import load

    plan = load_plan_text(plan_text, path=f"{out.name}.yaml")
    return anyio.run(lambda: run_study(load(), plan, out, progress=progress))


def _curve(out: Path, profile: str) -> dict[str, Any]:
    """The stored measurement of ``profile`` (its extras: points, capacity)."""
    with sqlite3.connect(out / "study.db") as db:
        rows = list(db.execute("SELECT status, extra FROM measurements WHERE profile = ? ORDER BY id", (profile,)))
    assert len(rows) == 1, rows
    return {"status": rows[0][0], **json.loads(rows[0][1])}


def _points(out: Path) -> dict[str, dict[str, Any]]:
    with sqlite3.connect(out / "study.db") as db:
        return {p: json.loads(d) for p, d in db.execute("SELECT point, data FROM points ORDER BY id")}


@pytest.mark.slow
@pytest.mark.parametrize(("plan", "profile", "label"), [(SWEEP_PLAN, "curve", "Curve"), (SEARCH_PLAN, "main", "Main")],
                         ids=["sweep", "max-load-search"])
def test_a_resumed_curve_keeps_its_finished_points_and_decides_the_same(
        tmp_path: Path, plan: str, profile: str, label: str) -> None:
    # Ctrl-C as the curve's third load point begins: the first two are measured
    out = tmp_path / "study"
    first = Watching(label, stop_at=3)
    summary = _run(plan, out, first)
    assert summary.interrupted and summary.exit_code == 130
    finished = first.begun[:2]

    # the resume measures only the missing points; the kept ones count as reused
    again = Watching(label)
    resumed = _run(plan, out, again)
    assert not resumed.interrupted and resumed.exit_code == 0
    remeasured = [b for b in again.begun if b in finished]
    assert remeasured == [], f"finished points measured again: {remeasured}"
    assert len(again.begun) >= 1  # the rest of the curve was measured
    kept = _points(out)
    assert {f"{label} ({k.replace('=', ' ')})" for k, p in kept.items() if p["status"] == "ok"} >= set(finished)
    assert resumed.reused >= len(finished) + (profile != "main")  # the points, and the profiles measured before
    curve = _curve(out, profile)
    by_load = {"max_concurrency=" + str(p["load"]["max_concurrency"]): p for p in curve["points"]}
    for point, data in list(kept.items())[:2]:  # the interrupted run's points are the curve's, figures unchanged
        assert by_load[point]["metrics"] == data["metrics"]

    # an uninterrupted study of the same plan decides the same: the same loads, the same verdicts
    whole_dir = tmp_path / "whole"
    whole = _run(plan, whole_dir, Watching(label))
    assert whole.exit_code == 0
    straight = _curve(whole_dir, profile)
    assert [(p["load"], p["status"], p["slo_met"]) for p in curve["points"]] == \
        [(p["load"], p["status"], p["slo_met"]) for p in straight["points"]]
    assert curve["capacity"] == straight["capacity"]
    assert resumed.outcome.optimized == whole.outcome.optimized or (
        resumed.outcome.optimized.label == whole.outcome.optimized.label)
