"""method: search against method: grid and the seeds' method on the simulator (issue 29).

Two spaces (``--space``):

- ``small``: 2 engines x 3 max_num_seqs x 3 max_batched_tokens (18 points), Qwen3-8B; its
  grid is tests/fixtures/search_grid_small.json, which the CI test
  (tests/lab/test_lab_search.py) compares its searches with. Target: within 2 % of the grid's
  best at <= 40 % of the grid's engine-hours.
- ``seed-002``: examples/search-seed-002-space.yaml's space (3 engines x 3 checkpoints x
  max_batched_tokens x max_num_seqs x tp, 162 points), Qwen3-32B on A100s; its grid is
  benchmarks/data/search_grid_seed002.json (not used by CI: ~15 minutes). Target: within 2 %
  at <= 30 %.

``--fixture``: measure every point of the space to the end (method: grid, no early stop) and
write the ground truth, with the plan it measured. Re-run it when the simulator's models change.

Without ``--fixture``: the seeds' method on the same options (the engines on defaults, then
each option's values one step at a time on the winner), then ``--seeds`` searches (default 10;
the plan's defaults, ``tuning: {seed: S}``); per search the figure of the configuration it
picked, its gap to the grid's best, its trials (pruned) and its engine-hours against the
grid's; then how many seeds reached the target.

Engine-hours are the simulated engines' own (start-up, benchmarks and teardown on the model
clock, perflab.lab.run.executor.LaunchClock): the same plan gives the same figure on any host,
so the fixture's are compared as they are.

Run::

    .venv/bin/python benchmarks/bench_search.py --fixture                      # ~2 min
    .venv/bin/python benchmarks/bench_search.py                                # ~10 min
    .venv/bin/python benchmarks/bench_search.py --space seed-002 --fixture     # ~15 min
    .venv/bin/python benchmarks/bench_search.py --space seed-002 --results seed002.jsonl  # ~40 min
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "lab"))

#: the small space; {method} and {tuning} are filled in per run
SMALL = """\
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

#: the seeds' method on the small space: the engines on defaults, then each option's values one
#: step at a time on the winner
SMALL_STEPS = """\
candidates:
  - name: Max Num Seqs
    variants: [{name: "32", set: {max_num_seqs: 32}}, {name: "128", set: {max_num_seqs: 128}},
               {name: "512", set: {max_num_seqs: 512}}]
  - name: Max Batched Tokens
    variants: [{name: "2048", set: {max_batched_tokens: 2048}}, {name: "8192", set: {max_batched_tokens: 8192}},
               {name: "32768", set: {max_batched_tokens: 32768}}]
"""

SEED002 = ROOT / "examples" / "search-seed-002-space.yaml"

#: the seeds' method on seed 002's space, in the seed's order (quantization, then max batched
#: tokens) and then the two options the seed did not tune; null in the space is the default,
#: which the seeds' method measures first
SEED002_STEPS = """\
candidates:
  - name: Quantization
    variants: [{name: FP8, set: {model: Qwen/Qwen3-32B-FP8}}, {name: AWQ, set: {model: Qwen/Qwen3-32B-AWQ}}]
  - name: Max Batched Tokens
    variants: [{name: "16k", set: {max_batched_tokens: 16384}}, {name: "32k", set: {max_batched_tokens: 32768}}]
  - name: Max Num Seqs
    variants: [{name: "128", set: {max_num_seqs: 128}}, {name: "512", set: {max_num_seqs: 512}}]
  - name: Tensor Parallelism
    variants: [{name: TP 2, set: {tp: 2}}]
"""


def small_plan(method: str, seed: int | None = None) -> str:
    return SMALL.format(method=method, tuning=f"tuning: {{seed: {seed}}}\n" if seed is not None else "")


def seed002_plan(method: str, seed: int | None = None) -> str:
    text = SEED002.read_text(encoding="utf-8").replace("method: search\n", f"method: {method}\n")
    return re.sub(r"^tuning:.*\n", f"tuning: {{seed: {seed}}}\n" if seed is not None else "", text, flags=re.M)


@dataclass(frozen=True)
class Space:
    name: str
    plan: Callable[..., str]  # (method, seed=None) -> plan text
    steps: str  # the seeds' method's candidates on the same options
    fixture: Path
    max_share: float  # the target: at most this share of the grid's engine-hours (%)

    def seeds_text(self) -> str:
        text = self.plan("seeds")  # its method, space and tuning lines give way to the candidates
        return text[:text.index("\nmethod:") + 1] + self.steps + text[text.index("\nprofiles:") + 1:]


SPACES = {
    "small": Space("small", small_plan, SMALL_STEPS, ROOT / "tests" / "fixtures" / "search_grid_small.json", 40.0),
    "seed-002": Space("seed-002", seed002_plan, SEED002_STEPS, ROOT / "benchmarks" / "data" / "search_grid_seed002.json",
                      30.0),
}


def run(text: str, out: Path, **decision: Any) -> Any:
    from simstudy import run_sim_study

    return run_sim_study(text, out, **decision)


def trials(summary: Any) -> list[dict[str, Any]]:
    step = summary.outcome.steps[0]
    return [{**e.trial, "label": e.label, "eligible": e.eligible} for e in step.entries if e.trial is not None]


