"""The lab stops a running benchmark: engine death, time budget, Ctrl-C (simulator, small plans).

The faulty configurations run their simulator in real time (``PERFLAB_SIM_TIME_SCALE: "1"``
in their ``env``, which the engine's environment takes over the study's 50): their benchmark
would take a minute of wall-clock time, while the healthy ones take about a second. A lab
that did not stop the client would spend that minute on each of them (or make the next
launch wait for it); one that does moves on at once.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import psutil
import pytest

TAG_ENV = "PERFLAB_LAB_TEST_TAG"
SCHEDULE_S = 60  # wall-clock length of a real-time configuration's benchmark, if not stopped
BUDGET_S = 5

FAULTY_PLAN = f"""
name: faulty
model: Qwen/Qwen3-8B
hardware: sim:a100-80g-x1
simulation: {{time_scale: 50}}
engines: [vllm]
candidates:
  - name: Faults
    variants:
      - {{name: crash, set: {{env: {{PERFLAB_SIM_FAULT: "crash-after:4", PERFLAB_SIM_TIME_SCALE: "1"}}}}}}
      - {{name: slow, set: {{env: {{PERFLAB_SIM_TIME_SCALE: "1"}}}}}}
      - {{name: "64", set: {{max_num_seqs: 64}}}}
profiles:
  main: {{label: Main, input_len: 32, output_len: 8, num_prompts: {SCHEDULE_S}, request_rate: 1, burstiness: 50}}
timeouts: {{startup_s: 60, benchmark_s: {BUDGET_S}}}
"""

LONG_PROFILE_PLAN = """
name: interrupted
model: Qwen/Qwen3-8B
hardware: sim:a100-80g-x1
simulation: {time_scale: 50}
engines: [vllm]
profiles:
  main: {label: Main, input_len: 32, output_len: 8, num_prompts: 10}
  second: {label: Second, input_len: 16, output_len: 4, num_prompts: 10}
  long: {label: Long, input_len: 16, output_len: 4, num_prompts: 3000, request_rate: 1}
