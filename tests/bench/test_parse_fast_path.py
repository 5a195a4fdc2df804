"""The parse after the run skips ``json.loads`` for chunks that repeat a parsed one but for
their text (perflab.bench.trace._Template); it must give exactly the traces of the full parse.

Streams are generated from a fixed seed: chat and completions, compact and spaced JSON, texts
with quotes, backslashes, control characters, non-ASCII and empty strings, role, finish and
usage chunks, continuous usage, reasoning deltas, errors in the stream, invalid JSON and
UTF-8, model-clock comments, and every way of cutting the bytes into network reads.
"""

from __future__ import annotations

import json
import random

import pytest

from perflab.bench import trace as trace_mod
from perflab.bench.tokenizer import load_tokenizer
from perflab.bench.trace import Capture, parse_capture

TEXTS = [" tok", " a b", "é", "日本", 'say "hi"', "back\\slash", "new\nline", "\t", "", "\u2028", "😀", "\x01", "#", "x"]


def _chunk(rng: random.Random, chat: bool, text: str, compact: bool, usage: dict | None) -> bytes:
    if chat:
        delta: dict = {"content": text}
        if rng.random() < 0.05:
            delta["reasoning_content"] = "think"
        choice: dict = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}
        obj: dict = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [choice]}
    else:
        obj = {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "m",
               "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": None}]}
    if usage is not None:
        obj["usage"] = usage
    body = json.dumps(obj, separators=(",", ":") if compact else (", ", ": "), ensure_ascii=rng.random() < 0.3)
    return b"data: " + body.encode() + b"\n\n"


def _stream(rng: random.Random) -> tuple[bytes, int]:
    chat, compact = rng.random() < 0.7, rng.random() < 0.8
    continuous = rng.random() < 0.15
    n = rng.randint(1, 40)
    plain = rng.random() < 0.6  # most streams: plain texts only (the path taken in practice)
    out = []
    if chat and rng.random() < 0.5:
        out.append(b'data: {"id":"chatcmpl-1","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n')
    for i in range(n):
        text = rng.choice([" tok", " w", "é"]) if plain else rng.choice(TEXTS)
        if rng.random() < 0.03:
            out.append(b": perflab-server-clock %f 0.5\n" % (i * 0.01))
        out.append(_chunk(rng, chat, text, compact, {"prompt_tokens": 4, "completion_tokens": i + 1} if continuous else None))
        r = rng.random()
        if r < 0.01:
            out.append(b'data: {"error":{"message":"boom","type":"server_error"}}\n\n')
        elif r < 0.02:
            out.append(b'data: {"choices":[{"index":0,"delta":{"content":"\xff\xfe"}}]}\n\n')
        elif r < 0.03:
            out.append(b"data: {not json\n\n")
        elif r < 0.04:
            out.append(b"event: error\n" + _chunk(rng, chat, " tok", compact, None))
    if chat and rng.random() < 0.5:
        out.append(b'data: {"id":"chatcmpl-1","choices":[{"index":0,"delta":{},"finish_reason":"length"}]}\n\n')
    out.append(b'data: {"id":"x","choices":[],"usage":{"prompt_tokens":4,"completion_tokens":%d}}\n\n' % n)
    out.append(b"data: [DONE]\n\n")
    events = out
    # reads: one event each, several events, or arbitrary cuts (also inside events)
    how = rng.random()
    if how < 0.4:
        pieces = events
    elif how < 0.7:
        pieces = []
        while events:
            k = rng.randint(1, 4)
            pieces.append(b"".join(events[:k]))
            events = events[k:]
    else:
        raw = b"".join(events)
        cuts = sorted(rng.sample(range(1, len(raw)), min(len(raw) - 1, rng.randint(1, 30))))
        pieces = [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)], strict=True)]
    return pieces, n


def _cap(pieces: list[bytes]) -> Capture:
    reads = [(0.01 * (i + 1), p) for i, p in enumerate(pieces)]
    return Capture(index=0, start=0.0, end=0.01 * (len(pieces) + 1), status=200, reads=reads)


@pytest.mark.parametrize("tokenizer", [None, "whitespace"])
def test_the_fast_path_gives_the_full_parse_trace(monkeypatch: pytest.MonkeyPatch, tokenizer: str | None) -> None:
    tok = load_tokenizer(tokenizer) if tokenizer else None
    rng = random.Random(27)
    decoded = [0]
    loads = json.loads

    def counting(data, *a, **kw):  # type: ignore[no-untyped-def]
        decoded[0] += 1
        return loads(data, *a, **kw)

    monkeypatch.setattr(trace_mod.json, "loads", counting)
    chunks = 0
    for _ in range(300):
        pieces, n = _stream(rng)
        kw = dict(prompt_len=4, tokenizer=tok, keep_text=True, max_tokens=64)
        fast = parse_capture(_cap(pieces), **kw)
        with monkeypatch.context() as m:
            m.setattr(trace_mod, "_TEMPLATE_TRIES", 0)
            full = parse_capture(_cap(pieces), **kw)
        assert fast == full, pieces
        chunks += n
    # the fast path was taken: far fewer decodes than chunks (the full parse decodes each)
    assert decoded[0] < 1.6 * chunks
