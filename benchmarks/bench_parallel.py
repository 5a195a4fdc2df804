"""A study one configuration at a time, then ``--parallel auto``: wall times, ratio, decisions.

Runs ``perflab run PLAN`` twice from scratch, each in a fresh study directory — sequentially
(``--parallel 1``, today's behaviour) and with ``--executor local --parallel auto`` (each step's
configurations side by side on disjoint device sets) — and prints the wall time of each
command, their ratio, and whether the decisions are identical (every step's entries, the
chosen configuration, whether it was adopted, the statuses, and the optimized
configuration, from each study's report.json)::

    .venv/bin/python benchmarks/bench_parallel.py [--plan examples/parallel-tp4-a100.yaml] [--keep DIR] [--json]

``--keep DIR`` keeps both study directories (DIR/sequential, DIR/parallel) for
``benchmarks/timeline.py``.

The default plan's configurations are all tensor-parallel over 4 GPUs on the simulated 8×A100
machine, so two fit at a time (issue #14: at least 1.7× faster, identical decisions). The
figures in docs/user-guide.md ("Parallel runs") come from it. Exit status 1 when the
decisions differ.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PLAN = ROOT / "examples" / "parallel-tp4-a100.yaml"


def decisions(report: dict[str, Any]) -> dict[str, Any]:
    """What the study decided, without the measured figures (the simulator's figures may
    differ in the last digits between two runs; the decisions may not)."""
    return {
        "steps": [{"title": s["title"], "entries": [(e["label"], e["result"]["status"]) for e in s["entries"]],
                   "chosen": s["chosen"], "adopted": s["adopted"]} for s in report["steps"]],
        "optimized": (report.get("optimized") or {}).get("label"),
    }


def run(plan: Path, out: Path, parallel: str) -> tuple[float, dict[str, Any], dict[str, Any]]:
    """(wall seconds, the --json summary, report.json) of one ``perflab run``."""
    argv = [sys.executable, "-m", "perflab", "run", str(plan), "--out", str(out), "--json", "--no-live",
            "--executor", "local", "--parallel", parallel]
    t0 = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        sys.exit(f"bench_parallel: `{' '.join(argv)}` exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    summary = json.loads(proc.stdout)
    report = json.loads((out / "report.json").read_text(encoding="utf-8"))
    # the study's own time (lab.start to lab.end in study.log): without the process's start
    # and the report's writing, which are the same in both runs
    ends = [json.loads(line) for line in (out / "study.log").read_text(encoding="utf-8").splitlines()]
    summary["study_s"] = next((e.get("elapsed_s") for e in reversed(ends) if e.get("event") == "lab.end"), None)
    return wall, summary, report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--plan", type=Path, default=DEFAULT_PLAN, help="the plan to run (default: %(default)s)")
    ap.add_argument("--parallel", default="auto", help="the parallel run's --parallel (default: auto)")
    ap.add_argument("--keep", type=Path, default=None, help="keep the study directories here")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-parallel-") as tmp:
        if args.keep is not None:
            args.keep.mkdir(parents=True, exist_ok=True)
            tmp = str(args.keep)
        seq_s, seq_sum, seq_rep = run(args.plan, Path(tmp) / "sequential", "1")
        par_s, par_sum, par_rep = run(args.plan, Path(tmp) / "parallel", args.parallel)
    same = decisions(seq_rep) == decisions(par_rep)
    result = {
        "plan": str(args.plan), "cpus": os.cpu_count(), "load_avg_1m": round(os.getloadavg()[0], 2),
        "sequential_s": round(seq_s, 1), "parallel_s": round(par_s, 1), "parallel": args.parallel,
        "speedup": round(seq_s / par_s, 2), "same_decisions": same,
        "study_s": {"sequential": seq_sum["study_s"], "parallel": par_sum["study_s"]},
        "runs_launched": {"sequential": seq_sum["runs_launched"], "parallel": par_sum["runs_launched"]},
        "optimized": {"sequential": seq_sum["optimized"], "parallel": par_sum["optimized"]},
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"plan          {result['plan']}  ({result['cpus']} CPUs, load {result['load_avg_1m']} at the end)")
        print(f"sequential    {seq_s:7.1f} s  ({seq_sum['runs_launched']} runs)")
        print(f"parallel      {par_s:7.1f} s  (--parallel {args.parallel}, {par_sum['runs_launched']} runs)")
        print(f"speedup       {result['speedup']:.2f}x  (the studies alone, without process start and report: "
              f"{seq_sum['study_s']} s / {par_sum['study_s']} s)")
        print(f"decisions     {'identical' if same else 'DIFFERENT'} (optimized: {seq_sum['optimized']} / "
              f"{par_sum['optimized']})")
    if not same:
        sys.exit(1)


if __name__ == "__main__":
    main()
