"""Early stop's forecast (perflab.lab.run.earlystop: EarlyStop.forecast, replay, drain_floor).

A run that sends every request at once ends when its last request ends, and which request
that is and when it starts are known to the client: the engine takes requests first come,
first served, and every request says its ``max_tokens``. These tests drive the observer with
a scripted engine of that kind — a batch of ``width`` requests, one token per request per
step, a step's time a roofline of the batch plus the prompts it takes in — and check that the
forecast stops a configuration that loses through its last request, never one that wins,
and is made only where what it rests on is seen to hold.
"""

from __future__ import annotations

import heapq
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from perflab.bench.drive import Observation, OpenRequests
from perflab.lab.run.earlystop import FORECAST_MARGIN, EarlyStop, drain_floor, replay
from perflab.lab.study import stopped_early_text


@dataclass
class Roofline:
    """A step's time: the larger of reading (weights + KV per sequence) and computing (per
    sequence), a fixed overhead, and the prompt tokens it takes in."""

    read_s: float = 0.040
    kv_s: float = 0.00005
    compute_s: float = 0.0004
    overhead_s: float = 0.002
    prompt_s: float = 0.0003

    def __call__(self, b: int, prompt_tokens: int = 0) -> float:
        return max(self.read_s + self.kv_s * b, self.compute_s * b) + self.overhead_s + self.prompt_s * prompt_tokens


