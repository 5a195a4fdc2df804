"""``perflab compare STUDY_A STUDY_B``: the same plan on two engine versions, two machines or
two dates, measurement by measurement.

Each study's decisions are rebuilt from its store, as ``perflab report`` does (so studies
written before report.json carried a field still compare). The measurements are the ones its
report shows: every step's entries (main profile) and the baseline and optimized
configuration on every profile. A measurement is paired with the other study's by its
configuration key (:meth:`perflab.lab.options.Configuration.key` without the study's salt: the
engine and its options, not the machine or the engine version) and its profile key
(:func:`perflab.lab.report.stored.profile_key`). For each pair, the change in every headline metric
(:data:`METRICS`, each with its direction) is computed, and a change for the worse is a
**regression** when it exceeds the threshold (``--threshold``, default
:data:`DEFAULT_THRESHOLD_PCT` %; ``--tail-threshold``, default :data:`DEFAULT_TAIL_THRESHOLD_PCT` %,
for p99s) and, when the measurements have repeats, their measured noise too (both relative
spreads in quadrature: the rule the study adopts candidates by; an energy figure adds the
uncertainty its measurement states). Metrics are compared where
both measurements ran to the end; a measurement that succeeded in A and not in B (crashed,
stalled, refused) is a regression as well, one stopped early is a status change. Then the decisions:
each step's adopted entry, the winner engine, the optimized configuration; and what only one
study holds.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from functools import partial
from pathlib import Path
from typing import Any

from perflab.bench.metrics import name_of
from perflab.contract.errors import UsageError
from perflab.contract.status import Status
from perflab.lab.plan import Plan, Profile
from perflab.lab.study import ConfigResult, Entry, StudyOutcome, pct

__all__ = [
    "DEFAULT_TAIL_THRESHOLD_PCT", "DEFAULT_THRESHOLD_PCT", "METRICS", "Change", "Comparison", "Decision", "Measured", "Metric", "MetricDelta", "Pair",
    "StudyView", "compare", "compare_studies", "load_study", "metric_delta", "same_plan",
]

#: A change smaller than this (in %) is never a regression, whatever the noise: run-to-run
#: variation of a serving benchmark on one machine is typically a few percent.
DEFAULT_THRESHOLD_PCT = 5.0
#: The same for tail percentiles (p99 TTFT, TPOT, ITL, E2EL): without repeats they move more
#: from run to run than means do (a different arrival order makes different batches; on the
#: simulator, SGLang's p99 ITL on seed 002's ShareGPT load moved 9.7 % between two runs of one
#: configuration while its means moved under 2 %).
DEFAULT_TAIL_THRESHOLD_PCT = 10.0


@dataclass(frozen=True)
class Metric:
    """A headline figure and which way is better."""

    # the metrics key (vllm bench serve's name), "capacity" (the max-load search's), or
    # "<observed key>.<field>" for a summary of what was watched (perflab.observe.OBSERVED_KEYS)
    key: str
    label: str
    higher_is_better: bool

    def value(self, res: ConfigResult) -> float | None:
        if not res.status.measured:
            return None
        if self.key == "capacity":
            raw: Any = res.capacity
        elif "." in self.key:
            summary, name = self.key.split(".", 1)
            raw = (res.observed.get(summary) or {}).get(name)
        else:
            raw = res.metrics.get(self.key) if res.metrics is not None else None
        if not isinstance(raw, (int, float)) or isinstance(raw, bool) or not math.isfinite(raw):
            return None
        return float(raw)

    @property
    def tail(self) -> bool:
        """A percentile (``p99_tpot_ms``), judged by the tail threshold."""
        head = self.key.split("_", 1)[0]
        return len(head) > 1 and head[0] == "p" and head[1:].replace(".", "").isdigit()

    def noise(self, res: ConfigResult) -> float | None:
        """The measured relative spread in % (repeats) and, for a summary of what was watched,
        the uncertainty it states of its own figures (``uncertainty_pct``: energy's idle
        estimate, :func:`perflab.observe.energy.idle_error`), in quadrature; None without
        either."""
        parts = [(res.noise or {}).get(self.key)]
        if "." in self.key:
            parts.append((res.observed.get(self.key.split(".", 1)[0]) or {}).get("uncertainty_pct"))
        got = [float(v) for v in parts if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)]
        return math.hypot(*got) if got else None


#: The headline metrics, each declared once with its direction. Goodput, capacity, energy and
#: cost appear only where they were measured (an SLO; ``decide_by: max-load``; accelerator
#: telemetry; a plan ``cost:``).
METRICS: tuple[Metric, ...] = (
    Metric(name_of(lambda m: m.total_token_throughput), "total tok/s", True),
    Metric(name_of(lambda m: m.output_throughput), "output tok/s", True),
    Metric(name_of(lambda m: m.request_throughput), "req/s", True),
    Metric(name_of(lambda m: m.request_goodput), "goodput req/s", True),
    Metric("capacity", "capacity", True),
    Metric(name_of(lambda m: m.mean_ttft_ms), "mean TTFT ms", False),
    Metric(name_of(lambda m: m.p99_ttft_ms), "p99 TTFT ms", False),
    Metric(name_of(lambda m: m.mean_tpot_ms), "mean TPOT ms", False),
    Metric(name_of(lambda m: m.p99_tpot_ms), "p99 TPOT ms", False),
    Metric(name_of(lambda m: m.mean_itl_ms), "mean ITL ms", False),
    Metric(name_of(lambda m: m.p99_itl_ms), "p99 ITL ms", False),
    Metric(name_of(lambda m: m.mean_e2el_ms), "mean E2EL ms", False),
    Metric(name_of(lambda m: m.p99_e2el_ms), "p99 E2EL ms", False),
    Metric("energy.output_tokens_per_joule", "output tok/J", True),
    Metric("cost.per_million_output_tokens", "cost per M output tok", False),
)


class Change(StrEnum):
    """What a metric's change means."""

    REGRESSED = "regressed"  # worse by more than the threshold and the noise
    IMPROVED = "improved"  # better by as much
    WITHIN_NOISE = "within-noise"  # smaller than the threshold or the noise


