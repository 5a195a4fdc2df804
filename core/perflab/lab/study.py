"""The seeds' method, as a function of a ``measure`` callback.

1. every engine on its defaults with the main profile; the winner by total token throughput;
2. each candidate's variants on the current best (the winner's configuration, or another
   engine's defaults when a candidate names it), one delta at a time; the best variant of a
   step is adopted when it beats the current best;
3. the listed combinations, the same way;
4. the baseline and the optimized configuration on every profile.

:func:`conduct` only decides; ``measure`` does the work. The runner passes a measure that
launches engines (reusing what the store already holds); ``perflab report`` passes one that
only reads the store, so the report follows exactly the decisions the run made. Tests pass a
fake one.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from perflab.lab.options import Configuration
from perflab.lab.plan import WINNER, Candidate, Plan, Profile
from perflab.status import Status


@dataclass
class ConfigResult:
    """What one configuration did on one profile, as the study decides with it: made by the
    store's lookup (:meth:`perflab.lab.store.Store.lookup`) from a run and its measurement."""

    status: Status
    metrics: dict[str, Any] | None = None
    num_prompts: int | None = None
    reasons: list[dict[str, Any]] = field(default_factory=list)  # Unsupported, as dicts
    cause: dict[str, Any] | None = None  # CrashCause, as a dict
    error: str | None = None
    script: str | None = None  # the serving script, as the report prints it
    version: str | None = None
    run_id: int | None = None
    run_dir: str | None = None
    log: str | None = None
    replicas: int = 1
    reused: bool = False  # taken from an earlier run of this study
    # issue #12, measured by the executor (perflab.lab.store.ProfileMeasurement has the same):
    # each repeat's metrics (``metrics`` is their mean), their relative stdev in % per metric,
    # a sweep's or max-load search's load points, the search's capacity, and the figures
    # that stopped the measurement early
    repeats: list[dict[str, Any]] = field(default_factory=list)
    noise: dict[str, float] = field(default_factory=dict)
    points: list[dict[str, Any]] = field(default_factory=list)
    capacity: float | None = None
    stopped_early: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        self.status = Status(self.status)  # a stored string ("crashed") becomes its member

    @property
    def tps(self) -> float | None:
        if self.status is not Status.OK or not self.metrics:
            return None
        v = self.metrics.get("total_token_throughput")
        return float(v) if v is not None else None

    @property
    def success_rate(self) -> float | None:
        if self.status is not Status.OK or not self.metrics:
            return None
        done = self.metrics.get("completed")
        if done is None:
            return None
        asked = self.num_prompts or (done + (self.metrics.get("failed") or 0))
        return float(done) / asked if asked else 0.0

    def summary(self) -> str:
        """One line: the number, or why there is none."""
        if self.status is Status.OK:
            return f"{self.tps:.2f} tok/s" if self.tps is not None else "measured"
        if self.status is Status.UNSUPPORTED:
            whys = "; ".join(r.get("why", "") for r in self.reasons if r.get("severity", "error") == "error")
            return f"not launched: {whys or 'unsupported'}"
        if self.status in (Status.CRASHED, Status.TIMEOUT, Status.STALLED):
            c = self.cause or {}
            return f"{self.status}: {c.get('line') or c.get('explanation') or self.error or 'see log'}"
        if self.status is Status.FAILED:
            return f"benchmark failed: {self.error or 'see log'}"
        return self.status

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status, "metrics": self.metrics, "num_prompts": self.num_prompts,
            "success_rate": self.success_rate, "total_token_throughput": self.tps, "reasons": self.reasons,
            "cause": self.cause, "error": self.error, "script": self.script, "version": self.version,
            "run_id": self.run_id, "run_dir": self.run_dir, "log": self.log, "replicas": self.replicas,
        }


Measure = Callable[..., Awaitable[Mapping[str, ConfigResult]]]
"""``await measure(config, profiles, step=..., label=...) -> {profile name: ConfigResult}``"""


@dataclass
class Entry:
    """One configuration as a step shows it."""

    label: str
    config: Configuration
    result: ConfigResult
    eligible: bool = False
    note: str = ""
    variant: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"label": self.label, "variant": self.variant, "engine": self.config.engine,
                "config": self.config.canonical(), "eligible": self.eligible, "note": self.note,
                "result": self.result.to_json()}


