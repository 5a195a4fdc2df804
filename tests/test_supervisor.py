"""The supervisor against a tiny fake engine whose failures we control.

The fake engine is a stdlib-only script (FAKE_ENGINE_SRC, written to a temp dir) launched
through an in-test plugin (``fake``): it serves /health and /v1/completions and can crash,
hang, lie about its health, ignore SIGTERM, spawn workers, spawn a child that escapes into
its own session, and "use" accelerator memory that a fake hardware probe reports. These tests
depend on nothing but the core; the simulator's must-show tests are in tests/test_launch_cli.py.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import anyio
import httpx
import psutil
import pytest

from perflab import EnginePlugin, hookimpl
from perflab.contract.errors import UnsupportedOption
from perflab.contract.types import (
    Accelerator,
    CrashCause,
    EngineInfo,
    FileSpec,
    HttpProbe,
    LaunchSpec,
    Readiness,
    ServeConfig,
    Unsupported,
)
from perflab.lifecycle import registry
from perflab.plugins import PluginManager, module_plugin
from perflab.supervisor import STATES, EngineInstance, pick_free_port, signal_guard

FAKE_ENGINE_SRC = r'''
import http.server, json, os, signal, socket, subprocess, sys, threading, time

args = sys.argv[1:]
opt = dict(zip(args[::2], args[1::2]))
host, port = opt["--host"], int(opt["--port"])
modes = [m for m in opt.get("--mode", "normal").split(",") if m]
gpu_dir = os.environ.get("FAKE_GPU_DIR")

def mode(name):
    for m in modes:
        if m == name or m.startswith(name + ":"):
            return m.partition(":")[2] or True
    return None

def say(line):
    # One write per line: with unbuffered stdout (PYTHONUNBUFFERED, -u) print() writes the
    # text and the newline separately, and lines of processes sharing the pipe interleave.
    os.write(1, (line + "\n").encode())

def die(code, line):
    say(line)
    say(f"EXIT_AT {time.time():.6f}")
    os._exit(code)

def sleeper(ignore_term, new_session, tag):
    code = ("import os, signal, time\n"
            + ("os.setsid()\n" if new_session else "")
            + ("signal.signal(signal.SIGTERM, signal.SIG_IGN)\n" if ignore_term else "")
            + f"os.write(1, b'{tag} %d\\n' % os.getpid())\n"
            + "time.sleep(60)\n")
    return subprocess.Popen([sys.executable, "-c", code])

if gpu_dir:
    with open(os.path.join(gpu_dir, f"{os.getpid()}.mem"), "w") as f:
        f.write("4000")
    if mode("leak"):
        with open(os.path.join(gpu_dir, "leak.mem"), "w") as f:
            f.write("4000")

def recorder(tag, ignore_term=False):
    # A child that writes down every signal it gets (FAKE_SIGNAL_DIR/<pid>.sig) and, like an
    # engine's worker, exits on its first SIGTERM (unless told to ignore it).
    code = ("import os, signal, sys, time\n"
            f"path = os.path.join({sig_dir!r}, '%d.sig' % os.getpid())\n"
            "open(path, 'a').close()\n"
            "def rec(sig, frame):\n"
            "    with open(path, 'a') as f:\n"
            "        f.write(signal.Signals(sig).name + '\\n')\n"
            + ("" if ignore_term else "    if sig == signal.SIGTERM:\n        os._exit(0)\n")
            + "for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):\n"
            "    signal.signal(s, rec)\n"
            f"os.write(1, b'{tag} %d\\n' % os.getpid())\n"
            "while True:\n"
            "    time.sleep(1)\n")
    return subprocess.Popen([sys.executable, "-c", code])

say(f"FAKE starting pid={os.getpid()} modes={modes}")
sig_dir = os.environ.get("FAKE_SIGNAL_DIR", ".")
recorded = []
if mode("record-signals"):
    # The leader of a real server: it records its signals, forwards the first SIGTERM to its
    # workers, waits for them and exits 0 (vLLM's API server and llama.cpp's server do so).
    leader_sig = os.path.join(sig_dir, f"{os.getpid()}.sig")
    open(leader_sig, "a").close()
    def on_signal(sig, frame):
        with open(leader_sig, "a") as f:
            f.write(signal.Signals(sig).name + "\n")
        if sig == signal.SIGTERM:
            for c in recorded:
                c.send_signal(signal.SIGTERM)
            for c in recorded:
                try:
                    c.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
            say("FAKE stopped cleanly")
            os._exit(0)
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, on_signal)
    for i in range(int(mode("record-signals") if mode("record-signals") is not True else 2)):
        recorded.append(recorder(f"RECORDER{i}"))
if mode("orphan-ignores-sigterm"):
    recorder("ORPHAN", ignore_term=True)  # not forwarded to: it outlives the leader
if mode("zombie"):
    zpid = os.fork()
    if zpid == 0:
        os._exit(0)  # never waited for by its parent: a zombie until someone reaps it
    say(f"ZOMBIE {zpid}")
if mode("ignore-sigterm"):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
for i in range(int(mode("workers") or 0)):
    sleeper(False, False, f"WORKER{i}")
if mode("child-ignores-sigterm"):
    sleeper(True, False, "CHILD")
if mode("escape"):
    sleeper(True, True, "ESCAPED")
    time.sleep(0.3)  # let it reach setsid() before the parent dies
if mode("crash-at-start"):
    die(3, "RuntimeError: fake failure at start")
if mode("exit-plain"):
    die(7, "something went wrong, bye")
if mode("slow-start"):
    time.sleep(float(mode("slow-start")))
if mode("bind-fail"):
    say("FAKE READY on port %d" % port)
    die(1, "OSError: [Errno 98] Address already in use")
if mode("hang"):
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((host, port)); s.listen(64)
    say("FAKE READY on port %d" % port)
    time.sleep(600)

served = 0
crash_after = int(mode("crash-after") or 0)

class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a):
        pass
    def send(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        self.wfile.flush()
    def do_GET(self):
        if self.path == "/health":
            self.send(503 if mode("never-ready") else 200, {})
        else:
            self.send(404, {"error": "not found"})
    def do_POST(self):
        global served
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        if mode("health-lies"):
            self.send(500, {"error": "scheduler is dead"})
            return
        served += 1
        if self.path.endswith("/chat/completions"):
            self.send(200, {"choices": [{"index": 0, "message": {"role": "assistant", "content": "Hi"}}]})
        else:
            self.send(200, {"model": body.get("model"), "choices": [{"index": 0, "text": " world", "finish_reason": "length"}]})
        if crash_after and served >= crash_after:
            die(9, "RuntimeError: fake failure after %d requests" % served)

class S(http.server.ThreadingHTTPServer):
    allow_reuse_address = True
    daemon_threads = True

server = S((host, port), H)
say("FAKE READY on port %d" % port)
server.serve_forever()
'''


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def write_fake_engine(directory: Path) -> Path:
    path = directory / "fake_engine.py"
    path.write_text(FAKE_ENGINE_SRC)
    return path


def fake_plugin(script: Path, *, check: list[Unsupported] | None = None, files: tuple[FileSpec, ...] = (),
                extra_ports: tuple[int, ...] = (), executable: str | None = None,
                teardown_calls: list[dict[str, Any]] | None = None, teardown_raises: bool = False,
                startup_timeout: float = 20.0, version_check: Any = None) -> ModuleType:
    """An engine plugin for the fake engine. ``config.options['mode']`` picks its behaviour."""

    class FakeEngine(EnginePlugin):
        info = EngineInfo(name="fake", display_name="Fake", accelerators=("cuda",), executable=sys.executable)

        def version(self, env: Any) -> str | None:
            return "0.0-fake"

        def check_support(self, config: ServeConfig, hardware: Any, version: str | None) -> list[Unsupported]:
            return list(check or [])

        def build_launch(self, config: ServeConfig, hardware: Any, workdir: Path, version: str | None) -> LaunchSpec:
            if config.options.get("mode") == "unexpressible":
                raise UnsupportedOption("fake", "mode=unexpressible", "the fake engine has no such flag")
            argv = [executable or sys.executable, "-u", str(script), "--host", config.host, "--port", str(config.port),
                    "--mode", str(config.options.get("mode", "normal"))]
            return LaunchSpec(engine="fake", argv=tuple(argv), host=config.host, port=config.port,  # type: ignore[arg-type]
                              served_model_name=config.name, files=files, extra_ports=extra_ports,
                              env={"FAKE_PLUGIN_ENV": "1"})

        def readiness(self, launch: LaunchSpec) -> Readiness | None:
            return Readiness(http=(HttpProbe("/health"),), generation_path="/v1/completions",
                             ready_log_patterns=(r"FAKE READY",), startup_timeout_s=startup_timeout,
                             served_version_check=version_check)

        def classify_crash(self, exit_code: int | None, log_tail: str) -> CrashCause | None:
            m = re.search(r"^RuntimeError: fake failure.*$", log_tail, re.M)
            if m:
                return CrashCause("fake-failure", "the fake engine failed on purpose", line=m.group(0))
            return None

        def teardown(self, launch: LaunchSpec, workdir: Path) -> None:
            if teardown_calls is not None:
                teardown_calls.append({"engine": self.info.name, "port": launch.port, "workdir": workdir})
            if teardown_raises:
                raise RuntimeError("teardown hook exploded")

    @hookimpl
    def perflab_register_engines(register: Any) -> None:
        register(FakeEngine())

    @hookimpl
    def perflab_probe_hardware(env: Any) -> list[Accelerator] | None:
        gpu_dir = env.get("FAKE_GPU_DIR")
        if not gpu_dir:
            return None
        used = 0
        for f in Path(gpu_dir).glob("*.mem"):
            owner = f.stem
            if owner == "leak" or (owner.isdigit() and _pid_alive(int(owner))):
                used += int(f.read_text())
        return [Accelerator(vendor="nvidia", kind="cuda", index=0, name="Fake GPU", memory_total_mib=20000,
                            memory_used_mib=used, compute_capability=(8, 0), source="fake")]

    return module_plugin(
        "fake_plugin",
        perflab_register_engines=perflab_register_engines,
        perflab_probe_hardware=perflab_probe_hardware,
    )


def _pid_alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def make_pm(plugin: ModuleType) -> PluginManager:
    pm = PluginManager(entrypoints=False, builtins=False)
    rec = pm.add_plugin(plugin, name="fake")
    assert rec.status == "ok", rec.error
    return pm


class Fake:
    """One test's fake-engine setup: script, plugin, hardware, env, and what to check after."""

    def __init__(self, tmp_path: Path, **plugin_kw: Any) -> None:
        self.tmp = tmp_path
        self.script = write_fake_engine(tmp_path)
        self.gpu_dir = tmp_path / "gpu"
        self.gpu_dir.mkdir()
        self.teardown_calls: list[dict[str, Any]] = plugin_kw.pop("teardown_calls", [])
        self.pm = make_pm(fake_plugin(self.script, teardown_calls=self.teardown_calls, **plugin_kw))
        self.signal_dir = tmp_path / "signals"
        self.signal_dir.mkdir()
        self.env = {**os.environ, "FAKE_GPU_DIR": str(self.gpu_dir), "FAKE_SIGNAL_DIR": str(self.signal_dir)}
        from perflab.hardware import probe

        self.hardware = probe(self.pm, self.env)
        self.pids: list[int] = []

    def EngineInstance(self, mode: str = "normal", *, grace: float = 2.0, startup_timeout: float | None = 15.0,
                  port: int | None = None, force: bool = False, **kw: Any) -> EngineInstance:
        config = ServeConfig(model="fake/model", port=port, options={"mode": mode})
        return EngineInstance(self.pm, "fake", config, hardware=self.hardware, env=self.env,
                         workdir=self.tmp / f"run-{len(self.pids)}", force=force, startup_timeout=startup_timeout,
                         grace=grace, memory_settle_s=kw.pop("memory_settle_s", 0.5),
                         on_started=self.pids.append, **kw)


