"""perflab's built-in benchmark: prepare, probe, warm up, run, parse, measure.

Order of work (the timed part is only step 5)::

    1. profile and validation
    2. a one-token test request per endpoint (fails fast with the server's error; tells
       whether the server runs on a faster clock of its own, a simulator's, and its time scale)
    3. tokenizer, dataset, every request encoded to bytes, arrival times
    4. warm-up requests (not measured)
    5. the run, with the garbage collector's heap frozen; in --workers processes if asked
    6. captures parsed into traces, metrics, result block and JSON

A ``cancel`` event (:mod:`perflab.bench.cancel`) is checked between the steps and polled by
the event loop during steps 2, 4 and 5; once set, the run raises :class:`BenchCancelled`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import secrets
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from time import perf_counter
from typing import Any, Protocol

from perflab.bench.cancel import BenchCancelled, check
from perflab.bench.client import (
    Prepared,
    Target,
    build_payload,
    make_target,
    output_cap,
    prepare,
    request_headers,
)
from perflab.bench.datasets import Sample, check_memory, iter_samples
from perflab.bench.drive import (
    Clock,
    LoadPlan,
    Observation,
    Observer,
    StallSeen,
    compact_with,
    drive,
    frozen_gc,
    run_in_new_loop,
    split_plan,
)
from perflab.bench.metrics import BenchMetrics, compute_metrics
from perflab.bench.profiles import apply_profile
from perflab.bench.request import BenchRequest
from perflab.bench.result import BenchResult, Stall
from perflab.bench.schedule import arrival_offsets
from perflab.bench.serverclock import (
    LIFECYCLE_HEADER,
    SERVER_CLOCK_COMMENT,
    TIME_SCALE_HEADER,
    parse_clock,
    parse_lifecycle,
)
from perflab.bench.tokenizer import Tokenizer, load_tokenizer, tokenizer_spec
from perflab.bench.trace import Capture, RequestTrace, parse_capture, sent_traces
from perflab.contract.errors import PerflabError

MAX_KEPT_ERRORS = 10
PROBE_TIMEOUT_S = 60.0
# the least real time without a byte before a *simulated* engine (time scale > 1) is called
# stalled: a 2-core host under load paused the demo's simulated SGLang for 1.6 s (64 engine
# seconds at x40) while it received 1000 requests, and the run was recorded as stalled
SIM_STALL_FLOOR_S = 5.0

Progress = Callable[[int, int], None]


class RunMarks(Protocol):
    """Told where the timed run begins and ends (:class:`perflab.observe.TimedRun`)."""

    def begin(self) -> None: ...

    def end(self) -> None: ...


# --------------------------------------------------------------------------- probe


def _probe_requests(req: BenchRequest, targets: list[Target]) -> list[Prepared]:
    payload = build_payload(req, "Hello", 1)
    # no model-clock request before the server proved to be perflab's simulator
    headers = request_headers(req.replace(server_clock=False), len(targets))
    run = secrets.token_hex(4)
    return [prepare(-1 - i, t, payload, headers, f"perflab-probe-{run}-{i}") for i, t in enumerate(targets)]


def _probe(req: BenchRequest, targets: list[Target], cancel: threading.Event | None = None
           ) -> tuple[bool, float | None, tuple[float, float] | None]:
    """Send one tiny request to every endpoint; (does a server run on a clock of its own
    (:data:`~perflab.bench.serverclock.TIME_SCALE_HEADER`), its time scale, its start-up and
    teardown on that clock (:data:`~perflab.bench.serverclock.LIFECYCLE_HEADER`; the first
    endpoint's))."""
    probes = _probe_requests(req, targets)
    plan = LoadPlan(probes, [0.0] * len(probes), None, req.http_stack, min(req.timeout or PROBE_TIMEOUT_S, PROBE_TIMEOUT_S))
    outcome = run_in_new_loop(drive(plan, cancel=cancel))
    if outcome.cancelled:
        raise BenchCancelled(None, "test request")
    simulated = False
    scale: float | None = None
    lifecycle: tuple[float, float] | None = None
    for target, cap in zip(targets, outcome.captures, strict=True):
        trace = parse_capture(cap, prompt_len=1, tokenizer=None, check_counts=False)  # the run checks counts
        if not trace.success:
            raise PerflabError(f"the test request to {target.url} failed: {trace.error}")
        header = cap.headers.get(TIME_SCALE_HEADER)
        if header is not None:
            simulated = True
            try:
                scale = float(header)
            except ValueError:
                raise PerflabError(f"{target.url} sent {TIME_SCALE_HEADER}: {header!r}, not a number") from None
        said = cap.headers.get(LIFECYCLE_HEADER)
        if said is not None and lifecycle is None:
            lifecycle = parse_lifecycle(said)
    return simulated, scale, lifecycle


# --------------------------------------------------------------------------- preparation


def _prepare_all(req: BenchRequest, targets: list[Target], samples: Iterable[Sample], id_prefix: str
                 ) -> tuple[list[Prepared], list[int], list[int | None]]:
    """Every request encoded, each prompt's client-side token count, and each request's
    output cap (:func:`output_cap`) (the headers say how many requests the run has: a
    simulated engine's closed-loop hold counts them)."""
    payloads = []
    lens = []
    for s in samples:
        payloads.append(build_payload(req, s.prompt, s.output_len))
        lens.append(s.prompt_len)
    headers = request_headers(req, len(payloads))
    deadline = req.timeout is None  # an explicit --timeout replaces the per-request limit
    out = [prepare(i, targets[i % len(targets)], payload, headers, f"{id_prefix}{i}", deadline=deadline)
           for i, payload in enumerate(payloads)]
    return out, lens, [p.max_tokens for p in out]


def _warmup(req: BenchRequest, first: Prepared, targets: list[Target], cancel: threading.Event | None = None,
            stall_s: float | None = None, model: list[float] | None = None, step: list[float] | None = None,
            time_scale: float = 1.0) -> StallSeen | None:
    """vLLM's warm-up: the first prompt, ``--warmup`` times, under the concurrency limit;
    what the stall watchdog saw if it stopped it. ``model``: given, and the requests stamped
    by the simulator's model clock, gets the warm-up's duration on that clock appended.
    ``step``: given, gets the warm-up's time per output token appended (engine seconds, the
    median over its requests; :func:`_per_token_s`) — what a decode step of that small a batch
    takes on this engine, which early stop's forecast takes as the least a step of its run's
    last requests can take."""
    if req.warmup <= 0:
        return None
    body = json.loads(first.body)
    headers = request_headers(req, req.warmup)
    prepared = [prepare(-1000 - i, targets[i % len(targets)], body, headers, None, deadline=req.timeout is None)
                for i in range(req.warmup)]
    plan = LoadPlan(prepared, [0.0] * len(prepared), req.max_concurrency, req.http_stack, req.timeout, stall_s=stall_s)
    outcome = run_in_new_loop(drive(plan, cancel=cancel))
    if outcome.stall is not None:
        return outcome.stall
    if outcome.cancelled:
        raise BenchCancelled(None, "warm-up")
    traces = [parse_capture(c, prompt_len=0, tokenizer=None, check_counts=False) for c in outcome.captures]
    timed = _on_model_clock(traces, 1.0) if req.server_clock else None
    if model is not None and timed is not None:
        model.append(timed[1])
    if step is not None:
        per_token = _per_token_s(timed[0] if timed is not None else traces)
        if per_token is not None:
            step.append(per_token * (1.0 if timed is not None else time_scale))
    return None


def _warm_batch(req: BenchRequest) -> int:
    """How many warm-up requests were in flight at once: all of them, or the concurrency limit."""
    return min(req.warmup, req.max_concurrency) if req.max_concurrency else req.warmup


def _per_token_s(traces: Iterable[RequestTrace]) -> float | None:
    """The median, over the successful requests that streamed two chunks or more, of their
    time per output token after the first: (last chunk - first chunk) / (output tokens - 1),
    tokens as the server counted them (several may come in one chunk). None if none did."""
    times = sorted((t.chunk_times[-1] - t.chunk_times[0]) / (t.output_tokens - 1) for t in traces
                   if t.success and len(t.chunk_times) >= 2 and t.output_tokens >= 2)
    return times[len(times) // 2] if times else None


# --------------------------------------------------------------------------- run


@dataclass
class _Timed:
    """What the timed run gives back (traces of the requests sent, by index)."""

    traces: list[RequestTrace]
    start: float
    end: float
    cpu_s: float
    cancelled: bool = False
    stall: StallSeen | None = None


def _run_single(plan: LoadPlan, prompt_lens: list[int], tok: Tokenizer, keep_text: bool, progress: Progress | None,
                cancel: threading.Event | None, observe: Observer | None = None, clock: Clock | None = None,
                output_caps: list[int | None] | None = None) -> _Timed:
    total = len(plan.prepared)
    done = 0
    last = [0.0]

    def on_done() -> None:
        nonlocal done
        done += 1
        if progress is not None:
            now = perf_counter()
            if now - last[0] >= 0.1 or done == total:
                last[0] = now
                progress(done, total)

    def parse(cap: Capture) -> RequestTrace:
        return parse_capture(cap, prompt_len=prompt_lens[cap.index], tokenizer=tok, keep_text=keep_text,
                             max_tokens=output_caps[cap.index] if output_caps is not None else None)

    with frozen_gc():
        outcome = run_in_new_loop(drive(plan, on_done=on_done, compact=compact_with(parse), cancel=cancel,
                                        observe=observe, clock=clock, prompt_lens=prompt_lens,
                                        output_caps=output_caps))
    if outcome.cancelled:
        traces = sent_traces(outcome.captures, parse, lambda i: prompt_lens[i])
    else:
        traces = [cap.trace or parse(cap) for cap in outcome.captures]
    return _Timed(traces, outcome.start, outcome.end, outcome.cpu_s, outcome.cancelled, outcome.stall)


def _run_workers(req: BenchRequest, plan: LoadPlan, prompt_lens: list[int], tok: Tokenizer, progress: Progress | None,
                 cancel: threading.Event | None) -> _Timed:
    from perflab.bench.workers import run_workers

    plans = split_plan(plan, req.workers)
    lens = [[prompt_lens[p.index] for p in sub.prepared] for sub in plans]
    total = len(plan.prepared)
    cb = (lambda n: progress(n, total)) if progress is not None else None
    traces, start, end, cpu_s, cancelled, stall = run_workers(
        plans, lens, tokenizer_spec(tok), keep_text=req.save_detailed or req.keep_text, progress=cb, cancel=cancel)
    return _Timed(traces, start, end, cpu_s, cancelled, stall)


def run_benchmark_sync(req: BenchRequest, progress: Progress | None = None, cancel: threading.Event | None = None,
                       observe: Observer | None = None, marks: RunMarks | None = None) -> BenchResult:
    """Run the built-in benchmark in the calling thread (its own event loop).

    :param cancel: set it (from any thread) to stop the benchmark within about half a second;
        the call then raises :class:`~perflab.bench.cancel.BenchCancelled` carrying what the
        timed run had measured (see :mod:`perflab.bench.cancel`).
    :param observe: called during the timed run with the counts so far
        (:class:`~perflab.bench.drive.Observation`, real seconds); it stops the run by setting
        ``cancel``. Single-process runs only: with ``workers > 1`` it is not called.
    :param marks: told (in this thread) just before the first timed request — after the
        tokenizer, the dataset and the warm-up — and right after the last response, before
        the metrics: the lab reads the accelerators' energy counters at both
        (:class:`perflab.observe.TimedRun`).
    """
    req = apply_profile(req).validate()
    check_memory(req)
    targets = [make_target(u, req.api_endpoint) for u in req.base_urls]
    check(cancel, "start")

    # An explicit tokenizer is loaded first: a wrong path is a usage error, not a server one.
    explicit_tok = load_tokenizer(req.tokenizer) if req.tokenizer not in (None, "", "auto") else None
    check(cancel, "tokenizer")
    simulated, server_scale, lifecycle = _probe(req, targets, cancel)
    if req.server_clock and not simulated:  # a real engine is never asked for model-clock stamps
        req = req.replace(server_clock=False)
    time_scale = server_scale if server_scale is not None else req.time_scale
    tok = explicit_tok or load_tokenizer(None, model=req.model, simulated=simulated)
    check(cancel, "tokenizer")
    samples = iter_samples(req, tok)
    check(cancel, "dataset")
    id_prefix = f"perflab-{secrets.token_hex(4)}-"
    prepared, prompt_lens, caps = _prepare_all(req, targets, samples, id_prefix)
    rate = req.request_rate * time_scale  # real requests per second
    offsets = arrival_offsets(len(prepared), rate, req.burstiness, req.seed)
    stall_real = req.stall_s / time_scale if req.stall_s else None  # stall_s is engine time
    if req.stall_s and stall_real is not None and simulated and time_scale > 1:
        # the simulated engine shares this host with the client: a loaded host pauses it for a
        # second or two with nothing wrong with the configuration — at x40 a minute of engine time
        stall_real = max(stall_real, min(req.stall_s, SIM_STALL_FLOOR_S))
    plan = LoadPlan(prepared, offsets, req.max_concurrency, req.http_stack, req.timeout, stall_s=stall_real)
    check(cancel, "preparation")
    warm_model: list[float] = []  # the warm-up's duration on the simulator's model clock
    warm_step: list[float] = []  # its time per output token (engine seconds)
    warm_stall = _warmup(req, prepared[0], targets, cancel, stall_real, warm_model, warm_step, time_scale)
    if warm_stall is not None:
        result = _make_result(req, [], 1e-9, tok, simulated, time_scale, len(targets))
        result.stall = _stall(req, warm_stall, time_scale, 0, "warm-up")
        result.info.update(stalled=result.stall.to_json(), requests_not_recorded=len(prepared))
        if lifecycle is not None:
            result.info["lifecycle_s"] = list(lifecycle)
        return result

    keep_text = req.save_detailed or req.keep_text
    if marks is not None:
        marks.begin()
    if req.workers > 1:
        timed = _run_workers(req, plan, prompt_lens, tok, progress, cancel)
    else:
        watch: Observer | None = None
        if observe is not None:  # the observer converts to engine time with the scale in use (the server's)
            warmed: dict[str, Any] = {"warm_step_s": warm_step[0], "warm_batch": _warm_batch(req)} if warm_step else {}

            def watch(o: Observation) -> None:
                observe(dataclasses.replace(o, time_scale=time_scale, **warmed))
        clock = model_clock_stamp if (req.server_clock and simulated) else None  # early stop in engine time
        timed = _run_single(plan, prompt_lens, tok, keep_text, progress, cancel, watch, clock, caps)
    if marks is not None:
        marks.end()

    start = timed.start
    model = _on_model_clock(timed.traces, time_scale) if (req.server_clock and simulated) else None
    if model is not None:
        traces, duration = model
    else:
        traces = [_relative(t, start).scaled(time_scale) for t in timed.traces]
        duration = (timed.end - start) * time_scale
    result = _make_result(req, traces, duration, tok, simulated, time_scale, len(targets))
    result.info["clock"] = "model" if model is not None else "host"
    if lifecycle is not None:  # the engine's start-up and teardown on its model clock (engine-hours)
        result.info["lifecycle_s"] = list(lifecycle)
    if warm_model:  # engine seconds the warm-up took (what the engine spent, outside the results)
        result.info["warmup_s"] = round(warm_model[0], 6)
    # For clock comparisons (benchmarks/bench_client_capacity.py): request i was sent with
    # x-request-id {request_id_prefix}{i}; its absolute perf_counter() times are
    # origin + (start + chunk time) / time_scale.
    result.info.update(
        client_cpu_s=timed.cpu_s,
        origin_perf_counter=start,
        request_id_prefix=id_prefix,
        time_scale_source="server" if server_scale is not None else "request",
    )
    if timed.stall is not None:
        # The engine stopped answering: returned (typed) so that callers can name it, saved
        # when asked with the stall recorded; never mistaken for a full run (result.stalled).
        result.stall = _stall(req, timed.stall, time_scale, int(result.metrics.completed or 0), "run")
        result.info.update(stalled=result.stall.to_json(), requests_not_recorded=len(plan.prepared) - len(traces))
    elif timed.cancelled:
        # Not a measurement of the server: never saved, never returned as a result.
        result.cancelled = True
        result.info.update(cancelled=True, requests_not_recorded=len(plan.prepared) - len(traces))
        raise BenchCancelled(result)
    if req.save_result:
        path = result.save(req.result_dir, req.result_filename, detailed=req.save_detailed)
        result.info["result_path"] = str(path)
    return result


def _stall(req: BenchRequest, seen: StallSeen, time_scale: float, completed: int, stage: str) -> Stall:
    return Stall(stall_s=float(req.stall_s or 0.0), idle_s=seen.idle_s * time_scale, in_flight=seen.in_flight,
                 completed=completed, stage=stage)


def model_clock_stamp(piece: bytes) -> tuple[float, float | None] | None:
    """The latest model-clock stamp (``: perflab-server-clock <t> <arrival>``, the simulator's
    :data:`perflab.bench.serverclock.SERVER_CLOCK_COMMENT`) in a received piece: ``(t, arrival)``; None if none."""
    at = piece.rfind(SERVER_CLOCK_COMMENT)
    if at < 0:
        return None
    line = piece[at + len(SERVER_CLOCK_COMMENT):].split(b"\n", 1)[0]
    return parse_clock(line.strip())


def _on_model_clock(traces: list[RequestTrace], time_scale: float) -> tuple[list[RequestTrace], float] | None:
    """The run timed by the simulated engine's model clock: every successful request's
    arrival and chunks from its stamps, the duration from the first arrival to the last
    chunk. None (time it by the host's clock) when a successful request lacks stamps."""
    ok = [t for t in traces if t.success]
    if not ok or any(t.model_arrival is None or not t.model_times for t in ok):
        return None
    origin = min(t.model_arrival for t in ok if t.model_arrival is not None)
    end = max(t.model_times[-1] for t in ok if t.model_times)
    out = []
    for t in traces:
        t.queue_time *= time_scale  # the client's own wait (--max-concurrency): host time
        if t.success:
            out.append(t.on_model_clock(origin))
        else:
            t.start = 0.0  # a failed request has no stamps; its times enter no metric
            out.append(t)
    return out, end - origin


def _relative(t: RequestTrace, origin: float) -> RequestTrace:
    t.start -= origin
    return t


def _make_result(
    req: BenchRequest,
    traces: list[RequestTrace],
    duration: float,
    tok: Tokenizer,
    simulated: bool,
    time_scale: float,
    n_targets: int,
) -> BenchResult:
    settings = BenchMetrics(
        date=datetime.now().strftime("%Y%m%d-%H%M%S"),
        endpoint_type=req.backend,
        backend=req.backend,
        label=req.label,
        model_id=req.model,
        tokenizer_id=tok.name,
        num_prompts=req.num_prompts,
        request_rate=req.request_rate if not math.isinf(req.request_rate) else "inf",
        burstiness=req.burstiness,
        max_concurrency=req.max_concurrency,
    )
    figures = compute_metrics(traces, max(duration, 1e-9), percentiles=req.percentiles, goodput=req.goodput_dict or None)
    ok = [t for t in traces if t.success]
    with_server = sum(1 for t in ok if t.server_prompt_tokens is not None)
    mismatched = sum(1 for t in ok if t.server_prompt_tokens is not None and t.server_prompt_tokens != t.prompt_len)
    # requests failed for counts that cannot be true (perflab.bench.trace.count_problem)
    checks = BenchMetrics(usage_mismatches=sum(1 for t in traces if t.usage_mismatch),
                          over_max_tokens=sum(1 for t in traces if t.over_max_tokens))
    metrics = settings.merged(figures).merged(checks)
    sources: dict[str, int] = {}
    for t in ok:
        sources[t.output_tokens_source] = sources.get(t.output_tokens_source, 0) + 1
    info = {
        "client": "perflab",
        "simulated": simulated,
        "time_scale": time_scale,
        "tokenizer": tok.kind,
        "tokenizer_exact": tok.exact,
        "dataset": req.dataset,
        "profile": req.profile,
        "base_urls": list(req.base_urls),
        "replicas": n_targets,
        "workers": req.workers,
        "http_stack": req.http_stack,
        "warmup": req.warmup,
        "percentiles": list(req.percentiles),
        "goodput": dict(req.goodput) or None,
        "input_tokens_source": "server" if ok and with_server == len(ok) else ("client" if with_server == 0 else "mixed"),
        "total_input_tokens_client": sum(t.prompt_len for t in ok),
        "prompt_len_mismatches": mismatched,
        "output_tokens_source": sources,
        # forced (ignore_eos), capped (max_tokens only), or counted: the engine cannot force
        # lengths (it refuses ignore_eos), the output tokens are what it generated
        "output_lengths": req.output_lengths,
        "pid": os.getpid(),
    }
    errors = [f"request {t.index}: {t.error}" for t in traces if not t.success][:MAX_KEPT_ERRORS]
    return BenchResult(
        metrics=metrics,
        errors=errors,
        requests=traces,
        info=info,
        percentiles=tuple(req.percentiles),
        percentile_metrics=tuple(req.percentile_metrics),
    )


__all__ = ["BenchCancelled", "Capture", "output_cap", "run_benchmark_sync"]
