"""The simulated engine runtime, run as a real process: HTTP API, workers, signals, faults."""

from __future__ import annotations

import array
import fcntl
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import termios
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil
import pytest
from perflab.bench.serverclock import TIME_SCALE_HEADER
from perflab_sim import state
from perflab_sim.nvml import NvmlShim

MACHINE = "a100-80g-x8"
F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)  # Linux
READY = "INFO:     Application startup complete."
STARTUP = "INFO:     simulated engine starting"
SHUTDOWN = "INFO:     Shutting down"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Engine:
    proc: subprocess.Popen[bytes]
    port: int
    env: dict[str, str]
    out: list[str] = field(default_factory=list)
    err: list[str] = field(default_factory=list)
    _eof: set[int] = field(default_factory=set)
    _partial: dict[int, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def read_until(self, needle: str, timeout: float = 10.0, stream: str = "out") -> bool:
        """Collect output until a line containing ``needle`` appears in ``stream``; False at
        timeout or when both pipes reach EOF without it."""
        assert self.proc.stdout is not None and self.proc.stderr is not None
        target = self.out if stream == "out" else self.err
        sel = selectors.DefaultSelector()
        for pipe, lines in ((self.proc.stdout, self.out), (self.proc.stderr, self.err)):
            if not pipe.closed and pipe.fileno() not in self._eof:
                sel.register(pipe.fileno(), selectors.EVENT_READ, lines)
        deadline = time.monotonic() + timeout
        try:
            while not any(needle in line for line in target):
                left = deadline - time.monotonic()
                if left <= 0 or not sel.get_map():
                    return False
                for key, _ in sel.select(left):
                    fd = int(key.fd)
                    data = os.read(fd, 65536)
                    if not data:
                        self._eof.add(fd)
                        sel.unregister(fd)
                        continue
                    text = self._partial.pop(fd, "") + data.decode()
                    *complete, rest = text.split("\n")
                    key.data.extend(complete)
                    if rest:
                        self._partial[fd] = rest
            return True
        finally:
            sel.close()

    def finish(self, timeout: float = 5.0) -> int:
        """Wait for the server to exit and collect what it printed (orphaned workers may keep
        the pipes open, so read only what is there, never to EOF)."""
        code = self.proc.wait(timeout=timeout)
        self.read_until("\0never printed\0", timeout=0.2)
        return code


@pytest.fixture
def sim_env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "PERFLAB_SIM_HARDWARE": MACHINE,
            "PERFLAB_SIM_STATE_DIR": str(tmp_path / "state"),
            "PERFLAB_SIM_TIME_SCALE": "20",
        }
    )
    env.pop("PERFLAB_SIM_FAULT", None)
    return env


@contextmanager
def engine(env: dict[str, str], fault: str | None = None, **cfg: object) -> Iterator[Engine]:
    port = int(cfg.pop("port", 0)) or free_port()  # type: ignore[call-overload]
    config = {
        "engine": "vllm",
        "engine_version": "0.11.0",
        "model": "Qwen/Qwen3-8B",
        "served_model_names": ["Qwen/Qwen3-8B"],
        "host": "127.0.0.1",
        "port": port,
        "startup_lines": [STARTUP],
        "ready_lines": [READY],
        "shutdown_lines": [SHUTDOWN],
        "load_time_s": 0.05,
        **cfg,
    }
    run_env = dict(env)
    if fault:
        run_env["PERFLAB_SIM_FAULT"] = fault
    proc = subprocess.Popen(
        [sys.executable, "-m", "perflab_sim.runtime", json.dumps(config)],
        env=run_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        yield Engine(proc, port, run_env)
    finally:
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=5)
        for pipe in (proc.stdout, proc.stderr):
            if pipe:
                pipe.close()


def group_members(pgid: int) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["pid"]):
        # processes come and go while we look (a busy host): skip those already gone
        with suppress(psutil.Error, ProcessLookupError, PermissionError):
            if os.getpgid(p.pid) == pgid and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
    return found


