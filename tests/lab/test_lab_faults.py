"""Faults of the machine are never recorded as the configuration's (issue #24, item 5): an
engine that loses its port to another process, a deliberate ``perflab kill`` (simulator)."""

from __future__ import annotations

import socket
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from simstudy import run_sim_study

from perflab.lab.store.integrity import MachineNotReady

PLAN = """
name: port-lost
model: Qwen/Qwen3-8B
hardware: sim:a100-80g-x1
simulation: {{time_scale: 50}}
engines: [vllm]
{variants}
profiles:
  main: {{label: Main, input_len: 32, output_len: 8, num_prompts: 10}}
timeouts: {{startup_s: 60, benchmark_s: 600}}
"""


def _rows(db: Path, sql: str) -> list[tuple[Any, ...]]:
    with sqlite3.connect(db) as con:
        return list(con.execute(sql))


def _bind_errors(run_dir: Path) -> int:
    return (run_dir / "engine.log").read_text().lower().count("address already in use")


def test_a_port_taken_between_the_pick_and_the_bind_is_relaunched_on_a_fresh_port(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The race itself: another process binds the free port perflab picked after perflab
    checked it and before the engine binds it. The engine fails (address in use); perflab
    launches it once more on a fresh port, and the configuration is measured."""
    import perflab.supervisor as supervisor

    taken: list[socket.socket] = []
    real_hold = supervisor.ports_hold

    def hold_then_lose(ports: Any) -> None:
        real_hold(ports)
        if not taken:  # the first launch only: someone else takes its port right now
            s = socket.socket()
            s.bind(("127.0.0.1", list(ports)[0]))
            s.listen()
            taken.append(s)

    monkeypatch.setattr(supervisor, "ports_hold", hold_then_lose)
    out = tmp_path / "study"
    try:
        summary = run_sim_study(PLAN.format(variants=""), out)
    finally:
        for s in taken:
            s.close()
    assert taken, "the port was never taken: the test did not reproduce the race"
    assert summary.exit_code == 0
    runs = _rows(out / "study.db", "SELECT state, dir FROM runs")
    assert [r[0] for r in runs] == ["done"]
    assert _bind_errors(out / runs[0][1]) == 1  # the first launch's failure, kept in the log
    assert _rows(out / "study.db", "SELECT status FROM measurements") == [("ok",)]


def test_an_engine_that_keeps_losing_its_port_is_an_environment_fault_never_reused(tmp_path: Path) -> None:
    """``PERFLAB_SIM_FAULT=bind-fail``: the engine can never bind its port. The port perflab
    picked is tried twice (a fresh one the second time); then the run is ``interrupted`` with
    the reason — not ``crashed`` — the study stops (exit 3), and a resume measures the
    configuration again. (A plan cannot fix a study's port: perflab picks each launch's.)"""
    variants = ("candidates:\n  - name: Faults\n    variants:\n"
                "      - {name: lost port, set: {env: {PERFLAB_SIM_FAULT: bind-fail}}}")
    out = tmp_path / "study"
    with pytest.raises(MachineNotReady) as err:
        run_sim_study(PLAN.format(variants=variants), out)
    assert err.value.exit_code == 3
    assert "not ready" in str(err.value) and "port" in str(err.value) and "\n" not in str(err.value)
    runs = _rows(out / "study.db", "SELECT label, state, error, dir, id FROM runs")
    lost = [r for r in runs if r[0] == "vLLM lost port"]
    assert [r[1] for r in lost] == ["interrupted"], runs
    assert "lost the port perflab chose for it to another process, again on a fresh port" in lost[0][2]
    assert _bind_errors(out / lost[0][3]) == 2
    assert not _rows(out / "study.db", f"SELECT id FROM measurements WHERE run_id = {lost[0][4]}")
    # never reused: the same command launches it again
    with pytest.raises(MachineNotReady):
        run_sim_study(PLAN.format(variants=variants), out)
    assert [r[1] for r in _rows(out / "study.db", "SELECT label, state FROM runs") if r[0] == "vLLM lost port"] == \
        ["interrupted", "interrupted"]
