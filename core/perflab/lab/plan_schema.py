"""The plan document's structure, declared once as pydantic models.

Each section's keys, value types, bounds and defaults live here; from them come the parser's
key lists and limits (:mod:`perflab.lab.plan` reads :func:`keys`, :func:`default` and
:data:`LIMITS`) and the JSON Schema that ``perflab plan schema`` publishes, so that editors
complete and check plans. The parser keeps its own checks of values (they write today's
one-line, all-problems-at-once messages) and the semantic ones no schema can state
(references between sections, known engines, files).

A bound that is one of the documented limits carries its name (``x-perflab-limit`` in the
schema): :data:`LIMITS` is collected from the schema, so a limit is written once, on its field.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, create_model
from pydantic.config import JsonDict
from pydantic.json_schema import GenerateJsonSchema

from perflab.accuracy.tasks import SHIPPED_TASK
from perflab.bench.request import MAX_NUM_PROMPTS
from perflab.contract.types import ServeOption
from perflab.lab.accuracy import APIS, AccuracySpec
from perflab.lab.decide import DEFAULT_LATENCY_REGRESSION_PCT, LATENCY_METRIC, SLO_METRICS, DecideBy, Decision, LoadKind
from perflab.lab.decide import Slo as SloLimits
from perflab.lab.options import PLAN_OPTIONS
from perflab.observe.energy import DEFAULT_CURRENCY

__all__ = ["DATASETS", "DEFAULT_OBJECTIVE", "LIMITS", "METHODS", "SPACE_KINDS", "SPACE_POINTS", "STUDY_NAME", "PlanDocument", "default", "fits", "json_schema", "keys",
           "limit_of", "schema_text"]

DEFAULT_OBJECTIVE = "Achieve high throughput under high-concurrency request scenarios."
# perflab.bench's datasets: "synthetic-sharegpt" is ShareGPT-like conversations generated
# locally (no dataset file needed); "prefix-repetition" (num_prefixes shared prefixes of
# prefix_len tokens, each followed by input_len tokens of its own) and "multi-turn"
# (conversations of `turns` turns, each prompt the conversation so far) show what prefix caching does
DATASETS = ("random", "sharegpt", "synthetic-sharegpt", "prefix-repetition", "multi-turn")
BACKENDS = ("openai-chat", "openai")
COMBINATION_BASES = ("best", "engine-defaults")

_LIMIT_KEY = "x-perflab-limit"
_NOT_BLANK = "\\S"  # a string the parser takes: not blank
_WEEK_S = 7 * 24 * 3600.0
_TOKENS = 10_000_000


def _tag(limit: str) -> JsonDict:
    """A bound's name among the documented limits (:data:`LIMITS`), on a field whose upper
    bound (``le``, a list's ``max_length``, or one branch of its union's) is that limit."""
    return {_LIMIT_KEY: limit}


def _dc_default(cls: Any, name: str) -> Any:
    """A dataclass field's default: the schema states the defaults the lab's types declare."""
    f = next(f for f in dataclasses.fields(cls) if f.name == name)
    return f.default


def _absent(description: str) -> Any:
    """A key that may be left out (the parser gives its absence a meaning) but not be null."""
    return Field(None, description=description)


class _Section(BaseModel):
    # an unknown key is a problem (the parser's "unknown key (did you mean ...?)")
    model_config = ConfigDict(extra="forbid", frozen=True)


# --------------------------------------------------------------------------- serving options

def _option_type(opt: ServeOption) -> Any:
    """The JSON-Schema-able type of one serving option's value, by its declared kind."""
    scalar = str | int | float | bool | None
    types: dict[str, Any] = {
        "str": Annotated[str, Field(pattern=_NOT_BLANK)],
        "pos_int": Annotated[int, Field(gt=0)],
        "bool": bool,
        "fraction": Annotated[float, Field(gt=0, le=1)],
        "port": Annotated[int, Field(ge=1, le=65535)],
        "json": dict[str, Any],
        "options": dict[str, Any],
        "env": dict[str, scalar],
        "args": str | list[str | int | float],
        "devices": Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1, json_schema_extra={"uniqueItems": True})],
    }
    return types[opt.kind] | None  # null: back to the engine's default


