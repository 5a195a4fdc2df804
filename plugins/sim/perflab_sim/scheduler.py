"""A continuous-batching scheduler in simulated time (pure, synchronous).

Modelled on vLLM's V1 scheduler (vllm/v1/core/sched/scheduler.py ``Scheduler.schedule``),
the common shape of today's engines:

- each step has a token budget (``max_batched_tokens``) and a sequence cap (``max_num_seqs``);
- running requests go first, oldest first: decoding sequences take ``1 + spec_tokens``
  positions each, partially prefilled prompts their next chunk;
- KV cache is allocated in blocks, a step's tokens at a time (``allocate_slots``). When a
  running request cannot get the blocks for its next tokens, the most recently admitted
  running request is preempted (its KV freed, recomputed later); when that is the request
  itself, the running pass stops there. The oldest requests therefore keep progressing;
- waiting requests are admitted first-come-first-served while budget, sequence slots and
  free KV blocks for their next chunk last — and not at all in a step that preempted, as
  vLLM does; with chunked prefill a prompt is split across steps, without it a prompt waits
  until it fits in one step's budget whole;
- with prefix caching, freed blocks stay in the cache (least recently freed evicted first,
  a request's last block before its first, like vLLM's free-block queue) until their space
  is needed: a later prompt with the same prefix, and a preempted request coming back, find
  their full blocks there and do not compute them again; a prompt admitted while another
  request with the same prefix runs finds the blocks that request has computed (vLLM hashes a
  block once it is full; the simulator shares the compute, each request keeps its own block).
  Without prefix caching a preempted request recomputes everything.

``capacity_policy="guaranteed_no_evict"`` is TensorRT-LLM's default capacity scheduler
(``CapacitySchedulerPolicy.GUARANTEED_NO_EVICT``, cpp/tensorrt_llm/batch_manager/
capacityScheduler.cpp): a request is admitted only when the KV blocks for its whole length
(prompt + ``max_tokens``) are free, they are reserved at admission, and nothing is ever
preempted.

:meth:`Scheduler.step` plans one step, advances every request and returns the step's
simulated duration (from :class:`perflab_sim.perfmodel.CostModel`) and the tokens each request
emitted. The HTTP runtime sleeps that long (divided by the time scale) before delivering them;
:func:`simulate` runs a whole workload offline for tests and calibration.
"""

from __future__ import annotations

import itertools
import random
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field

from perflab_sim.perfmodel import CostModel, Knobs, StepShape

Sink = Callable[[int, bool], None]  # (tokens emitted this step, finished)

ON_DEMAND = "max_utilization"  # vLLM / SGLang / MindIE: blocks as computed, preempt when out
GUARANTEED_NO_EVICT = "guaranteed_no_evict"  # TensorRT-LLM: reserve the whole length up front
CAPACITY_POLICIES = (ON_DEMAND, GUARANTEED_NO_EVICT)