@dataclass(frozen=True)
class MetricDelta:
    metric: Metric
    a: float
    b: float
    change_pct: float | None  # (b - a) / a in %; None when a is 0
    noise_pct: float | None  # both sides' spreads (and stated uncertainties) in quadrature; None without either
    limit_pct: float  # what the change had to exceed: max(threshold, noise)
    change: Change

    def to_json(self) -> dict[str, Any]:
        return {"metric": self.metric.key, "label": self.metric.label, "higher_is_better": self.metric.higher_is_better,
                "a": self.a, "b": self.b, "change_pct": _round(self.change_pct), "noise_pct": _round(self.noise_pct),
                "limit_pct": _round(self.limit_pct), "change": str(self.change)}


def metric_delta(metric: Metric, a: ConfigResult, b: ConfigResult, threshold_pct: float) -> MetricDelta | None:
    """The change of ``metric`` from ``a`` to ``b`` (None: either side lacks it)."""
    va, vb = metric.value(a), metric.value(b)
    if va is None or vb is None:
        return None
    change = pct(vb, va)
    na, nb = metric.noise(a), metric.noise(b)
    noise = None if na is None and nb is None else math.hypot(na or 0.0, nb or 0.0)
    limit = max(threshold_pct, noise or 0.0)
    if change is None:  # a was 0: any b is no relative change worth a verdict
        verdict = Change.WITHIN_NOISE
    else:
        better = change if metric.higher_is_better else -change
        verdict = Change.IMPROVED if better > limit else Change.REGRESSED if -better > limit else Change.WITHIN_NOISE
    return MetricDelta(metric, va, vb, change, noise, limit, verdict)


# --------------------------------------------------------------------------- one study


