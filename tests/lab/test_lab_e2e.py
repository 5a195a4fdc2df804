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


@pytest.mark.slow
def test_sigint_mid_study_then_resume(tmp_path):
    plan = tmp_path / "small.yaml"
    plan.write_text(SMALL_PLAN)
    out = tmp_path / "study"
    db = out / "study.db"
    tag = uuid.uuid4().hex
    proc = _perflab(["run", str(plan), "--out", str(out), "--no-live"], tag, tmp_path)
    try:
        # wait (bounded) until the first configuration finished and the next one is running
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if db.exists():
                try:
                    states = [r[0] for r in _rows(db, "SELECT state FROM runs ORDER BY id")]
                except sqlite3.OperationalError:
                    states = []
                if "done" in states and states[-1] == "running":
                    break
            time.sleep(0.05)
        assert proc.poll() is None, "the study finished before it could be interrupted"
        proc.send_signal(signal.SIGINT)
        rc, _, err = _wait(proc, 60)
    finally:
        if proc.poll() is None:
            proc.kill()
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


@pytest.mark.slow
def test_demo_plan_decisions(tmp_path):
    """The demo's study makes seed 002's decisions: TensorRT-LLM wins engine selection, its AWQ
    checkpoint crashes with KeyError: 'weight', SGLang's FP8 is refused before launch, and the
    accuracy gate rejects vLLM's AWQ checkpoint (its simulated score drops). To stay
    short, this runs the demo's engine selection and quantization steps on its main profile
    (1000 prompts: the engines' ranking needs a full batch); `perflab demo` runs it all."""
    import dataclasses

    import anyio

    from perflab.lab.demo import demo_plan
    from perflab.lab.progress import StudyProgress
    from perflab.lab.run.runner import run_study
    from perflab.plugins import load

    pm = load()
    plan = demo_plan(pm.engine_names())
    plan = dataclasses.replace(plan, profiles=(plan.main,), candidates=plan.candidates[:1])
    with open(os.devnull, "w") as sink:
        progress = StudyProgress("demo (test)", live=False, stream=sink)
        summary = anyio.run(lambda: run_study(pm, plan, tmp_path / "demo", progress=progress))
    o = summary.outcome
    assert o is not None and o.complete
    engines = o.steps[0]
    assert engines.chosen.config.engine == "trtllm", [(e.label, e.result.summary()) for e in engines.entries]
    quant = {e.label: e for e in o.steps[1].entries}
    assert quant["SGLang FP8"].result.status == "unsupported"
    assert quant["TensorRT-LLM AWQ"].result.status == "crashed"
    assert "KeyError: 'weight'" in (quant["TensorRT-LLM AWQ"].result.cause or {}).get("line", "")
    md = (tmp_path / "demo" / "report.md").read_text()
    assert md.startswith("# Optimizing Qwen3-32B") and '> [!WARNING]\n> **Simulated study**' in md
    assert "# KeyError: 'weight'" in md and "SGLang's FP8" in md
    assert "trtllm-serve Qwen/Qwen3-32B" in md
    assert (tmp_path / "demo" / "chart.png").read_bytes().startswith(b"\x89PNG")
    report = json.loads((tmp_path / "demo" / "report.json").read_text())
    assert report["steps"][0]["chosen"] == "TensorRT-LLM"
    # issue #13: every measured profile carries its telemetry, energy and (the plan has a price) cost
    measured = [e["result"] for s in report["steps"] for e in s["entries"] if e["result"]["status"] == "ok"]
    assert measured
    for r in measured:
        assert r["telemetry"]["source"] == "nvml" and r["telemetry"]["power_w"]["peak"] > 0
        assert r["energy"]["joules"] > 0 and r["energy"]["output_tokens_per_joule"] > 0
        assert r["cost"]["per_million_output_tokens"] > 0 and r["cost"]["currency"] == "USD"
    # issue 25: every measured configuration carries its accuracy (simulated), and the AWQ
    # checkpoint's drop is rejected by the gate — in report.json, report.md and report.html
    gated = [e for s in report["steps"] for e in s["entries"] if e["result"]["status"] in ("ok", "stopped-early")]
    assert gated and all(e["accuracy"]["simulated"] is True for e in gated)
    assert all(e["accuracy"]["score"] is not None and e["accuracy"]["agreement"] for e in gated)
    rejected = {e["label"]: e for e in gated if e["accuracy"]["gate"] == "rejected"}
    assert "vLLM AWQ" in rejected and rejected["vLLM AWQ"]["eligible"] is False
    reason = rejected["vLLM AWQ"]["accuracy"]["reason"]  # its note also says it stopped early, when it did
    assert reason.startswith("rejected: accuracy -") and " points (perflab_arith)" in reason
    assert reason.count("rejected") == 1  # one verdict, however many measures reject it
    assert reason in rejected["vLLM AWQ"]["note"]
    assert {r["label"] for r in report["accuracy"]["rows"]} >= set(rejected)
    assert "## Accuracy" in md and reason in md and reason in (tmp_path / "demo" / "report.html").read_text()
