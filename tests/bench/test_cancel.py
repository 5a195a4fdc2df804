"""Cancelling a running benchmark (``cancel=threading.Event()``) against the in-test server.

Each run would take tens of seconds (hundreds of requests, half a second of streaming each);
the cancel event is set from another thread once a few requests have completed, and the
benchmark must raise :class:`BenchCancelled` promptly, keep what completed, count the
requests cut short as failed, close its connections and leave no thread or process behind.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import anyio
import psutil
import pytest
from perflab.bench import (
    BenchCancelled,
    BenchRequest,
    BenchResult,
    run_benchmark,
    run_benchmark_sync,
)
from perflab.bench.trace import CANCELLED

from .conftest import FakeOpenAIServer

OUTPUT_LEN = 25
GAP_S = 0.02  # half a second of streaming per request
PROMPTS = 400
CONCURRENCY = 4
STOP_BOUND_S = 1.5  # the client stops in well under half a second; generous for a loaded machine


@pytest.fixture
def slow_server() -> Iterator[FakeOpenAIServer]:
    server = FakeOpenAIServer(gap_s=GAP_S).start()
    try:
        yield server
    finally:
        server.stop()


def _request(server: FakeOpenAIServer, **kw: object) -> BenchRequest:
    fields: dict[str, object] = {"base_urls": (server.base_url,), "model": "ok", "num_prompts": PROMPTS,
                                 "random_input_len": 4, "random_output_len": OUTPUT_LEN, "max_concurrency": CONCURRENCY}
    fields.update(kw)
    return BenchRequest(**fields)  # type: ignore[arg-type]


class _CancelAfter:
    """Sets ``cancel`` from its own thread once ``n`` requests have completed."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.cancel = threading.Event()
        self.reached = threading.Event()
        self.set_at = 0.0
        self.thread = threading.Thread(target=self._run, name="test-canceller", daemon=True)
        self.thread.start()

    def progress(self, done: int, total: int) -> None:
        if done >= self.n:
            self.reached.set()

    def _run(self) -> None:
        if self.reached.wait(60):
            self.set_at = time.perf_counter()
            self.cancel.set()

    def close(self) -> None:
        self.reached.set()
        self.thread.join(10)


def _client_connections(port: int) -> list[object]:
    """This process' open TCP connections to ``port`` (the client's side of them)."""
    return [c for c in psutil.Process().net_connections(kind="tcp")
            if c.raddr and c.raddr.port == port and c.status == psutil.CONN_ESTABLISHED]


