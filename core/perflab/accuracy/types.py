"""The typed records of accuracy measurements (frozen; ``to_json``/``from_json`` round-trip)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class EvalResult:
    """One task's score on one endpoint, as lm-evaluation-harness computed it."""

    task: str  # the lm-eval task name (perflab_arith, gsm8k, ...)
    metric: str  # the metric the score is (exact_match, acc, ...)
    filter: str  # lm-eval's filter the metric went through (strict-match, none, ...)
    mode: str  # "gen" (generate_until) or "loglikelihood"
    score: float  # points: 0..100
    stderr: float | None  # points, lm-eval's standard error of the mean
    samples: int  # items scored
    seconds: float  # wall time of the evaluation
    harness: str  # "lm-eval 0.4.13"
    api: str  # "chat" (local-chat-completions) or "completions" (local-completions)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> EvalResult:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__})


@dataclass(frozen=True)
class Answer:
    """One greedy answer: its text and, where the server returned them, its tokens' logprobs."""

    id: str  # the prompt's id in the prompt set
    text: str
    tokens: tuple[str, ...] | None = None
    logprobs: tuple[float, ...] | None = None
    error: str | None = None  # the request failed: no answer (counts as a disagreement)

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "text": self.text, "tokens": list(self.tokens) if self.tokens is not None else None,
                "logprobs": list(self.logprobs) if self.logprobs is not None else None, "error": self.error}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Answer:
        tokens, logprobs = data.get("tokens"), data.get("logprobs")
        return cls(str(data["id"]), str(data.get("text", "")), tuple(tokens) if tokens is not None else None,
                   tuple(float(x) for x in logprobs) if logprobs is not None else None, data.get("error"))


@dataclass(frozen=True)
class AnswerSet:
    """A configuration's greedy answers to the fixed prompt set, sent ``concurrency`` at a time."""

    prompt_set: str  # the prompt set's name and version: answer sets compare only within one
    concurrency: int
    answers: tuple[Answer, ...] = field(default_factory=tuple)

    def to_json(self) -> dict[str, Any]:
        return {"prompt_set": self.prompt_set, "concurrency": self.concurrency,
                "answers": [a.to_json() for a in self.answers]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> AnswerSet:
        return cls(str(data["prompt_set"]), int(data["concurrency"]),
                   tuple(Answer.from_json(a) for a in data.get("answers", ())))


@dataclass(frozen=True)
class Agreement:
    """How far two answer sets to the same prompts agree."""

    samples: int  # prompts compared
    exact_match: float  # percent of prompts answered identically (0..100)
    first_divergence: float | None  # mean token position of the first difference, over the diverging answers (None: none diverged)
    mean_abs_logprob_diff: float | None  # over the tokens both share before the first divergence (None: no logprobs)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Agreement:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__})
