"""``perflab bench`` and ``run_benchmark`` against the in-test streaming server (conftest.py)."""

from __future__ import annotations

import json
import math
import sys
import textwrap
from pathlib import Path

import anyio
import pytest

from perflab import hookimpl
from perflab.bench import (
    BenchRequest,
    BenchResult,
    available_backends,
    run_benchmark,
    run_benchmark_sync,
)
from perflab.bench.backends import run_vllm_bench_serve, vllm_bench_argv
from perflab.cli import main
from perflab.contract.errors import PerflabError, UsageError

from .conftest import FakeOpenAIServer


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = 0
    try:
        main(["bench", *args])
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def test_block_on_simulator_like_server(fake_server: FakeOpenAIServer, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "--base-url", fake_server.base_url, "--model", "sim", "--num-prompts", "40",
                             "--random-input-len", "128", "--random-output-len", "16", "--max-concurrency", "8")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == "============ Serving Benchmark Result ============" and lines[-1] == "=" * 50
    assert "Successful requests:                     40" in lines
    assert "Maximum request concurrency:             8" in lines
    assert "Total input tokens:                      5120" in lines  # whitespace tokens, exact
    assert "Total generated tokens:                  640" in lines
    # what the server received: vLLM's payload, exact prompt lengths
    body = fake_server.requests[-1]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["max_completion_tokens"] == 16
    # vLLM 0.33's defaults: no forced temperature, ignore_eos on for the random dataset
    assert "temperature" not in body and body["ignore_eos"] is True
    assert len(body["messages"][0]["content"].split()) == 128
    assert fake_server.headers[-1]["x-request-id"].startswith("perflab-")


def test_json_goodput_percentiles(fake_server: FakeOpenAIServer, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "--base-url", fake_server.base_url, "--model", "sim", "--num-prompts", "10",
                             "--random-input-len", "8", "--random-output-len", "4", "--goodput", "ttft:60000", "e2el:60000",
                             "--percentiles", "50,90,95,99", "--backend", "openai", "--json")
    assert code == 0, err
    j = json.loads(out)
    assert j["completed"] == 10 and j["failed"] == 0 and j["total_input_tokens"] == 80 and j["total_output_tokens"] == 40
    assert j["request_goodput"] == pytest.approx(j["request_throughput"])  # every request meets a 60 s SLO
    assert {"p50_ttft_ms", "p90_tpot_ms", "p95_itl_ms", "p99_e2el_ms", "max_output_tokens_per_s", "max_concurrent_requests"} <= set(j)
    assert j["backend"] == "openai" and j["perflab"]["tokenizer"] == "whitespace" and j["perflab"]["simulated"] is True
    assert "prompt" in fake_server.requests[-1] and fake_server.requests[-1]["max_tokens"] == 4


