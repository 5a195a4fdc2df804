"""The study directory's SQLite store and resuming through it (with a fake executor)."""

from __future__ import annotations

import sqlite3

import anyio
import pytest

from perflab.contract.status import Status
from perflab.contract.types import CrashCause, Unsupported
from perflab.lab.options import Configuration
from perflab.lab.plan import load_plan_text
from perflab.lab.report.stored import StoreMeasure
from perflab.lab.run.runner import LiveMeasure
from perflab.lab.store import ProfileMeasurement, RunRecord, Store
from perflab.lab.study import conduct

CFG = Configuration("vllm", {"model": "m"})


def _ok(tps: float = 100.0) -> ProfileMeasurement:
    return ProfileMeasurement(Status.OK, metrics={"total_token_throughput": tps, "completed": 10, "failed": 0}, num_prompts=10)


def test_measurement_roundtrip_and_reuse_across_sessions(tmp_path):
    store = Store(tmp_path)
    store.begin_session()
    run_id, run_dir = store.begin_run(CFG.key(), "vllm", CFG.canonical(), "1. x", "vLLM", ["a", "b"])
    assert run_dir.is_dir() and run_dir.parent == tmp_path / "runs"
    store.add_measurement(run_id, CFG.key(), "ka", "a", _ok(123.0))
    store.finish_run(run_id, RunRecord(Status.DONE, script="vllm serve m", version="0.11.0", log=str(run_dir / "engine.log")))
    res = store.lookup(CFG.key(), "ka")
    assert res.status == Status.OK and res.tps == 123.0 and res.script == "vllm serve m" and not res.reused
    assert res.log == f"{run_dir.relative_to(tmp_path)}/engine.log"
    assert store.lookup(CFG.key(), "kb") is None
    store.end_session("done")
    store.close()

    again = Store(tmp_path)
    again.begin_session()
    res = again.lookup(CFG.key(), "ka")
    assert res.tps == 123.0 and res.reused
    again.close()


def test_refusal_decides_every_profile_crash_can_be_retried(tmp_path):
    store = Store(tmp_path)
    store.begin_session()
    refused = Configuration("sglang", {"model": "m-FP8"})
    rid, _ = store.begin_run(refused.key(), "sglang", refused.canonical(), "s", "SGLang FP8", ["a"])
    store.finish_run(rid, RunRecord(Status.UNSUPPORTED, reasons=(Unsupported("quantization", "needs SM89"),)))
    crashed = Configuration("trtllm", {"model": "m-AWQ"})
    cid, _ = store.begin_run(crashed.key(), "trtllm", crashed.canonical(), "s", "TRT AWQ", ["a"])
    store.finish_run(cid, RunRecord(Status.CRASHED, cause=CrashCause('x', 'boom', line="KeyError: 'weight'")))
    assert store.lookup(refused.key(), "any-profile").status == Status.UNSUPPORTED
    assert store.lookup(crashed.key(), "any-profile").cause["line"] == "KeyError: 'weight'"
    store.close()

    again = Store(tmp_path)
    again.begin_session()
    assert again.lookup(crashed.key(), "p").status == Status.CRASHED
    assert again.lookup(crashed.key(), "p", retry_failed=True) is None  # an earlier session's crash: retried
    assert again.lookup(refused.key(), "p", retry_failed=True).status == Status.UNSUPPORTED
    # a crash in this session counts even with --retry-failed (retried once, not per step)
    cid2, _ = again.begin_run(crashed.key(), "trtllm", crashed.canonical(), "s", "TRT AWQ", ["p"])
    again.finish_run(cid2, RunRecord(Status.CRASHED, cause=CrashCause('x', 'boom again')))
    assert again.lookup(crashed.key(), "p", retry_failed=True).cause["explanation"] == "boom again"
    again.close()


def test_mid_benchmark_crash_is_per_profile_and_runs_left_running_become_interrupted(tmp_path):
    store = Store(tmp_path)
    store.begin_session()
    rid, _ = store.begin_run(CFG.key(), "vllm", CFG.canonical(), "s", "vLLM", ["a", "b", "c"])
    store.add_measurement(rid, CFG.key(), "ka", "a", _ok())
    store.add_measurement(rid, CFG.key(), "kb", "b", ProfileMeasurement(Status.CRASHED, cause=CrashCause('oom', 'OOM')))
    store.finish_run(rid, RunRecord(Status.CRASHED, cause=CrashCause('oom', 'OOM')))
    assert store.lookup(CFG.key(), "ka").status == Status.OK
    assert store.lookup(CFG.key(), "kb").status == Status.CRASHED
    assert store.lookup(CFG.key(), "kc") is None  # never benchmarked: measured on the next launch
    other = Configuration("vllm", {"model": "n"})
    store.begin_run(other.key(), "vllm", other.canonical(), "s", "killed", ["a"])
    store.close()
    again = Store(tmp_path)
    again.begin_session()
    states = [r["state"] for r in again.runs()]
    assert states == [Status.CRASHED, "interrupted"]
    again.close()



