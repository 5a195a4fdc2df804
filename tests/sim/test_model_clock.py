"""The simulated engine's model clock (perflab_sim.clock) and the bench client's use of it:
stamps only when asked, trusted only from perflab's simulator, and — timed by them — a live
benchmark gives the offline simulation's numbers."""

from __future__ import annotations

import asyncio
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pytest

from perflab.bench import BenchRequest, run_benchmark_sync
from perflab.bench.serverclock import SERVER_CLOCK_COMMENT, format_clock, parse_clock
from perflab.bench.sse import SSEParser
from perflab_sim.clock import ModelClock
from perflab_sim.faults import MAX_LAG_S

SCALE = 20.0


class FakeWall:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_model_clock_runs_with_wall_time_and_forgives_a_late_host() -> None:
    wall = FakeWall()
    clock = ModelClock(10.0, wall)
    origin = clock.last
    assert origin == 1000.0 * 10  # CLOCK_MONOTONIC x scale: engines on one host share it
    wall.t += 0.5
    assert clock.now() == pytest.approx(origin + 5.0)
    assert clock.now(horizon=origin + 2.0) == origin + 2.0  # never past the next step due
    # a step due at +6 s model (0.6 s wall) delivered 2 s late: the anchor moves, model time does not jump
    wall.t = 1000.0 + 0.6 + 2.0
    clock.delivered(origin + 6.0)
    assert clock.last == origin + 6.0
    assert clock.lost_s == pytest.approx(2.0 - MAX_LAG_S)
    assert clock.now() == pytest.approx(origin + 6.0 + MAX_LAG_S * 10.0)
    # idle: model time runs on from the last step, not from where a late host left it
    clock.idle()
    assert clock.now() == origin + 6.0
    wall.t += 0.1
    assert clock.now() == pytest.approx(origin + 7.0)
    # a burst held the clock at +6.5 s while the host took its time: model time runs on from there
    wall.t += 3.0
    clock.resume(origin + 6.5)
    assert clock.last == origin + 6.5 and clock.now() == origin + 6.5
    wall.t += 0.1
    assert clock.now() == pytest.approx(origin + 7.5)


def test_clock_comment_round_trip_and_the_sse_parser_keeps_only_it() -> None:
    line = format_clock(123.4567891, 100.0)
    assert line == b": perflab-server-clock 123.456789 100.000000\n"
    body = line + b'data: {"a":1}\n\n: ping\ndata: {"b":2}\n\n'
    ev = SSEParser(clock_prefix=SERVER_CLOCK_COMMENT).feed(body)
    assert [e.data for e in ev] == [b'{"a":1}', b'{"b":2}']
    assert [parse_clock(e.clock) for e in ev if e.clock is not None] == [(123.456789, 100.0)] * 2
    assert all(e.clock is None for e in SSEParser().feed(body))  # not asked: comments stay ignored
    assert parse_clock(b"1.0") is None and parse_clock(b"x y") is None and parse_clock(b"nan 1") is None


@pytest.fixture
def sim_vllm(tmp_path: Path) -> Iterator[str]:
    """A simulated vLLM (Qwen3-8B on one H100) at time scale 20, launched by the supervisor."""
    from perflab.contract.types import ServeConfig
    from perflab.hardware import resolve
    from perflab.plugins import load
    from perflab.supervisor import EngineInstance

    state = tmp_path / "sim-state"
    state.mkdir()
    pm = load()
    env = {**os.environ, "PERFLAB_SIM_TIME_SCALE": f"{SCALE:g}", "PERFLAB_SIM_STATE_DIR": str(state)}
    hw, env = resolve(pm, "sim:h100-80g-x1", env)
    urls: list[str] = []
    started = threading.Event()
    stop = threading.Event()

    async def serve() -> None:
        async with EngineInstance(pm, "vllm", ServeConfig(model="Qwen/Qwen3-8B"), hardware=hw, env=env,
                             workdir=tmp_path / "run", grace=2.0, startup_timeout=60) as inst:
            assert inst.outcome.state == "ready", inst.outcome.to_json()
            urls.append(inst.base_url)
            started.set()
            await anyio.to_thread.run_sync(stop.wait)
        assert inst.outcome.state == "done" and inst.outcome.leftovers == []

    th = threading.Thread(target=lambda: anyio.run(serve), daemon=True)
    th.start()
    try:
        assert started.wait(90), "the simulated engine did not start"
        yield urls[0]
    finally:
        stop.set()
        th.join(30)
        assert not th.is_alive()


