"""The simulated engine runtime: what every stand-in front end runs once it has parsed its
engine's flags into a :class:`perflab_sim.config.SimEngineConfig`.

``serve(cfg)`` blocks and returns the process exit status. In order, it:

1. prints ``cfg.startup_lines``;
2. applies faults from ``PERFLAB_SIM_FAULT`` that strike at start (:mod:`perflab_sim.faults`);
3. checks the model fits (:func:`deployment`): weights in memory, and free device memory (other
   simulated engines still holding memory make a new one fail, as on a real GPU);
4. spawns ``cfg.workers`` worker processes (:mod:`perflab_sim.worker`) that hold the devices'
   memory — or holds it itself when there are none;
5. fails now with ``cfg.fail_lines`` if the front end decided this configuration crashes;
6. "loads" for ``cfg.load_time_s`` seconds, binds ``host:port`` and ``extra_ports``, prints
   ``cfg.ready_lines``;
7. serves the OpenAI API from a continuous-batching scheduler in simulated time until SIGTERM
   or SIGINT, then stops its workers and exits 0 within about a second. Simulated time is the
   engine's model clock (:mod:`perflab_sim.clock`): one driver delivers every data-parallel
   scheduler's steps in model-time order, paced by wall time; a request that asks for it
   (``x-perflab-server-clock``) gets each step's model time as an SSE comment.

Steps 2 to 6 and the exit are :mod:`perflab_sim.lifecycle`'s; the HTTP routes
:mod:`perflab_sim.routing`'s; the bodies (vLLM 0.32.0's) :mod:`perflab_sim.wire`'s; the time
scale (``PERFLAB_SIM_TIME_SCALE``: a step the performance model says takes 50 ms is delivered
50 ms / scale after the previous one; responses carry it in the ``x-perflab-time-scale``
header, :data:`perflab.bench.serverclock.TIME_SCALE_HEADER`) and the faults :mod:`perflab_sim.faults`'. This module holds what the engine runs on (:class:`Deployment`),
the engine's schedulers and metrics (:class:`Engine`), and :func:`serve`. Optional engine
behaviour is ``cfg.behaviour`` (:class:`perflab_sim.config.EngineBehaviour`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import heapq
import itertools
import json
import os
import sys
import time
import traceback
from collections.abc import Mapping
from pathlib import Path

from perflab import models
from perflab_sim import accuracy, catalog, perfmodel
from perflab_sim.clock import ModelClock
from perflab_sim.config import EngineBehaviour, SimEngineConfig
from perflab_sim.env import FAULT_ENV, HARDWARE_ENV, TIME_SCALE_ENV, fault_applies
from perflab_sim.faults import Faults, parse_faults, time_scale
from perflab_sim.lifecycle import EngineLifecycle, die_by_signal, say
from perflab_sim.load import PUBLISH_S, LoadMeter
from perflab_sim.load import withdraw as load_withdraw
from perflab_sim.metrics import EngineMetrics, Finished
from perflab_sim.perfmodel import Deployment
from perflab_sim.routing import HttpApi
from perflab_sim.scheduler import Scheduler, SimRequest, StepResult
from perflab_sim.wire import Generation, fingerprint


def deployment(cfg: SimEngineConfig, env: Mapping[str, str] | None = None) -> Deployment:
    """Resolve ``cfg`` against the catalog. Raises models.UnknownModel, perflab UsageError
    (unknown machine) or ValueError (not enough devices). Front ends call this too, to decide
    engine-specific failures (e.g. vLLM's max-model-len check) with the same numbers."""
    env = os.environ if env is None else env
    name = cfg.hardware or env.get(HARDWARE_ENV)
    if not name:
        raise ValueError(f"not in simulation: {HARDWARE_ENV} is not set")
    machine = catalog.get(name)
    model = models.lookup(cfg.model)
    visible = tuple(cfg.devices) if cfg.devices is not None else tuple(range(machine.count))
    # a rank of a multi-node group holds its node's share of the devices (the model's numbers
    # are the whole group's: tp, pp and dp are the group's sizes)
    world = -(-cfg.tp * cfg.pp * cfg.dp // max(1, cfg.nnodes))
    if len(visible) < world or any(not 0 <= d < machine.count for d in visible):
        raise ValueError(
            f"the configuration needs {world} devices (tp {cfg.tp} x pp {cfg.pp} x dp {cfg.dp}) "
            f"but {len(visible)} of {machine.name}'s {machine.count} are visible"
        )
    quant = cfg.quantization or model.quant
    knobs = perfmodel.Knobs(
        tp=cfg.tp,
        pp=cfg.pp,
        ep=cfg.ep,
        quant=quant,
        kv_cache_dtype=cfg.kv_cache_dtype,
        mem_fraction=cfg.mem_fraction,
        max_model_len=cfg.max_model_len or model.context_len,
        max_num_seqs=cfg.max_num_seqs,
        max_batched_tokens=cfg.max_batched_tokens,
        chunked_prefill=cfg.chunked_prefill,
        prefix_caching=cfg.prefix_caching,
        spec_method=cfg.spec_method,
        spec_tokens=cfg.spec_tokens,
        spec_acceptance=cfg.spec_acceptance,
        efficiency=cfg.efficiency,
        decode_efficiency=cfg.decode_efficiency,
        prefill_efficiency=cfg.prefill_efficiency,
        overhead_ms=cfg.scheduler_overhead_ms,
        block_size=cfg.block_size,
        capacity_policy=cfg.capacity_policy,
        activation_bytes=cfg.activation_bytes,
    )
    memory = perfmodel.memory_plan(model, machine.chip, knobs)
    return Deployment(model, machine, visible[:world], knobs, memory, knobs.max_model_len or model.context_len)


# An all-at-once batch (SERVER_CLOCK_BURST) holds the model clock while its requests keep coming:
# until none came for BURST_QUIET_S wall seconds, at most BURST_MAX_S after the first.
BURST_QUIET_S = 0.1
BURST_MAX_S = 5.0


class Burst:
    """An all-at-once batch arriving at a held model time ``at``."""

    def __init__(self, id_: str, at: float) -> None:
        self.id = id_
        self.at = at
        self.started = self.last = time.monotonic()

    def extend(self) -> None:
        self.last = time.monotonic()

    def left(self) -> float:
        """Wall seconds the hold has left (<= 0: over)."""
        now = time.monotonic()
        return min(self.last + BURST_QUIET_S, self.started + BURST_MAX_S) - now


# A closed loop (SERVER_CLOCK_LOOP) holds the model clock while a request it is owed has not come:
# at most LOOP_HOLD_MAX_S wall seconds per hold (a client that stopped sending: the clock runs on)
LOOP_HOLD_MAX_S = 1.0


class Loop:
    """A closed loop of ``n`` requests, at most ``c`` at once, the next sent as soon as one ends:
    ``owed`` requests the client is sending now (the engine's clock waits for them)."""

    def __init__(self, n: int, c: int) -> None:
        self.n = n
        self.c = c
        self.arrived = 0
        self.owed = 0


class Hold:
    """The model clock held at ``at`` while a closed loop's requests are on their way."""

    def __init__(self, at: float) -> None:
        self.at = at
        self.started = time.monotonic()

    def left(self) -> float:
        return self.started + LOOP_HOLD_MAX_S - time.monotonic()


class Engine(EngineLifecycle):
    """One simulated engine: its schedulers (one per data-parallel rank) driven in simulated
    time, the requests in flight and the metrics; the process lifecycle is
    :class:`EngineLifecycle`'s, the HTTP handlers :class:`HttpApi`'s."""

    def __init__(self, cfg: SimEngineConfig, deployment_: Deployment, faults: Faults, scale: float,
                 env: Mapping[str, str]) -> None:
        self.cfg = cfg
        self.behaviour = cfg.behaviour
        self.deployment = deployment_
        # how well it answers (perflab_sim.accuracy): the model's score less its options' effects
        self.accuracy = accuracy.profile(deployment_.model.name, deployment_.knobs.quant, cfg.kv_cache_dtype, cfg.spec_method)
        self.faults = faults
        self.scale = scale
        self.env = env
        super().__init__()
        self.hung = False
        self.completed = 0
        cost = perfmodel.build_cost_model(deployment_.model, deployment_.machine.chip, deployment_.knobs)
        capacity = deployment_.memory.kv_capacity_tokens
        self.scheds = [Scheduler(cost, deployment_.knobs, capacity) for _ in range(cfg.dp)]
        self.cost = cost
        # how busy each device is, for the NVML shim's and npu-smi's power and utilization
        self.load = LoadMeter(deployment_.devices, cfg.dp)
        self.clock = ModelClock(scale)
        for sched in self.scheds:
            sched.now = self.clock.last
        self._waiter: asyncio.Future[None] | None = None  # the driver's sleep, cut short by _nudge
        self._due: list[tuple[float, int, int, StepResult]] = []  # (model end, order, rank, step) heap
        self._order = itertools.count()
        self._busy: set[int] = set()  # ranks with a step due
        self.step_end = self.clock.last  # model time of the step being delivered
        self._burst: Burst | None = None  # an all-at-once batch arriving: the clock is held
        self._bursts_seen: set[str] = set()
        self._loops: dict[str, Loop] = {}  # closed loops by id (SERVER_CLOCK_LOOP)
        self._loop_of: dict[int, Loop] = {}  # id(SimRequest) -> its loop, while in flight
        self._hold: Hold | None = None  # the clock held for a closed loop's next requests
        self.lag_warned = False
        self._arrivals = itertools.count()
        self._prompt_done = 0
        self._gen_done = 0
        self.fingerprint = fingerprint(cfg)
        self.metrics = EngineMetrics(cfg.engine, cfg.served_model_names[0], cfg.dp, deployment_.max_model_len,
                                     spec=bool(cfg.spec_method) and cfg.spec_tokens > 0)
        self.preemptions = [0] * cfg.dp
        self.api = HttpApi(self)

    def start_serving(self) -> list[asyncio.Task[None]]:
        driver = asyncio.create_task(self._drive())
        driver.add_done_callback(self._driver_ended)
        tasks = [driver]
        if self.state_dir is not None:
            tasks.append(asyncio.create_task(self._publish_load(self.state_dir)))
        if self.behaviour.stats_line:
            tasks.append(asyncio.create_task(self._stats()))
        return tasks

    def _driver_ended(self, task: asyncio.Task[None]) -> None:
        """The driver only ends when the engine stops; an error in it would otherwise leave an
        engine that accepts requests and never steps again: it goes down instead, its traceback
        in the log (a bug of the simulator, not a simulated crash), as a real engine does when
        its engine core dies."""
        if task.cancelled() or task.exception() is None:
            return
        exc = task.exception()
        say(["perflab-sim: internal error: the scheduler driver failed:",
             *"".join(traceback.format_exception(exc)).rstrip().splitlines()], sys.stderr)
        if not self.crashing and self.stop is not None:
            self.crashing = True
            self._failed(1)
            self.stop.set()

    # scheduling -----------------------------------------------------------------------
    def model_now(self) -> float:
        """The engine's model time now (:class:`perflab_sim.clock.ModelClock`), kept before
        the next step due; held during a burst."""
        if self._burst is not None:
            return self._burst.at
        if self._hold is not None:
            return self._hold.at
        return self.clock.now(self._due[0][0] if self._due else None)

    def _arrive(self, gen: Generation) -> float:
        """The request's arrival in model time. The first request of an all-at-once batch
        (``gen.burst``) reaching an idle engine holds the clock: the batch's requests arrive
        at one model time until none came for BURST_QUIET_S (at most BURST_MAX_S) — what the
        client meant, whatever time the host takes to send them."""
        if gen.loop is not None:
            return self._arrive_in_loop(*gen.loop)
        burst = self._burst
        if burst is not None and gen.burst == burst.id:
            burst.extend()
            return burst.at
        if (gen.burst is not None and burst is None and gen.burst not in self._bursts_seen and not self._due
                and not any(s.has_work for s in self.scheds)):
            self._bursts_seen.add(gen.burst)
            self._burst = Burst(gen.burst, self.model_now())
            self._nudge()
            return self._burst.at
        return self.model_now()

    def _arrive_in_loop(self, loop_id: str, n: int, c: int) -> float:
        """A closed loop's request: its first ``c`` reaching an idle engine arrive at one held
        model time, and a request the loop owes (one ended while fewer than ``n`` had come)
        arrives at the model time the clock was held at — the client's reaction time is the
        host's, not the engine's."""
        loop = self._loops.get(loop_id)
        if loop is None:
            loop = self._loops[loop_id] = Loop(n, c)
            if self._hold is None and self._burst is None and not self._due and not any(s.has_work for s in self.scheds):
                loop.owed = min(c, n)  # the first c are on their way: hold until they came
                self._hold = Hold(self.model_now())
        loop.arrived += 1
        if loop.owed > 0:
            loop.owed -= 1
        hold = self._hold
        if hold is None:
            return self.model_now()
        if not self._owed():
            self._nudge()  # every owed request came: the driver runs on
        return hold.at

    def _owed(self) -> bool:
        return any(loop.owed > 0 for loop in self._loops.values())

    def _ended_in_loop(self, req: SimRequest, end: float) -> None:
        """A request ended at model time ``end``: if its loop has more to send, the next one is
        owed and the clock holds at ``end`` until it comes."""
        loop = self._loop_of.pop(id(req), None)
        if loop is None or loop.arrived + loop.owed >= loop.n:
            return
        loop.owed += 1
        if self._hold is None:
            self._hold = Hold(end)

    def submit(self, gen: Generation, req: SimRequest) -> None:
        gen.sim = req
        rank = min(range(len(self.scheds)), key=lambda i: len(self.scheds[i].running) + len(self.scheds[i].waiting))
        req.seed = next(self._arrivals)  # reproducible speculative-acceptance draws
        arrival = self._arrive(gen)
        gen.arrived_model = req.arrival = arrival
        sched = self.scheds[rank]
        if rank not in self._busy and arrival > sched.now:
            sched.now = arrival  # an idle scheduler's next step starts when the request arrives
        sched.add(req)
        if gen.loop is not None:
            self._loop_of[id(req)] = self._loops[gen.loop[0]]
        gen.rank = rank
        if rank not in self._busy and self._burst is None:
            self._nudge()  # a step to plan, which may end before the one the driver waits for

    def abort(self, gen: Generation) -> None:
        if gen.sim is not None and not gen.done.done():
            self._loop_of.pop(id(gen.sim), None)  # gone: no request follows it on the engine's clock
            self.scheds[gen.rank].abort(gen.sim)
            self.record(gen, "abort")
            gen.done.set_result(None)

    def record(self, gen: Generation, reason: str) -> None:
        """Count a request that ended (finished, or aborted) in the metrics (model time)."""
        now = self.model_now()
        sim = gen.sim
        ttft = gen.first_model - gen.arrived_model if gen.first_model is not None else None
        prefill = 0.0
        if sim is not None and sim.first_token_at is not None and sim.scheduled_at is not None:
            prefill = max(0.0, sim.first_token_at - sim.scheduled_at)
        self.metrics.finished(Finished(
            rank=gen.rank,
            reason=reason,
            prompt_tokens=gen.prompt_tokens,
            generated=gen.generated,
            max_tokens=gen.max_tokens,
            ttft_s=ttft,
            e2e_s=max(0.0, now - gen.arrived_model),
            queue_s=max(0.0, (ttft or 0.0) - prefill),
            prefill_s=prefill,
            preemptions=sim.preemptions if sim is not None else 0,
            cached_tokens=sim.cached_tokens if sim is not None else 0,
        ))

    def _plan(self) -> None:
        """Start the next step of every idle scheduler that has work (in model time: it runs
        from the scheduler's ``now`` for the step's duration)."""
        for rank, sched in enumerate(self.scheds):
            if rank in self._busy or not sched.has_work:
                continue
            result = sched.step()
            if result is None:
                continue
            self._busy.add(rank)
            heapq.heappush(self._due, (sched.now, next(self._order), rank, result))

    def _nudge(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _wait(self, delay: float | None) -> None:
        """Sleep ``delay`` seconds (None: forever) or until :meth:`_nudge`."""
        loop = asyncio.get_running_loop()
        self._waiter = waiter = loop.create_future()
        timer = loop.call_later(delay, self._nudge) if delay is not None else None
        try:
            await waiter
        finally:
            self._waiter = None
            if timer is not None:
                timer.cancel()

    async def _drive(self) -> None:
        """Deliver the schedulers' steps in model-time order, each when wall time reaches it
        (model time / scale); a late host delays deliveries, never the model's numbers."""
        loop = asyncio.get_running_loop()
        while True:
            if self.hung:
                await asyncio.Event().wait()  # a stuck scheduler: nothing more happens
            burst = self._burst
            if burst is not None:
                left = burst.left()
                if left > 0:
                    await self._wait(left)
                    continue
                self._burst = None
                self.clock.resume(burst.at)
            hold = self._hold
            if hold is not None:
                left = hold.left()
                if self._owed() and left > 0:
                    await self._wait(left)
                    continue
                self._hold = None
                for held in self._loops.values():
                    held.owed = 0  # not come within LOOP_HOLD_MAX_S: the client stopped sending
                self.clock.resume(hold.at)
            self._plan()
            if not self._due:
                self.clock.idle()
                if self.state_dir is not None and self.ready:
                    # going idle: publish the busy counters now, so a telemetry reading right
                    # after the work (a benchmark's last sample) sees all of it
                    with contextlib.suppress(OSError):
                        self.load.publish(self.state_dir, self.model_now(), period=False)
                await self._wait(None)
                continue
            end, _, rank, result = self._due[0]
            delay = self.clock.wall_at(end) - time.monotonic()
            if delay > 0:
                await self._wait(delay)  # or until an arrival on an idle scheduler
                continue
            heapq.heappop(self._due)
            self._busy.discard(rank)
            self.clock.delivered(end)
            self._warn_lag()
            self.preemptions[rank] += result.preempted
            mem_s, compute_s = self.cost.split(result.shape)
            self.load.step(rank, result.duration, mem_s, compute_s)
            self.step_end = end
            for req, n, finished in result.emitted:
                if req.sink is not None:
                    req.sink(n, finished)
                if finished and not req.aborted:
                    self._ended_in_loop(req, end)
                    self.completed += 1
                    self._prompt_done += req.prompt_tokens
                self._gen_done += n
            if self.faults.crash_after is not None and self.completed >= self.faults.crash_after:
                # the scheduler dies: no further step; the responses just finished still reach
                # their clients before the process goes down
                self.hung = True
                loop.call_later(0.1, self.crash)
            if self.faults.hang_after is not None and self.completed >= self.faults.hang_after:
                self.hung = True
            await asyncio.sleep(0)  # let the HTTP side write what was delivered

    async def _publish_load(self, directory: Path) -> None:
        """Publish the devices' busy counters every PUBLISH_S wall seconds (:mod:`perflab_sim.load`)."""
        try:
            while True:
                with contextlib.suppress(OSError):  # a full or vanished state dir: no telemetry, no crash
                    self.load.publish(directory, self.model_now())
                await asyncio.sleep(PUBLISH_S)
        finally:
            load_withdraw(directory)

    def _warn_lag(self) -> None:
        if self.clock.lost_s > 1.0 and not self.lag_warned:
            self.lag_warned = True
            say([f"WARNING perflab-sim: the simulation runs behind {TIME_SCALE_ENV}={self.scale:g} "
                  "(CPU-bound); times measured by a wall clock are longer than the model's (the "
                  "perflab-server-clock stamps are not). Lower the time scale."], sys.stderr)

    async def _stats(self) -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(self.behaviour.stats_interval_s)
            now = time.monotonic()
            elapsed_sim = (now - last) * self.scale
            last = now
            running = sum(len(s.running) for s in self.scheds)
            waiting = sum(len(s.waiting) for s in self.scheds)
            if not (running or waiting or self._gen_done):
                continue
            hit = sum(s.prefix_hits for s in self.scheds) / max(1, sum(s.prefix_queries for s in self.scheds))
            say([str(self.behaviour.stats_line).format(
                prompt_tps=self._prompt_done / elapsed_sim, gen_tps=self._gen_done / elapsed_sim, running=running,
                waiting=waiting, kv_pct=100 * max(s.kv_usage for s in self.scheds), prefix_hit_pct=100 * hit,
            )])
            self._prompt_done = self._gen_done = 0


def serve(cfg: SimEngineConfig) -> int:
    """Run the simulated engine ``cfg`` until SIGTERM/SIGINT (exit 0) or a failure."""
    env = dict(os.environ)
    try:
        faults = parse_faults(env.get(FAULT_ENV)) if fault_applies(env, cfg.node_rank) else Faults()
        scale = time_scale(env)
    except ValueError as exc:
        say(cfg.startup_lines)
        say([f"perflab-sim: {exc}"], sys.stderr)
        return 2
    say(cfg.startup_lines)
    try:
        deployment_ = deployment(cfg, env)
    except models.UnknownModel as exc:
        say([exc.hf_message], sys.stderr)
        return 1
    except Exception as exc:  # noqa: BLE001 - catalog UsageError, too few devices: one line, no traceback
        say([f"RuntimeError: {exc}"], sys.stderr)
        return 1
    engine = Engine(cfg, deployment_, faults, scale, env)
    loop_factory = None
    try:
        import uvloop

        loop_factory = uvloop.new_event_loop
    except ImportError:
        pass
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        code = runner.run(engine.main())
    sys.stdout.flush()
    sys.stderr.flush()
    if engine.die_signal is not None:
        die_by_signal(engine.die_signal)
    return code


def config_from_json(text: str) -> SimEngineConfig:
    """A SimEngineConfig from JSON (lists become the dataclass's tuples, ``behaviour`` an
    :class:`EngineBehaviour`)."""
    raw = json.loads(text)
    tuple_fields = {f.name for f in dataclasses.fields(SimEngineConfig) if str(f.type).startswith("tuple")}
    for key in tuple_fields & raw.keys():
        if raw[key] is not None:
            raw[key] = tuple(raw[key])
    if "behaviour" in raw:
        raw["behaviour"] = EngineBehaviour.from_json(raw["behaviour"])
    return SimEngineConfig(**raw)


__all__ = ["Engine", "config_from_json", "deployment", "die_by_signal", "serve"]

if __name__ == "__main__":  # python -m perflab_sim.runtime '<SimEngineConfig as JSON>'
    sys.exit(serve(config_from_json(sys.argv[1])))
