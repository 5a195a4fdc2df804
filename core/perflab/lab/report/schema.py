"""report.json's structure, declared once as pydantic models.

:data:`perflab.lab.report.SCHEMA_VERSION` is written at the top of every report.json
(:func:`perflab.lab.report.build_json`; declared there, so writing a report does not build
these models); the models below state each key and the type of its value, and from them comes the JSON Schema published as docs/report.schema.json
(``python tests/lab/test_report_schema.py --update`` regenerates it; that test checks that it
is current and that a report's keys are the models'; tests/lab/test_demo_stored.py that the
demo's report.json validates).

What is open-ended by nature stays an
object here: a benchmark record (``vllm bench serve --save-result``'s names,
:class:`perflab.bench.metrics.BenchMetrics`), the probed hardware, the plan's decision rules,
the summaries of what was observed.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from perflab.contract.status import Status
from perflab.lab.decide import DecideBy
from perflab.lab.report import SCHEMA_VERSION, SchemaVersion

__all__ = ["ReportDocument", "json_schema", "schema_text"]

Object = dict[str, Any]


class _Part(BaseModel):
    # every key report.json writes is declared: a key the code adds without its field fails the tests
    model_config = ConfigDict(extra="forbid")


class Result(_Part):
    """What one configuration did on one profile (:class:`perflab.lab.study.ConfigResult`)."""

    status: Status
    metrics: Object | None = Field(description="The benchmark's record under vllm bench serve's --save-result names "
                                               "(the mean of the repeats); an accuracy measurement's record")
    num_prompts: int | None
    success_rate: float | None = Field(description="Completed requests over those asked (ok results only)")
    total_token_throughput: float | None = Field(description="tok/s (ok results only)")
    reasons: list[Object] = Field(description="Why it was refused: {what, why, source, severity}")
    cause: Object | None = Field(description="Why it crashed: {name, explanation, line, hint, source}")
    error: str | None
    script: str | None = Field(description="The serving script")
    version: str | None = Field(description="The engine's version")
    run_id: int | None
    run_dir: str | None
    log: str | None
    replicas: int
    repeats: list[Object] = Field(description="Each repeat's record, when there were more than one")
    noise: dict[str, float] = Field(description="The repeats' relative standard deviation in % per metric")
    points: list[Object] = Field(description="A curve's load points: {load, metrics, repeats, noise, slo_met, ...}")
    capacity: float | None = Field(description="The max-load search's highest load meeting the SLO")
    stopped_early: Object | None = Field(description="What stopped it early, with its figures")
    server_metrics: Object | None
    telemetry: Object | None
    energy: Object | None
    cost: Object | None


class Configuration(_Part):
    engine: str
    options: Object


class Entry(_Part):
    """One configuration of a step, as measured on the main profile."""

    label: str
    variant: str | None
    engine: str
    config: Configuration
    eligible: bool
    note: str
    result: Result
    accuracy: Object | None = Field(None, description="The accuracy gate's verdict (plans with accuracy:)")
    trial: Object | None = Field(None, description="method grid or search: {number, point, state (complete, pruned, "
                                                   "failed, unsupported), value (a pruned trial's: its bound or forecast, "
                                                   "pruned_by says which), engine_hours}")


class Step(_Part):
    index: int
    kind: str = Field(description="engine, candidate or combination; grid or search (method grid or search)")
    name: str
    title: str
    entries: list[Entry]
    base: str | None
    chosen: str | None
    adopted: bool
    statement: str
    improvement_vs_previous_best_pct: float | None
    improvement_vs_baseline_pct: float | None
    skipped: str | None
    within_noise: bool
    search: Object | None = Field(None, description="method grid or search: {method, points, dimensions, trials, pruned, "
                                                    "engine_hours, best, and for search sampler, seed, trials_asked, "
                                                    "budget_engine_hours, importances; with an SLO objectives ([{name, "
                                                    "direction}]: the ranking figure maximized, each SLO latency "
                                                    "minimized) and front (the Pareto front: the complete, eligible "
                                                    "trials meeting the SLO that no other dominates, each {number, "
                                                    "label, point, value, latencies, recommended}); after the seeds' "
                                                    "steps vs_seeds {seeds_pick, search_best, gain_pct, "
                                                    "seeds_engine_hours, search_engine_hours, recommended}}")


class Case(_Part):
    """One profile, baseline against optimized."""

    profile: str
    label: str
    definition: Object
    baseline: Result
    optimized: Result | None
    total_token_throughput_change_pct: float | None


class ConclusionRow(_Part):
    profile: str
    label: str
    baseline_total_token_throughput: float | None
    baseline_mean_tpot_ms: float | None
    baseline_ranking_figure: float | None
    optimized_ranking_figure: float | None
    ranking_figure_change_pct: float | None
    baseline_slo: list[Object] | None
    optimized_slo: list[Object] | None
    optimized_total_token_throughput: float | None
    optimized_mean_tpot_ms: float | None
    change_pct: float | None
    baseline_success_rate: float | None
    baseline_failures: str | None
    optimized_success_rate: float | None
    optimized_failures: str | None
    latency_regressions: list[Object]


class SummaryRow(_Part):
    option: str
    step: str
    adopted: bool
    improvement_vs_baseline_pct: float | None
    improvement_vs_previous_best_pct: float | None
    detail: str
    energy_cost: str | None


class ProfileDefinition(BaseModel):
    """A profile's name and label and what it measures (perflab.lab.plan.Profile.definition:
    keys added since the first version appear only when set)."""

    model_config = ConfigDict(extra="allow")
    name: str
    label: str
    dataset: str
    num_prompts: int
    request_rate: float | Literal["inf"]


class Model(_Part):
    id: str
    name: str
    metadata: Object


class EngineHours(_Part):
    spent: float
    full_method_estimate: float
    saved_pct: float


class Engine(_Part):
    display_name: str
    version: str | None


class Accuracy(_Part):
    spec: Object
    rows: list[Object]


class Finding(_Part):
    rule: str
    where: str
    message: str


class Audit(_Part):
    clean: bool
    sources: list[str]
    results_checked: int
    table_rows_checked: int
    rules: list[str]
    findings: list[Finding]


class ReportDocument(_Part):
    """A study's report.json, as ``perflab report`` writes it."""

    model_config = ConfigDict(extra="forbid", title="perflab report.json")
    schema_version: SchemaVersion = Field(description=f"This document's version: {SCHEMA_VERSION} (perflab.lab.report.SCHEMA_VERSION)")
    perflab_version: str
    generated_at: str
    title: str
    simulated: bool
    hardware_spec: str
    time_scale: float
    interrupted: bool
    stop_reason: str | None
    leftovers: list[str]
    model: Model
    objective: str
    decide_by: DecideBy
    slo: Object | None
    decision: Object
    latency_regression_pct: float | None
    ranking_metric: str
    pareto: list[Object]
    engine_hours: EngineHours | None
    hardware: Object
    engines: dict[str, Engine] | None
    main_profile: str
    min_success_rate: float
    profiles: list[ProfileDefinition]
    recommended_command: str | None
    conclusion: list[ConclusionRow]
    summary: list[SummaryRow]
    accuracy: Accuracy | None
    steps: list[Step]
    baseline: Entry
    optimized: Entry | None
    cases: list[Case]
    complete: bool
    audit: Audit | None = Field(None, description="`perflab audit` of the report as written")


def json_schema() -> dict[str, Any]:
    """report.json as JSON Schema (draft 2020-12)."""
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **ReportDocument.model_json_schema()}


def schema_text() -> str:
    """:func:`json_schema` as docs/report.schema.json holds it."""
    return json.dumps(json_schema(), indent=2) + "\n"
