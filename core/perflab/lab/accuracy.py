"""The accuracy gate of a study: a plan's ``accuracy:`` section, measured and decided.

Every configuration a study measures is scored on the plan's task (lm-evaluation-harness,
:mod:`perflab.accuracy.harness`) and answers a fixed prompt set greedily
(:mod:`perflab.accuracy.agreement`), in the same launch, after its profiles (which so measure
a fresh engine; a main profile stopped early still leaves it scored). Each
engine has a **reference**: the baseline for the baseline's engine, the engine's defaults for
the others (different engines are not expected to agree token for token). A reference answers
twice — one prompt at a time, then all at once — and the two sets' agreement is its noise
floor (real engines are not batch-invariant); any other configuration answers once, all at
once, and is compared with its reference's first set. The task score's drop is always taken
against the baseline's score.

A configuration is **rejected** (not eligible) when its score drops more than ``max_drop``
points below the baseline's, or its agreement falls more than ``agreement_margin`` points
below its reference's floor. One whose every change from its reference is lossless (an option
declared ``lossless`` where serving options are declared, :data:`perflab.lab.options.LOSSLESS_OPTIONS`,
or listed in ``accuracy.lossless``) skips the task and keeps the agreement check.

The measurement is stored as one more measurement of the run, under the reserved profile name
:data:`ACCURACY_PROFILE` and a key of what it measured (:meth:`AccuracyJob.key`): it survives
resume and ``--rebuild`` as the benchmarks do, and changing the task re-measures only it.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from perflab.accuracy.tasks import SHIPPED_TASK, load_items
from perflab.accuracy.types import AnswerSet, EvalResult
from perflab.lab.options import LOSSLESS_OPTIONS, Configuration

#: the reserved profile name an accuracy measurement is stored under (no plan profile may take it)
ACCURACY_PROFILE = "#accuracy"
APIS = ("chat", "completions")
#: the keys of a plan's ``accuracy:`` (docs/plan-reference.md)
ACCURACY_KEYS = ("task", "limit", "max_drop", "agreement", "agreement_margin", "concurrency", "api", "lossless",
                 "timeout_s")
#: serving options that change the weights or the precision answers are computed with: a plan
#: cannot declare them lossless (``accuracy.lossless``), or a quantized checkpoint would skip the
#: task, and with ``agreement: false`` be adopted unmeasured
NEVER_LOSSLESS = frozenset({"model", "quantization", "kv_cache_dtype"})
# a drop this close to the bound is the bound: a score is a ratio of counts, printed to 0.01
_EPS = 1e-9


@dataclass(frozen=True)
class AccuracySpec:
    """A plan's ``accuracy:`` (defaults here are the documented ones)."""

    task: str | None = SHIPPED_TASK  # None: agreement only
    limit: int | None = None  # items of the task (None: all)
    max_drop: float = 1.0  # points of score below the baseline's
    agreement: bool = True
    agreement_margin: float = 10.0  # points of exact match below the reference's noise floor
    concurrency: int = 8  # the task's requests in flight
    api: str = "chat"  # lm-eval's local-chat-completions or local-completions
    lossless: tuple[str, ...] = ()  # plan option keys the plan declares lossless beside the declared ones
    timeout_s: float = 1800.0  # the whole accuracy measurement of one configuration

    def items(self) -> int | None:
        """How many items the task scores (None: an lm-eval task's own count, unknown here)."""
        if self.task == SHIPPED_TASK:
            n = len(load_items())
            return min(n, self.limit) if self.limit else n
        return self.limit

    def describe(self) -> str:
        """``perflab_arith, 200 items`` (the progress line's)."""
        n = self.items()
        return f"{self.task}, {n} items" if n is not None else f"{self.task}, all items"

    def lossless_keys(self) -> frozenset[str]:
        return LOSSLESS_OPTIONS | frozenset(self.lossless)


