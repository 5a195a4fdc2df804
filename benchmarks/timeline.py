"""A study's runs on a time line: which run, which node, when it started and ended (issue #14).

Reads the study's ``study.log`` (``lab.run`` / ``lab.placed`` / ``lab.run-finished``) and
prints one row per run — its id, step, label, profiles, node and devices, start and end in
seconds since ``lab.start`` — then each node's busy share of the study's wall time (the
idle capacity a parallel run could fill)::

    .venv/bin/python benchmarks/timeline.py STUDY_DIR [STUDY_DIR ...] [--json]

``benchmarks/bench_ray.py --keep DIR`` and ``benchmarks/bench_parallel.py --keep DIR`` keep
their study directories for it.
"""

from __future__ import annotations

import argparse
import json
from datetime import datetime
from pathlib import Path
from typing import Any


def _t(ev: dict[str, Any]) -> float:
    return datetime.fromisoformat(ev["timestamp"].replace("Z", "+00:00")).timestamp()


def timeline(study: Path) -> dict[str, Any]:
    """``{"wall_s", "runs": [...], "nodes": {node: busy seconds}}`` of one study directory."""
    events = [json.loads(line) for line in (study / "study.log").read_text(encoding="utf-8").splitlines() if line]
    t0 = next(_t(e) for e in events if e.get("event") == "lab.start")
    runs: dict[int, dict[str, Any]] = {}
    end = t0
    for ev in events:
        kind, run_id = ev.get("event"), ev.get("run_id")
        end = max(end, _t(ev))
        if kind == "lab.run":
            runs[run_id] = {"run_id": run_id, "step": ev["step"].split(" ")[0].rstrip("."), "label": ev["label"],
                            "profiles": ev["profiles"], "node": None, "devices": None,
                            "start_s": round(_t(ev) - t0, 2), "end_s": None, "state": None}
        elif kind == "lab.placed" and run_id in runs:
            runs[run_id].update(node=str(ev["node"])[:8], devices=ev["devices"], placed_s=round(_t(ev) - t0, 2))
        elif kind in ("lab.run-finished", "lab.run-interrupted", "lab.run-error", "lab.run-lost") and run_id in runs:
            runs[run_id].update(end_s=round(_t(ev) - t0, 2), state=ev.get("state") or kind.removeprefix("lab.run-"))
    wall = round(end - t0, 2)
    nodes: dict[str, float] = {}
    for r in runs.values():
        if r["node"] is not None and r["end_s"] is not None:
            nodes[r["node"]] = round(nodes.get(r["node"], 0.0) + r["end_s"] - r.get("placed_s", r["start_s"]), 2)
    return {"study": str(study), "wall_s": wall, "runs": list(runs.values()), "nodes": nodes}


def show(t: dict[str, Any]) -> None:
    print(f"{t['study']}: {t['wall_s']:.1f} s")
    print(f"  {'run':>3} {'step':<5} {'label':<28} {'node':<8} {'start':>7} {'end':>7}  profiles")
    for r in t["runs"]:
        end = f"{r['end_s']:7.1f}" if r["end_s"] is not None else "      -"
        print(f"  {r['run_id']:>3} {r['step']:<5} {r['label'][:28]:<28} {str(r['node'])[:8]:<8} "
              f"{r.get('placed_s', r['start_s']):7.1f} {end}  {','.join(r['profiles'])} ({r['state']})")
    for node, busy in t["nodes"].items():
        # a local --parallel run's node holds several runs at once: then it is over 100%
        print(f"  node {node}: runs busy {busy:.1f} s of {t['wall_s']:.1f} s ({busy / t['wall_s'] * 100:.0f}%)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("studies", nargs="+", type=Path, help="study directories (perflab run --out)")
    ap.add_argument("--json", action="store_true", help="print the time lines as JSON")
    args = ap.parse_args()
    lines = [timeline(s) for s in args.studies]
    if args.json:
        print(json.dumps(lines, indent=2))
        return
    for t in lines:
        show(t)


if __name__ == "__main__":
    main()
