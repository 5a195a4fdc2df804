"""Per-request records: the raw capture taken during the run, and the parsed trace.

During the timed run the client only appends ``(receive time, bytes)`` per network read
(:class:`Capture`); SSE framing, JSON and token counting happen afterwards in
:func:`parse_capture`, so that the client spends its CPU on receiving, not on parsing
(measured in ``benchmarks/bench_client_capacity.py``). Times are ``time.perf_counter()``,
which on Linux is ``CLOCK_MONOTONIC``: one clock for every process of the machine, so
captures from ``--workers`` processes share an origin.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from perflab.bench.serverclock import SERVER_CLOCK_COMMENT, parse_clock
from perflab.bench.sse import SSEParser
from perflab.bench.tokenizer import Tokenizer

# a request's error when the run, not the server, ended it (declared here, with the request
# record, so the cancel machinery above the result does not sit below the trace)
CANCELLED = "cancelled"  # the error of a request cut short by a cancellation
STALLED = "stalled"  # the error of a request open when the stall watchdog stopped the run

MAX_ERROR_CHARS = 500
# How far the server's ``usage`` may disagree with what perflab saw before the request is an
# error (docs/benchmark.md "Token counts"). Every event that carries output holds at least one
# token, and any number when the server merges them (speculative decoding, --stream-interval,
# vLLM's API server merging a request's deltas while it is behind: a whole answer in one
# event), so completion_tokens may exceed the events up to max_tokens, and fall short of them
# by the slack only (a closing chunk with an empty delta some servers send). The prompt: an
# exact client tokenizer's count within this factor either way, plus a chat template's tokens.
USAGE_EVENT_SLACK = 1
PROMPT_COUNT_FACTOR = 2.0
PROMPT_TEMPLATE_TOKENS = 512
USAGE_ERROR = "the server's token counts are impossible"


@dataclass(slots=True, eq=False)  # identity: open requests are kept in a set
class Capture:
    """What the HTTP client records for one request while the benchmark runs."""

    index: int
    start: float = 0.0  # when the request was issued (before a connection is taken)
    queued: float = 0.0  # when it was due (its arrival time, before --max-concurrency's wait)
    end: float = 0.0  # when the response ended or failed
    status: int = 0
    reason: str = ""
    headers: dict[str, str] = field(default_factory=dict)  # lower-case names
    reads: list[tuple[float, bytes]] = field(default_factory=list)  # body bytes per read
    error: str | None = None  # transport error: refused, reset, timeout, truncated
    trace: RequestTrace | None = None  # parsed early when raw captures outgrow their budget


@dataclass(slots=True)
class RequestTrace:
    """One request as the metrics see it (vLLM's ``RequestFuncOutput``, plus chunk tokens).

    ``chunk_times`` are the arrival times of the chunks that carry ``choices``, relative to
    ``start``: the first is the TTFT, the gaps are the ITLs and the last is the latency
    (E2EL). ``chunk_tokens`` is how many output tokens each of those chunks carried, when
    known (``None``: spread ``output_tokens`` evenly over the chunks).
    """

    success: bool
    start: float = 0.0
    chunk_times: list[float] = field(default_factory=list)
    output_tokens: int = 0
    prompt_len: int = 0  # client-side count of the prompt
    server_prompt_tokens: int | None = None  # usage.prompt_tokens
    chunk_tokens: list[float] | None = None
    error: str = ""
    generated_text: str = ""
    output_tokens_source: str = "usage"  # "usage" | "tokenizer" | "chunks"
    index: int = -1
    queue_time: float = 0.0  # waited for --max-concurrency (vLLM's client_queue_time)
    # the server-clock protocol: the server's own stamps (perflab.bench.serverclock.SERVER_CLOCK_COMMENT)
    # — the request's arrival and each output chunk's step end, absolute model seconds; None
    # when a chunk carrying output came without one. Used only when the lab knows the engine
    # is simulated (runner: BenchRequest.server_clock and the probe's answer).
    model_arrival: float | None = None
    model_times: list[float] | None = None
    usage_mismatch: bool = False  # failed because the server's counts are impossible (USAGE_ERROR)
    over_max_tokens: bool = False  # more output than the request's max_tokens (also a usage_mismatch)

    @property
    def ttft(self) -> float:
        return self.chunk_times[0] if self.chunk_times else 0.0

    @property
    def latency(self) -> float:
        return self.chunk_times[-1] if self.chunk_times else 0.0

    @property
    def itl(self) -> list[float]:
        t = self.chunk_times
        return [t[i] - t[i - 1] for i in range(1, len(t))]

    @property
    def input_tokens(self) -> int:
        return self.server_prompt_tokens if self.server_prompt_tokens is not None else self.prompt_len

    @classmethod
    def from_itl(cls, *, start: float, ttft: float, itl: list[float], output_tokens: int, **kw: Any) -> RequestTrace:
        """A successful trace from vLLM's view of a request (TTFT and the chunk gaps)."""
        times = [ttft]
        for gap in itl:
            times.append(times[-1] + gap)
        return cls(success=True, start=start, chunk_times=times, output_tokens=output_tokens, **kw)

    def scaled(self, factor: float) -> RequestTrace:
        """The same trace with every duration multiplied (simulated time compression)."""
        if factor == 1.0:
            return self
        return dataclasses.replace(self, start=self.start * factor, chunk_times=[t * factor for t in self.chunk_times],
                                   queue_time=self.queue_time * factor)

    def on_model_clock(self, origin: float) -> RequestTrace:
        """The same trace timed by the engine's model-clock stamps: ``start`` is the arrival
        relative to ``origin``, ``chunk_times`` relative to the arrival. Requires the stamps
        (:attr:`model_arrival`, :attr:`model_times`) of a successful trace."""
        assert self.model_arrival is not None and self.model_times is not None
        self.start = self.model_arrival - origin
        self.chunk_times = [t - self.model_arrival for t in self.model_times]
        return self


def _clip(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 3] + "..."


def _error_message(obj: Any) -> str:
    """The message of an OpenAI-style error object, whatever its nesting."""
    if isinstance(obj, dict):
        err = obj.get("error", obj)
        if isinstance(err, dict):
            msg = err.get("message") or err.get("msg") or err.get("detail")
            if msg is None:
                msg = json.dumps(err)
            code = err.get("type") or err.get("code")
            return f"{msg} ({code})" if code and str(code) not in str(msg) else str(msg)
        return str(err)
    return str(obj)


def _http_error(cap: Capture) -> str:
    body = b"".join(piece for _, piece in cap.reads)
    detail = ""
    if body:
        try:
            detail = _error_message(json.loads(body))
        except ValueError:
            detail = body.decode("utf-8", "replace")
    head = f"HTTP {cap.status} {cap.reason}".rstrip()
    return _clip(f"{head}: {detail}" if detail else head)


def _chunk_text(choice: Any) -> str:
    if not isinstance(choice, dict):
        return ""
    text = choice.get("text")
    if text is None:
        delta = choice.get("delta")
        if isinstance(delta, dict):
            # Reasoning models stream their thinking in reasoning (vLLM >= 0.10) or
            # reasoning_content (SGLang, older vLLM); it is output too.
            text = (delta.get("content") or "") + (delta.get("reasoning_content") or delta.get("reasoning") or "")
    return text if isinstance(text, str) else ""


def has_streamed_output(choice: Any) -> bool:
    """Whether a chunk's first choice carries a generated token (it then times TTFT/ITL).

    Chat chunks follow vLLM 0.33.0's ``_choice_has_streamed_output``
    (vllm/benchmarks/lib/endpoint_request_func.py): a delta with non-empty ``content``,
    ``reasoning``, ``tool_calls`` or ``function_call`` — plus ``reasoning_content``, which
    SGLang and vLLM < 0.10 use — is output; so is ``"content": ""`` without ``role`` (a
    token that decoded to nothing: a special token, or the first bytes of a UTF-8 character
    split over tokens — the real vLLM 0.32 capture tests/fixtures/real/vllm-0.32.0-cpu/
    chat_stream.txt streams 8 chunks of this kind for ``completion_tokens`` 8). Not output:
    the opening ``{"role": "assistant", "content": ""}`` chunk (vLLM) or
    ``{"role": "assistant", "content": null}`` (llama-server), an empty ``delta: {}``
    finish chunk (llama-server), a choice without a delta.

    Completions chunks: vLLM 0.33 counts every chunk with choices ("text could be empty
    here, e.g. for special tokens"); perflab does the same except for a chunk whose text is
    empty *and* that carries a ``finish_reason``: llama-server's closing chunk
    (tests/fixtures/real/llama-server/completions_stream.txt: 5 text chunks, then
    ``{"text": "", "finish_reason": "length"}``, ``completion_tokens`` 5) is no token.
    """
    if not isinstance(choice, dict):
        return False
    delta = choice.get("delta")
    if isinstance(delta, dict):
        if (delta.get("content") or delta.get("reasoning") or delta.get("reasoning_content")
                or delta.get("tool_calls") or delta.get("function_call")):
            return True
        return delta.get("content") == "" and "role" not in delta
    if "delta" in choice:  # "delta": null
        return False
    return bool(choice.get("text")) or choice.get("finish_reason") is None


# Chunks of one stream are the same bytes but for their text (vLLM, SGLang, the simulator):
# after one is parsed, the next that matches it outside a plain string literal is not decoded
# again (issue 27: the parse after the run cost more CPU than the run itself).
_TEXT_KEYS = (b'"content":"', b'"text":"', b'"content": "', b'"text": "')  # compact (vLLM, SGLang) or spaced JSON
_NOT_PLAIN = re.compile(rb'["\\\x00-\x1f]')  # what a JSON string cannot hold unescaped
_TEMPLATE_TRIES = 3


@dataclass(frozen=True, slots=True)
class _Template:
    """A parsed chunk carrying output, cut around its text: ``prefix + text + suffix``.

    Another chunk with the same prefix and suffix and a plain text in between (no quote,
    backslash or control character, valid UTF-8) is the same JSON with another string in
    that slot, so it carries output, holds no error and has the same ``usage``: only its text
    is new. :meth:`verified` proves on the chunk itself that the slot is its text.
    """

    prefix: bytes
    suffix: bytes
    usage: dict[str, Any] | None
    completion_tokens: Any
    # the template as SSE events in a read: ``head + text + tail``, ``sep`` between two
    head: bytes = field(init=False)
    tail: bytes = field(init=False)
    sep: bytes = field(init=False)
    frame: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "head", b"data: " + self.prefix)
        object.__setattr__(self, "tail", self.suffix + b"\n\n")
        object.__setattr__(self, "sep", self.tail + self.head)
        object.__setattr__(self, "frame", len(self.head) + len(self.tail))

    @classmethod
    def of(cls, data: bytes, text: str, usage: dict[str, Any] | None) -> _Template | None:
        for key in _TEXT_KEYS:
            at = data.find(key)
            if at >= 0:
                break
        else:
            return None
        begin = at + len(key)
        end = data.find(b'"', begin)
        if end <= begin:
            return None
        value = data[begin:end]
        if _NOT_PLAIN.search(value) is not None or value.decode("utf-8", "replace") != text:
            return None
        return cls(data[:begin], data[end:], usage, usage.get("completion_tokens") if usage is not None else None)

    def verified(self) -> bool:
        """Whether another text in the slot is the chunk's text, and the chunk still carries output."""
        try:
            obj = json.loads(self.prefix + b"#" + self.suffix)
        except ValueError:
            return False
        if not isinstance(obj, dict) or obj.get("error") or obj.get("object") == "error":
            return False
        choices = obj.get("choices")
        u = obj.get("usage")
        return (isinstance(choices, list) and bool(choices) and has_streamed_output(choices[0]) and _chunk_text(choices[0]) == "#"
                and (u if isinstance(u, dict) else None) == self.usage)

    def texts_of(self, piece: bytes) -> list[str] | None:
        """The texts of a network read that is nothing but whole ``data:`` events of this
        chunk with other plain, non-empty texts (the usual read); else None.

        ``piece`` must then be ``data: prefix v1 suffix\\n\\ndata: prefix v2 suffix\\n\\n...``:
        no ``v`` holds a quote and every separator starts with one (the suffix's), so splitting
        on the separator finds exactly the texts, and any other content leaves a quote or a
        line break in some part."""
        head, tail = self.head, self.tail
        if not piece.startswith(head) or not piece.endswith(tail) or len(piece) <= self.frame:
            return None
        middle = piece[len(head):len(piece) - len(tail)]
        values = middle.split(self.sep)
        if not all(values) or _NOT_PLAIN.search(b"".join(values) if len(values) > 1 else middle) is not None:
            return None
        try:
            return [v.decode("utf-8") for v in values]
        except UnicodeDecodeError:
            return None

    def text_of(self, data: bytes) -> str | None:
        """The text of ``data`` if it is this chunk with another plain, non-empty text; else None."""
        prefix, suffix = self.prefix, self.suffix
        if len(data) <= len(prefix) + len(suffix) or not data.startswith(prefix) or not data.endswith(suffix):
            return None
        value = data[len(prefix):len(data) - len(suffix)]
        if _NOT_PLAIN.search(value) is not None:
            return None
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return None