def _options_model(name: str, doc: str, exclude: tuple[str, ...] = ()) -> type[BaseModel]:
    """A mapping of serving options: every plan option of ServeConfig (and ``replicas``),
    each with its declared help as description."""
    fields: dict[str, Any] = {
        key: (_option_type(opt), Field(None, description=opt.help + (f" {opt.note}" if opt.note else "")))
        for key, opt in PLAN_OPTIONS.items() if key not in exclude
    }
    model: type[BaseModel] = create_model(name, __base__=_Section, __doc__=doc, **fields)
    return model


#: options a delta sets (a baseline's serve, engine_serve, a variant's set): ``null`` removes one
ServeDelta = _options_model("ServeDelta", "Serving options; a value replaces, null means the engine's default.")
#: the plan's ``serve``: every option but the model, which is the top-level ``model`` key
ServeDefaults = _options_model("ServeDefaults", "Serving options every configuration gets.", exclude=("model",))

EngineName = Annotated[str, Field(min_length=1, description="An engine name (perflab engines list), or winner in steps.")]
Engines = Annotated[EngineName | Annotated[list[EngineName], Field(min_length=1)],
                    Field(description="One engine or a list of engines.")]
EngineSet = Annotated[dict[str, ServeDelta | None], Field(description="Engine name -> serving options for that engine only.")]  # type: ignore[valid-type]
Text = Annotated[str, Field(pattern=_NOT_BLANK)]


# --------------------------------------------------------------------------- sections

class ModelSection(_Section):
    """The model under test: a Hugging Face id or a local directory, and how the report names it."""

    model_config = ConfigDict(json_schema_extra={"oneOf": [{"required": ["id"]}, {"required": ["path"]}]})

    id: Text = _absent("Model id (Hugging Face), e.g. Qwen/Qwen3-32B.")
    path: Text = _absent("Local model directory (relative to the plan file).")
    name: Text = _absent("Display name in the report.")
    metadata: dict[str, Any] | None = Field(None, description="Free-form, listed under Model in the report.")


class Baseline(_Section):
    """The configuration every candidate is first compared with."""

    engine: EngineName = _absent("Default: the first of engines.")
    serve: ServeDelta | None = Field(None, description="Options on top of the engine's defaults.")  # type: ignore[valid-type]
    label: Text | None = Field(None, description="The baseline's name in the report.")


_SET = "Serving options this variant changes."
_ENGINE_SET = "Engine name -> serving options this variant changes on that engine only."


class Variant(_Section):
    """One named delta on the serving options, tried against the current best."""

    name: Text = _absent("Default: the step's name and the variant's number.")
    set: ServeDelta | None = Field(None, description=_SET)  # type: ignore[valid-type]
    engine_set: EngineSet | None = Field(None, description=_ENGINE_SET)
    engines: Engines | None = Field(None, description="The engines it applies to (default: the step's).")


class CombinationVariant(Variant):
    """A variant of a combination: candidate variants applied together, and/or a set."""

    of: list[str] = _absent("Candidate variants to combine: 'Candidate/Variant' or 'Candidate'.")


class Candidate(_Section):
    """An optimization step: one delta (set) or several variants, each tried against the current best."""

    name: Text = Field(description="The step's name (unique).")
    engines: Engines | None = Field(None, description="Engines it is tried on (default: [winner]).")
    variants: Annotated[list[Variant], Field(min_length=1)] = _absent("Alternatives, each tried.")
    set: ServeDelta | None = Field(None, description=_SET)  # type: ignore[valid-type]
    engine_set: EngineSet | None = Field(None, description=_ENGINE_SET)
    description: str = _absent("What the step tries, for the report.")