def marked_alive(inst: EngineInstance) -> list[psutil.Process]:
    """Every live process carrying this launch's marker (leader, workers, escaped children)."""
    out = []
    for p in psutil.process_iter():
        try:
            if p.environ().get("PERFLAB_INSTANCE") == inst.marker and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except (psutil.Error, OSError):
            continue
    return out


def assert_clean(inst: EngineInstance) -> None:
    o = inst.outcome
    assert marked_alive(inst) == []
    assert o.leftovers == [], o.leftovers
    assert o.launch is not None
    for port in o.launch.ports:
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((o.launch.host, port))  # raises if still bound
    assert o.teardown_s is not None
    assert inst not in registry.live_instances()


def exit_time(log: Path) -> float:
    m = re.search(r"^EXIT_AT ([0-9.]+)$", log.read_text(), re.M)
    assert m, log.read_text()
    return float(m.group(1))


def transition_time(inst: EngineInstance, state: str) -> float:
    return next(t for s, t in inst.outcome.transitions if s == state)


def log_pids(log: Path, tag: str) -> list[int]:
    return [int(m) for m in re.findall(rf"^{tag}\d* (\d+)$", log.read_text(), re.M)]


async def wait_log(log: Path, pattern: str, timeout: float = 10.0) -> None:
    with anyio.move_on_after(timeout):
        while not (log.exists() and re.search(pattern, log.read_text(), re.M)):
            await anyio.sleep(0.02)
        return
    pytest.fail(f"no line matching {pattern!r} in {log} within {timeout} s:\n{log.read_text()}")


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[Fake]:
    f = Fake(tmp_path)
    yield f
    registry.kill_all_now()  # a failing test must not leave engines running


