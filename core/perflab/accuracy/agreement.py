"""Agreement with the baseline: greedy answers to a fixed prompt set, compared token by token.

Needs no dataset and nothing beyond perflab: :func:`collect` sends the prompts of
:data:`PROMPTS` to an OpenAI-compatible endpoint at temperature 0, asking for the chosen
tokens' log-probabilities the way vLLM takes them (chat: ``logprobs: true, top_logprobs: 0``,
answered as ``choices[0].logprobs.content[*].{token, logprob}``; completions: ``logprobs: 0``,
answered as ``choices[0].logprobs.{tokens, token_logprobs}``: vLLM 0.32.0's
vllm/entrypoints/openai/chat_completion/protocol.py and completion/protocol.py, captured in
tests/fixtures/real/vllm-0.32.0-cpu/http/*logprobs*.http). :func:`compare` says how far two
answer sets agree; :func:`judge` decides against the noise floor.

Real engines are not batch-invariant: the same greedy request can come out different when
other requests share its batch. So agreement is judged against a *noise floor*, not 100 %:
the reference configuration answers twice, first one prompt at a time, then all prompts at
once, and ``floor = compare(first, second)``. A candidate answers all at once, is compared
with the reference's first set, and agrees when its exact-match rate is at most ``margin``
points below the floor's.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Mapping, Sequence
from typing import Any

import anyio
import httpx

from perflab.accuracy.types import Agreement, Answer, AnswerSet
from perflab.bench.serverclock import SERVER_CLOCK_HEADER, clock_header_value
from perflab.contract.errors import PerflabError, UsageError
from perflab.redact import register, scrub

PROMPT_SET = "perflab-agreement-v1"

# Varied on purpose (facts, reasoning, code, lists, rewriting, other languages): an optimization
# that changes the model shows in some kinds of answer before others.
PROMPTS: tuple[tuple[str, str], ...] = (
    ("fact-capital", "What is the capital of Australia, and why was it chosen over Sydney and Melbourne?"),
    ("fact-photosynthesis", "Explain photosynthesis in three sentences."),
    ("fact-boiling", "At what temperature does water boil at the top of Mount Everest, and why is it lower than at sea level?"),
    ("fact-moon", "How far is the Moon from the Earth, and how long does its light take to reach us?"),
    ("fact-dna", "What are the four bases of DNA and how do they pair?"),
    ("fact-history", "Summarize the causes of the First World War in one paragraph."),
    ("math-sum", "What is the sum of the integers from 1 to 100? Show the trick."),
    ("math-prime", "Is 221 a prime number? Explain your reasoning step by step."),
    ("math-percent", "A jacket costs 80 dollars and is discounted by 15 percent. What is the new price?"),
    ("math-train", "A train leaves at 9:40 and arrives at 13:05. How long is the journey in minutes?"),
    ("math-algebra", "Solve for x: 3x + 7 = 2x - 5. Explain each step."),
    ("math-probability", "What is the probability of rolling two sixes with two fair dice?"),
    ("code-python-reverse", "Write a Python function that reverses a string without using slicing."),
    ("code-sql", "Write an SQL query that returns the ten customers with the highest total order value."),
    ("code-bug", "Find the bug: def mean(xs): return sum(xs) / len(xs) + 1"),
    ("code-regex", "Write a regular expression that matches an ISO 8601 date such as 2024-03-15."),
    ("code-bash", "Write a bash one-liner that counts the lines of every .py file in a directory tree."),
    ("code-complexity", "What is the time complexity of binary search, and why?"),
    ("list-fruits", "List five fruits that are high in vitamin C."),
    ("list-steps", "Give the steps to change a flat tyre on a car."),
    ("list-planets", "Name the planets of the solar system in order from the Sun."),
    ("rewrite-formal", "Rewrite in a formal tone: hey, the meeting got moved to friday, can u make it?"),
    ("rewrite-summary", "Summarize in one sentence: The committee met on Tuesday to review the budget. After a long "
                        "discussion, it approved the proposal with two amendments and scheduled a follow-up for May."),
    ("rewrite-simple", "Explain what an API is to a ten-year-old."),
    ("translate-fr", "Translate into French: The library opens at nine in the morning."),
    ("translate-de", "Translate into German: Where is the nearest train station?"),
    ("translate-es", "Translate into Spanish: I would like a cup of coffee with milk, please."),
    ("creative-haiku", "Write a haiku about autumn rain."),
    ("creative-story", "Begin a short story about a lighthouse keeper who finds a message in a bottle."),
    ("advice-sleep", "Give three practical tips for sleeping better."),
    ("compare-tcp-udp", "Compare TCP and UDP in a short table."),
    ("define-entropy", "Define entropy in thermodynamics and in information theory."),
)


def _payload(prompt: str, model: str, api: str, max_tokens: int) -> dict[str, Any]:
    common: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "temperature": 0}
    if api == "chat":
        return {**common, "messages": [{"role": "user", "content": prompt}], "logprobs": True, "top_logprobs": 0}
    return {**common, "prompt": prompt, "logprobs": 0}


def parse_answer(prompt_id: str, body: Mapping[str, Any], api: str) -> Answer:
    """An :class:`Answer` from a non-streamed chat or completions body (vLLM's shapes)."""
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], Mapping):
        return Answer(prompt_id, "", error="the response has no choices")
    choice = choices[0]
    tokens: tuple[str, ...] | None = None
    logprobs: tuple[float, ...] | None = None
    lp = choice.get("logprobs")
    if api == "chat":
        message = choice.get("message") or {}
        text = message.get("content") if isinstance(message, Mapping) else None
        entries = lp.get("content") if isinstance(lp, Mapping) else None
        if isinstance(entries, list) and entries:
            tokens = tuple(str(e.get("token", "")) for e in entries)
            logprobs = tuple(float(e.get("logprob", math.nan)) for e in entries)
    else:
        text = choice.get("text")
        if isinstance(lp, Mapping) and isinstance(lp.get("tokens"), list) and lp["tokens"]:
            tokens = tuple(str(t) for t in lp["tokens"])
            logprobs = tuple(math.nan if x is None else float(x) for x in lp.get("token_logprobs") or ())
            if len(logprobs) != len(tokens):
                logprobs = None
    return Answer(prompt_id, str(text or ""), tokens, logprobs)