class Combination(_Section):
    """Candidate variants applied together, measured after the candidates."""

    name: Text = Field(description="The step's name (unique).")
    engines: Engines | None = Field(None, description="Engines it is tried on (default: [winner]).")
    variants: Annotated[list[CombinationVariant], Field(min_length=1)] = _absent("Alternatives, each tried.")
    of: list[str] = _absent("Candidate variants to combine: 'Candidate/Variant' or 'Candidate'.")
    set: ServeDelta | None = Field(None, description=_SET)  # type: ignore[valid-type]
    engine_set: EngineSet | None = Field(None, description=_ENGINE_SET)
    base: Literal[COMBINATION_BASES] = Field(  # type: ignore[valid-type]
        "best", description="What the combination is applied to: the current best, or each engine's defaults.")
    description: str = _absent("What the step tries, for the report.")


_MAX_CONCURRENCY = 1_000_000
_REQUEST_RATE = 1_000_000.0
_SWEEP = 100  # load points of one curve
_INF = "^\\s*[Ii][Nn][Ff]([Ii][Nn][Ii][Tt][Yy])?\\s*$"


class Sweep(_Section):
    """A load curve measured in one launch: exactly one axis, its loads ascending."""

    model_config = ConfigDict(json_schema_extra={"minProperties": 1, "maxProperties": 1})

    max_concurrency: Annotated[list[Annotated[int, Field(gt=0, le=_MAX_CONCURRENCY)]], Field(
        min_length=1, max_length=_SWEEP)] | None = Field(None, json_schema_extra=_tag("sweep"), description="Concurrency limits, ascending.")
    request_rate: Annotated[list[Annotated[float, Field(gt=0, le=_REQUEST_RATE)]], Field(
        min_length=1, max_length=_SWEEP)] | None = Field(
        None, json_schema_extra=_tag("sweep"), description="Request rates (requests per second), ascending.")


class Profile(_Section):
    """One benchmark workload."""

    label: Text = _absent("Display name (default: the profile's key).")
    dataset: Literal[DATASETS] = Field("random", description="Where the prompts come from.")  # type: ignore[valid-type]
    dataset_path: Text = _absent("A local dataset file (sharegpt), relative to the plan.")
    input_len: int | None = Field(None, gt=0, le=_TOKENS, json_schema_extra=_tag("input_len"), description="Prompt tokens.")
    output_len: int | None = Field(None, gt=0, le=_TOKENS, json_schema_extra=_tag("output_len"), description="Output tokens.")
    # at most the benchmark's own limit (perflab bench --num-prompts)
    num_prompts: int = Field(1000, gt=0, le=MAX_NUM_PROMPTS, json_schema_extra=_tag("num_prompts"), description="Requests sent.")
    request_rate: Annotated[float, Field(gt=0, le=_REQUEST_RATE)] | Annotated[str, Field(pattern=_INF)] = Field(
        "inf", json_schema_extra=_tag("request_rate"), description="Requests per second, or 'inf' (every request at once).")
    max_concurrency: int | None = Field(None, gt=0, le=_MAX_CONCURRENCY, json_schema_extra=_tag("max_concurrency"),
                                        description="Requests in flight at most.")
    # a 64-bit integer: what SQLite and JSON readers hold
    seed: int = Field(42, ge=-(2**63), le=2**63 - 1, json_schema_extra=_tag("seed"), description="The workload's random seed.")
    backend: Literal[BACKENDS] = Field("openai-chat", description="The API the bench speaks.")  # type: ignore[valid-type]
    endpoint: Text = _absent("A path such as /v1/chat/completions.")
    burstiness: float = Field(1.0, gt=0, le=1_000.0, json_schema_extra=_tag("burstiness"),
                              description="Arrival burstiness (1: Poisson), as vllm bench serve's.")
    range_ratio: float = Field(0.0, ge=0, lt=1, description="random: lengths vary by this fraction.")
    sweep: Sweep = _absent("A load curve instead of one load point.")
    prefix_len: int | None = Field(None, gt=0, le=_TOKENS, json_schema_extra=_tag("prefix_len"),
                                   description="Shared prefix tokens (random, prefix-repetition).")
    num_prefixes: int | None = Field(None, gt=0, le=1_000_000, json_schema_extra=_tag("num_prefixes"),
                                     description="prefix-repetition: distinct shared prefixes (default 10).")
    turns: int | None = Field(None, gt=0, le=10_000, json_schema_extra=_tag("turns"), description="multi-turn: turns per conversation.")


