"""Plan methods grid and search (issue 29): the plan keys, Optuna's search and its resume, the
report's trial table, and search against the grid's ground truth on the simulator.

The grid's ground truth of the small space (2 engines x 3 x 3, every point measured to the
end) is a fixture, tests/fixtures/search_grid_small.json, written by
``benchmarks/bench_search.py --fixture``: measuring it here would cost 18 engine launches.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import anyio
import pytest

from perflab.contract.errors import PerflabError, UsageError
from perflab.contract.status import Status
from perflab.lab.plan import load_plan_text
from perflab.lab.report import render_markdown, report_context
from perflab.lab.report.stored import stored_outcome
from perflab.lab.run.runner import LiveMeasure
from perflab.lab.search import JOURNAL
from perflab.lab.store import ProfileMeasurement, RunRecord, Store
from perflab.lab.study import conduct

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "search_grid_small.json"

BASE = """
model: m
engines: [vllm, sglang]
profiles:
  main: {input_len: 10, output_len: 10, num_prompts: 10}
"""


def plan(extra: str) -> Any:
    return load_plan_text(BASE + extra, path="search-test.yaml")


# --------------------------------------------------------------------------- the plan keys


def test_method_defaults_to_seeds_and_search_takes_sound_defaults() -> None:
    p = plan("")
    assert p.method == "seeds" and p.space is None
    p = plan("method: search\nspace: {max_num_seqs: [32, 128, 512], max_batched_tokens: [2048, 8192, 32768]}\n")
    assert p.space is not None and p.space.engines == ("vllm", "sglang") and p.space.size == 18
    assert p.tuning.seed == 0 and p.tuning.budget_engine_hours is None
    assert p.tuning.trials_for(18) == 6  # a quarter of the space, at least 6
    assert p.tuning.trials_for(4) == 4  # never more than the space
    assert p.tuning.trials_for(200) == 50
    assert p.space.points()[0] == {"engine": "vllm", "max_num_seqs": 32, "max_batched_tokens": 2048}
    g = plan("method: grid\nspace: {engine: [sglang], quantization: [null, fp8]}\n")
    assert g.space is not None and g.space.engines == ("sglang",) and g.space.options["quantization"] == (None, "fp8")


@pytest.mark.parametrize(("extra", "message"), [
    ("method: grid\n", "space: missing; method: grid needs the space"),
    ("method: anneal\nspace: {max_num_seqs: [1]}\n", "method: expected one of: seeds, grid, search"),
    ("space: {max_num_seqs: [1]}\n", "space: only with method: grid or method: search"),
    ("method: grid\nspace: {max_num_seqs: [1]}\ntuning: {seed: 1}\n", "tuning: only with method: search"),
    ("method: search\nspace: {max_num_seqs: []}\n", "space.max_num_seqs: expected a non-empty list"),
    ("method: search\nspace: {max_num_seqs: [0]}\n", "space.max_num_seqs[0]"),
    ("method: search\nspace: {max_num_seqs: [4, 4]}\n", "listed twice"),
    ("method: search\nspace: {env: [{A: 1}]}\n", "space.env: unknown key"),
    ("method: search\nspace: {max_num_seqs: [4]}\ntuning: {trials: 0}\n", "tuning.trials"),
    ("method: search\nspace: {max_num_seqs: [4]}\ntuning: {budget_engine_hours: -1}\n", "tuning.budget_engine_hours"),
    ("method: grid\nspace: {max_num_seqs: [4]}\ncandidates: [{name: X, set: {tp: 2}}]\n", "candidates: only with method: seeds"),
])
def test_bad_method_keys_are_refused_naming_the_key(extra: str, message: str) -> None:
    with pytest.raises(UsageError, match=None) as err:
        plan(extra)
    assert message in str(err.value), str(err.value)


# --------------------------------------------------------------------------- search and its resume


SEARCH = """
method: search
space: {max_num_seqs: [32, 64, 128, 256], max_batched_tokens: [2048, 8192, 32768]}
tuning: {trials: 7, seed: 3}
"""
SALT = {"hw": "x"}


def _tps(config: Any) -> float:
    """A smooth landscape: sglang better, more sequences better, 8192 tokens best."""
    seqs, tokens = config.options.get("max_num_seqs", 16), config.options.get("max_batched_tokens", 4096)
    return (1000.0 if config.engine == "sglang" else 800.0) + math.log2(seqs) * 50 - abs(math.log2(tokens / 8192)) * 20


class Executor:
    """Stands in for the executor: a figure per configuration, each launch recorded; the
    launch numbered ``fail_at`` raises (the study stops with that run interrupted)."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.launched: list[str] = []
        self.fail_at = fail_at

    async def run(self, config: Any, profiles: Any, run_dir: Any, **_: Any) -> RunRecord:
        if self.fail_at is not None and len(self.launched) + 1 == self.fail_at:
            raise RuntimeError("the machine went away")
        self.launched.append(repr(config.canonical()))
        tps = _tps(config)
        metrics = {"num_prompts": 10, "completed": 10, "failed": 0, "total_token_throughput": tps, "duration": 10.0,
                   "p99_tpot_ms": float(config.options.get("max_num_seqs", 16))}  # more sequences, slower tokens
        return RunRecord(Status.DONE, measurements={p.name: ProfileMeasurement(Status.OK, metrics=metrics, num_prompts=10)
                                                    for p in profiles}, version="1", engine_seconds=3600.0, accelerators=1)