def _eventually(check, timeout: float = 5.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        threading.Event().wait(0.02)
    return bool(check())


def _check_partial(r: BenchResult, server: FakeOpenAIServer, at_least: int) -> None:
    m = r.metrics
    assert r.cancelled and r.info["cancelled"] is True
    done = [t for t in r.requests if t.success]
    cut = [t for t in r.requests if not t.success]
    assert m["completed"] == len(done) >= at_least
    assert m["failed"] == len(cut) >= 1, "requests in flight at the cancellation count as failed"
    assert all(t.error == CANCELLED for t in cut)
    assert all(t.output_tokens == OUTPUT_LEN for t in done), "completed requests are kept whole"
    assert len(r.requests) < PROMPTS and r.info["requests_not_recorded"] == PROMPTS - len(r.requests)
    assert m["num_prompts"] == PROMPTS and m["duration"] > 0
    # nothing was sent that the result does not account for (plus the test request)
    assert len(server.requests) <= 1 + len(r.requests)


@pytest.mark.parametrize("stack", ["raw", "aiohttp"])
def test_cancel_mid_run_returns_promptly_with_what_completed(slow_server: FakeOpenAIServer, stack: str) -> None:
    canceller = _CancelAfter(CONCURRENCY)
    try:
        with pytest.raises(BenchCancelled) as info:
            run_benchmark_sync(_request(slow_server, http_stack=stack), canceller.progress, canceller.cancel)
        stopped_in = time.perf_counter() - canceller.set_at
    finally:
        canceller.close()
    assert stopped_in < STOP_BOUND_S, f"the benchmark took {stopped_in:.3f} s to stop"
    exc = info.value
    assert exc.result is not None and "requests completed" in str(exc)
    _check_partial(exc.result, slow_server, CONCURRENCY)
    assert _client_connections(slow_server.port) == [], "in-flight streams were not closed"


def test_cancel_with_worker_processes(slow_server: FakeOpenAIServer) -> None:
    me = psutil.Process()
    canceller = _CancelAfter(CONCURRENCY)
    try:
        with pytest.raises(BenchCancelled) as info:
            run_benchmark_sync(_request(slow_server, workers=2), canceller.progress, canceller.cancel)
        stopped_in = time.perf_counter() - canceller.set_at
    finally:
        canceller.close()
    assert stopped_in < STOP_BOUND_S, f"the benchmark took {stopped_in:.3f} s to stop"
    assert me.children(recursive=True) == [], "a worker process outlived the cancelled benchmark"
    exc = info.value
    assert exc.result is not None and exc.result.info["workers"] == 2
    _check_partial(exc.result, slow_server, CONCURRENCY)
    assert _eventually(lambda: _client_connections(slow_server.port) == [])


def test_cancelled_before_start_sends_nothing(slow_server: FakeOpenAIServer) -> None:
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(BenchCancelled) as info:
        run_benchmark_sync(_request(slow_server), None, cancel)
    assert info.value.result is None and "before its timed run" in str(info.value)
    assert slow_server.requests == []


def test_an_unset_event_changes_nothing(fake_server: FakeOpenAIServer) -> None:
    r = run_benchmark_sync(_request(fake_server, num_prompts=20, random_output_len=4), None, threading.Event())
    assert not r.cancelled and "cancelled" not in r.info
    assert r.metrics["completed"] == 20 and r.metrics["failed"] == 0


def test_async_run_benchmark_cancel_event(slow_server: FakeOpenAIServer) -> None:
    canceller = _CancelAfter(CONCURRENCY)

    async def go() -> BaseException | None:
        try:
            await run_benchmark(_request(slow_server), progress=canceller.progress, cancel=canceller.cancel)
        except BenchCancelled as exc:
            return exc
        return None

    try:
        exc = anyio.run(go)
    finally:
        canceller.close()
    assert isinstance(exc, BenchCancelled) and exc.result is not None
    _check_partial(exc.result, slow_server, CONCURRENCY)


def test_cancelling_the_awaiting_task_stops_the_client_thread(slow_server: FakeOpenAIServer) -> None:
    """An anyio cancellation (a timeout here) sets the event and waits for the client's thread."""
    started = threading.Event()
    before = {t.ident for t in threading.enumerate()}
    cancelled_at: list[float] = []

    async def go() -> float:
        with anyio.move_on_after(30) as scope:
            async with anyio.create_task_group() as tg:

                async def stop_when_started() -> None:
                    await anyio.to_thread.run_sync(started.wait, 30, abandon_on_cancel=True)
                    cancelled_at.append(time.perf_counter())
                    scope.cancel()

                tg.start_soon(stop_when_started)
                await run_benchmark(_request(slow_server), progress=lambda done, total: started.set())
        assert scope.cancelled_caught
        return time.perf_counter()

    ended = anyio.run(go)
    assert started.is_set() and cancelled_at
    assert ended - cancelled_at[0] < STOP_BOUND_S, f"run_benchmark took {ended - cancelled_at[0]:.3f} s to stop"
    assert _client_connections(slow_server.port) == [], "the client thread still had streams open"
    # anyio stops its idle worker threads with the event loop: nothing of the run is left
    assert _eventually(lambda: {t.ident for t in threading.enumerate() if t.is_alive()} <= before)
