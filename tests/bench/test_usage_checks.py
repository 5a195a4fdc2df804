"""Figures that cannot lie (issue 24 item 8): the server's ``usage`` checked against what the
client saw, a started stream cut at a limit derived from its request, absurd lengths refused.

The lying and endless servers are behaviours of the in-test streaming server (conftest.py).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from perflab.bench import BenchRequest, BenchResult, run_benchmark_sync
from perflab.bench.client import make_target, prepare
from perflab.bench.datasets import iter_samples
from perflab.bench.runner import _prepare_all
from perflab.bench.tokenizer import WhitespaceTokenizer
from perflab.bench.trace import Capture, count_problem, parse_capture
from perflab.cli.bench_cmd import EXIT_IMPOSSIBLE_COUNTS
from perflab.contract.status import Status
from perflab.lab.plan import Profile
from perflab.lab.run.executor import Executor

from .conftest import FakeOpenAIServer
from .test_bench_cli import run_cli

REAL = Path(__file__).resolve().parents[1] / "fixtures" / "real"


def _sse(obj: dict) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def _capture(events: int, usage: dict | None, per_event: str = " tok") -> Capture:
    reads = [(0.1 * (i + 1), _sse({"choices": [{"index": 0, "text": per_event, "finish_reason": None}]})) for i in range(events)]
    if usage is not None:
        reads.append((0.1 * (events + 1), _sse({"choices": [], "usage": usage})))
    reads.append((0.1 * (events + 2), b"data: [DONE]\n\n"))
    return Capture(index=0, start=0.0, end=0.1 * (events + 3), status=200, reads=reads)


# --------------------------------------------------------------------------- the CLI, end to end


def test_a_server_lying_about_usage_fails_its_requests_names_them_and_exits_5(
        fake_server: FakeOpenAIServer, capsys: pytest.CaptureFixture[str]) -> None:
    # issue 24's reproduction: 16 tokens streamed, usage prompt_tokens -5, completion_tokens 1000000
    code, out, err = run_cli(capsys, "--base-url", fake_server.base_url, "--model", "lying-usage", "--num-prompts", "10",
                             "--random-input-len", "8", "--random-output-len", "16")
    assert code == EXIT_IMPOSSIBLE_COUNTS == 5, err
    assert "Successful requests:                     0" in out
    assert "Failed requests:                         10" in out
    assert "Impossible token counts (failed):        10" in out
    assert "Total generated tokens:                  0" in out  # never 10,000,000
    assert "usage.prompt_tokens is -5, not a token count" in err
    assert "the server reported impossible token counts for 10 request(s); they count as failed; exit code 5" in err


def test_output_beyond_max_tokens_is_flagged_and_counted_in_json(
        fake_server: FakeOpenAIServer, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "--base-url", fake_server.base_url, "--model", "beyond-max-1", "--num-prompts", "4",
                             "--random-input-len", "8", "--random-output-len", "5", "--json")
    assert code == 5, err
    j = json.loads(out)
    assert (j["completed"], j["failed"], j["usage_mismatches"], j["over_max_tokens"]) == (0, 4, 4, 4)
    assert "usage.completion_tokens 6 is beyond max_tokens 5" in err
    assert "4 of them beyond max_tokens" in err


def test_an_honest_server_has_no_impossible_counts(fake_server: FakeOpenAIServer, capsys: pytest.CaptureFixture[str]) -> None:
    # several tokens per chunk (speculative decoding) is not a lie
    code, out, err = run_cli(capsys, "--base-url", fake_server.base_url, "--model", "multi-4", "--num-prompts", "6",
                             "--random-input-len", "8", "--random-output-len", "16", "--json")
    assert code == 0, err
    j = json.loads(out)
    assert (j["completed"], j["usage_mismatches"], j["over_max_tokens"], j["total_output_tokens"]) == (6, 0, 0, 96)


@pytest.mark.parametrize("flag", ["--random-input-len", "--random-output-len", "--random-prefix-len",
                                  "--multi-turn-input-len"])
def test_absurd_lengths_are_refused_at_once(capsys: pytest.CaptureFixture[str], flag: str) -> None:
    t0 = time.monotonic()
    code, out, err = run_cli(capsys, "--base-url", "http://127.0.0.1:9", "--model", "m", flag, "100000000")
    assert time.monotonic() - t0 < 5
    assert code == 2, err
    assert out == "" and len(err.strip().splitlines()) == 1
    assert f"{flag} 100000000: longer than any model's context" in err


def test_prefix_and_input_together_beyond_any_context_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(capsys, "--base-url", "http://127.0.0.1:9", "--model", "m",
                           "--random-prefix-len", "6000000", "--random-input-len", "6000000")
    assert code == 2 and "prompts of up to 12,000,000 tokens" in err


# --------------------------------------------------------------------------- the stream deadline


@pytest.mark.parametrize("stack", ["raw", "aiohttp"])
def test_a_stream_that_never_ends_is_cut_at_its_derived_deadline(
        fake_server: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch, stack: str) -> None:
    # the limit's constants shrunk so the test is quick: 0.4 s + 4 tokens at 20 token/s = 0.6 s
    monkeypatch.setattr("perflab.bench.request.STREAM_DEADLINE_MIN_S", 0.4)
    monkeypatch.setattr("perflab.bench.request.STREAM_DEADLINE_FLOOR_TOK_S", 20.0)
    req = BenchRequest(base_urls=(fake_server.base_url,), model="endless", num_prompts=2, random_input_len=4,
                       random_output_len=4, http_stack=stack, stall_s=0)
    t0 = time.monotonic()
    result = run_benchmark_sync(req)
    assert time.monotonic() - t0 < 10
    assert (result.metrics["completed"], result.metrics["failed"]) == (0, 2)
    assert all("the stream did not end within 0.6 s of its first byte" in t.error for t in result.requests)


def test_a_stream_cut_after_more_output_than_max_tokens_is_flagged_beyond_max_tokens(
        fake_server: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """An endless stream had streamed dozens of tokens for max_tokens 4 when it was cut: the
    result said only "did not end" (over_max_tokens 0, exit 1), hiding the output beyond
    max_tokens that the client had already seen (issue 24 item 8: output beyond max_tokens is
    flagged)."""
    monkeypatch.setattr("perflab.bench.request.STREAM_DEADLINE_MIN_S", 0.4)
    monkeypatch.setattr("perflab.bench.request.STREAM_DEADLINE_FLOOR_TOK_S", 20.0)
    req = BenchRequest(base_urls=(fake_server.base_url,), model="endless", num_prompts=2, random_input_len=4,
                       random_output_len=4, stall_s=0)
    result = run_benchmark_sync(req)
    assert (result.metrics["completed"], result.metrics["failed"]) == (0, 2)
    assert result.metrics["over_max_tokens"] == 2 and result.metrics["usage_mismatches"] == 2
    for t in result.requests:
        assert "chunks carrying output were streamed, beyond max_tokens 4" in t.error
        assert "the stream did not end within 0.6 s of its first byte" in t.error
    code, out, err = run_cli(capsys, "--base-url", fake_server.base_url, "--model", "endless", "--num-prompts", "2",
                             "--random-input-len", "4", "--random-output-len", "4", "--stall-s", "0")
    assert code == EXIT_IMPOSSIBLE_COUNTS, err
    assert "Output beyond max_tokens (failed):       2" in out


def test_a_request_queued_without_a_byte_is_not_cut(fake_server: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch) -> None:
    # one request at a time, 300 ms each: the fourth waits 0.9 s for its first byte, beyond the
    # 0.4 s limit — which counts from the first byte, so nothing is cut
    monkeypatch.setattr("perflab.bench.request.STREAM_DEADLINE_MIN_S", 0.4)
    monkeypatch.setattr("perflab.bench.request.STREAM_DEADLINE_FLOOR_TOK_S", 1000.0)
    req = BenchRequest(base_urls=(fake_server.base_url,), model="queued-300", num_prompts=4, random_input_len=4,
                       random_output_len=2, stall_s=0)
    result = run_benchmark_sync(req)
    assert (result.metrics["completed"], result.metrics["failed"]) == (4, 0), result.errors


def test_the_deadline_derives_from_max_tokens_and_an_explicit_timeout_replaces_it() -> None:
    target = make_target("http://127.0.0.1:9", "/v1/completions")
    tok = WhitespaceTokenizer()
    req = BenchRequest(base_urls=("http://127.0.0.1:9",), model="m", num_prompts=3, random_input_len=4,
                       random_output_len=100, backend="openai")
    prepared, _, caps = _prepare_all(req, [target], iter_samples(req, tok), "t-")
    assert caps == [100, 100, 100]
    assert [p.deadline_s for p in prepared] == [60.0 + 100 / 1.0] * 3
    explicit = req.replace(timeout=30.0)
    prepared, _, _ = _prepare_all(explicit, [target], iter_samples(explicit, tok), "t-")
    assert [p.deadline_s for p in prepared] == [None] * 3
    assert prepare(0, target, {"prompt": "x"}, [], None, deadline=True).deadline_s is None  # no max_tokens: no limit


# --------------------------------------------------------------------------- the rules


@pytest.mark.parametrize(
    ("events", "usage", "max_tokens", "why", "over"),
    [
        (16, {"prompt_tokens": -5, "completion_tokens": 16}, 16, "usage.prompt_tokens is -5, not a token count", False),
        (16, {"prompt_tokens": 8, "completion_tokens": -1}, 16, "usage.completion_tokens is -1, not a token count", False),
        (16, {"prompt_tokens": 8, "completion_tokens": "16"}, 16, 'usage.completion_tokens is "16", not a token count', False),
        (16, {"prompt_tokens": 8, "completion_tokens": 16.5}, 16, "usage.completion_tokens is 16.5, not a token count", False),
        (16, {"prompt_tokens": 0, "completion_tokens": 16}, 16, "usage.prompt_tokens is 0 for a prompt of about 8 tokens", False),
        (16, {"prompt_tokens": 8, "completion_tokens": 17}, 16, "usage.completion_tokens 17 is beyond max_tokens 16", True),
        (16, {"prompt_tokens": 8, "completion_tokens": 1000000}, 16, "usage.completion_tokens 1000000 is beyond max_tokens 16", True),
        (16, {"prompt_tokens": 8, "completion_tokens": 10}, 16, "usage.completion_tokens 10 for 16 chunks carrying output", False),
        (20, None, 16, "20 chunks carrying output were streamed, beyond max_tokens 16", True),
        (16, {"prompt_tokens": 8000, "completion_tokens": 16}, 16,
         "usage.prompt_tokens 8000 for a prompt of 8 tokens (whitespace); expected 4 to 528", False),
    ],
)
def test_impossible_counts(events: int, usage: dict | None, max_tokens: int | None, why: str, over: bool) -> None:
    assert count_problem(usage, events, 8, max_tokens, WhitespaceTokenizer()) == (why, over)
    trace = parse_capture(_capture(events, usage), prompt_len=8, tokenizer=WhitespaceTokenizer(), max_tokens=max_tokens)
    assert not trace.success and trace.usage_mismatch and trace.over_max_tokens is over
    assert trace.error == f"the server's token counts are impossible: {why}"


@pytest.mark.parametrize(
    ("events", "usage", "max_tokens"),
    [
        (16, {"prompt_tokens": 8, "completion_tokens": 16}, 16),
        (4, {"prompt_tokens": 8, "completion_tokens": 16}, 16),  # 4 tokens a chunk (speculative decoding)
        (1, {"prompt_tokens": 8, "completion_tokens": 16}, 16),  # a whole answer in one chunk (vLLM's API server behind)
        (16, {"prompt_tokens": 8, "completion_tokens": 15}, 16),  # one closing chunk of slack
        (17, {"prompt_tokens": 8, "completion_tokens": 16}, 16),
        (16, {"prompt_tokens": 30, "completion_tokens": 16}, 16),  # a chat template's tokens
        (16, {"prompt_tokens": 8, "completion_tokens": 16}, None),
        (16, None, 16),
        (5, {"prompt_tokens": 8, "completion_tokens": 5}, 16),  # stopped at EOS, ignore_eos or not
    ],
)
def test_possible_counts(events: int, usage: dict | None, max_tokens: int | None) -> None:
    assert count_problem(usage, events, 8, max_tokens, WhitespaceTokenizer()) == (None, False)


def test_an_approximate_tokenizer_never_judges_the_prompt() -> None:
    from perflab.bench.tokenizer import load_tokenizer

    approx = load_tokenizer("approx")
    assert not approx.exact
    assert count_problem({"prompt_tokens": 8000, "completion_tokens": 16}, 16, 8, 16, approx) == (None, False)


@pytest.mark.parametrize("name", ["vllm-0.32.0-cpu/chat_stream.txt", "vllm-0.32.0-cpu/completions_stream.txt",
                                  "vllm-0.32.0-cpu/chat_stream_continuous_usage.txt",
                                  "vllm-0.32.0-cpu/completions_stream_continuous_usage.txt",
                                  "llama-server/chat_stream.txt", "llama-server/completions_stream.txt"])
def test_real_engines_streams_pass_the_checks_at_their_max_tokens(name: str) -> None:
    raw = (REAL / name).read_bytes()
    if raw.startswith(b"HTTP/"):
        raw = raw[raw.find(b"\r\n\r\n") + 4:]
    events = [e + b"\n\n" for e in raw.split(b"\n\n") if e.strip()]
    usage = [json.loads(e[6:])["usage"] for e in events if e.strip() != b"data: [DONE]" and json.loads(e[6:]).get("usage")]
    completion = usage[-1]["completion_tokens"]
    cap = Capture(index=0, start=0.0, end=1.0, status=200, reads=[(0.01 * (i + 1), e) for i, e in enumerate(events)])
    trace = parse_capture(cap, prompt_len=usage[-1]["prompt_tokens"], tokenizer=None, max_tokens=completion)
    assert trace.success, trace.error
    assert trace.output_tokens == completion


# --------------------------------------------------------------------------- in a study


def test_a_study_never_ranks_a_measurement_with_impossible_counts() -> None:
    profile = Profile(name="short", label="Short Prompt", num_prompts=10)
    metrics = {"completed": 8, "failed": 2, "usage_mismatches": 2, "over_max_tokens": 0, "total_token_throughput": 1e8}
    from perflab.bench.trace import RequestTrace

    traces = [RequestTrace(success=False, error="the server's token counts are impossible: usage.prompt_tokens is -5, "
                           "not a token count", usage_mismatch=True) for _ in range(2)]
    result = BenchResult(metrics=metrics, requests=traces)
    m = Executor._judge(profile, result, None, None, [], False, 60.0)
    assert m.status is Status.FAILED
    assert m.error is not None and "the server reported impossible token counts (2 of 10 requests failed" in m.error
    honest = BenchResult(metrics={**metrics, "failed": 0, "usage_mismatches": 0, "completed": 10})
    assert Executor._judge(profile, honest, None, None, [], False, 60.0).status is Status.OK


def test_early_stop_never_counts_a_usage_beyond_max_tokens() -> None:
    # the observer (the lab's early stop) reads each ended stream's usage without parsing it;
    # 1000000 completion tokens for max_tokens 16 must not enter its figures
    from perflab.bench.drive import Observation

    server = FakeOpenAIServer(gap_s=0.01).start()  # ~0.2 s a request: observed as it runs
    try:
        seen: list[Observation] = []
        req = BenchRequest(base_urls=(server.base_url,), model="lying-usage", num_prompts=8, random_input_len=4,
                           random_output_len=16, max_concurrency=2)
        result = run_benchmark_sync(req, observe=seen.append)
    finally:
        server.stop()
    assert result.metrics["usage_mismatches"] == 8
    assert any(o.completed >= 2 for o in seen)
    assert all(o.usage_tokens == 0 for o in seen)


def test_worker_processes_check_the_counts_too(fake_server: FakeOpenAIServer) -> None:
    # --workers parses its captures in each worker process, with each request's max_tokens
    req = BenchRequest(base_urls=(fake_server.base_url,), model="beyond-max-1", num_prompts=6, random_input_len=4,
                       random_output_len=8, workers=2)
    result = run_benchmark_sync(req)
    assert (result.metrics["completed"], result.metrics["usage_mismatches"], result.metrics["over_max_tokens"]) == (0, 6, 6)