def write_fixture(space: Space) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-search-") as tmp:
        t0 = time.monotonic()  # the grid's wall time, kept in the fixture: what comparing with it saves
        s = run(space.plan("grid"), Path(tmp) / "grid", early_stop=False)
        points = trials(s)
    best = max((p for p in points if p["eligible"]), key=lambda p: p["value"])
    doc = {"plan": space.plan("grid"), "points": points, "best": best,
           "engine_hours": round(sum(p["engine_hours"] or 0.0 for p in points), 6),
           "wall_s": round(time.monotonic() - t0, 1)}
    space.fixture.parent.mkdir(parents=True, exist_ok=True)
    space.fixture.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    launched = sum(1 for p in points if p["engine_hours"])
    print(f"{space.fixture}: best {best['label']} {best['value']:.1f} tok/s; {len(points)} points, {launched} launched, "
          f"{doc['engine_hours']:.3f} engine-hours, {doc['wall_s']:.0f} s")


def measure(space: Space, which: str, tmp: Path) -> dict[str, Any]:
    """One row: ``seeds`` (the seeds' method) or ``search-S`` (a search with seed S)."""
    if which == "seeds":
        s = run(space.seeds_text(), tmp / "seeds")
        pick = s.outcome.optimized
        return {"method": "seeds' method", "label": pick.label if pick is not None else "-",
                "value": s.outcome.rank.value(pick.result) if pick is not None else 0.0,
                "engine_hours": s.engine_hours["spent"],
                "launches": sum(len(st.entries) for st in s.outcome.steps),
                "pruned": sum(1 for st in s.outcome.steps for e in st.entries if e.result.status == "stopped-early")}
    seed = int(which.removeprefix("search-"))
    s = run(space.plan("search", seed), tmp / which)
    info = s.outcome.steps[0].search
    return {"method": f"search, seed {seed}", "label": info["best"]["label"], "value": info["best"]["value"],
            "engine_hours": info["engine_hours"] or 0.0, "launches": info["trials"], "pruned": info["pruned"]}


def kept(results: Path | None, space: Space) -> dict[str, dict[str, Any]]:
    """The rows ``--results`` holds for ``space``."""
    rows: dict[str, dict[str, Any]] = {}
    if results is not None and results.is_file():
        for line in results.read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            if row["space"] == space.name:
                rows[row["which"]] = row
    return rows


def claimed(results: Path | None, space: Space, which: str) -> bool:
    """Claim a row for this process (several processes may share ``--results``, each
    measuring the rows no other one claimed: the seeds take minutes each on a loaded host)."""
    if results is None:
        return True
    try:
        results.with_name(f"{results.name}.{space.name}.{which}.claim").open("x").close()
    except FileExistsError:
        return False
    return True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--space", choices=sorted(SPACES), default="small")
    ap.add_argument("--fixture", action="store_true", help="measure the grid and write the fixture")
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--results", type=Path, default=None,
                    help="keep each row in this JSON-lines file as it is measured and reuse the rows it has (an "
                         "interrupted benchmark goes on where it stopped); processes sharing it split the rows")
    args = ap.parse_args()
    space = SPACES[args.space]
    if args.fixture:
        write_fixture(space)
        return
    order = ["seeds", *(f"search-{seed}" for seed in range(args.seeds))]
    rows = kept(args.results, space)
    with tempfile.TemporaryDirectory(prefix="bench-search-") as tmp:
        for which in order:
            if which in kept(args.results, space) or not claimed(args.results, space, which):
                continue
            t0 = time.monotonic()
            rows[which] = {"space": space.name, "which": which, **measure(space, which, Path(tmp)),
                           "wall_s": round(time.monotonic() - t0, 1)}
            print(f"{which}: {rows[which]}", file=sys.stderr, flush=True)
            if args.results is not None:
                with args.results.open("a", encoding="utf-8") as f:
                    f.write(json.dumps(rows[which]) + "\n")
    rows.update(kept(args.results, space))
    missing = [which for which in order if which not in rows]
    if missing:  # other processes on the same --results still measure them
        print(f"still measured elsewhere: {', '.join(missing)}; run again once they are in {args.results}")
        return

    truth = json.loads(space.fixture.read_text(encoding="utf-8"))
    optimum, grid_hours = truth["best"]["value"], truth["engine_hours"]
    launched = sum(1 for p in truth["points"] if p["engine_hours"])

    def line(method: str, label: str, value: float, launches: int, pruned: int, hours: float) -> str:
        return (f"| {method} | {label} | {value:.1f} | {(optimum - value) / optimum * 100:.2f} % | {launches} ({pruned}) "
                f"| {hours:.3f} ({hours / grid_hours * 100:.0f} %) |")

    print(f"space {space.name}: {len(truth['points'])} points")
    print("| method | pick | figure (tok/s) | gap to the grid's best | launches (pruned) | engine-hours (share of the grid's) |")
    print("|---|---|---|---|---|---|")
    print(line("grid", truth["best"]["label"], optimum, launched, 0, grid_hours))
    reached = 0
    for which in ["seeds", *(f"search-{seed}" for seed in range(args.seeds))]:
        r = rows[which]
        print(line(r["method"], r["label"], r["value"], r["launches"], r["pruned"], r["engine_hours"]))
        if which != "seeds":
            reached += ((optimum - r["value"]) / optimum * 100 <= 2.0
                        and r["engine_hours"] / grid_hours * 100 <= space.max_share)
    print(f"{reached} of {args.seeds} seeds within 2 % of the grid's best at <= {space.max_share:.0f} % of its engine-hours")


if __name__ == "__main__":
    main()