def _timeout(what: str, default: float | None, zero_ok: bool = False) -> Any:
    return Field(default, ge=0 if zero_ok else None, gt=None if zero_ok else 0, le=_WEEK_S,
                 json_schema_extra=_tag("timeout_s"), description=what)


class Timeouts(_Section):
    """How long each step may take, in seconds."""

    startup_s: float = _timeout("Until the engine serves (default: the engine plugin's own).", None)
    benchmark_s: float = _timeout("One profile's benchmark.", 7200.0)
    teardown_s: float = _timeout("Grace between SIGTERM and SIGKILL (default: the supervisor's).", None)
    stall_s: float = _timeout("No token on any open stream this long: stalled (default: the bench's 60).", None)
    device_wait_s: float = _timeout("How long a launch waits for its devices to be free (0: not at all).", 60.0,
                                    zero_ok=True)


class Simulation(_Section):
    """Simulator-only settings."""

    time_scale: float = Field(1.0, ge=1, le=10_000.0, json_schema_extra=_tag("time_scale"),
                              description="Simulated seconds per real second.")
    engine_versions: dict[str, str] | None = Field(None, description="Engine -> the version simulated engines report.")


_SLO_MS = 24 * 3600 * 1000.0
# the limits' keys are SLO_METRICS' (perflab.lab.decide), beside the percentile they apply at
_SLO_FIELDS: dict[str, Any] = {
    key: (float, Field(None, gt=0, le=_SLO_MS, json_schema_extra=_tag("slo_ms"),
                              description=f"Limit on the {key[:-3]} (ms)."))
    for key in SLO_METRICS
}
Slo = create_model(
    "Slo", __base__=_Section, __doc__="Latency limits in milliseconds at one percentile.", **_SLO_FIELDS,
    percentile=(float, Field(_dc_default(SloLimits, "percentile"), gt=0, le=100, description="The percentile.")),
)

_METRIC = re.sub(r"\?P<\w+>", "", LATENCY_METRIC.pattern)  # JSON Schema's regexes have no group names


class Guards(_Section):
    """What makes a configuration ineligible whatever its figure; latency metrics' limits besides."""

    model_config = ConfigDict(extra="allow", json_schema_extra={
        "patternProperties": {_METRIC: {"type": "number", "exclusiveMinimum": 0,
                                        "description": "A latency metric's limit (ms) on the main profile."}},
        "additionalProperties": False,
    })

    max_regression: dict[Annotated[str, Field(pattern=_METRIC)], Annotated[float, Field(ge=0)]] | None = Field(
        None, description="Latency metric -> how much worse than the baseline it may be (0.2: 20 %).")
    latency_regression_pct: float = Field(DEFAULT_LATENCY_REGRESSION_PCT, ge=0,
                                          description="The regression the report flags (percent).")


class Cost(_Section):
    """What an accelerator-hour costs: cost per million output tokens in the report."""

    per_accelerator_hour: float = Field(gt=0, le=1_000_000.0, json_schema_extra=_tag("per_accelerator_hour"),
                                        description="Price of one accelerator for one hour.")
    currency: str = Field(DEFAULT_CURRENCY, pattern="^[A-Za-z]{3}$", description="Three-letter currency code.")


_POINTS = 100.0


