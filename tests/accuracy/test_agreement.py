"""perflab.accuracy.agreement on its own: parsing vLLM's logprobs (the real captures),
comparing answer sets, judging against the noise floor, and a broken endpoint reported as
such. The whole path against simulated engines is tests/sim/test_answers.py."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from aiohttp import web

from perflab import redact
from perflab.accuracy import agreement
from perflab.accuracy.agreement import PROMPT_SET, PROMPTS, compare, judge, parse_answer
from perflab.accuracy.types import Agreement, Answer, AnswerSet
from perflab.contract.errors import PerflabError, UsageError

REAL = Path(__file__).resolve().parents[1] / "fixtures" / "real" / "vllm-0.32.0-cpu" / "http"


def body_of(capture: str) -> dict[str, object]:
    raw = (REAL / capture).read_bytes()
    return json.loads(raw.partition(b"\r\n\r\n")[2])


def test_the_prompt_set_is_fixed_varied_and_named() -> None:
    ids = [pid for pid, _ in PROMPTS]
    assert len(PROMPTS) == 32 and len(set(ids)) == 32 and len({p for _, p in PROMPTS}) == 32
    assert len({pid.split("-")[0] for pid in ids}) >= 6  # facts, maths, code, lists, rewriting, translation...
    assert PROMPT_SET == "perflab-agreement-v1"


def test_real_vllm_logprobs_parse_into_tokens_and_logprobs() -> None:
    chat = parse_answer("p", body_of("chat_logprobs.http"), "chat")
    assert chat.text == "259259259259" and chat.tokens == ("259",) * 4
    assert chat.logprobs is not None and chat.logprobs[0] == pytest.approx(-6.57375431060791)
    comp = parse_answer("p", body_of("completions_logprobs.http"), "completions")
    assert comp.text == "60606060" and comp.tokens == ("60",) * 4 and comp.logprobs is not None and len(comp.logprobs) == 4
    # without logprobs (a server that ignores the ask): text only, compared by words
    bare = parse_answer("p", {"choices": [{"message": {"content": "a b"}, "logprobs": None}]}, "chat")
    assert (bare.text, bare.tokens, bare.logprobs) == ("a b", None, None)
    assert parse_answer("p", {"choices": []}, "chat").error == "the response has no choices"


def _set(*answers: Answer) -> AnswerSet:
    return AnswerSet(PROMPT_SET, 1, answers)


def _ans(pid: str, words: str, lps: list[float] | None = None) -> Answer:
    tokens = tuple(" " + w for w in words.split())
    return Answer(pid, "".join(tokens), tokens if lps is not None else None, tuple(lps) if lps is not None else None)


def test_compare_counts_identical_answers_first_divergence_and_logprob_shift() -> None:
    ref = _set(_ans("a", "x y z w", [-1, -1, -1, -1]), _ans("b", "x y z w", [-1, -1, -1, -1]),
               _ans("c", "p q r s", [-1, -2, -3, -4]), _ans("d", "k l m n", [-1, -1, -1, -1]))
    other = _set(_ans("a", "x y z w", [-1, -1, -1, -1.5]), _ans("b", "x y Q R", [-1.25, -1, -2, -2]),
                 _ans("c", "p q r s", [-1, -2, -3, -4]), Answer("d", "", error="HTTP 500: boom"))
    got = compare(ref, other)
    assert got.samples == 4 and got.exact_match == 50.0
    # b parts at token 2, the failed request at 0
    assert got.first_divergence == 1.0
    # shared tokens: a's 4 (one differs by 0.5), b's first 2 (one by 0.25), c's 4 (none)
    assert got.mean_abs_logprob_diff == pytest.approx((0.5 + 0.25) / 10)
    assert compare(ref, ref) == Agreement(4, 100.0, None, 0.0)


def test_compare_counts_a_prompt_the_other_set_did_not_answer_as_a_disagreement() -> None:
    ref = AnswerSet(PROMPT_SET, 1, (_ans("a", "x y z", [-1, -2, -3]), _ans("b", "p q", [-1, -1]),
                                    _ans("c", "m n", [-1, -1])))
    partial = AnswerSet(PROMPT_SET, 32, (_ans("a", "x y z", [-1, -2, -3]),))
    got = compare(ref, partial)
    assert got == Agreement(3, 100 / 3, 0.0, 0.0)
    assert not judge(got, compare(ref, ref), margin=10.0)  # not a silent pass
    assert compare(ref, AnswerSet(PROMPT_SET, 32, ())) == Agreement(3, 0.0, 0.0, None)


def test_compare_without_logprobs_uses_words() -> None:
    ref = _set(_ans("a", "one two three"), _ans("b", "one two three"))
    other = _set(_ans("a", "one two three"), _ans("b", "one two four"))
    assert compare(ref, other) == Agreement(2, 50.0, 2.0, None)


def test_compare_refuses_answer_sets_of_other_prompt_sets() -> None:
    with pytest.raises(UsageError, match="different prompt sets"):
        compare(_set(), AnswerSet("another-v9", 1, ()))


def test_judge_against_the_floor_with_a_margin() -> None:
    floor = Agreement(32, 87.5, 24.0, 0.001)
    assert judge(Agreement(32, 81.25, 20.0, 0.01), floor, 10.0)
    assert judge(Agreement(32, 87.5, None, 0.0), floor, 0.0)
    assert not judge(Agreement(32, 75.0, 10.0, 0.05), floor, 10.0)
    assert not judge(Agreement(32, 84.375, 10.0, 0.05), floor, 0.0)


def test_an_endpoint_that_does_not_answer_is_a_fault_not_an_accuracy_result() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: nothing listens there
    with pytest.raises(PerflabError) as info:
        anyio.run(lambda: agreement.collect(f"http://127.0.0.1:{port}", "m", concurrency=8, timeout_s=5))
    message = str(info.value)
    assert "\n" not in message and "32 of 32 requests" in message and "not serving" in message
    with pytest.raises(UsageError):
        anyio.run(lambda: agreement.collect(f"http://127.0.0.1:{port}", "m", concurrency=0))


def test_real_vllm_answer_sets_judge_an_fp8_kv_cache_below_the_floor() -> None:
    """Answer sets collected from the real vLLM 0.32.0 CPU build with the tiny model
    (tests/fixtures/real/README.md): its float32 baseline agrees with itself exactly under
    load, and the same model with ``--kv-cache-dtype fp8`` parts from it on 5 of 32 prompts."""
    sets = {name: AnswerSet.from_json(json.loads((REAL.parent / "agreement" / f"{name}.json").read_text()))
            for name in ("baseline-c1", "baseline-c32", "kv-fp8-c32")}
    assert [s.concurrency for s in sets.values()] == [1, 32, 32]
    floor = compare(sets["baseline-c1"], sets["baseline-c32"])
    assert floor == Agreement(32, 100.0, None, 0.0)
    fp8 = compare(sets["baseline-c1"], sets["kv-fp8-c32"])
    assert fp8.exact_match == 84.375 and fp8.first_divergence == pytest.approx(9.2)
    assert fp8.mean_abs_logprob_diff == pytest.approx(0.024, abs=0.001)
    assert not judge(fp8, floor, 10.0) and judge(fp8, floor, 20.0)


class _Server:
    """An OpenAI-compatible chat endpoint on its own loop and thread: it refuses logprobs as
    a server without them does (400), answers the prompt back, and fails ``failing`` prompts."""

    def __init__(self, failing: set[str]) -> None:
        self.failing = failing
        self.bodies: list[dict[str, object]] = []
        self.port = 0
        self._ready = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, daemon=True)

    async def _chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.bodies.append(body)
        prompt = body["messages"][0]["content"]
        if "logprobs" in body:
            return web.json_response({"error": {"message": "logprobs is not supported", "code": 400}}, status=400)
        if any(prompt == text for pid, text in PROMPTS if pid in self.failing):
            # a careless server echoing the request's credentials
            message = f"engine died ({request.headers.get('Authorization', 'no key')})"
            return web.json_response({"error": {"message": message, "code": 500}}, status=500)
        return web.json_response({"choices": [{"index": 0, "message": {"role": "assistant", "content": prompt[:20]},
                                               "logprobs": None, "finish_reason": "length"}]})

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        self._runner = web.AppRunner(app)
        self._loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        self._loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._ready.set()
        self._loop.run_forever()

    def __enter__(self) -> _Server:
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()


@pytest.fixture
def fresh_registry() -> Iterator[None]:
    redact.forget_all()
    yield
    redact.forget_all()


@pytest.mark.usefixtures("fresh_registry")
def test_a_server_without_logprobs_is_asked_again_without_and_a_failed_request_is_the_endpoints_fault() -> None:
    with _Server(set()) as server:
        got = anyio.run(lambda: agreement.collect(f"http://127.0.0.1:{server.port}/v1", "m", concurrency=4,
                                                  api_key="sk-agreement-secret"))
    assert all(b["temperature"] == 0 and b["max_tokens"] == 32 for b in server.bodies)
    assert sum("logprobs" in b for b in server.bodies) == 32 and len(server.bodies) == 64
    assert all(a.error is None and a.tokens is None and a.text for a in got.answers)
    # three requests failing (an engine fault) are no agreement measured, not three disagreements
    # that would reject the configuration for its accuracy
    failing = {pid for pid, _ in PROMPTS[:3]}
    with _Server(failing) as server, pytest.raises(PerflabError) as err:
        anyio.run(lambda: agreement.collect(f"http://127.0.0.1:{server.port}/v1", "m", concurrency=4,
                                            api_key="sk-agreement-secret"))
    assert "3 of 32 requests" in str(err.value) and "HTTP 500: engine died (Bearer ***)" in str(err.value)
    assert "sk-agreement-secret" not in str(err.value)