# --------------------------------------------------------------------------- happy path


@pytest.mark.anyio
async def test_ready_serves_then_tears_down_completely(fake: Fake) -> None:
    async with fake.EngineInstance() as inst:
        o = inst.outcome
        assert o.state == "ready", o.to_json()
        assert inst.base_url is not None and inst.pid == o.pid
        async with httpx.AsyncClient(trust_env=False) as c:
            r = await c.post(inst.base_url + "/v1/completions", json={"model": "fake/model", "prompt": "x", "max_tokens": 1})
        assert r.json()["choices"][0]["text"] == " world"
        assert o.ready_s is not None and o.ready_log_s is not None and o.ready_log_s <= o.ready_s
        assert inst in registry.live_instances()
        # the engine got the caller's env, the plugin's env and the marker
        env = psutil.Process(inst.pid).environ()  # type: ignore[arg-type]
        assert env["FAKE_PLUGIN_ENV"] == "1" and env["FAKE_GPU_DIR"] == str(fake.gpu_dir)
        assert env["PERFLAB_INSTANCE"] == inst.marker
        assert os.getsid(inst.pid) == inst.pid  # type: ignore[arg-type]  # own session
        # the fake probe sees the engine's memory while it runs
    o = inst.outcome
    assert o.state == "done"
    assert [s for s, _ in o.transitions] == ["preflight", "launching", "waiting-ready", "ready", "tearing-down", "done"]
    assert all(s in STATES for s, _ in o.transitions)
    times = [t for _, t in o.transitions]
    assert times == sorted(times)
    assert o.version == "0.0-fake" and o.cause is None and o.reason is None
    assert "FAKE READY" in o.log.read_text()  # type: ignore[union-attr]
    launch = json.loads((o.workdir / "launch.json").read_text())  # type: ignore[operator]
    assert launch["argv"][2].endswith("fake_engine.py") and launch["port"] == o.launch.port  # type: ignore[union-attr]
    assert launch["env"] == {"FAKE_PLUGIN_ENV": "1"}
    assert fake.teardown_calls and fake.teardown_calls[0]["port"] == o.launch.port  # type: ignore[union-attr]
    assert_clean(inst)
    j = o.to_json()
    assert {"state", "cause", "reason", "log", "ready_s", "teardown_s"} <= set(j)
    json.dumps(j)


