"""What the simulated engines answer (perflab_sim.answers, perflab_sim.accuracy), through a
real simulated engine's HTTP API: the shipped task at the declared score, lossier options
scoring lower by their declared drop, greedy answers with logprobs, and agreement against the
noise floor (perflab.accuracy.agreement) — while the benchmarks' " tok" text stays as it was."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from typing import Any

import anyio
import httpx
import pytest
from perflab.accuracy import agreement
from perflab.accuracy.tasks import load_items
from perflab.accuracy.types import Agreement, AnswerSet
from perflab_sim import accuracy
from perflab_sim.answers import Content, answers_correctly, solution, task_item, wrong_count
from test_runtime import READY, engine, sim_env  # noqa: F401 - sim_env is a fixture

MODEL = "Qwen/Qwen3-32B"
ANSWER = re.compile(r"#### (-?[0-9.,]+)")  # lm-eval gsm8k's strict-match filter


@pytest.fixture
def fast_env(sim_env: dict[str, str]) -> dict[str, str]:  # noqa: F811
    return {**sim_env, "PERFLAB_SIM_TIME_SCALE": "200"}


def _served(env: dict[str, str], model: str, **cfg: object) -> Any:
    return engine(env, model=model, served_model_names=["m"], **cfg)


def _score(url: str) -> tuple[int, list[dict[str, Any]]]:
    """Correct answers to all shipped items, asked 32 at a time over chat, and the bodies."""
    items = load_items()
    bodies: list[dict[str, Any]] = [{}] * len(items)

    async def run() -> None:
        limiter = anyio.Semaphore(32)
        async with httpx.AsyncClient(timeout=60) as client:

            async def one(i: int) -> None:
                async with limiter:
                    prompt = f"Question: {items[i].question}\nAnswer:"
                    r = await client.post(url + "/v1/chat/completions", json={
                        "model": "m", "messages": [{"role": "user", "content": prompt}], "max_tokens": 256,
                        "temperature": 0})
                    bodies[i] = r.json()

            async with anyio.create_task_group() as tg:
                for i in range(len(items)):
                    tg.start_soon(one, i)

    anyio.run(run)
    correct = 0
    for item, body in zip(items, bodies, strict=True):
        text = body["choices"][0]["message"]["content"]
        m = ANSWER.search(text)
        correct += bool(m) and int(m.group(1)) == item.target
    return correct, bodies


@pytest.mark.parametrize(("model", "cfg", "declared"), [
    (MODEL, {}, 87.64),  # RedHat's BF16 Qwen3-32B on GSM-8K
    ("Qwen/Qwen3-32B-FP8", {}, 87.64 - 0.53),  # FP8 weights: -0.53 points
    ("Qwen/Qwen3-32B-AWQ", {}, 87.64 - 1.67),  # INT4 weights: -1.67 points
    (MODEL, {"kv_cache_dtype": "fp8"}, 87.64),  # FP8 KV cache: no published loss
])
def test_the_shipped_task_is_answered_at_the_declared_score(fast_env: dict[str, str], model: str, cfg: dict[str, object],
                                                             declared: float) -> None:
    with _served(fast_env, model, **cfg) as e:
        assert e.read_until(READY)
        correct, bodies = _score(e.url)
    n = len(load_items())
    assert correct == math.floor(n * declared / 100 + 0.5)  # of 200: 175 for Qwen3-32B, 174 FP8, 172 AWQ
    for body in bodies:
        choice, usage = body["choices"][0], body["usage"]
        # the answer ends by itself, and its words are its tokens
        assert choice["finish_reason"] == "stop"
        assert usage["completion_tokens"] == len(choice["message"]["content"].split())


def test_a_lossier_configuration_gets_wrong_every_item_a_better_one_does() -> None:
    base = accuracy.profile(MODEL, None, "auto", None)
    fp8 = accuracy.profile(MODEL, "fp8", "auto", None)
    awq = accuracy.profile(MODEL, "awq", "fp8", None)
    assert base.score > fp8.score > awq.score
    assert fp8.score == pytest.approx(87.64 - 0.53) and awq.score == pytest.approx(87.64 - 1.67)
    wrong = {p.score: {i.id for i in load_items() if not answers_correctly(i, p)} for p in (base, fp8, awq)}
    assert wrong[base.score] <= wrong[fp8.score] <= wrong[awq.score]
    assert [len(w) for w in wrong.values()] == [wrong_count(s) for s in wrong] == [25, 26, 28]
    # a wrong answer is the same worked solution with another final number
    item = next(i for i in load_items() if i.id in wrong[base.score])
    text = solution(item, False, MODEL)
    got = int(ANSWER.search(text).group(1))  # type: ignore[union-attr]
    assert got != item.target and text.split("\n")[0].rsplit(" ", 1)[0] == item.answer.split("\n")[0].rsplit(" ", 1)[0]


def test_task_questions_are_recognised_only_where_asked() -> None:
    item = load_items()[7]
    few_shot = "\n\n".join(f"Question: {i.question}\nAnswer: {i.answer}" for i in load_items()[:3])
    assert task_item(f"{few_shot}\n\nQuestion: {item.question}\nAnswer:") == item
    assert task_item("Why is the sky blue? " * 1000) is None
    assert task_item(None) is None and task_item("tok " * 50) is None


def test_answers_stream_like_they_are_sent_whole_and_max_tokens_cuts_them(fast_env: dict[str, str]) -> None:
    item = load_items()[3]
    messages = [{"role": "user", "content": f"Question: {item.question}\nAnswer:"}]
    with _served(fast_env, MODEL) as e:
        assert e.read_until(READY)
        whole = httpx.post(e.url + "/v1/chat/completions", json={"model": "m", "messages": messages}, timeout=30).json()
        r = httpx.post(e.url + "/v1/chat/completions", timeout=30, json={
            "model": "m", "messages": messages, "stream": True, "stream_options": {"include_usage": True}})
        events = [ev for ev in r.text.split("\n\n") if ev.startswith("data: {")]
        chunks = [json.loads(ev[6:]) for ev in events]
        streamed = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
        cut = httpx.post(e.url + "/v1/completions", timeout=30, json={
            "model": "m", "prompt": f"Question: {item.question}\nAnswer:", "max_tokens": 5}).json()
        stopped = httpx.post(e.url + "/v1/completions", timeout=30, json={
            "model": "m", "prompt": f"Question: {item.question}\nAnswer:", "max_tokens": 256, "stop": ["####", "Question:"]}).json()
        bench = httpx.post(e.url + "/v1/completions", timeout=30, json={
            "model": "m", "prompt": "Tell me a story about a cat.", "max_tokens": 7, "ignore_eos": True}).json()
    text = whole["choices"][0]["message"]["content"]
    assert streamed == text and text.endswith(f"#### {ANSWER.search(text).group(1)}")  # type: ignore[union-attr]
    assert chunks[-1]["usage"]["completion_tokens"] == whole["usage"]["completion_tokens"] == len(text.split())
    assert cut["choices"][0]["finish_reason"] == "length" and cut["usage"]["completion_tokens"] == 5
    assert cut["choices"][0]["text"] == "".join(re.findall(r"\s*\S+", text)[:5])
    # a stop string (lm-eval sends its task's `until`) ends the answer before it
    assert stopped["choices"][0]["text"] == text.split("####")[0].rstrip()
    assert stopped["choices"][0]["finish_reason"] == "stop"
    assert stopped["usage"]["completion_tokens"] == len(stopped["choices"][0]["text"].split())
    # not a task question, no logprobs asked: the benchmarks' words, exactly as before
    assert bench["choices"][0]["text"] == " tok" * 7 and bench["choices"][0]["logprobs"] is None


def test_greedy_answers_with_logprobs_are_deterministic_per_prompt_and_model(fast_env: dict[str, str]) -> None:
    body = {"model": "m", "prompt": "Name three rivers in Europe.", "max_tokens": 12, "logprobs": 0, "temperature": 0}
    with _served(fast_env, MODEL) as e:
        assert e.read_until(READY)
        a, b = (httpx.post(e.url + "/v1/completions", json=body, timeout=30).json()["choices"][0] for _ in range(2))
        other = httpx.post(e.url + "/v1/completions", json={**body, "prompt": "Name three lakes."}, timeout=30).json()
    with _served(fast_env, "Qwen/Qwen3-8B") as e:
        assert e.read_until(READY)
        small = httpx.post(e.url + "/v1/completions", json=body, timeout=30).json()["choices"][0]
    assert a == b and a["text"] != other["choices"][0]["text"] and a["text"] != small["text"]
    assert len(a["text"].split()) == 12 and all(-3 < x < 0 for x in a["logprobs"]["token_logprobs"])


def test_batching_and_lossy_options_move_answers_as_declared() -> None:
    """The content model alone: batching parts a few answers late; INT4 weights part more,
    anywhere; the log-probabilities of shared tokens shift by the declared noise."""
    base = accuracy.profile(MODEL, None, "auto", None)
    awq = accuracy.profile(MODEL, "awq", "auto", None)

    def answers(profile: accuracy.Profile, batched: bool) -> list[Content]:
        out = []
        for _, prompt in agreement.PROMPTS:
            c = Content(prompt, profile, None, 32)
            c.start(batched)
            out.append(c)
        return out

    alone, batched, lossy = answers(base, False), answers(base, True), answers(awq, False)
    parted = [i for i in range(len(alone)) if alone[i].text(0, 32) != batched[i].text(0, 32)]
    assert 0 < len(parted) <= 5  # 6 % of answers on average; 5 of these 32
    for i in parted:  # late: the first half of the answer is the same
        assert batched[i].text(0, 16) == alone[i].text(0, 16)
    assert sum(alone[i].text(0, 32) != lossy[i].text(0, 32) for i in range(len(alone))) > len(parted)
    same = [i for i in range(len(alone)) if i not in parted]
    shifts = [abs(alone[i].logprob(t) - batched[i].logprob(t)) for i in same for t in range(32)]
    assert 0 < max(shifts) <= accuracy.BATCH.logprob_noise


# --------------------------------------------------------------------------- agreement over HTTP


@pytest.fixture
def baseline(fast_env: dict[str, str]) -> Iterator[tuple[AnswerSet, Agreement]]:
    """The reference's answers one at a time, and the noise floor: those against all at once."""
    with _served(fast_env, MODEL) as e:
        assert e.read_until(READY)
        first = anyio.run(lambda: agreement.collect(e.url, "m", concurrency=1, server_clock=True))
        again = anyio.run(lambda: agreement.collect(e.url, "m", concurrency=1, server_clock=True))
        loaded = anyio.run(lambda: agreement.collect(e.url, "m", concurrency=len(agreement.PROMPTS), server_clock=True))
    assert agreement.compare(first, again) == Agreement(32, 100.0, None, 0.0)  # alone, greedy: identical
    yield first, agreement.compare(first, loaded)