@dataclass(frozen=True)
class Measured:
    """One (configuration, profile) result as the study's report shows it."""

    config_key: str  # Configuration.key() without salt: engine and options only
    profile_key: str
    label: str  # "vLLM", "SGLang · max_num_seqs 64", "Baseline"
    engine: str
    config: Mapping[str, Any]
    profile: str
    result: ConfigResult


@dataclass(frozen=True)
class StudyView:
    """What a comparison needs of one study."""

    path: Path
    plan: Plan
    outcome: StudyOutcome
    versions: Mapping[str, str | None]
    hardware_spec: str
    simulated: bool
    display: Callable[[str], str]
    measured: Mapping[tuple[str, str], Measured]

    @classmethod
    def of(cls, path: Path, plan: Plan, outcome: StudyOutcome, *, versions: Mapping[str, str | None] | None = None,
           hardware_spec: str = "auto", simulated: bool = False,
           display: Callable[[str], str] = lambda e: e) -> StudyView:
        """The view of a study's decisions (``outcome``, as :func:`perflab.lab.study.conduct`
        made them from ``plan``)."""
        return cls(Path(path), plan, outcome, dict(versions or {}), hardware_spec, simulated, display,
                   _measured(plan, outcome))

    def header(self) -> dict[str, Any]:
        return {"path": str(self.path), "plan": self.plan.name, "hardware": self.hardware_spec,
                "simulated": self.simulated, "versions": dict(self.versions), "complete": self.outcome.complete}


def _measured(plan: Plan, outcome: StudyOutcome) -> dict[tuple[str, str], Measured]:
    from perflab.lab.report.stored import profile_key

    out: dict[tuple[str, str], Measured] = {}

    def add(entry: Entry, profile: Profile, res: ConfigResult, label: str | None = None) -> None:
        if res.status is Status.PENDING:  # an unfinished study's gap: nothing to compare
            return
        key = (entry.config.key(), profile_key(plan, profile))
        if key not in out:  # the first place the report shows it names it
            out[key] = Measured(key[0], key[1], label or entry.label, entry.config.engine,
                                entry.config.canonical(), profile.name, res)

    for step in outcome.steps:
        for e in step.entries:
            add(e, plan.main, e.result)
    for case in outcome.cases:
        add(outcome.baseline, case.profile, case.baseline, "Baseline")
        if outcome.optimized is not None and case.optimized is not None:
            add(outcome.optimized, case.profile, case.optimized, "Optimized")
    return out


def _study_dir(path: Path) -> Path:
    """A study directory, also when given its study.db or report.json."""
    p = Path(path)
    if p.is_file() and p.name in ("study.db", "report.json"):
        return p.parent
    if not p.exists():
        raise UsageError(f"{path}: no such study directory")
    return p


def load_study(path: Path) -> StudyView:
    """Read a study directory (its store, read-only; no lock: it may still be running)."""
    import anyio

    from perflab.lab.report import report_context
    from perflab.lab.report.stored import StoreMeasure, stored_plan
    from perflab.lab.store import Store
    from perflab.lab.study import conduct

    directory = _study_dir(path)
    store = Store.open_existing(directory)
    try:
        plan = stored_plan(store)
        ctx = report_context(store)
        measure = StoreMeasure(store, store.get_meta("salt", {}), plan=plan)
        outcome = anyio.run(lambda: conduct(plan, measure, display=ctx.name))
    finally:
        store.close()
    return StudyView.of(directory, plan, outcome, versions=ctx.versions, hardware_spec=ctx.hardware_spec,
                        simulated=ctx.simulated, display=ctx.name)


# --------------------------------------------------------------------------- two studies

# Plan fields that say where, how fast or under which name a plan ran, not what it measures:
# two studies that differ only in these ran the same plan.
_CONTEXT_FIELDS = ("path", "text", "hardware", "time_scale", "sim_engine_versions", "engine_versions", "notes", "title")


