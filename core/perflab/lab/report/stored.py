"""A study rebuilt from its store: its plan, the measure that reads its measurements, and the
outcome ``perflab report``, ``perflab compare`` and ``perflab audit`` decide from.

Below the runner (whose live measure extends :class:`StoreMeasure`) and the report writers,
so that reading a stored study needs neither.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from perflab.bench.request import BenchRequest
from perflab.contract.status import Status
from perflab.lab.accuracy import AccuracyJob
from perflab.lab.decide import DecideBy
from perflab.lab.options import Configuration
from perflab.lab.plan import Plan, Profile, job_for, load_plan_text
from perflab.lab.report import report_context
from perflab.lab.search import JOURNAL
from perflab.lab.store import Store
from perflab.lab.study import ConfigResult, StudyOutcome, conduct


def profile_key(plan: Plan | None, profile: Profile) -> str:
    """The key a measurement of ``profile`` is stored under: the profile's own key, salted
    with what the plan's decision keys change in the measurement (repeats, the SLO's
    percentile and goodput, the max-load search on the main profile) when they are not the
    defaults — so the seeds' plans keep their keys, and changing ``repeats`` re-measures."""
    if plan is None:
        return profile.key()
    d = plan.decision
    method: dict[str, Any] = {}
    if d.repeats > 1:
        method["repeats"] = d.repeats
    if d.slo:
        method["slo"] = d.slo.to_json()
    if d.decide_by is DecideBy.MAX_LOAD and profile.name == plan.main_profile:
        method["search"] = str(d.search)
    # a guard reading a percentile or a latency kind the bench does not report by default asks
    # for it: a stored measurement without it is measured again, not judged "not measured"
    extra_pcts = sorted(set(d.guards.percentiles()) - set(BenchRequest.percentiles)  # the class attribute: the default
                        - ({float(d.slo.percentile)} if d.slo else set()))
    extra_kinds = sorted(set(d.guards.metrics()) - set(BenchRequest.percentile_metrics)
                         - ({k.removesuffix("_ms").split("_")[0] for k in d.slo.limits()} if d.slo else set()))
    if extra_pcts:
        method["percentiles"] = extra_pcts
    if extra_kinds:
        method["percentile_metrics"] = extra_kinds
    if not method:
        return profile.key()
    text = json.dumps({"profile": profile.key(), "method": method}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class StoreMeasure:
    """``measure`` over the store only: what ``perflab report`` decides from."""

    def __init__(self, store: Store, salt: Mapping[str, Any], retry_failed: bool = False, *,
                 plan: Plan | None = None) -> None:
        self.store = store
        self.salt = dict(salt)
        self.retry_failed = retry_failed
        self.plan = plan
        self.rerun_stopped = False  # a stopped-early measurement is measured again (--no-early-stop)
        # method: search's Optuna journal, beside the store; the report only reads it
        self.search_journal = store.dir / JOURNAL
        self.search_writable = False

    def engine_hours(self, res: ConfigResult) -> float | None:
        """The engine-hours of the run that measured ``res`` (its accelerators × launch→teardown)."""
        return self.store.run_engine_hours(res.run_id) if res.run_id is not None else None

    def lookup(self, config: Configuration, profile: Profile) -> ConfigResult | None:
        res = self.store.lookup(config.key(self.salt), profile_key(self.plan, profile), retry_failed=self.retry_failed)
        if res is not None and self.rerun_stopped and res.status is Status.STOPPED_EARLY:
            return None
        if res is not None and self.plan is not None and profile.name == self.plan.main_profile:
            res.accuracy = self.lookup_accuracy(config)  # what the study's accuracy gate decides with
        return res

    def accuracy_job(self, config: Configuration) -> AccuracyJob | None:
        return job_for(self.plan, config) if self.plan is not None else None

    def lookup_accuracy(self, config: Configuration) -> ConfigResult | None:
        """The stored accuracy measurement of ``config`` (None: not measured, or no gate)."""
        job = self.accuracy_job(config)
        if job is None:
            return None
        return self.store.lookup(config.key(self.salt), job.key(), retry_failed=self.retry_failed)

    def accuracy_todo(self, config: Configuration, profiles: Sequence[Profile]) -> AccuracyJob | None:
        """The accuracy measurement a launch of ``config`` for ``profiles`` must add: the plan's,
        when the main profile is asked for, measured (or about to be) and accuracy is not yet."""
        job = self.accuracy_job(config)
        if job is None or self.plan is None or all(p.name != self.plan.main_profile for p in profiles):
            return None
        if self.store.lookup(config.key(self.salt), job.key(), retry_failed=self.retry_failed) is not None:
            return None
        main = self.store.lookup(config.key(self.salt), profile_key(self.plan, self.plan.main),
                                 retry_failed=self.retry_failed)
        return job if main is None or main.status.measured else None

    def missing(self, config: Configuration, profiles: Sequence[Profile]) -> list[Profile]:
        """The profiles of ``config`` the store has no result for yet."""
        return [p for p in profiles if self.lookup(config, p) is None]

    async def __call__(self, config: Configuration, profiles: Sequence[Profile], *, step: str, label: str,
                       to_beat: float | None = None) -> dict[str, ConfigResult]:
        out: dict[str, ConfigResult] = {}
        for p in profiles:
            out[p.name] = self.lookup(config, p) or ConfigResult(Status.PENDING)
        return out


def stored_plan(store: Store) -> Plan:
    text = store.get_meta("plan_text")
    name = store.get_meta("plan_path") or "plan.yaml"
    if text is None:
        from perflab.contract.errors import UsageError

        raise UsageError(f"{store.dir}: the study has no stored plan; re-run `perflab run PLAN --out {store.dir}`")
    plan = load_plan_text(text, path=name, check_files=False)
    override = store.get_meta("hardware_spec")
    if override and override != plan.hardware:
        plan = dataclasses.replace(plan, hardware=override)
    return plan


async def stored_outcome(store: Store) -> StudyOutcome:
    plan = stored_plan(store)
    measure = StoreMeasure(store, store.get_meta("salt", {}), plan=plan)
    return await conduct(plan, measure, display=lambda e: report_context(store).name(e))


__all__ = ["StoreMeasure", "profile_key", "stored_outcome", "stored_plan"]