@dataclass(frozen=True)
class AccuracyJob:
    """What one configuration's accuracy measurement does."""

    spec: AccuracySpec
    reference: bool  # its engine's reference: answers twice (the noise floor)
    task: bool  # scores the task (False: task null, or every change from the reference lossless)

    def key(self) -> str:
        """The store's key of what is measured: the task and how, and the agreement's passes
        (not max_drop, the margin or timeouts: they decide, they do not measure)."""
        from perflab.accuracy.agreement import PROMPT_SET

        spec = self.spec
        what: dict[str, Any] = {"reference": self.reference}
        if self.task:
            what["task"] = {"name": spec.task, "limit": spec.limit, "api": spec.api}
        if spec.agreement:
            what["agreement"] = PROMPT_SET
        text = json.dumps(what, sort_keys=True)
        return "accuracy-" + hashlib.sha256(text.encode()).hexdigest()[:16]

    def describe(self) -> str:
        if self.task:
            return self.spec.describe()
        return "agreement only" + (" (lossless change)" if self.spec.task is not None else "")

    def to_json(self) -> dict[str, Any]:
        return {"reference": self.reference, "task": self.task, "spec": {
            k: list(v) if isinstance(v, tuple) else v for k, v in vars(self.spec).items()}}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> AccuracyJob:
        spec = dict(data["spec"])
        spec["lossless"] = tuple(spec.get("lossless") or ())
        return cls(AccuracySpec(**spec), bool(data["reference"]), bool(data["task"]))


def changed_keys(reference: Configuration, config: Configuration) -> list[str]:
    keys = set(reference.options) | set(config.options)
    return sorted(k for k in keys if reference.options.get(k) != config.options.get(k))


def is_lossless(spec: AccuracySpec, reference: Configuration, config: Configuration) -> bool:
    """Whether every change of ``config`` from ``reference`` is lossless (and there is one)."""
    changed = changed_keys(reference, config)
    return bool(changed) and all(k in spec.lossless_keys() for k in changed)


class AccuracyRunner:
    """The seam the executor measures accuracy through (tests replace it): the harness's
    ``evaluate`` and the agreement's ``collect``, as the shared design declares them."""

    async def evaluate(self, base_url: str, model: str, **kw: Any) -> EvalResult:
        from perflab.accuracy.harness import evaluate

        return await evaluate(base_url, model, **kw)

    async def collect(self, base_url: str, model: str, **kw: Any) -> AnswerSet:
        from perflab.accuracy.agreement import collect

        return await collect(base_url, model, **kw)


def all_at_once() -> int:
    """The concurrency that sends the whole prompt set at once."""
    from perflab.accuracy.agreement import PROMPTS

    return max(1, len(PROMPTS))