def same_plan(a: Plan, b: Plan) -> bool:
    """Whether two plans measure the same thing (the machine and engine versions may differ)."""
    blank: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(Plan) if f.name in _CONTEXT_FIELDS}
    blank["sim_engine_versions"] = blank["engine_versions"] = {}  # default_factory fields
    return dataclasses.replace(a, **blank) == dataclasses.replace(b, **blank)


@dataclass(frozen=True)
class Pair:
    """One configuration on one profile in both studies."""

    a: Measured
    b: Measured
    deltas: tuple[MetricDelta, ...]
    status_regressed: bool  # measured in A, not in B

    @property
    def regressions(self) -> tuple[MetricDelta, ...]:
        return tuple(d for d in self.deltas if d.change is Change.REGRESSED)

    @property
    def regressed(self) -> bool:
        return self.status_regressed or bool(self.regressions)

    def to_json(self) -> dict[str, Any]:
        return {
            "label": self.a.label, "engine": self.a.engine, "config_key": self.a.config_key, "config": self.a.config,
            "profile": self.a.profile, "profile_key": self.a.profile_key,
            "status": {"a": str(self.a.result.status), "b": str(self.b.result.status)},
            "version": {"a": self.a.result.version, "b": self.b.result.version},
            "regressed": self.regressed, "status_regressed": self.status_regressed,
            "regressions": [d.metric.key for d in self.regressions],
            "metrics": [d.to_json() for d in self.deltas],
        }


@dataclass(frozen=True)
class Decision:
    """One decision of the method in both studies: what each chose (None: that study made
    none) and whether the choice differs — by configuration key and adoption, not by label."""

    what: str  # "step: Choosing the Inference Engine", "winner engine", "optimized configuration"
    a: str | None
    b: str | None
    changed: bool

    def to_json(self) -> dict[str, Any]:
        return {"what": self.what, "a": self.a, "b": self.b, "changed": self.changed}


@dataclass(frozen=True)
class Comparison:
    a: StudyView
    b: StudyView
    threshold_pct: float
    tail_threshold_pct: float
    pairs: tuple[Pair, ...]
    decisions: tuple[Decision, ...]
    only_a: tuple[Measured, ...]
    only_b: tuple[Measured, ...]
    warnings: tuple[str, ...] = field(default_factory=tuple)

    @property
    def same_plan(self) -> bool:
        return same_plan(self.a.plan, self.b.plan)

    @property
    def regressions(self) -> tuple[Pair, ...]:
        return tuple(p for p in self.pairs if p.regressed)

    @property
    def exit_code(self) -> int:
        """0: no regression; 1: at least one (``git diff --exit-code``'s convention)."""
        return 1 if self.regressions else 0

    def to_json(self) -> dict[str, Any]:
        def only(ms: tuple[Measured, ...]) -> list[dict[str, Any]]:
            return [{"label": m.label, "engine": m.engine, "config_key": m.config_key, "config": m.config,
                     "profile": m.profile, "profile_key": m.profile_key, "status": str(m.result.status)} for m in ms]

        return {
            "a": self.a.header(), "b": self.b.header(), "same_plan": self.same_plan, "warnings": list(self.warnings),
            "threshold_pct": self.threshold_pct, "tail_threshold_pct": self.tail_threshold_pct,
            "metrics": [{"metric": m.key, "label": m.label, "higher_is_better": m.higher_is_better} for m in METRICS],
            "regressed": bool(self.regressions), "regressions": len(self.regressions),
            "pairs": [p.to_json() for p in self.pairs],
            "decisions": [d.to_json() for d in self.decisions],
            "decisions_changed": sum(d.changed for d in self.decisions),
            "only_in_a": only(self.only_a), "only_in_b": only(self.only_b),
        }


