"""perflab.contract.status.Status: one status vocabulary, its facts on the members, strings on disk."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from perflab.contract.status import Blame, Status
from perflab.contract.types import CrashCause
from perflab.lab.options import Configuration
from perflab.lab.store import ProfileMeasurement, RunRecord, Store, rebuild
from perflab.supervisor import STATES

# what earlier versions wrote in run.json / measurement-*.json / outcome.json / study.db
WRITTEN_BEFORE = ("preflight", "launching", "waiting-ready", "ready", "tearing-down", "done", "running", "ok",
                  "unsupported", "crashed", "timeout", "failed", "stalled", "pending", "interrupted")
RESULTS = {Status.OK, Status.STOPPED_EARLY, Status.UNSUPPORTED, Status.CRASHED, Status.TIMEOUT, Status.FAILED,
           Status.STALLED}


def test_every_outcome_is_a_fact_of_the_configuration_or_of_the_machine() -> None:
    for s in Status:
        if s.terminal and s is not Status.DONE:  # how a run or a measurement ended
            assert s.blame in (Blame.CONFIGURATION, Blame.MACHINE), s
        else:  # a passing state, or not measured yet: nobody's fact
            assert s.blame is None and not s.is_result, s
    assert {s for s in Status if s.blame is Blame.CONFIGURATION} == RESULTS
    assert {s for s in Status if s.blame is Blame.MACHINE} == {Status.INTERRUPTED}
    # what --retry-failed measures again and what ends a run before any measurement are failures
    assert {s for s in Status if s.retried} == {Status.CRASHED, Status.TIMEOUT, Status.FAILED, Status.STALLED}
    assert all(s.is_failure for s in Status if s.retried or s.startup)
    assert not Status.OK.is_failure and not Status.UNSUPPORTED.retried
    # a measurement stopped early (it had lost, or was over-saturated) is measured, never a failure
    assert {s for s in Status if s.measured} == {Status.OK, Status.STOPPED_EARLY}
    assert not Status.STOPPED_EARLY.is_failure and not Status.STOPPED_EARLY.retried


def test_the_supervisor_states_are_the_lifecycle_in_order() -> None:
    assert STATES == Status.supervisor_states()
    assert [str(s) for s in STATES] == ["preflight", "launching", "waiting-ready", "ready", "tearing-down", "done",
                                        "unsupported", "crashed", "timeout"]
    # a failed launch keeps its state after teardown: the supervisor's failures are terminal
    assert [s for s in STATES if s.terminal] == [Status.DONE, Status.UNSUPPORTED, Status.CRASHED, Status.TIMEOUT]


@pytest.mark.parametrize("text", WRITTEN_BEFORE)
def test_stored_strings_round_trip(text: str) -> None:
    s = Status(text)
    assert s == text and str(s) == text and f"{s}" == text and s.value == text
    assert json.loads(json.dumps({"state": s})) == {"state": text}
    assert Status(json.loads(json.dumps(s))) is s
    assert {text: 1}[s] == 1  # a dict keyed by the old strings still finds it
    assert set(WRITTEN_BEFORE) <= {str(s) for s in Status}  # every old string is still a member


def test_unknown_status_is_refused() -> None:
    with pytest.raises(ValueError):
        Status("exploded")


@pytest.mark.parametrize("status", sorted(RESULTS))
def test_retry_failed_follows_the_enum(tmp_path: Path, status: Status) -> None:
    """The store asks the member, for a measurement and for a run that measured nothing."""
    cfg = Configuration("vllm", {"model": "m"})
    store = Store(tmp_path)
    store.begin_session()
    rid, _ = store.begin_run(cfg.key(), "vllm", cfg.canonical(), "s", "measured", ["p"])
    store.add_measurement(rid, cfg.key(), "kp", "p", ProfileMeasurement(status, num_prompts=1, error="e"))
    store.finish_run(rid, RunRecord(status if status is not Status.OK else Status.DONE))
    if status.startup:
        other = Configuration("sglang", {"model": "m"})
        oid, _ = store.begin_run(other.key(), "sglang", other.canonical(), "s", "refused", ["p"])
        store.finish_run(oid, RunRecord(status, cause=CrashCause("x", "why")))
    store.close()

    again = Store(tmp_path)
    again.begin_session()
    assert again.lookup(cfg.key(), "kp").status is status  # counts without --retry-failed
    assert (again.lookup(cfg.key(), "kp", retry_failed=True) is None) is status.retried
    if status.startup:  # a run that ended before measuring decides every profile
        assert again.lookup(other.key(), "any").status is status
        assert (again.lookup(other.key(), "any", retry_failed=True) is None) is status.retried
    again.close()


def test_run_directories_of_earlier_versions_rebuild_into_members(tmp_path: Path) -> None:
    """``perflab report --rebuild`` over plain-string JSON (what every version wrote)."""
    cfg = Configuration("vllm", {"model": "m"})
    run = tmp_path / "runs" / "001-vllm"
    run.mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({
        "id": 1, "session_id": 1, "config_key": cfg.key(), "engine": "vllm", "config": cfg.canonical(), "step": "s",
        "label": "vLLM", "profiles": ["a", "b"], "state": "crashed", "dir": "runs/001-vllm", "started": 1.0,
        "finished": 2.0, "version": "0.32.0", "script": "vllm serve m", "reasons": [],
        "cause": {"name": "oom", "explanation": "out of memory", "line": "CUDA out of memory"}, "error": None, "log": None,
    }))
    (run / "measurement-a.json").write_text(json.dumps({
        "run_id": 1, "config_key": cfg.key(), "profile_key": "ka", "profile": "a", "status": "ok",
        "metrics": {"total_token_throughput": 10.0, "completed": 1, "failed": 0}, "num_prompts": 1, "error": None,
        "cause": None, "created": 1.5,
    }))
    (run / "measurement-b.json").write_text(json.dumps({
        "run_id": 1, "config_key": cfg.key(), "profile_key": "kb", "profile": "b", "status": "stalled",
        "metrics": None, "num_prompts": 1, "error": "no token for 60 s", "cause": None, "created": 1.6,
    }))
    assert rebuild(tmp_path) == {"runs": 1, "measurements": 2}
    store = Store.open_existing(tmp_path)
    a, b = store.lookup(cfg.key(), "ka"), store.lookup(cfg.key(), "kb")
    assert a is not None and a.status is Status.OK and a.tps == 10.0
    assert b is not None and b.status is Status.STALLED and b.summary() == "stalled: CUDA out of memory"
    assert [r["state"] for r in store.runs()] == ["crashed"]
    store.close()
