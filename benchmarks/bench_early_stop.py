"""``perflab demo`` with early stop and with ``--no-early-stop``: engine-hours, decisions, and
what stopping earlier could save at most.

Runs ``perflab demo --fresh`` twice, one after the other, each in a fresh directory — A with
early stop (the default), B with ``--no-early-stop`` — and prints what each spent
(``report.json``'s ``engine_hours``), how much less A spent than B, whether the decisions are
identical (whether each step adopted a configuration, and which; the optimized
configuration), and per configuration: B's engine-seconds, A's, and how
A's measurement ended::

    .venv/bin/python benchmarks/bench_early_stop.py [--keep DIR] [--json]

For every run A stopped as lost it prints what decided (the bound on its steady state, or
the forecast of its open requests), that figure and the limit, and what the same run made in
B, to its end: a stop is sound where B's figure is below the limit, and the deciding figure
is at least B's (both err high, never low).

It also prints two ceilings, from A's ``earlystop-<profile>.json`` windows (where each run's
warm window ended) and B's measured durations: what stopping, at the end of its warm window,
(1) every configuration B did not adopt and (2) only those whose steady-state token rate is
below their figure to beat would have saved of B's engine-seconds. (1) bounds any rule that
decides after a warm window; (2) is about what the bound alone saves before the tails (the
forecast also stops configurations that lose only through their last requests). The figures
in docs/user-guide.md, "Early stop", come from it. Exit status 1 when the decisions differ or
a stop was not sound.
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

from perflab.lab.run.earlystop import STEADY_UNTIL


def decisions(report: dict[str, Any]) -> dict[str, Any]:
    """What the study decided: whether each step adopted a configuration, and which, and the
    optimized configuration (the entries' statuses differ by design: stopped-early in A, and so
    may the best of a step's losers, which is no decision)."""
    return {"steps": [(s["title"], s["adopted"], s["chosen"] if s["adopted"] else None) for s in report["steps"]],
            "optimized": (report.get("optimized") or {}).get("label")}


def demo(out: Path, early_stop: bool) -> tuple[float, dict[str, Any]]:
    """(wall seconds, report.json) of one ``perflab demo --fresh``."""
    argv = [sys.executable, "-m", "perflab", "demo", "--fresh", "-o", str(out), "--json", "--no-live"]
    if not early_stop:
        argv.append("--no-early-stop")
    t0 = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        sys.exit(f"bench_early_stop: `{' '.join(argv)}` exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    return wall, json.loads((out / "report.json").read_text(encoding="utf-8"))


def runs(study: Path, main_profile: str) -> dict[str, dict[str, Any]]:
    """Per run directory name: engine-seconds, the main profile's status and duration, and what
    the early stop saw of it (steady-state token rate, figure to beat, end of the warm window)."""
    out: dict[str, dict[str, Any]] = {}
    for run_json in sorted((study / "runs").glob("*/run.json")):
        d = run_json.parent
        rec = json.loads(run_json.read_text(encoding="utf-8"))
        row: dict[str, Any] = {"engine_s": round(rec.get("engine_seconds") or 0.0, 1)}
        m = d / f"measurement-{main_profile}.json"
        if m.exists():
            meas = json.loads(m.read_text(encoding="utf-8"))
            row.update(status=meas["status"], duration_s=(meas.get("metrics") or {}).get("duration"),
                       figure=(meas.get("metrics") or {}).get("total_token_throughput"),
                       stopped_early=meas.get("stopped_early"))
        seen = d / f"earlystop-{main_profile}.json"
        if seen.exists():
            es = json.loads(seen.read_text(encoding="utf-8"))
            windows = es["windows"]
            steady = [w for w in windows if w["steady"] and w["ended"] <= STEADY_UNTIL * es["num_prompts"]]
            if steady and es.get("to_beat"):
                first = windows.index(steady[0])
                row.update(steady_rate=sum(w["token_rate"] for w in steady) / len(steady), to_beat=es["to_beat"],
                           warm_end_s=windows[first - 1]["elapsed"] if first else 0.0, label=rec.get("label"))
        out[d.name] = row
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--keep", type=Path, default=None, help="keep both study directories here (A, B)")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-early-stop-") as tmp:
        root = Path(tmp)
        if args.keep is not None:
            args.keep.mkdir(parents=True, exist_ok=True)
            root = args.keep
        a_s, a = demo(root / "A", early_stop=True)
        b_s, b = demo(root / "B", early_stop=False)
        main_profile = a["main_profile"]
        ra, rb = runs(root / "A", main_profile), runs(root / "B", main_profile)
    same = decisions(a) == decisions(b)
    spent_a, spent_b = a["engine_hours"]["spent"], b["engine_hours"]["spent"]
    total_b = sum(r["engine_s"] for r in rb.values())
    # the ceilings: configurations stopped at the end of their warm window (A saw their
    # windows; B measured their whole run) — every one B did not adopt, or only those whose
    # steady state is below the figure they had to beat
    kept = {s["chosen"] for s in b["steps"] if s["adopted"]}

    def saved(which: dict[str, dict[str, Any]]) -> float:
        return sum(max(0.0, (rb[k].get("duration_s") or 0.0) - r["warm_end_s"]) for k, r in which.items() if k in rb)

    losers = {k: r for k, r in ra.items() if r.get("warm_end_s") is not None and r.get("label") not in kept}
    below = {k: r for k, r in losers.items() if r["steady_rate"] < r["to_beat"]}
    ceiling_s, any_s = saved(below), saved(losers)
    stops: dict[str, dict[str, Any]] = {}
    for k, r in ra.items():
        d = r.get("stopped_early") or {}
        if d.get("reason") != "lost":
            continue
        basis = "forecast" if "forecast_token_throughput" in d else "bound"
        figure = d.get("forecast_token_throughput", d.get("bound_token_throughput"))
        full = rb.get(k, {}).get("figure")
        stops[k] = {"basis": basis, "figure": figure, "limit": d.get("limit"), "at_s": d.get("elapsed_s"),
                    "B_figure": full and round(full, 2),
                    "sound": full is not None and full < d["limit"] and figure is not None and figure >= 0.999 * full}
    result = {
        "cpus": os.cpu_count(), "wall_s": {"A": round(a_s, 1), "B": round(b_s, 1)},
        "engine_hours": {"A": a["engine_hours"], "B": b["engine_hours"]},
        "less_than_B_pct": round(100 * (1 - spent_a / spent_b), 1) if spent_b else None,
        "same_decisions": same, "optimized": {"A": (a.get("optimized") or {}).get("label"),
                                              "B": (b.get("optimized") or {}).get("label")},
        "runs": {k: {"B_engine_s": rb.get(k, {}).get("engine_s"), "A_engine_s": r["engine_s"],
                     "A_status": r.get("status"), "steady_rate": r.get("steady_rate") and round(r["steady_rate"]),
                     "to_beat": r.get("to_beat") and round(r["to_beat"])} for k, r in ra.items()},
        "ceiling": {"configurations": sorted(below), "saved_engine_s": round(ceiling_s),
                    "saved_pct": round(100 * ceiling_s / total_b, 1) if total_b else None},
        "stops": stops,
        "ceiling_any_rule": {"configurations": sorted(losers), "saved_engine_s": round(any_s),
                             "saved_pct": round(100 * any_s / total_b, 1) if total_b else None},
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"A (early stop)    {spent_a:.4f} engine-hours  (its own full-method estimate "
              f"{a['engine_hours']['full_method_estimate']:.4f}; {a_s:.0f} s wall)")
        print(f"B (--no-early-stop) {spent_b:.4f} engine-hours  ({b_s:.0f} s wall)")
        print(f"A spent           {result['less_than_B_pct']} % less than B")
        print(f"decisions         {'identical' if same else 'DIFFERENT'} (optimized: "
              f"{result['optimized']['A']} / {result['optimized']['B']})")
        print(f"{'run':26s} {'B eng-s':>8s} {'A eng-s':>8s} {'steady':>7s} {'to beat':>8s}  A's measurement")
        for k, r in result["runs"].items():
            print(f"{k:26s} {r['B_engine_s'] or 0:8.1f} {r['A_engine_s']:8.1f} {r['steady_rate'] or '':>7} "
                  f"{r['to_beat'] or '':>8}  {r['A_status'] or '-'}")
        for k, st in stops.items():
            print(f"stopped as lost   {k}: by its {st['basis']}, {st['figure']:.0f} tok/s below {st['limit']:.0f}, "
                  f"after {st['at_s']:.0f} s; in B it made {st['B_figure'] or 0:.0f} "
                  f"({'sound' if st['sound'] else 'NOT SOUND'})")
        print(f"ceilings          stopping at the end of the warm window every configuration B did not adopt "
              f"({', '.join(losers) or 'none'}) saves {result['ceiling_any_rule']['saved_pct']} % of B "
              f"({result['ceiling_any_rule']['saved_engine_s']} engine-s of {total_b:.0f}): no rule that decides "
              f"after a warm window saves more")
        print(f"                  stopping there only those whose steady state is below their figure to beat "
              f"({', '.join(below) or 'none'}) saves {result['ceiling']['saved_pct']} % "
              f"({result['ceiling']['saved_engine_s']} engine-s): what a rule that never stops a configuration "
              f"that could still win saves before the tails")
    if not same or not all(st["sound"] for st in stops.values()):
        sys.exit(1)


if __name__ == "__main__":
    main()