@dataclass
class Scripted:
    """Every request sent at once, taken first come first served, ``width`` at a time."""

    caps: list[int]
    prompts: list[int]
    width: int
    cost: Roofline = field(default_factory=Roofline)
    observe_s: float = 2.0  # engine seconds between observations
    warm_batch: int = 8
    stop_at_cap: bool = True  # False: every request ends at half its max_tokens (an EOS)
    out_of_order: bool = False  # True: take the last requests first
    # prompt tokens per step when admitted prompts are computed in chunks before any token is
    # decoded (None: all in the admitting step, decoding on): a wave's prompts then stall decode
    chunk: int | None = None

    def figure(self) -> float:
        """The whole-run total token throughput of the complete run."""
        duration, outputs = self._run(None)
        return (sum(self.prompts) + outputs) / duration

    def drive(self, es: EarlyStop) -> float:
        """Feed ``es`` observations until the run ends or it stops it; the engine seconds it ran."""
        return self._run(es)[0]

    def _run(self, es: EarlyStop | None) -> tuple[float, int]:
        n = len(self.caps)
        lengths = [c if self.stop_at_cap else max(2, c // 2) for c in self.caps]
        order = list(range(n))[::-1] if self.out_of_order else list(range(n))
        queue = iter(order)
        left = n
        events = [0] * n
        answering: dict[int, None] = {}
        ended: set[int] = set()
        t, next_obs, gaps = 0.0, self.observe_s, []
        usage = completed_prompts = 0
        while left or answering:
            admitted = []
            while len(answering) < self.width and left:
                i = next(queue)
                left -= 1
                answering[i] = None
                admitted.append(i)
            pending = sum(self.prompts[i] for i in admitted)
            if self.chunk is not None and pending > self.chunk:  # prompt-only steps first: nobody streams
                while pending > self.chunk:
                    t += self.cost(0, self.chunk)
                    pending -= self.chunk
                    if es is not None and t >= next_obs:
                        next_obs = t + self.observe_s
                        es(self._observation(t, events, answering, ended, usage, completed_prompts, gaps))
                        gaps = []
                        if es.decided is not None:
                            return t, usage
            dt = self.cost(len(answering), pending)
            t += dt
            for i in list(answering):
                events[i] += 1
                if events[i] >= 2:
                    gaps.append(dt)
                if events[i] >= lengths[i]:
                    del answering[i]
                    ended.add(i)
                    usage += events[i]
                    completed_prompts += self.prompts[i]
            if es is not None and (t >= next_obs or not answering):
                next_obs = t + self.observe_s
                es(self._observation(t, events, answering, ended, usage, completed_prompts, gaps))
                gaps = []
                if es.decided is not None:
                    return t, usage
        return t, usage

    def _observation(self, t: float, events: list[int], answering: dict[int, None], ended: set[int], usage: int,
                     completed_prompts: int, gaps: list[float]) -> Observation:
        n = len(self.caps)
        begun = [i for i in range(n) if events[i] > 0]
        order = list(range(n))[::-1] if self.out_of_order else list(range(n))
        waiting = [i for i in order if events[i] == 0]

        def open_requests() -> OpenRequests:
            first_wait = min(waiting) if waiting else n
            behind = sum(1 for i in begun if i > first_wait)
            return OpenRequests(tuple(self.caps[i] - events[i] for i in range(n) if i in answering),
                                tuple(self.caps[i] for i in range(n) if events[i] == 0), behind)

        ended_at_cap = sum(1 for i in ended if events[i] >= self.caps[i])
        return Observation(
            t / 40, n, len(ended), 0, n - len(ended), sum(events), 0.0, time_scale=40.0, model_t=t, model_origin=0.0,
            prompt_tokens=sum(self.prompts[i] for i in begun), prompt_tokens_total=sum(self.prompts),
            answered=len(begun), output_cap_open=sum(self.caps[i] for i in range(n) if i not in ended),
            events_open=sum(events[i] for i in answering), usage_tokens=usage, usage_events=usage,
            usage_prompt_tokens=completed_prompts, usage_prompt_client=completed_prompts, running=len(answering),
            ended_capped=len(ended), ended_at_cap=ended_at_cap, open_requests=open_requests,
            warm_step_s=self.cost(self.warm_batch), warm_batch=self.warm_batch, step_gaps=tuple(gaps))


def _workload(n: int, seed: int, long_at: int | None) -> tuple[list[int], list[int]]:
    """ShareGPT-like lengths; one answer of 1600 tokens at position ``long_at`` (None: none)."""
    rng = random.Random(seed)
    caps = [max(4, min(900, round(rng.lognormvariate(4.9, 0.7)))) for _ in range(n)]
    prompts = [max(4, min(1000, round(rng.lognormvariate(5.0, 0.9)))) for _ in range(n)]
    if long_at is not None:
        caps[long_at] = 1600
    return caps, prompts


def _observer(to_beat: float) -> tuple[EarlyStop, threading.Event]:
    cancel = threading.Event()
    return EarlyStop(num_prompts=1000, cancel=cancel, to_beat=to_beat), cancel


def test_a_run_that_loses_through_its_last_request_is_stopped_long_before_its_end() -> None:
    """Its steady state streams faster than the figure to beat, so no bound on the steady
    state stops it; but its longest answer is near the back of the queue, starts late and
    streams alone at the end. The forecast, from the requests still open one by one, sees it."""
    caps, prompts = _workload(1000, 1, long_at=950)
    run = Scripted(caps, prompts, width=96)
    full = run.figure()
    early, _ = _observer(1.0)
    duration = run.drive(early)
    assert early.decided is None  # (a figure every run beats: the script ran to its end)
    to_beat = 1.04 * full  # 4 % better than this run will end
    assert early.bound()["steady_rate"] > 1.1 * to_beat  # ... and well below this run's own steady state

    es, cancel = _observer(to_beat)
    run.drive(es)
    assert cancel.is_set() and es.decided is not None
    d = es.decided
    assert d["reason"] == "lost" and "forecast_token_throughput" in d and "bound_token_throughput" not in d
    assert d["elapsed_s"] < 0.5 * duration
    # the forecast errs high, never low: at most what the run then made, once it stopped it
    assert full <= d["forecast_token_throughput"] < d["limit"]
    assert d["forecast_end_s"] <= duration
    # ... and at every window before, on this run's own end, it was never below it by the margin
    assert all(w.forecast is None or w.forecast > (1 - FORECAST_MARGIN) * full for w in early.windows)
    text = stopped_early_text(d)
    assert text.startswith("lost after ") and ": its open requests, first come first served, end ~" in text
    assert "at the earliest, so it could reach at most" in text


def test_the_same_run_with_its_longest_answer_in_front_wins_and_is_never_stopped() -> None:
    caps, prompts = _workload(1000, 1, long_at=5)
    front = Scripted(caps, prompts, width=96)
    back = Scripted(*_workload(1000, 1, long_at=950), width=96)
    assert front.figure() > 1.04 * back.figure()
    es, cancel = _observer(1.02 * back.figure())
    front.drive(es)
    assert es.decided is None and not cancel.is_set()
    forecasts = [w.forecast for w in es.windows if w.forecast is not None]
    assert forecasts and min(forecasts) > (1 - FORECAST_MARGIN) * front.figure()


@pytest.mark.parametrize("width", [16, 64, 256])
def test_the_forecast_never_falls_below_what_the_run_makes(width: int) -> None:
    """Across batch widths (a weight-bound engine at 16, a compute-bound one at 256) and
    workloads, no window's forecast is below the complete run's figure by as much as the
    margin a stop needs (FORECAST_MARGIN): the statistics of three windows can err a little
    low, never that much."""
    for seed in range(3):
        caps, prompts = _workload(1000, seed, long_at=random.Random(seed).randrange(1000))
        run = Scripted(caps, prompts, width=width)
        full = run.figure()
        es, _ = _observer(0.5 * full)
        run.drive(es)
        forecasts = [w.forecast for w in es.windows if w.forecast is not None]
        assert forecasts, (width, seed, es.unmet)
        assert min(forecasts) > (1 - FORECAST_MARGIN) * full, (width, seed, min(forecasts), full)


@pytest.mark.parametrize(("change", "unmet"), [
    ({"stop_at_cap": False}, "the ended requests did not answer to their max_tokens"),
    ({"out_of_order": True}, "the engine did not take the requests first come, first served"),
])
def test_no_forecast_where_what_it_rests_on_is_not_seen(change: dict, unmet: str) -> None:
    caps, prompts = _workload(1000, 1, long_at=950)
    run = Scripted(caps, prompts, width=96, **change)
    es, cancel = _observer(10 * run.figure())  # a figure it cannot reach: only the forecast's premises keep it going
    es.margin_pct = 0.0
    run.drive(es)
    assert all(w.forecast is None for w in es.windows)
    assert es.unmet == unmet
    # the bound still judges it (it cannot reach ten times its own figure)
    assert es.decided is not None and "bound_token_throughput" in es.decided


def test_no_forecast_from_a_steady_state_that_opens_on_the_next_waves_prompts() -> None:
    """Every request sent at once with equal answers: a batch ends together, and the next one's
    prompts, computed in chunks, stall decode for a while. The steady state (from 5 % of the
    requests ended) opens on that stall: its rate is not the run's, and a forecast from it
    would stop a run that goes on to make many times its figure. The windows before it, which
    streamed at several times that rate, say so."""
    n, width = 1000, 256
    run = Scripted([256] * n, [512] * n, width=width, chunk=2048, observe_s=1.0)
    full = run.figure()
    es, cancel = _observer(0.9 * full)  # a figure this run beats
    run.drive(es)
    assert es.decided is None and not cancel.is_set()
    assert any(w.steady and w.waiting for w in es.windows)
    # (made from the stall and the decode after it, a forecast erred 9 % low)
    assert all(w.forecast is None for w in es.windows)
    stalled = Scripted([256] * n, [512] * n, width=width, chunk=2048, observe_s=1.0)
    es = EarlyStop(num_prompts=n, cancel=threading.Event(), to_beat=10 * full)
    stalled.drive(es)  # stopped on its bound, while requests still waited
    assert es.decided is not None and es.unmet is not None and "not steady" in es.unmet


def test_no_forecast_under_speculative_decoding() -> None:
    caps, prompts = _workload(1000, 1, long_at=950)
    es = EarlyStop(num_prompts=1000, cancel=threading.Event(), to_beat=1.0, tokens_per_event=5.0)
    Scripted(caps, prompts, width=96).drive(es)
    assert all(w.forecast is None for w in es.windows) and es.unmet is not None and "speculative" in es.unmet


# ----------------------------------------------------------------------- the parts


def test_replay_takes_requests_first_come_first_served() -> None:
    # one slot: 3 tokens left, then 5, then 2 — at 1 s a step while requests wait, 0.5 s after
    assert replay([3], [5, 2], 1, 1.0, lambda b: 0.5) == pytest.approx(3 * 1.0 + 5 * 1.0 + 2 * 0.5)
    # two slots: the long one at the back decides the end
    end = replay([1, 1], [1, 1, 10], 2, 1.0, lambda b: 0.5)
    assert end == pytest.approx(1 + 1 + 1 * 0.5 + 9 * 0.5)
    assert replay([], [], 4, 1.0, lambda b: 1.0) == 0.0


def _rooflines(seed: int) -> Callable[[], Roofline]:
    rng = random.Random(seed)
    return lambda: Roofline(read_s=rng.uniform(0.001, 0.08), kv_s=rng.uniform(0, 0.001), compute_s=rng.uniform(0, 0.003),
                            overhead_s=rng.uniform(0, 0.01), prompt_s=rng.uniform(0, 0.001))


def test_the_drain_floor_never_exceeds_a_roofline_step() -> None:
    """What drain_floor rests on: for any roofline (weights + KV read, compute, overhead),
    from its warm-up point, its decode step at the steady batch (or less), and a steady step
    with prompts (or more), the floor is at or below the step at every batch size."""
    make = _rooflines(7)
    rng = random.Random(8)
    for _ in range(2000):
        f = make()
        w = rng.choice([1, 4, 8, 16])
        conc = rng.randint(2, 512)
        decode = f(conc) * rng.uniform(0.5, 1.0)  # a low quantile errs low
        step = f(conc, rng.randint(0, 8192))  # steps that took prompts in: at least a decode step
        floor = drain_floor(f(min(w, conc)), w, conc, step, decode)
        for b in range(1, conc + 1):
            assert floor(b) <= f(b) * (1 + 1e-9), (f, w, conc, b, floor(b), f(b))


def test_the_drain_floor_is_the_warm_up_from_its_batch_up_and_rises_with_the_batch() -> None:
    floor = drain_floor(0.015, 8, 256, 0.28, 0.165)
    assert floor(8) == floor(20) == 0.015
    assert floor(128) == pytest.approx(0.165 / 2)  # the decode step shared out
    assert all(floor(b) <= floor(b + 1) for b in range(1, 256))
    assert drain_floor(0.015, 8, 256, 0.28, None)(200) == 0.015  # no decode step measured