def test_a_run_left_running_by_a_killed_perflab_is_interrupted_with_the_reason(tmp_path):
    """perflab SIGKILLed mid-run leaves the run "running": the next invocation marks it
    interrupted and says why (which perflab, killed), in the index and in run.json (what
    --rebuild reads), and it is never reused."""
    import json
    import os

    from perflab.lab.store import rebuild

    store = Store(tmp_path)
    store.begin_session()
    rid, run_dir = store.begin_run(CFG.key(), "vllm", CFG.canonical(), "s", "vLLM", ["a"])
    store.close()  # what a SIGKILL leaves: the run "running", nothing else recorded
    again = Store(tmp_path)
    again.begin_session()
    run = again.runs()[0]
    assert run["state"] == Status.INTERRUPTED
    assert f"perflab (pid {os.getpid()}) was killed while this run was going" in run["error"]
    assert json.loads((run_dir / "run.json").read_text())["error"] == run["error"]
    assert again.lookup(CFG.key(), "ka") is None
    again.close()
    # a study.db rebuilt from run directories still "running" says the same
    data = json.loads((run_dir / "run.json").read_text())
    (run_dir / "run.json").write_text(json.dumps({**data, "state": "running", "error": None}))
    rebuild(tmp_path)
    third = Store(tmp_path)
    assert "was killed while this run was going" in third.runs()[0]["error"]
    third.close()


def test_the_points_of_an_interrupted_curve_are_kept_and_rebuilt(tmp_path):
    """A curve's measured load points are stored as they come; only those of an interrupted
    run are offered to a resume (a finished curve is its measurement), stopped-early ones
    unless asked not to, and --rebuild indexes them from their files."""
    from perflab.lab.store import rebuild

    store = Store(tmp_path)
    store.begin_session()
    rid, _ = store.begin_run(CFG.key(), "vllm", CFG.canonical(), "s", "vLLM", ["curve"])
    store.add_point(rid, CFG.key(), "kc", "curve", "max_concurrency=4", _ok(40.0))
    store.add_point(rid, CFG.key(), "kc", "curve", "max_concurrency=16",
                    ProfileMeasurement(Status.STOPPED_EARLY, metrics={"total_token_throughput": 9.0}, num_prompts=10,
                                       stopped_early={"why": "over-saturated"}))
    assert store.points(CFG.key(), "kc") == {}  # the run goes on: its curve is not interrupted
    store.mark_interrupted(rid, "Ctrl-C")
    kept = store.points(CFG.key(), "kc")
    assert sorted(kept) == ["max_concurrency=16", "max_concurrency=4"]
    assert kept["max_concurrency=4"].metrics["total_token_throughput"] == 40.0
    assert kept["max_concurrency=16"].stopped_early == {"why": "over-saturated"}
    assert sorted(store.points(CFG.key(), "kc", stopped=False)) == ["max_concurrency=4"]
    assert store.points(CFG.key(), "other") == {}
    store.close()
    (tmp_path / "study.db").unlink()
    rebuild(tmp_path)
    again = Store(tmp_path)
    assert again.points(CFG.key(), "kc")["max_concurrency=4"].metrics == kept["max_concurrency=4"].metrics
    again.close()


PLAN = """
model: m
engines: [vllm, sglang]
candidates:
  - name: Max Num Seqs
    variants: [{name: "256", set: {max_num_seqs: 256}}, {name: "512", set: {max_num_seqs: 512}}]
profiles:
  main: {input_len: 10, output_len: 10, num_prompts: 10}
  other: {input_len: 100, output_len: 10, num_prompts: 10}
"""


class FakeExecutor:
    """Stands in for perflab.lab.run.executor.Executor: records calls, invents throughput."""

    def __init__(self, stop_after: int | None = None, broken: str | None = None) -> None:
        self.calls: list[tuple[str, dict, tuple[str, ...]]] = []
        self.stop_after = stop_after
        self.broken = broken

    async def run(self, config, profiles, run_dir, *, label="", to_beat=None):
        if self.stop_after is not None and len(self.calls) >= self.stop_after:
            raise KeyboardInterrupt  # what Ctrl-C looks like to the measure wrapper
        if config.engine == self.broken:
            raise RuntimeError("plugin bug")
        self.calls.append((config.engine, dict(config.options), tuple(p.name for p in profiles)))
        tps = {"vllm": 100.0, "sglang": 90.0}[config.engine] + config.options.get("max_num_seqs", 0) / 100
        return RunRecord(Status.DONE, measurements={
            p.name: ProfileMeasurement(Status.OK, metrics={"total_token_throughput": tps, "completed": 10}, num_prompts=10)
            for p in profiles})


class _Log:
    def info(self, *a, **k): ...
    def warning(self, *a, **k): ...
    def exception(self, *a, **k): ...


def _study(tmp_path, executor):
    plan = load_plan_text(PLAN)
    store = Store(tmp_path)
    store.begin_session()
    measure = LiveMeasure(store, {"hw": "x"}, executor, retry_failed=False, on_event=lambda *a, **k: None, log=_Log())
    try:
        return anyio.run(lambda: conduct(plan, measure)), measure
    finally:
        store.close()


