"""A simulated engine keeps serving after its clients go away, as a real engine does: a stream
reset mid-answer (perflab bench's cancel aborts its connections, an RST when data is unread),
a non-streamed request reset while it runs, and a benchmark cut short on the model clock are
all followed by requests that are answered. Every wait here is bounded: a frozen engine fails
the test, it never hangs the suite."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from contextlib import suppress

import httpx
import pytest
from test_runtime import READY, engine, free_port, sim_env  # noqa: F401 - the fixture and the engine process helper

MODEL = "Qwen/Qwen3-8B"
ANSWER_S = 10.0  # a serving engine answers a 4-token request in far less


def _raw_request(port: int, body: str) -> bytes:
    data = body.encode()
    return (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n").encode() + data


def _resetting_socket(port: int) -> socket.socket:
    """A connection whose close is a reset (linger 0), as a client aborting with data unread."""
    s = socket.create_connection(("127.0.0.1", port), timeout=ANSWER_S)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    return s


def _gauge(url: str, name: str, label: str = "") -> float:
    """The sum of the engine's ``name`` series (those whose labels hold ``label``)."""
    text = httpx.get(f"{url}/metrics", timeout=ANSWER_S).text
    return sum(float(m.group(2)) for m in re.finditer(rf"^{re.escape(name)}{{([^}}]*)}} (\S+)$", text, re.M)
               if label in m.group(1))


def _answers(url: str) -> None:
    """One ordinary request, answered within ANSWER_S (else the engine froze)."""
    r = httpx.post(f"{url}/v1/completions", json={"model": MODEL, "prompt": "one more", "max_tokens": 4},
                   timeout=ANSWER_S)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4


def test_a_stream_reset_before_its_last_step_leaves_the_engine_serving(sim_env: dict[str, str]) -> None:  # noqa: F811
    """Each stream is reset after 5 of its 6 tokens: its next step ends it, for a client that
    is gone. The engine finishes it and goes on stepping (it froze there: the request ended
    twice and the scheduler's driver died with it)."""
    with engine({**sim_env, "PERFLAB_SIM_TIME_SCALE": "0.5"}) as e:  # steps far apart: the reset lands between two
        assert e.read_until("Application startup complete")
        body = '{"model": "%s", "prompt": "%s", "max_tokens": 6, "ignore_eos": true, "stream": true}'
        for i in range(3):
            s = _resetting_socket(e.port)
            s.sendall(_raw_request(e.port, body % (MODEL, f"reset me {i} " * 10)))
            got = b""
            while got.count(b"data: ") < 5:
                chunk = s.recv(65536)
                assert chunk, "the stream ended before its fifth token"
                got += chunk
            s.close()
        _answers(e.url)
        assert _gauge(e.url, "vllm:num_requests_running") == 0
        assert "internal error" not in "\n".join(e.err)


def test_a_request_reset_while_it_runs_leaves_the_batch_at_once(sim_env: dict[str, str]) -> None:  # noqa: F811
    """A non-streamed request whose client resets its connection is aborted then, as on a real
    engine (it ran to its last token, 2000 of them, for nobody)."""
    with engine({**sim_env, "PERFLAB_SIM_TIME_SCALE": "1"}) as e:  # its 2000 tokens: many seconds
        assert e.read_until("Application startup complete")
        body = '{"model": "%s", "prompt": "a long answer", "max_tokens": 2000, "ignore_eos": true}' % MODEL
        s = _resetting_socket(e.port)
        s.sendall(_raw_request(e.port, body))
        deadline = time.monotonic() + ANSWER_S
        while _gauge(e.url, "vllm:num_requests_running") < 1:
            assert time.monotonic() < deadline, "the request never ran"
            time.sleep(0.02)
        s.close()
        deadline = time.monotonic() + 2.0
        while _gauge(e.url, "vllm:num_requests_running") > 0:
            assert time.monotonic() < deadline, "the reset request still runs"
            time.sleep(0.02)
        assert _gauge(e.url, "vllm:request_success_total", 'finished_reason="abort"') == 1
        assert _gauge(e.url, "vllm:generation_tokens_total") < 2000
        _answers(e.url)


