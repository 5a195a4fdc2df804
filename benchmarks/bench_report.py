"""How long `perflab report` of the demo study and a re-run of the finished demo take: wall and CPU.

Builds the demo study once (`perflab demo`, minutes; or reuses ``--study DIR``), then times, in
cold processes of the `perflab` beside the Python running this file:

- ``report, charts redrawn``: `perflab report DIR` after chart.png/pareto.png are deleted (the
  first report of figures that changed: what every `run` used to pay);
- ``report, unchanged``: `perflab report DIR` again (the PNG charts are kept: their inputs' digest
  is in them);
- ``re-run finished demo``: `perflab demo --out DIR` of the finished study (all 20 measurements
  reused).

CPU time is the process' and its children's (``resource.getrusage``): on a shared machine it is
the figure to compare, wall time follows the load. ``--baseline-pythonpath PATH`` times another
perflab side by side (``PYTHONPATH=PATH``: the ``core`` and ``plugins/sim`` of a checkout of an
earlier commit, ``git worktree add /tmp/before COMMIT``), alternating with this one run by run,
each on its own copy of the study, and prints the ratios::

    .venv/bin/python benchmarks/bench_report.py [--study DIR] [-n 5] \
        [--baseline-pythonpath /tmp/before/core:/tmp/before/plugins/sim]

Exit status 1 when the median CPU time of ``report, charts redrawn`` is above ``--target`` (2 s).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CASES = ("report, charts redrawn", "report, unchanged", "re-run finished demo")


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall s, CPU s of the command and everything it ran)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=1800)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        sys.exit(f"`{' '.join(argv)}` failed with code {done.returncode}: {done.stderr.strip()[-2000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def run_case(case: str, study: Path, env: dict[str, str]) -> tuple[float, float]:
    perflab = [sys.executable, "-m", "perflab"]
    if case == "report, charts redrawn":
        for name in ("chart.png", "pareto.png"):
            (study / name).unlink(missing_ok=True)
        return timed([*perflab, "report", str(study)], env)
    if case == "report, unchanged":
        return timed([*perflab, "report", str(study)], env)
    return timed([*perflab, "demo", "--out", str(study)], env)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--study", type=Path, help="a finished demo study to reuse (default: build one, minutes)")
    parser.add_argument("-n", "--runs", type=int, default=5, help="timed runs of each case (default 5)")
    parser.add_argument("--baseline-pythonpath",
                        help="PYTHONPATH of another perflab (its core and plugins/sim) to time side by side")
    parser.add_argument("--target", type=float, default=2.0, help="most median CPU s of a report (default 2)")
    args = parser.parse_args()

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    work = Path(tempfile.mkdtemp(prefix="perflab-bench-report-"))
    try:
        source = args.study
        if source is None:
            source = work / "demo"
            print(f"building the demo study in {source} (minutes)...", file=sys.stderr, flush=True)
            wall, cpu = timed([sys.executable, "-m", "perflab", "demo", "--out", str(source)], env)
            print(f"built in {wall:.0f} s ({cpu:.0f} s CPU)", file=sys.stderr)
        variants = {"this perflab": env}
        if args.baseline_pythonpath:
            variants = {"baseline": {**env, "PYTHONPATH": args.baseline_pythonpath}, **variants}
        studies = {}
        for name, venv in variants.items():  # each its own copy: one's charts never serve the other
            studies[name] = work / name.replace(" ", "-")
            shutil.copytree(source, studies[name], symlinks=True)
            run_case("re-run finished demo", studies[name], venv)  # untimed: caches, a first report
        results: dict[str, dict[str, list[tuple[float, float]]]] = {v: {c: [] for c in CASES} for v in variants}
        for _ in range(args.runs):
            for case in CASES:
                for name, venv in variants.items():  # alternating: both see the same machine load
                    results[name][case].append(run_case(case, studies[name], venv))
    finally:
        shutil.rmtree(work, ignore_errors=True)

    medians = {v: {c: (statistics.median(w for w, _ in r), statistics.median(c for _, c in r))
                   for c, r in cases.items()} for v, cases in results.items()}
    print(f"runs: {args.runs} of each case{', alternating with the baseline' if len(variants) > 1 else ''}")
    for v, cases in medians.items():
        for case, (wall, cpu) in cases.items():
            print(f"{v:<13} {case:<24} median wall {wall:6.2f} s   CPU {cpu:6.2f} s")
    if "baseline" in medians:
        for case in CASES:
            (bw, bc), (w, c) = medians["baseline"][case], medians["this perflab"][case]
            print(f"ratio this/baseline  {case:<24} wall {w / bw:.2f}   CPU {c / bc:.2f}")
    cpu = medians["this perflab"]["report, charts redrawn"][1]
    print(f"target: report <= {args.target:g} s CPU (median): {'OK' if cpu <= args.target else 'OVER TARGET'}")
    print(json.dumps({v: {c: {"wall_s": round(w, 3), "cpu_s": round(u, 3)} for c, (w, u) in cases.items()}
                      for v, cases in medians.items()}))
    sys.exit(0 if cpu <= args.target else 1)


if __name__ == "__main__":
    main()