timeouts: {startup_s: 60, benchmark_s: 600}
"""


def _rows(db: Path, sql: str, *args: object) -> list[tuple]:
    with sqlite3.connect(db) as con:
        return list(con.execute(sql, args))


@pytest.mark.slow
def test_engine_death_and_time_budget_stop_the_benchmark(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import anyio

    from perflab.lab.plan import load_plan_text
    from perflab.lab.progress import StudyProgress
    from perflab.lab.run.runner import run_study
    from perflab.plugins import load

    monkeypatch.setenv("PERFLAB_SIM_STATE_DIR", str(tmp_path / "sim-state"))
    plan = load_plan_text(FAULTY_PLAN, path="faulty.yaml")
    pm = load()
    out = tmp_path / "study"
    t0 = time.monotonic()
    with open(os.devnull, "w") as sink:
        progress = StudyProgress("faulty (test)", live=False, stream=sink)
        summary = anyio.run(lambda: run_study(pm, plan, out, progress=progress))
    elapsed = time.monotonic() - t0

    # the study went on past both faults and finished
    o = summary.outcome
    assert o is not None and o.complete and summary.exit_code == 0
    entries = {e.label: e.result for e in o.steps[1].entries}
    assert entries["vLLM 64"].status == "ok"
    assert (out / "report.md").is_file()

    runs = {r[0]: r[1:] for r in _rows(out / "study.db", "SELECT label, state, dir, finished - started FROM runs")}

    # the crash: recorded as crashed, with the cause the supervisor classified
    crashed = entries["vLLM crash"]
    assert crashed.status == "crashed", crashed
    assert "the engine died during the Main benchmark" in (crashed.error or "")
    state, run_dir, took = runs["vLLM crash"]
    assert state == "crashed"
    outcome = json.loads((out / run_dir / "outcome.json").read_text())
    supervisor_cause = outcome["instances"][0]["crash"]
    assert supervisor_cause and supervisor_cause["line"]
    assert crashed.cause == supervisor_cause == outcome["measurements"]["main"]["cause"]
    stopped = json.loads((out / run_dir / "bench-main.json").read_text())
    assert stopped["cancelled"] is True and stopped["status"] == "crashed"
    assert stopped["metrics"]["completed"] + stopped["metrics"]["failed"] < SCHEDULE_S
    assert took < SCHEDULE_S / 3, f"the crashed configuration took {took:.1f} s"

    # the time budget: recorded as failed once it ran out, not a minute later
    slow = entries["vLLM slow"]
    assert slow.status == "failed" and f"did not finish within {BUDGET_S} s" in (slow.error or "")
    state, run_dir, took = runs["vLLM slow"]
    assert took < SCHEDULE_S / 3, f"the over-budget configuration took {took:.1f} s"

    # nothing waited for an abandoned client, and nothing is left running
    assert elapsed < SCHEDULE_S, f"the study took {elapsed:.0f} s"
    assert psutil.Process().children(recursive=True) == []
    # anyio stops its worker threads when the event loop's root task ends, by a message the
    # thread reads after anyio.run has returned: give them a moment, then none may be left
    for t in threading.enumerate():
        if not t.daemon and t is not threading.main_thread():
            t.join(timeout=10)
    left = [t.name for t in threading.enumerate() if t.is_alive() and not t.daemon and t is not threading.main_thread()]
    assert left == [], f"threads left running: {left}"


# --------------------------------------------------------------------------- Ctrl-C


def _tagged(tag: str) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["pid"]):
        try:
            if p.pid != os.getpid() and p.environ().get(TAG_ENV) == tag and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except (psutil.Error, OSError):
            continue
    return out


@pytest.mark.slow
def test_ctrl_c_mid_benchmark_keeps_the_profiles_measured_and_exits_130(tmp_path: Path) -> None:
    """Interrupted during the third profile of a run: the second, measured by the same launch,
    is stored; the benchmark stops, the engine is torn down, and perflab exits 130 promptly
    (no forced exit needed: no thread is left behind)."""
    plan = tmp_path / "plan.yaml"
    plan.write_text(LONG_PROFILE_PLAN)
    out = tmp_path / "study"
    db = out / "study.db"
    tag = uuid.uuid4().hex
    env = {**os.environ, TAG_ENV: tag, "PYTHONUNBUFFERED": "1", "PERFLAB_SIM_STATE_DIR": str(tmp_path / "sim-state")}
    proc = subprocess.Popen([sys.executable, "-c", "from perflab.cli import main; main()", "run", str(plan), "--out",
                             str(out), "--no-live"], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        deadline = time.monotonic() + 120
        ready = False
        while time.monotonic() < deadline and proc.poll() is None and not ready:
            try:
                stored = {r[0] for r in _rows(db, "SELECT profile FROM measurements")} if db.exists() else set()
                running = _rows(db, "SELECT profiles FROM runs WHERE state = 'running'") if db.exists() else []
            except sqlite3.OperationalError:
                stored, running = set(), []
            ready = "second" in stored and any("long" in json.loads(r[0]) for r in running)
            time.sleep(0.05)
        assert ready, "the second profile was not stored while its launch went on to the long one"
        proc.send_signal(signal.SIGINT)
        t0 = time.monotonic()
        try:
            _, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
            pytest.fail(f"perflab did not stop after Ctrl-C:\n{err[-3000:]}")
        stopped_in = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
    assert stopped_in < 20, f"perflab took {stopped_in:.1f} s to stop"
    assert _tagged(tag) == [], "engine processes survived the interrupt"
    measured = _rows(db, "SELECT profile, status FROM measurements ORDER BY id")
    assert measured == [("main", "ok"), ("second", "ok")]
    assert _rows(db, "SELECT state FROM runs ORDER BY id")[-1] == ("interrupted",)


# --------------------------------------------------------------------------- a crash under load

CRASH_UNDER_LOAD_PLAN = """
name: crash-under-load
model: Qwen/Qwen3-8B
hardware: sim:a100-80g-x1
simulation: {time_scale: 50}
engines: [vllm]
engine_serve:
  vllm: {env: {PERFLAB_SIM_FAULT: "crash-after:20"}}
profiles:
  burst: {label: All at once, input_len: 64, output_len: 64, num_prompts: 400}
timeouts: {startup_s: 60, benchmark_s: 120}
"""


def test_a_crash_at_all_at_once_load_is_named_from_the_engines_line_not_our_cancellation(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """400 streams open when the engine dies: perflab cancels them all, and the cause it records
    is the engine's own root line, never the CancelledError of its own cancellation."""
    import anyio

    from perflab.lab.plan import load_plan_text
    from perflab.lab.progress import StudyProgress
    from perflab.lab.run.runner import run_study
    from perflab.plugins import load

    monkeypatch.setenv("PERFLAB_SIM_STATE_DIR", str(tmp_path / "sim-state"))
    plan = load_plan_text(CRASH_UNDER_LOAD_PLAN, path="crash.yaml")
    out = tmp_path / "study"
    with open(os.devnull, "w") as sink:
        progress = StudyProgress("crash (test)", live=False, stream=sink)
        anyio.run(lambda: run_study(load(), plan, out, progress=progress))
    (state, run_dir), = _rows(out / "study.db", "SELECT state, dir FROM runs")
    assert state == "crashed"
    outcome = json.loads((out / run_dir / "outcome.json").read_text())
    cause = outcome["instances"][0]["crash"]
    assert "illegal memory access" in cause["line"], cause
    blob = json.dumps(outcome) + (out / "report.md").read_text() + (out / "report.json").read_text()
    assert "CancelledError" not in blob
    assert "illegal memory access" in (out / "report.md").read_text()
    assert psutil.Process().children(recursive=True) == []
