"""End to end on the simulator: a small study, Ctrl-C mid-study, resume, and the demo's decisions."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

TAG_ENV = "PERFLAB_LAB_TEST_TAG"

SMALL_PLAN = """
name: small
model: Qwen/Qwen3-8B
hardware: sim:a100-80g-x8
simulation: {time_scale: 50}
engines: [vllm, sglang]
candidates:
  - name: Max Num Seqs
    variants:
      - {name: "64", set: {max_num_seqs: 64}}
      - {name: "128", set: {max_num_seqs: 128}}
profiles:
  main: {label: Main, input_len: 64, output_len: 16, num_prompts: 12}
  other: {label: Other, input_len: 256, output_len: 8, num_prompts: 8}
timeouts: {startup_s: 60, benchmark_s: 120}
"""


def _tagged(tag: str) -> list[psutil.Process]:
    """Live processes started under this test (the tag is inherited through the environment)."""
    out = []
    for p in psutil.process_iter(["pid"]):
        try:
            if p.pid == os.getpid():
                continue
            if p.environ().get(TAG_ENV) == tag and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except (psutil.Error, OSError):
            continue
    return out


def _perflab(args: list[str], tag: str, cwd: Path) -> subprocess.Popen[str]:
    env = {**os.environ, TAG_ENV: tag, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, "-c", "from perflab.cli import main; main()", *args],
        cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def _wait(proc: subprocess.Popen[str], timeout: float) -> tuple[int, str, str]:
    """(exit code, stdout, stderr)"""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"perflab did not finish within {timeout} s:\n{out[-2000:]}\n{err[-4000:]}")
    return proc.returncode, out, err


def _rows(db: Path, sql: str) -> list[tuple]:
    with sqlite3.connect(db) as con:
        return list(con.execute(sql))


def _wait_for_runs(proc: subprocess.Popen, db: Path, done: int, timeout: float) -> None:
    """Until ``done`` runs of the study in ``db`` finished and the next one is running (bounded)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if db.exists():
            try:
                states = [r[0] for r in _rows(db, "SELECT state FROM runs ORDER BY id")]
            except sqlite3.OperationalError:
                states = []
            if states.count("done") >= done and states[-1] == "running":
                return
        time.sleep(0.05)


def _interrupt_after_runs(proc: subprocess.Popen, db: Path, done: int, timeout: float) -> tuple[int, str]:
    """Ctrl-C ``proc`` once ``done`` runs finished and the next is running: its exit code and stderr."""
    try:
        _wait_for_runs(proc, db, done, timeout)
        assert proc.poll() is None, "the study finished before it could be interrupted"
        proc.send_signal(signal.SIGINT)
        rc, _, err = _wait(proc, 60)
    finally:
        if proc.poll() is None:
            proc.kill()
    return rc, err


@pytest.mark.slow
def test_sigint_mid_study_then_resume(tmp_path):
    plan = tmp_path / "small.yaml"
    plan.write_text(SMALL_PLAN)
    out = tmp_path / "study"
    db = out / "study.db"
    tag = uuid.uuid4().hex
    proc = _perflab(["run", str(plan), "--out", str(out), "--no-live"], tag, tmp_path)
    rc, err = _interrupt_after_runs(proc, db, 1, 120)  # the first configuration finished, the next running
    assert rc == 130, err
    assert "interrupted" in err
    assert _tagged(tag) == [], "engine processes survived the interrupt"

    finished = _rows(db, "SELECT m.config_key, m.profile_key FROM measurements m JOIN runs r ON r.id = m.run_id"
                         " WHERE m.status = 'ok'")
    assert finished, "nothing was measured before the interrupt"
    states = [r[0] for r in _rows(db, "SELECT state FROM runs ORDER BY id")]
    assert states[-1] == "interrupted" and "running" not in states
    assert not (out / "report.md").exists()

    rc, text, err = _wait(_perflab(["run", str(plan), "--out", str(out), "--no-live", "--json"], tag, tmp_path), 240)
    assert rc == 0, err
    summary = json.loads(text)
    assert summary["complete"] and summary["measurements_reused"] >= len(finished)
    assert _tagged(tag) == []

    # nothing measured before the interrupt was measured again
    again = _rows(db, "SELECT m.config_key, m.profile_key FROM measurements m JOIN runs r ON r.id = m.run_id"
                      " WHERE r.session_id = 2")
    assert again, "the resumed study measured nothing"
    assert not set(again) & set(finished)
    for name in ("report.md", "report.json", "chart.png", "study.log"):
        assert (out / name).is_file(), name
    log_lines = (out / "study.log").read_text().splitlines()
    events = [json.loads(line)["event"] for line in log_lines]
    assert "lab.run-interrupted" in events and events.count("lab.start") == 2
    assert "engine.state" in events

    # `perflab report` rebuilds the same report from the directory
    rc, text, err = _wait(_perflab(["report", str(out), "--json"], tag, tmp_path), 60)
    assert rc == 0, err
    data = json.loads(text)
    assert data["simulated"] and data["complete"]
    assert data["optimized"]["engine"] in ("vllm", "sglang")
