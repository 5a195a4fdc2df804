"""Readiness and health as real vLLM 0.32 behaves, through the supervisor.

An in-test plugin launches tests/replay_vllm.py, which replays a real vLLM 0.32.0 fault log
(tests/fixtures/real/vllm-0.32.0-cpu/faults/) and answers HTTP as the real server did; the
plugin's readiness and crash classification are the real vLLM plugin's (perflab_vllm).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import anyio
import psutil
import pytest

from perflab import EnginePlugin, hookimpl
from perflab.contract.crashes import is_info
from perflab.contract.types import CrashCause, EngineInfo, HardwareSnapshot, LaunchSpec, Readiness, ServeConfig
from perflab.lifecycle import readiness_probe, registry
from perflab.plugins import PluginManager, module_plugin
from perflab.supervisor import EngineInstance
from perflab_vllm.crashes import classify
from perflab_vllm.launch import READINESS

HERE = Path(__file__).parent
REPLAY = HERE / "replay_vllm.py"
FAULTS = HERE / "fixtures" / "real" / "vllm-0.32.0-cpu" / "faults"
CASES = json.loads((FAULTS / "faults.json").read_text())
ENGINE = "vllm-replay"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def replay_plugin() -> ModuleType:
    class Replay(EnginePlugin):
        info = EngineInfo(name=ENGINE, display_name="vLLM 0.32 replay", accelerators=("cpu",), executable=sys.executable)

        def version(self, env: Any) -> str | None:
            return "0.32.0-replay"

        def build_launch(self, config: ServeConfig, hardware: Any, workdir: Path, version: str | None) -> LaunchSpec:
            case = str(config.options["case"])
            argv = [sys.executable, "-u", str(REPLAY), "--host", config.host, "--port", str(config.port),
                    "--log", str(FAULTS / f"{case}.log")]
            code = CASES[case]["exit_code"]
            if code is not None:
                argv += ["--exit-code", str(code)]
            argv += [str(x) for x in config.options.get("args", ())]
            return LaunchSpec(engine=ENGINE, argv=tuple(argv), host=config.host, port=int(config.port or 0),
                              served_model_name=config.name)

        def readiness(self, launch: LaunchSpec) -> Readiness | None:
            # the real plugin's probes and ready patterns, with a test-sized start-up timeout
            return dataclasses.replace(READINESS, startup_timeout_s=20.0)

        def classify_crash(self, exit_code: int | None, log_tail: str) -> CrashCause | None:
            return classify(log_tail)

    @hookimpl
    def perflab_register_engines(register: Any) -> None:
        register(Replay())

    return module_plugin("replay_plugin", perflab_register_engines=perflab_register_engines)


@pytest.fixture
def pm() -> Iterator[PluginManager]:
    pm = PluginManager(entrypoints=False, builtins=False)
    rec = pm.add_plugin(replay_plugin(), name="replay")
    assert rec.status == "ok", rec.error
    yield pm
    registry.kill_all_now()  # a failing test must not leave engines running


# A --fault acts --fault-after seconds after the readiness generation; the tests that look for
# "ready" before the fault pass 3 s, so a loaded machine still sees "ready" first.
def run(pm: PluginManager, tmp_path: Path, case: str, *args: Any, timeout: float | None = None) -> EngineInstance:
    config = ServeConfig(model="/models/tiny", served_model_name="tiny", options={"case": case, "args": tuple(args)})
    return EngineInstance(pm, ENGINE, config, hardware=HardwareSnapshot(), env=dict(os.environ),
                     workdir=tmp_path / "run", startup_timeout=timeout, grace=2.0, check_memory=False)


def posts(inst: EngineInstance) -> int:
    assert inst.outcome.log is not None
    return len(re.findall(r'"POST /v1/completions', inst.outcome.log.read_text()))


def assert_gone(inst: EngineInstance) -> None:
    assert inst.pid is not None and not psutil.pid_exists(inst.pid) or psutil.Process(inst.pid).status() == psutil.STATUS_ZOMBIE
    assert inst.outcome.leftovers == []


# --------------------------------------------------------------------------- readiness


@pytest.mark.anyio
async def test_ready_line_of_032_wakes_the_probe_at_once(pm: PluginManager, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # With a 5 s poll interval, only the ready line can make "ready" follow it within a second.
    monkeypatch.setattr(readiness_probe, "MAX_INTERVAL_S", 5.0)
    monkeypatch.setattr(readiness_probe, "FIRST_INTERVAL_S", 5.0)
    async with run(pm, tmp_path, "enginecore-killed", "--health-503-until-ready", "1.0") as inst:
        o = inst.outcome
        assert o.state == "ready", o.to_json()
        assert o.ready_log_s is not None and o.ready_s is not None
        assert o.ready_s - o.ready_log_s < 1.0, (o.ready_s, o.ready_log_s)
        assert o.ready_s < 4.0  # not the second 5 s poll


@pytest.mark.anyio
async def test_generation_http_errors_end_readiness_quoting_the_answer(pm: PluginManager, tmp_path: Path) -> None:
    t0 = time.monotonic()
    async with run(pm, tmp_path, "enginecore-killed", "--gen-status", "404", timeout=30.0) as inst:
        o = inst.outcome
        assert o.state == "timeout" and o.cause is not None
        assert o.cause.name == "generation-probe-failed"
        assert "5 times in a row" in o.cause.explanation and "HTTP 404" in o.cause.explanation
        assert "replayed HTTP 404" in o.cause.explanation  # the engine's own answer
    assert time.monotonic() - t0 < 15.0  # well before the 30 s start-up timeout
    assert posts(inst) == readiness_probe.GENERATION_HTTP_ERRORS_MAX


@pytest.mark.anyio
async def test_auth_errors_are_not_retried(pm: PluginManager, tmp_path: Path) -> None:
    async with run(pm, tmp_path, "enginecore-killed", "--gen-status", "401", timeout=30.0) as inst:
        o = inst.outcome
        assert o.state == "timeout" and o.cause is not None and o.cause.name == "generation-probe-failed"
        assert "not retried" in o.cause.explanation and "HTTP 401" in o.cause.explanation
    assert posts(inst) == 1


@pytest.mark.anyio
async def test_the_probe_sends_the_engines_api_key(pm: PluginManager, tmp_path: Path) -> None:
    """vLLM --api-key guards /v1/*: the probe sends the key of the launch's argv (perflab.redact)."""
    async with run(pm, tmp_path, "enginecore-killed", "--api-key", "secret-key", timeout=30.0) as inst:
        assert inst.outcome.state == "ready", inst.outcome.to_json()


@pytest.mark.anyio
async def test_the_health_watch_sends_the_engines_api_key(pm: PluginManager, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """After ready, /v1/models still wants the key: without it the health watch read 401 as
    a dead engine and ended a healthy run (an accuracy run, a long benchmark) as crashed."""
    from perflab import supervisor

    monkeypatch.setattr(supervisor, "HEALTH_INTERVAL_S", 0.1)
    monkeypatch.setattr(supervisor, "HEALTH_FAIL_S", 0.3)
    async with run(pm, tmp_path, "enginecore-killed", "--api-key", "secret-key", timeout=30.0) as inst:
        assert inst.outcome.state == "ready", inst.outcome.to_json()
        with anyio.move_on_after(2.0):  # many health rounds, far past HEALTH_FAIL_S
            await inst.died.wait()
        assert not inst.died.is_set() and inst.outcome.state == "ready", inst.outcome.to_json()


@pytest.mark.anyio
async def test_an_api_key_on_the_engine_ends_readiness_at_once(pm: PluginManager, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A key perflab does not know (not in the argv nor VLLM_API_KEY): GET /v1/models answers
    401; no wait for the start-up timeout."""
    monkeypatch.setenv("REPLAY_API_KEY", "secret")
    t0 = time.monotonic()
    async with run(pm, tmp_path, "enginecore-killed", timeout=30.0) as inst:
        o = inst.outcome
        assert o.state == "timeout" and o.cause is not None and o.cause.name == "probe-refused", o.to_json()
        assert "GET /v1/models" in o.cause.explanation and "HTTP 401" in o.cause.explanation
        assert "Unauthorized" in o.cause.explanation and "not retried" in o.cause.explanation
        assert o.cause.line is None or not is_info(o.cause.line)  # never uvicorn's access line
    assert time.monotonic() - t0 < 10.0


# --------------------------------------------------------------------------- after ready


@pytest.mark.anyio
async def test_engine_core_death_with_keep_alive_is_caught_by_the_health_watch(pm: PluginManager, tmp_path: Path) -> None:
    """VLLM_KEEP_ALIVE_ON_ENGINE_DEATH=1: the API server lives on, /health says 503 forever."""
    async with run(pm, tmp_path, "enginecore-killed-keepalive", "--fault", "engine-core-died", "--keep-alive",
                   "--fault-after", "3") as inst:
        assert inst.outcome.state == "ready", inst.outcome.to_json()
        with anyio.fail_after(10):
            await inst.died.wait()
        o = inst.outcome
        assert o.state == "crashed" and o.cause is not None
        assert o.cause.name == "engine-core-died"
        assert "MPClient: engine core exited unexpectedly" in (o.cause.line or "")
        assert o.exit_code is None  # the process was alive: only its health said it was dead
        assert inst.pid is not None and psutil.pid_exists(inst.pid)
        assert any("health check failing" in n for n in o.notes)
    assert inst.outcome.state == "crashed"  # stays failed after teardown
    assert_gone(inst)


@pytest.mark.anyio
async def test_a_swamped_health_endpoint_with_the_death_in_the_log_is_a_crash_in_seconds(
        pm: PluginManager, tmp_path: Path) -> None:
    """Measured on the real vLLM with 1041 open streams when its EngineCore was killed: the API
    server lived on and /health timed out. Timeouts alone wait HEALTH_TIMEOUT_FAIL_S (a busy
    engine is not a dead one); with the engine's own death line in its output they do not."""
    from perflab.supervisor import HEALTH_TIMEOUT_FAIL_S

    async with run(pm, tmp_path, "enginecore-killed-keepalive", "--fault", "engine-core-died", "--keep-alive",
                   "--health-hangs-when-dead", "--fault-after", "3") as inst:
        assert inst.outcome.state == "ready", inst.outcome.to_json()
        t0 = time.monotonic()
        with anyio.fail_after(HEALTH_TIMEOUT_FAIL_S / 2):
            await inst.died.wait()
        o = inst.outcome
        assert o.state == "crashed" and o.cause is not None and o.cause.name == "engine-core-died"
        assert "no answer within" in " ".join(o.notes)
        print(f"named after {time.monotonic() - t0:.1f} s")
    assert_gone(inst)


@pytest.mark.anyio
async def test_exit_code_zero_after_the_engine_core_watchdog_is_a_crash(pm: PluginManager, tmp_path: Path) -> None:
    async with run(pm, tmp_path, "enginecore-killed", "--fault", "engine-core-died", "--fault-after", "3") as inst:
        assert inst.outcome.state == "ready", inst.outcome.to_json()
        with anyio.fail_after(10):
            await inst.died.wait()
        o = inst.outcome
        assert o.state == "crashed" and o.cause is not None
        assert o.cause.name == "engine-core-died"
        assert "MPClient: engine core exited unexpectedly" in (o.cause.line or "")
    assert inst.outcome.exit_code == 0
    assert_gone(inst)


@pytest.mark.anyio
async def test_kill_9_of_the_api_server_is_named_by_its_signal(pm: PluginManager, tmp_path: Path) -> None:
    async with run(pm, tmp_path, "apiserver-kill9", "--fault", "sigkill", "--fault-after", "3") as inst:
        assert inst.outcome.state == "ready", inst.outcome.to_json()
        with anyio.fail_after(10):
            await inst.died.wait()
        o = inst.outcome
        assert o.exit_code == -signal.SIGKILL
        assert o.cause is not None and o.cause.name == "killed-by-signal"
        assert "SIGKILL" in o.cause.explanation and "OOM" in o.cause.explanation
        assert "ulimit" not in (o.cause.line or "")


# --------------------------------------------------------------------------- start-up faults


@pytest.mark.anyio
@pytest.mark.parametrize("case", ["missing-model", "broken-config", "unknown-flag", "port-taken", "max-model-len", "sigint-startup"])
async def test_startup_fault_is_crashed_with_the_real_root_line(pm: PluginManager, tmp_path: Path, case: str) -> None:
    spec = CASES[case]
    async with run(pm, tmp_path, case) as inst:
        o = inst.outcome
        assert o.state == "crashed", o.to_json()
        assert o.exit_code == spec["exit_code"]
        assert o.cause is not None and o.cause.name == spec["cause"], o.cause
        if spec["root"]:
            assert spec["root"] in (o.cause.line or "")
        assert o.reason and "ulimit" not in o.reason


def test_the_032_ready_line_is_recognised_before_uvicorns() -> None:
    """0.32 prints ``Starting vLLM server on http://…`` (entry.py), then the routes, then uvicorn's line."""
    log = (FAULTS / "enginecore-killed.log").read_text().splitlines()
    first = next(i for i, ln in enumerate(log) if any(re.search(p, ln) for p in READINESS.ready_log_patterns))
    assert "[entry.py:140] Starting vLLM server on http://127.0.0.1:" in log[first]
