"""Wall time of a study run sequentially on one simulated machine vs on two simulated nodes
with ``--executor ray`` (issue #14: the seed-001 example, target ≥ 1.8×).

A local Ray cluster of two ``sim:a100-80g-x8`` nodes (fake GPUs) is started in a loopback-only
network namespace (:mod:`perflab.testing.raycluster`; root, ``unshare -n``), outside the timed
part. Then the same plan is run twice, each into a fresh study directory, and timed from the
command's start to its exit: ``perflab run PLAN`` (sequential, local) and ``perflab run PLAN
--executor ray --ray-address ADDR`` (a step's configurations on both nodes at once). It prints
both wall times, the ratio and whether both studies adopted the same configurations::

    .venv/bin/python benchmarks/bench_ray.py [--plan examples/seed-001-qwen3-235b-a22b-a100.yaml]
        [--prompts 80] [--time-scale X] [--keep DIR] [--json]

It also prints each study's own time (``lab.start`` to the last event in study.log) and how
busy each node was (:mod:`timeline`); ``--keep DIR`` keeps both study directories for
``benchmarks/timeline.py DIR/seq DIR/ray``.

``--prompts N`` scales the plan's profiles down (every ``num_prompts`` to at most N; 0: as
written). Both runs share this machine's CPU: on a host with few cores the simulated engines
of two nodes compete for it, which the ratio shows. On a 2-CPU host (docs/user-guide.md,
"Ray"): ``--prompts 0 --time-scale 10`` gives 1.80-1.83x (the simulated accelerators bound
each run); at the example's own time scale, 30, two simulated engines and their clients need
more than the two CPUs, and the ratio is 1.53x.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from perflab.testing.raycluster import NetnsCluster

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timeline import timeline  # noqa: E402  (benchmarks/ is not a package)

ROOT = Path(__file__).resolve().parents[1]


def scaled(text: str, prompts: int, time_scale: float | None) -> str:
    if prompts > 0:
        text = re.sub(r"num_prompts: (\d+)", lambda m: f"num_prompts: {min(int(m.group(1)), prompts)}", text)
    if time_scale is not None:
        text = re.sub(r"time_scale: [0-9.]+", f"time_scale: {time_scale:g}", text)
    return text


def timed(argv: list[str]) -> float:
    t0 = time.monotonic()
    r = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.monotonic() - t0
    if r.returncode != 0:
        sys.exit(f"{' '.join(argv)} failed ({r.returncode}): {r.stderr[-2000:]}")
    return wall


def adopted(study: Path) -> list[tuple[str, str | None]]:
    report = json.loads((study / "report.json").read_text())
    return [(s["title"], s["chosen"] if s["adopted"] else None) for s in report["steps"]]


def cases(study: Path) -> list[tuple[str, str, str | None]]:
    """The report's conclusion rows without their figures: profile, the baseline's and the
    optimized configuration's status, in the report's order."""
    report = json.loads((study / "report.json").read_text())
    return [(c["profile"], c["baseline"]["status"], (c["optimized"] or {}).get("status")) for c in report["cases"]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--plan", type=Path, default=ROOT / "examples" / "seed-001-qwen3-235b-a22b-a100.yaml")
    ap.add_argument("--prompts", type=int, default=80, help="scale every profile to at most N prompts (0: as written)")
    ap.add_argument("--time-scale", type=float, default=None,
                    help="replace the plan's simulation.time_scale (lower: the simulated engines run closer to real "
                         "speed, so a run is bounded by its accelerators rather than by this host's CPU)")
    ap.add_argument("--keep", type=Path, default=None, help="keep the study directories here (DIR/seq, DIR/ray)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-ray-") as tmp:
        work = Path(tmp) if args.keep is None else args.keep
        work.mkdir(parents=True, exist_ok=True)
        plan = work / "plan.yaml"
        plan.write_text(scaled(args.plan.read_text(encoding="utf-8"), args.prompts, args.time_scale))
        perflab = [sys.executable, "-m", "perflab", "run", str(plan), "--no-live"]
        sequential = timed([*perflab, "--out", str(work / "seq")])
        with NetnsCluster(["a100-80g-x8:8", "a100-80g-x8:8"], log=work / "cluster.log") as c:
            on_ray = timed(c.argv([*perflab, "--out", str(work / "ray"), "--executor", "ray",
                                   "--ray-address", c.address]))
        same = adopted(work / "seq") == adopted(work / "ray")
        same_cases = cases(work / "seq") == cases(work / "ray")
        lines = {name: timeline(work / name) for name in ("seq", "ray")}
    result = {"plan": str(args.plan), "prompts": args.prompts, "time_scale": args.time_scale, "sequential_s": round(sequential, 1),
              "ray_2_nodes_s": round(on_ray, 1), "speedup": round(sequential / on_ray, 2), "same_decisions": same,
              "same_cases": same_cases, "study_s": {k: t["wall_s"] for k, t in lines.items()},
              "node_busy_s": {k: t["nodes"] for k, t in lines.items()},
              "runs": {k: len(t["runs"]) for k, t in lines.items()}}
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"sequential (1 machine): {sequential:7.1f} s")
        print(f"ray (2 nodes):          {on_ray:7.1f} s")
        print(f"speedup:                {sequential / on_ray:7.2f}x   same decisions: {same}   "
              f"same cases (profiles, order, statuses): {same_cases}")
        st = result["study_s"]
        print(f"studies alone:          {st['seq']:7.1f} s / {st['ray']:.1f} s = {st['seq'] / st['ray']:.2f}x "
              f"({result['runs']['seq']} / {result['runs']['ray']} runs)")
        for node, busy in result["node_busy_s"]["ray"].items():
            print(f"  ray node {node}: busy {busy:.1f} s ({busy / st['ray'] * 100:.0f}% of the study)")


if __name__ == "__main__":
    main()
