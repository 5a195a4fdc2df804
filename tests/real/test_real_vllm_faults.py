"""perflab against the real vLLM (CPU build 0.32.0, tiny local model): a stop and a crash in the
middle of a study, the engine core killed, startup faults. The lane's other half,
test_real_vllm.py, serves, benchmarks and studies; two files, so that xdist runs the halves on
both workers.

Each test starts its own engine and checks that nothing perflab started is left and the port
is free. The measured figures each test prints (``-s``) are the ones in docs/engines/vllm.md.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import time
from pathlib import Path

import httpx
import pytest
from reallab import RealLab, free_port
from test_real_vllm import _engine_core, _plan, _ready


def test_sigint_during_a_study_benchmark_stops_everything(lab: RealLab) -> None:
    out = lab.tmp / "study"
    plan = _plan(lab, "{label: Long, input_len: 256, output_len: 128, num_prompts: 2000, seed: 1}", candidates=False)
    proc = lab.popen("run", str(plan), "--hardware", "auto", "--out", str(out))
    try:
        _engine_core(lab, timeout=300)
        _wait_for_generation(lab, out)
        started = time.monotonic()
        rc, _, err = proc.stop(signal.SIGINT, timeout=120)
    finally:
        proc.kill()
    print(f"\nSIGINT during benchmark: perflab exited {rc} after {time.monotonic() - started:.1f} s")
    assert rc == 130, err[-3000:]
    lab.assert_nothing_left()


def _wait_for_generation(lab: RealLab, study: Path, timeout: float = 300) -> None:
    """Until the engine has generated tokens for the benchmark (its own counter moves)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for launch in study.glob("runs/*/launch.json"):
            try:
                spec = json.loads(launch.read_text())
                port = spec.get("port") or spec.get("launch", {}).get("port")
                text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
            except (OSError, ValueError, httpx.HTTPError):
                continue
            m = re.search(r"^vllm:generation_tokens_total\{[^}]*\} ([\d.e+]+)", text, re.M)
            if m and float(m.group(1)) > 50:
                return
        time.sleep(0.5)
    raise AssertionError("the benchmark never generated tokens")


# --------------------------------------------------------------------------- engine core killed


@pytest.mark.parametrize("keep_alive", ["0", "1"])
def test_engine_core_killed_while_idle_is_a_named_crash(lab: RealLab, keep_alive: str) -> None:
    port = free_port()
    proc = lab.popen(*lab.launch_args("--port", str(port), "--json", "--env",
                                      f"VLLM_KEEP_ALIVE_ON_ENGINE_DEATH={keep_alive}",
                                      "--workdir", str(lab.tmp / "w")))
    try:
        _ready(proc)
        core = _engine_core(lab)
        core.kill()
        rc, out, err = proc.finish(timeout=120)
    finally:
        proc.kill()
    assert rc == 4, err[-3000:]
    result = json.loads(out)
    assert result["state"] == "crashed"
    line = (result["crash"] or {}).get("line") or ""
    print(f"\nEngineCore killed (keep-alive {keep_alive}): cause {result['cause']!r}, line {line!r}")
    assert "engine core" in line.lower() or "enginecore" in line.lower() or "EngineDead" in line, result["crash"]
    lab.assert_nothing_left(port)


def test_engine_core_killed_during_a_benchmark_is_a_named_crash(lab: RealLab) -> None:
    out = lab.tmp / "study"
    plan = _plan(lab, "{label: Long, input_len: 256, output_len: 128, num_prompts: 2000, seed: 1}", candidates=False)
    proc = lab.popen("run", str(plan), "--hardware", "auto", "--out", str(out))
    try:
        core = _engine_core(lab, timeout=300)
        _wait_for_generation(lab, out)
        core.kill()
        rc, _, err = proc.finish(timeout=300)
    finally:
        proc.kill()
    report = json.loads((out / "report.json").read_text())
    blob = json.dumps(report)
    print(f"\nEngineCore killed mid-benchmark: perflab exited {rc}")
    assert "crashed" in blob, blob[:2000]
    assert "CancelledError" not in blob
    assert re.search(r"engine core|EngineCore|EngineDead", blob), blob[:3000]
    lab.assert_nothing_left()


# --------------------------------------------------------------------------- startup faults


