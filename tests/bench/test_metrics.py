"""Every metric on hand-built request traces, against values computed by hand.

The traces (times in seconds, relative to each request's start)::

    A  start 0.0  chunks at 0.1 0.3 0.6   3 tokens   prompt 10
    B  start 0.5  chunks at 0.2 0.4       5 tokens   prompt 20 (server says 22), chunks of 2 and 3 tokens
    C  start 1.0  chunk  at 0.3           1 token    prompt 30
    D  failed (connection refused)
    duration 2.0 s
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from perflab.bench.metrics import (
    compute_metrics,
    peak_concurrency,
    peak_output_tokens_per_s,
    percentile,
    std,
)
from perflab.bench.tokenizer import WhitespaceTokenizer
from perflab.bench.trace import Capture, RequestTrace, parse_capture


def traces() -> list[RequestTrace]:
    a = RequestTrace.from_itl(start=0.0, ttft=0.1, itl=[0.2, 0.3], output_tokens=3, prompt_len=10, index=0)
    b = RequestTrace.from_itl(start=0.5, ttft=0.2, itl=[0.2], output_tokens=5, prompt_len=20, server_prompt_tokens=22,
                              chunk_tokens=[2.0, 3.0], index=1)
    c = RequestTrace.from_itl(start=1.0, ttft=0.3, itl=[], output_tokens=1, prompt_len=30, index=2)
    d = RequestTrace(success=False, start=1.5, prompt_len=40, error="cannot connect", index=3)
    return [a, b, c, d]


def approx(x: float) -> object:
    return pytest.approx(x, abs=1e-9)


def test_counts_and_throughputs() -> None:
    m = compute_metrics(traces(), 2.0)
    assert m["completed"] == 3 and m["failed"] == 1
    # input: the server's count when it gave one (B: 22), else the client's; failed D not counted
    assert m["total_input_tokens"] == 10 + 22 + 30
    assert m["total_output_tokens"] == 3 + 5 + 1
    assert m["request_throughput"] == approx(3 / 2.0)
    assert m["output_throughput"] == approx(9 / 2.0)
    assert m["total_token_throughput"] == approx((62 + 9) / 2.0)
    assert m["duration"] == 2.0
    assert m["request_goodput"] is None


def test_ttft_tpot_itl_e2el() -> None:
    m = compute_metrics(traces(), 2.0, percentiles=(50, 99))
    # TTFT [0.1, 0.2, 0.3]
    assert m["mean_ttft_ms"] == approx(200.0)
    assert m["median_ttft_ms"] == approx(200.0)
    assert m["std_ttft_ms"] == approx(math.sqrt(0.02 / 3) * 1000)
    assert m["p50_ttft_ms"] == approx(200.0)
    assert m["p99_ttft_ms"] == approx(298.0)  # linear: 0.2 + 0.98 * 0.1
    # TPOT = (E2EL - TTFT) / (tokens - 1): A 0.5/2 = 0.25, B 0.2/4 = 0.05; C (1 token) has none
    assert m["mean_tpot_ms"] == approx(150.0)
    assert m["median_tpot_ms"] == approx(150.0)
    assert m["p99_tpot_ms"] == approx(248.0)  # 0.05 + 0.99 * 0.2
    # ITL: every chunk gap: A 0.2 0.3, B 0.2
    assert m["mean_itl_ms"] == approx(700.0 / 3)
    assert m["median_itl_ms"] == approx(200.0)
    assert m["p99_itl_ms"] == approx(298.0)
    # E2EL = last chunk: A 0.6, B 0.4, C 0.3
    assert m["mean_e2el_ms"] == approx(1300.0 / 3)
    assert m["median_e2el_ms"] == approx(400.0)
    assert m["p99_e2el_ms"] == approx(596.0)  # 0.4 + 0.98 * 0.2


def test_peak_output_counts_tokens_not_chunks() -> None:
    # Second 0 gets A's 3 chunks (3 tokens, spread evenly) and B's 2 chunks (2 + 3 tokens):
    # 8 tokens; vLLM would count 5 chunks (issue 37666). Second 1 gets C's token.
    assert peak_output_tokens_per_s(traces()) == approx(8.0)
    # Without a per-chunk split, B's 5 tokens are spread evenly over its 2 chunks: still 8.
    t = traces()
    t[1].chunk_tokens = None
    assert peak_output_tokens_per_s(t) == approx(8.0)
    # The peak can never be below the average when tokens come bundled.
    bundled = [RequestTrace.from_itl(start=0.0, ttft=0.1, itl=[0.2] * 3, output_tokens=16, index=0)]
    m = compute_metrics(bundled, 1.0)
    assert m["max_output_tokens_per_s"] == approx(16.0) and m["output_throughput"] == approx(16.0)


def test_peak_concurrency_half_open_intervals() -> None:
    assert peak_concurrency(traces()) == 2  # A [0, 0.6) overlaps B [0.5, 0.9); C starts at 1.0
    back_to_back = [
        RequestTrace.from_itl(start=0.0, ttft=0.5, itl=[0.5], output_tokens=2),
        RequestTrace.from_itl(start=1.0, ttft=0.5, itl=[], output_tokens=1),
    ]
    assert peak_concurrency(back_to_back) == 1  # one ends at 1.0 exactly when the next starts
    assert compute_metrics(traces(), 2.0)["max_concurrent_requests"] == 2


def test_goodput() -> None:
    # ttft <= 250 ms and tpot <= 100 ms: A fails tpot (250), B passes, C fails ttft (300)
    m = compute_metrics(traces(), 2.0, goodput={"ttft": 250, "tpot": 100})
    assert m["request_goodput"] == approx(1 / 2.0)
    # e2el <= 500 ms: B (400) and C (300); a one-token request counts TPOT 0 for goodput
    m = compute_metrics(traces(), 2.0, goodput={"e2el": 500, "tpot": 0})
    assert m["request_goodput"] == approx(1 / 2.0)  # C only: B's tpot 50 ms > 0
    m = compute_metrics(traces(), 2.0, goodput={"e2el": 500})
    assert m["request_goodput"] == approx(2 / 2.0)


def test_all_failed_gives_zeros_like_vllm() -> None:
    m = compute_metrics([RequestTrace(success=False, error="x")] * 3, 1.0)
    assert m["completed"] == 0 and m["failed"] == 3
    assert m["mean_ttft_ms"] == 0.0 and m["p99_itl_ms"] == 0.0
    assert m["max_output_tokens_per_s"] == 0.0 and m["max_concurrent_requests"] == 0


def test_numpy_compatible_statistics() -> None:
    xs = [0.3, 1.7, 0.2, 9.1, 4.4, 4.4, 0.05]
    for p in (1, 25, 50, 90, 95, 99, 99.9):
        assert percentile(xs, p) == pytest.approx(float(np.percentile(xs, p)))
    assert std(xs) == pytest.approx(float(np.std(xs)))
    assert percentile([], 99) == 0.0 and percentile([2.0], 99) == 2.0


def test_percentile_key_spelling() -> None:
    m = compute_metrics(traces(), 2.0, percentiles=(99.9, 95))
    assert "p99.9_ttft_ms" in m and "p95_e2el_ms" in m


# --------------------------------------------------------------------------- from raw streams


def sse(*objs: object) -> bytes:
    return b"".join(b"data: " + (o if isinstance(o, bytes) else json.dumps(o).encode()) + b"\n\n" for o in objs)


def chunk(text: str, usage: dict | None = None) -> dict:
    out: dict = {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}
    if usage is not None:
        out["usage"] = usage
    return out


def usage(prompt: int, completion: int) -> dict:
    return {"choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}}


def cap(*reads: tuple[float, bytes], status: int = 200, error: str | None = None, end: float = 9.0) -> Capture:
    return Capture(index=0, start=10.0, end=10.0 + end, status=status, reads=[(10.0 + t, b) for t, b in reads], error=error)


def test_trace_from_stream_vllm_definitions() -> None:
    c = cap(
        (0.02, sse({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})),  # role only: no token
        (0.05, sse(chunk(" tok"))),  # TTFT: the first chunk carrying output (vLLM 0.33)
        (0.15, sse(chunk(" tok"))),
        (0.40, sse(chunk(" tok"), usage(8, 3), b"[DONE]")),  # usage chunk: choices [] -> no token
    )
    t = parse_capture(c, prompt_len=8, tokenizer=WhitespaceTokenizer())
    assert t.success and t.error == ""
    assert t.ttft == approx(0.05)
    assert t.itl == pytest.approx([0.1, 0.25])
    assert t.latency == approx(0.40)
    assert t.output_tokens == 3 and t.output_tokens_source == "usage"
    assert t.server_prompt_tokens == 8
    assert t.chunk_tokens == [1.0, 1.0, 1.0]


def test_multi_token_chunks_are_counted_per_chunk() -> None:
    c = cap((0.1, sse(chunk(" tok tok tok"))), (0.2, sse(chunk(" tok tok"), usage(4, 5))))
    t = parse_capture(c, prompt_len=4, tokenizer=WhitespaceTokenizer())
    assert t.output_tokens == 5 and t.chunk_tokens == [3.0, 2.0]
    m = compute_metrics([t], 1.0)
    assert m["mean_tpot_ms"] == approx(100.0 / 4)  # (0.2 - 0.1) / (5 - 1)
    assert m["mean_itl_ms"] == approx(100.0)  # one gap between the two chunks
    assert m["max_output_tokens_per_s"] == approx(5.0)


def test_continuous_usage_gives_exact_chunk_tokens() -> None:
    c = cap(
        (0.1, sse(chunk("a", {"completion_tokens": 1}))),
        (0.2, sse(chunk("bcd", {"completion_tokens": 4}))),
        (0.3, sse(usage(2, 4))),
    )
    t = parse_capture(c, prompt_len=2, tokenizer=None)
    assert t.chunk_tokens == [1.0, 3.0] and t.output_tokens == 4


def test_single_token_output() -> None:
    t = parse_capture(cap((0.2, sse(chunk(" tok"), usage(3, 1)))), prompt_len=3, tokenizer=None)
    assert t.success and t.output_tokens == 1 and t.itl == []
    m = compute_metrics([t], 1.0)
    assert m["mean_ttft_ms"] == approx(200.0) and m["mean_e2el_ms"] == approx(200.0)
    assert m["mean_tpot_ms"] == 0.0  # no request with more than one token: vLLM's "or 0"


def test_error_object_in_stream_is_a_failure() -> None:
    # vLLM's client would count this request as a success (it only looks at choices/usage).
    c = cap(
        (0.1, sse(chunk(" tok"))),
        (0.2, sse({"error": {"message": "CUDA out of memory", "type": "InternalServerError", "code": 500}})),
    )
    t = parse_capture(c, prompt_len=1, tokenizer=None)
    assert not t.success
    assert "CUDA out of memory" in t.error and t.error.startswith("error in stream")
    older = cap((0.1, sse({"object": "error", "message": "boom", "type": "BadRequestError", "code": 400})))
    assert "boom" in parse_capture(older, prompt_len=1, tokenizer=None).error
    event = cap((0.1, b'event: error\ndata: {"message": "overloaded"}\n\n'))
    assert "overloaded" in parse_capture(event, prompt_len=1, tokenizer=None).error
    m = compute_metrics([t, parse_capture(cap((0.1, sse(chunk("x"), usage(1, 1)))), prompt_len=1, tokenizer=None)], 1.0)
    assert m["completed"] == 1 and m["failed"] == 1


def test_other_failures() -> None:
    http = Capture(index=0, start=0.0, status=503, reason="Service Unavailable", reads=[(0.1, b'{"error": {"message": "queue full"}}')])
    t = parse_capture(http, prompt_len=1, tokenizer=None)
    assert not t.success and t.error == "HTTP 503 Service Unavailable: queue full"
    refused = Capture(index=0, status=0, error="cannot connect to 127.0.0.1:1: Connection refused")
    assert "Connection refused" in parse_capture(refused, prompt_len=1, tokenizer=None).error
    no_token = cap((0.1, sse(usage(2, 0), b"[DONE]")))
    assert "no token" in parse_capture(no_token, prompt_len=2, tokenizer=None).error
    cut = cap((0.1, sse(chunk("a"))), error="connection closed by the server before the response ended")
    assert not parse_capture(cut, prompt_len=1, tokenizer=None).success
    garbage = cap((0.1, b"data: {not json\n\n"))
    assert "invalid JSON" in parse_capture(garbage, prompt_len=1, tokenizer=None).error


def test_output_tokens_without_usage() -> None:
    c = cap((0.1, sse(chunk(" a b"))), (0.2, sse(chunk(" c"))))
    with_tok = parse_capture(c, prompt_len=1, tokenizer=WhitespaceTokenizer())
    assert with_tok.output_tokens == 3 and with_tok.output_tokens_source == "tokenizer"
    without = parse_capture(c, prompt_len=1, tokenizer=None)
    assert without.output_tokens == 2 and without.output_tokens_source == "chunks"


def test_time_scale_multiplies_durations() -> None:
    t = RequestTrace.from_itl(start=0.5, ttft=0.01, itl=[0.002], output_tokens=2)
    s = t.scaled(20.0)
    assert s.start == approx(10.0) and s.ttft == approx(0.2) and s.itl == pytest.approx([0.04])
    assert s.output_tokens == 2