class Accuracy(_Section):
    """The accuracy gate: task score and agreement of every configuration."""

    task: Text | None = Field(_dc_default(AccuracySpec, "task"),
                              description=f"An lm-eval task name or task file (default {SHIPPED_TASK}); null: agreement only.")
    limit: int | None = Field(None, gt=0, le=1_000_000, json_schema_extra=_tag("accuracy_limit"), description="Items of the task (default: all).")
    max_drop: float = Field(_dc_default(AccuracySpec, "max_drop"), ge=0, le=_POINTS, json_schema_extra=_tag("accuracy_points"),
                            description="Points of score below the baseline's a configuration may lose.")
    agreement: bool = Field(_dc_default(AccuracySpec, "agreement"), description="Check greedy outputs agree with the reference.")
    agreement_margin: float = Field(_dc_default(AccuracySpec, "agreement_margin"), ge=0,
                                    le=_POINTS, json_schema_extra=_tag("accuracy_points"),
                                    description="Points of exact match below the reference's noise floor.")
    concurrency: int | None = Field(_dc_default(AccuracySpec, "concurrency"), gt=0,
                             le=10_000, json_schema_extra=_tag("accuracy_concurrency"), description="The task's requests in flight.")
    api: Literal[APIS] = Field(_dc_default(AccuracySpec, "api"), description="The API lm-eval uses.")  # type: ignore[valid-type]
    lossless: list[Literal[tuple(PLAN_OPTIONS)]] = _absent(  # type: ignore[valid-type]
        "Serving options declared lossless beside the built-in ones.")
    timeout_s: float = Field(_dc_default(AccuracySpec, "timeout_s"), gt=0, le=_WEEK_S, json_schema_extra=_tag("timeout_s"),
                             description="The whole accuracy measurement of one configuration (seconds).")


# --------------------------------------------------------------------------- method: grid | search

#: how a study walks the configurations: the seeds' steps (engines on defaults, then one delta
#: at a time), every point of ``space``, or an Optuna search over it (perflab.lab.search)
METHODS = ("seeds", "grid", "search")
#: the option kinds a space may range over: a point is one scalar value per dimension (Optuna's
#: categorical choices); mappings and lists (env, engine_options, devices) stay in serve
SPACE_KINDS = ("str", "pos_int", "bool", "fraction")
SPACE_POINTS = 100_000
#: the space's key of per-engine engine-specific options (ServeConfig.options' plan key)
ENGINE_OPTIONS = "engine_options"
#: a value an engine-specific dimension takes (Optuna's categorical choices; null: the engine's default)
SpaceValue = str | int | float | bool | None


def _space_model() -> type[BaseModel]:
    """``space``: engine and each scalar serving option -> the values it takes (null: the
    engine's default); the points are their product."""
    fields: dict[str, Any] = {"engine": (Annotated[list[EngineName], Field(min_length=1)] | None, Field(
        None, description="Engines of the space (default: the plan's engines)."))}
    for key, opt in PLAN_OPTIONS.items():
        if opt.kind in SPACE_KINDS:
            values: Any = Annotated[list[_option_type(opt)], Field(min_length=1)]  # type: ignore[misc]
            fields[key] = (values | None, Field(
                None, description=f"Values of {key} to try (null: the engine's default). {opt.help}"))
    fields[ENGINE_OPTIONS] = (dict[EngineName, dict[str, Annotated[list[SpaceValue], Field(min_length=1)]]] | None, Field(
        None, description="Engine name -> engine-specific option its plugin maps -> values to try (null: the "
                          "engine's default); a dimension of that engine's points only."))
    model: type[BaseModel] = create_model("Space", __base__=_Section, __doc__="The configuration space of method grid or search.",
                                          **fields)
    return model


Space = _space_model()


