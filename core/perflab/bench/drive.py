"""The timed part: send prepared requests on schedule, under the concurrency limit.

Runs in one event loop (uvloop when installed) — in the caller's process, or in each
``--workers`` process with its share of the requests. Nothing here parses or tokenizes.
A run given a ``cancel`` event stops when it is set (see :mod:`perflab.bench.cancel`).

Observation (``observe``): a caller that wants to watch a run while it goes (the lab's early
stop, :mod:`perflab.lab.run.earlystop`) gets an :class:`Observation` every ``observe_s`` real
seconds from one task — cumulative counts only (requests arrived, completed, in flight,
streamed events, summed latency), so nothing is done per chunk. To stop the run it sets the
``cancel`` event, and the run ends as a cancelled one does: no request or thread is left.

Stall watchdog (``LoadPlan.stall_s``): when requests are open and no request — open, or ended
since — has received a byte for ``stall_s`` real seconds, the run stops as a cancelled one does
and the outcome says ``stalled``. One task looks at the open requests' last receive times a few
times a second (never per chunk): the receive time of every read is already recorded in the
captures; each request that ends leaves its last one behind. An engine that queues requests
and answers each in a burst is making progress even when no open request has a byte at the
moment the watchdog looks: the real vLLM CPU build with ``--max-num-seqs 4`` and 3000 requests
at once delivers every answer's 128 tokens within a fraction of a second after a wait of up to
a minute (its API server merges a request's deltas while it is behind,
``vllm.v1.engine.output_processor.RequestOutputCollector``), and the open requests were
almost all still waiting.
"""

from __future__ import annotations

import asyncio
import gc
import threading
from collections.abc import Callable, Coroutine, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from time import perf_counter, process_time
from typing import Any, TypeVar

from perflab.bench.cancel import POLL_S
from perflab.bench.client import Prepared, make_client
from perflab.bench.trace import CANCELLED, STALLED, Capture, RequestTrace

T = TypeVar("T")


@dataclass
class LoadPlan:
    """The requests one process sends and when (its share of a run): made by the bench
    runner, split over worker processes (picklable), executed by :func:`drive`."""

    prepared: list[Prepared]
    offsets: list[float]  # real seconds after the common start
    max_concurrency: int | None
    http_stack: str
    timeout: float | None
    capture_budget: int = 1 << 30  # raw bytes kept per process before captures are parsed early
    stall_s: float | None = None  # real seconds without a byte on any open request: stalled


@dataclass
class DriveOutcome:
    """What :func:`drive` returns: one process' raw captures and timing, parsed into a
    :class:`~perflab.bench.result.BenchResult` by the bench runner."""

    captures: list[Capture]
    start: float  # perf_counter of the common start
    end: float  # perf_counter when the last response ended (or the run was cancelled)
    cpu_s: float = 0.0  # this process' CPU time during the run
    cancelled: bool = False  # stopped by the cancel event: captures with start == 0 were never sent
    stall: StallSeen | None = None  # stopped by the stall watchdog (then cancelled is True too)


