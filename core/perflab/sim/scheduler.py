"""A continuous-batching scheduler in simulated time (pure, synchronous).

Modelled on vLLM's V1 scheduler, the common shape of today's engines:

- each step has a token budget (``max_batched_tokens``) and a sequence cap (``max_num_seqs``);
- running requests go first: decoding sequences take ``1 + spec_tokens`` positions each,
  partially prefilled prompts their next chunk;
- waiting requests are admitted first-come-first-served while budget, sequence slots and
  free KV-cache blocks last; with chunked prefill a prompt is split across steps, without it a
  prompt waits until it fits in one step's budget whole;
- KV cache is allocated in blocks as tokens are computed; when a decoding sequence needs a
  block and none is free, the most recently admitted request is preempted (its KV freed, to
  be recomputed later), as vLLM does;
- with prefix caching, the prompt's full blocks that are still in the cache (blocks of
  finished requests, kept until their space is needed) are not computed again.

:meth:`Scheduler.step` plans one step, advances every request and returns the step's
simulated duration (from :class:`perflab.sim.perfmodel.CostModel`) and the tokens each request
emitted. The HTTP runtime sleeps that long (divided by the time scale) before delivering them;
:func:`simulate` runs a whole workload offline for tests and calibration.
"""

from __future__ import annotations

import math
import random
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from perflab.sim.perfmodel import CostModel, Knobs, StepShape

Sink = Callable[[int, bool], None]  # (tokens emitted this step, finished)


@dataclass(eq=False)
class SimRequest:
    prompt_tokens: int
    output_tokens: int  # the length it will stop at (max_tokens, or an earlier EOS)
    block_hashes: tuple[int, ...] = ()  # prompt block hashes, for prefix caching
    sink: Sink | None = None
    arrival: float = 0.0  # simulated seconds
    seed: int = 0
    # progress ------------------------------------------------------------------------
    target: int = 0  # tokens whose KV must be computed before decoding (prompt [+ output])
    target_output: int = 0  # generated tokens included in target (after a preemption)
    computed: int = 0  # of those, computed (or found in the prefix cache)
    generated: int = 0
    cached_tokens: int = 0
    blocks: int = 0
    first_token_at: float | None = None
    finished_at: float | None = None
    preemptions: int = 0
    aborted: bool = False
    _rng: random.Random | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.target = self.prompt_tokens

    @property
    def decoding(self) -> bool:
        return self.computed >= self.target

    @property
    def remaining(self) -> int:
        return self.output_tokens - self.generated

    @property
    def context(self) -> int:
        return self.computed + (self.generated - self.target_output if self.decoding else 0)


@dataclass(frozen=True)
class StepResult:
    duration: float  # simulated seconds
    emitted: tuple[tuple[SimRequest, int, bool], ...]  # (request, tokens, finished)
    shape: StepShape
    running: int
    waiting: int
    kv_usage: float  # fraction of KV blocks in use after the step
    preempted: int = 0