@pytest.mark.anyio
@pytest.mark.parametrize("answer", ["mismatch", "boom", None])
async def test_served_version_is_cross_checked_once_ready(tmp_path: Path, answer: str | None) -> None:
    seen: list[tuple[str, str | None, int]] = []

    async def check(base_url: str, detected: str | None) -> str | None:
        async with httpx.AsyncClient(trust_env=False) as c:  # the engine serves when asked
            seen.append((base_url, detected, (await c.get(base_url + "/health")).status_code))
        if answer == "boom":
            raise RuntimeError("plugin bug")
        return None if answer is None else f"serves 9.9, detected {detected}"

    fake = Fake(tmp_path, version_check=check)
    async with fake.EngineInstance() as inst:
        assert inst.outcome.state == "ready"
        assert seen == [(inst.base_url, "0.0-fake", 200)]
    warnings = [w.why for w in inst.outcome.warnings if w.what == "version"]
    if answer is None:
        assert warnings == []
    else:
        assert len(warnings) == 1 and ("0.0-fake" in warnings[0] or "plugin bug" in warnings[0])
        assert inst.outcome.state == "done"  # a warning, never a failure
    registry.kill_all_now()


@pytest.mark.anyio
async def test_slow_start_waits_for_a_real_generation(fake: Fake) -> None:
    async with fake.EngineInstance("slow-start:0.6") as inst:
        assert inst.outcome.state == "ready"
        assert inst.outcome.ready_s is not None and inst.outcome.ready_s >= 0.6
    assert_clean(inst)


@pytest.mark.anyio
async def test_files_are_written_under_workdir(tmp_path: Path) -> None:
    fake = Fake(tmp_path, files=(FileSpec("conf/config.json", '{"a": 1}'),))
    async with fake.EngineInstance() as inst:
        assert inst.outcome.state == "ready"
        assert json.loads((inst.workdir / "conf" / "config.json").read_text()) == {"a": 1}
    assert json.loads((inst.workdir / "launch.json").read_text())["files"] == ["conf/config.json"]
    assert_clean(inst)


# --------------------------------------------------------------------------- crashes