MARGIN = 10.0  # points of exact match: 3 of the 32 prompts


def test_the_noise_floor_is_below_100_and_above_its_documented_level(
        baseline: tuple[AnswerSet, Agreement]) -> None:
    first, floor = baseline
    assert first.prompt_set == agreement.PROMPT_SET and len(first.answers) == 32
    assert all(a.error is None and a.tokens and len(a.tokens) == 32 == len(a.logprobs or ()) for a in first.answers)
    # docs/user-guide.md: the simulated Qwen3-32B's floor is 84.4 % (5 of 32 answers part late)
    assert 75.0 <= floor.exact_match < 100.0
    assert floor.first_divergence is not None and floor.first_divergence >= 16  # late: the second half
    assert floor.mean_abs_logprob_diff is not None and 0 < floor.mean_abs_logprob_diff <= accuracy.BATCH.logprob_noise


@pytest.mark.parametrize(("model", "cfg", "agrees"), [
    ("Qwen/Qwen3-32B-FP8", {}, True),
    (MODEL, {"kv_cache_dtype": "fp8"}, True),
    (MODEL, {"spec_method": "eagle", "spec_tokens": 3}, True),  # lossless under greedy
    ("Qwen/Qwen3-32B-AWQ", {}, False),
])
def test_candidates_are_judged_against_the_floor(fast_env: dict[str, str], baseline: tuple[AnswerSet, Agreement],
                                                 model: str, cfg: dict[str, object], agrees: bool) -> None:
    first, floor = baseline
    with _served(fast_env, model, **cfg) as e:
        assert e.read_until(READY)
        answers = anyio.run(lambda: agreement.collect(e.url, "m", concurrency=32, server_clock=True))
    candidate = agreement.compare(first, answers)
    assert agreement.judge(candidate, floor, MARGIN) is agrees, (candidate, floor)
    assert candidate.exact_match <= floor.exact_match or not agrees
