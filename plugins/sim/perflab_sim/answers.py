"""What the simulated engines write: the content model behind :class:`perflab_sim.wire.Generation`.

Three kinds of text, one token per whitespace-separated word as the simulator's tokenizer
counts them (:mod:`perflab_sim.tokenizer`), so usage counts stay exact:

- a prompt asking a question of perflab's shipped task (:func:`perflab.accuracy.tasks.find_item`)
  is answered with the item's worked solution, ending in gsm8k's ``#### <number>`` line, and
  the generation stops there by itself (``finish_reason: stop``) unless ``max_tokens`` cuts
  it. Whether the number is right is decided per (item, model, score): the configuration's
  score (:mod:`perflab_sim.accuracy`) says how many of the task's items it gets right, and the
  items it gets wrong are the first ones of an order fixed per model, so a lossier
  configuration gets wrong every item a better one gets wrong, and more;
- any other prompt asking for log-probabilities gets deterministic greedy pseudo-words derived
  from the prompt and the model, with log-probabilities; the configuration's effects (and
  batching, when other requests share the engine) make a deterministic fraction of the
  answers part from the baseline's at a deterministic token and shift the log-probabilities;
- anything else gets the ``" tok"`` words the benchmarks rely on (no content model at all).
"""

from __future__ import annotations

import functools
import hashlib
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from perflab.accuracy.tasks import TaskItem, find_item, load_items
from perflab_sim.accuracy import BATCH, Effect, Profile

# Pseudo-words: two to three of these syllables (64 of them: 6 bits each).
_SYLLABLES = (
    "ka", "lo", "mi", "ne", "su", "ta", "ri", "po", "de", "va", "shi", "ro", "ga", "mu", "ze", "bi",
    "tor", "lan", "mer", "sol", "dan", "kel", "vin", "par", "qui", "fen", "ost", "ul", "ark", "em", "io", "ya",
    "the", "and", "ing", "ion", "ent", "for", "pro", "con", "ver", "ter", "com", "per", "ble", "tion", "ment", "est",
    "al", "an", "ar", "as", "at", "ed", "en", "er", "es", "in", "is", "it", "on", "or", "ou", "ay",
)


def _u(*parts: object) -> float:
    """A uniform number in [0, 1), a pure function of ``parts``."""
    digest = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def _word(seed: str, i: int) -> str:
    h = int.from_bytes(hashlib.blake2b(f"{seed}\x1f{i}".encode(), digest_size=8).digest(), "big")
    n = 2 + (h & 1)
    return "".join(_SYLLABLES[(h >> (1 + 6 * k)) & 63] for k in range(n))


# ---------------------------------------------------------------- task questions

@functools.cache
def _tails() -> frozenset[str]:
    return frozenset(item.question[-_TAIL:] for item in load_items())


_TAIL = 24  # every question is longer; its last characters rule most prompts out at once


def task_item(text: str | None) -> TaskItem | None:
    """The shipped item ``text`` asks (last), cheaply ruling out prompts that ask none: a
    question's last characters must end one of the prompt's ``?`` before the full lookup."""
    if not text or "?" not in text:
        return None
    tails = _tails()
    end = len(text)
    while (q := text.rfind("?", 0, end)) >= 0:
        if text[q + 1 - _TAIL : q + 1] in tails:
            return find_item(text)
        end = q
    return None


@functools.cache
def _wrong_order(model: str) -> dict[str, int]:
    """The rank of each item in the order a model gets items wrong (fixed per model)."""
    ids = sorted((item.id for item in load_items()), key=lambda i: _u("wrong-order", model, i))
    return {item_id: rank for rank, item_id in enumerate(ids)}


def wrong_count(score: float) -> int:
    """How many of the shipped items a configuration scoring ``score`` points gets wrong."""
    n = len(load_items())
    right = math.floor(n * score / 100 + 0.5)
    return n - max(0, min(n, right))


def answers_correctly(item: TaskItem, profile: Profile) -> bool:
    return _wrong_order(profile.model)[item.id] >= wrong_count(profile.score)


def solution(item: TaskItem, correct: bool, model: str) -> str:
    """The worked solution the model writes: the item's own, or with a wrong final number."""
    if correct:
        return item.answer
    delta = 1 + int(_u("wrong-by", model, item.id) * 9)
    wrong = item.target + delta if item.target <= delta or _u("wrong-sign", model, item.id) < 0.5 else item.target - delta
    body, _, _ = item.answer.rpartition("####")
    head, sep, tail = body.rstrip().rpartition(f"= {item.target}")
    if sep:
        body = f"{head}= {wrong}{tail}\n"
    return f"{body}#### {wrong}"


_PIECES = re.compile(r"\s*\S+")


def _tokens_of(text: str) -> tuple[str, ...]:
    """``text`` in tokens of one word each, with the whitespace before it (the first one
    gets a space, as the ``" tok"`` words have)."""
    pieces = _PIECES.findall(text)
    if pieces and not pieces[0][0].isspace():
        pieces[0] = " " + pieces[0]
    return tuple(pieces)


# ---------------------------------------------------------------- the content of one answer