@pytest.mark.anyio
async def test_crash_at_start_is_named_and_noticed_at_once(fake: Fake) -> None:
    async with fake.EngineInstance("crash-at-start") as inst:
        o = inst.outcome
        assert o.state == "crashed"
        assert inst.died.is_set()
        assert o.cause is not None and o.cause.name == "fake-failure"
        assert o.cause.line == "RuntimeError: fake failure at start"
        assert o.exit_code == 3
        assert transition_time(inst, "crashed") - exit_time(o.log) < 1.0  # type: ignore[arg-type]
        assert o.teardown_s is not None  # already torn down inside __aenter__
    assert o.state == "crashed" and o.ready_s is None
    assert [s for s, _ in o.transitions][-2:] == ["crashed", "tearing-down"]
    assert o.to_json()["cause"] == "fake-failure"
    assert "fake failure at start" in o.to_json()["reason"]
    assert_clean(inst)


@pytest.mark.anyio
async def test_unknown_crash_gets_generic_cause_with_exit_code(fake: Fake) -> None:
    async with fake.EngineInstance("exit-plain") as inst:
        c = inst.outcome.cause
        assert inst.outcome.state == "crashed" and c is not None
        assert c.name == "unknown" and "code 7" in c.explanation
    assert_clean(inst)


@pytest.mark.anyio
async def test_crash_while_serving_sets_died_within_a_second(fake: Fake) -> None:
    async with fake.EngineInstance("crash-after:2") as inst:  # the readiness generation is request 1
        assert inst.outcome.state == "ready"
        assert not inst.died.is_set()
        async with httpx.AsyncClient(trust_env=False) as c:
            await c.post(inst.base_url + "/v1/completions", json={"model": "fake/model", "prompt": "x"})  # type: ignore[operator]
        with anyio.fail_after(5):
            await inst.died.wait()
        o = inst.outcome
        assert o.state == "crashed" and o.cause is not None and o.cause.name == "fake-failure"
        assert "after 2 requests" in (o.cause.line or "")
        assert transition_time(inst, "crashed") - exit_time(o.log) < 1.0  # type: ignore[arg-type]
    assert o.state == "crashed" and o.ready_s is not None and o.teardown_s is not None
    assert_clean(inst)


@pytest.mark.anyio
async def test_ready_line_before_bind_failure_is_not_ready(fake: Fake) -> None:
    async with fake.EngineInstance("bind-fail") as inst:
        o = inst.outcome
        assert o.state == "crashed" and o.ready_s is None
        assert o.ready_log_s is not None  # the line was seen, and not trusted
        assert "Address already in use" in (o.cause.line or "")  # type: ignore[union-attr]
    assert_clean(inst)


@pytest.mark.anyio
async def test_missing_executable_is_a_named_failure(tmp_path: Path) -> None:
    fake = Fake(tmp_path, executable=str(tmp_path / "no-such-engine"))
    async with fake.EngineInstance() as inst:
        o = inst.outcome
        assert o.state == "crashed" and o.cause is not None and o.cause.name == "spawn-failed"
        assert inst.pid is None
    assert o.state == "crashed"


# --------------------------------------------------------------------------- deadlines


@pytest.mark.anyio
async def test_never_healthy_times_out(fake: Fake) -> None:
    async with fake.EngineInstance("never-ready", startup_timeout=1.0) as inst:
        o = inst.outcome
        assert o.state == "timeout" and o.cause is not None and o.cause.name == "startup-timeout"
        assert "HTTP 503" in o.cause.explanation
    assert_clean(inst)


@pytest.mark.anyio
async def test_health_that_lies_is_caught_by_the_generation_probe(fake: Fake) -> None:
    async with fake.EngineInstance("health-lies", startup_timeout=1.0) as inst:
        o = inst.outcome
        assert o.state == "timeout" and o.cause is not None and o.cause.name == "generation-probe-failed"
        assert "HTTP 500" in o.cause.explanation
    assert_clean(inst)


@pytest.mark.anyio
async def test_hung_engine_times_out_and_is_killed(fake: Fake) -> None:
    t0 = time.monotonic()
    async with fake.EngineInstance("hang,ignore-sigterm", startup_timeout=1.0, grace=0.3) as inst:
        assert inst.outcome.state == "timeout"
    assert time.monotonic() - t0 < 10
    assert_clean(inst)


# --------------------------------------------------------------------------- teardown


@pytest.mark.anyio
async def test_sigterm_ignored_means_sigkill_after_grace(fake: Fake) -> None:
    async with fake.EngineInstance("ignore-sigterm", grace=0.4) as inst:
        assert inst.outcome.state == "ready"
    o = inst.outcome
    assert o.state == "done"
    assert 0.4 <= o.teardown_s < 5  # type: ignore[operator]
    assert o.exit_code == -signal.SIGKILL
    # the outcome says SIGKILL was needed (it is not a clean stop)
    assert len(o.killed) == 1 and o.killed[0].startswith(f"pid {o.pid} ") and "0.4 s grace" in o.killed[0], o.killed
    assert any("SIGKILL was needed" in n for n in o.notes), o.notes
    assert inst.outcome.to_json()["killed"] == o.killed
    assert_clean(inst)