@dataclass(frozen=True, slots=True)
class Observation:
    """A running benchmark's counts so far (cumulative; times in real seconds since the start)."""

    t: float
    arrived: int  # requests whose arrival time has come (sent, or queued for the concurrency limit)
    completed: int  # responses ended successfully
    failed: int  # responses ended with an error
    in_flight: int  # requests sent and not ended
    events: int  # server-sent events received ("data:" lines: one or more output tokens each, or none)
    latency_s: float  # the sum, over completed requests, of end - arrival (queueing included)
    time_scale: float = 1.0  # engine seconds per real second (the simulator's; set by the bench runner)
    model_t: float | None = None  # the latest engine-clock stamp received (``clock``), engine seconds
    model_origin: float | None = None  # ... and the earliest arrival stamped: where the run began on that clock
    # prompt tokens (the client's count) of the requests that have begun to answer — their prompt
    # is processed — and of every request of the run (``drive``'s ``prompt_lens``; else 0)
    prompt_tokens: int = 0
    prompt_tokens_total: int = 0
    # the requests that have begun to answer: how many, and the sum and sum of squares of
    # their events so far (for early stop's estimate of the output still to come)
    answered: int = 0
    answered_events: float = 0.0
    answered_events_sq: float = 0.0
    # the requests that have not ended: the sum of their ``max_tokens`` (``drive``'s
    # ``output_caps``; None: a request without one, or none given) and the events they sent so far
    output_cap_open: int | None = None
    events_open: int = 0
    # the ended requests whose stream reported ``usage.completion_tokens``: their output tokens
    # and their events (engines may stream several tokens in one event: vLLM merges a
    # request's deltas while its API server is behind)
    usage_tokens: int = 0
    usage_events: int = 0
    # ... and their prompts: the server's count (``usage.prompt_tokens``, which the run's
    # ``total_input_tokens`` counts) and the client's (``prompt_lens``); they differ where the
    # server tokenizes a prompt otherwise (the random dataset's decoded token ids: vLLM counted
    # 47 tokens for the client's 32)
    usage_prompt_tokens: int = 0
    usage_prompt_client: int = 0
    # the requests answering now (begun, not ended), and of the ended requests that reported
    # usage and had a ``max_tokens``: how many, and how many answered all of it (early stop's
    # forecast takes the open requests to answer to their ``max_tokens`` only where the ended
    # ones did)
    running: int = 0
    ended_capped: int = 0
    ended_at_cap: int = 0
    # the open requests one by one, in the order they were sent (:class:`OpenRequests`), made
    # when called — during the observer's call only; None: not observed, or a request has no
    # ``max_tokens``
    open_requests: Callable[[], OpenRequests | None] | None = None
    # set by the bench runner: the warm-up's time per output token (engine seconds; the
    # median over its requests) and how many it sent at once; None: no warm-up measured
    warm_step_s: float | None = None
    warm_batch: int = 0
    # the time between consecutive reads of one event each of the open requests since the
    # previous observation (once each has streamed two): the engine's steps, where it streams
    # a token per step — engine seconds where the stream is stamped (``model_t``), else real
    step_gaps: tuple[float, ...] = ()


@dataclass(frozen=True, slots=True)
class OpenRequests:
    """The requests not yet ended, in the order they were sent: for those answering, what
    their ``max_tokens`` still allows (less the events they streamed); for those not yet
    answering, their ``max_tokens``; and how many requests began to answer or ended although
    a request sent before them is still waiting (0 when the engine takes requests first come,
    first served)."""

    answering_left: tuple[int, ...]
    waiting_caps: tuple[int, ...]
    out_of_order: int


Observer = Callable[[Observation], None]
#: ``clock(piece)``: the latest engine-clock stamp in a piece of a response and the arrival of its
#: request on that clock (engine seconds; the arrival None where the stamp has none), or None —
#: for engines that stamp their stream (perflab's simulator's model clock)
Clock = Callable[[bytes], tuple[float, float | None] | None]
OBSERVE_S = 0.1  # default period of the observation task (real seconds)


@dataclass(frozen=True, slots=True)
class StallSeen:
    """What the watchdog saw when it stopped the run (real seconds)."""

    idle_s: float  # since the last byte on any open request
    in_flight: int  # requests open at that moment


