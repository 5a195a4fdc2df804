"""Watching a running benchmark (``observe``) and stopping it from the observer (the lab's
early stop) against the in-test server: the counts grow, the streamed events count the
tokens, and a stop from inside the observer ends the run as a cancellation does — no
connection or thread left behind."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import psutil
import pytest

from perflab.bench import BenchCancelled, BenchRequest, run_benchmark_sync
from perflab.bench.drive import Observation

from .conftest import FakeOpenAIServer

OUTPUT_LEN = 10


@pytest.fixture
def slow_server() -> Iterator[FakeOpenAIServer]:
    server = FakeOpenAIServer(gap_s=0.01).start()
    try:
        yield server
    finally:
        server.stop()


def _request(server: FakeOpenAIServer, prompts: int) -> BenchRequest:
    return BenchRequest(base_urls=(server.base_url,), model="ok", num_prompts=prompts, random_input_len=4,
                        random_output_len=OUTPUT_LEN, max_concurrency=4)


def test_observer_sees_counts_that_grow_and_events_per_token(slow_server: FakeOpenAIServer) -> None:
    seen: list[Observation] = []
    result = run_benchmark_sync(_request(slow_server, 40), observe=seen.append)
    assert result.metrics["completed"] == 40
    assert len(seen) >= 3  # about 1 s of streaming, one observation per 0.1 s
    assert [o.t for o in seen] == sorted(o.t for o in seen)
    assert [o.completed for o in seen] == sorted(o.completed for o in seen)
    assert all(o.in_flight <= 4 for o in seen)  # the concurrency limit
    last = seen[-1]
    assert last.arrived == 40  # request_rate inf: every request arrives at the start
    # every token is one "data:" event, plus the usage chunk and [DONE] of each ended request
    assert OUTPUT_LEN * last.completed <= last.events <= (OUTPUT_LEN + 2) * 40
    assert last.latency_s > 0
    # the max_tokens of the requests not ended, and what they streamed so far
    first = seen[0]
    assert first.output_cap_open == OUTPUT_LEN * (40 - first.completed - first.failed)
    assert 0 <= first.events_open <= first.events
    assert all(o.output_cap_open == OUTPUT_LEN * (40 - o.completed - o.failed) for o in seen)
    assert all(o.events_open <= (OUTPUT_LEN + 2) * o.in_flight for o in seen)


def test_a_requests_output_cap_is_its_max_tokens() -> None:
    from perflab.bench.runner import output_cap

    assert output_cap({"max_tokens": 64}) == 64
    assert output_cap({"max_tokens": 64, "max_completion_tokens": 128}) == 128  # a plan's extra_body set one
    assert output_cap({"prompt": "x"}) is None and output_cap({"max_tokens": None}) is None


def test_a_stop_from_the_observer_ends_the_run_cleanly(slow_server: FakeOpenAIServer) -> None:
    cancel = threading.Event()
    stopped_at: list[float] = []

    def observe(o: Observation) -> None:
        if o.completed >= 8 and not cancel.is_set():
            stopped_at.append(time.perf_counter())
            cancel.set()

    threads = {t.ident for t in threading.enumerate()}
    with pytest.raises(BenchCancelled) as err:
        run_benchmark_sync(_request(slow_server, 400), cancel=cancel, observe=observe)
    assert time.perf_counter() - stopped_at[0] < 1.5  # 400 requests would take ~10 s
    partial = err.value.result
    assert partial is not None and 8 <= partial.metrics["completed"] < 400
    assert {t.ident for t in threading.enumerate()} <= threads  # no thread left behind
    conns = [c for c in psutil.Process().net_connections(kind="tcp")
             if c.raddr and c.raddr.port == slow_server.port and c.status == psutil.CONN_ESTABLISHED]
    assert conns == []


def test_observations_carry_the_time_scale_the_client_measures_with() -> None:
    server = FakeOpenAIServer(gap_s=0.01, time_scale=25.0).start()  # answers as perflab's simulator
    try:
        seen: list[Observation] = []
        req = BenchRequest(base_urls=(server.base_url,), model="sim", num_prompts=20, random_input_len=4,
                           random_output_len=OUTPUT_LEN, max_concurrency=4)
        run_benchmark_sync(req, observe=seen.append)
    finally:
        server.stop()
    assert seen and {o.time_scale for o in seen} == {25.0}  # the server's scale, not the request's (1)


def test_observations_carry_the_engine_clock_when_the_stream_is_stamped(slow_server: FakeOpenAIServer) -> None:
    """``clock`` reads each received piece once; the observations carry the latest stamp."""
    from perflab.bench.client import build_payload, make_target, prepare, request_headers
    from perflab.bench.drive import LoadPlan, drive, run_in_new_loop

    req = _request(slow_server, 12)
    target = make_target(slow_server.base_url, req.api_endpoint)
    prepared = [prepare(i, target, build_payload(req, "hello there", OUTPUT_LEN), request_headers(req), None)
                for i in range(12)]
    pieces = [0]

    def clock(piece: bytes) -> tuple[float, float | None] | None:  # a stand-in engine clock: 1 s per token piece
        if b"tok" not in piece:
            return None
        pieces[0] += 1
        return float(pieces[0]), None

    seen: list[Observation] = []
    outcome = run_in_new_loop(drive(LoadPlan(prepared, [0.0] * 12, 4, "raw", None), observe=seen.append, clock=clock,
                                    cancel=threading.Event()))
    assert not outcome.cancelled
    stamps = [o.model_t for o in seen if o.model_t is not None]
    assert stamps and stamps == sorted(stamps) and stamps[-1] <= pieces[0]


def test_the_simulators_model_clock_stamp_is_read_from_a_piece() -> None:
    from perflab.bench.runner import model_clock_stamp
    from perflab.bench.serverclock import format_clock

    piece = b"data: {}\n\n" + format_clock(1.5, 0.25) + b"data: {}\n\n" + format_clock(2.25, 0.25) + b"data: {}\n\n"
    assert model_clock_stamp(piece) == (2.25, 0.25)  # the latest step in the piece, and its request's arrival
    assert model_clock_stamp(b"data: {}\n\n") is None
    assert model_clock_stamp(b": perflab-server-clock nonsense\n") is None


def test_the_bench_marks_where_its_timed_run_begins_and_ends(slow_server: FakeOpenAIServer) -> None:
    """``marks.begin()`` comes after the warm-up and before the first timed request,
    ``marks.end()`` after the last response (the lab reads the energy counters there)."""
    seen: list[Observation] = []
    calls: list[tuple[str, int, int]] = []

    class Marks:
        def begin(self) -> None:
            calls.append(("begin", len(slow_server.requests), len(seen)))

        def end(self) -> None:
            calls.append(("end", len(slow_server.requests), len(seen)))

    req = _request(slow_server, 20).replace(warmup=2)
    result = run_benchmark_sync(req, observe=seen.append, marks=Marks())
    assert result.metrics["completed"] == 20
    sent_before = len(slow_server.requests) - 20  # the probe and the two warm-up requests
    assert calls == [("begin", sent_before, 0), ("end", sent_before + 20, len(seen))]


def test_observations_count_the_tokens_of_streams_that_carry_several_per_event() -> None:
    """An engine may stream several tokens in one event (vLLM merges a request's deltas while
    its API server is behind; speculative decoding): the ended requests' ``usage`` gives their
    tokens, and early stop counts tokens, not events — the run's own output token count."""
    import threading

    from perflab.lab.run.earlystop import EarlyStop

    server = FakeOpenAIServer(gap_s=0.01).start()  # 4 tokens per event
    try:
        seen: list[Observation] = []
        req = BenchRequest(base_urls=(server.base_url,), model="multi-4", num_prompts=20, random_input_len=4,
                           random_output_len=12, max_concurrency=4)
        result = run_benchmark_sync(req, observe=seen.append)
    finally:
        server.stop()
    last = seen[-1]
    assert last.completed >= 8 and last.usage_tokens == 12 * last.completed
    # 3 token events, the usage chunk and [DONE] per ended request
    assert last.usage_events == 5 * last.completed and last.events >= last.usage_events
    es = EarlyStop(num_prompts=20, cancel=threading.Event())
    tokens = es._tokens(last)
    assert tokens >= last.prompt_tokens + 12 * last.completed
    assert tokens <= last.prompt_tokens + 12 * 20  # the open requests' events at 12/5 tokens each, at most
    assert result.metrics["total_output_tokens"] == 12 * 20


