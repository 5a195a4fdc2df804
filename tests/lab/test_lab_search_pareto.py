"""Multi-objective search for SLO plans and the Pareto front in the report (issue 29): an SLO
plan's search maximizes the ranking figure and minimizes each latency the SLO limits (Optuna's
multi-objective TPE, the constraints kept), and the grid's or search's front is in report.json,
report.md and front.svg; the recommendation stays the best eligible point on ``decide_by``.

The simulator's studies are small (a few launches at ``time_scale: 10000``): the search's
front is checked from its trials' own figures, the grid's against the front of all its points.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from test_lab_search import Executor, _session

from perflab.lab.search import COMPLETE, JOURNAL, PRUNED, Search, Told, non_dominated

SLO = "slo: {tpot_ms: 100, percentile: 99}\n"


def _journal(path: Path) -> Any:
    import optuna

    return optuna.load_study(study_name="perflab-search", storage=optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(path / JOURNAL))))


def _objectives(e: Any, slo: Any, rank: Any) -> tuple[float, ...]:
    """A trial's point in objective space from its own measurement, every coordinate better larger."""
    return (rank.value(e.result), *(-float(c.measured) for c in slo.check(e.result.metrics)))


def _feasible(e: Any, slo: Any) -> bool:
    return e.trial is not None and e.trial["state"] == "complete" and e.eligible and slo.met(e.result.metrics)


def _front_of(entries: list[Any], slo: Any, rank: Any) -> list[int]:
    """The trial numbers of the non-dominated feasible entries, computed here from their figures."""
    ok = [e for e in entries if _feasible(e, slo)]
    pts = [_objectives(e, slo, rank) for e in ok]
    return [ok[i].trial["number"] for i, p in enumerate(pts)
            if not any(all(a >= b for a, b in zip(q, p, strict=True)) and q != p for q in pts)]


def test_non_dominated_keeps_the_points_no_other_betters_in_every_coordinate() -> None:
    pts = [(10.0, -5.0), (8.0, -1.0), (9.0, -6.0), (10.0, -5.0), (7.0, -1.0)]
    # (9, -6) is worse than (10, -5) in both; (7, -1) than (8, -1) in one and equal in the other
    assert non_dominated(pts) == [0, 1, 3]
    assert non_dominated([]) == []
    assert non_dominated([(1.0, 2.0, 3.0)]) == [0]


def test_a_pruned_trial_of_a_multi_objective_search_keeps_its_bound_never_a_figure() -> None:
    from perflab.lab.plan import Space, Tuning

    space = Space(engines=("vllm",), options={"max_num_seqs": (8, 16, 32)})
    search = Search(space, Tuning(trials=3, seed=0), None, constrained=True, minimize=["p99_tpot_ms"])
    n0, _ = search.ask()
    search.tell(n0, Told(COMPLETE, 100.0, (0.0, -5.0), (20.0,)))
    n1, _ = search.ask()
    search.tell(n1, Told(PRUNED, 80.0, (0.0, 0.0)))
    done = {t.number: t for t in search.finished()}
    assert done[n0].value == 100.0 and done[n1].told == PRUNED and done[n1].value == 80.0
    assert done[n1].attrs["bound"] == 80.0
    trials = search._study.get_trials(deepcopy=False)
    assert trials[0].values == [100.0, 20.0] and trials[1].values is None  # nothing made up for Optuna


def test_a_journal_of_other_objectives_is_refused_naming_it(tmp_path: Path) -> None:
    from perflab.contract.errors import UsageError
    from perflab.lab.plan import Space, Tuning

    space, journal = Space(engines=("vllm",), options={"max_num_seqs": (8, 16)}), tmp_path / JOURNAL
    Search(space, Tuning(trials=2), journal)
    with pytest.raises(UsageError, match="its search has 1 objective"):
        Search(space, Tuning(trials=2), journal, minimize=["p99_tpot_ms"])


