"""Simulated studies are reproducible (issue #12 item 7): the same plan twice gives the same
decisions and main-profile numbers within 2 %, and the same again while a CPU-bound process
runs beside it — the lab times simulated engines by their model clock (docs/simulator.md
"Reproducible time"), not by the host's wall clock, which a busy host stretches."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

# A time scale of 50 on two shared cores: the host falls behind the simulated engines (a wall
# clock would read their throughput lower, and lower still beside a CPU hog).
PLAN = """
name: reproducible
engines: [vllm, sglang]
model: Qwen/Qwen3-8B
simulation: {time_scale: 50}
hardware: sim:a100-80g-x8
profiles:
  main: {label: Main, input_len: 512, output_len: 128, num_prompts: 128, seed: 7}
candidates:
  - {name: Max Num Seqs, variants: [{name: "48", set: {max_num_seqs: 48}}, {name: "96", set: {max_num_seqs: 96}}]}
timeouts: {startup_s: 60, benchmark_s: 120}
"""
KEYS = ("total_token_throughput", "mean_tpot_ms", "p99_ttft_ms")


def _study(root: Path) -> dict[str, Any]:
    from perflab.lab.plan import load_plan_text
    from perflab.lab.progress import StudyProgress
    from perflab.lab.run.runner import run_study
    from perflab.plugins import load

    pm = load()
    plan = load_plan_text(PLAN, path=Path("reproducible.yaml"), known_engines=pm.engine_names())
    with open(os.devnull, "w") as sink:
        progress = StudyProgress("reproducible (test)", live=False, stream=sink)
        summary = anyio.run(lambda: run_study(pm, plan, root, progress=progress))
    o = summary.outcome
    assert o is not None and o.complete
    numbers: dict[str, dict[str, float]] = {}
    for step in o.steps:
        for e in step.entries:
            assert e.result.metrics is not None, (e.label, e.result.status)
            numbers[e.label] = {k: float(e.result.metrics[k]) for k in KEYS}
    return {
        "decisions": [(s.name, s.chosen.label if s.chosen else None, s.adopted) for s in o.steps],
        "optimized": o.optimized.label if o.optimized else None,
        "numbers": numbers,
    }


def _same_numbers(a: dict[str, dict[str, float]], b: dict[str, dict[str, float]], tol_pct: float) -> list[str]:
    assert a.keys() == b.keys()
    off = []
    for label in a:
        for k in KEYS:
            x, y = a[label][k], b[label][k]
            if abs(x - y) > tol_pct / 100 * max(abs(x), abs(y)):
                off.append(f"{label} {k}: {x:.2f} vs {y:.2f}")
    return off


@pytest.mark.slow
def test_same_plan_twice_same_decisions_and_numbers_even_beside_a_cpu_hog(tmp_path: Path) -> None:
    first = _study(tmp_path / "first")
    second = _study(tmp_path / "second")
    assert first["decisions"] == second["decisions"] and first["optimized"] == second["optimized"]
    assert not _same_numbers(first["numbers"], second["numbers"], 2.0)

    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        busy = _study(tmp_path / "busy")
    finally:
        hog.kill()
        hog.wait()
    assert busy["decisions"] == first["decisions"] and busy["optimized"] == first["optimized"]
    assert not _same_numbers(first["numbers"], busy["numbers"], 2.0)