def workers_of(e: Engine, count: int, timeout: float = 10.0) -> list[psutil.Process]:
    """The server's worker processes once all ``count`` have registered their memory."""
    directory = Path(e.env["PERFLAB_SIM_STATE_DIR"])
    deadline = time.monotonic() + timeout
    while True:
        children = [c for c in psutil.Process(e.proc.pid).children() if c.status() != psutil.STATUS_ZOMBIE]
        registered = {h.pid for h in state.holders(directory)}
        if len(children) == count and {c.pid for c in children} <= registered:
            return children
        assert time.monotonic() < deadline, f"{len(children)} of {count} workers registered"
        selectors.DefaultSelector().select(0.02)


def used_mib(env: dict[str, str], device: int = 0) -> int:
    nvml = NvmlShim(env)
    nvml.nvmlInit()
    try:
        return int(nvml.nvmlDeviceGetMemoryInfo(nvml.nvmlDeviceGetHandleByIndex(device)).used) // 2**20
    finally:
        nvml.nvmlShutdown()


def stream_chat(url: str, words: int, max_tokens: int, **extra: object) -> tuple[list[dict], httpx.Headers]:
    body = {
        "model": "Qwen/Qwen3-8B",
        "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": " ".join(["w"] * words)}],
        "max_completion_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        **extra,
    }
    events: list[dict] = []
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=10) as r:
        assert r.status_code == 200
        headers = r.headers
        lines = [line for line in r.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    for line in lines[:-1]:
        assert line.startswith("data: ")
        events.append(json.loads(line[6:]))
    return events, headers


# serving -----------------------------------------------------------------------------------


def test_streams_chat_with_usage_and_stops_cleanly_on_sigterm(sim_env: dict[str, str]) -> None:
    with engine(sim_env) as e:
        assert e.read_until(READY)
        assert e.out.index(STARTUP) < e.out.index(READY)
        assert httpx.get(f"{e.url}/health").status_code == 200
        events, headers = stream_chat(e.url, words=30, max_tokens=12, ignore_eos=True)
        assert headers[TIME_SCALE_HEADER] == "20"
        content = "".join(ev["choices"][0]["delta"].get("content", "") for ev in events if ev["choices"])
        assert len(content.split()) == 12
        assert events[0]["choices"][0]["delta"]["role"] == "assistant"
        # vLLM 0.32.0: the fingerprint rides on the final usage chunk only
        assert [ev.get("system_fingerprint", "").startswith("vllm-0.11.0-") for ev in events] == [False] * (len(events) - 1) + [True]
        finals = [ev["choices"][0]["finish_reason"] for ev in events if ev["choices"]]
        assert finals[-1] == "length" and set(finals[:-1]) == {None}
        usage = events[-1]["usage"]
        assert events[-1]["choices"] == []
        # 2 words of system prompt + 30 of user prompt, whitespace tokenization
        assert usage == {"prompt_tokens": 32, "completion_tokens": 12, "total_tokens": 44}
        models = httpx.get(f"{e.url}/v1/models").json()
        assert [m["id"] for m in models["data"]] == ["Qwen/Qwen3-8B"]
        assert used_mib(e.env) > 60000  # 0.9 x 80 GiB held by the engine
        os.kill(e.proc.pid, signal.SIGTERM)
        assert e.finish(timeout=3) == 0
        assert SHUTDOWN in e.out
        assert used_mib(e.env) == 4  # back to the idle baseline


def test_completions_non_streaming_and_token_limits(sim_env: dict[str, str]) -> None:
    with engine(sim_env, max_model_len=64) as e:
        assert e.read_until(READY)
        r = httpx.post(f"{e.url}/v1/completions", json={"model": "Qwen/Qwen3-8B", "prompt": "one two three"})
        body = r.json()
        assert r.status_code == 200
        assert body["usage"]["prompt_tokens"] == 3
        assert body["usage"]["completion_tokens"] == len(body["choices"][0]["text"].split()) <= 16  # vLLM default
        r = httpx.post(
            f"{e.url}/v1/completions",
            json={"model": "Qwen/Qwen3-8B", "prompt": "x " * 10, "max_tokens": 7, "ignore_eos": True},
        )
        assert r.json()["usage"]["completion_tokens"] == 7
        assert r.json()["choices"][0]["finish_reason"] == "length"
        too_long = httpx.post(f"{e.url}/v1/completions", json={"model": "Qwen/Qwen3-8B", "prompt": "x " * 64})
        assert too_long.status_code == 400
        assert too_long.json()["error"]["message"] == (
            "This model's maximum context length is 64 tokens. However, your request has 64 input tokens. "
            "Please reduce the length of the input messages."
        )
        too_many = httpx.post(
            f"{e.url}/v1/completions", json={"model": "Qwen/Qwen3-8B", "prompt": "x " * 60, "max_tokens": 10}
        )
        assert too_many.status_code == 400 and "'max_tokens' or 'max_completion_tokens' is too large" in too_many.text
        wrong = httpx.post(f"{e.url}/v1/chat/completions", json={"model": "other", "messages": []})
        assert wrong.status_code == 404 and wrong.json()["error"]["message"] == "The model `other` does not exist. Valid aliases: Qwen/Qwen3-8B."


def test_speculative_decoding_sends_multi_token_chunks(sim_env: dict[str, str]) -> None:
    with engine(sim_env, spec_method="mtp", spec_tokens=3, spec_acceptance=1.0) as e:
        assert e.read_until(READY)
        events, _ = stream_chat(e.url, words=5, max_tokens=13, ignore_eos=True)
        sizes = [len(ev["choices"][0]["delta"].get("content", "").split()) for ev in events if ev["choices"]]
        sizes = [s for s in sizes if s]
        assert sum(sizes) == 13
        assert sizes[0] == 1 and max(sizes) == 4  # first token from prefill, then 1 + 3 accepted drafts


def test_workers_hold_memory_and_outlive_a_killed_server(sim_env: dict[str, str]) -> None:
    with engine(sim_env, tp=2, workers=2, worker_title="VllmWorker TP{rank}") as e:
        assert e.read_until(READY)
        members = group_members(e.proc.pid)
        workers = [p for p in members if p.pid != e.proc.pid]
        assert sorted(p.cmdline()[0] for p in workers) == ["VllmWorker TP0", "VllmWorker TP1"]
        held = {h.pid: h.devices for h in state.holders(Path(e.env["PERFLAB_SIM_STATE_DIR"]))}
        assert sorted(held.values()) == [(0,), (1,)]
        assert set(held) == {p.pid for p in workers}
        os.kill(e.proc.pid, signal.SIGKILL)  # the server alone, as a careless teardown would
        e.proc.wait(timeout=5)
        assert all(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in workers)
        assert used_mib(e.env, 0) > 60000 and used_mib(e.env, 1) > 60000  # leaked workers keep it
        os.killpg(e.proc.pid, signal.SIGKILL)
        psutil.wait_procs(workers, timeout=5)
        assert used_mib(e.env, 0) == 4 and used_mib(e.env, 1) == 4


def test_sigterm_stops_workers_too(sim_env: dict[str, str]) -> None:
    with engine(sim_env, tp=2, workers=2) as e:
        assert e.read_until(READY)
        workers = [p for p in group_members(e.proc.pid) if p.pid != e.proc.pid]
        assert len(workers) == 2
        e.proc.send_signal(signal.SIGINT)
        assert e.finish(timeout=3) == 0
        gone, alive = psutil.wait_procs(workers, timeout=3)
        assert not alive


def test_sigterm_ends_a_loaded_engine_and_its_workers_within_a_second(sim_env: dict[str, str]) -> None:
    """Under load, with its stdout pipe full and no longer drained (a supervisor tearing a
    study down), the engine and its workers are gone about a second after SIGTERM."""
    access = 'INFO:     {client} - "{method} {path} HTTP/1.1" {status} {reason}'
    with engine({**sim_env, "PERFLAB_SIM_TIME_SCALE": "1000"}, tp=2, workers=2, behaviour={"access_log": access}) as e:
        assert e.proc.stdout is not None
        fcntl.fcntl(e.proc.stdout.fileno(), F_SETPIPE_SZ, 4096)  # a small pipe fills fast
        assert e.read_until(READY)
        workers = [p for p in group_members(e.proc.pid) if p.pid != e.proc.pid]
        assert len(workers) == 2
        body = json.dumps({"model": "Qwen/Qwen3-8B", "prompt": "w " * 500, "max_tokens": 4000, "ignore_eos": True, "stream": True})
        post = (f"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                f"content-length: {len(body)}\r\n\r\n{body}").encode()
        clients = []
        try:
            for _ in range(64):  # long generations keep the scheduler busy
                c = socket.create_connection(("127.0.0.1", e.port))
                c.sendall(post)
                clients.append(c)
            probe = socket.create_connection(("127.0.0.1", e.port))
            clients.append(probe)
            probe.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n" * 400)  # 400 access-log lines: far over 4 KiB
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and fionread(e.proc.stdout.fileno()) < 4000:
                selectors.DefaultSelector().select(0.05)
            assert fionread(e.proc.stdout.fileno()) >= 4000  # stdout is full: the server blocks writing to it
            started = time.monotonic()
            os.killpg(e.proc.pid, signal.SIGTERM)
            e.proc.wait(timeout=5)
            _gone, alive = psutil.wait_procs(workers, timeout=5)
            elapsed = time.monotonic() - started
        finally:
            for c in clients:
                c.close()
        assert not alive and elapsed < 2.5, elapsed  # the supervisor would SIGKILL after 10 s
        assert used_mib(e.env, 0) == 4 and used_mib(e.env, 1) == 4


def fionread(fd: int) -> int:
    """Bytes waiting in a pipe."""
    buf = array.array("i", [0])
    fcntl.ioctl(fd, termios.FIONREAD, buf)
    return buf[0]


def test_second_engine_on_busy_device_fails_like_vllm(sim_env: dict[str, str]) -> None:
    with engine(sim_env) as first:
        assert first.read_until(READY)
        with engine(sim_env) as second:
            assert second.finish() == 1
            assert any("Free memory on device" in line for line in second.err)
            assert READY not in second.out


def test_fail_signal_takes_the_engine_and_its_workers_down_by_that_signal(sim_env: dict[str, str]) -> None:
    lines = ["[2025-01-01 00:00:00] Scheduler hit an exception: ValueError: boom", "Received sigquit from a child process."]
    with engine(sim_env, tp=2, workers=2, fail_lines=lines, fail_after_s=0.5, behaviour={"fail_signal": 9}) as e:
        workers = workers_of(e, 2)
        assert e.finish(timeout=10) == -signal.SIGKILL
        assert e.err[-2:] == lines
        _gone, alive = psutil.wait_procs(workers, timeout=5)
        assert not alive
        assert used_mib(e.env, 0) == 4 and used_mib(e.env, 1) == 4


def test_crash_after_with_fail_signal_dies_by_the_signal(sim_env: dict[str, str]) -> None:
    with engine(sim_env, fault="crash-after:1", behaviour={"fail_signal": 6}) as e:
        assert e.read_until(READY)
        stream_chat(e.url, words=3, max_tokens=2, ignore_eos=True)
        assert e.finish(timeout=10) == -signal.SIGABRT


def test_bind_error_lines_and_signal_replace_uvicorns_message(sim_env: dict[str, str]) -> None:
    occupied = "[2025-01-01 00:00:00.000000] [ERROR] Management or Business or Metrics Http server listen port is occupied"
    extra = {"bind_error_lines": [occupied], "bind_error_signal": 9}
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        mgmt = taken.getsockname()[1]
        with engine(sim_env, extra_ports=[mgmt], behaviour=extra) as e:  # the management port is the busy one
            assert e.finish(timeout=10) == -signal.SIGKILL
            assert occupied in e.err
            assert not any("error while attempting to bind" in line for line in e.err)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        templ = "bind {host}:{port} failed: [Errno {errno}] {reason}"
        with engine(sim_env, port=taken.getsockname()[1], behaviour={"bind_error_lines": [templ]}) as e:
            assert e.finish(timeout=10) == 1
            assert f"bind 127.0.0.1:{taken.getsockname()[1]} failed: [Errno 98] address already in use" in e.err


def test_port_hosts_bind_extra_ports_on_their_own_address(sim_env: dict[str, str]) -> None:
    mgmt = free_port()
    extra = {"port_hosts": {str(mgmt): "127.0.0.2"}, "health_paths_by_port": {str(mgmt): ["/health"]}}
    with engine(sim_env, extra_ports=[mgmt], health_paths=[], behaviour=extra) as e:
        assert e.read_until(READY)
        assert httpx.get(f"http://127.0.0.2:{mgmt}/health").status_code == 200
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"http://127.0.0.1:{mgmt}/health")
        assert httpx.get(f"{e.url}/v1/models").status_code == 200  # the main port stays on host


def test_unknown_model_prints_hugging_face_error(sim_env: dict[str, str]) -> None:
    with engine(sim_env, model="nobody/NoSuchModel-7B", served_model_names=["x"]) as e:
        assert e.finish() == 1
        assert any("is not a valid model identifier" in line for line in e.err)


def test_weights_that_do_not_fit_fail_at_load(sim_env: dict[str, str]) -> None:
    with engine(sim_env, model="Qwen/Qwen3-235B-A22B", served_model_names=["x"]) as e:
        assert e.finish() == 1
        assert any("out of memory" in line for line in e.err)


def test_front_end_failure_lines(sim_env: dict[str, str]) -> None:
    lines = ["Traceback (most recent call last):", "RuntimeError: Unsupported SM version for FP8 block scaling GEMM"]
    with engine(sim_env, fail_lines=lines, fail_exit_code=3, fail_after_s=0.05) as e:
        assert e.finish() == 3
        assert e.err[-2:] == lines
        assert READY not in e.out


def test_bind_before_load_answers_503_until_loaded_and_extra_port_health(sim_env: dict[str, str]) -> None:
    mgmt = free_port()
    extra = {"bind_before_load": True, "health_paths_by_port": {str(mgmt): ["/v2/health/ready"]}}
    with engine(sim_env, load_time_s=30.0, extra_ports=[mgmt], health_paths=["/health"], behaviour=extra) as e:
        assert e.read_until(STARTUP)
        status = None
        deadline = time.monotonic() + 10
        while status is None and time.monotonic() < deadline:
            with suppress(httpx.TransportError):
                status = httpx.get(f"{e.url}/health", timeout=1).status_code
        assert status == 503
        assert httpx.get(f"http://127.0.0.1:{mgmt}/v2/health/ready").status_code == 503
        assert httpx.get(f"http://127.0.0.1:{mgmt}/v1/models").status_code == 404
        os.kill(e.proc.pid, signal.SIGTERM)  # while still loading
        assert e.finish(timeout=3) == 0


# faults ------------------------------------------------------------------------------------


def test_fault_crash_at_start(sim_env: dict[str, str]) -> None:
    with engine(sim_env, fault="crash-at-start") as e:
        assert e.finish() == 1
        assert e.err and READY not in e.out
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{e.url}/health")


def test_fault_crash_after_requests(sim_env: dict[str, str]) -> None:
    with engine(sim_env, fault="crash-after:2") as e:
        assert e.read_until(READY)
        for _ in range(2):
            stream_chat(e.url, words=3, max_tokens=2, ignore_eos=True)
        assert e.finish() == 1
        assert any("EngineCore encountered a fatal error" in line for line in e.err)


def test_fault_hang_after_requests(sim_env: dict[str, str]) -> None:
    with engine(sim_env, fault="hang-after:1") as e:
        assert e.read_until(READY)
        stream_chat(e.url, words=3, max_tokens=2, ignore_eos=True)
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(
                f"{e.url}/v1/completions",
                json={"model": "Qwen/Qwen3-8B", "prompt": "hi", "max_tokens": 2},
                timeout=0.5,
            )
        assert httpx.get(f"{e.url}/health").status_code == 200  # the process and port stay up
        assert e.proc.poll() is None


def test_fault_slow_start(sim_env: dict[str, str]) -> None:
    with engine(sim_env, fault="slow-start:0.6") as e:
        assert e.read_until(STARTUP)
        started = time.monotonic()
        assert e.read_until(READY)
        assert time.monotonic() - started >= 0.6


@pytest.mark.parametrize("fault", ["bind-fail", "ready-then-bind-fail"])
def test_fault_bind_fail(sim_env: dict[str, str], fault: str) -> None:
    with engine(sim_env, fault=fault) as e:
        assert e.finish() == 1
        assert any("[Errno 98]" in line and "address already in use" in line for line in e.err)
        assert (READY in e.out) == (fault == "ready-then-bind-fail")


def test_real_port_conflict_fails_like_uvicorn(sim_env: dict[str, str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with engine(sim_env, port=taken.getsockname()[1]) as e:
            assert e.finish() == 1
            assert any("error while attempting to bind on address" in line for line in e.err)


def test_fault_ignore_sigterm_engine_and_workers(sim_env: dict[str, str]) -> None:
    with engine(sim_env, fault="ignore-sigterm", tp=2, workers=2) as e:
        assert e.read_until(READY)
        workers = [p for p in group_members(e.proc.pid) if p.pid != e.proc.pid]
        os.killpg(e.proc.pid, signal.SIGTERM)
        with pytest.raises(subprocess.TimeoutExpired):
            e.proc.wait(timeout=0.5)
        gone, alive = psutil.wait_procs(workers, timeout=0.3)
        assert len(alive) == 2
        os.killpg(e.proc.pid, signal.SIGKILL)
        assert e.proc.wait(timeout=3) == -signal.SIGKILL


def test_fault_health_lies(sim_env: dict[str, str]) -> None:
    with engine(sim_env, fault="health-lies") as e:
        assert e.read_until(READY)
        assert httpx.get(f"{e.url}/health").status_code == 200
        r = httpx.post(f"{e.url}/v1/completions", json={"model": "Qwen/Qwen3-8B", "prompt": "hi", "max_tokens": 2})
        assert r.status_code == 500


def test_fault_orphan_workers(sim_env: dict[str, str]) -> None:
    with engine(sim_env, fault="orphan-workers", tp=2, workers=2) as e:
        assert e.read_until(READY, timeout=30)
        workers = workers_of(e, 2)
        os.kill(e.proc.pid, signal.SIGTERM)
        assert e.finish(timeout=10) == 0
        gone, alive = psutil.wait_procs(workers, timeout=0.5)  # they must not go
        assert not gone and len(alive) == 2
        assert used_mib(e.env, 0) > 60000 and used_mib(e.env, 1) > 60000


def test_unknown_fault_is_an_error(sim_env: dict[str, str]) -> None:
    with engine(sim_env, fault="explode") as e:
        assert e.finish() == 2
        assert any("unknown PERFLAB_SIM_FAULT fault 'explode'" in line for line in e.err)


def test_visible_devices_data_parallel_and_stats_lines(sim_env: dict[str, str]) -> None:
    stats = "INFO [loggers.py] Avg prompt throughput: {prompt_tps:.1f} tokens/s, Running: {running} reqs"
    with engine(sim_env, devices=[4, 5], dp=2, behaviour={"stats_line": stats, "stats_interval_s": 0.2}) as e:
        assert e.read_until(READY)
        assert [used_mib(e.env, d) > 60000 for d in (0, 4, 5)] == [False, True, True]
        stream_chat(e.url, words=50, max_tokens=40, ignore_eos=True)
        assert e.read_until("Avg prompt throughput:")
        line = next(line for line in e.out if "Avg prompt throughput:" in line)
        assert float(line.split("throughput: ")[1].split(" ")[0]) > 0