class Content:
    """The tokens one request is answered with, made lazily: ``token(i)`` and ``logprob(i)``.

    ``length`` is where the answer ends by itself (a task answer), None when it runs until
    the request's cap. :meth:`start` fixes whether the request was batched with others (the
    scheduler knows only when its first token is due), which decides the batch effect.
    """

    def __init__(self, prompt: str, profile: Profile, item: TaskItem | None, cap: int, stop: Sequence[str] = ()) -> None:
        self.profile = profile
        self.item = item
        self.cap = cap
        self.seed = hashlib.blake2b(f"{profile.model}\x1f{prompt}".encode(), digest_size=12).hexdigest()
        self.length: int | None = None
        self._answer: tuple[str, ...] = ()
        if item is not None:
            text = solution(item, answers_correctly(item, profile), profile.model)
            cut = min((i for i in (text.find(s) for s in stop) if i >= 0), default=-1)
            self._answer = _tokens_of(text if cut < 0 else text[:cut])  # a stop string ends it, unsent
            self.length = len(self._answer)
        self._effects: tuple[Effect, ...] = profile.effects
        self._diverge_at: int | None = None
        self._branch = self.seed
        self._settle()

    def start(self, batched: bool) -> None:
        if batched:
            self._effects = (*self.profile.effects, BATCH)
            self._settle()

    def _settle(self) -> None:
        """Where the answer parts from the baseline's (the earliest position any effect
        moves it to), and the seed of the words after it."""
        points = []
        for effect in self._effects:
            if _u("diverges", effect.name, self.seed) < effect.diverge:
                v = _u("diverge-at", effect.name, self.seed)
                points.append((int(self.cap * (0.5 + 0.5 * v)) if effect.late else int(self.cap * v), effect.name))
        if points:
            self._diverge_at = max(1, min(p for p, _ in points))  # greedy answers share their first token
            self._branch = f"{self.seed}\x1f" + "\x1f".join(f"{name}@{p}" for p, name in sorted(points))
        else:
            self._diverge_at, self._branch = None, self.seed

    def token(self, i: int) -> str:
        if self.item is not None:
            return self._answer[i] if i < len(self._answer) else " tok"
        seed = self._branch if self._diverge_at is not None and i >= self._diverge_at else self.seed
        return " " + _word(seed, i)

    def text(self, start: int, end: int) -> str:
        return "".join(self.token(i) for i in range(start, end))

    def logprob(self, i: int) -> float:
        """The chosen token's log-probability: the model's own (a pure function of the
        prompt and position) plus each effect's deterministic shift."""
        diverged = self._diverge_at is not None and i >= self._diverge_at
        seed = self._branch if diverged else self.seed
        lp = -(0.01 + 2.5 * _u("lp", seed, i) ** 3)
        for effect in self._effects:
            lp -= effect.logprob_noise * _u("jitter", effect.name, self.seed, i)
        return lp

    def alternatives(self, i: int, k: int) -> list[tuple[str, float]]:
        """The ``k`` most likely tokens at ``i`` (the chosen one first: greedy)."""
        lp = self.logprob(i)
        out = [(self.token(i), lp)]
        for j in range(1, k):
            lp -= 0.05 + 2.0 * _u("alt-gap", self.seed, i, j)
            out.append((" " + _word(f"{self.seed}\x1falt{j}", i), lp))
        return out


# ---------------------------------------------------------------- the logprobs JSON

def chat_logprobs(content: Content, start: int, end: int, top: int) -> list[dict[str, object]]:
    """vLLM's ``ChatCompletionLogProbs.content`` entries for tokens ``start..end``
    (vllm/entrypoints/openai/chat_completion/protocol.py: token, logprob, bytes, top_logprobs)."""
    out: list[dict[str, object]] = []
    for i in range(start, end):
        token = content.token(i)
        alts = content.alternatives(i, top) if top > 0 else []
        out.append({"token": token, "logprob": content.logprob(i), "bytes": list(token.encode()),
                    "top_logprobs": [{"token": t, "logprob": lp, "bytes": list(t.encode())} for t, lp in alts]})
    return out


def completion_logprobs(content: Content, start: int, end: int, top: int, offset: int) -> dict[str, list[object]]:
    """vLLM's ``CompletionLogProbs`` for tokens ``start..end`` whose text begins at character
    ``offset`` of the completion (text_offset, token_logprobs, tokens, top_logprobs; with
    ``logprobs: 0`` each top_logprobs entry holds the chosen token alone)."""
    offsets: list[object] = []
    lps: list[object] = []
    tokens: list[object] = []
    tops: list[object] = []
    for i in range(start, end):
        token = content.token(i)
        offsets.append(offset)
        offset += len(token)
        lps.append(content.logprob(i))
        tokens.append(token)
        tops.append(dict(content.alternatives(i, max(1, top))))
    return {"text_offset": offsets, "token_logprobs": lps, "tokens": tokens, "top_logprobs": tops}


def requested_top(body: Mapping[str, Any], chat: bool) -> int | None:
    """How many top alternatives the request asks per token, or None: no logprobs asked
    (chat: ``logprobs: true`` with ``top_logprobs``; completions: ``logprobs: N``)."""
    if chat:
        if body.get("logprobs") is not True:
            return None
        top = body.get("top_logprobs") or 0
    else:
        top = body.get("logprobs")
        if top is None or top is False:
            return None
    return int(top) if isinstance(top, int) and not isinstance(top, bool) and top > 0 else 0
