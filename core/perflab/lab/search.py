"""method: search's optimizer: Optuna's TPE over a plan's ``space`` (issue 29).

The study (:mod:`perflab.lab.study`) decides what a trial is worth; this module only keeps
Optuna's side: which point to measure next, and what each trial was told. Optuna's storage is
a journal file in the study directory (:data:`JOURNAL`), beside the store: a resumed search
replays its finished trials (their measurements are the store's, reused without a launch)
and asks only for the rest. A trial the interrupted session left running is failed and its
point asked again first (its measurement, if the store finished it, is reused too).

A plan with an SLO is searched over several objectives (:class:`Search`'s ``minimize``): the
ranking figure, maximized, and each latency the SLO limits, minimized; the report shows the
trials' Pareto front (:func:`non_dominated`).

Optuna is the ``perflab[search]`` extra; it is imported when a search starts.
"""

from __future__ import annotations

import math
import random
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perflab.contract.errors import UsageError
from perflab.lab.plan import Space, Tuning

__all__ = ["COMPLETE", "FAIL", "JOURNAL", "PRUNED", "REPEAT", "Search", "Told", "Trial", "non_dominated", "point_key"]

#: Optuna's journal in the study directory
JOURNAL = "search.optuna.jsonl"
_STUDY = "perflab-search"
# what a trial was told (user attribute "told"): a trial without one was interrupted
COMPLETE, PRUNED, FAIL = "complete", "pruned", "fail"
REPEAT = "repeat"  # TPE proposed a point measured already: told the same, not measured again


def point_key(point: Mapping[str, Any]) -> str:
    """A point's identity (its values in dimension order)."""
    return repr(sorted(point.items()))


def non_dominated(points: Sequence[Sequence[float]]) -> list[int]:
    """Indices (in order) of the points no other point dominates, every coordinate better
    larger (a caller negates the ones better smaller): another point dominates one when it is
    at least as good in every coordinate and better in one. Equal points are all kept."""

    def dominates(a: Sequence[float], b: Sequence[float]) -> bool:
        return all(x >= y for x, y in zip(a, b, strict=True)) and any(x > y for x, y in zip(a, b, strict=True))

    return [i for i, p in enumerate(points) if not any(dominates(q, p) for j, q in enumerate(points) if j != i)]


@dataclass(frozen=True)
class Told:
    """What a trial measured, as Optuna is told it. ``value``: the ranking figure (complete),
    or the bound or forecast early stop stopped it with (pruned: an upper bound, never a
    figure it did not reach; None when the stop gave none). ``constraints``: Optuna's, each
    feasible at <= 0 (the guards and accuracy gate as one, the SLO's limits as slack in ms).
    ``latencies``: a multi-objective search's minimized figures (complete: the SLO's
    latencies in ms, in :meth:`perflab.lab.decide.Slo.limits` order)."""

    state: str  # COMPLETE | PRUNED | FAIL
    value: float | None = None
    constraints: tuple[float, ...] = ()
    latencies: tuple[float, ...] = ()


@dataclass(frozen=True)
class Trial:
    """A finished trial as the journal keeps it."""

    number: int
    point: Mapping[str, Any]
    told: str  # COMPLETE | PRUNED | FAIL | REPEAT
    value: float | None = None
    attrs: Mapping[str, Any] = field(default_factory=dict)


def _optuna() -> Any:
    try:
        import optuna
    except ImportError:
        raise UsageError("method: search needs Optuna: pip install 'perflab[search]'") from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