def test_an_slo_search_is_multi_objective_reproducible_and_its_front_is_in_the_report(tmp_path: Path) -> None:
    """A throughput ranking with an SLO (stand-in executor: more sequences, more tokens/s and
    slower tokens): Optuna minimizes p99 TPOT beside maximizing throughput, the same trials for
    the same seed; the front is the feasible trials none betters in both; the recommendation,
    the best throughput, breaks the SLO (reported, not ranked), so it is not on the front."""
    import anyio

    from perflab.lab.report import render_markdown, report_context
    from perflab.lab.report.stored import stored_outcome
    from perflab.lab.store import Store

    one, two = Executor(), Executor()
    a, b = _session(tmp_path / "a", one, SLO), _session(tmp_path / "b", two, SLO)
    assert one.launched == two.launched
    assert [e.trial for e in a.steps[0].entries] == [e.trial for e in b.steps[0].entries]
    journal = _journal(tmp_path / "a")
    assert len(journal.directions) == 2
    for t in journal.get_trials(deepcopy=False):
        if t.user_attrs.get("told") == "complete":
            assert t.values == [pytest.approx(t.values[0]), float(t.params["max_num_seqs"])]
    step, slo, rank = a.steps[0], a.plan.decision.slo, a.rank
    info = step.search
    assert info["objectives"] == [{"name": "total_token_throughput", "direction": "maximize"},
                                  {"name": "p99_tpot_ms", "direction": "minimize"}]
    assert [f["number"] for f in info["front"]] == _front_of(step.entries, slo, rank)
    assert info["front"] and all(f["latencies"]["p99_tpot_ms"] <= 100 for f in info["front"])
    assert step.chosen is not None and not slo.met(step.chosen.result.metrics)
    assert not any(f["recommended"] for f in info["front"])
    store = Store.open_existing(tmp_path / "a")
    try:  # the report replays the journal (its objectives) and the store: the same front
        again = anyio.run(stored_outcome, store)
        md = render_markdown(again, report_context(store))
    finally:
        store.close()
    assert again.steps[0].search["front"] == info["front"] and again.steps[0].search["objectives"] == info["objectives"]
    assert "**Pareto front.**" in md and "| Trial | Configuration | Throughput | p99 TPOT (ms) |" in md
    assert f"The recommendation, {step.chosen.label}, is not on the front" in md


class _Tied(Executor):
    """Every point the same throughput; p99 TPOT grows with max_batched_tokens."""

    async def run(self, config: Any, profiles: Any, run_dir: Any, **_: Any) -> Any:
        from perflab.contract.status import Status
        from perflab.lab.store import ProfileMeasurement, RunRecord

        self.launched.append(repr(config.canonical()))
        metrics = {"num_prompts": 10, "completed": 10, "failed": 0, "total_token_throughput": 1000.0, "duration": 10.0,
                   "p99_tpot_ms": config.options.get("max_batched_tokens", 4096) / 100}
        return RunRecord(Status.DONE, measurements={p.name: ProfileMeasurement(Status.OK, metrics=metrics, num_prompts=10)
                                                    for p in profiles}, version="1", engine_seconds=3600.0, accelerators=1)


def test_a_tie_on_the_ranking_figure_goes_to_the_point_on_the_front(tmp_path: Path) -> None:
    """Two points as good on throughput: the one with the faster tokens is on the front and
    recommended (without the SLO the first measured would be), so the recommendation is on it."""
    grid = "method: grid\nspace: {engine: [sglang], max_batched_tokens: [8192, 2048]}\n"
    outcome = _session(tmp_path / "tied", _Tied(), SLO, search=grid)
    step = outcome.steps[0]
    assert step.chosen is not None and step.chosen.config.options["max_batched_tokens"] == 2048
    assert [(f["label"], f["recommended"]) for f in step.search["front"]] == [(step.chosen.label, True)]
    plain = _session(tmp_path / "plain", _Tied(), "", search=grid)
    assert plain.steps[0].chosen.config.options["max_batched_tokens"] == 8192 and "front" not in plain.steps[0].search


def test_an_interrupted_slo_search_resumes_with_its_objectives(tmp_path: Path) -> None:
    from perflab.contract.errors import PerflabError

    out = tmp_path / "study"
    first = Executor(fail_at=3)
    with pytest.raises(PerflabError):
        _session(out, first, SLO)
    second = Executor()
    outcome = _session(out, second, SLO)
    trials = [e.trial for e in outcome.steps[0].entries]
    assert len(trials) == 7 and len({json.dumps(t["point"], sort_keys=True) for t in trials}) == 7
    assert set(first.launched).isdisjoint(second.launched)  # nothing finished is launched again
    assert len(_journal(out).directions) == 2
    assert [f["number"] for f in outcome.steps[0].search["front"]] == _front_of(
        outcome.steps[0].entries, outcome.plan.decision.slo, outcome.rank)


# --------------------------------------------------------------------------- on the simulator