async def drive(
    plan: LoadPlan,
    *,
    start_at: float | None = None,
    on_done: Callable[[], None] | None = None,
    compact: Callable[[Capture], None] | None = None,
    cancel: threading.Event | None = None,
    observe: Observer | None = None,
    observe_s: float = OBSERVE_S,
    clock: Clock | None = None,
    prompt_lens: Sequence[int] | None = None,
    output_caps: Sequence[int | None] | None = None,
) -> DriveOutcome:
    """Send every request of ``plan``; return the raw captures.

    :param start_at: ``perf_counter()`` time to start at (worker processes share one);
        ``None``: now.
    :param on_done: called after each response (progress), in the event loop.
    :param compact: once the raw bytes held exceed ``plan.capture_budget``, called on each
        finished capture to parse it now and drop its bytes (long generation-heavy runs
        would otherwise hold every streamed byte until the end).
    :param cancel: when set (from any thread), stop: nothing more is sent, in-flight requests
        are aborted (connections closed) and get the error ``"cancelled"``, and the outcome
        says ``cancelled``. Polled every :data:`~perflab.bench.cancel.POLL_S` by one task,
        never per chunk.
    :param observe: called with an :class:`Observation` every ``observe_s`` real seconds of
        the run, in the event loop (it must be quick; to stop the run it sets ``cancel``).
    :param clock: with ``observe``, read each received piece's engine-clock stamp once, so that
        observations carry the engine's own time (``Observation.model_t``).
    :param prompt_lens: with ``observe``, the prompt tokens of each request (by its index):
        observations count those of the requests that have begun to answer
        (``Observation.prompt_tokens``).
    :param output_caps: with ``observe``, each request's ``max_tokens`` (by its index; None:
        uncapped): observations say how many output tokens the requests not yet ended may
        still stream at most (``Observation.output_cap_open``).
    """
    client = make_client(plan.http_stack, plan.timeout)
    sem = asyncio.Semaphore(plan.max_concurrency) if plan.max_concurrency else None
    captures = [Capture(p.index) for p in plan.prepared]
    send = client.send
    held = 0
    start, cpu0 = 0.0, process_time()
    tasks: list[asyncio.Task[None]] = []
    open_caps: set[Capture] = set()  # requests sent and not finished (for the stall watchdog)
    # what the observer sees: [completed, failed, events of ended requests, latency sum, output
    # tokens and events of the ended requests that reported usage, their prompt tokens as the
    # server and as the client counted them, of those with a max_tokens: how many, and how
    # many answered all of it]
    ended = [0, 0, 0, 0.0, 0, 0, 0, 0, 0, 0]
    heard = [0.0]  # the latest byte received on a request that has ended (the stall watchdog's)
    counted: dict[int, list[Any]] = {}  # open request -> [reads counted, events in them, last event's time]
    stamp: list[float | None] = [None, None]  # the latest engine-clock stamp seen, the earliest arrival (clock)
    answers = _Answers(prompt_lens, sum(prompt_lens[p.index] for p in plan.prepared) if prompt_lens is not None else 0,
                       output_caps, [p.index for p in plan.prepared])

    async def send_open(p: Prepared, cap: Capture) -> None:
        open_caps.add(cap)
        try:
            await send(p, cap)
        finally:
            open_caps.discard(cap)

    async def one(p: Prepared, cap: Capture) -> None:
        nonlocal held
        cap.queued = perf_counter()
        if sem is None:
            await send_open(p, cap)
        else:
            async with sem:
                await send_open(p, cap)
        if cap.reads and cap.reads[-1][0] > heard[0]:
            heard[0] = cap.reads[-1][0]
        if observe is not None:
            ended[0 if cap.error is None else 1] += 1
            seen = counted.pop(cap.index, [0, 0])
            mine = seen[1] + _events(cap.reads[seen[0]:])
            ended[2] += mine
            used = _usage_count(cap.reads, _COMPLETION_TOKENS) if cap.error is None else None
            cap_i = output_caps[cap.index] if output_caps is not None else None
            if used is not None and cap_i is not None and used > cap_i:
                used = None  # impossible (trace.count_problem fails the request): early stop never counts it
            if used is not None:
                ended[4] += used
                ended[5] += mine
                if cap_i is not None:
                    ended[8] += 1
                    ended[9] += used >= cap_i
                prompt = _usage_count(cap.reads, _PROMPT_TOKENS)
                if prompt is not None and prompt_lens is not None:
                    ended[6] += prompt
                    ended[7] += prompt_lens[cap.index]
            if cap.reads:
                answers.ended(cap.index, mine)
            answers.closed(cap.index)
            if clock is not None:
                _stamp(clock, cap.reads[seen[0]:], stamp)
            if cap.error is None and cap.end:
                ended[3] += cap.end - cap.queued
        if compact is not None:
            if held > plan.capture_budget:
                compact(cap)
            else:
                held += sum(len(piece) for _, piece in cap.reads)
        if on_done is not None:
            on_done()

    async def dispatch() -> None:
        nonlocal start, cpu0
        if start_at is not None:
            wait = start_at - perf_counter()
            if wait > 0:
                await asyncio.sleep(wait)
        cpu0 = process_time()
        start = perf_counter() if start_at is None else start_at
        for p, cap, offset in zip(plan.prepared, captures, plan.offsets, strict=True):
            if offset > 0:
                delay = start + offset - perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(p, cap)))
        await asyncio.gather(*tasks)

    cancelled = False
    stall: list[StallSeen] = []
    try:
        if cancel is None and not plan.stall_s and observe is None:
            await dispatch()
        else:
            watchers = []
            if cancel is not None:
                if cancel.is_set():  # stopped before it began: send nothing
                    watchers.append(_noop())
                else:
                    watchers.append(_wait_event(cancel))
            if plan.stall_s:
                watchers.append(_watch_stall(open_caps, plan.stall_s, stall, heard))
            if observe is not None:
                watchers.append(_observe(observe, observe_s, lambda: start, tasks, open_caps, ended, counted, clock, stamp,
                                         answers, cancel))
            cancelled = await _cancellable(dispatch(), watchers, tasks)
        end = perf_counter()
        cpu = process_time() - cpu0
    finally:
        await client.close()
    if cancelled:
        if not start:  # cancelled while waiting for the common start
            start = end
        why = STALLED if stall else CANCELLED
        for cap in captures:
            if cap.start and (not cap.end or cap.error == CANCELLED):  # in flight, or aborted by the stop
                cap.error = why
                cap.end = end
    return DriveOutcome(captures, start, end, cpu, cancelled, stall[0] if stall else None)