def _launch_fault(lab: RealLab, *extra: str, model: Path | str | None = None, timeout: float = 300) -> dict:
    port = free_port()
    r = lab.run(*lab.launch_args("--check", "--json", "--port", str(port), "--workdir", str(lab.tmp / "w"),
                                 "--grace", "5", *extra, model=model), timeout=timeout)
    result = json.loads(r.stdout)
    result["_rc"] = r.rc
    print(f"\n{extra or model}: rc {r.rc}, state {result['state']}, cause {result['cause']!r}, "
          f"line {(result.get('crash') or {}).get('line')!r}, {r.seconds:.1f} s")
    lab.assert_nothing_left(port)
    return result


def _line(result: dict) -> str:
    return (result.get("crash") or {}).get("line") or ""


def test_broken_config_json(lab: RealLab) -> None:
    model = lab.tmp / "broken-model"
    shutil.copytree(lab.env.model, model)
    (model / "config.json").write_text('{"architectures": ["Qwen3ForCausalLM"], "model_type": ')
    result = _launch_fault(lab, model=model)
    assert result["_rc"] == 4 and result["state"] == "crashed"
    assert result["cause"] != "unknown"
    assert re.search(r"JSONDecodeError|config\.json|Expecting value|not a valid JSON", _line(result)), result["crash"]


def test_missing_model_path(lab: RealLab) -> None:
    result = _launch_fault(lab, model=lab.tmp / "no-such-model")
    assert result["_rc"] == 4 and result["state"] == "crashed"
    assert result["cause"] not in (None, "unknown")
    assert re.search(r"HFValidationError|LocalEntryNotFoundError|does not exist|not found|Repo id", _line(result)), result["crash"]


def test_unknown_flag(lab: RealLab) -> None:
    result = _launch_fault(lab, "--extra-arg=--no-such-flag-at-all")
    assert result["_rc"] == 4 and result["state"] == "crashed"
    assert "--no-such-flag-at-all" in _line(result), result["crash"]


def test_max_model_len_above_the_models_limit(lab: RealLab) -> None:
    # the tiny model has max_position_embeddings 2048; the last --max-model-len wins in argparse
    result = _launch_fault(lab, "--extra-arg=--max-model-len=4096")
    assert result["_rc"] == 4 and result["state"] == "crashed"
    assert "max_model_len" in _line(result) or "max-model-len" in _line(result), result["crash"]


def test_port_taken(lab: RealLab) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        r = lab.run(*lab.launch_args("--check", "--json", "--port", str(port), "--workdir", str(lab.tmp / "w")))
        result = json.loads(r.stdout)
        print(f"\nport taken: rc {r.rc}, state {result['state']}, reason {result['reason']!r}")
        assert r.rc == 4
        assert str(port) in (result["reason"] or "") + _line(result)
        assert str(os.getpid()) in json.dumps(result) or "in use" in json.dumps(result).lower()
    lab.assert_nothing_left()


def _shm_names() -> set[str]:
    """Python multiprocessing's shared memory and semaphores (vLLM's message queues)."""
    shm = Path("/dev/shm")
    return {p.name for p in shm.iterdir() if p.name.startswith(("psm_", "sem.mp-"))} if shm.is_dir() else set()


def _shm_litter() -> set[str]:
    """Those of :func:`_shm_names` that no live process maps. A segment still mapped has a live
    owner (the real engine of a test on the other xdist worker, say), which unlinks it itself.
    Only names there both before and after the scan of every process's maps count: one made
    meanwhile (that engine starting) is not mapped yet when its owner's maps were read."""
    before = _shm_names()
    held: set[str] = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            text = maps.read_text()
        except OSError:  # gone meanwhile
            continue
        held.update(line.split("/dev/shm/", 1)[1].split(" ", 1)[0] for line in text.splitlines() if "/dev/shm/" in line)
    return (before & _shm_names()) - held


def test_sigint_during_startup(lab: RealLab) -> None:
    port = free_port()
    shm_before = _shm_names()
    proc = lab.popen(*lab.launch_args("--json", "--port", str(port), "--grace", "5", "--workdir", str(lab.tmp / "w")))
    try:
        # the API server is up and the engine core is loading: vLLM is mid-startup
        _engine_core(lab, timeout=120)
        started = time.monotonic()
        rc, out, err = proc.stop(signal.SIGINT, timeout=60)
    finally:
        proc.kill()
    result = json.loads(out)
    print(f"\nSIGINT during startup: rc {rc} after {time.monotonic() - started:.1f} s, notes {result['notes']}")
    assert rc == 130, err[-2000:]
    assert result["interrupted"] is True
    lab.assert_nothing_left(port)
    # vLLM ignores SIGTERM while starting: SIGKILL; its resource tracker, killed last, still
    # unlinked the shared memory its peers had made (docs/lifecycle.md, "Cleaners last")
    assert _shm_litter() - shm_before == set()