async def collect(base_url: str, model: str, *, concurrency: int, api_key: str | None = None, max_tokens: int = 32,
                  timeout_s: float = 120, api: str = "chat", prompts: Sequence[tuple[str, str]] = PROMPTS,
                  headers: Mapping[str, str] | None = None, server_clock: bool = False) -> AnswerSet:
    """The greedy answers of the endpoint at ``base_url`` to ``prompts``, ``concurrency`` at a
    time (``len(prompts)``: all at once). A request that fails (an HTTP error, a timeout, a
    body that is not JSON) is a one-line :class:`PerflabError`: a fault of the machine or the
    engine, never counted as a disagreement, which would reject the configuration for its
    accuracy. ``server_clock``: the endpoint
    is a simulated engine; all prompts at once then arrive at one model time, as they would on
    a real engine however slowly this host sends them (:data:`perflab.bench.serverclock.SERVER_CLOCK_HEADER`)."""
    if api not in ("chat", "completions"):
        raise UsageError(f"agreement api {api!r}: expected 'chat' or 'completions'")
    if concurrency < 1:
        raise UsageError(f"agreement concurrency {concurrency}: expected at least 1")
    path = "/chat/completions" if api == "chat" else "/completions"
    base = base_url.rstrip("/")
    url = (base if base.endswith("/v1") else base + "/v1") + path
    hdrs = {"Content-Type": "application/json", **(headers or {})}
    if api_key:
        register([api_key])  # masked in every message from here on
        hdrs["Authorization"] = f"Bearer {api_key}"
    if server_clock:
        hdrs[SERVER_CLOCK_HEADER] = clock_header_value(count=len(prompts), request_rate=math.inf,
                                                    max_concurrency=concurrency, engines=1, tag=secrets.token_hex(4))
    answers: dict[str, Answer] = {}
    limiter = anyio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=max(concurrency, 1), max_keepalive_connections=max(concurrency, 1))

    async def one(client: httpx.AsyncClient, prompt_id: str, prompt: str) -> None:
        async with limiter:
            payload = _payload(prompt, model, api, max_tokens)
            try:
                r = await client.post(url, json=payload, headers=hdrs)
                if r.status_code == 400 and "logprob" in _message(r).lower():
                    # a server without logprobs: the answer alone, compared by its words
                    payload = {k: v for k, v in payload.items() if k not in ("logprobs", "top_logprobs")}
                    r = await client.post(url, json=payload, headers=hdrs)
            except httpx.HTTPError as exc:
                answers[prompt_id] = Answer(prompt_id, "", error=scrub(f"{type(exc).__name__}: {exc}"[:300]))
                return
            if r.status_code != 200:
                answers[prompt_id] = Answer(prompt_id, "", error=scrub(f"HTTP {r.status_code}: {_message(r)}"[:300]))
                return
            try:
                body = r.json()
            except ValueError:
                answers[prompt_id] = Answer(prompt_id, "", error="the response is not JSON")
                return
            answers[prompt_id] = parse_answer(prompt_id, body if isinstance(body, Mapping) else {}, api)

    async with (
        httpx.AsyncClient(timeout=timeout_s, limits=limits, trust_env=False) as client,
        anyio.create_task_group() as tg,
    ):
        for prompt_id, prompt in prompts:
            tg.start_soon(one, client, prompt_id, prompt)
    ordered = tuple(answers[pid] for pid, _ in prompts)
    failed = [a for a in ordered if a.error is not None]
    if failed:
        raise PerflabError(f"agreement: {len(failed)} of {len(ordered)} requests to {scrub(url)} failed "
                           f"(first: {failed[0].error}); the endpoint is not serving (a fault, not an answer): no agreement measured")
    return AnswerSet(PROMPT_SET if prompts is PROMPTS else f"{PROMPT_SET}+custom", concurrency, ordered)


