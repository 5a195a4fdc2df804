"""method: search against method: grid on the simulator (issue 29).

``--fixture``: measure every point of the small space (2 engines x 3 max_num_seqs x 3
max_batched_tokens) to the end (method: grid, no early stop) and write the ground truth to
tests/fixtures/search_grid_small.json, with the plan it measured: the CI test
(tests/lab/test_lab_search.py) compares its searches with it instead of measuring the grid
(18 engine launches) itself. Re-run it when the simulator's models change.

Without ``--fixture``: search that space with ``--seeds`` seeds (default 10; the plan's
defaults, ``tuning: {seed: S}``) and print, per seed, the figure of the configuration search
picked, its gap to the grid's best and its engine-hours against the grid's; then how many
seeds reached within 2 % of the optimum at most 40 % of the grid's engine-hours.

Run::

    .venv/bin/python benchmarks/bench_search.py --fixture     # ~2 min, writes the fixture
    .venv/bin/python benchmarks/bench_search.py --seeds 10    # ~10 min
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "fixtures" / "search_grid_small.json"
sys.path.insert(0, str(ROOT / "tests" / "lab"))

#: the small space; {method} and {tuning} are filled in per run
PLAN = """\
model: Qwen/Qwen3-8B
hardware: sim:a100-80g-x8
simulation: {{time_scale: 10000}}
engines: [vllm, sglang]
method: {method}
space:
  engine: [vllm, sglang]
  max_num_seqs: [32, 128, 512]
  max_batched_tokens: [2048, 8192, 32768]
{tuning}profiles:
  main: {{input_len: 1024, output_len: 64, num_prompts: 200}}
"""


#: the seeds' method on the same space: the engines on defaults, then each option's values one
#: step at a time on the winner
SEEDS_STEPS = """\
candidates:
  - name: Max Num Seqs
    variants: [{name: "32", set: {max_num_seqs: 32}}, {name: "128", set: {max_num_seqs: 128}},
               {name: "512", set: {max_num_seqs: 512}}]
  - name: Max Batched Tokens
    variants: [{name: "2048", set: {max_batched_tokens: 2048}}, {name: "8192", set: {max_batched_tokens: 8192}},
               {name: "32768", set: {max_batched_tokens: 32768}}]
"""


def seeds_text() -> str:
    text = plan_text("seeds")
    return text[:text.index("space:")] + SEEDS_STEPS + text[text.index("profiles:"):]


def plan_text(method: str, seed: int | None = None) -> str:
    return PLAN.format(method=method, tuning=f"tuning: {{seed: {seed}}}\n" if seed is not None else "")


def run(text: str, out: Path, **decision: Any) -> Any:
    from simstudy import run_sim_study

    return run_sim_study(text, out, **decision)


def trials(summary: Any) -> list[dict[str, Any]]:
    step = summary.outcome.steps[0]
    return [{**e.trial, "label": e.label, "eligible": e.eligible} for e in step.entries if e.trial is not None]


def write_fixture() -> None:
    with tempfile.TemporaryDirectory(prefix="bench-search-") as tmp:
        t0 = time.monotonic()  # the grid's wall time, kept in the fixture: what the CI test saves
        s = run(plan_text("grid"), Path(tmp) / "grid", early_stop=False)
        points = trials(s)
    best = max((p for p in points if p["eligible"]), key=lambda p: p["value"])
    doc = {"plan": plan_text("grid"), "points": points, "best": best,
           "engine_hours": round(sum(p["engine_hours"] or 0.0 for p in points), 6),
           "wall_s": round(time.monotonic() - t0, 1)}
    FIXTURE.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    print(f"{FIXTURE}: best {best['label']} {best['value']:.1f} tok/s; grid {doc['engine_hours']:.3f} engine-hours")


def search_seed(seed: int, tmp: Path, truth: dict[str, Any]) -> dict[str, Any]:
    """One search; its engine-hours' share of the grid's, the grid's rescaled to this host (a
    simulated engine's engine-hours are mostly its start on the host x the time scale): by
    the hours its complete trials took here against the fixture's hours of the same points."""
    s = run(plan_text("search", seed), tmp / f"search-{seed}")
    step = s.outcome.steps[0]
    fixture = {json.dumps(p["point"], sort_keys=True): p["engine_hours"] for p in truth["points"]}
    complete = [e.trial for e in step.entries if e.trial is not None and e.trial["state"] == "complete"]
    here = sum(t["engine_hours"] for t in complete) / sum(fixture[json.dumps(t["point"], sort_keys=True)] for t in complete)
    return {"seed": seed, "best": step.search["best"], "engine_hours": step.search["engine_hours"],
            "share": step.search["engine_hours"] / (truth["engine_hours"] * here),
            "trials": step.search["trials"], "pruned": step.search["pruned"]}


def hours(summary: Any, entry: Any) -> float | None:
    from perflab.lab.store import Store

    store = Store.open_existing(summary.study_dir)
    try:
        return store.run_engine_hours(entry.result.run_id) if entry.result.run_id is not None else None
    finally:
        store.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fixture", action="store_true", help="measure the grid and write the fixture")
    ap.add_argument("--seeds", type=int, default=10)
    args = ap.parse_args()
    if args.fixture:
        write_fixture()
        return
    truth = json.loads(FIXTURE.read_text(encoding="utf-8"))
    optimum, grid_hours = truth["best"]["value"], truth["engine_hours"]
    print(f"grid: {truth['best']['label']} {optimum:.1f} tok/s, {grid_hours:.3f} engine-hours ({len(truth['points'])} points)")
    print("| seed | search's pick | figure | gap to optimum | trials (pruned) | engine-hours (share of grid) |")
    print("|---|---|---|---|---|---|")
    reached = 0
    with tempfile.TemporaryDirectory(prefix="bench-search-") as tmp:
        seeds = run(seeds_text(), Path(tmp) / "seeds")
        pick = seeds.outcome.optimized
        fig = seeds.outcome.rank.value(pick.result) if pick is not None else None
        steps_hours = sum(e.trial["engine_hours"] if e.trial else (hours(seeds, e) or 0.0)
                          for st in seeds.outcome.steps for e in st.entries)
        print(f"| seeds' method | {pick.label if pick else '-'} | {fig or 0:.1f} | "
              f"{(optimum - (fig or 0)) / optimum * 100:.2f} % | {sum(len(st.entries) for st in seeds.outcome.steps)} "
              f"| {steps_hours:.3f} (this host) |", flush=True)
        for seed in range(args.seeds):
            r = search_seed(seed, Path(tmp), truth)
            gap = (optimum - r["best"]["value"]) / optimum * 100
            share = r["share"] * 100
            reached += gap <= 2.0 and share <= 40.0
            print(f"| {seed} | {r['best']['label']} | {r['best']['value']:.1f} | {gap:.2f} % | {r['trials']} ({r['pruned']}) "
                  f"| {r['engine_hours']:.3f} ({share:.0f} %) |", flush=True)
    print(f"{reached} of {args.seeds} seeds within 2 % of the optimum at <= 40 % of the grid's engine-hours")


if __name__ == "__main__":
    main()
