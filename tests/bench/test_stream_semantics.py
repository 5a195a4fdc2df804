"""Which streamed chunks are tokens: vLLM 0.33's rule, checked on real engines' streams.

The streams in tests/fixtures/real/ were captured from vLLM 0.32.0 (CPU build) and
llama.cpp's llama-server (see tests/fixtures/real/README.md). They are replayed through the
client's parser with one network read per SSE event, read i arriving at ``0.1 * (i + 1)`` s.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pytest import approx

from perflab.bench.metrics import compute_metrics
from perflab.bench.trace import Capture, has_streamed_output, parse_capture

REAL = Path(__file__).resolve().parents[1] / "fixtures" / "real"
STEP = 0.1


def _events(name: str) -> list[bytes]:
    raw = (REAL / name).read_bytes()
    head_end = raw.find(b"\r\n\r\n")
    if raw.startswith(b"HTTP/"):  # llama-server's chat capture starts with the response head
        raw = raw[head_end + 4 :]
    return [e + b"\n\n" for e in raw.split(b"\n\n") if e.strip()]


def _replay(name: str) -> tuple[Capture, list[dict]]:
    events = _events(name)
    reads = [(STEP * (i + 1), e) for i, e in enumerate(events)]
    objs = [json.loads(e[len(b"data: "):]) for e in events if e.strip() != b"data: [DONE]"]
    return Capture(index=0, start=0.0, end=STEP * (len(events) + 1), status=200, reads=reads), objs


def _sse(obj: dict) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def test_vllm_chat_role_chunk_is_not_the_first_token() -> None:
    cap, objs = _replay("vllm-0.32.0-cpu/chat_stream.txt")
    assert objs[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    t = parse_capture(cap, prompt_len=16, tokenizer=None)
    assert t.success
    # read 1 is the role chunk; the first token (" test") is read 2
    assert t.ttft == approx(2 * STEP)
    # 8 chunks carry output (the empty-content one included) for usage.completion_tokens 8
    assert len(t.chunk_times) == 8 == t.output_tokens
    assert t.itl == approx([STEP] * 7)
    assert t.latency == approx(9 * STEP)  # the finish chunk with " bytes"; not the usage chunk
    assert t.server_prompt_tokens == 16


def test_vllm_chat_empty_content_chunk_is_a_token_as_in_vllm_033() -> None:
    """vLLM streams ``{"content": ""}`` (no role) for a token that decodes to nothing — here
    the first bytes of a split UTF-8 character. usage.completion_tokens (8) equals the number
    of such chunks only if it is counted: dropping it would merge two token gaps into one ITL."""
    _, objs = _replay("vllm-0.32.0-cpu/chat_stream.txt")
    deltas = [o["choices"][0]["delta"] for o in objs if o["choices"]]
    assert {"content": ""} in deltas
    assert sum(has_streamed_output(o["choices"][0]) for o in objs if o["choices"]) == objs[-1]["usage"]["completion_tokens"]


def test_vllm_continuous_usage_counts_tokens_per_chunk_without_the_role_chunk() -> None:
    cap, _ = _replay("vllm-0.32.0-cpu/chat_stream_continuous_usage.txt")
    t = parse_capture(cap, prompt_len=12, tokenizer=None)
    assert t.ttft == approx(2 * STEP)
    assert t.chunk_tokens == [1.0, 1.0, 1.0] and t.output_tokens == 3
    assert t.itl == approx([STEP, STEP])


@pytest.mark.parametrize("name,tokens", [("vllm-0.32.0-cpu/completions_stream.txt", 8),
                                         ("vllm-0.32.0-cpu/completions_stream_continuous_usage.txt", 3)])
def test_vllm_completions_every_text_chunk_is_a_token(name: str, tokens: int) -> None:
    cap, _ = _replay(name)
    t = parse_capture(cap, prompt_len=1, tokenizer=None)
    assert t.ttft == approx(STEP)
    assert len(t.chunk_times) == tokens == t.output_tokens
    assert t.latency == approx(tokens * STEP)


def test_llama_server_chat_role_null_content_and_empty_finish_delta_are_not_tokens() -> None:
    cap, objs = _replay("llama-server/chat_stream.txt")
    assert objs[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}
    assert objs[-2]["choices"][0]["delta"] == {} and objs[-2]["choices"][0]["finish_reason"] == "length"
    t = parse_capture(cap, prompt_len=21, tokenizer=None)
    # reads: role, 6 tokens, empty finish delta, usage, [DONE]
    assert t.ttft == approx(2 * STEP)
    assert len(t.chunk_times) == 6 == t.output_tokens
    assert t.itl == approx([STEP] * 5)
    assert t.latency == approx(7 * STEP)


def test_llama_server_completions_empty_finish_chunk_is_not_a_token() -> None:
    cap, objs = _replay("llama-server/completions_stream.txt")
    last = objs[-1]["choices"][0]
    assert last["text"] == "" and last["finish_reason"] == "length"
    t = parse_capture(cap, prompt_len=7, tokenizer=None)
    assert t.ttft == approx(STEP)
    assert len(t.chunk_times) == 5 == t.output_tokens
    assert t.latency == approx(5 * STEP)  # the finish chunk (read 6) does not extend E2EL


def _synthetic(*extra: tuple[float, dict]) -> Capture:
    """Three tokens at 0.30, 0.40, 0.60 s plus ``extra`` (time, chunk) reads, usage at the end."""
    def tok(text: str) -> dict:
        return {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}

    reads = [(0.30, tok(" a")), (0.40, tok(" b")), (0.60, tok(" c")), *extra,
             (0.95, {"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 3}})]
    reads.sort(key=lambda r: r[0])
    return Capture(index=0, start=0.0, end=1.0, status=200, reads=[(t, _sse(o)) for t, o in reads])


def test_role_chunk_empty_finish_delta_and_null_content_change_neither_ttft_nor_itl() -> None:
    base = parse_capture(_synthetic(), prompt_len=4, tokenizer=None)
    noisy = parse_capture(
        _synthetic(
            (0.01, {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}),
            (0.05, {"choices": [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}]}),
            (0.50, {"choices": [{"index": 0, "delta": {"content": None}, "finish_reason": None}]}),
            (0.70, {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}),
            (0.80, {"choices": [{"index": 0, "delta": None, "finish_reason": "stop"}]}),
        ),
        prompt_len=4,
        tokenizer=None,
    )
    assert base.ttft == approx(0.30) and base.itl == approx([0.10, 0.20])
    assert noisy.ttft == base.ttft and noisy.itl == base.itl and noisy.latency == base.latency
    m0, m1 = compute_metrics([base], 1.0), compute_metrics([noisy], 1.0)
    for key in ("mean_ttft_ms", "mean_itl_ms", "mean_tpot_ms", "mean_e2el_ms"):
        assert m1[key] == approx(m0[key])


def test_reasoning_deltas_are_output() -> None:
    for field in ("reasoning", "reasoning_content"):
        cap = _synthetic((0.10, {"choices": [{"index": 0, "delta": {field: "think"}, "finish_reason": None}]}))
        t = parse_capture(cap, prompt_len=4, tokenizer=None, keep_text=True)
        assert t.ttft == approx(0.10), field
        assert t.generated_text.startswith("think")


def test_tool_call_deltas_are_output() -> None:
    call = {"tool_calls": [{"index": 0, "function": {"arguments": "{"}}]}
    t = parse_capture(_synthetic((0.2, {"choices": [{"index": 0, "delta": call}]})), prompt_len=4, tokenizer=None)
    assert t.ttft == approx(0.2)


def test_a_stream_with_only_a_role_chunk_is_a_failure() -> None:
    role = {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
    cap = Capture(index=0, start=0.0, end=1.0, status=200, reads=[(0.1, _sse(role)), (0.2, b"data: [DONE]\n\n")])
    t = parse_capture(cap, prompt_len=4, tokenizer=None)
    assert not t.success and "no token" in t.error
