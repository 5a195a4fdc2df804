"""Stopping a benchmark from outside: a :class:`threading.Event` and :class:`BenchCancelled`.

The caller (the lab, when the engine dies, the time budget runs out or the user presses
Ctrl-C) sets the event from any thread. The client never looks at it per chunk: the event
loop of the timed run polls it every :data:`POLL_S` (:func:`perflab.bench.drive.drive`), and
the stages around the run (test request, tokenizer, dataset, warm-up) check it between steps.
Once it is set no new request is sent, in-flight streams are aborted (their connections
closed, the requests counted as failed with the error ``"cancelled"``), ``--workers``
processes are told to stop (and terminated if they do not answer in time), and
:func:`~perflab.bench.run_benchmark_sync` raises :class:`BenchCancelled` — a cancelled run is
not a measurement of the server, so it never comes back as an ordinary result.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from perflab.contract.errors import PerflabError

if TYPE_CHECKING:
    from perflab.bench.result import BenchResult

T = TypeVar("T")

POLL_S = 0.05  # how often a running event loop looks at the cancel event
JOIN_S = 5.0  # how long run_benchmark() waits for its cancelled thread before giving up on it


class BenchCancelled(PerflabError):
    """The benchmark was cancelled through its ``cancel`` event.

    ``result`` is what the timed run had measured when it stopped — a :class:`BenchResult`
    with ``cancelled=True``, metrics over the requests sent (the completed ones, plus those
    cut short, counted as failed with the error ``"cancelled"``; requests never sent are left
    out) — or ``None`` when the cancellation came before the timed run began.
    """

    def __init__(self, result: BenchResult | None = None, stage: str = "run") -> None:
        self.result = result
        self.stage = stage
        if result is None:
            msg = f"the benchmark was cancelled before its timed run ({stage})"
        else:
            done = int(result.metrics.completed or 0)
            msg = f"the benchmark was cancelled ({done} of {result.metrics.num_prompts} requests completed)"
        super().__init__(msg)


def check(cancel: threading.Event | None, stage: str) -> None:
    """Raise :class:`BenchCancelled` (no result) if ``cancel`` is set."""
    if cancel is not None and cancel.is_set():
        raise BenchCancelled(None, stage)


async def wait_set(event: threading.Event, timeout: float) -> bool:
    """Wait (in the caller's event loop, any anyio backend) until ``event`` is set, at most
    ``timeout`` seconds; True if it was. Polls, so it needs no thread of its own."""
    import anyio

    deadline = time.monotonic() + timeout
    while not event.is_set():
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        await anyio.sleep(min(0.01, left))
    return True


def signalling_end(finished: threading.Event, work: Callable[[], T]) -> Callable[[], T]:
    """``work``, setting ``finished`` when it returns or raises: the benchmark thread's end,
    which a cancelling caller waits for (:func:`wait_set`) before it goes on."""

    def run() -> T:
        try:
            return work()
        finally:
            finished.set()

    return run


__all__ = ["POLL_S", "BenchCancelled", "check", "signalling_end", "wait_set"]
