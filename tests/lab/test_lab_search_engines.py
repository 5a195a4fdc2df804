"""Issue 29, the engines' part: per-engine engine_options in a search space (a space conditional
on the engine), the seeds' method and the search in one study (the search's best against the
seeds' pick), and a search's batches on a parallel executor.

Most tests use the stand-in executor of test_lab_search (a figure per configuration, no
engine); the simulator's own tests of these are in test_lab_search_sim.py."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import anyio
import pytest
from test_lab_search import BASE, SALT, Executor, _Log, _session, plan

from perflab.contract.errors import UsageError
from perflab.contract.status import Status
from perflab.lab.plan import engine_dim, load_plan_text, space_config
from perflab.lab.report import render_markdown, report_context
from perflab.lab.report.stored import stored_outcome
from perflab.lab.run.backends.local import LocalBackend
from perflab.lab.run.runner import LiveMeasure
from perflab.lab.store import RunRecord, Store
from perflab.lab.study import conduct

PER_ENGINE = """
method: search
space:
  max_num_seqs: [32, 128]
  engine_options: {vllm: {block_size: [16, 32]}, sglang: {schedule_policy: [lpm, fcfs, null]}}
"""


# --------------------------------------------------------------------------- the plan


def test_engine_options_are_dimensions_of_their_engine_only() -> None:
    p = plan(PER_ENGINE)
    space = p.space
    assert space is not None and space.conditional
    assert space.engine_dims("vllm") == {"vllm.block_size": (16, 32)}
    # vllm: 2 x 2, sglang: 2 x 3; a flat product would have 2 x 2 x 2 x 3 = 24 with duplicates
    assert space.size == 10 == len(space.points())
    assert len({json.dumps(pt, sort_keys=True) for pt in space.points()}) == 10
    assert all(("vllm.block_size" in pt) == (pt["engine"] == "vllm") for pt in space.points())
    assert all(("sglang.schedule_policy" in pt) == (pt["engine"] == "sglang") for pt in space.points())
    # a point's engine option goes to the engine's engine_options; null: the engine's own default
    cfg = space_config(p, {"engine": "vllm", "max_num_seqs": 32, engine_dim("vllm", "block_size"): 32})
    assert cfg.options["engine_options"] == {"block_size": 32} and cfg.options["max_num_seqs"] == 32
    cfg = space_config(p, {"engine": "sglang", "max_num_seqs": 32, "sglang.schedule_policy": None})
    assert "engine_options" not in cfg.options
    # they merge with the plan's own engine_serve engine_options
    q = plan(PER_ENGINE + "engine_serve: {vllm: {engine_options: {enforce_eager: true}}}\n")
    cfg = space_config(q, {"engine": "vllm", "max_num_seqs": 32, "vllm.block_size": 16})
    assert cfg.options["engine_options"] == {"enforce_eager": True, "block_size": 16}
    g = plan(PER_ENGINE.replace("method: search", "method: grid"))
    assert g.space is not None and g.space.points() == space.points()


@pytest.mark.parametrize(("space", "message"), [
    ("{engine_option: {vllm: {block_size: [16]}}}", "space.engine_option: unknown key (did you mean 'engine_options'?)"),
    ("{engine_options: {vlm: {block_size: [16]}}}", "space.engine_options.vlm: unknown engine 'vlm' (did you mean 'vllm'?)"),
    ("{engine: [sglang], engine_options: {vllm: {block_size: [16]}}}", "is not one of the space's engines"),
    ("{engine_options: {vllm: {block_size: []}}}", "space.engine_options.vllm.block_size: expected a non-empty list"),
    ("{engine_options: {vllm: {block_size: [16, 16]}}}", "listed twice"),
    ("{engine_options: {vllm: {block_size: [[16]]}}}", "expected plain values"),
    ("{engine_options: {vllm: [16]}}", "space.engine_options.vllm: expected a mapping"),
])
def test_bad_engine_options_in_space_are_refused_naming_the_key(space: str, message: str) -> None:
    with pytest.raises(UsageError) as err:
        load_plan_text(BASE + f"method: search\nspace: {space}\n", path="s.yaml", known_engines=["vllm", "sglang"])
    assert message in str(err.value), str(err.value)


# --------------------------------------------------------------------------- search over them


class EngineOptionsExecutor(Executor):
    """The stand-in's landscape plus the engine options: vLLM gains with 32-token blocks,
    SGLang with lpm; an engine option the plugin would not map is refused, as a plugin does."""

    def __init__(self, refuse: str | None = None, **kw: Any) -> None:
        super().__init__(**kw)
        self.refuse = refuse

    async def run(self, config: Any, profiles: Any, run_dir: Any, **kw: Any) -> RunRecord:
        own = dict(config.options.get("engine_options") or {})
        if self.refuse is not None and self.refuse in own:
            self.launched.append("refused " + repr(config.canonical()))
            return RunRecord(Status.UNSUPPORTED, error=f"{config.engine}: option(s) {self.refuse}")
        record = await super().run(config, profiles, run_dir, **kw)
        bonus = 120.0 if own.get("block_size") == 32 or own.get("schedule_policy") == "lpm" else 0.0
        return dataclasses.replace(record, measurements={
            name: dataclasses.replace(m, metrics={**m.metrics, "total_token_throughput": m.metrics["total_token_throughput"] + bonus})
            for name, m in record.measurements.items()})


def _run(out: Path, executor: Executor, text: str) -> Any:
    return _session(out, executor, search=text)


def _replay(out: Path) -> tuple[Any, str]:
    store = Store.open_existing(out)
    try:
        again = anyio.run(stored_outcome, store)
        return again, render_markdown(again, report_context(store))
    finally:
        store.close()


def test_search_asks_each_engine_only_its_own_options_and_is_reproducible(tmp_path: Path) -> None:
    text = PER_ENGINE + "tuning: {trials: 8, seed: 5}\n"
    one, two = EngineOptionsExecutor(), EngineOptionsExecutor()
    a, b = _run(tmp_path / "a", one, text), _run(tmp_path / "b", two, text)
    assert one.launched == two.launched
    trials = [e.trial for e in a.steps[0].entries]
    assert len(trials) == 8 and len({json.dumps(t["point"], sort_keys=True) for t in trials}) == 8
    for t in trials:
        own = {k for k in t["point"] if "." in k}
        assert own == ({"vllm.block_size"} if t["point"]["engine"] == "vllm" else {"sglang.schedule_policy"})
    assert trials == [e.trial for e in b.steps[0].entries]
    best = a.steps[0].chosen
    assert best is not None and best.config.engine == "sglang"
    assert best.config.options["engine_options"] == {"schedule_policy": "lpm"}
    assert "schedule_policy=lpm" in best.label and "sglang." not in best.label
    assert a.steps[0].search["dimensions"]["vllm.block_size"] == [16, 32]
    again, _ = _replay(tmp_path / "a")  # the report replays the conditional journal
    assert [e.trial for e in again.steps[0].entries] == trials


def test_an_interrupted_search_over_engine_options_resumes_without_repeating(tmp_path: Path) -> None:
    from perflab.contract.errors import PerflabError

    text = PER_ENGINE + "tuning: {trials: 7, seed: 2}\n"
    first = EngineOptionsExecutor(fail_at=4)
    with pytest.raises(PerflabError):
        _run(tmp_path / "r", first, text)
    second = EngineOptionsExecutor()
    outcome = _run(tmp_path / "r", second, text)
    trials = [e.trial for e in outcome.steps[0].entries]
    assert len(trials) == 7 and len({json.dumps(t["point"], sort_keys=True) for t in trials}) == 7
    assert set(first.launched).isdisjoint(second.launched) and len(second.launched) == 4 + 1
    own = {"vllm": "vllm.block_size", "sglang": "sglang.schedule_policy"}
    for t in trials:  # the re-asked point keeps its engine's own dimension, and only that
        assert {k for k in t["point"] if "." in k} == {own[t["point"]["engine"]]}


def test_an_engine_option_the_plugin_refuses_skips_that_point(tmp_path: Path) -> None:
    ex = EngineOptionsExecutor(refuse="schedule_policy")
    outcome = _run(tmp_path / "r", ex, PER_ENGINE + "tuning: {trials: 10, seed: 1}\n")
    states = {json.dumps(e.trial["point"], sort_keys=True): e.trial["state"] for e in outcome.steps[0].entries}
    for key, state in states.items():
        point = json.loads(key)
        refused = point.get("sglang.schedule_policy") is not None
        assert state == ("unsupported" if refused else "complete"), (point, state)
    chosen = outcome.steps[0].chosen
    assert chosen is not None and "schedule_policy" not in dict(chosen.config.options.get("engine_options") or {})
    assert any(line.startswith("refused") for line in ex.launched)


# --------------------------------------------------------------------------- seeds and search in one study

SEEDED = """
method: search
candidates:
  - name: Max Num Seqs
    variants:
      - {name: "64", set: {max_num_seqs: 64}}