def _pair(a: Measured, b: Measured, threshold_pct: float, tail_threshold_pct: float) -> Pair:
    """The metrics' changes when both sides ran to the end (a measurement stopped early holds
    the figures of its first windows only: its status change is shown instead)."""
    deltas: tuple[MetricDelta, ...] = ()
    if a.result.status is Status.OK and b.result.status is Status.OK:
        deltas = tuple(d for m in METRICS if (d := metric_delta(
            m, a.result, b.result, tail_threshold_pct if m.tail else threshold_pct)) is not None)
    return Pair(a, b, deltas, a.result.status.measured and not b.result.status.measured)


def _decisions(a: StudyView, b: StudyView) -> list[Decision]:
    """Each step's choice (paired by the step's name), the winner engine, the optimized
    configuration: (what it shows, what identifies it) per study."""

    def step_choice(view: StudyView, name: str) -> tuple[str | None, Any]:
        step = next((s for s in view.outcome.steps if s.name == name), None)
        if step is None:
            return None, None
        if step.skipped:
            return f"skipped: {step.skipped}", ("skipped",)
        if step.chosen is None:
            return "nothing eligible", ("none",)
        verdict = "adopted" if step.adopted else "within noise" if step.within_noise else "not adopted"
        return f"{step.chosen.label} ({verdict})", (step.chosen.config.key(), step.adopted)

    def winner(view: StudyView) -> tuple[str | None, Any]:
        step = next((s for s in view.outcome.steps if s.kind == "engine"), None)
        engine = step.chosen.config.engine if step and step.chosen else None
        return (view.display(engine) if engine else None), engine

    def optimized(view: StudyView) -> tuple[str | None, Any]:
        o = view.outcome.optimized
        return (o.label, o.config.key()) if o is not None else (None, None)

    def decision(what: str, pick: Callable[[StudyView], tuple[str | None, Any]]) -> Decision:
        (ta, ka), (tb, kb) = pick(a), pick(b)
        return Decision(what, ta, tb, ka != kb)

    names = list(dict.fromkeys([s.name for s in a.outcome.steps] + [s.name for s in b.outcome.steps]))
    out = [decision(f"step: {name}", partial(step_choice, name=name)) for name in names]
    out.append(decision("winner engine", winner))
    out.append(decision("optimized configuration", optimized))
    return out


def compare(a: StudyView, b: StudyView, threshold_pct: float = DEFAULT_THRESHOLD_PCT,
            tail_threshold_pct: float = DEFAULT_TAIL_THRESHOLD_PCT) -> Comparison:
    """Pair the two studies' measurements and decisions."""
    for option, value in (("--threshold", threshold_pct), ("--tail-threshold", tail_threshold_pct)):
        if not value >= 0:
            raise UsageError(f"{option} must be a percentage ≥ 0, got {value}")
    warnings: list[str] = []
    if not same_plan(a.plan, b.plan):
        warnings.append(f"the studies ran different plans ({a.plan.name!r} in {a.path}, {b.plan.name!r} in "
                        f"{b.path}); comparing the configurations and profiles they share")
    for view in (a, b):
        if not view.outcome.complete:
            warnings.append(f"{view.path} is incomplete; comparing what it has measured")
    pairs = tuple(_pair(m, b.measured[k], threshold_pct, tail_threshold_pct)
                  for k, m in a.measured.items() if k in b.measured)
    only_a = tuple(m for k, m in a.measured.items() if k not in b.measured)
    only_b = tuple(m for k, m in b.measured.items() if k not in a.measured)
    return Comparison(a, b, threshold_pct, tail_threshold_pct, pairs, tuple(_decisions(a, b)), only_a, only_b,
                      tuple(warnings))


def compare_studies(path_a: Path, path_b: Path, threshold_pct: float = DEFAULT_THRESHOLD_PCT,
                    tail_threshold_pct: float = DEFAULT_TAIL_THRESHOLD_PCT) -> Comparison:
    return compare(load_study(path_a), load_study(path_b), threshold_pct, tail_threshold_pct)


def _round(v: float | None, digits: int = 3) -> float | None:
    return None if v is None else round(v, digits)
