"""``--workers N``: drive one benchmark from N processes when one core cannot.

A Python event loop tops out near one core's worth of chunks per second (see
docs/benchmark.md). With ``--workers``, requests are dealt round-robin to N processes
(``python -m perflab.bench.workers``, started with an argv list: unlike multiprocessing's
spawn, this never re-imports the caller's main script), each with its own event loop, connection pool and share of
``--max-concurrency``; they start at one common ``perf_counter()`` instant (a system-wide
monotonic clock on Linux and macOS), keep the global arrival schedule, parse their own
captures after the run and send back traces. The parent merges them and computes the
metrics as for one process.

Cancellation: when the parent's ``cancel`` event is set it sends ``("cancel",)`` to every
worker; a thread in each worker waits for that message (or for the parent's end of the
socket to close) and sets the worker's own event, which its run polls like a single-process
run. Workers send back what they had measured; one that has not answered within
:data:`CANCEL_GRACE_S` is terminated and its requests are left out of the partial result.
"""

from __future__ import annotations

import os
import pickle
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from time import perf_counter

from perflab.bench.cancel import POLL_S, BenchCancelled
from perflab.bench.drive import LoadPlan, StallSeen, compact_with, drive, frozen_gc, run_in_new_loop
from perflab.bench.trace import Capture, RequestTrace, parse_capture, sent_traces
from perflab.contract.errors import PerflabError

START_LEAD_S = 0.2  # between "all workers ready" and the common start
PROGRESS_EVERY_S = 0.25
JOIN_TIMEOUT_S = 10.0
READY_TIMEOUT_S = 60.0
CANCEL_GRACE_S = 0.3  # after "cancel": how long workers get to send back what they measured


def _worker_main(conn: Connection) -> None:
    """A worker process: receive its plan, wait for "go", run, parse, send traces back."""
    try:
        msg = conn.recv()
        plan: LoadPlan = msg[1]
        prompt_lens: list[int] = msg[2]
        keep_text: bool = msg[4]
        from perflab.bench.tokenizer import load_tokenizer

        tok = load_tokenizer(msg[3])
        conn.send(("ready",))
        msg = conn.recv()
        if msg[0] != "go":
            return
        start_at: float = msg[1]
        cancel = threading.Event()
        threading.Thread(target=_listen, args=(conn, cancel), name="perflab-bench-cancel", daemon=True).start()
        done = 0
        last = [0.0]

        def on_done() -> None:
            nonlocal done
            done += 1
            now = perf_counter()
            if now - last[0] >= PROGRESS_EVERY_S:
                last[0] = now
                conn.send(("progress", done))

        lens = {p.index: plen for p, plen in zip(plan.prepared, prompt_lens, strict=True)}
        caps = {p.index: p.max_tokens for p in plan.prepared}

        def parse(cap: Capture) -> RequestTrace:
            return parse_capture(cap, prompt_len=lens[cap.index], tokenizer=tok, keep_text=keep_text, max_tokens=caps[cap.index])

        with frozen_gc():
            outcome = run_in_new_loop(
                drive(plan, start_at=start_at, on_done=on_done, compact=compact_with(parse), cancel=cancel))
        conn.send(("progress", done))
        if outcome.cancelled:
            traces = sent_traces(outcome.captures, parse, lambda i: lens[i])
        else:
            traces = [cap.trace or parse(cap) for cap in outcome.captures]
        conn.send(("done", traces, outcome.start, outcome.end, outcome.cpu_s, outcome.cancelled, outcome.stall))
    except (EOFError, BrokenPipeError, ConnectionResetError):
        pass  # the parent went away: nothing to report to
    except BaseException as exc:  # report anything, the parent turns it into one line
        try:
            conn.send(("error", f"{type(exc).__name__}: {exc}", traceback.format_exc()))
        except OSError:
            pass
    finally:
        conn.close()


def _listen(conn: Connection, cancel: threading.Event) -> None:
    """A worker's cancel listener: the parent's "cancel", or its end of the socket closing
    (the parent gave up or died), stops the run."""
    try:
        while conn.recv()[0] != "cancel":
            pass
    except (EOFError, OSError, pickle.UnpicklingError):
        pass
    cancel.set()


def _spawn(plan: LoadPlan, lens: list[int], tokenizer: str, keep_text: bool) -> tuple[subprocess.Popen, Connection]:
    ours, theirs = socket.socketpair()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "perflab.bench.workers", str(theirs.fileno())],
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
        )
    finally:
        theirs.close()
    conn = Connection(ours.detach())
    conn.send(("plan", plan, lens, tokenizer, keep_text))
    return proc, conn