space: {max_num_seqs: [32, 64, 128, 256], max_batched_tokens: [2048, 8192, 32768]}
tuning: {trials: 6, seed: 3}
"""


def test_seeds_then_search_reports_the_best_found_against_the_seeds_pick(tmp_path: Path) -> None:
    ex = Executor()
    outcome = _run(tmp_path / "s", ex, SEEDED)
    kinds = [s.kind for s in outcome.steps]
    assert kinds == ["engine", "candidate", "search"]
    engine, cand, search = outcome.steps
    pick = cand.chosen if cand.adopted else engine.chosen
    assert pick is not None and search.base is pick
    vs = search.search["vs_seeds"]
    assert vs["seeds_pick"]["label"] == pick.label and vs["search_best"]["label"] == search.chosen.label
    gain = (vs["search_best"]["value"] / vs["seeds_pick"]["value"] - 1) * 100
    assert vs["gain_pct"] == pytest.approx(gain) and gain > 0  # 256 sequences beat the seeds' 64
    # each launch takes an engine-hour: the seeds' three configurations, the search's six trials
    assert vs["seeds_engine_hours"] == 3.0 and vs["search_engine_hours"] == 6.0
    assert vs["recommended"] == "search" and search.adopted and outcome.optimized is not None
    assert outcome.optimized.label == search.chosen.label
    assert search.title.startswith("3. Searching the Configuration Space")
    assert search.vs_base_pct == pytest.approx(gain)
    again, md = _replay(tmp_path / "s")
    assert again.steps[2].search["vs_seeds"] == vs
    assert "| Seeds' method | " in md and "| Search | " in md
    assert "The search measured 6 of the space's 24 points" in md and "The seeds' method ran first" in md
    assert "This pruning approach yields a local optimum" not in md  # the seeds' own note is theirs
    assert f"The search's best against the seeds' pick: +{gain:.1f}%; recommended: the search's best." in md
    data = json.loads(json.dumps(outcome.to_json()))
    assert data["steps"][2]["search"]["vs_seeds"]["recommended"] == "search"


def test_the_seeds_pick_stays_when_the_search_does_not_beat_it(tmp_path: Path) -> None:
    text = SEEDED.replace('{name: "64", set: {max_num_seqs: 64}}', '{name: "best", set: {max_num_seqs: 512, max_batched_tokens: 8192}}')
    outcome = _run(tmp_path / "k", Executor(), text)
    search = outcome.steps[2]
    vs = search.search["vs_seeds"]
    assert vs["recommended"] == "seeds" and not search.adopted and vs["gain_pct"] < 0
    assert outcome.optimized is not None and outcome.optimized.label == vs["seeds_pick"]["label"]
    assert "keeping" in search.statement


# --------------------------------------------------------------------------- batches on a parallel executor


class SlowExecutor(Executor):
    """The stand-in, each launch taking a different (seeded) while: runs finish out of order,
    and how many run at once is recorded."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        import random

        self.rng = random.Random(seed)
        self.running = self.most = 0

    async def run(self, config: Any, profiles: Any, run_dir: Any, **kw: Any) -> RunRecord:
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            await anyio.sleep(self.rng.uniform(0.0, 0.05))
            return await super().run(config, profiles, run_dir, **kw)
        finally:
            self.running -= 1