def test_a_live_benchmark_timed_by_the_model_clock_is_the_offline_simulation(sim_vllm: str) -> None:
    from perflab_sim import calibrate
    from perflab_sim.frontends import vllm

    n, isl, osl = 200, 128, 16
    req = BenchRequest(base_urls=(sim_vllm,), model="Qwen/Qwen3-8B", dataset="random", random_input_len=isl,
                       random_output_len=osl, num_prompts=n, server_clock=True)
    model = run_benchmark_sync(req)
    assert model.info["clock"] == "model" and model.metrics["completed"] == n
    host = run_benchmark_sync(req.replace(server_clock=False))
    assert host.info["clock"] == "host" and host.metrics["completed"] == n

    cfg = vllm.parse(["serve", "Qwen/Qwen3-8B", "--port", "0"], {"PERFLAB_SIM_HARDWARE": "h100-80g-x1"})
    offline = calibrate.run_engine(cfg, "h100-80g-x1", [(0.0, isl, osl)] * n)
    m = model.metrics
    assert m["total_input_tokens"] == offline.input_tokens and m["total_output_tokens"] == offline.output_tokens
    # one burst, one arrival time: the live engine steps exactly as the offline scheduler
    assert m["duration"] == pytest.approx(offline.duration, rel=1e-3)
    assert m["mean_ttft_ms"] == pytest.approx(offline.mean_ttft * 1000, rel=1e-3)
    assert m["mean_tpot_ms"] == pytest.approx(offline.mean_tpot * 1000, rel=1e-3)


def test_a_server_that_is_not_the_simulator_is_never_timed_by_stamps() -> None:
    """A server streaming perflab-server-clock comments without being perflab's simulator (no
    x-perflab-time-scale header): the client times it by its own clock even with server_clock
    set, and ignores the stamps (here: 1000 s of TTFT)."""
    from aiohttp import web

    seen_headers: list[str | None] = []

    async def stream(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        seen_headers.append(request.headers.get("x-perflab-server-clock"))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        n = int(body.get("max_tokens") or 1)
        for i in range(n):
            chunk = {"id": "x", "object": "text_completion", "choices": [{"index": 0, "text": " tok", "finish_reason": None}]}
            await resp.write(format_clock(5000.0 + i, 4000.0) + b"data: " + json.dumps(chunk).encode() + b"\n\n")
        usage = {"id": "x", "choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": n, "total_tokens": 4 + n}}
        await resp.write(b"data: " + json.dumps(usage).encode() + b"\n\ndata: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def main() -> dict[str, Any]:
        app = web.Application()
        app.router.add_post("/v1/completions", stream)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        try:
            req = BenchRequest(base_urls=(f"http://127.0.0.1:{port}",), model="m", backend="openai", dataset="random",
                               random_input_len=4, random_output_len=4, num_prompts=4, tokenizer="whitespace",
                               server_clock=True)
            r = await asyncio.to_thread(run_benchmark_sync, req)
            return {"info": r.info, "metrics": r.metrics}
        finally:
            await runner.cleanup()

    out = asyncio.run(main())
    assert out["info"]["simulated"] is False and out["info"]["clock"] == "host"
    assert out["metrics"]["completed"] == 4 and out["metrics"]["mean_ttft_ms"] < 10_000
    # the lab said "simulated", but the test request proved otherwise: never asked for stamps
    assert seen_headers and all(h is None for h in seen_headers)



def test_a_closed_loop_timed_by_the_model_clock_is_the_offline_simulation(
        sim_vllm: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``max_concurrency`` below the number of prompts: the next request goes out when one
    ends. The engine holds its clock for it (perflab.bench.serverclock.SERVER_CLOCK_LOOP), so the client's
    reaction time — host milliseconds, ×20 in model time here — is not the engine's: the live
    run steps exactly as the offline scheduler, whose client reacts in no time; and a client
    slowed down on purpose (20 ms after each response before the next request: 0.4 s of model
    time each) measures the same."""
    from perflab.bench import drive
    from perflab_sim import calibrate
    from perflab_sim.frontends import vllm

    n, c, isl, osl = 48, 6, 96, 24
    req = BenchRequest(base_urls=(sim_vllm,), model="Qwen/Qwen3-8B", dataset="random", random_input_len=isl,
                       random_output_len=osl, num_prompts=n, max_concurrency=c, warmup=0, server_clock=True)
    cfg = vllm.parse(["serve", "Qwen/Qwen3-8B", "--port", "0"], {"PERFLAB_SIM_HARDWARE": "h100-80g-x1"})
    offline = calibrate.run_engine(cfg, "h100-80g-x1", [(0.0, isl, osl)] * n, max_concurrency=c)

    def check(m: dict[str, Any]) -> None:
        assert m["completed"] == n and m["max_concurrent_requests"] <= c
        assert m["duration"] == pytest.approx(offline.duration, rel=1e-3)
        assert m["mean_ttft_ms"] == pytest.approx(offline.mean_ttft * 1000, rel=1e-3)
        assert m["mean_tpot_ms"] == pytest.approx(offline.mean_tpot * 1000, rel=1e-3)

    fast = run_benchmark_sync(req)
    assert fast.info["clock"] == "model"
    check(fast.metrics)

    real_client = drive.make_client

    def slow_client(*args: Any, **kwargs: Any) -> Any:
        client = real_client(*args, **kwargs)
        send = client.send

        async def late(p: Any, cap: Any) -> None:
            await send(p, cap)
            await asyncio.sleep(0.02)  # a slow client: the slot frees 20 ms after the response

        client.send = late
        return client

    monkeypatch.setattr(drive, "make_client", slow_client)
    slow = run_benchmark_sync(req.replace(seed=1))  # other prompts: none in the prefix cache
    assert slow.info["clock"] == "model"
    check(slow.metrics)