class _Log:
    def info(self, *a: Any, **k: Any) -> None: ...
    def warning(self, *a: Any, **k: Any) -> None: ...
    def exception(self, *a: Any, **k: Any) -> None: ...


def _session(out: Path, executor: Executor, extra: str = "", search: str = SEARCH) -> Any:
    p = plan(search + extra)
    store = Store(out)
    store.begin_session()
    for key, value in (("plan_text", BASE + search + extra), ("plan_path", "search-test.yaml"), ("salt", SALT)):
        store.set_meta(key, value)
    measure = LiveMeasure(store, SALT, executor, retry_failed=False, on_event=lambda *a, **k: None, log=_Log(), plan=p)
    try:
        return anyio.run(lambda: conduct(p, measure))
    finally:
        store.close()


def _trials(outcome: Any) -> list[dict[str, Any]]:
    return [e.trial for e in outcome.steps[0].entries]


def test_search_is_reproducible_for_a_seed_and_tells_every_trial(tmp_path: Path) -> None:
    one, two = Executor(), Executor()
    a, b = _session(tmp_path / "a", one), _session(tmp_path / "b", two)
    assert one.launched == two.launched  # the same seed, the same trials
    trials = _trials(a)
    assert len(trials) == 7 and len({json.dumps(t["point"], sort_keys=True) for t in trials}) == 7
    assert all(t["state"] == "complete" and t["engine_hours"] == 1.0 for t in trials)
    step = a.steps[0]
    assert step.kind == "search" and step.search["trials"] == 7 and step.search["engine_hours"] == 7.0
    best = max(trials, key=lambda t: t["value"])
    assert step.chosen is not None and step.chosen.trial == best and a.optimized is not None
    assert _trials(a) == _trials(b)
    assert (tmp_path / "a" / JOURNAL).is_file()


def test_an_interrupted_search_resumes_without_repeating_finished_trials(tmp_path: Path) -> None:
    out = tmp_path / "study"
    first = Executor(fail_at=4)  # three trials told, the fourth's launch fails: the study stops
    with pytest.raises(PerflabError):
        _session(out, first)
    assert len(first.launched) == 3
    second = Executor()
    outcome = _session(out, second)
    trials = _trials(outcome)
    points = [json.dumps(t["point"], sort_keys=True) for t in trials]
    assert len(trials) == 7 and len(set(points)) == 7  # the trials asked for, each point once
    assert set(first.launched).isdisjoint(second.launched)  # nothing finished is launched again
    assert len(second.launched) == 4 + 1  # the four new trials, and the baseline's final measurement
    # and it asks what a search never interrupted asks: the same points, in the same order
    whole = Executor()
    uninterrupted = _session(tmp_path / "whole", whole)
    assert first.launched + second.launched == whole.launched
    assert [t["point"] for t in _trials(uninterrupted)] == [t["point"] for t in trials]
    import optuna

    journal = optuna.load_study(study_name="perflab-search", storage=optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(out / JOURNAL))))
    told = [t.user_attrs.get("told") for t in journal.get_trials(deepcopy=False)]
    assert told.count(None) == 1  # the interrupted trial: failed, its point asked again
    assert told.count("complete") == 7  # besides, TPE's repeats of measured points ("repeat")
    # the report replays the journal and the store: the same trials, the same choice, nothing launched
    store = Store.open_existing(out)
    try:
        again = anyio.run(stored_outcome, store)
        md = render_markdown(again, report_context(store))
    finally:
        store.close()
    assert _trials(again) == trials and again.steps[0].chosen.label == outcome.steps[0].chosen.label
    assert "| Trial | Configuration | Throughput | State | Engine-hours |" in md
    assert f"{outcome.steps[0].chosen.label} **(best)**" in md