async def measure(job: AccuracyJob, runner: AccuracyRunner, base_url: str, model: str, *, api_key: str | None,
                  simulated: bool, on_stage: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run ``job`` against a served endpoint; the record the store keeps (JSON). Raises what
    the harness or the client raise (the caller makes it the run's failure)."""
    spec = job.spec
    began = time.monotonic()
    result: EvalResult | None = None
    if job.task:
        if on_stage is not None:
            on_stage(f"evaluating accuracy ({spec.describe()})")
        result = await runner.evaluate(base_url, model, task=spec.task, api=spec.api, limit=spec.limit,
                                       concurrency=spec.concurrency, timeout_s=spec.timeout_s, api_key=api_key)
    sets: list[AnswerSet] = []
    if spec.agreement:
        if on_stage is not None:
            on_stage("collecting greedy answers (agreement" + (", twice: the noise floor)" if job.reference else ")"))
        passes = (1, all_at_once()) if job.reference else (all_at_once(),)
        for concurrency in passes:
            # server_clock: all at once arrive at one model time on a simulated engine, as on a real one
            sets.append(await runner.collect(base_url, model, concurrency=concurrency, api_key=api_key,
                                             timeout_s=spec.timeout_s, api=spec.api, server_clock=simulated))
    return {"job": job.to_json(), "eval": result.to_json() if result is not None else None,
            "answers": [s.to_json() for s in sets], "simulated": simulated,
            "seconds": round(time.monotonic() - began, 3)}


# --------------------------------------------------------------------------- the decision


@dataclass(frozen=True)
class Verdict:
    """A configuration's accuracy as the study decides with it and the report shows it."""

    block: dict[str, Any]  # report.json's ``accuracy``
    rejected: bool
    note: str  # "rejected: accuracy -2.3 points (perflab_arith)"; "" when it passes

    @property
    def gate(self) -> str:
        return str(self.block.get("gate"))


def _eval(record: Mapping[str, Any] | None) -> EvalResult | None:
    data = (record or {}).get("eval")
    return EvalResult.from_json(data) if data else None


def _answers(record: Mapping[str, Any] | None) -> list[AnswerSet]:
    return [AnswerSet.from_json(a) for a in (record or {}).get("answers") or ()]


def points(value: float) -> str:
    return f"{value:+.1f} points"


def decide(spec: AccuracySpec, record: Mapping[str, Any] | None, *, reference: Mapping[str, Any] | None,
           baseline: Mapping[str, Any] | None, reference_label: str, missing: str | None = None) -> Verdict:
    """Judge one configuration's accuracy ``record`` against its engine's ``reference`` record
    and the ``baseline``'s (each as :func:`measure` returned it; None: not measured, with
    ``missing`` saying why when known)."""
    from perflab.accuracy.agreement import compare, judge

    job = AccuracyJob.from_json(record["job"]) if record else None
    block: dict[str, Any] = {"task": spec.task, "metric": None, "score": None, "baseline_score": None, "drop": None,
                             "samples": None, "agreement": None, "gate": None, "reason": None, "simulated": None,
                             "reference": reference_label}
    if record is None:
        why = missing or "not measured"
        block["gate"] = "not measured"
        block["reason"] = f"accuracy not measured ({why})"
        return Verdict(block, True, block["reason"])
    block["simulated"] = bool(record.get("simulated"))
    problems: list[str] = []
    result = _eval(record)
    if result is not None:
        base = _eval(baseline)
        block.update(task=result.task, metric=result.metric, score=round(result.score, 4), samples=result.samples)
        if base is None:
            problems.append("accuracy not judged (the baseline's score was not measured)")
        else:
            block["baseline_score"] = round(base.score, 4)
            drop = base.score - result.score + 0.0  # never -0.0
            block["drop"] = round(drop, 4) + 0.0
            if drop > spec.max_drop + _EPS:
                problems.append(f"rejected: accuracy {points(-drop)} ({result.task})")
    if spec.agreement:
        ref_sets, own = _answers(reference), _answers(record)
        if len(ref_sets) < 2 or not own:
            problems.append(f"accuracy not judged ({reference_label}'s answers were not collected)"
                            if len(ref_sets) < 2 else "accuracy not judged (no answers collected)")
        else:
            floor = compare(ref_sets[0], ref_sets[1])
            mine = floor if job is not None and job.reference else compare(ref_sets[0], own[-1])
            ok = judge(mine, floor, spec.agreement_margin)
            block["agreement"] = {**mine.to_json(), "floor": floor.exact_match, "margin": spec.agreement_margin,
                                  "ok": ok}
            if not ok:
                problems.append(f"rejected: accuracy: agreement {mine.exact_match:.1f}% with {reference_label}, below "
                                f"its noise floor {floor.exact_match:.1f}% by more than {spec.agreement_margin:g} points")
    rejected = bool(problems)
    # one "rejected:" for the verdict, however many measures reject it
    reason = "; ".join(p if i == 0 else p.removeprefix("rejected: accuracy: ") for i, p in enumerate(problems))
    block["reason"] = reason or None
    if any(p.startswith("rejected") for p in problems):
        block["gate"] = "rejected"
    elif rejected:  # never adopted blind: not eligible, though nothing measured was found wrong
        block["gate"] = "not judged"
    elif job is not None and not job.task and spec.task is not None:
        block["gate"] = "skipped (lossless)"
    else:
        block["gate"] = "pass"
    return Verdict(block, rejected, reason)


__all__ = [
    "ACCURACY_KEYS",
    "ACCURACY_PROFILE",
    "APIS",
    "NEVER_LOSSLESS",
    "AccuracyJob",
    "AccuracyRunner",
    "AccuracySpec",
    "Verdict",
    "decide",
    "is_lossless",
    "measure",
]