class Tuning(_Section):
    """How method: search spends its measurements."""

    trials: int | None = Field(None, gt=0, le=10_000, json_schema_extra=_tag("trials"),
                               description="Distinct configurations measured (default: a quarter of the space, "
                                           "at least 6, never more than the space).")
    seed: int = Field(0, ge=0, le=2**32 - 1, description="The sampler's seed: the same seed, the same trials on the simulator.")
    budget_engine_hours: float | None = Field(None, gt=0, le=1_000_000.0, json_schema_extra=_tag("budget_engine_hours"),
                                              description="Stop asking for trials once they have used this many "
                                                          "engine-hours (default: no budget but trials).")


#: a study name: it becomes perflab-studies/<name> (no separator, no '..', nothing hidden)
STUDY_NAME = "^(?!.*\\.\\.)[A-Za-z0-9][A-Za-z0-9._-]{0,99}$"


class PlanDocument(_Section):
    """A perflab plan: what a study compares, on what, with which workloads (docs/plan-reference.md)."""

    # the study name's pattern has a look-ahead, which pydantic's default regex engine lacks
    model_config = ConfigDict(title="perflab plan", regex_engine="python-re")

    version: Literal[1] = Field(1, description="The plan format's version.")
    name: str | None = Field(None, pattern=STUDY_NAME,
                             description="Study name: default directory perflab-studies/<name> (default: the file's stem).")
    title: Text | None = Field(None, description="The report's title.")
    objective: Text | None = Field(DEFAULT_OBJECTIVE, description="What the study optimizes, for the report.")
    model: Text | ModelSection = Field(description="A model id such as Qwen/Qwen3-32B, or {id|path, name, metadata}.")
    hardware: str = Field("auto", pattern="^(auto|sim:.+)$", description="auto, or sim:NAME (the simulator's machines).")
    engines: Engines = Field(description="The engines compared on their defaults.")
    serve: ServeDefaults | None = Field(None, description="Serving options every configuration gets.")  # type: ignore[valid-type]
    engine_serve: EngineSet | None = Field(None, description="Engine name -> options that engine always gets.")
    engine_versions: dict[str, str] | None = Field(
        None, description="Engine name -> the engine version its commands are built for (planning for another "
                          "machine; default: the installed version, else the newest the plugin maps).")
    baseline: EngineName | Baseline | None = Field(None, description="An engine name, or {engine, serve, label}.")
    candidates: list[Candidate] | None = Field(None, description="Optimization steps, in order.")
    combinations: list[Combination] | None = Field(None, description="Candidate variants applied together.")
    profiles: Annotated[dict[str, Profile], Field(min_length=1)] = Field(description="Profile name -> workload.")
    main_profile: str | int | None = Field(None, description="The profile that decides (default: the first).")
    min_success_rate: Annotated[float, Field(ge=0, le=1)] | Annotated[str, Field(pattern="^\\s*[0-9.]+\\s*%\\s*$")] = Field(
        0.9, description="Successful requests a measurement needs: a fraction, or '90%'.")
    min_improvement_pct: float = Field(0.0, ge=0, le=10_000.0, json_schema_extra=_tag("min_improvement_pct"),
                                       description="A change is adopted if it improves the figure by more than this.")
    timeouts: Timeouts | None = None
    simulation: Simulation | None = None
    notes: list[str] = _absent("Listed in the report.")
    decide_by: Literal[tuple(DecideBy)] = Field(  # type: ignore[valid-type]
        str(_dc_default(Decision, "decide_by")), description="What ranks configurations.")
    slo: Slo | None = None  # type: ignore[valid-type]
    search: Literal[tuple(LoadKind)] = Field(  # type: ignore[valid-type]
        str(_dc_default(Decision, "search")), description="The load axis of max-load's search.")
    repeats: int = Field(_dc_default(Decision, "repeats"), gt=0, le=100, json_schema_extra=_tag("repeats"),
                         description="Measurements of each configuration and profile.")
    warmup: int = Field(_dc_default(Decision, "warmup"), ge=0, le=1_000_000, json_schema_extra=_tag("warmup"),
                        description="Warm-up requests before each measured profile.")
    early_stop: bool = Field(_dc_default(Decision, "early_stop"),
                             description="Stop a measurement that cannot win any more.")
    guards: Guards | None = None
    cost: Cost | None = None
    accuracy: Accuracy | None = Field(None, description="The accuracy gate; {} (or null) takes every default.")
    method: Literal[METHODS] = Field("seeds", description="seeds: the engines on defaults, then the candidates one "  # type: ignore[valid-type]
                                     "at a time; grid: every point of space; search: an Optuna search over space.")
    space: Space | None = Field(None, description="The configuration space of method grid or search.")  # type: ignore[valid-type]
    tuning: Tuning | None = Field(None, description="method: search's trials, seed and budget.")