def test_resume_reuses_finished_configurations(tmp_path):
    first = FakeExecutor(stop_after=3)
    with pytest.raises(KeyboardInterrupt):
        _study(tmp_path, first)
    assert len(first.calls) == 3
    with sqlite3.connect(tmp_path / "study.db") as db:
        states = [r[0] for r in db.execute("SELECT state FROM runs ORDER BY id")]
    assert states == ["done", "done", "done", "interrupted"]

    second = FakeExecutor()
    outcome, measure = _study(tmp_path, second)
    assert outcome.complete
    done_before = {(e, tuple(sorted(o.items())), p) for e, o, p in first.calls}
    for e, o, p in second.calls:
        assert (e, tuple(sorted(o.items())), p) not in done_before
    # vllm, sglang, 256 were measured before; this session: 512, then both on "other"
    assert [c[1].get("max_num_seqs") for c in second.calls] == [512, None, 512]
    assert [c[2] for c in second.calls] == [("main",), ("other",), ("other",)]
    assert measure.reused >= 3
    assert outcome.optimized.config.options["max_num_seqs"] == 512

    # a third run measures nothing and the report-only measure sees the same decisions
    third = FakeExecutor()
    again, _ = _study(tmp_path, third)
    assert third.calls == []
    store = Store(tmp_path)
    store.begin_session()
    report_view = anyio.run(lambda: conduct(load_plan_text(PLAN), StoreMeasure(store, {"hw": "x"})))
    store.close()
    assert report_view.optimized.config == again.optimized.config
    assert [c.change_pct for c in report_view.cases] == [c.change_pct for c in again.cases]


def test_store_measure_reports_pending_for_missing(tmp_path):
    store = Store(tmp_path)
    store.begin_session()
    o = anyio.run(lambda: conduct(load_plan_text(PLAN), StoreMeasure(store, {})))
    store.close()
    assert not o.complete and o.optimized is None
    assert all(e.result.status == Status.PENDING for e in o.steps[0].entries)


def test_a_perflab_bug_is_recorded_interrupted_with_its_reason_and_never_reused(tmp_path):
    """A plugin or client bug is perflab's fault, not the configuration's: the run is
    'interrupted' (with the reason), the study stops with one line, and a resume measures it."""
    from perflab.contract.errors import PerflabError

    with pytest.raises(PerflabError, match=r"perflab failed while measuring .*RuntimeError: plugin bug"):
        _study(tmp_path, FakeExecutor(broken="sglang"))
    store = Store(tmp_path)
    broken = [r for r in store.runs() if r["engine"] == "sglang"]
    assert [r["state"] for r in broken] == ["interrupted"] and "plugin bug" in broken[0]["error"]
    store.close()
    again = FakeExecutor()
    outcome, measure = _study(tmp_path, again)
    assert ("sglang", {}, ("main",)) in [(e, {k: v for k, v in o.items() if k != "model"}, p) for e, o, p in again.calls]
    assert outcome.complete and outcome.steps[0].entries[1].result.status == Status.OK


class LeakyExecutor(FakeExecutor):
    """Measures, but its teardown leaves a port bound (as the supervisor reports it)."""

    async def run(self, config, profiles, run_dir, *, label="", to_beat=None):
        rec = await super().run(config, profiles, run_dir, label=label)
        rec.leftovers = ["port 8000 is still bound by pid 4242 (python), not started by this launch"]
        return rec


def test_a_teardown_leftover_stops_the_study_keeping_the_measurement(tmp_path):
    from perflab.lab.store.integrity import MachineNotReady

    with pytest.raises(MachineNotReady, match=r"teardown of vllm left something behind: port 8000 .* pid 4242") as exc:
        _study(tmp_path, LeakyExecutor())
    assert exc.value.exit_code == 3 and exc.value.leftovers
    store = Store(tmp_path)
    assert [(r["engine"], r["state"]) for r in store.runs()] == [("vllm", "done")]  # one launch, then stop
    assert [m["status"] for m in store.measurements()] == [Status.OK]  # what it measured is kept
    store.close()


def test_only_the_store_reads_the_run_directories_results() -> None:
    """One source of truth for results: the store. The run directories are its durable log, so
    no other module of the core names their result files (it would read results the store
    does not know of, or miss its corrections)."""
    import re
    from pathlib import Path

    import perflab

    core = Path(perflab.__file__).parent
    store = core / "lab" / "store" / "__init__.py"
    names = re.compile(r"""["'](run\.json|measurement-[{*]|point-[{*])|\bRUN_FILE\b|_measurement_file|_point_file""")
    readers = [f"{p.relative_to(core)}:{i}: {line.strip()}"
               for p in sorted(core.rglob("*.py")) if p != store
               for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
               if names.search(line) and not line.lstrip().startswith("#")]
    assert not readers, readers
    assert names.search(store.read_text(encoding="utf-8"))  # the pattern still matches what the store spells