def test_save_result_and_profile(fake_server: FakeOpenAIServer, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, err = run_cli(capsys, "--base-url", fake_server.base_url, "--model", "sim", "--profile", "throughput",
                             "--num-prompts", "6", "--random-input-len", "16", "--random-output-len", "2",
                             "--save-result", "--result-dir", str(tmp_path), "--label", "t")
    assert code == 0, err
    assert "Maximum request concurrency:             512" in out  # from the profile
    assert "Request rate configured (RPS):           1000.00" in out
    assert "Total input tokens:                      96" in out  # explicit options beat the profile
    (saved,) = tmp_path.glob("t-1000.0qps-concurrency512-sim-*.json")
    j = json.loads(saved.read_text())
    assert j["completed"] == 6 and j["max_concurrency"] == 512 and j["request_rate"] == 1000.0
    assert f"saved to {saved}" in err


def test_failures_are_counted_and_reported(fake_server: FakeOpenAIServer, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "--base-url", fake_server.base_url, "--model", "error-after-2", "--num-prompts", "3",
                             "--random-input-len", "8", "--random-output-len", "4")
    assert code == 1
    assert "Failed requests:                         3" in out
    assert "error in stream: CUDA out of memory" in err
    assert err.strip().splitlines()[-1] == "perflab: error: all 3 requests failed: request 0: error in stream: CUDA out of memory (InternalServerError)"


def test_some_failed_requests_exit_non_zero(fake_server: FakeOpenAIServer, capsys: pytest.CaptureFixture[str]) -> None:
    # outputs of 2..6 tokens; the server fails every stream longer than 3 tokens
    code, out, err = run_cli(capsys, "--base-url", fake_server.base_url, "--model", "error-after-3", "--num-prompts", "20",
                             "--random-input-len", "8", "--random-output-len", "4", "--random-range-ratio", "0.5")
    lens = [b["max_completion_tokens"] for b in fake_server.requests[1:]]
    failed = sum(n > 3 for n in lens)
    assert 0 < failed < 20
    assert code == 3, err
    assert f"Failed requests:                         {failed}" in out
    assert f"perflab: {failed} of 20 requests failed" in err


def test_stall_watchdog_cli(fake_server: FakeOpenAIServer, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    import time

    t0 = time.monotonic()
    code, out, err = run_cli(capsys, "--base-url", fake_server.base_url, "--model", "hang-after-2", "--num-prompts", "4",
                             "--random-input-len", "8", "--random-output-len", "5", "--stall-s", "0.5", "--json")
    assert time.monotonic() - t0 < 10
    assert code == 4, err
    j = json.loads(out)
    assert j["perflab"]["stalled"]["in_flight"] == 4 and j["perflab"]["stalled"]["stall_s"] == 0.5
    assert j["completed"] == 0 and j["failed"] == 4
    assert "the benchmark stalled: no token on any of 4 open stream(s)" in err


def test_stall_watchdog_result_is_typed(fake_server: FakeOpenAIServer) -> None:
    import time

    from perflab.bench.result import Stall

    req = BenchRequest(base_urls=(fake_server.base_url,), model="hang-after-2", num_prompts=6, max_concurrency=2,
                       random_input_len=4, random_output_len=5, stall_s=0.4)
    t0 = time.monotonic()
    result = run_benchmark_sync(req)
    assert time.monotonic() - t0 < 5
    assert isinstance(result.stall, Stall) and result.stalled
    assert (result.stall.in_flight, result.stall.completed, result.stall.stage) == (2, 0, "run")
    assert result.stall.idle_s >= 0.4
    assert result.info["requests_not_recorded"] == 4  # never sent: the limit of 2 was full
    assert [t.error for t in result.requests] == ["stalled", "stalled"]


def test_an_engine_that_queues_and_answers_in_bursts_is_not_stalled(fake_server: FakeOpenAIServer) -> None:
    """Requests that wait in the engine's queue without a byte while others are answered in
    one burst each: no open request has a byte for longer than ``stall_s``, yet answers keep
    coming — progress, not a stall (the real vLLM CPU build with ``--max-num-seqs 4`` and 3000
    requests at once was called stalled after 60 s while it answered 7 requests a second)."""
    req = BenchRequest(base_urls=(fake_server.base_url,), model="queued-80", num_prompts=12, random_input_len=4,
                       random_output_len=5, stall_s=0.4)
    result = run_benchmark_sync(req)  # 12 x 80 ms, one at a time: about 1 s, over twice stall_s
    assert result.stall is None and result.metrics["completed"] == 12
    # still a stall when nothing comes at all: every request waits behind a hung one
    hung = run_benchmark_sync(req.replace(model="hang-after-2", max_concurrency=1, num_prompts=3))
    assert hung.stall is not None


def test_stall_watchdog_off(fake_server: FakeOpenAIServer) -> None:
    slow = FakeOpenAIServer(gap_s=0.3).start()
    try:
        req = BenchRequest(base_urls=(slow.base_url,), model="ok", num_prompts=2, random_input_len=4,
                           random_output_len=3, stall_s=0.25)
        stalled = run_benchmark_sync(req)
        assert stalled.stall is not None  # 0.3 s between tokens > 0.25 s
        assert [t.error for t in stalled.requests] == ["stalled", "stalled"]
        calm = run_benchmark_sync(req.replace(stall_s=0))
        assert calm.stall is None and calm.metrics["completed"] == 2
        patient = run_benchmark_sync(req.replace(stall_s=2.0))
        assert patient.stall is None and patient.metrics["completed"] == 2
    finally:
        slow.stop()


def test_unreachable_and_http_error_fail_fast(fake_server: FakeOpenAIServer, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(capsys, "--base-url", fake_server.base_url, "--model", "http-500", "--num-prompts", "3")
    assert code == 1 and err.strip() == (
        f"perflab: error: the test request to {fake_server.base_url}/v1/chat/completions failed: "
        "HTTP 500 Internal Server Error: engine is dead (InternalServerError)"
    )
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code, _, err = run_cli(capsys, "--base-url", f"http://127.0.0.1:{port}", "--model", "m")
    assert code == 1 and len(err.strip().splitlines()) == 1
    assert f"the test request to http://127.0.0.1:{port}/v1/chat/completions failed: cannot connect" in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--request-rate", "abc"], "--request-rate 'abc'"),
        (["--goodput", "ttft=5"], "--goodput 'ttft=5'"),
        (["--goodput", "itl:5"], "must be one of ttft, tpot, e2el"),
        (["--dataset", "sharegpt"], "needs --dataset-path"),
        (["--percentiles", "0,120"], "is not in (0, 100)"),
        (["--random-range-ratio", "1.5"], "[0, 1)"),
        (["--workers", "4", "--max-concurrency", "2"], "exceeds --max-concurrency"),
        (["--profile", "nope"], "expected one of"),
        (["--header", "novalue"], "KEY=VALUE"),
        (["--extra-body", "[1]"], "expected a JSON object"),
        (["--tokenizer", "/no/such/dir"], "tokenizer.json"),
    ],
)
def test_usage_errors_are_one_line(capsys: pytest.CaptureFixture[str], args: list[str], message: str) -> None:
    code, out, err = run_cli(capsys, "--base-url", "http://127.0.0.1:9", "--model", "m", *args)
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and message in err and out == ""


def test_goodput_values_follow_the_flag_like_vllm() -> None:
    from perflab.cli.bench_cmd import bench

    ctx = bench.make_context("bench", ["--base-url", "http://x:1", "--goodput", "ttft:5", "tpot:6", "--model", "m"])
    assert ctx.params["goodput"] == "ttft:5 tpot:6" and ctx.params["model"] == "m"


def test_replicas_workers_and_time_scale(capsys: pytest.CaptureFixture[str]) -> None:
    a = FakeOpenAIServer(gap_s=0.01, time_scale=10.0).start()
    b = FakeOpenAIServer(gap_s=0.01, time_scale=10.0).start()
    try:
        req = BenchRequest(base_urls=(a.base_url, b.base_url + "/v1"), model="sim", num_prompts=20, random_input_len=8,
                           random_output_len=3, request_rate=10.0, workers=2, max_concurrency=8)
        r = run_benchmark_sync(req)
    finally:
        a.stop()
        b.stop()
    assert r.metrics["completed"] == 20 and r.metrics["total_input_tokens"] == 160
    assert len(a.requests) == len(b.requests) == 1 + 10  # the test request + round-robin half
    assert r.info["time_scale"] == 10.0 and r.info["workers"] == 2 and r.info["replicas"] == 2
    # 10 req/s of simulated time: the last request leaves 20 / 10 = 2 simulated seconds in
    assert r.metrics["duration"] >= 2.0
    # 10 ms real between tokens is 100 ms simulated
    assert r.metrics["mean_itl_ms"] >= 95.0
    assert r.metrics["request_rate"] == 10.0


def test_run_benchmark_async_api(fake_server: FakeOpenAIServer) -> None:
    seen: list[tuple[int, int]] = []
    req = BenchRequest(base_urls=(fake_server.base_url,), model="sim", num_prompts=12, random_input_len=4, random_output_len=2,
                       warmup=3, http_stack="aiohttp")

    async def go() -> BenchResult:
        return await run_benchmark(req, progress=lambda done, total: seen.append((done, total)))

    r = anyio.run(go)
    assert r.metrics["completed"] == 12 and seen[-1] == (12, 12)
    assert len(fake_server.requests) == 1 + 3 + 12  # test request, warm-up, run
    assert r.requests[0].index == 0 and len(r.requests) == 12
    assert "Successful requests:                     12" in r.format_block()


# --------------------------------------------------------------------------- backends


class _Plugin:
    def __init__(self) -> None:
        self.calls: list[BenchRequest] = []

    @hookimpl
    def perflab_register_bench_backends(self, register):  # type: ignore[no-untyped-def]
        def drive(req: BenchRequest) -> BenchResult:
            self.calls.append(req)
            return BenchResult(metrics={"completed": req.num_prompts, "failed": 0}, info={"client": "mine"})

        register("mine", drive)
        register("perflab", drive)  # taken: ignored, noted


def test_plugin_backend_through_the_hook() -> None:
    from perflab.plugins import PluginManager

    pm = PluginManager(entrypoints=False, builtins=False)
    plugin = _Plugin()
    pm.pm.register(plugin)
    backends = available_backends(pm)
    assert {"perflab", "vllm-bench", "mine"} <= set(backends)
    assert any("registered twice" in e for e in pm.errors)
    req = BenchRequest(base_urls=("http://127.0.0.1:9",), model="m", num_prompts=7)
    r = anyio.run(lambda: run_benchmark(req, backend="mine", pm=pm))
    assert r.metrics["completed"] == 7 and plugin.calls == [req]
    with pytest.raises(UsageError, match="unknown"):
        anyio.run(lambda: run_benchmark(req, backend="nope", pm=pm))


def test_vllm_bench_argv() -> None:
    req = BenchRequest(base_urls=("http://127.0.0.1:8000/v1",), model="Qwen/Qwen3-8B", random_input_len=128, random_output_len=4,
                       num_prompts=1000, seed=42, max_concurrency=4, goodput=(("ttft", 500.0),), percentiles=(95, 99))
    argv = vllm_bench_argv(req, "/tmp/out", ["vllm"])
    joined = " ".join(argv)
    assert argv[:3] == ["vllm", "bench", "serve"]
    for part in ("--backend openai-chat", "--base-url http://127.0.0.1:8000", "--endpoint /v1/chat/completions",
                 "--dataset-name random", "--random-input-len 128", "--random-output-len 4", "--num-prompts 1000",
                 "--request-rate inf", "--seed 42", "--max-concurrency 4", "--goodput ttft:500", "--metric-percentiles 95,99",
                 "--save-result", "--result-dir /tmp/out"):
        assert part in joined, part
    with pytest.raises(UsageError, match="one endpoint"):
        vllm_bench_argv(req.replace(base_urls=("http://a:1", "http://b:1")), "/tmp", None)
    with pytest.raises(UsageError, match="no dataset"):
        vllm_bench_argv(req.replace(dataset="synthetic-sharegpt"), "/tmp", None)


def test_vllm_bench_driver_reads_its_json(tmp_path: Path) -> None:
    # A stand-in `vllm` that checks its argv like vllm bench serve's parser and writes a result.
    fake = tmp_path / "vllm"
    fake.write_text(textwrap.dedent(f"""\
        #!{sys.executable}
        import json, sys, os
        a = sys.argv[1:]
        assert a[:2] == ["bench", "serve"], a
        opt = lambda k: a[a.index(k) + 1]
        out = os.path.join(opt("--result-dir"), opt("--result-filename"))
        json.dump({{"date": "x", "backend": opt("--backend"), "completed": int(opt("--num-prompts")), "failed": 0,
                   "total_input_tokens": 10, "total_output_tokens": 20, "duration": 2.0, "request_throughput": 5.0,
                   "output_throughput": 10.0, "total_token_throughput": 15.0, "mean_ttft_ms": 12.0, "p99_ttft_ms": 30.0,
                   "max_output_tokens_per_s": 11.0, "max_concurrent_requests": 3, "errors": ["", ""],
                   "ttfts": [0.01, 0.02]}}, open(out, "w"))
        print("============ Serving Benchmark Result ============")
    """))
    fake.chmod(0o755)
    req = BenchRequest(base_urls=("http://127.0.0.1:8000",), model="m", num_prompts=2, time_scale=2.0)
    r = run_vllm_bench_serve(req, env={"PATH": str(tmp_path)})
    assert r.metrics["completed"] == 2 and "ttfts" not in r.metrics
    assert r.metrics["mean_ttft_ms"] == 24.0 and r.metrics["duration"] == 4.0 and r.metrics["request_throughput"] == 2.5
    assert r.info["client"] == "vllm-bench" and r.info["argv"][0] == "vllm" and r.errors == []
    with pytest.raises(PerflabError, match="not found on PATH"):
        run_vllm_bench_serve(req, env={"PATH": str(tmp_path / "none")})
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "vllm").write_text(f"#!{sys.executable}\nimport sys\nprint('ValueError: Unknown backend', file=sys.stderr)\nsys.exit(3)\n")
    (broken / "vllm").chmod(0o755)
    with pytest.raises(PerflabError, match="exited with code 3: ValueError: Unknown backend"):
        run_vllm_bench_serve(req, env={"PATH": str(broken)})