def signals_received(fake: Fake) -> dict[int, list[str]]:
    """pid -> the signals it recorded, for every process of the stand-in that records them."""
    return {int(f.stem): f.read_text().split() for f in fake.signal_dir.glob("*.sig")}


@pytest.mark.anyio
async def test_each_process_gets_at_most_one_sigterm_and_the_leader_stops_its_children(fake: Fake) -> None:
    # A leader that forwards SIGTERM to its workers, like vLLM's API server and llama.cpp's
    # server; a second SIGTERM is what makes llama.cpp skip its cleanup.
    async with fake.EngineInstance("record-signals:3", grace=5.0) as inst:
        assert inst.outcome.state == "ready"
        await wait_log(inst.outcome.log, r"^RECORDER2 \d+$")  # type: ignore[arg-type]
    o = inst.outcome
    got = signals_received(fake)
    assert set(got) == {o.pid, *log_pids(o.log, "RECORDER")}, got  # type: ignore[arg-type]
    assert got[o.pid] == ["SIGTERM"]  # exactly one, to the leader
    for pid, sigs in got.items():
        assert sigs.count("SIGTERM") <= 1 and set(sigs) <= {"SIGTERM"}, (pid, sigs)
    assert o.exit_code == 0, o.exit_code  # it stopped itself: no SIGKILL, cleanup ran
    assert "FAKE stopped cleanly" in o.log.read_text()  # type: ignore[union-attr]
    assert o.killed == [] and o.teardown_s < 3  # type: ignore[operator]
    assert_clean(inst)


@pytest.mark.anyio
async def test_a_child_outliving_its_leader_gets_a_short_grace_not_the_full_one(fake: Fake) -> None:
    from perflab.lifecycle.procs import ORPHAN_GRACE_S

    async with fake.EngineInstance("record-signals:1,orphan-ignores-sigterm", grace=8.0) as inst:
        assert inst.outcome.state == "ready"
        await wait_log(inst.outcome.log, r"^ORPHAN \d+$")  # type: ignore[arg-type]
    o = inst.outcome
    orphan = log_pids(o.log, "ORPHAN")[0]  # type: ignore[arg-type]
    got = signals_received(fake)
    assert got[orphan] == ["SIGTERM"]  # once, after its leader was gone
    assert got[o.pid] == ["SIGTERM"]
    assert o.exit_code == 0
    # the leader's clean exit took well under a second; the orphan got ORPHAN_GRACE_S, not 8 s
    assert ORPHAN_GRACE_S <= o.teardown_s < 8.0 / 2, o.teardown_s  # type: ignore[operator]
    assert len(o.killed) == 1 and o.killed[0].startswith(f"pid {orphan} ") and "outlived its leader" in o.killed[0]
    assert not _pid_alive(orphan)
    assert_clean(inst)


@pytest.mark.anyio
async def test_zombies_are_reaped(fake: Fake) -> None:
    async with fake.EngineInstance("zombie", grace=2.0) as inst:
        assert inst.outcome.state == "ready"
        await wait_log(inst.outcome.log, r"^ZOMBIE \d+$")  # type: ignore[arg-type]
        zombie = log_pids(inst.outcome.log, "ZOMBIE")[0]  # type: ignore[arg-type]
        assert psutil.Process(zombie).status() == psutil.STATUS_ZOMBIE  # its parent never waits for it
    assert_clean(inst)
    # once its parent died it was re-parented to the keeper (a child subreaper), which reaped it
    with anyio.fail_after(2):
        while psutil.pid_exists(zombie):
            await anyio.sleep(0.02)
    assert inst.outcome.keeper_pid is not None
    with anyio.fail_after(2):  # and the keeper exits once its engine tree is gone
        while _pid_alive(inst.outcome.keeper_pid):
            await anyio.sleep(0.02)


@pytest.mark.anyio
async def test_workers_and_stubborn_children_are_killed(fake: Fake) -> None:
    async with fake.EngineInstance("workers:2,child-ignores-sigterm", grace=0.3) as inst:
        assert inst.outcome.state == "ready"
        await wait_log(inst.outcome.log, r"^CHILD \d+$")  # type: ignore[arg-type]
        await wait_log(inst.outcome.log, r"^WORKER1 \d+$")  # type: ignore[arg-type]
        kids = log_pids(inst.outcome.log, "WORKER") + log_pids(inst.outcome.log, "CHILD")  # type: ignore[arg-type]
        assert len(kids) == 3 and all(psutil.pid_exists(p) for p in kids)
    assert_clean(inst)
    assert not any(_pid_alive(p) for p in kids)