class Search:
    """One plan's search: an Optuna study (maximize the ranking figure) over ``space``'s
    categorical dimensions with a seeded TPE sampler. ``journal`` None: in memory (a study
    without a directory); ``writable`` False: the report's replay, which only reads it.

    ``minimize``: the names of the figures minimized beside the ranking figure (an SLO plan's
    latencies): a multi-objective study, TPE's multi-objective form (MOTPE). NSGA-II, Optuna's
    other one, evolves generations of 50 trials by default: a budget of 5 to 50 trials would
    never leave its random first generation, where TPE models the trials from its few random
    start-up ones on. Optuna's multi-objective trials take no intermediate values, so a pruned
    trial is told PRUNED with its bound in the user attribute ``bound``."""

    def __init__(self, space: Space, tuning: Tuning, journal: Path | None, *, writable: bool = True,
                 constrained: bool = False, minimize: Sequence[str] = ()) -> None:
        self.space = space
        self.tuning = tuning
        self.writable = writable
        self.minimize = tuple(minimize)
        self.trials = tuning.trials_for(space.size)
        self._open: dict[int, Any] = {}  # trial number -> optuna Trial (asked, not told)
        self._study: Any = None
        if journal is not None and not writable and not journal.is_file():
            return  # nothing searched yet: nothing to replay
        optuna = _optuna()
        storage = None
        if journal is not None:
            from optuna.storages import JournalStorage
            from optuna.storages.journal import JournalFileBackend

            storage = JournalStorage(JournalFileBackend(str(journal)))
        self._sampler_args: dict[str, Any] = dict(
            multivariate=True, n_startup_trials=max(2, min(10, self.trials // 3)),
            constraints_func=_constraints if constrained else None,
            # a batch's trials are asked before any is told (a parallel executor): each
            # asked one counts as a poor result meanwhile, so a batch spreads out instead
            # of asking one point again and again (no effect when one runs at a time)
            constant_liar=True,
            # a space conditional on the engine (per-engine engine_options): multivariate TPE
            # models each group of dimensions that occur together (Optuna's group=True), so
            # an engine's own dimension is learnt from that engine's trials only
            **({"group": True} if space.conditional else {}))
        sampler = self._sampler(0, 0)
        self._study = optuna.create_study(study_name=_STUDY, storage=storage, sampler=sampler,
                                          directions=["maximize", *("minimize" for _ in self.minimize)],
                                          load_if_exists=True)
        if len(self._study.directions) != 1 + len(self.minimize):  # loaded as it was written, whatever we asked
            raise UsageError(f"{journal}: its search has {len(self._study.directions)} objective(s), this plan "
                             f"{1 + len(self.minimize)} (the SLO changed?): run the plan into a new study directory")
        self._dists = {name: optuna.distributions.CategoricalDistribution(list(values))
                       for name, values in space.dims().items()}
        self._engine_dists = {engine: {name: optuna.distributions.CategoricalDistribution(list(values))
                                       for name, values in space.engine_dims(engine).items()}
                              for engine in space.engines}

    def _sampler(self, told: int, open_: int) -> Any:
        """TPE seeded by the plan's seed and how far the search has come (``told`` trials,
        ``open_`` asked in this batch), not once per session: a resumed search asks what the
        uninterrupted one would have asked after the same trials (a sampler seeded once would
        start its random stream over at the resume)."""
        optuna = _optuna()
        seed = random.Random(f"{self.tuning.seed}:{told}:{open_}").getrandbits(32)
        with warnings.catch_warnings():  # multivariate TPE is "experimental" in name only since Optuna 2.2
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.samplers.TPESampler(seed=seed, **self._sampler_args)

    def finished(self) -> list[Trial]:
        """The journal's told trials, in order (a resumed search's first part)."""
        if self._study is None:
            return []
        optuna = _optuna()
        out = []
        for t in self._study.get_trials(deepcopy=False):
            told = t.user_attrs.get("told")
            if t.state.is_finished() and told is not None:
                if t.state is optuna.trial.TrialState.COMPLETE:
                    value = t.values[0]
                elif self.minimize:
                    value = t.user_attrs.get("bound")
                else:
                    value = t.intermediate_values[max(t.intermediate_values)] if t.intermediate_values else None
                out.append(Trial(t.number, dict(t.params), told, value, dict(t.user_attrs)))
        return out

    def recover(self) -> int:
        """Fail the trials an interrupted session left running and ask their points again
        first; how many there were."""
        if self._study is None or not self.writable:
            return 0
        optuna = _optuna()
        n = 0
        for t in self._study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
            self._study.tell(t.number, state=optuna.trial.TrialState.FAIL, skip_if_finished=True)
            if t.params:
                self._study.enqueue_trial(dict(t.params), skip_if_exists=False)
            n += 1
        return n

    def ask(self) -> tuple[int, dict[str, Any]]:
        """The next point to measure: (trial number, point)."""
        told = sum(t.user_attrs.get("told") is not None for t in self._study.get_trials(deepcopy=False))
        self._study.sampler = self._sampler(told, len(self._open))
        if not self.space.conditional:
            trial = self._study.ask(self._dists)
        else:  # define-by-run: the engine first, then the dimensions every point has, then its own
            trial = self._study.ask()
            for name, dist in self._dists.items():
                trial.suggest_categorical(name, dist.choices)
            for name, dist in self._engine_dists[trial.params["engine"]].items():
                trial.suggest_categorical(name, dist.choices)
        self._open[trial.number] = trial
        return trial.number, dict(trial.params)

    def tell(self, number: int, told: Told, told_as: str | None = None, **attrs: Any) -> None:
        """Tell trial ``number`` what it measured; ``attrs`` are kept with it (label, engine-hours)."""
        optuna = _optuna()
        trial = self._open.pop(number)
        for k, v in {**attrs, "told": told_as or told.state, "constraint": list(told.constraints)}.items():
            trial.set_user_attr(k, v)
        # a multi-objective trial missing a latency has no point to tell: failed for Optuna
        if told.state == COMPLETE and told.value is not None and len(told.latencies) == len(self.minimize):
            self._study.tell(trial, [told.value, *told.latencies] if self.minimize else told.value)
        elif told.state == PRUNED:
            if told.value is not None and self.minimize:
                trial.set_user_attr("bound", told.value)
            elif told.value is not None:
                trial.report(told.value, 0)
            self._study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        else:
            self._study.tell(trial, state=optuna.trial.TrialState.FAIL)

    def importances(self) -> dict[str, float] | None:
        """Optuna's parameter importances (fANOVA) of the complete trials; None when they
        cannot say (fewer than two complete trials, or a single varying dimension)."""
        if self._study is None:
            return None
        optuna = _optuna()
        complete = self._study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
        varying = [name for name, values in self.space.dims().items() if len(values) > 1]
        if len(complete) < 2 or len(varying) < 2:
            return None
        try:  # several objectives: the importances for the ranking figure
            got = optuna.importance.get_param_importances(
                self._study, evaluator=optuna.importance.FanovaImportanceEvaluator(seed=self.tuning.seed),
                target=(lambda t: t.values[0]) if self.minimize else None)
        except (ValueError, RuntimeError, ZeroDivisionError):
            return None
        return {k: round(float(v), 4) for k, v in got.items() if not math.isnan(v)}


def _constraints(trial: Any) -> Sequence[float]:
    return tuple(trial.user_attrs.get("constraint") or (0.0,))