SIM = """
model: Qwen/Qwen3-8B
hardware: sim:a100-80g-x8
simulation: {time_scale: 10000}
engines: [vllm, sglang]
baseline: {engine: sglang, serve: {max_num_seqs: 32, max_batched_tokens: 8192}}   # a point: measured once
decide_by: goodput
slo: {ttft_ms: 4000, tpot_ms: 55, percentile: 99}   # SGLang 32/2048: p99 TPOT 49.5 ms
profiles:
  main: {input_len: 1024, output_len: 64, num_prompts: 60, max_concurrency: 32}
"""


@pytest.mark.slow
def test_an_slo_search_on_the_simulator_finds_a_front_with_the_recommendation_on_it(tmp_path: Path) -> None:
    """Fewer sequences give faster tokens and a longer wait for the first one, more give more
    goodput: the front trades them (with 8 sequences the wait breaks the SLO: at most 2 of
    the 4 trials are infeasible). Each front point is checked against every trial's own
    figures; the recommendation (the best goodput) is on it, eligible; report.json, report.md
    and front.svg show it."""
    from simstudy import run_sim_study

    plan = SIM + ("method: search\ntuning: {trials: 4, seed: 1}\n"
                  "space: {engine: [sglang], max_num_seqs: [8, 16, 32], max_batched_tokens: [2048, 8192]}\n")
    summary = run_sim_study(plan, tmp_path / "search")
    o = summary.outcome
    step, slo, rank = o.steps[0], o.plan.decision.slo, o.rank
    front = step.search["front"]
    assert len(front) >= 2, front
    assert [f["number"] for f in front] == _front_of(step.entries, slo, rank)
    by_number = {e.trial["number"]: e for e in step.entries}
    for f in front:
        e = by_number[f["number"]]
        assert _feasible(e, slo) and f["value"] == rank.value(e.result)
        assert not any(all(a >= b for a, b in zip(_objectives(x, slo, rank), _objectives(e, slo, rank), strict=True))
                       and x is not e and _objectives(x, slo, rank) != _objectives(e, slo, rank)
                       for x in step.entries if _feasible(x, slo))
    chosen = [f for f in front if f["recommended"]]
    assert len(chosen) == 1 and step.chosen is not None and step.chosen.eligible
    assert by_number[chosen[0]["number"]] is step.chosen and chosen[0]["value"] == max(f["value"] for f in front)
    assert len(_journal(tmp_path / "search").directions) == 3  # goodput, p99 TTFT, p99 TPOT
    report = json.loads((tmp_path / "search" / "report.json").read_text(encoding="utf-8"))
    assert report["steps"][0]["search"]["front"] == json.loads(json.dumps(front))
    md = (tmp_path / "search" / "report.md").read_text(encoding="utf-8")
    assert "| Trial | Configuration | Goodput | p99 TTFT (ms) | p99 TPOT (ms) |" in md
    assert f"{step.chosen.label} **(recommended)**" in md and "![Pareto front](front.svg)" in md
    svg = (tmp_path / "search" / "front.svg").read_text(encoding="utf-8")
    assert svg.startswith("<svg") and "Pareto front" in svg and "recommended" in svg
    assert "data:image/svg+xml" in (tmp_path / "search" / "report.html").read_text(encoding="utf-8")


@pytest.mark.slow
def test_a_grid_slo_plans_front_is_the_front_of_all_its_points(tmp_path: Path) -> None:
    from simstudy import run_sim_study

    # vLLM's points are feasible and dominated by SGLang's (less goodput, slower on both latencies)
    plan = SIM + "method: grid\nspace: {engine: [vllm, sglang], max_num_seqs: [16, 32], max_batched_tokens: [8192]}\n"
    summary = run_sim_study(plan, tmp_path / "grid", early_stop=False)
    o = summary.outcome
    step, slo, rank = o.steps[0], o.plan.decision.slo, o.rank
    assert all(e.trial["state"] == "complete" for e in step.entries)
    front = step.search["front"]
    assert [f["number"] for f in front] == _front_of(step.entries, slo, rank) and len(front) >= 2
    assert [f["label"] for f in front] == ["SGLang max_num_seqs=16 max_batched_tokens=8192",
                                           "SGLang max_num_seqs=32 max_batched_tokens=8192"]
    assert [f for f in front if f["recommended"]] == [f for f in front if f["number"] == step.chosen.trial["number"]]
    assert (tmp_path / "grid" / "front.svg").is_file()
    assert not (tmp_path / "grid" / JOURNAL).exists()