def test_request_validation_defaults() -> None:
    req = BenchRequest(base_urls=("http://h:1",), model="m")
    assert req.validate() is req and math.isinf(req.request_rate) and req.api_endpoint == "/v1/chat/completions"
    assert req.replace(backend="openai").api_endpoint == "/v1/completions"
    with pytest.raises(UsageError, match="base-url"):
        BenchRequest(base_urls=("h:1",), model="m").validate()


def test_captures_outgrowing_their_budget_are_parsed_early(fake_server: FakeOpenAIServer) -> None:
    from perflab.bench.client import make_target, prepare
    from perflab.bench.drive import LoadPlan, compact_with, drive, run_in_new_loop
    from perflab.bench.tokenizer import WhitespaceTokenizer
    from perflab.bench.trace import parse_capture

    target = make_target(fake_server.base_url, "/v1/completions")
    prepared = [prepare(i, target, {"model": "sim", "prompt": "a b c", "max_tokens": 5, "stream": True,
                                    "stream_options": {"include_usage": True}}, [], None) for i in range(6)]

    def parse(cap):  # type: ignore[no-untyped-def]
        return parse_capture(cap, prompt_len=3, tokenizer=WhitespaceTokenizer())

    plan = LoadPlan(prepared, [0.0] * 6, 2, "raw", 10.0, capture_budget=0)
    outcome = run_in_new_loop(drive(plan, compact=compact_with(parse)))
    early = [c for c in outcome.captures if c.trace is not None]
    assert len(early) == 5 and all(c.reads == [] for c in early)  # the first fills the budget
    traces = [c.trace or parse(c) for c in outcome.captures]
    assert all(t.success and t.output_tokens == 5 and len(t.chunk_times) == 5 for t in traces)


