"""method: search on the Ray executor, measured once outside CI (issue 29): a local Ray cluster
of two simulated A100 nodes (perflab.testing.raycluster, as tests/lab/test_lab_ray.py), the
small space of tests/fixtures/search_grid_small.json searched twice with the same seed through
``perflab run --executor ray``. Prints each run's wall time, its trials (number, point, state,
figure), how many runs overlapped, and whether the two runs asked the same trials; exit 1
when they differ.

    python benchmarks/ray_search.py [--seed 0] [--nodes 2]
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from perflab.testing.raycluster import NetnsCluster

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "search_grid_small.json"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--nodes", type=int, default=2)
    args = ap.parse_args()
    text = json.loads(FIXTURE.read_text(encoding="utf-8"))["plan"].replace(
        "method: grid\n", f"method: search\ntuning: {{seed: {args.seed}}}\n")
    work = Path(tempfile.mkdtemp(prefix="ray-search-"))
    plan = work / "search.yaml"
    plan.write_text("name: ray-search\n" + text)
    runs = []
    with NetnsCluster(["a100-80g-x8:8"] * args.nodes, log=work / "cluster.log") as c:
        for i in range(2):
            out = work / f"run{i}"
            argv = [sys.executable, "-m", "perflab", "run", str(plan), "--out", str(out), "--executor", "ray",
                    "--ray-address", c.address, "--no-live"]
            t0 = time.monotonic()
            proc = subprocess.run(c.argv(argv), capture_output=True, text=True)
            wall = time.monotonic() - t0
            if proc.returncode != 0:
                print(proc.stderr[-3000:], file=sys.stderr)
                return 2
            step = json.loads((out / "report.json").read_text())["steps"][0]
            trials = [(e["trial"]["number"], e["trial"]["point"], e["trial"]["state"]) for e in step["entries"]]
            runs.append(trials)
            with sqlite3.connect(out / "study.db") as con:
                spans = list(con.execute("SELECT started, finished FROM runs WHERE finished IS NOT NULL"))
            at_once = max(sum(1 for s, f in spans if s <= t < f) for t, _ in spans)
            print(f"run {i}: {wall:.1f} s wall, {len(trials)} trials, at most {at_once} runs at once, "
                  f"best {step['search']['best']}")
            for e in step["entries"]:
                t = e["trial"]
                print(f"  {t['number']:>3} {json.dumps(t['point'])} {t['state']} {t['value']}")
    same = runs[0] == runs[1]
    print("the same trials in both runs:", same)
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