def run_workers(
    plans: list[LoadPlan],
    prompt_lens: list[list[int]],
    tokenizer: str,
    *,
    keep_text: bool = False,
    progress: Callable[[int], None] | None = None,
    cancel: threading.Event | None = None,
) -> tuple[list[RequestTrace], float, float, float, bool, StallSeen | None]:
    """Run each plan in its own process; return (traces by index, start, end, CPU seconds,
    cancelled, stall). Cancelled before the common start: :class:`BenchCancelled` (no result);
    after it: the traces of the requests sent, from the workers that answered in time.

    Each worker runs the stall watchdog over its own open requests; the first to stall
    stops the others, as a cancellation does."""
    procs: list[subprocess.Popen] = []
    conns: list[Connection] = []
    tick = POLL_S if cancel is not None else 1.0
    cancelled_at: float | None = None  # when the workers were told to stop (cancel or a stall)
    try:
        for plan, lens in zip(plans, prompt_lens, strict=True):
            proc, conn = _spawn(plan, lens, tokenizer, keep_text)
            procs.append(proc)
            conns.append(conn)
        for conn, proc in zip(conns, procs, strict=True):
            deadline = time.monotonic() + READY_TIMEOUT_S
            while not conn.poll(tick):
                if cancel is not None and cancel.is_set():
                    raise BenchCancelled(None, "starting --workers")
                if time.monotonic() > deadline:
                    raise PerflabError(f"benchmark worker did not start within {READY_TIMEOUT_S:g} s")
            msg = _recv(conn, proc)
            if msg[0] != "ready":
                raise PerflabError(f"benchmark worker failed to start: {msg[1]}")
        start_at = perf_counter() + START_LEAD_S
        for conn in conns:
            conn.send(("go", start_at))
        counts = [0] * len(conns)
        results: dict[int, tuple[list[RequestTrace], float, float, float]] = {}
        pending = {id(c): i for i, c in enumerate(conns)}
        partial = False  # some worker stopped before the end of its share
        stall: StallSeen | None = None
        while pending:
            if cancelled_at is None and ((cancel is not None and cancel.is_set()) or stall is not None):
                cancelled_at = time.monotonic()
                for i in pending.values():
                    try:
                        conns[i].send(("cancel",))
                    except OSError:
                        pass  # gone already: noticed below
            if cancelled_at is not None and time.monotonic() - cancelled_at > CANCEL_GRACE_S:
                break  # the rest are terminated below; their requests are not in the result
            ready = wait([conns[i] for i in pending.values()], timeout=tick)
            if not ready:
                for i in pending.values():
                    if procs[i].poll() is not None:
                        raise PerflabError(f"benchmark worker {i} died (exit code {procs[i].returncode})")
                continue
            for got in ready:
                i = pending[id(got)]
                conn = conns[i]  # the ready one itself, typed as a Connection
                msg = _recv(conn, procs[i])
                if msg[0] == "progress":
                    counts[i] = msg[1]
                    if progress is not None:
                        progress(sum(counts))
                elif msg[0] == "done":
                    results[i] = (msg[1], msg[2], msg[3], msg[4])
                    partial = partial or msg[5]
                    stall = stall or msg[6]
                    del pending[id(conn)]
                elif msg[0] == "error":
                    raise PerflabError(f"benchmark worker {i} failed: {msg[1]}")
        cancelled = partial or bool(pending)
        traces = sorted((t for r in results.values() for t in r[0]), key=lambda t: t.index)
        runs = results.values()
        if not runs:  # cancelled and no worker answered in time
            return [], start_at, perf_counter(), 0.0, True, stall
        return traces, min(r[1] for r in runs), max(r[2] for r in runs), sum(r[3] for r in runs), cancelled, stall
    finally:
        for conn in conns:
            conn.close()  # a worker still running reads EOF and stops
        stopping = (cancel is not None and cancel.is_set()) or cancelled_at is not None
        deadline = time.monotonic() + (CANCEL_GRACE_S if stopping else JOIN_TIMEOUT_S)
        for proc in procs:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.terminate()
                try:
                    proc.wait(2.0)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def _recv(conn: Connection, proc: subprocess.Popen) -> tuple:
    try:
        return conn.recv()
    except (EOFError, OSError, pickle.UnpicklingError):
        try:
            code = proc.wait(1.0)
        except subprocess.TimeoutExpired:
            code = None
        raise PerflabError(f"benchmark worker exited unexpectedly (exit code {code})") from None


if __name__ == "__main__":
    _worker_main(Connection(int(sys.argv[1])))
    # Everything is sent and the socket closed: skip the interpreter's teardown, which frees
    # every capture, trace and module one by one (CPU charged to the run, nothing to save).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