@pytest.mark.anyio
async def test_child_that_escaped_into_its_own_session_is_found_after_a_crash(fake: Fake) -> None:
    async with fake.EngineInstance("escape,crash-at-start", grace=0.3) as inst:
        assert inst.outcome.state == "crashed"
    escaped = log_pids(inst.outcome.log, "ESCAPED")  # type: ignore[arg-type]
    assert escaped, inst.outcome.log.read_text()  # type: ignore[union-attr]
    assert not _pid_alive(escaped[0])
    assert_clean(inst)


@pytest.mark.anyio
async def test_teardown_is_idempotent_and_callable_in_the_body(fake: Fake) -> None:
    async with fake.EngineInstance() as inst:
        assert inst.outcome.state == "ready"
        async with anyio.create_task_group() as tg:  # concurrent calls wait for one teardown
            tg.start_soon(inst.teardown)
            tg.start_soon(inst.teardown)
        assert inst.outcome.state == "done"
        first = inst.outcome.teardown_s
        await inst.teardown()
        assert not inst.died.is_set()  # a requested stop is not a death
    assert inst.outcome.teardown_s == first
    assert [s for s, _ in inst.outcome.transitions].count("tearing-down") == 1
    assert_clean(inst)


@pytest.mark.anyio
async def test_cancellation_while_waiting_still_tears_down(fake: Fake) -> None:
    inst = fake.EngineInstance("slow-start:30")
    with anyio.move_on_after(1.0):
        async with inst:
            pytest.fail("must not get ready")
    o = inst.outcome
    assert o.interrupted and o.ready_s is None
    assert o.state == "done" and "tearing-down" in [s for s, _ in o.transitions]
    assert_clean(inst)


@pytest.mark.anyio
async def test_cancellation_while_serving_still_tears_down(fake: Fake) -> None:
    with anyio.CancelScope() as scope:
        async with fake.EngineInstance("ignore-sigterm", grace=0.2) as inst:
            assert inst.outcome.state == "ready"
            scope.cancel()
            await anyio.sleep(30)
    assert inst.outcome.interrupted and inst.outcome.state == "done"
    assert_clean(inst)


@pytest.mark.anyio
async def test_teardown_hook_failure_is_recorded_not_raised(tmp_path: Path) -> None:
    fake = Fake(tmp_path, teardown_raises=True)
    async with fake.EngineInstance() as inst:
        assert inst.outcome.state == "ready"
    assert any("teardown hook" in x and "exploded" in x for x in inst.outcome.leftovers)
    assert marked_alive(inst) == []


@pytest.mark.anyio
async def test_memory_not_back_to_baseline_is_a_leftover(fake: Fake) -> None:
    async with fake.EngineInstance("leak", memory_settle_s=0.3) as inst:
        assert inst.outcome.state == "ready"
        used = fake.pm.hook.perflab_probe_hardware(env=fake.env)[0][0].memory_used_mib
        assert used == 8000  # the engine's and the leaked share, while it runs
    assert any("memory not released" in x and "cuda:0" in x for x in inst.outcome.leftovers), inst.outcome.leftovers
    assert marked_alive(inst) == []


@pytest.mark.anyio
async def test_memory_released_is_not_a_leftover(fake: Fake) -> None:
    async with fake.EngineInstance() as inst:
        assert inst.outcome.state == "ready"
        assert fake.pm.hook.perflab_probe_hardware(env=fake.env)[0][0].memory_used_mib == 4000
    assert_clean(inst)


# --------------------------------------------------------------------------- preflight and ports


@pytest.mark.anyio
async def test_preflight_error_refuses_unless_forced(tmp_path: Path) -> None:
    why = [Unsupported("quantization=fp8", "needs SM89+", source="test"),
           Unsupported("kv", "slow here", severity="warning")]
    fake = Fake(tmp_path, check=why)
    async with fake.EngineInstance() as inst:
        o = inst.outcome
        assert o.state == "unsupported" and inst.pid is None
        assert [u.what for u in o.reasons] == ["quantization=fp8"] and [u.what for u in o.warnings] == ["kv"]
        assert o.to_json()["reason"] == "quantization=fp8: needs SM89+"
    assert o.state == "unsupported" and fake.pids == []
    async with fake.EngineInstance(force=True) as forced:
        assert forced.outcome.state == "ready" and forced.outcome.reasons
    assert_clean(forced)


@pytest.mark.anyio
async def test_option_the_plugin_cannot_express_is_unsupported(fake: Fake) -> None:
    async with fake.EngineInstance("unexpressible") as inst:
        o = inst.outcome
        assert o.state == "unsupported" and "mode=unexpressible" in (o.reason or "")
    assert fake.pids == []