class Scheduler:
    def __init__(self, cost: CostModel, knobs: Knobs, kv_capacity_tokens: int) -> None:
        self.cost = cost
        self.knobs = knobs
        self.block = max(1, knobs.block_size)
        self.total_blocks = max(1, kv_capacity_tokens // self.block)
        self.free_blocks = self.total_blocks
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.now = 0.0
        self.acceptance = knobs.acceptance
        self.spec_tokens = max(0, knobs.spec_tokens)
        # prefix cache: block hash -> None, LRU order; holds only blocks not in use
        self._cache: OrderedDict[int, None] = OrderedDict()
        self.prefix_queries = 0
        self.prefix_hits = 0
        self.steps = 0
        self.rejected = 0

    # requests -------------------------------------------------------------------------
    def add(self, req: SimRequest) -> None:
        if req.output_tokens <= 0:
            raise ValueError("a request must generate at least one token")
        self.waiting.append(req)

    def abort(self, req: SimRequest) -> None:
        """Drop a request (client went away); frees its KV blocks."""
        req.aborted = True
        if req in self.running:
            self.running.remove(req)
            self._free(req, cache=False)
        else:
            try:
                self.waiting.remove(req)
            except ValueError:
                pass

    @property
    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    @property
    def kv_usage(self) -> float:
        return 1.0 - self.free_blocks / self.total_blocks

    @property
    def prefix_hit_rate(self) -> float:
        return self.prefix_hits / self.prefix_queries if self.prefix_queries else 0.0

    # KV blocks ------------------------------------------------------------------------
    def _blocks_for(self, tokens: int) -> int:
        return math.ceil(tokens / self.block)

    def _take_blocks(self, n: int) -> bool:
        if n <= 0:
            return True
        if n > self.free_blocks + len(self._cache):
            return False
        short = n - self.free_blocks
        while short > 0 and self._cache:  # evict cached prefixes, least recently used first
            self._cache.popitem(last=False)
            self.free_blocks += 1
            short -= 1
        self.free_blocks -= n
        return True

    def _available(self) -> int:
        return self.free_blocks + len(self._cache)

    def _free(self, req: SimRequest, cache: bool) -> None:
        released = req.blocks
        req.blocks = 0
        if cache and self.knobs.prefix_caching and req.block_hashes:
            for h in req.block_hashes:
                if released <= 0:
                    break
                if h in self._cache:
                    self._cache.move_to_end(h)
                else:
                    self._cache[h] = None
                    released -= 1
        self.free_blocks += released

    def _prefix_hits(self, req: SimRequest) -> int:
        """Leading prompt blocks found in the cache (they leave the cache: now in use)."""
        if not (self.knobs.prefix_caching and req.block_hashes):
            return 0
        hits = 0
        for h in req.block_hashes:
            if h not in self._cache:
                break
            hits += 1
        # never the whole prompt: the last position is recomputed to produce a token
        hits = min(hits, (req.prompt_tokens - 1) // self.block)
        for h in req.block_hashes[:hits]:
            del self._cache[h]
        self.prefix_queries += req.prompt_tokens
        self.prefix_hits += hits * self.block
        return hits

    # one step -------------------------------------------------------------------------
    def step(self) -> StepResult | None:
        """Plan and run one step; None when there is nothing to do."""
        if not self.has_work:
            return None
        budget = self.knobs.max_batched_tokens
        positions = 1 + self.spec_tokens
        scheduled: dict[SimRequest, int] = {}  # request -> positions computed this step
        emitted: list[tuple[SimRequest, int, bool]] = []
        preempted = 0
        # 1. running requests, oldest first
        i = 0
        while i < len(self.running):
            req = self.running[i]
            if req.decoding:
                need = positions
            else:
                need = req.target - req.computed
                if self.knobs.chunked_prefill:
                    need = min(need, budget)
            if need > budget or need <= 0:
                i += 1
                continue
            grow = self._blocks_for(req.context + need) - req.blocks
            while grow > self._available() and len(self.running) > 1:
                victim = self.running[-1] if self.running[-1] is not req else self.running[-2]
                if victim is req:
                    break
                if self.running.index(victim) < i:
                    i -= 1
                budget += scheduled.pop(victim, 0)
                self._preempt(victim)
                preempted += 1
            if grow > self._available():
                i += 1
                continue
            self._take_blocks(grow)
            req.blocks += grow
            budget -= need
            scheduled[req] = need
            i += 1
        # 2. waiting requests, first come first served
        while self.waiting and budget > 0 and len(self.running) < self.knobs.max_num_seqs:
            req = self.waiting[0]
            if self._blocks_for(req.target) > self.total_blocks:
                # larger than the whole KV cache: can never run
                self.waiting.popleft()
                req.aborted = True
                self.rejected += 1
                emitted.append((req, 0, True))
                continue
            if req.computed == 0 and req.preemptions == 0 and req.cached_tokens == 0:
                hits = self._prefix_hits(req)
                req.cached_tokens = hits * self.block
                req.computed = req.cached_tokens
                req.blocks = hits
            need = req.target - req.computed
            if self.knobs.chunked_prefill:
                need = min(need, budget)
            elif need > budget and scheduled:
                break  # without chunking a whole prompt must fit in one step
            grow = self._blocks_for(req.computed + need) - req.blocks
            if grow > self._available():
                break
            self._take_blocks(grow)
            req.blocks += grow
            self.waiting.popleft()
            self.running.append(req)
            scheduled[req] = need
            budget -= need
        if not scheduled:
            if self.running and not emitted:
                # the KV cache cannot hold even the oldest request's next token: stop it at
                # its current length rather than stall forever
                req = self.running.pop(0)
                req.output_tokens = req.generated
                req.finished_at = self.now
                self._free(req, cache=True)
                emitted.append((req, 0, True))
            return StepResult(0.0, tuple(emitted), StepShape(), len(self.running), len(self.waiting), self.kv_usage, preempted)
        decode = [r for r in scheduled if r.decoding]
        chunks = [(r, n) for r, n in scheduled.items() if not r.decoding]
        shape = StepShape(
            decode_seqs=len(decode),
            decode_context=sum(r.context for r in decode),
            prefill_tokens=sum(n for _, n in chunks),
            prefill_attention=sum(n * (r.computed + n / 2) for r, n in chunks),
        )
        duration = self.cost.step_time(shape)
        self.now += duration
        self.steps += 1
        for req in decode:
            n = min(self._accepted(req), req.remaining)
            req.generated += n
            emitted.append((req, n, req.generated >= req.output_tokens))
        for req, n in chunks:
            req.computed += n
            if req.decoding:  # the last chunk samples the next token
                req.generated += 1
                if req.first_token_at is None:
                    req.first_token_at = self.now
                emitted.append((req, 1, req.generated >= req.output_tokens))
        for req, _, done in emitted:
            if done and not req.aborted:
                req.finished_at = self.now
                self.running.remove(req)
                self._free(req, cache=True)
        return StepResult(
            duration, tuple(emitted), shape, len(self.running), len(self.waiting), self.kv_usage, preempted
        )

    def _preempt(self, victim: SimRequest) -> None:
        self.running.remove(victim)
        self._free(victim, cache=False)
        victim.computed = 0
        victim.target = victim.prompt_tokens + victim.generated  # recompute prompt + output so far
        victim.target_output = victim.generated
        victim.preemptions += 1
        self.waiting.appendleft(victim)

    def _accepted(self, req: SimRequest) -> int:
        if self.spec_tokens == 0:
            return 1
        if req._rng is None:
            req._rng = random.Random(req.seed)
        n = 1
        for _ in range(self.spec_tokens):
            if req._rng.random() >= self.acceptance:
                break
            n += 1
        return n


# offline simulation --------------------------------------------------------------------


@dataclass(frozen=True)
class OfflineResult:
    duration: float
    requests: int
    input_tokens: int
    output_tokens: int
    mean_ttft: float
    mean_tpot: float
    steps: int
    preemptions: int

    @property
    def total_token_throughput(self) -> float:
        return (self.input_tokens + self.output_tokens) / self.duration if self.duration else 0.0

    @property
    def output_throughput(self) -> float:
        return self.output_tokens / self.duration if self.duration else 0.0


def simulate(
    workload: Iterable[tuple[float, int, int]],
    cost: CostModel,
    knobs: Knobs,
    kv_capacity_tokens: int,
    max_concurrency: int | None = None,
    hashes: Sequence[tuple[int, ...]] | None = None,
) -> OfflineResult:
    """Run ``workload`` — (arrival seconds, prompt tokens, output tokens) — to completion in
    simulated time, the way a benchmark client would drive the server."""
    items = sorted(workload, key=lambda w: w[0])
    sched = Scheduler(cost, knobs, kv_capacity_tokens)
    reqs = [
        SimRequest(p, o, block_hashes=(hashes[i] if hashes else ()), arrival=a, seed=i)
        for i, (a, p, o) in enumerate(items)
    ]
    pending = deque(reqs)
    in_flight = 0
    while pending or sched.has_work:
        while pending and pending[0].arrival <= sched.now and (max_concurrency is None or in_flight < max_concurrency):
            req = pending.popleft()
            req.arrival = sched.now  # sent now: a client measures TTFT from here
            sched.add(req)
            in_flight += 1
        if not sched.has_work:
            sched.now = max(sched.now, pending[0].arrival)
            continue
        result = sched.step()
        if result is None:
            continue
        in_flight -= sum(1 for _, _, finished in result.emitted if finished)
        if not result.emitted and pending:
            # stuck until the next arrival (cannot happen with work admitted; defensive)
            sched.now = max(sched.now, pending[0].arrival)
    start = min((a for a, _, _ in items), default=0.0)
    ok = [r for r in reqs if not r.aborted]
    ttfts = [r.first_token_at - r.arrival for r in ok if r.first_token_at is not None]
    tpots = [
        (r.finished_at - r.first_token_at) / (r.generated - 1)
        for r in ok
        if r.finished_at is not None and r.first_token_at is not None and r.generated > 1
    ]
    return OfflineResult(
        duration=sched.now - start,
        requests=len(ok),
        input_tokens=sum(r.prompt_tokens for r in ok),
        output_tokens=sum(r.generated for r in ok),
        mean_ttft=sum(ttfts) / len(ttfts) if ttfts else 0.0,
        mean_tpot=sum(tpots) / len(tpots) if tpots else 0.0,
        steps=sched.steps,
        preemptions=sum(r.preemptions for r in reqs),
    )
