"""The seeds' method, as a function of a ``measure`` callback.

1. every engine on its defaults with the main profile; the winner by the ranking figure — the
   plan's ``decide_by`` (:class:`Ranking`): total token throughput (the seeds' method, the
   default), goodput, or capacity (the highest load meeting the SLO);
2. each candidate's variants on the current best (the winner's configuration, or another
   engine's defaults when a candidate names it), one delta at a time; the best variant of a
   step is adopted when it beats the current best by more than ``min_improvement_pct`` and,
   with ``repeats`` > 1, by more than the measured noise (both sides' spreads in quadrature) —
   otherwise the step says "within noise, not adopted";
3. the listed combinations, the same way;
4. the baseline and the optimized configuration on every profile (with a concurrent measure,
   the baseline's other profiles run early in a slot a step leaves free, and the optimized
   configuration's are split across the slots free at the end: :meth:`_Study._fill`,
   :meth:`_Study._groups`; the decisions and the report are the same).

:func:`conduct` only decides; ``measure`` does the work. The runner passes a measure that
launches engines (reusing what the store already holds) and is told ``to_beat``, the best
figure so far (with ``--parallel``, the best *before the step*: the same for every
configuration of a step, so they can run at once), so that a clearly lost configuration can stop early; ``perflab report`` passes one that
only reads the store, so the report follows exactly the decisions the run made. Tests pass a
fake one.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import anyio
import anyio.abc

from perflab.bench.metrics import BenchMetrics, metrics_json, name_of, read_metrics
from perflab.contract.status import Status
from perflab.lab import accuracy as acc
from perflab.lab.decide import SLO_METRICS, DecideBy, Decision, LoadKind, Regression, latency_regressions, pct_name
from perflab.lab.measured import MeasurementExtras
from perflab.lab.options import Configuration
from perflab.lab.plan import WINNER, Candidate, Plan, Profile, engine_dim, reference_config, space_config
from perflab.lab.search import COMPLETE, FAIL, PRUNED, REPEAT, Search, Told, non_dominated, point_key
from perflab.observe import OBSERVED_KEYS


@dataclass
class ConfigResult(MeasurementExtras):
    """What one configuration did on one profile, as the study decides with it: made by the
    store's lookup (:meth:`perflab.lab.store.Store.lookup`) from a run and its measurement,
    whose extras (repeats, noise, load points, capacity, ...) it inherits with their declaration."""

    status: Status
    metrics: BenchMetrics | None = None  # an accuracy measurement's: its record (ProfileMeasurement.metrics)
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
    # the main profile's: the configuration's accuracy measurement (perflab.lab.accuracy), as
    # the store's lookup found it (its metrics: the record); None: none stored, or no gate
    accuracy: ConfigResult | None = None

    def __post_init__(self) -> None:
        self.status = Status(self.status)  # a stored string ("crashed") becomes its member
        self.metrics = read_metrics(self.metrics)

    @property
    def tps(self) -> float | None:
        if self.status is not Status.OK or not self.metrics:
            return None
        v = self.metrics.total_token_throughput
        return float(v) if v is not None else None

    @property
    def success_rate(self) -> float | None:
        if self.status is not Status.OK or not self.metrics:
            return None
        done = self.metrics.completed
        if done is None:
            return None
        asked = self.num_prompts or (done + (self.metrics.failed or 0))
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
        if self.status is Status.STOPPED_EARLY:
            return f"stopped early: {stopped_early_text(self.stopped_early)}"
        return self.status

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status, "metrics": metrics_json(self.metrics), "num_prompts": self.num_prompts,
            "success_rate": self.success_rate, name_of(lambda m: m.total_token_throughput): self.tps,
            "reasons": self.reasons,
            "cause": self.cause, "error": self.error, "script": self.script, "version": self.version,
            "run_id": self.run_id, "run_dir": self.run_dir, "log": self.log, "replicas": self.replicas,
            # the extras as stored, but what was observed flat (one key per OBSERVED_KEYS)
            **{k: v for k, v in self.extra().items() if k != "observed"},
            **{k: self.observed.get(k) for k in OBSERVED_KEYS},
        }


Measure = Callable[..., Awaitable[Mapping[str, ConfigResult]]]
"""``await measure(config, profiles, step=..., label=..., to_beat=...) -> {profile name: ConfigResult}``;
``to_beat`` is the current best's ranking figure on the main profile (None: nothing to beat
yet, or not the main profile), for early stop — a measure that does not stop early ignores it."""


def stopped_early_text(info: Mapping[str, Any] | None) -> str:
    """One plain sentence for a person: what was measured, what was never sent, and the bound
    or forecast that stopped it — ``lost after 164 of 1000 requests completed (43 of ~261 s;
    836 in flight were cut short, 0 never sent): at its measured rate it could reach at most
    1647 tok/s, below the 1667 it needed to be adopted; the 1702.10 tok/s measured is the rate
    of those 43 s only, not the full run's`` (the bound), ``... its open requests, first come
    first served, end ~220 s in at the earliest, so it could reach at most 1790 tok/s ...`` (the
    forecast). The counts are the measured part's (:func:`perflab.lab.run.executor.stopped_early_record`),
    those of its result block; any other record reads as its reason and figures."""
    info = dict(info or {})
    reason = str(info.pop("reason", "") or "no reason recorded")
    when = ""
    if {"completed", "num_prompts", "elapsed_s", "estimated_full_s"} <= info.keys():
        unsent = ""
        if {"cut_short", "never_sent"} <= info.keys():
            unsent = f"; {info['cut_short']} in flight were cut short, {info['never_sent']} never sent"
        when = (f" after {info['completed']} of {info['num_prompts']} requests completed "
                f"({info['elapsed_s']:.0f} of ~{info['estimated_full_s']:.0f} s{unsent})")
    partial = ""
    if isinstance(info.get("partial_token_throughput"), (int, float)) and "elapsed_s" in info:
        partial = (f"; the {info['partial_token_throughput']:.2f} tok/s measured is the rate of those "
                   f"{info['elapsed_s']:.0f} s only, not the full run's")
    if reason == "lost" and {"bound_token_throughput", "limit"} <= info.keys():
        return (f"lost{when}: at its measured rate it could reach at most {info['bound_token_throughput']:.0f} tok/s, "
                f"below the {info['limit']:.0f} it needed to be adopted{partial}")
    if reason == "lost" and {"forecast_token_throughput", "forecast_end_s", "limit"} <= info.keys():
        return (f"lost{when}: its open requests, first come first served, end ~{info['forecast_end_s']:.0f} s in at "
                f"the earliest, so it could reach at most {info['forecast_token_throughput']:.0f} tok/s, below the "
                f"{info['limit']:.0f} it needed to be adopted{partial}")
    if reason == "over-saturated" and info.get("queue") and info.get("latency_ms"):
        q, lat = info["queue"], info["latency_ms"]
        return (f"over-saturated{when}: the queue grew from {q[0]} to {q[-1]} requests and latency from "
                f"{lat[0]:.0f} to {lat[-1]:.0f} ms")
    figures = ", ".join(f"{k} {_fig(v)}" for k, v in info.items())
    return f"{reason} ({figures})" if figures else reason


def _fig(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


@dataclass(frozen=True)
class Ranking:
    """What ranks configurations: the plan's ``decide_by`` (:class:`perflab.lab.decide.Decision`)
    as the study's decisions, the summary table and the conclusion read it."""

    decision: Decision = field(default_factory=Decision)
    min_improvement_pct: float = 0.0

    @property
    def decide_by(self) -> DecideBy:
        return self.decision.decide_by

    @property
    def metric(self) -> str:
        return self.decide_by.metric

    @property
    def name(self) -> str:
        """The figure's name in the report: "Throughput", "Goodput", "Capacity"."""
        return {DecideBy.THROUGHPUT: "Throughput", DecideBy.GOODPUT: "Goodput", DecideBy.MAX_LOAD: "Capacity"}[self.decide_by]

    @property
    def unit(self) -> str:
        if self.decide_by is DecideBy.THROUGHPUT:
            return "tok/s"
        if self.decide_by is DecideBy.MAX_LOAD and self.decision.search is LoadKind.MAX_CONCURRENCY:
            return "concurrent requests"
        return "req/s"  # goodput, and the capacity of a request-rate search

    def rule(self) -> str:
        """The decision rule, one sentence (the report's "Service-level objective" section)."""
        slo = self.decision.slo
        limits = " and ".join(f"{slo_label(k, slo.percentile)} ≤ {v:g} ms" for k, v in slo.limits().items())
        if self.decide_by is DecideBy.THROUGHPUT:
            text = "Configurations are ranked by total token throughput on the main profile"
            return text + (f"; the SLO ({limits}) is reported, not used to rank." if slo else ".")
        if self.decide_by is DecideBy.GOODPUT:
            return (f"Configurations are ranked by goodput on the main profile: requests per second that meet "
                    f"every limit ({limits}), vLLM's definition (`vllm bench serve --goodput`).")
        axis = "request rate" if self.decision.search is LoadKind.REQUEST_RATE else "max concurrency"
        return (f"Configurations are ranked by capacity: the highest {axis} on the main profile at which "
                f"{limits} (found per configuration in one launch; `vllm bench sweep serve_sla`'s method).")

    def value(self, res: ConfigResult) -> float | None:
        """The ranking figure of a measured result (None: none, e.g. no load met the SLO)."""
        if not res.status.measured or not res.metrics:
            return None
        if self.decide_by is DecideBy.MAX_LOAD:
            return res.capacity
        v = res.metrics.get(self.metric)
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isnan(v) else None

    def noise(self, res: ConfigResult) -> float | None:
        """The ranking figure's measured relative spread in % (None: one repeat, not measured)."""
        v = res.noise.get(self.metric) if res.noise else None
        return float(v) if isinstance(v, (int, float)) and not math.isnan(v) else None

    def text(self, res: ConfigResult) -> str:
        """``2054.21 tok/s``, with the spread when repeats measured one: ``2054.21 tok/s ±1.3%``."""
        v = self.value(res)
        if v is None:
            return "n/a"
        digits = 0 if self.unit == "concurrent requests" and float(v).is_integer() else 2
        text = f"{v:.{digits}f} {self.unit}"
        spread = self.noise(res)
        if spread is not None and len(res.repeats) > 1:
            text += f" ±{spread:.1f}%"
        return text

    def combined_noise(self, new: ConfigResult, old: ConfigResult) -> float | None:
        """The relative spread of the difference of two means (their spreads in quadrature),
        None when neither side has one (one repeat)."""
        a, b = self.noise(new), self.noise(old)
        if a is None and b is None:
            return None
        return math.hypot(a or 0.0, b or 0.0)

    def verdict(self, new: ConfigResult, best: ConfigResult) -> str:
        """``adopted`` | ``no-gain`` (not above min_improvement_pct) | ``within-noise``."""
        nv, bv = self.value(new), self.value(best)
        assert nv is not None and bv is not None
        if not nv > bv * (1.0 + self.min_improvement_pct / 100.0):
            return "no-gain"
        gain = pct(nv, bv)
        spread = self.combined_noise(new, best)
        if spread is not None and gain is not None and not gain > spread:
            return "within-noise"
        return "adopted"