@dataclass
class Step:
    index: int
    kind: str  # "engine" | "candidate" | "combination"
    name: str  # "Choosing the Inference Engine", "Quantization"
    title: str  # "2. Quantization in TensorRT-LLM/vLLM"
    entries: list[Entry] = field(default_factory=list)
    base: Entry | None = None  # the current best when the step started
    chosen: Entry | None = None  # the step's best eligible entry
    adopted: bool = False
    statement: str = ""  # "Result: TensorRT-LLM (2054.21 tok/s) > vLLM (1730.98 tok/s)"
    vs_base_pct: float | None = None
    vs_baseline_pct: float | None = None
    skipped: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index, "kind": self.kind, "name": self.name, "title": self.title,
            "entries": [e.to_json() for e in self.entries],
            "base": self.base.label if self.base else None,
            "chosen": self.chosen.label if self.chosen else None, "adopted": self.adopted,
            "statement": self.statement, "improvement_vs_previous_best_pct": self.vs_base_pct,
            "improvement_vs_baseline_pct": self.vs_baseline_pct, "skipped": self.skipped or None,
        }


@dataclass
class Case:
    """One profile, baseline against optimized (the conclusion table's row)."""

    profile: Profile
    baseline: ConfigResult
    optimized: ConfigResult | None

    @property
    def change_pct(self) -> float | None:
        return pct(self.optimized.tps if self.optimized else None, self.baseline.tps)

    def to_json(self) -> dict[str, Any]:
        return {"profile": self.profile.name, "label": self.profile.label,
                "definition": self.profile.definition(), "baseline": self.baseline.to_json(),
                "optimized": self.optimized.to_json() if self.optimized else None,
                "total_token_throughput_change_pct": self.change_pct}


@dataclass
class StudyOutcome:
    plan: Plan
    steps: list[Step]
    baseline: Entry
    optimized: Entry | None
    cases: list[Case]
    complete: bool  # every measurement the method asked for exists

    def to_json(self) -> dict[str, Any]:
        return {
            "steps": [s.to_json() for s in self.steps],
            "baseline": self.baseline.to_json(),
            "optimized": self.optimized.to_json() if self.optimized else None,
            "cases": [c.to_json() for c in self.cases],
            "complete": self.complete,
        }


def pct(new: float | None, old: float | None) -> float | None:
    """Relative change in percent, ``None`` when either side is missing."""
    if new is None or old is None or old == 0 or math.isnan(old):
        return None
    return (new - old) / old * 100.0


def _display_default(engine: str) -> str:
    return engine


