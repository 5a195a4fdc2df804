"""The OpenAI wire format of the simulated engines, vLLM 0.32.0's field for field: request
parsing (:func:`parse_request`), error bodies, the streamed SSE chunks and the usage blocks
(:class:`Generation`), the ``system_fingerprint`` and the ``/tokenize`` vocabulary.

Captured from a real server: tests/fixtures/real/vllm-0.32.0-cpu/; vllm/entrypoints/openai/
chat_completion/serving.py, completion/serving.py and protocol.py.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from perflab.bench.serverclock import format_clock
from perflab_sim import answers, tokenizer
from perflab_sim.config import SimEngineConfig
from perflab_sim.scheduler import SimRequest

if TYPE_CHECKING:
    from perflab_sim.accuracy import Profile
    from perflab_sim.config import EngineBehaviour
    from perflab_sim.faults import Faults
    from perflab_sim.metrics import EngineMetrics
    from perflab_sim.perfmodel import Deployment
    from perflab_sim.scheduler import Scheduler


class ServingEngine(Protocol):
    """What a generation and the HTTP handlers (:mod:`perflab_sim.routing`) use of the engine
    serving them: :class:`perflab_sim.runtime.Engine`, which sits above both and is declared
    there (this protocol keeps the wire and the routing below the runtime)."""

    cfg: SimEngineConfig
    behaviour: EngineBehaviour
    deployment: Deployment
    accuracy: Profile
    faults: Faults
    scheds: list[Scheduler]
    metrics: EngineMetrics
    preemptions: list[int]
    fingerprint: str
    ready: bool
    step_end: float  # model time of the step being delivered

    def submit(self, gen: Generation, req: SimRequest) -> None: ...

    def abort(self, gen: Generation) -> None: ...

    def record(self, gen: Generation, reason: str) -> None: ...

VLLM_ENGINES = ("vllm", "vllm-ascend")  # the stand-ins with vLLM's API server


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


@dataclass(frozen=True)
class CompletionRequest:
    """A valid ``/v1/chat/completions`` or ``/v1/completions`` body, as the engine runs it."""

    chat: bool
    model: str | None
    text: str | None  # the prompt text (None: token ids), what prefix caching hashes
    prompt_tokens: int
    max_tokens: int  # the cap: the request's max_tokens or what the context leaves
    stop_at: int  # where the generation stops (EOS or the cap)
    stream: bool
    include_usage: bool
    continuous_usage: bool
    ignore_eos: bool = False
    min_tokens: int = 0
    logprobs: int | None = None  # top alternatives asked per token (0: the chosen one only); None: no logprobs
    stop: tuple[str, ...] = ()  # stop strings: the text ends before the first one (vLLM's default)


def parse_request(body: Mapping[str, Any], chat: bool, max_model_len: int, eos_mean: float) -> CompletionRequest | str:
    """The request in ``body``, or vLLM's message for a 400 BadRequestError."""
    text: str | None  # None: the prompt is token ids
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list):
            return "'messages' is required"
        text, prompt_tokens = tokenizer.chat_prompt(messages)
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
    else:
        if "prompt" not in body:
            return "'prompt' is required"
        text, prompt_tokens = tokenizer.completion_prompt(body.get("prompt"))
        max_tokens = body.get("max_tokens", 16)  # vLLM's CompletionRequest default
    message = context_error(prompt_tokens, max_tokens, max_model_len)
    if message:
        return message
    cap = int(max_tokens) if max_tokens is not None else max_model_len - prompt_tokens
    if cap < 1:
        return f"max_tokens must be at least 1, got {cap}."
    min_tokens = min(int(body.get("min_tokens") or 0), cap)
    if body.get("ignore_eos"):
        stop_at = cap
    else:
        seed_text = text if text is not None else json.dumps(body.get("prompt"))
        stop_at = max(min_tokens, min(cap, natural_length(seed_text, eos_mean)), 1)
    opts = body.get("stream_options") or {}
    model = body.get("model")
    return CompletionRequest(chat, None if model is None else str(model), text, prompt_tokens, cap, stop_at,
                             bool(body.get("stream")), bool(opts.get("include_usage")),
                             bool(opts.get("continuous_usage_stats")), bool(body.get("ignore_eos")), min_tokens,
                             answers.requested_top(body, chat), _stop_strings(body.get("stop")))