def parse_capture(cap: Capture, *, prompt_len: int, tokenizer: Tokenizer | None, keep_text: bool = False,
                  max_tokens: int | None = None, check_counts: bool = True) -> RequestTrace:
    """Turn a raw capture into a trace, with ``vllm bench serve``'s definitions.

    - TTFT: arrival of the first chunk that carries output (:func:`has_streamed_output`, vLLM
      0.33's rule): not the role-only opening chunk, not an empty finish chunk.
    - ITL: the gaps between the chunks that carry output; E2EL: the last of them.
    - Output tokens: ``usage.completion_tokens`` of the stream (``stream_options.include_usage``);
      without usage, the tokenizer's count of the generated text; without a tokenizer, the
      number of chunks.
    - Failures: a transport error, a non-200 status, no chunk with choices, and — unlike
      vLLM, which counts such a request as a success — an ``{"error": ...}`` object (or an
      ``event: error``) inside the stream, even after tokens were received; and with
      ``check_counts``, token counts that cannot be true (:func:`count_problem`: ``usage``
      against the streamed events, ``max_tokens`` and an exact tokenizer) — unlike vLLM,
      which believes ``usage``.
    """
    trace = RequestTrace(success=False, start=cap.start, prompt_len=prompt_len, index=cap.index,
                         queue_time=max(cap.start - cap.queued, 0.0) if cap.queued and cap.start else 0.0)
    if cap.status == 0:
        trace.error = _clip(cap.error or "no response")
        return trace
    if cap.status != 200:
        trace.error = _http_error(cap)
        return trace

    parser = SSEParser(clock_prefix=SERVER_CLOCK_COMMENT)
    times: list[float] = []
    stamps: list[float] | None = []  # model clock of the chunks carrying output (None: one had none)
    arrival: float | None = None
    texts: list[str] = []
    cumulative: list[int | None] = []  # usage.completion_tokens carried by token chunks
    usage: dict[str, Any] | None = None
    stream_error: str | None = None
    start = cap.start

    tpl: _Template | None = None
    tries = 0  # templates verified (bounded: streams whose chunks all differ pay it a few times only)

    def handle(t: float, events: list[tuple[bytes, str, bytes | None]]) -> str | None:
        nonlocal usage, stamps, arrival, tpl, tries
        for data, event, ev_clock in events:
            if tpl is not None and event == "message":
                text = tpl.text_of(data)
                if text is not None:  # the template's chunk with another text: same verdicts
                    times.append(t - start)
                    if stamps is not None:
                        clock = parse_clock(ev_clock) if ev_clock is not None else None
                        if clock is None:
                            stamps = None
                        else:
                            stamps.append(clock[0])
                            arrival = clock[1]
                    texts.append(text)
                    cumulative.append(tpl.completion_tokens)
                    if tpl.usage is not None:
                        usage = tpl.usage
                    continue
            if data == b"[DONE]":
                continue
            try:
                obj = json.loads(data)
            except ValueError:
                return f"invalid JSON in stream: {data[:200].decode('utf-8', 'replace')}"
            if event == "error":
                return _error_message(obj)
            if not isinstance(obj, dict):
                continue
            if obj.get("error") or obj.get("object") == "error":
                return _error_message(obj)
            choices = obj.get("choices")
            u = obj.get("usage")
            if choices and has_streamed_output(choices[0]):
                times.append(t - start)
                if stamps is not None:
                    clock = parse_clock(ev_clock) if ev_clock is not None else None
                    if clock is None:
                        stamps = None
                    else:
                        stamps.append(clock[0])
                        arrival = clock[1]
                text = _chunk_text(choices[0])
                texts.append(text)
                cumulative.append(u.get("completion_tokens") if isinstance(u, dict) else None)
                if event == "message" and tries < _TEMPLATE_TRIES and (tpl is None or tpl.text_of(data) is None):
                    found = _Template.of(data, text, u if isinstance(u, dict) else None)
                    if found is not None:
                        tries += 1
                        tpl = found if found.verified() else tpl
            if isinstance(u, dict):
                usage = u
        return None

    for t, piece in cap.reads:
        if tpl is not None and parser.idle:
            got = tpl.texts_of(piece)
            if got is not None:  # whole events that differ from the template only in their text
                k = len(got)
                times.extend([t - start] * k)
                if stamps is not None:
                    clock = parse_clock(parser.clock) if parser.clock is not None else None
                    if clock is None:
                        stamps = None
                    else:
                        stamps.extend([clock[0]] * k)
                        arrival = clock[1]
                texts.extend(got)
                cumulative.extend([tpl.completion_tokens] * k)
                if tpl.usage is not None:
                    usage = tpl.usage
                continue
        stream_error = handle(t, parser.feed_data(piece))
        if stream_error:
            break
    if stream_error is None and cap.error is None:
        stream_error = handle(cap.end, parser.close_data())

    if stream_error is not None:
        trace.error = _clip(f"error in stream: {stream_error}")
        return trace
    if cap.error is not None:
        trace.error = _clip(cap.error)
        if check_counts and max_tokens is not None and len(times) > max_tokens + USAGE_EVENT_SLACK:
            # cut (a timeout) after streaming more than it was asked for: that is known already,
            # and it is the server's lie, not only a slow stream
            why, over = count_problem(None, len(times), prompt_len, max_tokens, tokenizer)
            trace.error = _clip(f"{USAGE_ERROR}: {why}; then {cap.error}")
            trace.usage_mismatch, trace.over_max_tokens = True, over
        return trace
    if not times:
        trace.error = "stream ended without a chunk carrying output (no token received)"
        return trace

    if check_counts:
        why, over = count_problem(usage, len(times), prompt_len, max_tokens, tokenizer)
        if why is not None:
            trace.error = _clip(f"{USAGE_ERROR}: {why}")
            trace.usage_mismatch, trace.over_max_tokens = True, over
            return trace
    trace.success = True
    trace.chunk_times = times
    if stamps and arrival is not None:
        trace.model_arrival, trace.model_times = arrival, stamps
    text = "".join(texts) if (keep_text or usage is None or tokenizer is not None) else ""
    completion = usage.get("completion_tokens") if usage else None
    if isinstance(completion, int) and completion > 0:
        trace.output_tokens = completion
        trace.output_tokens_source = "usage"
    elif tokenizer is not None:
        trace.output_tokens = tokenizer.count(text)
        trace.output_tokens_source = "tokenizer"
    else:
        trace.output_tokens = len(times)
        trace.output_tokens_source = "chunks"
    prompt_tokens = usage.get("prompt_tokens") if usage else None
    if isinstance(prompt_tokens, int):
        trace.server_prompt_tokens = prompt_tokens
    trace.chunk_tokens = _chunk_tokens(cumulative, texts, trace.output_tokens, tokenizer)
    if keep_text:
        trace.generated_text = text
    return trace


