"""Early stop: end a measured profile once the configuration has clearly lost, or once it is
over-saturated (issue #12 item 6; plan key ``early_stop``, ``perflab run --no-early-stop``).

The benchmark client reports its counts every :data:`perflab.bench.drive.OBSERVE_S` real
seconds (:class:`~perflab.bench.drive.Observation`); :class:`EarlyStop` cuts them into windows
of at least :data:`WINDOW_S` real seconds and :data:`WINDOW_ENGINE_S` engine seconds and
decides from the windows, never from one chunk:

*lost* (only when the study ranks by throughput and gives a figure to beat)
    The study ranks by the whole-run ``total_token_throughput``: (prompt + output tokens) /
    duration, counted as the server counts them (``usage``). While the run goes, the client
    knows the tokens processed so far, ``W`` (:meth:`EarlyStop._tokens`: the prompt and output
    tokens the ended requests reported, and for the others their prompts and their streamed
    events at the most tokens an event carries — an engine may stream several per event, as
    vLLM does when its API server is behind, and speculative decoding does), the engine time
    ``t``, and the prompt tokens still to process, ``P`` (every prompt is known before the
    run). The *steady-state rate* is the token rate of
    the windows after the warm window (:data:`STEADY_FROM` of the requests ended: the first
    batch's prefill burst is over); ``r`` is its upper confidence bound, ``mean + Z·sd/√k``
    over ``k >= MIN_WINDOWS`` windows.

    If the engine never processes tokens faster than ``r`` for the rest of the run (a run that
    sends its requests at once or at a steady pace drains its queue with no faster phase
    than its steady state: the burst is behind it, and the decode-only tail is the slowest
    part), the rest takes at least ``(P + O) / r`` engine seconds for the ``O`` output
    tokens still to come, so the run ends at ``f(O) = (W + P + O) / (t + (P + O) / r)`` at
    most. ``f`` moves monotonically from ``(W + P) / (t + P / r)`` towards ``r`` as ``O``
    grows, so over what may still come, ``O_low <= O <= O_high``, its most is at one end:

        ``bound = max(f(O_low), f(O_high))``

    ``O_low``: a lower confidence bound on the outputs of the requests not yet answering
    (:meth:`EarlyStop.outputs_to_come`). ``O_high``: the ``max_tokens`` of the requests not
    ended, less what they streamed (:meth:`EarlyStop.outputs_at_most`); where a request has
    none, ``f(O_high)`` is ``r``. In the tail, where the engine runs below ``r``, the run's
    own figure so far pulls ``f(O_high)`` down towards what the run will end at, so a
    configuration whose tail loses it is stopped there. The run stops when ``bound`` is below the figure to beat
    (times ``1 + min_improvement_pct / 100``): then its whole-run figure could not have been
    adopted. No reference run and no model of the engine is needed: the bound holds whatever
    the engine's prefill/decode balance, so a configuration with a slow start and a fast tail
    (AWQ at high batch) is judged by what it could still reach, never by how its start
    compares with another engine's. The steady state is the windows before :data:`STEADY_UNTIL`
    of the requests ended (after it, the tail: a slower phase); the decision may come later,
    with the steady rate as it was.

    The bound cannot see a run's tail, and a run that sends every request at once ends when
    its last request ends: a configuration whose steady state beats the figure to beat can
    lose through its tail alone (the demo's TensorRT-LLM runs 37 % longer than its steady
    rate would, the last of its long answers decoding alone). The *forecast*
    (:meth:`EarlyStop.forecast`) sees it, from what the client knows of every request still
    open: the engine takes requests first come, first served, each streams one token per
    step, and each says its ``max_tokens``. It replays them (:func:`replay`): ``concurrency``
    at a time (the steady state's mean of the requests answering), a step taking
    ``concurrency / rate`` while requests still wait (``rate``: the upper confidence bound of
    the slope of the events received against engine time, :func:`_slope`) and, once none
    waits, the least a decode step of that many sequences can take (:func:`drain_floor`: the
    warm-up's time per token and the steady state's decode step, through the two properties
    of a roofline). The run ends at the replay's end at the earliest, so its figure is at
    most the tokens it will have processed over that time; it stops when that is below the
    figure to beat by more than :data:`FORECAST_MARGIN`. It is made only where its premises
    are seen to hold (:meth:`EarlyStop.premises`): every request sent, the ended ones
    answering to their ``max_tokens`` (:data:`AT_CAP_SHARE`), a token per event, a measured
    warm-up, and requests begun in the order sent (:data:`OUT_OF_ORDER_SHARE`); otherwise
    the bound alone judges.

*over-saturated* (every measured profile, when requests arrive over time)
    For :data:`SATURATION_WINDOWS` windows in a row while requests are still arriving, the
    queue (arrived and not ended) grew and the mean latency of the requests that ended
    (arrival to end, queueing included) grew too, and the queue at least doubled: arrivals
    outrun the engine and latency grows without bound (guidellm's over-saturation stop).
    A profile that sends every request at once (the seeds' ``request_rate: inf``) never has
    a growing queue, so this never fires on it.

Window durations are engine seconds: the engine's own clock when the stream carries one
(``Observation.model_t``, perflab's simulator's model clock, from the run's stamped arrival,
``Observation.model_origin``), else real seconds × the time scale the client measures with.
No run is stopped as lost from a window in which the client went more than :data:`LAG_MAX_S`
without observing: its counts may be behind what the engine sent.

A stop sets the benchmark's cancel event: the client ends the run as a cancelled one
(no request or thread left behind) and the measurement is ``stopped-early`` with
:attr:`EarlyStop.decided` — the figures that decided — never a failure.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from perflab.bench.drive import Observation

WINDOW_S = 0.1  # real seconds a window lasts at least (the client's observation period)
WINDOW_ENGINE_S = 4.0  # ... and engine seconds: longer than one step's prefill/decode swing
STEADY_FROM = 0.05  # fraction of the requests ended before the steady state starts (warm window)
STEADY_UNTIL = 0.6  # ... and after which the tail starts (its windows do not set the steady rate)
MIN_WINDOWS = 6
# the most events of a streamed answer that carry no output token: vLLM's chat stream has 3
# (the role chunk, the usage chunk, ``[DONE]``; its completions stream 2), llama.cpp's server's
# chat stream 4 (a finishing chunk apart from the last token too) — tests/fixtures/real/ — and
# one to spare. Taken off each answer's events for the least output still to come, added to
# each open request's ``max_tokens`` for the most: either way the bound stays a bound.
FRAMING_EVENTS = 5
MIN_ANSWERED = 30  # answers an estimate of the outputs still to come needs
Z = 3.0  # one-sided: ~99.9 % for a normal mean
SATURATION_WINDOWS = 4
FORECAST_WINDOWS = 3  # steady windows with requests waiting the forecast's rate needs at least
# no run is stopped as lost from a window in which the client went longer than this without
# observing (real seconds): its counts may be behind what the engine sent (the real vLLM CPU
# build on two cores starves the client for seconds; the bound and the forecast each fell
# 4-6 % below the run's figure at such windows, never at others)
LAG_MAX_S = 1.0
# a run is stopped on its forecast only when the forecast is this far below the figure to beat:
# in 56 complete simulated runs (the demo's seven configurations on five ShareGPT-like samples
# from four windows, on three of them from three; 40-50 windows each) the forecast was at most
# 0.6 % below the figure the run then made
FORECAST_MARGIN = 0.01
# a window's decode step: this quantile of the steps its open requests streamed a token in (of
# at least MIN_STEPS): the steps that carried no prompt, or a little less
DECODE_QUANTILE = 0.1
MIN_STEPS = 20
# the forecast's premises (EarlyStop.forecast): of the ended requests with a max_tokens, at
# least this share answered all of it; and at most this many requests (a share of the run,
# at least OUT_OF_ORDER_MIN) began to answer while one sent before them still waited
AT_CAP_SHARE = 0.95
# the forecast assumes the steady state's event rate holds while requests wait; a window before
# it that streamed more than this many times its upper bound, or two of its windows this far
# apart, say it does not: requests sent at once with equal answers end together, and the next
# wave's prompts stall decode (a simulated SGLang at max_num_seqs 1024 streamed 11.8k events/s,
# then 0.4-0.7k: forecast 1911 tok/s for a run that made 9741). Steady runs stay well inside it
# (the real vLLM CPU build's windows: 3.3k-4.5k events/s).
RATE_SWING = 2.0
OUT_OF_ORDER_SHARE = 0.02
OUT_OF_ORDER_MIN = 8


def tokens_per_event(serve: Any) -> float | None:
    """The most output tokens one streamed event of a configuration (its ``ServeConfig``) may
    carry: engines stream one event per request per step (vLLM, SGLang and TensorRT-LLM at
    their default stream interval of 1), a speculative step up to ``num_speculative_tokens + 1``
    tokens; None when a speculative configuration does not say how many."""
    spec = getattr(serve, "speculative_config", None)
    if not spec:
        return 1.0
    try:
        return 1.0 + float(spec["num_speculative_tokens"])
    except (KeyError, TypeError, ValueError):
        return None


@dataclass
class _Window:
    t: float  # real seconds at its end
    rate: float  # events per engine second
    queue: int
    latency_ms: float | None  # mean latency of the requests that ended in it (engine ms)
    ended: int  # requests ended by its end
    arrived: int
    elapsed: float = 0.0  # engine seconds of the timed run at its end
    events: int = 0  # events received by its end
    token_rate: float = 0.0  # tokens processed (prompts answered + output) per engine second
    tokens: float = 0.0  # tokens processed by its end
    steady: bool = False  # after the warm window (it began once STEADY_FROM of the requests had ended)
    bound: float | None = None  # the most the whole run could still reach, as of its end (lost's figure)
    running: float = 0.0  # requests answering (the mean of its two ends)
    waiting: int = 0  # requests sent that had not begun to answer, at its end
    decode_step_s: float | None = None  # a low quantile of its steps (DECODE_QUANTILE): those without prompts
    lag_s: float = 0.0  # the longest the client went without observing in it (real seconds)
    forecast: float | None = None  # the whole run's forecast figure, as of its end (EarlyStop.forecast)


class EarlyStop:
    """The observer of one benchmark run (called in the benchmark's thread).

    ``to_beat``: the whole-run ``total_token_throughput`` the run must beat to be adopted (None:
    *lost* never fires); ``margin_pct``: the plan's ``min_improvement_pct``;
    ``tokens_per_event``: the most output tokens one streamed event may carry (None: unknown,
    *lost* never fires)."""

    def __init__(self, *, num_prompts: int, cancel: threading.Event, to_beat: float | None = None,
                 margin_pct: float = 0.0, tokens_per_event: float | None = 1.0, saturation: bool = True) -> None:
        self.n = max(1, num_prompts)
        self.scale = 1.0  # engine seconds per real second: each observation says
        self.cancel = cancel
        self.to_beat = to_beat
        self.margin_pct = max(0.0, margin_pct)
        self.tokens_per_event = tokens_per_event
        self.saturation = saturation
        self.windows: list[_Window] = []
        self._last: Observation | None = None
        self._mark: Observation | None = None  # the observation that began the current window
        self.decided: dict[str, Any] | None = None
        self._model0: float | None = None  # the first model-clock stamp seen (the simulator's)
        self._gaps: list[float] = []  # the current window's steps (engine seconds)
        self._lag = 0.0  # the current window's longest time between two observations (real seconds)
        self._seen_t: float | None = None  # the latest observation's time
        self.unmet: str | None = None  # the forecast's premise that did not hold, at the latest window

    def __call__(self, obs: Observation) -> None:
        if self.decided is not None:
            return
        self._last = obs
        if self._model0 is None and obs.model_t is not None:
            self._model0 = obs.model_t
        self.scale = obs.time_scale  # the scale the bench client measures with (the server's own)
        unit = 1.0 if obs.model_t is not None else self.scale
        self._gaps.extend(g * unit for g in obs.step_gaps if g > 0)
        if self._seen_t is not None:
            self._lag = max(self._lag, obs.t - self._seen_t)
        self._seen_t = obs.t
        if self._mark is None:
            self._mark = Observation(0.0, 0, 0, 0, 0, 0, 0.0)
        m = self._mark
        if obs.t - m.t < WINDOW_S * (1 - 1e-6):
            return
        if obs.model_t is not None and m.model_t is not None:  # the engine's own clock: host load does not move it
            dt = obs.model_t - m.model_t
        else:
            dt = (obs.t - m.t) * self.scale
        opening = m.model_t is None and obs.model_t is not None  # the first stamp: that window closes at once
        if dt <= 0 or (dt < WINDOW_ENGINE_S * (1 - 1e-6) and not opening):
            return  # widen the window
        ended_new = obs.completed - m.completed
        latency = (obs.latency_s - m.latency_s) / ended_new * self.scale * 1000 if ended_new > 0 else None
        ended = obs.completed + obs.failed
        tokens, tokens0 = self._tokens(obs), self._tokens(m)
        self.windows.append(_Window(obs.t, (obs.events - m.events) / dt, obs.arrived - ended, latency, ended,
                                    obs.arrived, self.elapsed_s(), obs.events, (tokens - tokens0) / dt,
                                    tokens, m.completed + m.failed >= STEADY_FROM * self.n,
                                    running=(obs.running + m.running) / 2,
                                    waiting=max(0, obs.arrived - obs.answered - obs.failed),
                                    decode_step_s=_quantile(self._gaps, DECODE_QUANTILE, MIN_STEPS),
                                    lag_s=round(self._lag, 3)))
        self._gaps, self._lag = [], 0.0
        self._mark = obs
        b = self.bound()
        self.windows[-1].bound = round(b["bound"], 2) if b is not None else None
        f = self.forecast()
        self.windows[-1].forecast = round(f["forecast"], 2) if f is not None else None
        self._decide(b, f)

    def _tokens(self, obs: Observation) -> float:
        """Tokens processed so far, counted as the run's whole-run figure counts them (the
        server's ``usage`` where it reports one): the prompts answered and the output tokens
        the ended requests reported, and for the others, their prompts (the client's count,
        at the server's tokens per client token so far: :meth:`_prompt_scale`) and their
        events at the most tokens an event carries — ``tokens_per_event``, or more where the
        ended requests' own counts say so.

        Counting events and the client's prompt tokens undercounted the real vLLM CPU build:
        with 3000 requests at once it sent 110 events for 128 tokens (its API server merges a
        request's deltas while it is behind) and counted 47 prompt tokens where the client
        counted 32, so a bound on those counts ended 10 % below the whole-run figure it was
        to bound."""
        per_event = self.tokens_per_event or 1.0
        if obs.usage_events > 0:
            per_event = max(per_event, obs.usage_tokens / obs.usage_events)
        prompts = obs.usage_prompt_tokens + (obs.prompt_tokens - obs.usage_prompt_client) * self._prompt_scale(obs)
        return prompts + obs.usage_tokens + (obs.events - obs.usage_events) * per_event

    @staticmethod
    def _prompt_scale(obs: Observation) -> float:
        """The server's prompt tokens per client-counted prompt token, over the ended requests
        that reported both (1 before any did)."""
        if obs.usage_prompt_client > 0 and obs.usage_prompt_tokens > 0:
            return obs.usage_prompt_tokens / obs.usage_prompt_client
        return 1.0

    # ------------------------------------------------------------------ figures

    def steady_windows(self) -> list[_Window]:
        """The windows of the steady state: those that began after the warm window and ended
        before the tail."""
        return [w for w in self.windows if w.steady and w.ended <= STEADY_UNTIL * self.n]

    def bound(self) -> dict[str, float] | None:
        """The most the run's whole-run throughput can reach (module docstring), with the figures
        it comes from; None before :data:`MIN_WINDOWS` steady windows."""
        steady = self.steady_windows()
        last = self._last
        k = len(steady)
        if k < MIN_WINDOWS or last is None or not last.prompt_tokens_total:
            return None
        rates = [w.token_rate for w in steady]
        mean = sum(rates) / k
        sd = math.sqrt(sum((x - mean) ** 2 for x in rates) / (k - 1))
        r = mean + Z * sd / math.sqrt(k)
        if r <= 0:
            return None
        done, t = self._tokens(last), self.elapsed_s()
        prompts = max(0, last.prompt_tokens_total - last.prompt_tokens) * self._prompt_scale(last)
        low, high = prompts + self.outputs_to_come(last), self.outputs_at_most(last)

        def whole(left: float) -> float:  # the whole run's figure if ``left`` more tokens come at ``r``
            return (done + left) / (t + left / r)

        # monotonic in ``left``: the most is at one end of what may still come (r: no end known)
        out = {"bound": max(whole(low), r if high is None else whole(prompts + high)), "steady_rate": mean,
               "steady_rate_upper": r, "windows": k, "tokens_done": done, "tokens_left_at_least": low}
        if high is not None:
            out["tokens_left_at_most"] = prompts + high
        return out

    def forecast(self, expected: bool = False) -> dict[str, Any] | None:
        """The whole run's figure forecast from the requests still open, one by one (module
        docstring, *lost*: the forecast), with the figures it comes from; None before
        :data:`FORECAST_WINDOWS` steady windows with requests waiting, or while a premise does
        not hold (:meth:`premises`). ``expected``: the steady rate itself instead of its
        upper confidence bound (the full-method estimate of a stopped run)."""
        last = self._last
        self.unmet = self.premises()
        # (premises() holds only with the open requests and the warm-up's step known: said again for mypy)
        if last is None or self.unmet is not None or last.open_requests is None or last.warm_step_s is None:
            return None
        span = self.queue_windows()
        if len(span) < FORECAST_WINDOWS + 1:
            return None
        # while requests wait, the engine streams events at a steady rate: the slope of the
        # events received against engine time, and its upper confidence bound
        mean_rate, upper = _slope([w.elapsed for w in span], [float(w.events) for w in span], Z)
        rate = mean_rate if expected else upper
        # the premise under the rate: it holds while requests wait. Windows before the steady
        # state far faster than its upper bound, or windows within it far apart, say it does not
        kept = [w.rate for w in span[1:] if w.lag_s <= LAG_MAX_S]
        peak = max((w.rate for w in self.windows if not w.steady and w.lag_s <= LAG_MAX_S), default=0.0)
        if peak > RATE_SWING * upper or (kept and max(kept) > RATE_SWING * min(kept)):
            self.unmet = ("the engine's rate while requests waited was not steady (waves: a batch that ends "
                          "together, then the next one's prompts)")
            return None
        conc = sum(w.running for w in span[1:]) / (len(span) - 1)
        open_ = last.open_requests()
        if open_ is None or mean_rate <= 0 or conc <= 0:
            return None
        if open_.out_of_order > max(OUT_OF_ORDER_MIN, OUT_OF_ORDER_SHARE * self.n):
            self.unmet = "the engine did not take the requests first come, first served"
            return None
        step = conc / rate  # a step gives each request answering one token
        decode = [w.decode_step_s for w in span[1:] if w.decode_step_s is not None]
        decode_step = sorted(decode)[len(decode) // 2] if decode else None
        left = replay(open_.answering_left, open_.waiting_caps, max(1, round(conc)), step,
                      drain_floor(last.warm_step_s, last.warm_batch, conc, conc / mean_rate, decode_step))
        t = self.elapsed_s()
        prompts = max(0, last.prompt_tokens_total - last.prompt_tokens) * self._prompt_scale(last)
        tokens = self._tokens(last) + prompts + (self.outputs_at_most(last) or 0.0)
        return {"forecast": tokens / (t + left), "end_s": t + left, "tokens": tokens, "concurrency": conc,
                "event_rate": rate, "step_s": step, "drain_step_s": last.warm_step_s, "warm_batch": last.warm_batch,
                "decode_step_s": decode_step,
                "windows": len(span) - 1, "waiting": len(open_.waiting_caps), "answering": len(open_.answering_left)}

    def queue_windows(self) -> list[_Window]:
        """The windows of the steady state while requests wait, after the window before them
        (where the span begins): what the forecast's rate is measured over."""
        first = next((i for i, w in enumerate(self.windows) if w.steady), None)
        if first is None or first == 0:
            return []
        span = [self.windows[first - 1]]
        for w in self.windows[first:]:
            if w.waiting <= 0:
                break
            span.append(w)
        return span

    def premises(self) -> str | None:
        """Why the forecast may not be made now (None: it may): what it takes from the run and
        the engine has to be seen to hold — requests taken first come, first served, every
        request sent, the ended ones answering to their ``max_tokens``, a token per event,
        and a measured warm-up."""
        last = self._last
        if last is None or last.open_requests is None or last.output_cap_open is None:
            return "the requests' max_tokens are not known"
        if self.tokens_per_event != 1.0:
            return "an event may carry several tokens (speculative decoding)"
        if last.warm_step_s is None or last.warm_batch < 1:
            return "no warm-up was measured"
        if last.arrived < self.n:
            return "requests are still arriving"
        if last.ended_capped < MIN_ANSWERED or last.ended_at_cap < AT_CAP_SHARE * last.ended_capped:
            return "the ended requests did not answer to their max_tokens"
        if last.usage_events > 0 and last.usage_tokens > last.usage_events:
            return "the engine streamed several tokens in one event"
        return None

    def outputs_at_most(self, obs: Observation) -> float | None:
        """At most how many tokens (as counted: events × ``tokens_per_event``) the requests
        not yet ended will still stream: their ``max_tokens`` and framing, less the events they
        sent (None: a request without ``max_tokens``). An engine never answers past a request's
        ``max_tokens``, end of sequence or not."""
        if obs.output_cap_open is None:
            return None
        open_ = max(0, self.n - obs.completed - obs.failed)
        events = obs.output_cap_open + FRAMING_EVENTS * open_ - obs.events_open
        return max(0, events) * (self.tokens_per_event or 1.0)

    def outputs_to_come(self, obs: Observation) -> float:
        """At least how many output tokens the requests that have not begun to answer will
        stream (99.9 % one-sided): they are a random draw from the same workload as those
        that have (requests are admitted in the order they were sent, and a dataset's order
        does not depend on output lengths), whose events so far (complete for the ended, a
        floor for the running, less the framing) bound their mean from below."""
        k = obs.answered
        if k < MIN_ANSWERED:
            return 0.0
        mean = obs.answered_events / k
        var = max(0.0, obs.answered_events_sq / k - mean * mean) * k / (k - 1)
        low = mean - FRAMING_EVENTS - Z * math.sqrt(var / k)
        return max(0, self.n - k) * max(0.0, low)

    def elapsed_s(self) -> float:
        """Engine seconds of the timed run so far: on the engine's own clock when the stream
        carries one (the simulator's: host load does not move it), else real seconds × scale."""
        last = self._last
        if last is not None and last.model_t is not None:
            origin = last.model_origin if last.model_origin is not None else self._model0
            if origin is not None:
                return last.model_t - origin
        return (last.t if last is not None else 0.0) * self.scale

    def to_json(self) -> dict[str, Any]:
        """Every window, the bound and the decision (the run's ``earlystop-*.json``)."""
        return {"num_prompts": self.n, "to_beat": self.to_beat, "margin_pct": self.margin_pct,
                "tokens_per_event": self.tokens_per_event, "decided": self.decided, "bound": self.bound(),
                "forecast": self.forecast(), "forecast_unmet": self.unmet,
                "windows": [dataclasses.asdict(w) for w in self.windows]}

    def _stop(self, reason: str, **figures: Any) -> None:
        last = self._last
        self.decided = {"reason": reason, "completed": last.completed if last else 0, "num_prompts": self.n,
                        "elapsed_s": round(self.elapsed_s(), 3), "estimated_full_s": round(self.estimated_full_s(), 3),
                        **figures}
        self.cancel.set()

    def _limit(self) -> float:
        return (self.to_beat or 0.0) * (1 + self.margin_pct / 100)

    def _decide(self, b: dict[str, float] | None, f: dict[str, Any] | None = None) -> None:
        if self.to_beat is not None and self.tokens_per_event is not None and self.windows[-1].lag_s <= LAG_MAX_S:
            limit = self._limit()
            if b is not None and b["bound"] < limit:
                self._stop("lost", bound_token_throughput=round(b["bound"], 2),
                           steady_token_rate=round(b["steady_rate"], 2),
                           steady_token_rate_upper=round(b["steady_rate_upper"], 2),
                           to_beat=round(self.to_beat, 2), limit=round(limit, 2), windows=b["windows"],
                           margin_pct=self.margin_pct, confidence_z=Z)
                return
            if f is not None and f["forecast"] < limit * (1 - FORECAST_MARGIN):
                self._stop("lost", forecast_token_throughput=round(f["forecast"], 2),
                           forecast_end_s=round(f["end_s"], 2), concurrency=round(f["concurrency"], 1),
                           step_ms=round(1000 * f["step_s"], 2), drain_step_ms=round(1000 * f["drain_step_s"], 2),
                           waiting=f["waiting"], to_beat=round(self.to_beat, 2), limit=round(limit, 2),
                           windows=f["windows"], margin_pct=self.margin_pct, confidence_z=Z)
                return
        if self.saturation and len(self.windows) > SATURATION_WINDOWS:
            last = self.windows[-(SATURATION_WINDOWS + 1):]
            if last[-1].arrived >= self.n:
                return  # every request has arrived: the queue can only drain from here
            lat = [w.latency_ms for w in last]
            growing = all(b.queue > a.queue for a, b in itertools.pairwise(last))
            slower = all(a is not None and b is not None and b > a for a, b in itertools.pairwise(lat))
            if growing and slower and last[-1].queue >= 2 * max(1, last[0].queue):
                self._stop("over-saturated", queue=[w.queue for w in last],
                           latency_ms=[round(x or 0.0, 1) for x in lat], windows=len(last),
                           window_s=round(sum(b.elapsed - a.elapsed for a, b in itertools.pairwise(last))
                                          / SATURATION_WINDOWS, 3))

    def estimated_full_s(self) -> float:
        """The engine seconds the whole run would have taken: where the forecast may be made,
        its end with the steady state's means; else, with every request's ``max_tokens``
        known, the most still to come at the rate of the latest window (in a tail, its own
        slow pace); else extrapolated by the share of requests ended."""
        last = self._last
        f = self.forecast(expected=True)
        if f is not None:
            return float(f["end_s"])
        b = self.bound()
        recent = self.windows[-1].token_rate if self.windows else 0.0
        if b is not None and "tokens_left_at_most" in b and recent > 0:
            return self.elapsed_s() + b["tokens_left_at_most"] / recent
        ended = (last.completed + last.failed) if last is not None else 0
        return self.elapsed_s() * self.n / ended if ended else self.elapsed_s()


def _slope(ts: Sequence[float], ys: Sequence[float], z: float) -> tuple[float, float]:
    """The least-squares slope of ``ys`` against ``ts``, and that plus ``z`` standard errors.
    Fitted to the cumulative counts, not averaged over windows' rates: an observation that
    lands a little early or late moves one point off the line, not two windows' rates apart."""
    n = len(ts)
    tm, ym = sum(ts) / n, sum(ys) / n
    sxx = sum((t - tm) ** 2 for t in ts)
    if n < 3 or sxx <= 0:
        return 0.0, 0.0
    slope = sum((t - tm) * (y - ym) for t, y in zip(ts, ys, strict=True)) / sxx
    resid = sum((y - ym - slope * (t - tm)) ** 2 for t, y in zip(ts, ys, strict=True))
    return slope, slope + z * math.sqrt(resid / (n - 2) / sxx)


def drain_floor(warm_step_s: float, warm_batch: int, concurrency: float, step_s: float,
                decode_step_s: float | None) -> Callable[[int], float]:
    """The least a decode step of ``b`` sequences can take once no request waits.

    A decode step's time is a roofline — the larger of the time to read the weights and the
    sequences' KV cache and the time to compute their tokens, each an affine function of
    ``b`` with a non-negative intercept — plus a fixed overhead (and the longer contexts of a
    run's last requests only add to it). Such a function never falls as ``b`` grows, and its
    time per sequence never rises. So from the warm-up's batch up, a step takes at least the
    warm-up's time per token (``warm_step_s`` at ``warm_batch``) and at least the steady
    state's decode step shared out, ``decode_step_s × b / concurrency`` (the steps that
    carried no prompt: a low quantile, which errs low). Below the warm-up's batch the function
    lies above the line through the warm-up's point whose slope is the steady state's mean
    step's (``step_s``, prompts included: above a decode step) — a convex function lies above
    its chords' extensions — and above ``warm_step_s × b / warm_batch``."""
    w = max(1, min(warm_batch, int(concurrency)))
    slope = (step_s - warm_step_s) / (concurrency - w) if concurrency > w and step_s > warm_step_s else warm_step_s / w
    shared = decode_step_s / concurrency if decode_step_s is not None and concurrency > 0 else 0.0

    def floor(b: int) -> float:
        if b >= w:
            return max(warm_step_s, shared * b)
        return max(warm_step_s * b / w, warm_step_s - (w - b) * slope)

    return floor


def _quantile(xs: list[float], q: float, least: int) -> float | None:
    """The ``q`` quantile of ``xs`` (None with fewer than ``least``)."""
    if len(xs) < least:
        return None
    return sorted(xs)[int(q * (len(xs) - 1))]


def replay(answering_left: Sequence[int], waiting_caps: Sequence[int], width: int, step_s: float,
           drain: Callable[[int], float]) -> float:
    """Engine seconds until the last of the open requests ends: ``width`` at a time, first
    come first served, one token per step each; a step takes ``step_s`` while requests wait
    (the steady state) and ``drain(b)`` for ``b`` sequences once none waits. The requests
    answering have ``answering_left`` tokens to go, the waiting ones their ``max_tokens``."""
    heap = [max(1, x) for x in answering_left]
    pending = iter(waiting_caps)
    queued = len(waiting_caps)
    while len(heap) < width and queued:
        heap.append(max(1, next(pending)))
        queued -= 1
    heapq.heapify(heap)
    done = 0  # steps taken: a request on the heap ends at step ``value``
    elapsed = 0.0
    while heap:
        steps = heap[0] - done
        elapsed += steps * (step_s if queued else drain(len(heap)))
        done = heap[0]
        while heap and heap[0] <= done:
            heapq.heappop(heap)
            if queued:
                heapq.heappush(heap, done + max(1, next(pending)))
                queued -= 1
    return elapsed