def _message(r: httpx.Response) -> str:
    try:
        body = r.json()
    except ValueError:
        return r.text.strip().splitlines()[0] if r.text.strip() else r.reason_phrase
    err = body.get("error") if isinstance(body, Mapping) else None
    if isinstance(err, Mapping) and err.get("message"):
        return str(err["message"]).splitlines()[0]
    return str(body)[:200]


def _words(answer: Answer) -> tuple[str, ...]:
    return answer.tokens if answer.tokens is not None else tuple(answer.text.split())


def compare(reference: AnswerSet, other: AnswerSet) -> Agreement:
    """How far ``other`` agrees with ``reference``, prompt by prompt: the percentage answered
    identically; the mean token position where the diverging answers first differ (tokens
    from the logprobs' token strings where both have them, else whitespace words; a failed
    request, or a prompt ``other`` has no answer to, differs at 0); the mean absolute
    log-probability difference over the tokens both share before that position (None where
    no logprobs came back)."""
    if reference.prompt_set != other.prompt_set:
        raise UsageError(f"agreement: answer sets of different prompt sets ({reference.prompt_set} vs "
                         f"{other.prompt_set}) cannot be compared")
    theirs = {a.id: a for a in other.answers}
    # every reference prompt counts: one the other set lacks is a disagreement at 0, not a
    # prompt left out of the rate (a set answering 1 of 32 prompts identically is not 100 %)
    pairs = [(a, theirs.get(a.id)) for a in reference.answers]
    if not pairs:
        return Agreement(0, 0.0, None, None)
    same = 0
    divergences: list[int] = []
    diffs: list[float] = []
    for ref, oth in pairs:
        if oth is None or ref.error is not None or oth.error is not None:
            divergences.append(0)
            continue
        if ref.text == oth.text:
            same += 1
        a, b = _words(ref), _words(oth)
        if ref.tokens is None or oth.tokens is None:  # compare like with like
            a, b = tuple(ref.text.split()), tuple(oth.text.split())
        shared = 0
        while shared < min(len(a), len(b)) and a[shared] == b[shared]:
            shared += 1
        if ref.text != oth.text:
            divergences.append(shared)
        if ref.logprobs is not None and oth.logprobs is not None and ref.tokens is not None and oth.tokens is not None:
            diffs.extend(abs(x - y) for x, y in zip(ref.logprobs[:shared], oth.logprobs[:shared], strict=False)
                         if math.isfinite(x) and math.isfinite(y))
    return Agreement(
        samples=len(pairs),
        exact_match=100.0 * same / len(pairs),
        first_divergence=sum(divergences) / len(divergences) if divergences else None,
        mean_abs_logprob_diff=sum(diffs) / len(diffs) if diffs else None,
    )


def judge(candidate: Agreement, floor: Agreement, margin: float) -> bool:
    """True when the candidate agrees with the reference within the noise floor: its exact
    match rate is at most ``margin`` points below the floor's (the reference against itself
    under different load)."""
    return candidate.exact_match >= floor.exact_match - margin