def _count(usage: dict[str, Any], key: str) -> tuple[int | None, str | None]:
    """``usage[key]`` as a token count, or why it is none (absent: neither)."""
    if key not in usage or usage[key] is None:
        return None, None
    value = usage[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None, f"usage.{key} is {json.dumps(value)[:40]}, not a token count"
    return value, None


def count_problem(usage: dict[str, Any] | None, events: int, prompt_len: int, max_tokens: int | None,
                  tokenizer: Tokenizer | None) -> tuple[str | None, bool]:
    """Why a successful stream's token counts cannot be true, or None; and whether its output
    went beyond ``max_tokens``. ``events``: the chunks that carried output; ``prompt_len``: the
    client's count of the prompt (0: unknown). Tolerances: :data:`USAGE_EVENT_SLACK`,
    :data:`PROMPT_COUNT_FACTOR`, :data:`PROMPT_TEMPLATE_TOKENS`."""
    if max_tokens is not None and events > max_tokens + USAGE_EVENT_SLACK:
        return f"{events} chunks carrying output were streamed, beyond max_tokens {max_tokens}", True
    if not usage:
        return None, False
    prompt, why = _count(usage, "prompt_tokens")
    if why is None:
        completion, why = _count(usage, "completion_tokens")
    if why is not None:
        return why, False
    if prompt is not None and prompt_len > 0:
        if prompt == 0:
            return f"usage.prompt_tokens is 0 for a prompt of about {prompt_len} tokens", False
        low, high = prompt_len / PROMPT_COUNT_FACTOR, prompt_len * PROMPT_COUNT_FACTOR + PROMPT_TEMPLATE_TOKENS
        if tokenizer is not None and tokenizer.exact and not low <= prompt <= high:
            return (f"usage.prompt_tokens {prompt} for a prompt of {prompt_len} tokens ({tokenizer.name}); "
                    f"expected {low:g} to {high:g}"), False
    if completion is not None:
        if max_tokens is not None and completion > max_tokens:
            return f"usage.completion_tokens {completion} is beyond max_tokens {max_tokens}", True
        if completion < events - USAGE_EVENT_SLACK:
            return f"usage.completion_tokens {completion} for {events} chunks carrying output", False
    return None, False


def _chunk_tokens(
    cumulative: list[int | None], texts: list[str], output_tokens: int, tokenizer: Tokenizer | None
) -> list[float] | None:
    """Tokens carried by each chunk, for a peak throughput that counts tokens, not chunks.

    Exact when the server reports cumulative usage on every chunk
    (``continuous_usage_stats``); exact on the simulator (one word per token); otherwise
    ``None`` and the metrics spread the request's tokens evenly over its chunks.
    """
    if cumulative and all(c is not None for c in cumulative):
        out: list[float] = []
        prev = 0
        for c in cumulative:
            out.append(float(c - prev))  # type: ignore[operator]
            prev = c  # type: ignore[assignment]
        return out
    if tokenizer is not None and tokenizer.kind == "whitespace":
        counts = [float(len(t.split())) for t in texts]
        total = sum(counts)
        if total <= 0:
            return None
        if total != output_tokens:
            factor = output_tokens / total
            counts = [c * factor for c in counts]
        return counts
    return None


def cancelled_trace(cap: Capture, prompt_len: int) -> RequestTrace:
    """A request cut short by a cancellation or the stall watchdog: failed, whatever it had
    received (its error says which)."""
    return RequestTrace(success=False, start=cap.start, prompt_len=prompt_len, error=cap.error or CANCELLED, index=cap.index)


def sent_traces(captures: list[Capture], parse: Callable[[Capture], RequestTrace], prompt_len: Callable[[int], int]) -> list[RequestTrace]:
    """Traces of a cancelled run's requests that were sent (the others are left out)."""
    out = []
    for cap in captures:
        if not cap.start:
            continue
        if cap.error in (CANCELLED, STALLED):
            out.append(cancelled_trace(cap, prompt_len(cap.index)))
        else:
            out.append(cap.trace or parse(cap))
    return out