def test_usage_is_read_from_the_end_of_a_stream() -> None:
    from perflab.bench.drive import _COMPLETION_TOKENS, _PROMPT_TOKENS, _usage_count

    def _usage_tokens(reads: list) -> int | None:
        return _usage_count(reads, _COMPLETION_TOKENS)

    tail = b'data: {"choices":[],"usage":{"prompt_tokens":47,"total_tokens":175,"completion_tokens": 128}}\n\ndata: [DONE]\n\n'
    assert _usage_tokens([(0.0, b'data: {"choices":[{"text":"a"}]}\n\n'), (0.1, tail[:40]), (0.2, tail[40:])]) == 128
    assert _usage_tokens([(0.0, b'data: {"choices":[{"text":"a"}]}\n\ndata: [DONE]\n\n')]) is None
    # cumulative usage on every chunk (continuous_usage_stats): the latest
    chunks = b"".join(b'data: {"choices":[{"text":"a"}],"usage":{"completion_tokens":%d}}\n\n' % i for i in (1, 2, 3))
    assert _usage_tokens([(0.0, chunks)]) == 3
    assert _usage_tokens([]) is None
    assert _usage_count([(0.0, tail)], _PROMPT_TOKENS) == 47
    details = b'data: {"usage":{"prompt_tokens": 9,"prompt_tokens_details":null,"completion_tokens":2}}\n\n'
    assert _usage_count([(0.0, details)], _PROMPT_TOKENS) == 9