def _run_parallel(out: Path, executor: Executor, text: str, parallel: int) -> Any:
    p = plan(text)
    store = Store(out)
    store.begin_session()
    for key, value in (("plan_text", BASE + text), ("plan_path", "search-test.yaml"), ("salt", SALT)):
        store.set_meta(key, value)
    backend = LocalBackend(None, parallel=parallel, executor_factory=lambda: executor)
    measure = LiveMeasure(store, SALT, backend, retry_failed=False, on_event=lambda *a, **k: None, log=_Log(), plan=p)
    try:
        return anyio.run(lambda: conduct(p, measure))
    finally:
        store.close()


def test_a_search_runs_its_trials_in_batches_and_a_seed_gives_the_same_trials(tmp_path: Path) -> None:
    """Three slots: after the seeds' steps the trials run three at a time, and a seed gives the
    same trials whatever order the runs finish in (each batch is told in the order it was
    asked; its size is the backend's capacity, not the slots free at that moment)."""
    text = SEEDED.replace("trials: 6", "trials: 9")
    runs = []
    for i, timing in enumerate((1, 2, 3)):
        ex = SlowExecutor(timing)
        outcome = _run_parallel(tmp_path / f"p{i}", ex, text, parallel=3)
        runs.append(([e.trial for e in outcome.steps[2].entries], outcome.steps[2].chosen.label))
        assert ex.most == 3  # three at once
    assert runs[0] == runs[1] == runs[2]
    trials = runs[0][0]
    assert len(trials) == 9 and len({json.dumps(t["point"], sort_keys=True) for t in trials}) == 9