def test_guards_are_optuna_constraints_and_the_budget_stops_the_trials(tmp_path: Path) -> None:
    import optuna

    outcome = _session(tmp_path / "guarded", Executor(), "guards: {p99_tpot_ms: 100}\n")
    step = outcome.steps[0]
    assert step.chosen is not None and step.chosen.config.options["max_num_seqs"] <= 64  # 128 and 256 break the guard
    assert any(not e.eligible and e.note.startswith("Not eligible") for e in step.entries)
    journal = optuna.load_study(study_name="perflab-search", storage=optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(tmp_path / "guarded" / JOURNAL))))
    told = [t for t in journal.get_trials(deepcopy=False) if t.user_attrs.get("told") == "complete"]
    assert {tuple(t.user_attrs["constraint"]) for t in told} <= {(0.0,), (1.0,)}
    assert all((t.user_attrs["constraint"] == [1.0]) == (t.params["max_num_seqs"] > 100) for t in told)
    # an SLO a throughput ranking only reports: each limit's slack (ms) is one more constraint
    _session(tmp_path / "slo", Executor(), "slo: {tpot_ms: 100, percentile: 99}\n")
    journal = optuna.load_study(study_name="perflab-search", storage=optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(tmp_path / "slo" / JOURNAL))))
    told = [t for t in journal.get_trials(deepcopy=False) if t.user_attrs.get("told") == "complete"]
    assert told and all(t.user_attrs["constraint"] == [0.0, t.params["max_num_seqs"] - 100.0] for t in told)
    # each trial takes one engine-hour: with a budget of 3, no fourth trial starts
    capped = _session(tmp_path / "capped", Executor(), search=SEARCH.replace("seed: 3}", "seed: 3, budget_engine_hours: 3}"))
    assert capped.steps[0].search["trials"] == 3 and capped.steps[0].search["engine_hours"] == 3.0


def test_grid_measures_every_point_and_picks_the_best(tmp_path: Path) -> None:
    p = plan("method: grid\nspace: {engine: [sglang], max_num_seqs: [32, 256], max_batched_tokens: [2048, 8192]}\n")
    store = Store(tmp_path / "g")
    store.begin_session()
    ex = Executor()
    measure = LiveMeasure(store, SALT, ex, retry_failed=False, on_event=lambda *a, **k: None, log=_Log(), plan=p)
    try:
        outcome = anyio.run(lambda: conduct(p, measure))
    finally:
        store.close()
    step = outcome.steps[0]
    assert step.kind == "grid" and [e.trial["number"] for e in step.entries] == [0, 1, 2, 3]
    assert step.chosen is not None and step.chosen.config.options["max_num_seqs"] == 256
    assert step.chosen.config.options["max_batched_tokens"] == 8192
    assert not (tmp_path / "g" / JOURNAL).exists()  # the grid needs no optimizer


# --------------------------------------------------------------------------- on the simulator


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_search_reaches_the_grids_best_at_a_fraction_of_its_engine_hours(tmp_path: Path, seed: int) -> None:
    """Search (its defaults, tuning: {seed: S}) on the small space: within 2 % of the grid's
    best at <= 40 % of the grid's engine-hours (the grid: the fixture, measured to the end).

    A simulated engine's engine-hours are its model clock's (start-up, benchmarks, teardown),
    the same on any host: the fixture's compare as they are."""
    from simstudy import run_sim_study

    truth = json.loads(FIXTURE.read_text(encoding="utf-8"))
    text = truth["plan"].replace("method: grid\n", f"method: search\ntuning: {{seed: {seed}}}\n")
    summary = run_sim_study(text, tmp_path / f"search-{seed}")
    step = summary.outcome.steps[0]
    info = step.search
    gap = (truth["best"]["value"] - info["best"]["value"]) / truth["best"]["value"] * 100
    assert gap <= 2.0, (info["best"], truth["best"])
    fixture_hours = {json.dumps(p["point"], sort_keys=True): p["engine_hours"] for p in truth["points"]}
    complete = [e.trial for e in step.entries if e.trial is not None and e.trial["state"] == "complete"]
    for t in complete:  # a point measured to the end costs here what it cost in the grid
        assert t["engine_hours"] == pytest.approx(fixture_hours[json.dumps(t["point"], sort_keys=True)], rel=0.02), t
    share = info["engine_hours"] / truth["engine_hours"]
    assert share <= 0.4, (share, info["engine_hours"], truth["engine_hours"])