def test_stall_in_warm_up_and_with_workers(fake_server: FakeOpenAIServer) -> None:
    import time

    base = BenchRequest(base_urls=(fake_server.base_url,), model="hang-after-1", num_prompts=4, random_input_len=4,
                        random_output_len=5, stall_s=0.4)
    warm = run_benchmark_sync(base.replace(warmup=2))
    assert warm.stall is not None and warm.stall.stage == "warm-up" and warm.stall.in_flight == 2
    assert warm.metrics["completed"] == 0 and warm.info["requests_not_recorded"] == 4

    t0 = time.monotonic()
    spread = run_benchmark_sync(base.replace(workers=2, max_concurrency=2))
    assert time.monotonic() - t0 < 15
    assert spread.stall is not None and spread.stall.stage == "run"
    assert spread.metrics["completed"] == 0
    # the worker that saw the stall names it; the other one is stopped by it (cancelled)
    errors = {t.error for t in spread.requests}
    assert spread.requests and "stalled" in errors and errors <= {"stalled", "cancelled"}


def test_clock_auto_never_asks_a_real_engine_for_model_clock_stamps(
        fake_server: FakeOpenAIServer, capsys: pytest.CaptureFixture[str]) -> None:
    """``--clock auto`` (the default) asks for the simulator's model-clock stamps only once the
    test request proved the server is perflab's simulator: a server that is not (model "ok":
    no ``x-perflab-time-scale``) never sees the header, and is timed by the host clock."""
    code, out, err = run_cli(capsys, "--base-url", fake_server.base_url, "--model", "ok", "--num-prompts", "6",
                             "--random-input-len", "8", "--random-output-len", "4", "--json")
    assert code == 0, err
    assert json.loads(out)["perflab"]["clock"] == "host"
    assert fake_server.headers and all("x-perflab-server-clock" not in h for h in fake_server.headers)