def _stop_strings(stop: Any) -> tuple[str, ...]:
    """The request's ``stop`` (a string or a list of them; OpenAI's and vLLM's field)."""
    if isinstance(stop, str):
        return (stop,) if stop else ()
    if isinstance(stop, list):
        return tuple(s for s in stop if isinstance(s, str) and s)
    return ()


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

    def __init__(self, engine: ServingEngine, request: CompletionRequest, model: str) -> None:
        self.engine = engine
        self.chat = chat = request.chat
        self.prompt_tokens = request.prompt_tokens
        self.max_tokens = request.max_tokens
        self.stop_at = request.stop_at
        self.top = request.logprobs
        # what it writes (perflab_sim.answers): a shipped-task question is answered and stops
        # there by itself; other text only where logprobs are asked; else the " tok" words
        self.content: answers.Content | None = None
        self._chars = 0  # characters streamed so far (completions' text_offset)
        item = answers.task_item(request.text)
        if item is not None or request.logprobs is not None:
            self.content = answers.Content(request.text or "", engine.accuracy, item, request.max_tokens, request.stop)
            if self.content.length is not None and not request.ignore_eos:
                self.stop_at = max(request.min_tokens, min(request.max_tokens, self.content.length), 1)
        self.stream = request.stream
        self.include_usage = request.include_usage
        self.continuous_usage = request.include_usage and request.continuous_usage
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
        # model time (perflab_sim.clock): set by Engine.submit, then the steps' ends
        self.arrived_model = 0.0
        self.first_model: float | None = None
        self.last_model: float | None = None
        self.stamp = False  # stream the model-clock stamps (the client asked: SERVER_CLOCK_HEADER)
        self.burst: str | None = None  # the all-at-once batch it belongs to (one arrival time)
        self.loop: tuple[str, int, int] | None = None  # the closed loop it belongs to: (id, n, c)
        obj = "chat.completion.chunk" if chat else "text_completion"
        self._head = (
            f'{{"id":"{self.id}","object":"{obj}","created":{self.created},"model":{self.model_json},"choices":['
        ).encode()

    def usage(self) -> dict[str, int]:
        if self.engine.faults.lying_usage:  # PERFLAB_SIM_FAULT=lying-usage: a server whose counts are impossible
            return {"prompt_tokens": -5, "total_tokens": 999995, "completion_tokens": 1000000}
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

    def _chunk(self, text: str, finish: str | None, role: bool = False, logprobs: str = "null") -> bytes:
        fin = "null" if finish is None else f'"{finish}"'
        stop = ',"stop_reason":null' if finish is not None else ""
        content = json.dumps(text)
        if self.chat:
            if role:
                choice = '{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}'
            else:
                choice = f'{{"index":0,"delta":{{"content":{content}}},"logprobs":{logprobs},"finish_reason":{fin}{stop},"token_ids":null}}'
        else:
            choice = (f'{{"index":0,"text":{content},"logprobs":{logprobs},"finish_reason":{fin},"stop_reason":null,'
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
                clock = format_clock(self.engine.step_end, self.arrived_model) if self.stamp else b""
                self.send(clock + f"data: {body}\n\n".encode() + b"data: [DONE]\n\n")
            self.engine.record(self, "abort")
            self.done.set_result(None)
            return
        first = self.generated == 0 and n > 0
        now = self.engine.step_end  # the model time of the step delivering these tokens
        if first and self.content is not None:
            # batched with other requests (its scheduler holds others): batch-variant numerics
            sched = self.engine.scheds[self.rank]
            self.content.start(len(sched.running) + len(sched.waiting) > 1)
        if n > 0:
            if first:
                self.first_model = now
            elif self.last_model is not None:
                self.engine.metrics.token_interval(self.rank, now - self.last_model)
            self.last_model = now
        start = self.generated
        self.generated += n
        if finished:
            self.finish_reason = "length" if self.generated >= self.max_tokens else "stop"
        if self.send is not None:
            # asked for, every step's events open with its model time (an SSE comment)
            out = [format_clock(now, self.arrived_model) if self.stamp else b""]
            if first and self.chat:
                out.append(self._chunk("", None, role=True))
            if n > 0 or finished:
                out.append(self._stream_chunk(start, n))
            if finished:
                if self.include_usage:
                    out.append(self._final_usage())
                out.append(b"data: [DONE]\n\n")
            if len(out) == 1:
                out.clear()  # no event in this step: no stamp either
            if not self.send(b"".join(out)) and not finished:
                self.engine.abort(self)  # the client is gone: its request leaves the batch
                return
            # gone at its last step: finished all the same (the engine computed it, as a real
            # engine's scheduler has when its API server finds the client gone)
        if finished:
            self.engine.record(self, self.finish_reason or "stop")
            self.done.set_result(None)

    def _stream_chunk(self, start: int, n: int) -> bytes:
        """The chunk of tokens ``start..start+n``, with their logprobs where asked."""
        content = self.content
        if content is None:
            return self._chunk(tokenizer.output_text(n), self.finish_reason)
        text = content.text(start, start + n)
        logprobs = "null"
        if self.top is not None and n > 0:
            if self.chat:
                entries: Any = {"content": answers.chat_logprobs(content, start, start + n, self.top)}
            else:
                entries = answers.completion_logprobs(content, start, start + n, self.top, self._chars)
            logprobs = json.dumps(entries, separators=(",", ":"))
        self._chars += len(text)
        return self._chunk(text, self.finish_reason, logprobs=logprobs)

    def _logprobs(self) -> dict[str, Any] | None:
        """The non-streamed body's logprobs (vLLM's shapes), None where none were asked."""
        if self.content is None or self.top is None:
            return None
        if self.chat:
            return {"content": answers.chat_logprobs(self.content, 0, self.generated, self.top)}
        return answers.completion_logprobs(self.content, 0, self.generated, self.top, 0)

    def full_response(self) -> dict[str, Any]:
        """The non-streamed body, vLLM 0.32.0's fields in its order."""
        text = tokenizer.output_text(self.generated) if self.content is None else self.content.text(0, self.generated)
        logprobs = self._logprobs()
        usage = {**self.usage(), "prompt_tokens_details": None, "completion_tokens_details": None}
        if self.chat:
            message = {"role": "assistant", "content": text, "refusal": None, "annotations": None, "audio": None,
                       "function_call": None, "reasoning": None}
            choice: dict[str, Any] = {"index": 0, "message": message, "logprobs": logprobs, "finish_reason": self.finish_reason,
                                      "stop_reason": None, "token_ids": None, "routed_experts": None}
        else:
            choice = {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": self.finish_reason, "stop_reason": None,
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