@pytest.mark.slow
def test_after_a_benchmark_cut_short_the_engine_answers_on_the_model_clock(sim_env: dict[str, str]) -> None:  # noqa: F811
    """The lab's sequence: a model-clock benchmark stopped early (its cancel event, as
    perflab.lab.run.earlystop sets it) — a closed loop, then an all-at-once burst — and then the
    accuracy measurement's requests: agreement answers one at a time and all at once
    (perflab.accuracy.agreement.collect with server_clock) and the task through lm-eval."""
    from perflab.accuracy.agreement import PROMPTS, collect
    from perflab.accuracy.harness import evaluate
    from perflab.bench import BenchCancelled, BenchRequest, run_benchmark_sync

    # short answers, steps far apart: at the cut, many streams are one step from their end
    with engine({**sim_env, "PERFLAB_SIM_TIME_SCALE": "2"}) as e:
        assert e.read_until("Application startup complete")
        base = BenchRequest(base_urls=(e.url,), model=MODEL, dataset="random", random_input_len=64,
                            random_output_len=4, num_prompts=2000, warmup=0, server_clock=True)
        for req in (base.replace(max_concurrency=32), base):
            cancel = threading.Event()
            timer = threading.Timer(1.5, cancel.set)
            timer.start()
            try:
                with pytest.raises(BenchCancelled):
                    run_benchmark_sync(req, None, cancel)
            finally:
                timer.cancel()

        async def accuracy() -> None:
            with_limit = 60.0
            one = await asyncio.wait_for(collect(e.url, MODEL, concurrency=1, server_clock=True, timeout_s=ANSWER_S), with_limit)
            burst = await asyncio.wait_for(collect(e.url, MODEL, concurrency=len(PROMPTS), server_clock=True,
                                                   timeout_s=ANSWER_S), with_limit)
            assert all(a.error is None for a in (*one.answers, *burst.answers))
            scored = await asyncio.wait_for(evaluate(e.url, MODEL, limit=20, concurrency=8, timeout_s=ANSWER_S), with_limit)
            assert scored.samples == 20

        asyncio.run(accuracy())
        assert _gauge(e.url, "vllm:num_requests_running") == 0


# an engine whose scheduler driver fails at its first delivery (a bug planted in the simulator)
BROKEN_DRIVER = """
import sys
from perflab_sim import wire
from perflab_sim.runtime import config_from_json, serve

def sink(self, n, finished):
    raise RuntimeError("a planted bug")

wire.Generation.sink = sink
sys.exit(serve(config_from_json(sys.argv[1])))
"""


def test_an_error_in_the_scheduler_driver_takes_the_engine_down_with_its_traceback(
        sim_env: dict[str, str]) -> None:  # noqa: F811
    """Never an engine that accepts requests and never steps again: it exits 1 and says why."""
    port = free_port()
    config = {"engine": "vllm", "engine_version": "0.11.0", "model": MODEL, "served_model_names": [MODEL],
              "host": "127.0.0.1", "port": port, "ready_lines": [READY], "load_time_s": 0.05}
    proc = subprocess.Popen([sys.executable, "-c", BROKEN_DRIVER, json.dumps(config)], env=sim_env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + ANSWER_S
        while True:
            with suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            assert proc.poll() is None and time.monotonic() < deadline, "the engine did not start"
            time.sleep(0.05)
        with suppress(httpx.HTTPError):  # the connection ends with the process
            httpx.post(f"http://127.0.0.1:{port}/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 2},
                       timeout=ANSWER_S)
        assert proc.wait(timeout=ANSWER_S) == 1
        err = proc.stderr.read().decode() if proc.stderr else ""
        assert "perflab-sim: internal error: the scheduler driver failed:" in err
        assert "RuntimeError: a planted bug" in err
    finally:
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=5)
        for pipe in (proc.stdout, proc.stderr):
            if pipe:
                pipe.close()
