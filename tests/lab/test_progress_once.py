"""Each configuration's result is announced once per step: a plan's ``max_regression`` guards
measure the baseline before the engine step, and the step then looks the same configuration up
again — the progress printed "✓ vLLM: 1541.79 tok/s" twice in a row (review of issue 24, item 11:
the progress lines show what they claim)."""

from __future__ import annotations

import anyio
from test_lab_store import PLAN, FakeExecutor, _Log

from perflab.lab.plan import load_plan_text
from perflab.lab.run.runner import LiveMeasure
from perflab.lab.store import Store
from perflab.lab.study import conduct


def _results(tmp_path, plan_text: str) -> list[tuple[str, str]]:
    plan = load_plan_text(plan_text)
    store = Store(tmp_path)
    store.begin_session()
    events: list[tuple[str, dict]] = []
    measure = LiveMeasure(store, {"hw": "x"}, FakeExecutor(), retry_failed=False,
                          on_event=lambda kind, **f: events.append((kind, f)), log=_Log())
    step = ""
    out: list[tuple[str, str]] = []
    try:
        anyio.run(lambda: conduct(plan, measure))
    finally:
        store.close()
    for kind, f in events:
        if kind == "step":
            step = f["title"]
        elif kind == "result":
            out.append((step, f["label"]))
    return out


def test_a_guarded_studys_baseline_result_is_announced_once_in_the_engine_step(tmp_path) -> None:
    guarded = PLAN + "guards: {max_regression: {mean_ttft_ms: 0.2}}\n"
    results = _results(tmp_path, guarded)
    engine_step = [label for step, label in results if step.startswith("1.")]
    assert engine_step == ["vllm", "sglang"], results


def test_without_guards_nothing_changes(tmp_path) -> None:
    results = _results(tmp_path, PLAN)
    assert [label for step, label in results if step.startswith("1.")] == ["vllm", "sglang"], results