# --------------------------------------------------------------------------- what the parser reads


def keys(model: type[BaseModel]) -> tuple[str, ...]:
    """A section's keys, in declaration order (the parser's "expected one of: ...")."""
    return tuple(model.model_fields)


def default(model: type[BaseModel], key: str) -> Any:
    """A key's declared default."""
    return model.model_fields[key].default


@functools.cache
def _adapter(model: type[BaseModel], key: str) -> TypeAdapter[Any]:
    return TypeAdapter(model.model_fields[key].rebuild_annotation(), config=model.model_config)


def fits(model: type[BaseModel], key: str, value: Any) -> bool:
    """``value`` is of the key's declared type, within its declared bounds (pydantic, strict:
    nothing is coerced, a boolean is no number)."""
    try:
        _adapter(model, key).validate_python(value, strict=True)
    except ValidationError:
        return False
    return True


def limit_of(model: type[BaseModel], key: str) -> str:
    """The name of the documented limit a key's upper bound is (a :data:`LIMITS` key)."""
    extra = model.model_fields[key].json_schema_extra
    if not isinstance(extra, Mapping) or not isinstance(extra.get(_LIMIT_KEY), str):
        raise KeyError(f"{model.__name__}.{key} declares no limit")
    return str(extra[_LIMIT_KEY])


class _Generator(GenerateJsonSchema):
    # a key's title would be its name respelled ("Input Len"): editors show the key and its description
    def field_title_should_be_set(self, schema: Any) -> bool:
        return False


def json_schema() -> dict[str, Any]:
    """The plan document as JSON Schema (draft 2020-12), for editors and validators."""
    schema = PlanDocument.model_json_schema(schema_generator=_Generator)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema}


def schema_text() -> str:
    """:func:`json_schema` as the file ``perflab plan schema`` writes (docs/plan.schema.json)."""
    return json.dumps(json_schema(), indent=2) + "\n"


def _limits_in(node: Any) -> Iterator[tuple[str, float]]:
    if isinstance(node, Mapping):
        if _LIMIT_KEY in node:
            for n in (node, *node.get("anyOf", ())):
                hi = n.get("maximum", n.get("maxItems"))
                if hi is not None:
                    yield node[_LIMIT_KEY], hi
        for value in node.values():
            yield from _limits_in(value)
    elif isinstance(node, list):
        for value in node:
            yield from _limits_in(value)


def _collect_limits() -> Mapping[str, float]:
    out: dict[str, float] = {}
    for name, hi in _limits_in(json_schema()):
        if out.setdefault(name, hi) != hi:
            raise ValueError(f"limit {name!r} declared as both {out[name]} and {hi}")
    return MappingProxyType(out)


#: The largest value each number of a plan may take (docs/plan-reference.md states them). Past
#: these a number is a typo, not a study (``num_prompts: 1000000000000`` used to launch an
#: engine and then fail its benchmark): refused when the plan is read. Collected from the
#: bounds declared above: ``timeout_s`` is every timeouts key's, ``slo_ms`` every slo limit's,
#: ``sweep`` the load points of one curve.
LIMITS: Mapping[str, float] = _collect_limits()

