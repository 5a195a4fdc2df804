"""The task perflab ships (offline, deterministic: :mod:`perflab.accuracy.generate`)."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from perflab.accuracy.generate import TASK_NAME

SHIPPED_TASK = TASK_NAME  # the default task of ``perflab eval`` and of a plan's ``accuracy:``


@dataclass(frozen=True)
class TaskItem:
    id: str
    question: str
    answer: str  # the worked solution, ending in "#### <target>"
    target: int


def data_path() -> Path:
    return Path(str(resources.files("perflab.accuracy").joinpath(f"data/{SHIPPED_TASK}.jsonl")))


@functools.cache
def load_items() -> tuple[TaskItem, ...]:
    out = []
    for line in data_path().read_text(encoding="utf-8").splitlines():
        if line.strip():
            d = json.loads(line)
            out.append(TaskItem(d["id"], d["question"], d["answer"], int(d["target"])))
    return tuple(out)


@functools.cache
def _by_question() -> dict[str, TaskItem]:
    return {item.question: item for item in load_items()}


def find_item(text: str | None) -> TaskItem | None:
    """The shipped item whose question a prompt asks last (few-shot prompts carry solved
    examples before it), or None: how the simulated engines recognise a question they can
    answer."""
    if not text:
        return None
    best: tuple[int, TaskItem] | None = None
    index = _by_question()
    # every question ends with "?": look at each sentence run ending in one, from the end
    end = len(text)
    while True:
        q = text.rfind("?", 0, end)
        if q < 0:
            return None if best is None else best[1]
        for item in _candidates(text, q + 1, index):
            if best is None or q > best[0]:
                best = (q, item)
        if best is not None:
            return best[1]
        end = q


def _candidates(text: str, stop: int, index: dict[str, TaskItem]) -> list[TaskItem]:
    found = []
    for length in _lengths():
        start = stop - length
        if start >= 0 and text[start:stop] in index:
            found.append(index[text[start:stop]])
    return found


@functools.cache
def _lengths() -> tuple[int, ...]:
    return tuple(sorted({len(q) for q in _by_question()}))