async def _cancellable(work: Coroutine[Any, Any, None], watchers: list[Coroutine[Any, Any, None]],
                       tasks: list[asyncio.Task[None]]) -> bool:
    """Run ``work`` until it ends (False) or one of ``watchers`` returns (True: ``work`` and
    the request ``tasks`` it started are cancelled and awaited, so their connections are
    closed)."""
    watching = [asyncio.ensure_future(w) for w in watchers]
    await asyncio.sleep(0)  # a watcher that is already done wins before anything is sent
    if any(w.done() for w in watching):
        work.close()
        for w in watching:
            w.cancel()
        await asyncio.gather(*watching, return_exceptions=True)
        return True
    job = asyncio.ensure_future(work)
    try:
        await asyncio.wait((job, *watching), return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # the caller's own cancellation (Ctrl-C in a CLI loop)
        job.cancel()
        for w in watching:
            w.cancel()
        raise
    if job.done():  # finished first: a complete run, even if the event is set by now
        for w in watching:
            w.cancel()
        job.result()
        return False
    for w in watching:
        w.cancel()
    job.cancel()
    for t in tasks:
        t.cancel()
    await asyncio.gather(job, *tasks, *watching, return_exceptions=True)
    return True


async def _watch_stall(open_caps: set[Capture], stall_s: float, seen: list[StallSeen],
                       heard: list[float] | None = None) -> None:
    """Return (appending to ``seen``) once requests are open and no request has received a byte
    for ``stall_s`` seconds: neither an open one (one without a byte yet counts from when it
    was sent) nor one that has ended since (``heard[0]``: the latest byte of those)."""
    tick = min(max(stall_s / 10, 0.01), 0.5)
    while True:
        await asyncio.sleep(tick)
        if not open_caps:
            continue
        now = perf_counter()
        last = max(heard[0] if heard else 0.0,
                   max((c.reads[-1][0] if c.reads else (c.start or now)) for c in open_caps))
        if now - last >= stall_s:
            seen.append(StallSeen(now - last, len(open_caps)))
            return


def _events(reads: list[tuple[float, bytes]]) -> int:
    return sum(piece.count(b"data:") for _, piece in reads)


_COMPLETION_TOKENS = b'"completion_tokens":'
_PROMPT_TOKENS = b'"prompt_tokens":'


def _usage_count(reads: list[tuple[float, bytes]], key: bytes) -> int | None:
    """A count of the ``usage`` an ended stream reported last (the final usage chunk that
    ``stream_options.include_usage`` asks for, or the latest cumulative one) — ``key`` is
    ``"completion_tokens":`` or ``"prompt_tokens":`` — found in its last reads without parsing
    the stream; None when it reported none."""
    tail = b"".join(piece for _, piece in reads[-4:])[-8192:]
    at = tail.rfind(key)
    if at < 0:
        return None
    digits = tail[at + len(key):at + len(key) + 24].lstrip()
    end = 0
    while end < len(digits) and 48 <= digits[end] <= 57:
        end += 1
    return int(digits[:end]) if end else None


class _Answers:
    """The requests that have begun to answer: their prompt tokens (each counted once), and the
    events of those that ended (count, sum, sum of squares); and the ``max_tokens`` of the
    requests that have not ended (None: one is uncapped, or no caps were given)."""

    def __init__(self, lens: Sequence[int] | None, total: int, caps: Sequence[int | None] | None = None,
                 indices: Sequence[int] = ()) -> None:
        self.lens, self.total, self.done = lens, total, 0
        self._seen: set[int] = set()
        self.n_ended, self.sum_ended, self.sq_ended = 0, 0.0, 0.0
        self.caps = caps
        self.indices = list(indices)
        self.closed_set: set[int] = set()
        mine = [caps[i] for i in indices] if caps is not None else [None]
        self.cap_open: int | None = None if any(c is None for c in mine) else sum(c for c in mine if c is not None)

    def closed(self, index: int) -> None:
        """A request ended (answered or not): its cap is no longer open."""
        self.closed_set.add(index)
        if self.cap_open is not None and self.caps is not None:
            self.cap_open -= self.caps[index] or 0

    def open_requests(self, counted: dict[int, list[Any]]) -> OpenRequests | None:
        """The open requests in the order sent (:class:`OpenRequests`); None without caps."""
        if self.cap_open is None or self.caps is None:
            return None
        left: list[int] = []
        waiting: list[int] = []
        behind = 0
        for i in self.indices:
            if i in self.closed_set:
                behind += bool(waiting) and i in self._seen
                continue
            cap = self.caps[i] or 0
            if i in self._seen:
                behind += bool(waiting)
                left.append(max(0, cap - counted.get(i, (0, 0))[1]))
            else:
                waiting.append(cap)
        return OpenRequests(tuple(left), tuple(waiting), behind)

    def answered(self, index: int) -> None:
        if self.lens is not None and index not in self._seen:
            self._seen.add(index)
            self.done += self.lens[index]

    def ended(self, index: int, events: int) -> None:
        self.answered(index)
        self.n_ended += 1
        self.sum_ended += events
        self.sq_ended += events * events


async def _observe(observe: Observer, every: float, start: Callable[[], float], tasks: list[asyncio.Task[None]],
                   open_caps: set[Capture], ended: list[Any], counted: dict[int, list[Any]], clock: Clock | None,
                   stamp: list[float | None], answers: _Answers, cancel: threading.Event | None = None) -> None:
    """The observation task: returns only once the observer has set ``cancel`` (the run then
    stops at once, not at the cancel watcher's next poll); otherwise it is cancelled with the
    run. The events of the open requests are counted from their new reads at each tick
    (bytes.count, each read once)."""
    while True:
        await asyncio.sleep(every)
        t0 = start()
        if not t0:
            continue
        events = ended[2]
        answered, a_sum, a_sq = answers.n_ended, answers.sum_ended, answers.sq_ended
        running = 0
        gaps: list[float] = []
        for c in list(open_caps):
            seen = counted.setdefault(c.index, [0, 0, -1.0])
            n = len(c.reads)
            if n > seen[0]:
                _take(c.reads[seen[0]:n], seen, clock, stamp, gaps)
            seen[0] = n
            events += seen[1]
            if n:
                answers.answered(c.index)
                answered += 1
                running += 1
                a_sum += seen[1]
                a_sq += seen[1] * seen[1]
        observe(Observation(perf_counter() - t0, len(tasks), ended[0], ended[1], len(open_caps), events, ended[3],
                            model_t=stamp[0], model_origin=stamp[1], prompt_tokens=answers.done, prompt_tokens_total=answers.total,
                            answered=answered, answered_events=a_sum, answered_events_sq=a_sq,
                            output_cap_open=answers.cap_open, events_open=events - ended[2],
                            usage_tokens=ended[4], usage_events=ended[5], usage_prompt_tokens=ended[6],
                            usage_prompt_client=ended[7], running=running, ended_capped=ended[8],
                            ended_at_cap=ended[9], open_requests=lambda: answers.open_requests(counted),
                            step_gaps=tuple(gaps)))
        if cancel is not None and cancel.is_set():
            return


def _take(reads: list[tuple[float, bytes]], seen: list[Any], clock: Clock | None, stamp: list[float | None],
          gaps: list[float]) -> None:
    """Count an open request's new ``reads``: their events into ``seen[1]``, the engine clock's
    stamps into ``stamp``, and into ``gaps`` the time from its previous read to each read that
    carries one event, once it has streamed two (a step of the engine's each, where it streams
    a token per step; the first gap would be its first token's wait). ``seen[2]`` keeps its
    latest read's time: the stamp where the stream is stamped, else the receive time."""
    for received, piece in reads:
        k = piece.count(b"data:")
        at: float | None = received
        if clock is not None:
            got = clock(piece)
            at = got[0] if got is not None else None
            _keep_stamp(got, stamp)
        if k == 1 and seen[1] >= 2 and at is not None and seen[2] >= 0:
            gaps.append(at - seen[2])
        seen[1] += k
        if at is not None and k:
            seen[2] = at


def _stamp(clock: Clock, reads: list[tuple[float, bytes]], stamp: list[float | None]) -> None:
    """Keep in ``stamp[0]`` the latest engine-clock stamp among ``reads``, in ``stamp[1]`` the
    earliest arrival they stamp."""
    for _, piece in reads:
        _keep_stamp(clock(piece), stamp)


def _keep_stamp(got: tuple[float, float | None] | None, stamp: list[float | None]) -> None:
    """Fold one piece's ``(t, arrival)`` (a :data:`Clock`'s answer) into ``stamp``: the latest
    ``t``, the earliest arrival."""
    if got is None:
        return
    t, arrival = got
    if stamp[0] is None or t > stamp[0]:
        stamp[0] = t
    if arrival is not None and (stamp[1] is None or arrival < stamp[1]):
        stamp[1] = arrival


async def _noop() -> None:
    return None


async def _wait_event(event: threading.Event) -> None:
    while not event.is_set():
        await asyncio.sleep(POLL_S)


def compact_with(parse: Callable[[Capture], RequestTrace]) -> Callable[[Capture], None]:
    """A ``compact`` for :func:`drive`: parse the capture now, keep the trace, drop the bytes."""

    def compact(cap: Capture) -> None:
        cap.trace = parse(cap)
        cap.reads = []

    return compact


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop when installed (``perflab[fast]``), else asyncio's default loop."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is optional
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def run_in_new_loop(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to completion in a fresh event loop owned by the current thread."""
    out: list[T] = []

    async def main() -> None:
        out.append(await coro)

    # The result leaves through ``out``, not as the task's result: in the main thread the
    # Runner's SIGINT handler holds the task, and restoring the handler reprs it (through
    # signal.getsignal), result included: 0.1-0.3 s for a run's captures.
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        runner.run(main())
    return out[0]


@contextmanager
def frozen_gc():
    """Move everything allocated so far out of the collector's sight for the timed run.

    A full collection walking the prepared requests in the middle of the run is a pause of
    many milliseconds on every stream at once; young-generation collections of what the run
    itself allocates stay cheap.
    """
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def split_plan(plan: LoadPlan, workers: int) -> list[LoadPlan]:
    """Round-robin the requests over ``workers`` plans; the concurrency limit is shared out."""
    out = []
    for w in range(workers):
        conc = None
        if plan.max_concurrency is not None:
            conc = plan.max_concurrency // workers + (1 if w < plan.max_concurrency % workers else 0)
        out.append(
            LoadPlan(
                prepared=plan.prepared[w::workers],
                offsets=plan.offsets[w::workers],
                max_concurrency=conc,
                http_stack=plan.http_stack,
                timeout=plan.timeout,
                capture_budget=plan.capture_budget,
                stall_s=plan.stall_s,
            )
        )
    return out