@dataclass(eq=False)
class SimRequest:
    prompt_tokens: int
    output_tokens: int  # the length it will stop at (max_tokens, or an earlier EOS)
    block_hashes: tuple[int, ...] = ()  # prompt block hashes, for prefix caching
    sink: Sink | None = None
    arrival: float = 0.0  # simulated seconds
    seed: int = 0
    max_output: int | None = None  # the client's max_tokens (reserved under guaranteed_no_evict); None: output_tokens
    # progress ------------------------------------------------------------------------
    target: int = 0  # tokens whose KV must be computed before decoding (prompt [+ output])
    target_output: int = 0  # generated tokens included in target (after a preemption)
    computed: int = 0  # of those, computed (or found in the prefix cache)
    generated: int = 0
    cached_tokens: int = 0
    blocks: int = 0
    scheduled_at: float | None = None  # simulated time it was first admitted (left the queue)
    first_token_at: float | None = None
    finished_at: float | None = None
    preemptions: int = 0
    aborted: bool = False
    uid: int = 0  # set by the scheduler: names the request's own KV blocks in the cache
    shared: int = 0  # leading prompt blocks it has computed that others may reuse while it runs
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

    @property
    def full_length(self) -> int:
        return self.prompt_tokens + max(self.output_tokens, self.max_output or 0)


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
        if knobs.capacity_policy not in CAPACITY_POLICIES:
            raise ValueError(f"unknown capacity policy {knobs.capacity_policy!r} (known: {', '.join(CAPACITY_POLICIES)})")
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
        self.reserve = knobs.capacity_policy == GUARANTEED_NO_EVICT
        self.max_len = knobs.max_model_len or 0
        # prefix cache: block key -> None, LRU order; holds only blocks not in use
        self._cache: OrderedDict[Hashable, None] = OrderedDict()
        # the prompt blocks running requests have computed: key -> how many hold it. vLLM finds
        # a prefix in the blocks of running requests too (hashed as soon as they are full); here
        # their compute is shared, not their memory: each request still holds its own blocks
        self._running: dict[Hashable, int] = {}
        self._uids = itertools.count(1)
        self.prefix_queries = 0
        self.prefix_hits = 0
        # speculative decoding, as vLLM's SpecDecodingStats counts it: verification steps of a
        # sequence, the draft tokens proposed, the draft tokens accepted (not the bonus token)
        self.spec_drafts = 0
        self.spec_draft_tokens = 0
        self.spec_accepted = 0
        self.steps = 0
        self.rejected = 0

    # requests -------------------------------------------------------------------------
    def add(self, req: SimRequest) -> None:
        if req.output_tokens <= 0:
            raise ValueError("a request must generate at least one token")
        req.uid = next(self._uids)
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
        return 1.0 - (self.free_blocks + len(self._cache)) / self.total_blocks

    @property
    def prefix_hit_rate(self) -> float:
        return self.prefix_hits / self.prefix_queries if self.prefix_queries else 0.0

    # KV blocks ------------------------------------------------------------------------
    def _blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block)

    def _available(self) -> int:
        return self.free_blocks + len(self._cache)

    def _take_blocks(self, n: int) -> None:
        """Allocate ``n`` blocks (the caller checked they are available): free ones first,
        then cached ones, least recently freed first."""
        if n <= 0:
            return
        short = n - self.free_blocks
        while short > 0:
            self._cache.popitem(last=False)
            self.free_blocks += 1
            short -= 1
        self.free_blocks -= n

    def _key(self, req: SimRequest, index: int) -> Hashable:
        """What names block ``index`` of ``req``'s tokens in the prefix cache: the prompt's
        content hash where there is one (shared between equal prefixes), else the request's own."""
        if index < len(req.block_hashes):
            return req.block_hashes[index]
        return (req.uid, index)

    def _share(self, req: SimRequest) -> None:
        """Offer ``req``'s newly computed full prompt blocks to requests admitted after it."""
        if not self.knobs.prefix_caching:
            return
        full = min(req.computed // self.block, len(req.block_hashes))
        for index in range(req.shared, full):
            key = req.block_hashes[index]
            self._running[key] = self._running.get(key, 0) + 1
        req.shared = max(req.shared, full)

    def _unshare(self, req: SimRequest) -> None:
        for index in range(req.shared):
            key = req.block_hashes[index]
            left = self._running[key] - 1
            if left:
                self._running[key] = left
            else:
                del self._running[key]
        req.shared = 0

    def _free(self, req: SimRequest, cache: bool) -> None:
        self._unshare(req)
        held = req.blocks
        req.blocks = 0
        kept = 0
        if cache and self.knobs.prefix_caching:
            full = min(held, req.context // self.block)
            # last block first, so the cache evicts a request's tail before its head
            for index in range(full - 1, -1, -1):
                key = self._key(req, index)
                if key in self._cache:
                    self._cache.move_to_end(key)  # the same content is cached already
                else:
                    self._cache[key] = None
                    kept += 1
        self.free_blocks += held - kept

    def _cached_prefix(self, req: SimRequest) -> int:
        """Leading blocks of ``req``'s tokens still in the cache or computed by a running request
        (never all of them: the last position is recomputed to produce a token)."""
        if not self.knobs.prefix_caching:
            return 0
        limit = (req.target - 1) // self.block
        hits = 0
        while hits < limit and (self._key(req, hits) in self._cache or self._key(req, hits) in self._running):
            hits += 1
        return hits

    def reset_prefix_cache(self, refuse_waiting: bool = False) -> bool:
        """Forget every cached block (vLLM's ``BlockPool.reset_prefix_cache``, SGLang's radix
        cache flush): False, and nothing changed, while a running request holds blocks (vLLM
        refuses then) or, with ``refuse_waiting``, while any request waits (SGLang refuses)."""
        if self.running or (refuse_waiting and self.waiting):
            return False
        self.free_blocks += len(self._cache)
        self._cache.clear()
        return True

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
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            if req.decoding:
                need = positions
            else:
                need = req.target - req.computed
                if self.knobs.chunked_prefill:
                    need = min(need, budget)
            if need > budget:
                i += 1
                continue
            # guaranteed_no_evict reserved the request's whole length at admission
            grow = 0 if self.reserve else self._blocks_for(req.context + need) - req.blocks
            stopped = False
            while grow > self._available():
                victim = self.running[-1]  # the most recently admitted
                self._preempt(victim)
                preempted += 1
                if victim is req:
                    stopped = True
                    break
            if stopped:
                break  # vLLM: the request cannot be scheduled and nothing is left to preempt
            if grow > self._available():
                i += 1
                continue
            self._take_blocks(grow)
            req.blocks += max(0, grow)
            budget -= need
            scheduled[req] = need
            i += 1
        # 2. waiting requests, first come first served (none in a step that preempted)
        while self.waiting and not preempted and budget > 0 and len(self.running) < self.knobs.max_num_seqs:
            req = self.waiting[0]
            whole = self._blocks_for(self._reservation(req) if self.reserve else req.target)
            if whole > self.total_blocks:
                # larger than the whole KV cache: can never run
                self.waiting.popleft()
                self._reject(req, emitted)
                continue
            hits = self._cached_prefix(req) if req.computed == 0 else 0
            computed = hits * self.block if req.computed == 0 else req.computed
            need = req.target - computed
            if self.knobs.chunked_prefill:
                need = min(need, budget)
            elif need > budget and scheduled:
                break  # without chunking a whole prompt must fit in one step
            reused = [i for i in range(hits) if self._key(req, i) in self._cache]  # the rest: running requests'
            held = req.blocks + len(reused)
            grow = (whole if self.reserve else self._blocks_for(computed + need)) - held
            if grow > self._available() - len(reused):
                break  # not enough free KV blocks: it waits (and so does everyone behind it)
            if req.scheduled_at is None:
                req.scheduled_at = self.now
            if req.computed == 0:
                for index in reused:  # the cached blocks are in use again
                    del self._cache[self._key(req, index)]
                req.blocks = len(reused)
                req.computed = computed
                self._share(req)
                self.prefix_queries += req.target
                self.prefix_hits += computed
                if req.preemptions == 0:
                    req.cached_tokens = computed
            self._take_blocks(grow)
            req.blocks += max(0, grow)
            self.waiting.popleft()
            self.running.append(req)
            scheduled[req] = need
            budget -= need
        if not scheduled:
            if self.running and not emitted and not preempted:
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
            drawn = self._accepted(req)
            if self.spec_tokens:
                self.spec_drafts += 1
                self.spec_draft_tokens += self.spec_tokens
                self.spec_accepted += drawn - 1
            n = min(drawn, req.remaining)
            req.generated += n
            emitted.append((req, n, req.generated >= req.output_tokens))
        for req, n in chunks:
            req.computed += n
            self._share(req)
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

    def _reservation(self, req: SimRequest) -> int:
        """Tokens guaranteed_no_evict reserves: the request's whole possible length (and
        the draft tokens of its last step under speculative decoding)."""
        full = min(req.full_length, self.max_len) if self.max_len else req.full_length
        return full + self.spec_tokens

    def _reject(self, req: SimRequest, emitted: list[tuple[SimRequest, int, bool]]) -> None:
        if req.generated > 0:
            # preempted and grown past what the cache holds: it ends at its current length
            req.output_tokens = req.generated
            req.finished_at = self.now
            emitted.append((req, 0, True))
            return
        req.aborted = True
        self.rejected += 1
        emitted.append((req, 0, True))

    def _preempt(self, victim: SimRequest) -> None:
        self.running.remove(victim)
        self._free(victim, cache=True)  # its full blocks stay cached (prefix caching) until needed
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