def slo_label(key: str, percentile: float) -> str:
    """``p99 TPOT`` for the SLO key ``tpot_ms``."""
    return f"p{pct_name(percentile)} {SLO_METRICS[key][1].upper()}"


@dataclass
class Entry:
    """One configuration as a step shows it."""

    label: str
    config: Configuration
    result: ConfigResult
    eligible: bool = False
    note: str = ""
    variant: str | None = None
    accuracy: dict[str, Any] | None = None  # the accuracy gate's verdict (perflab.lab.accuracy.Verdict.block)
    # method grid or search: the point as a trial ({number, point, state, value, engine_hours});
    # state complete | pruned (stopped early; value its bound or forecast) | failed | unsupported
    trial: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        out = {"label": self.label, "variant": self.variant, "engine": self.config.engine,
               "config": self.config.canonical(), "eligible": self.eligible, "note": self.note,
               "result": self.result.to_json()}
        if self.accuracy is not None:
            out["accuracy"] = self.accuracy
        if self.trial is not None:
            out["trial"] = self.trial
        return out


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
    within_noise: bool = False  # the chosen variant's gain did not exceed the measured noise
    # method grid or search: {method, points, trials, seed, engine_hours, pruned, importances, best}
    search: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return {

            "index": self.index, "kind": self.kind, "name": self.name, "title": self.title,
            "entries": [e.to_json() for e in self.entries],
            "base": self.base.label if self.base else None,
            "chosen": self.chosen.label if self.chosen else None, "adopted": self.adopted,
            "statement": self.statement, "improvement_vs_previous_best_pct": self.vs_base_pct,
            "improvement_vs_baseline_pct": self.vs_baseline_pct, "skipped": self.skipped or None,
            "within_noise": self.within_noise,
            **({"search": self.search} if self.search is not None else {}),
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

    def latency_regressions(self, threshold_pct: float) -> list[Regression]:
        """The recommendation's latency metrics worse than the baseline's by more than
        ``threshold_pct`` on this profile (the price of the decision, flagged in the report)."""
        if self.optimized is None or not self.optimized.status.measured or not self.baseline.status.measured:
            return []
        return latency_regressions(self.optimized.metrics, self.baseline.metrics, threshold_pct)

    def figure_change_pct(self, rank: Ranking) -> float | None:
        """The change in the ranking figure (throughput, goodput or capacity)."""
        return pct(rank.value(self.optimized) if self.optimized else None, rank.value(self.baseline))

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
    rank: Ranking = Ranking()  # what decided (the plan's decide_by)
    # the accuracy references measured outside every step (a candidate's engine the engine
    # step did not try): their floors judge that engine's candidates, so the report shows them
    references: list[Entry] = field(default_factory=list)

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


OTHER = "Other Benchmark Cases"  # the final measurements' step
BASELINE, OPTIMIZED = "Baseline", "Optimized"  # their labels


def _display_default(engine: str) -> str:
    return engine


class _Study:
    def __init__(self, plan: Plan, measure: Measure, display: Callable[[str], str],
                 on_rejected: Callable[[str, str], None] | None = None) -> None:
        self.plan = plan
        self.measure = measure
        self.display = display
        # told (label, note) when the accuracy gate rejects a configuration: the progress says so
        # at once, as it says a run crashed, instead of only the report
        self.on_rejected = on_rejected
        self.complete = True
        self.rank = Ranking(plan.decision, plan.min_improvement_pct)
        # the baseline's final measurements, dispatched early into a free slot (:meth:`_fill`)
        self._early: tuple[Configuration, tuple[Profile, ...]] | None = None
        self._early_done: anyio.Event | None = None
        self._early_profiles: tuple[Profile, ...] = ()  # what the early launch measures, once dispatched
        self._bg: anyio.abc.TaskGroup | None = None
        # the baseline's main-profile result, which the plan's max_regression guards compare with
        self._baseline_main: ConfigResult | None = None
        # each engine's accuracy reference (label, main-profile result): the baseline for its
        # engine, the engine's defaults for the others (perflab.lab.plan.reference_config)
        self._references: dict[str, tuple[str, ConfigResult]] = {}

    async def one(self, config: Configuration, step: str, label: str, to_beat: float | None) -> ConfigResult:
        kw = {"to_beat": to_beat} if to_beat is not None else {}  # measures without early stop need not take it
        results = await self.measure(config, (self.plan.main,), step=step, label=label, **kw)
        res = results.get(self.plan.main_profile) or ConfigResult(Status.PENDING)
        self._note_pending(res)
        if res.status is Status.UNSUPPORTED:  # refused before launch: its slot is free for the step's rest
            self._fill()
        return res

    async def each(self, jobs: list[tuple[Configuration, str]], step: str, to_beat: float | None) -> list[ConfigResult]:
        """The main-profile results of a step's configurations, in ``jobs``' (the plan's) order.

        With a concurrent measure (``measure.concurrent``, ``perflab run --parallel``) every
        configuration of a step is compared with the same ``to_beat`` — the best *before* the
        step — so they are independent of one another and run at once. One at a time, each is
        compared with the best so far, the step's earlier configurations included (more can
        stop early: in the engine step, an engine that clearly lost to an earlier one). The
        decisions are the same either way: early stop only ends configurations that could
        not have been adopted."""
        results: list[ConfigResult | None] = [None] * len(jobs)
        concurrent = getattr(self.measure, "concurrent", False) and len(jobs) > 1

        async def job(i: int) -> None:
            cfg, label = jobs[i]
            beat = to_beat
            if not concurrent:
                earlier = [self.entry(lb, c, r) for (c, lb), r in zip(jobs[:i], results[:i], strict=True) if r is not None]
                best = self.to_beat(*earlier)
                beat = best if beat is None else (beat if best is None else max(beat, best))
            results[i] = await self.one(cfg, step, label, beat)

        await self._all([partial(job, i) for i in range(len(jobs))], [cfg for cfg, _ in jobs])
        return [r if r is not None else ConfigResult(Status.PENDING) for r in results]

    async def _all(self, calls: Sequence[Callable[[], Coroutine[Any, Any, None]]], configs: Sequence[Configuration]) -> None:
        """Await ``calls`` — at once when the measure is concurrent. A configuration equal to
        an earlier one waits for it, so it is measured once and then reused, as in sequence.
        Once every call is handed to the backend, a slot the step leaves free is offered to
        the work known from the start (:meth:`_fill`; again when a configuration is refused
        before launch, :meth:`one`)."""
        if not getattr(self.measure, "concurrent", False) or (len(calls) < 2 and self._early is None):
            for call in calls:
                await call()
            return
        seen: set[str] = set()
        first: list[Callable[[], Coroutine[Any, Any, None]]] = []
        again: list[Callable[[], Coroutine[Any, Any, None]]] = []
        for call, cfg in zip(calls, configs, strict=True):
            key = repr(cfg.canonical())
            (again if key in seen else first).append(call)
            seen.add(key)
        try:
            async with anyio.create_task_group() as tg:
                for call in first:
                    tg.start_soon(call)
                await anyio.sleep(0)  # each call reaches the backend (its ticket queued) before the first yield
                self._fill()  # a step with fewer runnable configurations than slots
        except BaseExceptionGroup as group:
            # one configuration's fault (a busy machine, a full disk) cancelled its siblings:
            # raise it as a sequential run would, not wrapped with their cancellations
            raise _first_fault(group) from None
        for call in again:
            await call()

    # ------------------------------------------------- idle capacity (issue #14)

    def _room(self, config: Configuration) -> int:
        """How many more runs of ``config`` the backend would start right now (0: none, or a
        measure that cannot say — one at a time, a table in a test)."""
        room = getattr(self.measure, "room", None)
        return int(room(config)) if room is not None and getattr(self.measure, "concurrent", False) else 0

    def _fill(self) -> None:
        """Start the baseline's final measurements in a slot the current step leaves free.

        The baseline's configuration is fixed by the plan, so its "other benchmark cases"
        (every profile but the main one, which only the steps measure) need not wait for
        the last step: they are dispatched as soon as a step leaves a slot free for its
        whole length — a step with fewer configurations than slots (one variant, the winner
        deduplicated with ``vllm``), or a configuration refused before launch. Not when a
        measured sibling finishes first: that gap ends with the step, and the next step's
        configurations would wait for the whole launch. A step's configurations are always
        queued first, so this never takes a slot a step asked for. Decision-neutral: the
        steps measure the main profile only, and ``to_beat`` (early stop) is only ever
        given for the main profile."""
        if self._early is None or self._bg is None:
            return
        cfg, profiles = self._early
        if self._room(cfg) < 1:
            return
        self._early = None
        self._early_profiles = profiles
        done = self._early_done = anyio.Event()

        async def prefetch() -> None:
            try:
                await self.measure(cfg, profiles, step=OTHER, label=BASELINE, background=True)
            finally:
                done.set()

        self._bg.start_soon(prefetch)

    def _groups(self, config: Configuration, slots: int, base_cfg: Configuration,
                busy: bool = False) -> list[tuple[Profile, ...]]:
        """``config``'s profiles still to measure in up to ``slots`` launches, one per free slot,
        balanced by their expected durations (longest first onto the least loaded launch):
        the baseline's measured duration of the same profile where every one has it, else
        its token volume, else one each. Each launch measures its profiles in plan order.

        ``busy``: the last slot is the baseline's early launch, still running; it starts
        loaded with what that launch has left — its profiles not measured yet, the first
        of them (the one it measures now) half done, in the same units — so the launch
        waiting for it gets less, and the launches started first (on the slots free now)
        more: the study ends when the last launch does."""
        missing = getattr(self.measure, "missing", None)
        todo = list(missing(config, self.plan.profiles)) if missing is not None else []
        if slots < 2 or len(todo) < 2:
            return []
        left = list(missing(base_cfg, self._early_profiles)) if busy and missing is not None else []
        lookup = getattr(self.measure, "lookup", None)

        def measured(p: Profile) -> float | None:
            res = lookup(base_cfg, p) if lookup is not None else None
            d = res.metrics.duration if res is not None and res.status.measured and res.metrics is not None else None
            return float(d) if isinstance(d, (int, float)) and d > 0 else None

        def volume(p: Profile) -> float | None:
            return float(p.num_prompts * (p.input_len + p.output_len)) if p.input_len and p.output_len else None

        weight = next((w for w in (measured, volume) if all(w(p) is not None for p in todo)), lambda p: 1.0)
        loads: list[tuple[float, list[Profile]]] = [(0.0, []) for _ in range(min(slots, len(todo)))]
        if left and len(loads) == slots:  # the baseline's slot is one of them: the last
            loads[-1] = ((weight(left[0]) or 0.0) / 2 + sum(weight(p) or 0.0 for p in left[1:]), [])
        for p in sorted(todo, key=lambda p: -(weight(p) or 0.0)):  # ties keep the plan's order
            i = min(range(len(loads)), key=lambda k: loads[k][0])
            loads[i] = (loads[i][0] + (weight(p) or 0.0), [*loads[i][1], p])
        order = {p.name: i for i, p in enumerate(self.plan.profiles)}
        return [tuple(sorted(g, key=lambda p: order[p.name])) for _, g in loads if g]

    def _baseline_label(self) -> str:
        return self.plan.baseline.label or f"{self.display(self.plan.baseline.engine)} without any optimizations"

    def _note_pending(self, res: ConfigResult) -> None:
        if not res.status.is_result:  # pending, or interrupted by the machine
            self.complete = False

    def entry(self, label: str, config: Configuration, res: ConfigResult, variant: str | None = None) -> Entry:
        e = Entry(label, config, res, variant=variant)
        if res.status is Status.STOPPED_EARLY:  # measured, never a failure, but not a candidate to adopt
            e.note = f"Stopped early: {stopped_early_text(res.stopped_early)}"
        elif res.status is Status.OK:
            rate = res.success_rate
            if rate is not None and rate < self.plan.min_success_rate:
                e.note = f"Success rate: {rate * 100:.1f}%, optimization skipped"
            elif res.tps is None and self.rank.decide_by is DecideBy.THROUGHPUT:
                e.note = "no throughput in the benchmark result"
            elif self.rank.value(res) is None:
                e.note = ("no probed load met the SLO" if self.rank.decide_by is DecideBy.MAX_LOAD
                          else f"no {self.rank.metric} in the benchmark result")
            elif broken := self.plan.decision.guards.violations(
                    res.metrics, self._baseline_main.metrics if self._baseline_main is not None else None):
                e.note = f"Not eligible: {'; '.join(broken)}"  # the plan's guards: its price in latency
            else:
                e.eligible = True
        self._judge_accuracy(e)
        return e

    def _judge_accuracy(self, e: Entry) -> None:
        """The accuracy gate (plan ``accuracy:``): every measured configuration gets its verdict;
        a rejected one, or one whose accuracy could not be judged, is not eligible."""
        spec = self.plan.accuracy
        if spec is None or not e.result.status.measured:
            return
        ref_label, ref = self._references.get(e.config.engine, (self.display(e.config.engine), None))
        if reference_config(self.plan, e.config.engine).canonical() == e.config.canonical():
            ref = e.result  # the reference itself (measured before it was registered)
        base = self._baseline_main
        own = e.result.accuracy
        missing = None if own is None else (own.error or own.summary())
        verdict = acc.decide(spec, _record(own), reference=_record(ref.accuracy if ref else None),
                             baseline=_record(base.accuracy if base else None), reference_label=ref_label,
                             missing=missing)
        e.accuracy = verdict.block
        if verdict.rejected and self.on_rejected is not None:
            self.on_rejected(e.label, verdict.note)
        if verdict.rejected and e.eligible:
            e.eligible = False
            e.note = verdict.note
        elif verdict.rejected and verdict.gate == "rejected":  # ineligible already (stopped early): both reasons
            e.note = f"{e.note}; {verdict.note}" if e.note else verdict.note

    async def references(self, engines: list[str], step: str) -> None:
        """Measure the accuracy reference of each of ``engines`` not measured yet (a candidate's
        engine outside the engine step), so its candidates can be judged."""
        if self.plan.accuracy is None:
            return
        for engine in engines:
            if engine in self._references:
                continue
            cfg = reference_config(self.plan, engine)
            label = (self._baseline_label() if engine == self.plan.baseline.engine
                     else f"{self.display(engine)} (accuracy reference)")
            self._references[engine] = (label, await self.one(cfg, step, label, None))

    def figure(self, e: Entry) -> float:
        v = self.rank.value(e.result)
        assert v is not None, e.label  # eligible entries have one
        return v

    def ranked(self, entries: list[Entry]) -> list[Entry]:
        """The eligible entries, best first (ties keep the plan's order)."""
        return sorted((e for e in entries if e.eligible), key=lambda e: -self.figure(e))

    def to_beat(self, *entries: Entry | None) -> float | None:
        """The best ranking figure among ``entries`` (what a new measurement must beat)."""
        figs = [self.figure(e) for e in entries if e is not None and e.eligible]
        return max(figs) if figs else None

    # ------------------------------------------------------------------ steps

    async def engine_step(self) -> tuple[Step, Entry | None]:
        step = Step(1, "engine", "Choosing the Inference Engine", "1. Choosing the Inference Engine")
        jobs = [(self.plan.engine_defaults(engine), self.display(engine)) for engine in self.plan.engines]
        if self.plan.decision.guards.max_regression or self.plan.accuracy is not None:
            # regression guards compare every configuration with the baseline, the accuracy gate
            # every score with its score: measured first (an engine of the step whose defaults
            # it is reuses the measurement)
            base_cfg = self.plan.baseline_config()
            label = next((lb for c, lb in jobs if c == base_cfg), self._baseline_label())
            self._baseline_main = await self.one(base_cfg, step.title, label, None)
            self._references[base_cfg.engine] = (label, self._baseline_main)
        # nothing to beat before the first step (one at a time: the engines before this one)
        results = await self.each(jobs, step.title, None)
        for (cfg, label), res in zip(jobs, results, strict=True):
            if cfg.engine not in self._references and reference_config(self.plan, cfg.engine) == cfg:
                self._references[cfg.engine] = (label, res)
        for (cfg, label), res in zip(jobs, results, strict=True):
            step.entries.append(self.entry(label, cfg, res))
        ok = self.ranked(step.entries)
        ranked = " > ".join(f"{e.label} ({self.rank.text(e.result)})" for e in ok)
        if ok:
            step.chosen = ok[0]
            step.adopted = True
            step.statement = f"Result: {ranked}{_guarded(step)}"
            if len(ok) > 1:
                gain = pct(self.figure(ok[0]), self.figure(ok[1]))
                spread = self.rank.combined_noise(ok[0].result, ok[1].result)
                if spread is not None and gain is not None and not gain > spread:
                    step.statement += (f" ({ok[0].label} leads {ok[1].label} by {gain:+.1f}%, within the measured "
                                       f"noise of ±{spread:.1f}%: the engines are indistinguishable here)")
        else:
            step.statement = "Result: no engine served the main profile; the study cannot go on." if not _guarded(step) \
                else f"Result: no engine is eligible{_guarded(step)}; the study cannot go on."
        return step, step.chosen

    # ------------------------------------------------- method: grid | search (issue 29)

    def _point_label(self, point: Mapping[str, Any]) -> str:
        """``vLLM max_num_seqs=128 max_batched_tokens=default``: the engine and each option's value."""
        own = engine_dim(point["engine"], "")  # an engine's own dimension shows as its option's name
        opts = " ".join(f"{k.removeprefix(own)}={'default' if v is None else v}" for k, v in point.items() if k != "engine")
        return f"{self.display(point['engine'])} {opts}".strip()

    def _engine_hours(self, res: ConfigResult) -> float | None:
        """The engine-hours of the run that measured ``res`` (None: a measure that cannot say)."""
        hours = getattr(self.measure, "engine_hours", None)
        return hours(res) if hours is not None else None

    def _told(self, e: Entry) -> Told:
        """What an entry tells Optuna: its figure (complete), the bound or forecast early stop
        stopped it with (pruned), or nothing (failed, refused). The guards and the accuracy gate
        are one constraint; with an SLO each limit is one more (its slack in ms), and the SLO's
        latencies are the multi-objective search's other objectives (:meth:`_objectives`)."""
        res, slo = e.result, self.plan.decision.slo
        slack = [0.0] * len(slo.limits()) if slo else []
        if res.status is Status.STOPPED_EARLY:
            info = res.stopped_early or {}
            bound = info.get("bound_token_throughput", info.get("forecast_token_throughput")) \
                if self.rank.decide_by is DecideBy.THROUGHPUT else None
            return Told(PRUNED, float(bound) if isinstance(bound, (int, float)) else None, (0.0, *slack))
        value = self.rank.value(res) if res.status.measured else None
        if value is None:
            return Told(FAIL)
        checks = slo.check(res.metrics)
        slack = [(c.measured - c.limit) if c.measured is not None else 1e9 for c in checks]
        latencies = tuple(c.measured for c in checks if c.measured is not None)
        return Told(COMPLETE, value, (0.0 if e.eligible else 1.0, *slack), latencies)

    def _objectives(self) -> list[dict[str, str]]:
        """An SLO plan's objectives (none without an SLO): the ranking figure, maximized, and
        each latency the SLO limits (``p99_ttft_ms``), minimized."""
        slo = self.plan.decision.slo
        if not slo:
            return []
        return [{"name": self.rank.metric, "direction": "maximize"},
                *({"name": slo.metric_key(k), "direction": "minimize"} for k in slo.limits())]

    def _latencies(self, e: Entry) -> dict[str, float]:
        """The SLO's latencies an entry measured (``p99_ttft_ms``: ms)."""
        slo = self.plan.decision.slo
        return {slo.metric_key(c.key): c.measured for c in slo.check(e.result.metrics) if c.measured is not None}

    def _front(self, step: Step) -> list[Entry]:
        """The Pareto front of an SLO plan's trials over :meth:`_objectives`: the complete,
        eligible trials meeting every SLO limit (each latency measured) that no other such
        trial dominates, in trial order."""
        slo = self.plan.decision.slo
        feasible = [e for e in step.entries if e.trial is not None and e.trial["state"] == "complete"
                    and e.eligible and slo.met(e.result.metrics)]
        points = [(self.figure(e), *(-v for v in self._latencies(e).values())) for e in feasible]
        return [feasible[i] for i in non_dominated(points)]

    def _front_point(self, e: Entry, step: Step) -> dict[str, Any]:
        """A front entry as report.json's step ``search.front`` has it."""
        assert e.trial is not None
        return {"number": e.trial["number"], "label": e.label, "point": e.trial["point"], "value": self.figure(e),
                "latencies": self._latencies(e), "recommended": e is step.chosen}

    def _on_front_first(self, ranked: list[Entry], front: list[Entry]) -> list[Entry]:
        """``ranked`` with a tie on the ranking figure at the top broken by the Pareto front:
        of the entries as good as the best, the first on the front (as good, and none of its
        latencies bettered by the others) leads; without a tie, or a front, as it was."""
        if not ranked or not front:
            return ranked
        best = self.figure(ranked[0])
        lead = next((e for e in ranked if self.figure(e) == best and any(e is f for f in front)), ranked[0])
        return [lead, *(e for e in ranked if e is not lead)]

    def _trial(self, e: Entry, number: int, point: Mapping[str, Any], told: Told) -> None:
        state = "unsupported" if e.result.status is Status.UNSUPPORTED else {
            COMPLETE: "complete", PRUNED: "pruned", FAIL: "failed"}[told.state]
        e.trial = {"number": number, "point": dict(point), "state": state, "value": told.value,
                   "engine_hours": self._engine_hours(e.result)}
        if told.state == PRUNED:  # which figure of early stop's the value is
            info = e.result.stopped_early or {}
            e.trial["pruned_by"] = "bound" if "bound_token_throughput" in info else \
                "forecast" if "forecast_token_throughput" in info else None

    async def space_step(self, index: int = 1, seeds: Sequence[Step] = ()) -> tuple[Step, Entry | None]:
        """Method grid (every point of the space, in grid order, early stop against the best so
        far unless the plan turns it off: the ground truth) or search (Optuna's TPE, seeded,
        :mod:`perflab.lab.search`): one step whose entries are the trials; its chosen entry
        is the best eligible point, the recommendation the final measurements confirm.

        ``seeds``: the steps of the seeds' method run before it in the same study (a search
        plan that lists candidates). The search runs as it would alone (the same trials for a
        seed, early stop against its own best, not the seeds' pick: a forecast stop must not
        hide a point the search alone would have measured; what both measure, the store
        measures once), and the recommendation is the better of the two, the search's best
        adopted only if it beats the seeds' pick beyond the noise."""
        plan = self.plan
        space = plan.space
        assert space is not None  # the parser requires it for method grid and search
        pick = _pick(seeds)
        what = "every point" if plan.method == "grid" else "Optuna's TPE search"
        step = Step(index, plan.method, "Searching the Configuration Space",
                    f"{index}. Searching the Configuration Space ({what} of {space.size})", base=pick)
        if (plan.decision.guards.max_regression or plan.accuracy is not None) and self._baseline_main is None:
            base_cfg = plan.baseline_config()  # the guards' and the gate's reference, first (as engine_step)
            self._baseline_main = await self.one(base_cfg, step.title, self._baseline_label(), None)
            self._references[base_cfg.engine] = (self._baseline_label(), self._baseline_main)
        await self.references(list(space.engines), step.title)
        info: dict[str, Any] = {"method": plan.method, "points": space.size, "dimensions": {
            k: list(v) for k, v in space.dims().items()} | {
            k: list(v) for e in space.engines for k, v in space.engine_dims(e).items()}}
        if plan.method == "grid":
            points = space.points()
            jobs = [(space_config(plan, pt), self._point_label(pt)) for pt in points]
            results = await self.each(jobs, step.title, None)
            for i, ((cfg, label), pt, res) in enumerate(zip(jobs, points, results, strict=True)):
                e = self.entry(label, cfg, res)
                self._trial(e, i, pt, self._told(e))
                step.entries.append(e)
        else:
            info.update(await self._search(step))
        trials = [e.trial for e in step.entries if e.trial is not None]
        hours = [t["engine_hours"] for t in trials if t["engine_hours"] is not None]
        info.update({"trials": len(trials), "pruned": sum(t["state"] == "pruned" for t in trials),
                     "engine_hours": round(sum(hours), 6) if hours else None})
        front = self._front(step) if plan.decision.slo else []
        ok = self._on_front_first(self.ranked(step.entries), front)
        if ok:
            step.chosen, step.adopted = ok[0], True
            info["best"] = {"label": ok[0].label, "point": ok[0].trial["point"] if ok[0].trial else None,
                            "value": self.figure(ok[0])}
            step.statement = (f"Result: {ok[0].label} ({self.rank.text(ok[0].result)}), the best of "
                              f"{len(trials)} {'points' if plan.method == 'grid' else 'trials'}{_guarded(step)}.")
        else:
            step.statement = f"Result: no point of the space is eligible{_guarded(step)}; the study cannot go on."
        if plan.decision.slo:
            info["objectives"], info["front"] = self._objectives(), [self._front_point(e, step) for e in front]
        step.search = info
        if seeds:
            return self._against_seeds(step, seeds, pick)
        return step, step.chosen

    def _against_seeds(self, step: Step, seeds: Sequence[Step], pick: Entry | None) -> tuple[Step, Entry | None]:
        """The search's best against the seeds' pick, both measured in this study: the two
        figures, the gain, the engine-hours each method spent (report.json's ``search.vs_seeds``),
        and the recommendation: the search's best only if it beats the pick beyond the noise."""
        assert step.search is not None
        top, r = step.chosen, self.rank
        seeds_hours = [h for st in seeds for e in st.entries if (h := self._engine_hours(e.result)) is not None]

        def side(e: Entry | None) -> dict[str, Any] | None:
            return {"label": e.label, "value": self.figure(e)} if e is not None and e.eligible else None

        gain = pct(self.figure(top), self.figure(pick)) if top is not None and pick is not None and pick.eligible else None
        verdict = r.verdict(top.result, pick.result) if top is not None and pick is not None and pick.eligible else \
            "adopted" if top is not None else "no-search-best"
        step.search["vs_seeds"] = {
            "seeds_pick": side(pick), "search_best": side(top), "gain_pct": gain,
            "seeds_engine_hours": round(sum(seeds_hours), 6) if seeds_hours else None,
            "search_engine_hours": step.search.get("engine_hours"),
            "recommended": "search" if verdict == "adopted" else "seeds"}
        step.vs_base_pct = gain
        step.within_noise = verdict == "within-noise"
        if top is None:
            step.adopted = False
            step.statement = (f"Result: no trial is eligible{_guarded(step)}; keeping the seeds' pick "
                              f"{pick.label} ({r.text(pick.result)})." if pick is not None else step.statement)
            return step, pick
        if pick is None or not pick.eligible:
            step.statement = (f"Result: {top.label} ({r.text(top.result)}), the best of the search; "
                              f"the seeds' method picked nothing eligible{_guarded(step)}.")
            return step, top
        versus = f"the seeds' pick {pick.label} ({r.text(pick.result)})"
        if verdict == "adopted":
            step.statement = (f"Result: the search's best {top.label} ({r.text(top.result)}) beats {versus} "
                              f"by {gain:+.1f}%; adopted{_guarded(step)}.")
            return step, top
        step.adopted = False
        if verdict == "within-noise":
            spread = r.combined_noise(top.result, pick.result)
            step.statement = (f"Result: the search's best {top.label} ({r.text(top.result)}) is {gain:+.1f}% over "
                              f"{versus}, within noise (±{spread:.1f}%), not adopted; keeping {pick.label}.")
        else:
            step.statement = (f"Result: the search's best {top.label} ({r.text(top.result)}) does not beat "
                              f"{versus} ({gain:+.1f}%); keeping {pick.label}{_guarded(step)}.")
        return step, pick

    async def _search(self, step: Step) -> dict[str, Any]:
        """Optuna's trials: the journal's finished ones first (a resumed search: their
        measurements are the store's), then new ones until ``tuning.trials`` distinct points,
        the budget, or the space is spent. With a concurrent measure, a batch of as many
        trials as the backend holds at once runs at once, each against the best before the
        batch. The batch's size is the backend's capacity, not its free slots of the moment
        (the baseline's early launch may hold one, or not yet): so a seed asks the same
        trials whatever the timing, and a trial that finds no free slot waits for one. It is
        at most a third of the trials, so that TPE learns from at least two rounds."""
        plan, space, tuning = self.plan, self.plan.space, self.plan.tuning
        assert space is not None
        journal = getattr(self.measure, "search_journal", None)
        writable = journal is None or bool(getattr(self.measure, "search_writable", False))
        constrained = bool(plan.decision.slo or plan.decision.guards or plan.accuracy is not None)
        search = Search(space, tuning, journal, writable=writable, constrained=constrained,
                        minimize=[o["name"] for o in self._objectives()[1:]])
        seen: dict[str, Told] = {}
        spent = 0.0

        def record(e: Entry, number: int, point: Mapping[str, Any], told: Told) -> None:
            nonlocal spent
            self._trial(e, number, point, told)
            assert e.trial is not None
            spent += e.trial["engine_hours"] or 0.0
            seen[point_key(point)] = told
            step.entries.append(e)

        search.recover()
        for t in search.finished():
            if t.told == REPEAT or point_key(t.point) in seen:
                continue
            cfg, label = space_config(plan, t.point), self._point_label(t.point)
            e = self.entry(label, cfg, await self.one(cfg, step.title, label, None))
            record(e, t.number, t.point, self._told(e))
        asks = 0
        while writable and len(seen) < search.trials and asks < 4 * search.trials + space.size:
            if tuning.budget_engine_hours is not None and spent >= tuning.budget_engine_hours:
                break
            capacity = getattr(self.measure, "capacity", None)
            room = int(capacity(space_config(plan, space.points()[0]))) if capacity is not None else 1
            # at least three rounds: one batch of every trial would be TPE's random start alone
            room = min(room, max(1, math.ceil(search.trials / 3)))
            batch: list[tuple[int, dict[str, Any]]] = []
            while len(batch) < max(1, room) and len(seen) + len(batch) < search.trials and asks < 4 * search.trials + space.size:
                number, point = search.ask()
                asks += 1
                key = point_key(point)
                if key in seen or any(point_key(p) == key for _, p in batch):
                    told = seen.get(key) or Told(FAIL)
                    search.tell(number, told, told_as=REPEAT)  # TPE's proposal measured already: no launch
                    continue
                batch.append((number, point))
            if not batch:
                continue
            beat = self.to_beat(*step.entries)
            jobs = [(space_config(plan, pt), self._point_label(pt)) for _, pt in batch]
            results = await self.each(jobs, step.title, beat)
            for (number, point), (cfg, label), res in zip(batch, jobs, results, strict=True):
                e = self.entry(label, cfg, res)
                told = self._told(e)
                search.tell(number, told, label=label, engine_hours=self._engine_hours(res))
                record(e, number, point, told)
        return {"sampler": "TPE", "seed": tuning.seed, "trials_asked": search.trials,
                "budget_engine_hours": tuning.budget_engine_hours,
                "importances": search.importances()}

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
        jobs = [(self._config_for(cand, vname, engine, best), f"{self.display(engine)} {vname}")
                for vname, engine in plan_rows]
        await self.references(engines_all, step.title)
        results = await self.each(jobs, step.title, self.to_beat(best))  # the best before the step
        for (cfg, label), (vname, _), res in zip(jobs, plan_rows, results, strict=True):
            step.entries.append(self.entry(label, cfg, res, variant=vname))
        ok = self.ranked(step.entries)
        if ok:
            top, r = ok[0], self.rank
            step.chosen = top
            step.vs_base_pct = pct(self.figure(top), self.figure(best))
            verdict = r.verdict(top.result, best.result)
            if verdict == "adopted":
                step.adopted = True
                step.statement = (
                    f"Result: {top.label} ({r.text(top.result)}) beats the current best "
                    f"{best.label} ({r.text(best.result)}) by {step.vs_base_pct:+.1f}%; adopted{_guarded(step)}."
                )
                return step, top
            if verdict == "within-noise":
                step.within_noise = True
                spread = r.combined_noise(top.result, best.result)
                step.statement = (
                    f"Result: {top.label} ({r.text(top.result)}) is {step.vs_base_pct:+.1f}% over the current best "
                    f"{best.label} ({r.text(best.result)}), within noise (±{spread:.1f}% measured over "
                    f"{self.plan.decision.repeats} repeats), not adopted."
                )
            else:
                step.statement = (
                    f"Result: no improvement; the best variant {top.label} ({r.text(top.result)}) "
                    f"does not beat the current best {best.label} ({r.text(best.result)}){_guarded(step)}."
                )
        elif stopped := [e.label for e in step.entries if e.result is not None and e.result.status is Status.STOPPED_EARLY]:
            step.statement = (f"Result: no improvement; {', '.join(stopped)} stopped early, unable to be adopted over "
                              f"the current best {best.label} ({self.rank.text(best.result)}){_rejected(step)}; "
                              f"keeping {best.label}.")
        elif _guarded(step):
            step.statement = f"Result: no variant is eligible{_guarded(step)}; keeping {best.label}."
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
        try:
            async with anyio.create_task_group() as bg:
                self._bg = bg
                if getattr(self.measure, "concurrent", False):
                    others = tuple(p for p in self.plan.profiles if p.name != self.plan.main_profile)
                    self._early = (self.plan.baseline_config(), others) if others else None
                outcome = await self._run()
            return outcome
        except BaseExceptionGroup as group:
            raise _first_fault(group) from None

    async def _run(self) -> StudyOutcome:
        plan = self.plan
        steps: list[Step] = []
        # a search plan with candidates runs the seeds' method first, then searches against its pick
        seeded = plan.method == "seeds" or bool(plan.candidates or plan.combinations)
        step1, best = await (self.engine_step() if seeded else self.space_step())
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
        if seeded and plan.method != "seeds":
            step, best = await self.space_step(index, seeds=list(steps))
            steps.append(step)

        base_cfg = plan.baseline_config()
        base_label = self._baseline_label()
        cases_of: dict[str, dict[str, ConfigResult]] = {}
        self._early = None  # not dispatched early: measured now, beside the optimized configuration
        early = self._early_done

        async def profiles(name: str, cfg: Configuration) -> None:
            if name == BASELINE and early is not None:
                await early.wait()  # dispatched early: what it measured is reused
            cases_of[name] = await self.profiles_of(cfg, OTHER, name)

        async def measure_group(cfg: Configuration, group: Sequence[Profile]) -> None:
            await self.measure(cfg, group, step=OTHER, label=OPTIMIZED)

        async def measure_optimized(cfg: Configuration) -> None:
            # the optimized configuration's final measurements across the slots left free
            # (one launch per slot, each measuring some of the profiles); the results are
            # the store's, read back per profile below, so the report is the same
            # (the baseline's launch, started just before, is queued already: the room is what it
            # leaves). The slot of the baseline's early launch, still running, counts too: the
            # launch queued for it starts on whichever slot frees first, so at worst it follows
            # another of these launches (one engine start more than one launch) — and it does
            # not leave that slot idle while one launch measures every profile
            running = early is not None and not early.is_set()
            groups = self._groups(cfg, self._room(cfg) + (1 if running else 0), base_cfg, busy=running)
            if groups:
                async with anyio.create_task_group() as tg:
                    for group in groups:
                        tg.start_soon(measure_group, cfg, group)
            await profiles(OPTIMIZED, cfg)

        todo = [(BASELINE, base_cfg)] + ([(OPTIMIZED, best.config)] if best is not None else [])
        calls: list[Callable[[], Coroutine[Any, Any, None]]] = [partial(profiles, BASELINE, base_cfg)]
        if best is not None:
            calls.append(partial(measure_optimized, best.config))
        await self._all(calls, [cfg for _, cfg in todo])
        base_results = cases_of["Baseline"]
        self._baseline_main = base_results[plan.main_profile]
        baseline = self.entry(base_label, base_cfg, base_results[plan.main_profile])
        optimized: Entry | None = None
        opt_results: dict[str, ConfigResult] = {}
        if best is not None:
            opt_results = cases_of["Optimized"]
            optimized = Entry(best.label, best.config, opt_results[plan.main_profile], eligible=best.eligible,
                              accuracy=best.accuracy)
        cases = [Case(p, base_results[p.name], opt_results.get(p.name) if optimized else None) for p in plan.profiles]

        # Improvements relative to the baseline, as the seeds' summary tables give them (in the
        # ranking figure: throughput, goodput or capacity)
        base_fig = self.rank.value(baseline.result)
        for step in steps:
            if step.adopted and step.chosen is not None:
                step.vs_baseline_pct = pct(self.rank.value(step.chosen.result), base_fig)
                if step.kind in ("engine", "grid", "search") and step.base is None:
                    step.vs_base_pct = step.vs_baseline_pct
        in_steps = {e.config.key() for st in steps for e in st.entries} | {baseline.config.key()}
        references = [self.entry(label, reference_config(plan, engine), res)
                      for engine, (label, res) in self._references.items()
                      if reference_config(plan, engine).key() not in in_steps]
        return StudyOutcome(plan, steps, baseline, optimized, cases, self.complete, self.rank, references)


def _pick(seeds: Sequence[Step]) -> Entry | None:
    """The seeds' method's pick after ``seeds``: the last adopted step's chosen entry."""
    adopted = [s.chosen for s in seeds if s.adopted and s.chosen is not None]
    return adopted[-1] if adopted else None


def _record(res: ConfigResult | None) -> dict[str, Any] | None:
    """An accuracy measurement's record (perflab.lab.accuracy.measure), when it was measured."""
    return res.metrics.to_json() if res is not None and res.status is Status.OK and res.metrics else None


def _rejected(step: Step) -> str:
    """`` (rejected by the accuracy gate: X (accuracy -2.3 points (perflab_arith)))`` for a
    step's statement, or ""."""
    out = [f"{e.label} ({e.accuracy['reason'].removeprefix('rejected: ')})" for e in step.entries
           if not e.eligible and e.accuracy is not None and e.accuracy.get("reason")]
    return f" (rejected by the accuracy gate: {'; '.join(out)})" if out else ""


def _guarded(step: Step) -> str:
    """`` (excluded by the plan's guards: X (guard p99_tpot_ms ≤ 200 ms: p99 TPOT 250.00 ms))``
    for a step's statement, or "": a configuration a guard excluded is named with the reason."""
    out = [f"{e.label} ({e.note.removeprefix('Not eligible: ')})" for e in step.entries
           if not e.eligible and e.note.startswith("Not eligible: ")]
    return (f" (excluded by the plan's guards: {'; '.join(out)})" if out else "") + _rejected(step)


def _first_fault(group: BaseExceptionGroup) -> BaseException:
    """The first exception of ``group`` that is not a cancellation (else its first one)."""
    cancelled = anyio.get_cancelled_exc_class()
    leaves: list[BaseException] = []

    def walk(e: BaseException) -> None:
        if isinstance(e, BaseExceptionGroup):
            for sub in e.exceptions:
                walk(sub)
        else:
            leaves.append(e)

    walk(group)
    return next((e for e in leaves if not isinstance(e, cancelled)), leaves[0] if leaves else group)


async def conduct(plan: Plan, measure: Measure, display: Callable[[str], str] | None = None,
                  on_rejected: Callable[[str, str], None] | None = None) -> StudyOutcome:
    """Run the method; ``display`` maps engine names to display names (``trtllm`` -> TensorRT-LLM);
    ``on_rejected(label, note)``: a configuration the accuracy gate rejects (once or more per label)."""
    return await _Study(plan, measure, display or _display_default, on_rejected).run()