@pytest.mark.anyio
async def test_taken_port_fails_fast_without_starting(fake: Fake) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        async with fake.EngineInstance(port=port) as inst:
            o = inst.outcome
            assert o.state == "crashed" and o.cause is not None and o.cause.name == "port-in-use"
            assert str(port) in o.cause.explanation
    assert fake.pids == []


@pytest.mark.anyio
async def test_taken_extra_port_fails_fast(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        extra = s.getsockname()[1]
        fake = Fake(tmp_path, extra_ports=(extra,))
        async with fake.EngineInstance() as inst:
            assert inst.outcome.cause is not None and inst.outcome.cause.name == "port-in-use"
            assert str(extra) in inst.outcome.cause.explanation
    assert fake.pids == []


def test_pick_free_port_is_bindable() -> None:
    port = pick_free_port("127.0.0.1")
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


# --------------------------------------------------------------------------- signals / registry


@pytest.mark.anyio
async def test_signal_guard_cancels_the_work_and_tears_everything_down(fake: Fake) -> None:
    async with signal_guard(signals=(signal.SIGUSR1,)) as guard:
        async with fake.EngineInstance("ignore-sigterm", grace=0.2) as inst:
            assert inst.outcome.state == "ready"
            os.kill(os.getpid(), signal.SIGUSR1)
            await anyio.sleep(30)
    assert guard.interrupted and guard.exit_code == 128 + signal.SIGUSR1
    assert inst.outcome.state == "done" and inst.outcome.interrupted
    assert_clean(inst)


@pytest.mark.anyio
async def test_kill_all_now_is_the_synchronous_last_resort(fake: Fake) -> None:
    async with fake.EngineInstance("ignore-sigterm,workers:1", grace=0.2) as inst:
        assert inst.outcome.state == "ready"
        await wait_log(inst.outcome.log, r"^WORKER0 \d+$")  # type: ignore[arg-type]
        registry.kill_all_now()
        with anyio.fail_after(5):
            await inst.died.wait()
        assert inst.outcome.exit_code == -signal.SIGKILL
        with anyio.fail_after(5):
            while marked_alive(inst):
                await anyio.sleep(0.02)
    assert_clean(inst)


ABANDONING_SCRIPT = r"""
import sys, anyio
sys.path.insert(0, {tests!r})
from pathlib import Path
from test_supervisor import Fake
fake = Fake(Path({tmp!r}))
async def main():
    inst = fake.EngineInstance("ignore-sigterm")
    await inst.__aenter__()
    print("MARKER", inst.marker, inst.outcome.state, flush=True)
    # returns without __aexit__: only the atexit last resort can stop the engine now
anyio.run(main)
"""


def test_atexit_last_resort_kills_an_engine_left_running(tmp_path: Path) -> None:
    import subprocess

    code = ABANDONING_SCRIPT.format(tests=str(Path(__file__).parent), tmp=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    m = re.search(r"^MARKER (\S+) (\S+)$", done.stdout, re.M)
    assert m and m.group(2) == "ready", done.stdout + done.stderr
    leftovers = []
    for p in psutil.process_iter():
        try:
            if p.environ().get("PERFLAB_INSTANCE") == m.group(1) and p.status() != psutil.STATUS_ZOMBIE:
                leftovers.append(p)
        except (psutil.Error, OSError):
            continue
    for p in leftovers:
        p.kill()
    assert leftovers == []


def test_install_signal_handlers_makes_sigterm_act_like_ctrl_c() -> None:
    import subprocess

    code = ("import os, signal, time\n"
            "from perflab.supervisor import install_signal_handlers\n"
            "install_signal_handlers()\n"
            "try:\n"
            "    os.kill(os.getpid(), signal.SIGTERM)\n"
            "    time.sleep(10)\n"
            "except KeyboardInterrupt:\n"
            "    print('interrupted')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert done.stdout.strip() == "interrupted", done.stderr


@pytest.mark.anyio
async def test_errors_propagate_unwrapped_after_teardown(fake: Fake) -> None:
    from perflab.contract.errors import UsageError

    with pytest.raises(KeyError, match="from the body"):  # not an ExceptionGroup
        async with signal_guard(signals=(signal.SIGUSR1,)):
            async with fake.EngineInstance() as inst:
                assert inst.outcome.state == "ready"
                raise KeyError("from the body")
    assert inst.outcome.state == "done"
    assert_clean(inst)
    bad = EngineInstance(fake.pm, "nope", ServeConfig(model="m"), hardware=fake.hardware, env=fake.env,
                    workdir=fake.tmp / "nope")
    with pytest.raises(UsageError, match="unknown engine 'nope'"):
        async with bad:
            pytest.fail("must not enter")
