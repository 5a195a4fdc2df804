"""No secret reaches an artifact or an output, end to end on the simulator.

A plan with ``serve.env: {HF_TOKEN: ...}`` and ``--api-key`` in its extra args runs as a whole
study (``perflab run``), and the same options go through ``perflab launch --check --json`` and
``perflab engines command`` (``--json`` and text): every byte of every file they write (study.db,
engine logs, plan copy, report, study.log ...) and all their stdout/stderr hold ``***``, never the
secrets. The study still measures: the simulated vLLM refuses /v1 requests without the real key,
so the readiness probe and the benchmark client did send it.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

SIM_HW = "sim:a100-80g-x8"


def _perflab(tmp_path: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    state = tmp_path / "sim-state"
    state.mkdir(exist_ok=True)
    env = {**os.environ, "PERFLAB_SIM_STATE_DIR": str(state), "PERFLAB_SIM_TIME_SCALE": "20", "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, "-c", "from perflab.cli import main; main()", *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=timeout)


def _secrets() -> tuple[str, str]:
    return f"hf_{uuid.uuid4().hex}", f"sk-{uuid.uuid4().hex}"


def _assert_clean(secrets: tuple[str, ...], *, files_under: Path | None = None, outputs: tuple[str, ...] = ()) -> int:
    """No secret in any file under ``files_under`` (raw bytes) nor in ``outputs``; the number of files read."""
    n = 0
    if files_under is not None:
        for path in sorted(files_under.rglob("*")):
            if path.is_file():
                n += 1
                data = path.read_bytes()
                for s in secrets:
                    assert s.encode() not in data, f"{s[:6]}... in {path}"
    for text in outputs:
        for s in secrets:
            assert s not in text
    return n


@pytest.mark.slow
def test_study_with_secrets_writes_them_nowhere(tmp_path: Path) -> None:
    tok, key = _secrets()
    plan = tmp_path / "secret.yaml"
    plan.write_text(f"""
name: secret
model: Qwen/Qwen3-8B
hardware: {SIM_HW}
simulation: {{time_scale: 50}}
engines: [vllm]
serve:
  env: {{HF_TOKEN: {tok}}}
  extra_args: ["--api-key", "{key}"]
profiles:
  main: {{label: Main, input_len: 32, output_len: 4, num_prompts: 6}}
timeouts: {{startup_s: 60, benchmark_s: 60}}
""")
    out = tmp_path / "study"
    r = _perflab(tmp_path, "run", str(plan), "--hardware", SIM_HW, "--out", str(out), "--no-live")
    assert r.returncode == 0, r.stderr[-3000:]
    rj = _perflab(tmp_path, "report", str(out), "--json")  # rebuilt from the masked plan in study.db
    assert rj.returncode == 0, rj.stderr[-3000:]

    n = _assert_clean((tok, key), files_under=out, outputs=(r.stdout, r.stderr, rj.stdout, rj.stderr))
    assert n >= 10  # study.db, plan.yaml, study.log, report.*, run files ...
    assert out.stat().st_mode & 0o777 == 0o700

    # it measured: every request went through the key-guarded engine
    with sqlite3.connect(out / "study.db") as db:
        rows = list(db.execute("SELECT status, metrics FROM measurements"))
        config = json.loads(db.execute("SELECT config FROM runs").fetchone()[0])
    assert rows and all(status == "ok" for status, _ in rows)
    assert all(json.loads(m)["completed"] == 6 for _, m in rows)
    assert config["options"]["env"] == {"HF_TOKEN": "***"} and config["options"]["extra_args"] == ["--api-key", "***"]
    # the masks are where the secrets were
    run_dir = next((out / "runs").iterdir())
    launch = json.loads((run_dir / "launch.json").read_text())
    assert launch["env"]["HF_TOKEN"] == "***" and launch["argv"][launch["argv"].index("--api-key") + 1] == "***"
    assert "'api_key': ['***']" in (run_dir / "engine.log").read_text()
    assert "HF_TOKEN: '***'" in (out / "plan.yaml").read_text()
    assert "--api-key '***'" in (out / "report.md").read_text()  # the serving script
    assert json.loads(rj.stdout)["summary"]  # the report from the masked plan found the measurements

    # resuming with the real plan reuses the measurement (options are keyed redacted)
    again = _perflab(tmp_path, "run", str(plan), "--out", str(out), "--no-live", "--json")
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads(again.stdout)["runs_launched"] == 0
    _assert_clean((tok, key), files_under=out, outputs=(again.stdout, again.stderr))


def test_launch_check_json_and_engines_command_print_no_secret(tmp_path: Path) -> None:
    tok, key = _secrets()
    opts = ["--model", "Qwen/Qwen3-8B", "--hardware", SIM_HW, "--env", f"HF_TOKEN={tok}",
            "--extra-arg=--api-key", f"--extra-arg={key}"]
    work = tmp_path / "run"
    r = _perflab(tmp_path, "launch", "vllm", *opts, "--check", "--json", "--workdir", str(work), "--grace", "2")
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads(r.stdout)
    assert result["check"]["ok"]  # --check sent the key: the engine answers /v1 only with it
    assert result["launch"]["env"].get("HF_TOKEN", "***") == "***"
    assert result["launch"]["argv"][result["launch"]["argv"].index("--api-key") + 1] == "***"
    assert work.stat().st_mode & 0o777 == 0o700

    cj = _perflab(tmp_path, "engines", "command", "vllm", *opts, "--json")
    assert cj.returncode == 0, cj.stderr[-3000:]
    cmd = json.loads(cj.stdout)
    assert cmd["argv"][cmd["argv"].index("--api-key") + 1] == "***"
    ct = _perflab(tmp_path, "engines", "command", "vllm", *opts)
    assert ct.returncode == 0, ct.stderr[-3000:]
    assert "--api-key '***'" in ct.stdout

    _assert_clean((tok, key), files_under=work, outputs=(r.stdout, r.stderr, cj.stdout, cj.stderr, ct.stdout, ct.stderr))