class _Study:
    def __init__(self, plan: Plan, measure: Measure, display: Callable[[str], str]) -> None:
        self.plan = plan
        self.measure = measure
        self.display = display
        self.complete = True

    async def one(self, config: Configuration, step: str, label: str, to_beat: float | None = None) -> ConfigResult:
        kw = {"to_beat": to_beat} if to_beat is not None else {}
        results = await self.measure(config, (self.plan.main,), step=step, label=label, **kw)
        res = results.get(self.plan.main_profile) or ConfigResult(Status.PENDING)
        self._note_pending(res)
        return res

    def _note_pending(self, res: ConfigResult) -> None:
        if not res.status.is_result:  # pending, or interrupted by the machine
            self.complete = False

    def entry(self, label: str, config: Configuration, res: ConfigResult, variant: str | None = None) -> Entry:
        e = Entry(label, config, res, variant=variant)
        if res.status is Status.OK:
            rate = res.success_rate
            if rate is not None and rate < self.plan.min_success_rate:
                e.note = f"Success rate: {rate * 100:.1f}%, optimization skipped"
            elif res.tps is None:
                e.note = "no throughput in the benchmark result"
            else:
                e.eligible = True
        return e

    def beats(self, new: Entry, best: Entry) -> bool:
        assert new.result.tps is not None and best.result.tps is not None
        return new.result.tps > best.result.tps * (1.0 + self.plan.min_improvement_pct / 100.0)

    # ------------------------------------------------------------------ steps

    async def engine_step(self) -> tuple[Step, Entry | None]:
        step = Step(1, "engine", "Choosing the Inference Engine", "1. Choosing the Inference Engine")
        for engine in self.plan.engines:
            cfg = self.plan.engine_defaults(engine)
            label = self.display(engine)
            best = max((e.result.tps for e in step.entries if e.eligible and e.result.tps is not None), default=None)
            res = await self.one(cfg, step.title, label, best)
            step.entries.append(self.entry(label, cfg, res))
        ok = sorted((e for e in step.entries if e.eligible), key=lambda e: -(e.result.tps or 0.0))
        ranked = " > ".join(f"{e.label} ({e.result.tps:.2f} tok/s)" for e in ok)
        if ok:
            step.chosen = ok[0]
            step.adopted = True
            step.statement = f"Result: {ranked}"
        else:
            step.statement = "Result: no engine served the main profile; the study cannot go on."
        return step, step.chosen

    def _engines_for(self, cand: Candidate, variant_engines: tuple[str, ...] | None, best: Entry) -> list[str]:
        out: list[str] = []
        for name in variant_engines or cand.engines:
            engine = best.config.engine if name == WINNER else name
            if engine not in out:
                out.append(engine)
        return out

    def _config_for(self, cand: Candidate, variant_name: str, engine: str, best: Entry) -> Configuration:
        var = next(v for v in cand.variants if v.name == variant_name)
        if engine == best.config.engine and not (cand.combination and cand.base == "engine-defaults"):
            cfg = best.config
        else:
            cfg = self.plan.engine_defaults(engine)
        for ref in var.of:
            _, part = self.plan.variant(ref)
            cfg = cfg.with_delta(part.delta_for(engine))
        return cfg.with_delta(var.delta_for(engine))

    async def candidate_step(self, index: int, cand: Candidate, best: Entry) -> tuple[Step, Entry]:
        engines_all: list[str] = []
        pairs: list[tuple[str, str]] = []  # (variant, engine)
        for var in cand.variants:
            for engine in self._engines_for(cand, var.engines, best):
                pairs.append((var.name, engine))
                if engine not in engines_all:
                    engines_all.append(engine)
        # engine by engine, as the seeds list them (TensorRT-LLM FP8, TensorRT-LLM AWQ, vLLM FP8 ...)
        plan_rows = sorted(pairs, key=lambda ve: engines_all.index(ve[1]))
        where = "/".join(self.display(e) for e in engines_all)
        step = Step(index, "combination" if cand.combination else "candidate", cand.name,
                    f"{index}. {cand.name} in {where}", base=best)
        for vname, engine in plan_rows:
            cfg = self._config_for(cand, vname, engine, best)
            label = f"{self.display(engine)} {vname}"
            res = await self.one(cfg, step.title, label, best.result.tps)
            step.entries.append(self.entry(label, cfg, res, variant=vname))
        ok = sorted((e for e in step.entries if e.eligible), key=lambda e: -(e.result.tps or 0.0))
        if ok:
            step.chosen = ok[0]
            step.vs_base_pct = pct(ok[0].result.tps, best.result.tps)
            if self.beats(ok[0], best):
                step.adopted = True
                step.statement = (
                    f"Result: {ok[0].label} ({ok[0].result.tps:.2f} tok/s) beats the current best "
                    f"{best.label} ({best.result.tps:.2f} tok/s) by {step.vs_base_pct:+.1f}%; adopted."
                )
                return step, ok[0]
            step.statement = (
                f"Result: no improvement; the best variant {ok[0].label} ({ok[0].result.tps:.2f} tok/s) "
                f"does not beat the current best {best.label} ({best.result.tps:.2f} tok/s)."
            )
        else:
            step.statement = f"Result: no variant produced a usable result; keeping {best.label}."
        return step, best

    async def profiles_of(self, config: Configuration, step: str, label: str) -> dict[str, ConfigResult]:
        results = await self.measure(config, self.plan.profiles, step=step, label=label)
        out = {p.name: results.get(p.name) or ConfigResult(Status.PENDING) for p in self.plan.profiles}
        for r in out.values():
            self._note_pending(r)
        return out

    async def run(self) -> StudyOutcome:
        plan = self.plan
        steps: list[Step] = []
        step1, best = await self.engine_step()
        steps.append(step1)
        index = 2
        for cand in (*plan.candidates, *plan.combinations):
            if best is None:
                steps.append(Step(index, "combination" if cand.combination else "candidate", cand.name,
                                  f"{index}. {cand.name}", skipped="skipped: no engine served the main profile"))
            else:
                step, best = await self.candidate_step(index, cand, best)
                steps.append(step)
            index += 1

        other = "Other Benchmark Cases"
        base_cfg = plan.baseline_config()
        base_label = plan.baseline.label or f"{self.display(plan.baseline.engine)} without any optimizations"
        base_results = await self.profiles_of(base_cfg, other, "Baseline")
        baseline = self.entry(base_label, base_cfg, base_results[plan.main_profile])
        optimized: Entry | None = None
        opt_results: dict[str, ConfigResult] = {}
        if best is not None:
            opt_results = await self.profiles_of(best.config, other, "Optimized")
            optimized = Entry(best.label, best.config, opt_results[plan.main_profile], eligible=best.eligible)
        cases = [Case(p, base_results[p.name], opt_results.get(p.name) if optimized else None) for p in plan.profiles]

        # Improvements relative to the baseline, as the seeds' summary tables give them
        base_tps = baseline.result.tps
        for step in steps:
            if step.adopted and step.chosen is not None:
                step.vs_baseline_pct = pct(step.chosen.result.tps, base_tps)
                if step.kind == "engine":
                    step.vs_base_pct = step.vs_baseline_pct
        return StudyOutcome(plan, steps, baseline, optimized, cases, self.complete)


async def conduct(plan: Plan, measure: Measure, display: Callable[[str], str] | None = None) -> StudyOutcome:
    """Run the method; ``display`` maps engine names to display names (``trtllm`` -> TensorRT-LLM)."""
    return await _Study(plan, measure, display or _display_default).run()

