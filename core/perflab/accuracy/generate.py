"""Generate perflab's shipped accuracy task: arithmetic word problems in gsm8k's format.

``python -m perflab.accuracy.generate`` rewrites ``perflab/accuracy/data/perflab_arith.jsonl``
byte for byte (a test regenerates it and compares): a seeded generator, no network, no
model. Each item has gsm8k's fields (``question``; ``answer``: the worked solution ending in
``#### <number>``), plus ``id`` and the integer ``target``, so exact match on the number
after ``####`` scores it, as lm-evaluation-harness scores gsm8k (its ``strict-match``
filter: ``#### (\\-?[0-9\\.\\,]+)``).

Two- and three-step problems with small integers: a capable model answers nearly all of
them, so a drop in score is the serving configuration's doing, not the task's difficulty.
"""

from __future__ import annotations

import json
import random
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

TASK_NAME = "perflab_arith"
ITEMS = 200
SEED = 20261128
DATA = Path(__file__).with_name("data") / f"{TASK_NAME}.jsonl"

NAMES = ("Ava", "Ben", "Chen", "Dara", "Eli", "Fatima", "Gus", "Hana", "Ivan", "Jia", "Kofi", "Lena",
         "Mateo", "Nia", "Omar", "Priya", "Quinn", "Ravi", "Sofia", "Tomas", "Uma", "Viktor", "Wen", "Yara")
THINGS = ("apples", "marbles", "stickers", "books", "pencils", "cookies", "stamps", "shells", "coins", "cards")

Problem = tuple[str, str, int]  # question, worked solution (without the #### line), answer


def _buy_and_give(r: random.Random) -> Problem:
    name, thing = r.choice(NAMES), r.choice(THINGS)
    a, b = r.randint(5, 60), r.randint(2, 40)
    c = r.randint(1, a + b - 1)
    q = (f"{name} has {a} {thing}. {name} buys {b} more and then gives {c} to a friend. "
         f"How many {thing} does {name} have now?")
    s = f"{name} has {a} + {b} = {a + b} {thing} after buying. After giving {c} away, {a + b} - {c} = {a + b - c}."
    return q, s, a + b - c


def _boxes(r: random.Random) -> Problem:
    name, thing = r.choice(NAMES), r.choice(THINGS)
    boxes, per, extra = r.randint(2, 12), r.randint(3, 25), r.randint(1, 30)
    q = (f"{name} packs {boxes} boxes with {per} {thing} in each box and has {extra} {thing} left over. "
         f"How many {thing} did {name} start with?")
    s = f"The boxes hold {boxes} * {per} = {boxes * per} {thing}. With the {extra} left over, {boxes * per} + {extra} = {boxes * per + extra}."
    return q, s, boxes * per + extra


def _share(r: random.Random) -> Problem:
    name, thing = r.choice(NAMES), r.choice(THINGS)
    friends, each = r.randint(2, 9), r.randint(2, 20)
    kept = r.randint(1, 25)
    total = friends * each + kept
    q = (f"{name} had {total} {thing}, kept {kept} and shared the rest equally among {friends} friends. "
         f"How many {thing} did each friend get?")
    s = f"{name} shared {total} - {kept} = {total - kept} {thing}. Each friend got {total - kept} / {friends} = {each}."
    return q, s, each


def _wage(r: random.Random) -> Problem:
    name = r.choice(NAMES)
    rate, hours, days = r.randint(8, 30), r.randint(2, 8), r.randint(2, 6)
    q = f"{name} earns {rate} dollars an hour and works {hours} hours a day for {days} days. How many dollars does {name} earn?"
    s = f"Each day {name} earns {rate} * {hours} = {rate * hours} dollars. Over {days} days, {rate * hours} * {days} = {rate * hours * days}."
    return q, s, rate * hours * days


def _change(r: random.Random) -> Problem:
    name, thing = r.choice(NAMES), r.choice(THINGS)
    price, n = r.randint(2, 15), r.randint(2, 9)
    paid = price * n + r.randint(1, 50)
    q = (f"{name} buys {n} {thing} at {price} dollars each and pays with {paid} dollars. "
         f"How many dollars of change does {name} get?")
    s = f"The {thing} cost {n} * {price} = {price * n} dollars. The change is {paid} - {price * n} = {paid - price * n}."
    return q, s, paid - price * n


def _ages(r: random.Random) -> Problem:
    a, b = r.sample(NAMES, 2)
    age, diff, years = r.randint(5, 40), r.randint(2, 20), r.randint(2, 15)
    q = f"{a} is {age} years old and {b} is {diff} years older than {a}. How old will {b} be in {years} years?"
    s = f"{b} is {age} + {diff} = {age + diff} years old now. In {years} years, {age + diff} + {years} = {age + diff + years}."
    return q, s, age + diff + years


def _rows(r: random.Random) -> Problem:
    name = r.choice(NAMES)
    rows, per, removed = r.randint(3, 15), r.randint(4, 20), r.randint(1, 30)
    total = rows * per
    removed = min(removed, total - 1)
    q = (f"{name} plants {rows} rows of {per} trees each. A storm knocks down {removed} trees. "
         f"How many trees are still standing?")
    s = f"{name} planted {rows} * {per} = {total} trees. After the storm, {total} - {removed} = {total - removed}."
    return q, s, total - removed


def _distance(r: random.Random) -> Problem:
    name = r.choice(NAMES)
    speed, hours, back = r.randint(20, 90), r.randint(2, 6), r.randint(5, 60)
    q = (f"{name} drives at {speed} kilometres per hour for {hours} hours, then drives {back} kilometres back. "
         f"How far from the start is {name}?")
    s = f"{name} drove {speed} * {hours} = {speed * hours} kilometres out. Driving back {back}, {speed * hours} - {back} = {speed * hours - back}."
    return q, s, speed * hours - back


TEMPLATES: tuple[Callable[[random.Random], Problem], ...] = (
    _buy_and_give, _boxes, _share, _wage, _change, _ages, _rows, _distance)


def items(n: int = ITEMS, seed: int = SEED) -> Iterator[dict[str, object]]:
    r = random.Random(seed)
    seen: set[str] = set()
    i = 0
    while i < n:
        q, s, target = TEMPLATES[i % len(TEMPLATES)](r)
        if q in seen:  # every question unique: a question identifies its item
            continue
        seen.add(q)
        yield {"id": f"{TASK_NAME}-{i:03d}", "question": q, "answer": f"{s}\n#### {target}", "target": target}
        i += 1


def render() -> str:
    return "".join(json.dumps(item, ensure_ascii=False, sort_keys=True) + "\n" for item in items())


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    out = Path(args[0]) if args else DATA
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render(), encoding="utf-8")
    print(f"wrote {ITEMS} items to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