def test_clock_option_against_the_simulator(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Against a real simulated engine, ``perflab bench`` times by its model clock unless told
    ``--clock host``."""
    import os
    import threading

    from perflab.contract.types import ServeConfig
    from perflab.hardware import resolve
    from perflab.plugins import load
    from perflab.supervisor import EngineInstance

    state = tmp_path / "sim-state"
    state.mkdir()
    pm = load()
    hw, env = resolve(pm, "sim:h100-80g-x1", {**os.environ, "PERFLAB_SIM_TIME_SCALE": "20",
                                               "PERFLAB_SIM_STATE_DIR": str(state)})
    urls: list[str] = []
    started, stop = threading.Event(), threading.Event()

    async def serve() -> None:
        async with EngineInstance(pm, "vllm", ServeConfig(model="Qwen/Qwen3-8B"), hardware=hw, env=env,
                                  workdir=tmp_path / "run", grace=2.0, startup_timeout=60) as inst:
            urls.append(inst.base_url)
            started.set()
            await anyio.to_thread.run_sync(stop.wait)

    th = threading.Thread(target=lambda: anyio.run(serve), daemon=True)
    th.start()
    try:
        assert started.wait(90), "the simulated engine did not start"
        args = ("--base-url", urls[0], "--model", "Qwen/Qwen3-8B", "--num-prompts", "8", "--random-input-len", "16",
                "--random-output-len", "4", "--json")
        clocks = []
        for extra in ((), ("--clock", "host")):
            code, out, err = run_cli(capsys, *args, *extra)
            assert code == 0, err
            lines = out.splitlines()  # the engine's log lines share stdout in this test
            doc = "\n".join(lines[lines.index("{"):lines.index("}") + 1])
            clocks.append(json.loads(doc)["perflab"]["clock"])
        assert clocks == ["model", "host"]
    finally:
        stop.set()
        th.join(30)
