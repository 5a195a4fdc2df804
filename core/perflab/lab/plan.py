"""Plan files: what a study compares, on what, with which workloads.

One schema, declared in :mod:`perflab.lab.plan_schema` (each section's keys, limits and defaults
come from there) and documented in ``docs/plan-reference.md``, read from YAML (``.yaml``/``.yml``)
or TOML (``.toml``). :func:`load_plan` checks the whole file and reports every problem at once,
each with its key and what was expected, as one :class:`~perflab.contract.errors.UsageError` line:

    plan.yaml: 2 problems: engines[1]: unknown engine 'foo' (expected one of: sglang, trtllm,
    vllm); profiles.short.num_prompts: expected a positive integer, got 'many'

Each value is checked here, with a message that says in words what was expected; whether a
number (a sweep, a currency) is within what the schema declares is pydantic's answer
(:func:`perflab.lab.plan_schema.fits`). What no schema can state is checked here only: engines
that are installed, files that exist, references between sections, what each dataset needs.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import re
import shlex
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import yaml

from perflab import redact
from perflab.contract.errors import UsageError, did_you_mean
from perflab.lab import plan_schema as schema
from perflab.lab.accuracy import (
    ACCURACY_PROFILE,
    APIS,
    NEVER_LOSSLESS,
    AccuracyJob,
    AccuracySpec,
    is_lossless,
)
from perflab.lab.decide import DecideBy, Decision, Guards, LoadKind, Slo, is_latency_metric
from perflab.lab.options import PLAN_OPTIONS, Configuration, PlanServe, apply_delta, normalise
from perflab.lab.plan_schema import BACKENDS, COMBINATION_BASES, DATASETS, DEFAULT_OBJECTIVE, LIMITS
from perflab.observe.energy import DEFAULT_CURRENCY, Cost

if TYPE_CHECKING:
    from pydantic import BaseModel

    from perflab.bench.request import BenchRequest

WINNER = "winner"  # in an `engines:` list: the engine of the current best configuration

# Each section's keys, as the plan schema declares them (perflab.lab.plan_schema)
TOP_KEYS = schema.keys(schema.PlanDocument)
MODEL_KEYS = schema.keys(schema.ModelSection)
BASELINE_KEYS = schema.keys(schema.Baseline)
CANDIDATE_KEYS = schema.keys(schema.Candidate)
COMBINATION_KEYS = schema.keys(schema.Combination)
VARIANT_KEYS = schema.keys(schema.CombinationVariant)  # a candidate's variants: all but "of"
CANDIDATE_VARIANT_KEYS = schema.keys(schema.Variant)
PROFILE_KEYS = schema.keys(schema.Profile)
TIMEOUT_KEYS = schema.keys(schema.Timeouts)
SIMULATION_KEYS = schema.keys(schema.Simulation)
SLO_SECTION_KEYS = schema.keys(schema.Slo)
COST_SECTION_KEYS = schema.keys(schema.Cost)
ACCURACY_SECTION_KEYS = schema.keys(schema.Accuracy)
SPACE_KEYS = schema.keys(schema.Space)
TUNING_KEYS = schema.keys(schema.Tuning)
# the profile keys each dataset needs (input_len: the prompt's own tokens after a shared prefix,
# or each new user message of a conversation)
DATASET_NEEDS: Mapping[str, tuple[str, ...]] = {
    "random": ("input_len", "output_len"),
    "prefix-repetition": ("prefix_len", "input_len", "output_len"),
    "multi-turn": ("turns", "input_len", "output_len"),
}
# the keys only some datasets take
DATASET_ONLY: Mapping[str, tuple[str, ...]] = {
    "prefix_len": ("random", "prefix-repetition"), "num_prefixes": ("prefix-repetition",), "turns": ("multi-turn",),
}


# --------------------------------------------------------------------------- the plan


@dataclass(frozen=True)
class Sweep:
    """A load curve measured in one launch: the profile at each ``kind`` value, in order."""

    kind: LoadKind
    values: tuple[float, ...]

    def to_json(self) -> dict[str, Any]:
        return {str(self.kind): [int(v) if self.kind is LoadKind.MAX_CONCURRENCY else v for v in self.values]}


@dataclass(frozen=True)
class Profile:
    """One benchmark workload (the seeds' "ShareGPT", "Short Prompt: random 128/4" ...)."""

    name: str
    label: str
    dataset: str = schema.default(schema.Profile, "dataset")
    dataset_path: str | None = None
    input_len: int | None = None
    output_len: int | None = None
    num_prompts: int = schema.default(schema.Profile, "num_prompts")
    request_rate: float = float(schema.default(schema.Profile, "request_rate"))  # "inf"
    max_concurrency: int | None = None
    seed: int = schema.default(schema.Profile, "seed")
    backend: str = schema.default(schema.Profile, "backend")
    endpoint: str | None = None
    burstiness: float = schema.default(schema.Profile, "burstiness")
    range_ratio: float = schema.default(schema.Profile, "range_ratio")
    sweep: Sweep | None = None  # a load curve instead of one load point
    prefix_len: int | None = None  # shared prefix tokens (random: one for all; prefix-repetition: each prefix)
    num_prefixes: int | None = None  # prefix-repetition: distinct shared prefixes (default 10)
    turns: int | None = None  # multi-turn: turns per conversation

    def definition(self) -> dict[str, Any]:
        """What is measured (not the display label): two profiles with the same definition
        measure the same thing. Keys added since the first version appear only when set, so
        the profiles of earlier plans keep their keys."""
        extra: dict[str, Any] = {"sweep": self.sweep.to_json()} if self.sweep is not None else {}
        extra.update({k: v for k in ("prefix_len", "num_prefixes", "turns") if (v := getattr(self, k)) is not None})
        return {**extra,
            "dataset": self.dataset, "dataset_path": self.dataset_path, "input_len": self.input_len,
            "output_len": self.output_len, "num_prompts": self.num_prompts,
            "request_rate": "inf" if math.isinf(self.request_rate) else self.request_rate,
            "max_concurrency": self.max_concurrency, "seed": self.seed, "backend": self.backend,
            "endpoint": self.endpoint, "burstiness": self.burstiness, "range_ratio": self.range_ratio,
        }

    @property
    def prefixes(self) -> int:
        """prefix-repetition: the distinct shared prefixes (``num_prefixes``; default the bench's,
        vllm bench serve's ``--prefix-repetition-num-prefixes`` 10)."""
        from perflab.bench.request import BenchRequest

        return self.num_prefixes or BenchRequest.prefix_repetition_num_prefixes

    def key(self) -> str:
        text = json.dumps(self.definition(), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def describe(self) -> str:
        if self.dataset == "random":
            what = f"random {self.input_len} input tokens, {self.output_len} output tokens"
            if self.prefix_len:
                what = f"a shared {self.prefix_len}-token prefix, then {what}"
        elif self.dataset == "prefix-repetition":
            what = (f"{self.prefixes} shared {self.prefix_len}-token prefixes, each prompt "
                    f"one of them + {self.input_len} own tokens, {self.output_len} output tokens")
        elif self.dataset == "multi-turn":
            what = (f"{self.turns}-turn conversations, {self.input_len} tokens per new message, {self.output_len} "
                    "output tokens per answer, each prompt the conversation so far")
        else:
            what = {"sharegpt": "ShareGPT", "synthetic-sharegpt": "synthetic ShareGPT-like conversations"}.get(
                self.dataset, self.dataset)
            if self.output_len:
                what += f" (output capped at {self.output_len} tokens)"
        extra = [f"{self.num_prompts} prompts"]
        if not math.isinf(self.request_rate):
            extra.append(f"request rate {self.request_rate:g}/s")
        if self.max_concurrency:
            extra.append(f"max concurrency {self.max_concurrency}")
        return f"{what}, {', '.join(extra)}"

    def bench_request(self, model: str, served_model_name: str | None = None, **launch: Any) -> BenchRequest:
        """This workload as a benchmark request (what the lab's client runs and what the
        report's ``vllm bench serve`` command says); ``launch``: the fields a launch adds
        (``base_urls``, ``headers``, ``time_scale``, ``label`` ...)."""
        from perflab.bench.request import BenchRequest

        workload: dict[str, Any] = {}
        if self.dataset == "random":
            workload = {"random_input_len": self.input_len, "random_output_len": self.output_len,
                        "random_range_ratio": self.range_ratio, "random_prefix_len": self.prefix_len or 0}
        elif self.dataset == "prefix-repetition":
            workload = {"prefix_repetition_prefix_len": self.prefix_len, "prefix_repetition_suffix_len": self.input_len,
                        "prefix_repetition_num_prefixes": self.prefixes,
                        "prefix_repetition_output_len": self.output_len}
        elif self.dataset == "multi-turn":
            workload = {"multi_turn_turns": self.turns, "multi_turn_input_len": self.input_len,
                        "multi_turn_output_len": self.output_len}
        elif self.output_len:
            workload = {"sharegpt_output_len": self.output_len}
        return BenchRequest(
            base_urls=launch.pop("base_urls", ()), model=model, served_model_name=served_model_name,
            backend=self.backend, endpoint=self.endpoint, dataset=self.dataset, dataset_path=self.dataset_path,
            num_prompts=self.num_prompts, request_rate=self.request_rate, burstiness=self.burstiness,
            max_concurrency=self.max_concurrency, seed=self.seed, **workload, **launch,
        )

    def bench_command(self, model: str, served_model_name: str | None = None) -> str:
        """The equivalent ``vllm bench serve`` command line (:func:`perflab.bench.vllm_cli.vllm_bench_argv`).
        ``--served-model-name`` is the name the engines were asked for: without it vLLM sends
        ``--model`` (a local path, say) as the request's model and the server answers 404."""
        from perflab.bench.vllm_cli import vllm_bench_argv

        if self.dataset == "multi-turn":
            return f"# vllm bench serve has no multi-turn dataset: perflab's own ({self.describe()})"
        return shlex.join(vllm_bench_argv(self.bench_request(model, served_model_name)))


@dataclass(frozen=True)
class Variant:
    """One named delta on the serving options (a candidate's "FP8", "16k" ...)."""

    name: str
    set: Mapping[str, Any] = field(default_factory=dict)
    engine_set: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    engines: tuple[str, ...] | None = None
    of: tuple[str, ...] = ()  # combinations: references to candidate variants

    def delta_for(self, engine: str) -> dict[str, Any]:
        return apply_delta(dict(self.set), dict(self.engine_set.get(engine, {})))


@dataclass(frozen=True)
class Candidate:
    """An optimization step: its variants are each tried against the current best."""

    name: str
    variants: tuple[Variant, ...]
    engines: tuple[str, ...] = (WINNER,)
    description: str = ""
    combination: bool = False
    base: str = "best"  # combinations: "best" or "engine-defaults"


@dataclass(frozen=True)
class Baseline:
    engine: str
    serve: Mapping[str, Any] = field(default_factory=dict)
    label: str | None = None


@dataclass(frozen=True)
class Space:
    """``space:`` of method grid or search: its engines, and serving option -> the values it
    takes (None: the engine's default). A point is one value per dimension; the grid is
    their product, engines first, then the options in the plan's order.

    ``engine_options``: engine -> engine-specific option (``ServeConfig.options``, which that
    engine's plugin maps or refuses) -> its values. Such a dimension belongs to that engine's
    points only (named :func:`engine_dim`, ``vllm.block_size``): the space is conditional on
    the engine, so the grid holds no point twice and Optuna never models a dimension a trial
    did not have."""

    engines: tuple[str, ...]
    options: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)
    engine_options: Mapping[str, Mapping[str, tuple[Any, ...]]] = field(default_factory=dict)

    def dims(self) -> dict[str, tuple[Any, ...]]:
        """The dimensions every point has: ``engine`` first, then the options."""
        return {"engine": self.engines, **self.options}

    def engine_dims(self, engine: str) -> dict[str, tuple[Any, ...]]:
        """The dimensions only ``engine``'s points have (its engine_options)."""
        return {engine_dim(engine, k): v for k, v in self.engine_options.get(engine, {}).items()}

    @property
    def conditional(self) -> bool:
        """Whether some dimension belongs to one engine's points only."""
        return any(self.engine_dims(e) for e in self.engines)

    @property
    def size(self) -> int:
        shared = math.prod(len(v) for v in self.options.values())
        return sum(shared * math.prod(len(v) for v in self.engine_dims(e).values()) for e in self.engines)

    def points(self) -> list[dict[str, Any]]:
        """Every point, in grid order: ``{"engine": ..., option: value, ..., "vllm.block_size": value}``."""
        out: list[dict[str, Any]] = []
        for engine in self.engines:
            dims = {**self.options, **self.engine_dims(engine)}
            out += [{"engine": engine, **dict(zip(dims, combo, strict=True))} for combo in itertools.product(*dims.values())]
        return out


def engine_dim(engine: str, option: str) -> str:
    """The name of ``engine``'s engine-specific dimension ``option`` in a space's points."""
    return f"{engine}.{option}"


#: the fewest trials a search makes by default (Tuning.trials_for)
MIN_TRIALS = 6


@dataclass(frozen=True)
class Tuning:
    """``tuning:`` of method search (perflab.lab.search)."""

    trials: int | None = None  # None: trials_for's default
    seed: int = schema.default(schema.Tuning, "seed")
    budget_engine_hours: float | None = None

    def trials_for(self, space_size: int) -> int:
        """The distinct configurations a search measures: ``trials``, else a quarter of the
        space and at least :data:`MIN_TRIALS`, never more than the space. A quarter: on seed
        002's space (162 points) 41 trials reach the grid's best for 10 of 10 seeds at 16-21 %
        of its engine-hours (benchmarks/bench_search.py). At least six: TPE starts from two
        random trials, and on the 2 x 3 x 3 space 5 trials reached within 2 % for 22-25 of 30
        seeds, 6 for 25-27 (the stored grid's figures, told without pruning)."""
        n = self.trials if self.trials is not None else max(MIN_TRIALS, math.ceil(space_size / 4))
        return max(1, min(n, space_size))


@dataclass(frozen=True)
class Timeouts:
    startup_s: float | None = None  # None: the engine plugin's own readiness timeout
    benchmark_s: float = schema.default(schema.Timeouts, "benchmark_s")
    teardown_s: float | None = None  # grace between SIGTERM and SIGKILL; None: the supervisor's
    stall_s: float | None = None  # no token on any open stream this long (engine time): stalled; None: the bench's 60
    # how long a launch waits for its devices (memory, fixed ports) to be free of other
    # processes before the study stops as "machine not ready" (perflab.lab.store.integrity)
    device_wait_s: float = schema.default(schema.Timeouts, "device_wait_s")


@dataclass(frozen=True)
class Plan:
    name: str
    model: str
    engines: tuple[str, ...]
    profiles: tuple[Profile, ...]
    main_profile: str
    baseline: Baseline
    serve: PlanServe  # what every configuration starts from: the model and the plan's serve options
    path: Path | None = None
    text: str = ""
    title: str | None = None
    objective: str = DEFAULT_OBJECTIVE
    model_name: str | None = None
    model_metadata: Mapping[str, Any] = field(default_factory=dict)
    hardware: str = schema.default(schema.PlanDocument, "hardware")
    engine_serve: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    # engine_versions: engine -> the version its commands are built for (absent: the installed
    # version, else the newest its plugin maps; perflab.contract.versions)
    engine_versions: Mapping[str, str] = field(default_factory=dict)
    candidates: tuple[Candidate, ...] = ()
    combinations: tuple[Candidate, ...] = ()
    min_success_rate: float = schema.default(schema.PlanDocument, "min_success_rate")
    min_improvement_pct: float = schema.default(schema.PlanDocument, "min_improvement_pct")
    timeouts: Timeouts = Timeouts()
    time_scale: float = 1.0
    notes: tuple[str, ...] = ()
    # simulation.engine_versions: engine -> version the simulated engines report (empty: the
    # simulated machine's defaults, the seeds' versions)
    sim_engine_versions: Mapping[str, str] = field(default_factory=dict)
    decision: Decision = field(default_factory=Decision)  # decide_by, slo, search, repeats, warmup, early_stop
    cost: Cost | None = None  # cost: {per_accelerator_hour, currency}; None: no cost figures
    accuracy: AccuracySpec | None = None  # accuracy: the gate (perflab.lab.accuracy); None: no accuracy runs
    method: str = schema.default(schema.PlanDocument, "method")  # seeds | grid | search (schema.METHODS)
    space: Space | None = None  # method grid or search: the points measured or searched
    tuning: Tuning = Tuning()

    @property
    def display_model(self) -> str:
        return self.model_name or self.model

    def profile(self, name: str) -> Profile:
        return next(p for p in self.profiles if p.name == name)

    @property
    def main(self) -> Profile:
        return self.profile(self.main_profile)

    def engine_defaults(self, engine: str) -> Configuration:
        """An engine "on defaults": the model plus the plan's common and per-engine options."""
        opts = self.serve.plan_options()
        opts = apply_delta(opts, self.engine_serve.get(engine, {}))
        return Configuration(engine, opts)

    def baseline_config(self) -> Configuration:
        return self.engine_defaults(self.baseline.engine).with_delta(self.baseline.serve)

    def sim_environment(self) -> dict[str, str]:
        """What an activated machine needs from the plan, as environment variables:
        :data:`perflab.hardware.emulation.ENGINE_VERSIONS_ENV` when ``simulation.engine_versions``
        is set (the lab adds it to the environment it activates ``sim:NAME`` hardware with)."""
        if not self.sim_engine_versions:
            return {}
        from perflab.hardware.emulation import ENGINE_VERSIONS_ENV
        from perflab.hardware.engine_versions import format_versions

        return {ENGINE_VERSIONS_ENV: format_versions(self.sim_engine_versions)}

    def variant(self, ref: str) -> tuple[Candidate, Variant]:
        """Resolve ``"Candidate/Variant"``, ``"Candidate"`` (single variant) or a unique variant name."""
        return _resolve_ref(self.candidates, ref)  # type: ignore[return-value]


# --------------------------------------------------------------------------- validation


class _Problems:
    def __init__(self) -> None:
        self.items: list[str] = []

    def add(self, key: str, message: str) -> None:
        self.items.append(f"{key}: {message}" if key else message)


_BAD = object()


def _show(value: Any) -> str:
    text = repr(value) if not isinstance(value, (dict, list)) else json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def _typename(value: Any) -> str:
    return {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean", int: "an integer",
            float: "a number", type(None): "nothing"}.get(type(value), type(value).__name__)


def _unknown_keys(p: _Problems, where: str, data: Mapping[str, Any], allowed: Iterable[str]) -> None:
    allowed = tuple(allowed)
    for key in data:
        if key in allowed:
            continue
        p.add(f"{where}.{key}" if where else str(key),
              f"unknown key{did_you_mean(key, allowed)}; expected one of: {', '.join(allowed)}")


def _mapping(p: _Problems, key: str, value: Any, what: str = "a mapping") -> Mapping[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        p.add(key, f"expected {what}, got {_typename(value)} {_show(value)}")
        return None
    return value


def _limit(name: str) -> str:
    """LIMITS[name] as a message writes it: 10_000_000, 604_800."""
    value = LIMITS[name]
    return f"{int(value):_}" if value == int(value) else f"{value:g}"


def _expected(p: _Problems, key: str, value: Any, what: str) -> Any:
    p.add(key, f"expected {what}, got {_typename(value)} {_show(value)}")
    return _BAD


def _str(p: _Problems, key: str, value: Any, what: str = "a string") -> Any:
    if isinstance(value, str) and value.strip():
        return value
    if isinstance(value, str):  # not "expected a string, got a string ''"
        p.add(key, f"expected {what} that is not blank, got {_show(value)}")
        return _BAD
    return _expected(p, key, value, what)


# a section's model and one of its keys: the type and bounds the schema declares for it
Declared = tuple[type["BaseModel"], str]


def _pos_int(p: _Problems, key: str, value: Any, what: str = "a positive integer",
             declared: Declared | None = None) -> Any:
    """A positive integer, within the bounds ``declared`` in the schema (its limit the largest it may be)."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        if declared is None or schema.fits(*declared, value):
            return value
        what = f"{what} of at most {_limit(schema.limit_of(*declared))}"
    return _expected(p, key, value, what)


def _number(p: _Problems, key: str, value: Any, what: str, declared: Declared | None = None,
            lo: float | None = None, lo_open: bool = False) -> Any:
    """A number within the bounds ``declared`` in the schema (or, for a key whose name the
    schema does not fix, at least ``lo``); ``what`` says them in words."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)
    if ok and declared is not None:
        ok = schema.fits(*declared, value)
    if ok and lo is not None:
        ok = value > lo if lo_open else value >= lo
    return float(value) if ok else _expected(p, key, value, what)


def _bool(p: _Problems, key: str, value: Any, what: str) -> Any:
    return value if isinstance(value, bool) else _expected(p, key, value, what)


def _fraction(p: _Problems, key: str, value: Any, what: str) -> Any:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and 0.0 < value <= 1.0
    return float(value) if ok else _expected(p, key, value, what)


def _port(p: _Problems, key: str, value: Any, what: str) -> Any:
    ok = isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 65535
    return value if ok else _expected(p, key, value, what)


def _plain_mapping(p: _Problems, key: str, value: Any, what: str) -> Any:
    if not isinstance(value, Mapping):
        return _expected(p, key, value, what)
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        p.add(key, f"expected {what} of plain values")
        return _BAD
    return value


def _env(p: _Problems, key: str, value: Any, what: str) -> Any:
    if not isinstance(value, Mapping) or not all(
        isinstance(v, (str, int, float, bool)) or v is None for v in value.values()
    ):
        p.add(key, f"expected {what} (NAME: value), got {_typename(value)} {_show(value)}")
        return _BAD
    return value


def _args(p: _Problems, key: str, value: Any, what: str) -> Any:
    if isinstance(value, str):
        try:
            shlex.split(value)
        except ValueError as exc:
            p.add(key, f"cannot split {value!r} into arguments ({exc})")
            return _BAD
        return value
    if not isinstance(value, list) or not all(isinstance(v, (str, int, float)) and not isinstance(v, bool) for v in value):
        return _expected(p, key, value, what)
    return value


def _devices(p: _Problems, key: str, value: Any, what: str) -> Any:
    if (
        not isinstance(value, list)
        or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)
        or len(set(value)) != len(value)
        or not value
    ):
        return _expected(p, key, value, what)
    return value


# an option's kind (perflab.contract.types.OPTION_KINDS) -> its check: the value, or _BAD with the problem added
_KIND_CHECKS = {
    "str": _str, "pos_int": _pos_int, "bool": _bool, "fraction": _fraction, "port": _port,
    "json": _plain_mapping, "options": _plain_mapping, "env": _env, "args": _args, "devices": _devices,
}


def _option_value(p: _Problems, key: str, name: str, value: Any) -> Any:
    """Check one serving option; returns the normalised value or _BAD."""
    if value is None:
        return None  # null: back to the engine's default
    opt = PLAN_OPTIONS[name]
    if _KIND_CHECKS[opt.kind](p, key, value, opt.expect) is _BAD:
        return _BAD
    return normalise(name, value)


def _options(p: _Problems, key: str, value: Any) -> dict[str, Any]:
    data = _mapping(p, key, value, "a mapping of serving options")
    if data is None:
        return {}
    out: dict[str, Any] = {}
    _unknown_keys(p, key, data, PLAN_OPTIONS)
    for name, v in data.items():
        if name not in PLAN_OPTIONS:
            continue
        checked = _option_value(p, f"{key}.{name}", name, v)
        if checked is not _BAD:
            out[name] = checked
    return out


def _engine_set(p: _Problems, key: str, value: Any, known: set[str] | None) -> dict[str, dict[str, Any]]:
    data = _mapping(p, key, value, "a mapping of engine name to serving options")
    out: dict[str, dict[str, Any]] = {}
    for engine, opts in (data or {}).items():
        if known is not None and engine not in known:
            p.add(f"{key}.{engine}", f"unknown engine {engine!r}{did_you_mean(engine, known)} "
                  f"(expected one of: {', '.join(sorted(known))})")
            continue
        out[str(engine)] = _options(p, f"{key}.{engine}", opts)
    return out


def _engine_list(p: _Problems, key: str, value: Any, known: set[str] | None, allow_winner: bool) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value:
        p.add(key, f"expected a non-empty list of engine names, got {_typename(value)} {_show(value)}")
        return None
    out: list[str] = []
    choices = sorted(known) + ([WINNER] if allow_winner else []) if known is not None else None
    for i, name in enumerate(value):
        k = f"{key}[{i}]"
        if not isinstance(name, str):
            p.add(k, f"expected an engine name, got {_typename(name)} {_show(name)}")
            continue
        if name == WINNER and allow_winner:
            out.append(name)
            continue
        if known is not None and name not in known:
            p.add(k, f"unknown engine {name!r}{did_you_mean(name, choices or [])} (expected one of: {', '.join(choices or [])})")
            continue
        if name in out:
            p.add(k, f"engine {name!r} is listed twice")
            continue
        out.append(name)
    return tuple(out)


def _profiles(p: _Problems, value: Any, base_dir: Path | None, check_files: bool) -> list[Profile]:
    if value is None:
        p.add("profiles", "missing; expected a mapping of profile name to workload "
              "(e.g. sharegpt: {dataset: sharegpt, num_prompts: 1000})")
        return []
    data = _mapping(p, "profiles", value, "a mapping of profile name to workload")
    if data is None:
        return []
    if not data:
        p.add("profiles", "expected at least one profile")
    out: list[Profile] = []
    for name, spec in data.items():
        key = f"profiles.{name}"
        what = "a mapping (dataset, input_len, output_len, num_prompts ...)"
        spec = _mapping(p, key, spec, what)
        if spec is None:
            if data[name] is None:  # `name:` with nothing after it: a workload left out, not defaults
                p.add(key, f"empty; expected {what}")
            continue
        _unknown_keys(p, key, spec, PROFILE_KEYS)
        kw: dict[str, Any] = {"name": str(name), "label": str(name)}
        ok = True
        if "label" in spec:
            v = _str(p, f"{key}.label", spec["label"])
            ok &= v is not _BAD
            kw["label"] = v
        dataset = spec.get("dataset", "random")
        if not isinstance(dataset, str) or dataset not in DATASETS:
            p.add(f"{key}.dataset", f"expected one of: {', '.join(DATASETS)}, got {_show(dataset)}")
            ok = False
        kw["dataset"] = dataset
        for n in ("input_len", "output_len", "max_concurrency", "prefix_len", "num_prefixes", "turns"):
            if spec.get(n) is not None:
                v = _pos_int(p, f"{key}.{n}", spec[n], declared=(schema.Profile, n))
                ok &= v is not _BAD
                kw[n] = v
        if "num_prompts" in spec:
            v = _pos_int(p, f"{key}.num_prompts", spec["num_prompts"], declared=(schema.Profile, "num_prompts"))
            ok &= v is not _BAD
            kw["num_prompts"] = v
        if "seed" in spec:
            v = spec["seed"]
            if not isinstance(v, int) or isinstance(v, bool) or not schema.fits(schema.Profile, "seed", v):
                p.add(f"{key}.seed", f"expected a 64-bit integer, got {_typename(v)} {_show(v)}")
                ok = False
            kw["seed"] = v
        if "request_rate" in spec:
            v = spec["request_rate"]
            # 'inf', or YAML's own infinity (.inf, a float): every request at once
            if (isinstance(v, str) and v.strip().lower() in ("inf", "infinity")) or (
                    isinstance(v, float) and math.isinf(v) and v > 0):
                kw["request_rate"] = math.inf
            else:
                r = _number(p, f"{key}.request_rate", v, "a positive number of requests per second (at most "
                            f"{_limit('request_rate')}) or 'inf'", (schema.Profile, "request_rate"))
                ok &= r is not _BAD
                kw["request_rate"] = r
        if "burstiness" in spec:
            r = _number(p, f"{key}.burstiness", spec["burstiness"], f"a positive number of at most {_limit('burstiness')}",
                        (schema.Profile, "burstiness"))
            ok &= r is not _BAD
            kw["burstiness"] = r
        if "range_ratio" in spec:
            r = _number(p, f"{key}.range_ratio", spec["range_ratio"], "a number in [0, 1)", (schema.Profile, "range_ratio"))
            ok &= r is not _BAD
            kw["range_ratio"] = r
        if "backend" in spec:
            if spec["backend"] not in BACKENDS:
                p.add(f"{key}.backend", f"expected one of: {', '.join(BACKENDS)}, got {_show(spec['backend'])}")
                ok = False
            kw["backend"] = spec["backend"]
        if "endpoint" in spec:
            v = _str(p, f"{key}.endpoint", spec["endpoint"], "a path such as /v1/chat/completions")
            ok &= v is not _BAD
            kw["endpoint"] = v
        if "dataset_path" in spec:
            v = _str(p, f"{key}.dataset_path", spec["dataset_path"], "a file path")
            if v is not _BAD:
                path = Path(v).expanduser()
                if not path.is_absolute() and base_dir is not None:
                    path = base_dir / path
                if check_files and not path.is_file():
                    p.add(f"{key}.dataset_path", f"file {str(path)!r} does not exist; expected a local dataset file")
                    ok = False
                v = str(path)
            else:
                ok = False
            kw["dataset_path"] = v
        if "sweep" in spec:
            v = _sweep(p, f"{key}.sweep", spec["sweep"])
            ok &= v is not _BAD
            kw["sweep"] = v
        if dataset == "sharegpt" and "dataset_path" not in spec:
            p.add(f"{key}.dataset_path", "missing; dataset sharegpt needs a local ShareGPT JSON file "
                  "(or use dataset: synthetic-sharegpt)")
            ok = False
        for n, takers in DATASET_ONLY.items():
            if n in spec and isinstance(dataset, str) and dataset in DATASETS and dataset not in takers:
                p.add(f"{key}.{n}", f"only for dataset {' or '.join(takers)}, not {dataset}")
                ok = False
        if ok and dataset in DATASET_NEEDS:
            needs = DATASET_NEEDS[dataset]
            for n in needs:
                if n not in kw:
                    p.add(f"{key}.{n}", f"missing; a {dataset} dataset needs {', '.join(needs)}")
                    ok = False
        profile = Profile(**kw) if ok else None
        if profile is not None and dataset == "prefix-repetition" and profile.num_prompts < profile.prefixes:
            p.add(f"{key}.num_prompts", f"{profile.num_prompts} is fewer than num_prefixes {profile.prefixes}: "
                  "every prefix needs a prompt")
            profile = None
        if profile is not None:
            out.append(profile)
    return out


def _variant(p: _Problems, key: str, value: Any, known: set[str] | None, combination: bool, default_name: str) -> Variant | None:
    data = _mapping(p, key, value, "a mapping with name and set")
    if data is None:
        return None
    _unknown_keys(p, key, data, VARIANT_KEYS if combination else CANDIDATE_VARIANT_KEYS)
    name = data.get("name", default_name)
    if _str(p, f"{key}.name", name) is _BAD:
        name = default_name
    delta = _options(p, f"{key}.set", data.get("set"))
    engine_set = _engine_set(p, f"{key}.engine_set", data.get("engine_set"), known)
    engines = _engine_list(p, f"{key}.engines", data.get("engines"), known, allow_winner=True)
    of: tuple[str, ...] = ()
    if combination:
        raw = data.get("of", [])
        if not isinstance(raw, list) or not all(isinstance(r, str) for r in raw):
            p.add(f"{key}.of", f"expected a list of candidate variant names such as ['Performance Mode', 'Max Num Seqs/512'], got {_show(raw)}")
        else:
            of = tuple(raw)
    elif "set" not in data and "engine_set" not in data:
        p.add(f"{key}.set", "missing; expected the serving options this variant changes")
    return Variant(str(name), MappingProxyType(delta), MappingProxyType(engine_set), engines, of)


def _candidates(p: _Problems, where: str, value: Any, known: set[str] | None, combination: bool) -> list[Candidate]:
    if value is None:
        return []
    if not isinstance(value, list):
        p.add(where, f"expected a list of steps, got {_typename(value)} {_show(value)}")
        return []
    out: list[Candidate] = []
    names: set[str] = set()
    for i, item in enumerate(value):
        key = f"{where}[{i}]"
        what = "a mapping with name and set (or variants)"
        data = _mapping(p, key, item, what)
        if data is None:
            if item is None:  # a bare `-`: a step left out, which must not vanish from the study
                p.add(key, f"empty; expected {what}")
            continue
        _unknown_keys(p, key, data, COMBINATION_KEYS if combination else CANDIDATE_KEYS)
        name: Any = data.get("name")  # a str once _str accepts it
        if _str(p, f"{key}.name", name) is _BAD:
            continue
        if name in names:
            p.add(f"{key}.name", f"{name!r} is used twice; expected unique step names")
        names.add(name)
        engines = _engine_list(p, f"{key}.engines", data.get("engines"), known, allow_winner=True) or (WINNER,)
        variants: list[Variant] = []
        if "variants" in data:
            if "set" in data or "of" in data:
                p.add(key, "give either variants or set/of, not both")
            raw = data["variants"]
            if not isinstance(raw, list) or not raw:
                p.add(f"{key}.variants", f"expected a non-empty list of variants, got {_show(raw)}")
            else:
                vnames: set[str] = set()
                for j, v in enumerate(raw):
                    var = _variant(p, f"{key}.variants[{j}]", v, known, combination, f"{name} {j + 1}")
                    if var is None:
                        continue
                    if var.name in vnames:
                        p.add(f"{key}.variants[{j}].name", f"{var.name!r} is used twice in {name!r}")
                    vnames.add(var.name)
                    variants.append(var)
        else:
            single = {k: data[k] for k in ("set", "engine_set", "of") if k in data}
            var = _variant(p, key, {"name": name, **single}, known, combination, name)
            if var is not None:
                variants.append(var)
        base = data.get("base", "best")
        if combination and base not in COMBINATION_BASES:
            p.add(f"{key}.base", f"expected one of: {', '.join(COMBINATION_BASES)}, got {_show(base)}")
            base = "best"
        description = data.get("description", "")
        if not isinstance(description, str):
            p.add(f"{key}.description", f"expected a string, got {_typename(description)}")
            description = ""
        out.append(Candidate(str(name), tuple(variants), engines, description, combination, base))
    return out


def _resolve_ref(candidates: Iterable[Candidate], ref: str) -> tuple[Candidate, Variant] | None:
    cands = list(candidates)
    # names may hold '/' themselves: match the whole "Candidate/Variant", never a split of it
    exact = [(c, v) for c in cands for v in c.variants if f"{c.name}/{v.name}" == ref]
    if exact:
        return exact[0]
    for c in cands:
        if c.name == ref and len(c.variants) == 1:
            return c, c.variants[0]
    hits = [(c, v) for c in cands for v in c.variants if v.name == ref]
    return hits[0] if len(hits) == 1 else None


def _model(p: _Problems, raw: Any, base_dir: Path | None, check_files: bool) -> tuple[Any, Any, Mapping[str, Any]]:
    """(model id or path, display name, metadata) of the ``model`` key."""
    if raw is None:
        p.add("model", "missing; expected a model id such as Qwen/Qwen3-32B, or {id: ..., name: ...}")
        return None, None, {}
    if isinstance(raw, str):
        return _str(p, "model", raw, "a model id or a mapping with id or path"), None, {}
    m = _mapping(p, "model", raw, "a model id or a mapping with id or path")
    if m is None:
        return None, None, {}
    _unknown_keys(p, "model", m, MODEL_KEYS)
    model_id: Any = None
    if ("id" in m) == ("path" in m):
        p.add("model", "expected exactly one of model.id or model.path")
    elif "id" in m:
        model_id = _str(p, "model.id", m["id"], "a model id such as Qwen/Qwen3-32B")
    else:
        v = _str(p, "model.path", m["path"], "a local model directory")
        if v is not _BAD:
            mp = Path(v).expanduser()
            if not mp.is_absolute() and base_dir is not None:
                mp = base_dir / mp
            if check_files and not mp.exists():
                p.add("model.path", f"{str(mp)!r} does not exist; expected a local model directory")
            model_id = str(mp)
    name = _str(p, "model.name", m["name"]) if "name" in m else None
    return model_id, None if name is _BAD else name, _mapping(p, "model.metadata", m.get("metadata")) or {}


def _baseline(p: _Problems, raw: Any, engines: tuple[str, ...] | None, known: set[str] | None) -> Baseline | None:
    if raw is None:
        return Baseline(engines[0]) if engines else None
    if isinstance(raw, str):
        if known is not None and raw not in known:
            p.add("baseline", f"unknown engine {raw!r}{did_you_mean(raw, known)} (expected one of: {', '.join(sorted(known))})")
            return None
        return Baseline(raw)
    b = _mapping(p, "baseline", raw, "an engine name or {engine: ..., serve: {...}}")
    if b is None:
        return None
    _unknown_keys(p, "baseline", b, BASELINE_KEYS)
    eng = b.get("engine", engines[0] if engines else None)
    if not isinstance(eng, str) or (known is not None and eng not in known):
        p.add("baseline.engine", f"unknown engine {_show(eng)}{did_you_mean(eng, known or []) if isinstance(eng, str) else ''} "
              f"(expected one of: {', '.join(sorted(known or []))})")
        return None
    label = b.get("label")
    if label is not None and _str(p, "baseline.label", label) is _BAD:
        label = None
    return Baseline(eng, MappingProxyType(_options(p, "baseline.serve", b.get("serve"))), label)


def _check_combination_refs(p: _Problems, candidates: list[Candidate], combinations: list[Candidate]) -> None:
    names = [f"{c.name}/{v.name}" for c in candidates for v in c.variants]
    for i, comb in enumerate(combinations):
        for j, var in enumerate(comb.variants):
            key = f"combinations[{i}].variants[{j}].of" if len(comb.variants) > 1 else f"combinations[{i}].of"
            for ref in var.of:
                if _resolve_ref(candidates, ref) is None:
                    p.add(key, f"{ref!r} names no candidate variant (expected one of: {', '.join(names) or 'none defined'})")
            if not var.of and not var.set and not var.engine_set:
                p.add(f"combinations[{i}]", "expected of (candidate variants to combine) and/or set")


def _main_profile(p: _Problems, data: Mapping[str, Any], profiles: list[Profile]) -> Any:
    main = data.get("main_profile")
    raw = data.get("profiles")
    if main is None:
        return profiles[0].name if profiles else None
    names = [str(k) for k in raw] if isinstance(raw, Mapping) else []
    if not isinstance(main, (str, int)) or isinstance(main, bool):
        return _expected(p, "main_profile", main, f"a profile name (one of: {', '.join(names)})")
    if isinstance(raw, Mapping) and str(main) not in names:
        p.add("main_profile", f"{_show(main)} is not a profile (expected one of: {', '.join(names)})")
    return str(main)  # profile names are strings (Profile.name), whatever YAML made of the key


def _timeouts(p: _Problems, raw: Any) -> Timeouts:
    t = _mapping(p, "timeouts", raw)
    if t is None:
        return Timeouts()
    _unknown_keys(p, "timeouts", t, TIMEOUT_KEYS)
    values: dict[str, float] = {}
    for k in TIMEOUT_KEYS:
        if k in t:
            zero_ok = k == "device_wait_s"  # 0: do not wait, stop at once
            v = _number(p, f"timeouts.{k}", t[k], ("a non-negative number of seconds" if zero_ok else
                        "a positive number of seconds") + f" of at most {_limit('timeout_s')}", (schema.Timeouts, k))
            if v is not _BAD:
                values[k] = v
    return Timeouts(**values)


def _time_scale(p: _Problems, raw: Any) -> float:
    s = _mapping(p, "simulation", raw)
    if s is None:
        return 1.0
    _unknown_keys(p, "simulation", s, SIMULATION_KEYS)
    if "time_scale" not in s:
        return 1.0
    v = _number(p, "simulation.time_scale", s["time_scale"],
                f"a number from 1 to {_limit('time_scale')} (simulated seconds per real second)",
                (schema.Simulation, "time_scale"))
    return 1.0 if v is _BAD else v


def _cost(p: _Problems, raw: Any) -> Cost | None:
    """``cost: {per_accelerator_hour: 2.50, currency: USD}`` (currency: 3 letters, default USD)."""
    c = _mapping(p, "cost", raw, "a mapping such as {per_accelerator_hour: 2.50, currency: USD}")
    if c is None:
        return None
    _unknown_keys(p, "cost", c, COST_SECTION_KEYS)
    if "per_accelerator_hour" not in c:
        p.add("cost.per_accelerator_hour", "missing; expected the price of one accelerator for one hour, e.g. 2.50")
        return None
    price = _number(p, "cost.per_accelerator_hour", c["per_accelerator_hour"],
                    f"a positive price per accelerator-hour of at most {_limit('per_accelerator_hour')}",
                    (schema.Cost, "per_accelerator_hour"))
    currency = c.get("currency", DEFAULT_CURRENCY)
    if not isinstance(currency, str) or not schema.fits(schema.Cost, "currency", currency):
        p.add("cost.currency", f"expected a three-letter currency code such as USD or EUR, got {_show(currency)}")
        return None
    return None if price is _BAD else Cost(float(price), currency.upper())


def _accuracy(p: _Problems, raw: Any, check_available: bool, base_dir: Path | None = None) -> AccuracySpec | None:
    """``accuracy: {task: perflab_arith, max_drop: 1.0, agreement: true, ...}`` (perflab.lab.accuracy);
    ``accuracy: {}`` takes every default. A task needs lm-evaluation-harness: without it the
    plan is refused here, with the install hint (``check_available``: not when re-reading a
    finished study's plan, which measures nothing)."""
    if raw is None:  # ``accuracy:`` with nothing after it: the defaults
        raw = {}
    a = _mapping(p, "accuracy", raw, "a mapping such as {task: perflab_arith, max_drop: 1.0, agreement: true}")
    if a is None:
        return None
    _unknown_keys(p, "accuracy", a, ACCURACY_SECTION_KEYS)
    kw: dict[str, Any] = {}
    ok = True
    if "task" in a:
        v = a["task"]
        if v is not None and _str(p, "accuracy.task", v, "an lm-eval task name such as perflab_arith or gsm8k, or null") is _BAD:
            ok = False
        elif isinstance(v, str) and Path(v).suffix.lower() in (".jsonl", ".yaml", ".yml"):
            path = Path(v).expanduser()  # a task file: relative to the plan, as dataset_path is
            v = str(base_dir / path if not path.is_absolute() and base_dir is not None else path)
        kw["task"] = v
    for key in ("limit", "concurrency"):
        if a.get(key) is not None:
            v = _pos_int(p, f"accuracy.{key}", a[key], declared=(schema.Accuracy, key))
            ok &= v is not _BAD
            kw[key] = v
    for key in ("max_drop", "agreement_margin"):
        if key in a:
            v = _number(p, f"accuracy.{key}", a[key], f"a number of points from 0 to {_limit('accuracy_points')}",
                        (schema.Accuracy, key))
            ok &= v is not _BAD
            kw[key] = v
    if "agreement" in a:
        v = _bool(p, "accuracy.agreement", a["agreement"], "true or false")
        ok &= v is not _BAD
        kw["agreement"] = v
    if "api" in a:
        if a["api"] not in APIS:
            p.add("accuracy.api", f"expected one of: {', '.join(APIS)}, got {_show(a['api'])}")
            ok = False
        kw["api"] = a["api"]
    if "timeout_s" in a:
        v = _number(p, "accuracy.timeout_s", a["timeout_s"], f"a positive number of seconds of at most {_limit('timeout_s')}",
                    (schema.Accuracy, "timeout_s"))
        ok &= v is not _BAD
        kw["timeout_s"] = v
    if "lossless" in a:
        v = a["lossless"]
        if not isinstance(v, list) or not all(isinstance(k, str) for k in v):
            _expected(p, "accuracy.lossless", v, f"a list of serving option names such as [{', '.join(sorted(PLAN_OPTIONS)[:2])}]")
            ok = False
        else:
            for i, k in enumerate(v):
                if k not in PLAN_OPTIONS:
                    p.add(f"accuracy.lossless[{i}]", f"unknown serving option {k!r}{did_you_mean(k, PLAN_OPTIONS)}"
                          f"; expected one of: {', '.join(PLAN_OPTIONS)}")
                    ok = False
                elif k in NEVER_LOSSLESS:
                    p.add(f"accuracy.lossless[{i}]", f"{k!r} changes the weights or the precision the answers are "
                          "computed with: it cannot be declared lossless (its candidates are scored on the task)")
                    ok = False
            kw["lossless"] = tuple(v)
    if not ok:
        return None
    spec = AccuracySpec(**kw)
    if spec.task is None and not spec.agreement:
        p.add("accuracy", "nothing to measure: task is null and agreement is false (remove accuracy: to measure none)")
        return None
    if spec.task is not None and check_available:
        from perflab.accuracy.harness import ensure_available
        from perflab.contract.errors import PerflabError

        try:
            ensure_available()
            _check_task(spec.task)
        except PerflabError as exc:
            p.add("accuracy.task", str(exc))
            return None
    return spec


def _check_task(task: str) -> None:
    """Raise the harness's one-line UsageError for a task it would not run: a task file that is
    not one, or a name lm-eval does not know (its task index: seconds, for names only)."""
    from perflab.accuracy.harness import check_task

    check_task(task)


def _engine_versions(p: _Problems, raw: Any, known: set[str] | None) -> dict[str, str]:
    """``engine_versions: {sglang: "0.5.23"}``: a quoted version per registered engine."""
    from perflab.contract.versions import version_key

    data = _mapping(p, "engine_versions", raw, "a mapping of engine name to version")
    out: dict[str, str] = {}
    for engine, version in (data or {}).items():
        where = f"engine_versions.{engine}"
        if known is not None and engine not in known:
            p.add(where, f"unknown engine {engine!r}{did_you_mean(engine, known)} (expected one of: {', '.join(sorted(known))})")
            continue
        if not isinstance(version, str):
            # YAML reads 0.10 as the number 0.1: a version must be quoted to survive
            p.add(where, f"expected a version string such as '0.5.23' (quote it), got {_show(version)}")
            continue
        try:
            version_key(version)
        except UsageError as exc:
            p.add(where, str(exc))
            continue
        out[str(engine)] = version.strip()
    return out


def _sim_engine_versions(p: _Problems, raw: Any) -> dict[str, str]:
    if not isinstance(raw, Mapping) or "engine_versions" not in raw:
        return {}  # a simulation key that is not a mapping is reported once, by _time_scale
    s = raw
    key = "simulation.engine_versions"
    versions = _mapping(p, key, s["engine_versions"])
    if versions is None:
        return {}
    from perflab.hardware import engine_versions as sim_versions

    out: dict[str, str] = {}
    for engine, version in versions.items():
        where = f"{key}.{engine}"
        if not isinstance(version, str):
            # YAML reads 0.10 as the number 0.1: a version must be quoted to survive
            p.add(where, f"expected a version string such as '0.17.1' (quote it), got {_show(version)}")
            continue
        try:
            out[sim_versions.engine_name(str(engine))] = sim_versions.check_version(str(engine), version)
        except UsageError as exc:
            p.add(where, str(exc).split(": ", 1)[-1])
    return out


def _sweep(p: _Problems, key: str, value: Any) -> Any:
    """``sweep: {max_concurrency: [1, 4, 16]}`` or ``{request_rate: [1, 2, 4]}``: ascending."""
    kinds = ", ".join(str(k) for k in LoadKind)
    if not isinstance(value, Mapping) or len(value) != 1 or next(iter(value)) not in set(LoadKind):
        return _expected(p, key, value, f"a mapping with one of {kinds} and a list of loads, e.g. {{max_concurrency: [1, 4, 16]}}")
    name, loads = next(iter(value.items()))
    kind = LoadKind(name)
    integer = kind is LoadKind.MAX_CONCURRENCY
    what = f"positive {'integers' if integer else 'numbers'} of at most {_limit(str(kind))}"
    ok = isinstance(loads, list) and schema.fits(schema.Sweep, name, loads)
    if not ok:
        return _expected(p, f"{key}.{name}", loads, f"a list of 1 to {_limit('sweep')} {what}")
    if any(b <= a for a, b in itertools.pairwise(loads)):
        return _expected(p, f"{key}.{name}", loads, f"{what} in ascending order, each once")
    return Sweep(kind, tuple(int(v) if integer else float(v) for v in loads))


def _decision(p: _Problems, data: Mapping[str, Any]) -> Decision:
    """The decision keys (perflab.lab.decide), each checked; defaults are the seeds' method."""
    kw: dict[str, Any] = {}
    raw = data.get("decide_by", str(DecideBy.THROUGHPUT))
    if not isinstance(raw, str) or raw not in set(DecideBy):
        p.add("decide_by", f"expected one of: {', '.join(DecideBy)}, got {_show(raw)}")
    else:
        kw["decide_by"] = DecideBy(raw)
    slo = _mapping(p, "slo", data.get("slo"), "a mapping such as {tpot_ms: 50, percentile: 99}")
    if slo is not None:
        _unknown_keys(p, "slo", slo, SLO_SECTION_KEYS)
        limits: dict[str, Any] = {}
        for name in SLO_SECTION_KEYS:
            if name not in slo:
                continue
            if name == "percentile":
                v = _number(p, "slo.percentile", slo[name], "a percentile in (0, 100]", (schema.Slo, name))
            else:
                v = _number(p, f"slo.{name}", slo[name], f"a positive number of milliseconds of at most {_limit('slo_ms')}",
                            (schema.Slo, name))
            if v is not _BAD:
                limits[name] = float(v)
        kw["slo"] = Slo(**limits)
        if not kw["slo"] and not any(k in slo for k in SLO_SECTION_KEYS if k != "percentile"):
            p.add("slo", "expected at least one limit: ttft_ms, tpot_ms or e2el_ms")
    decide_by = kw.get("decide_by")
    if decide_by is not None and decide_by.needs_slo and slo is None:
        p.add("slo", f"missing; decide_by: {decide_by} needs latency limits, e.g. slo: {{tpot_ms: 50, percentile: 99}}")
    if "search" in data:
        if not isinstance(data["search"], str) or data["search"] not in set(LoadKind):
            p.add("search", f"expected one of: {', '.join(LoadKind)}, got {_show(data['search'])}")
        else:
            kw["search"] = LoadKind(data["search"])
    if "repeats" in data:
        v = _pos_int(p, "repeats", data["repeats"], declared=(schema.PlanDocument, "repeats"))
        if v is not _BAD:
            kw["repeats"] = v
    if "warmup" in data:
        v = data["warmup"]
        if not isinstance(v, int) or isinstance(v, bool) or not schema.fits(schema.PlanDocument, "warmup", v):
            p.add("warmup", f"expected a number of requests (0 to {_limit('warmup')}), got {_typename(v)} {_show(v)}")
        else:
            kw["warmup"] = v
    if "early_stop" in data:
        v = _bool(p, "early_stop", data["early_stop"], "true or false")
        if v is not _BAD:
            kw["early_stop"] = v
    return Decision(**kw)


def _method(p: _Problems, data: Mapping[str, Any], engines: tuple[str, ...] | None,
            known: set[str] | None) -> tuple[str, Space | None, Tuning]:
    """``method``, ``space`` and ``tuning``: each checked, and that they fit together."""
    method = data.get("method", schema.default(schema.PlanDocument, "method"))
    if not isinstance(method, str) or method not in schema.METHODS:
        p.add("method", f"expected one of: {', '.join(schema.METHODS)}, got {_show(method)}")
        method = schema.default(schema.PlanDocument, "method")
    space: Space | None = None
    raw = _mapping(p, "space", data.get("space"), "a mapping of engine and serving options to lists of values")
    if raw is not None:
        _unknown_keys(p, "space", raw, SPACE_KEYS)
        space_engines = _engine_list(p, "space.engine", raw["engine"], known, allow_winner=False) \
            if raw.get("engine") is not None else engines
        options: dict[str, tuple[Any, ...]] = {}
        for name, values in raw.items():
            if name in ("engine", schema.ENGINE_OPTIONS) or name not in SPACE_KEYS:
                continue
            if not isinstance(values, list) or not values:
                p.add(f"space.{name}", f"expected a non-empty list of values, got {_typename(values)} {_show(values)}")
                continue
            checked = [_option_value(p, f"space.{name}[{i}]", name, v) for i, v in enumerate(values)]
            if any(c is _BAD for c in checked):
                continue
            if len(set(map(repr, checked))) != len(checked):
                p.add(f"space.{name}", f"a value is listed twice in {_show(values)}")
                continue
            options[name] = tuple(checked)
        per_engine = _space_engine_options(p, raw.get(schema.ENGINE_OPTIONS), space_engines, known)
        if space_engines is not None:
            space = Space(space_engines, MappingProxyType(options), MappingProxyType(per_engine))
            if space.size > schema.SPACE_POINTS:
                p.add("space", f"{space.size:_} points; at most {schema.SPACE_POINTS:_} (a grid that size is a typo)")
    if method != "seeds" and raw is None:
        p.add("space", f"missing; method: {method} needs the space, e.g. space: {{engine: [vllm, sglang], "
                       f"max_num_seqs: [64, 256]}}")
    if method == "seeds" and raw is not None:
        p.add("space", "only with method: grid or method: search (the seeds' method takes candidates)")
    if method == "grid" and (data.get("candidates") or data.get("combinations")):
        # method: search takes them: the seeds' method runs first and the search is measured against its pick
        p.add("candidates", "only with method: seeds or search; method: grid measures every point of space")
    t = _mapping(p, "tuning", data.get("tuning"), "a mapping such as {trials: 20, seed: 1}")
    tuning = Tuning()
    if t is not None:
        if method != "search":
            p.add("tuning", "only with method: search")
        _unknown_keys(p, "tuning", t, TUNING_KEYS)
        kw: dict[str, Any] = {}
        if t.get("trials") is not None:
            kw["trials"] = _pos_int(p, "tuning.trials", t["trials"], declared=(schema.Tuning, "trials"))
        if "seed" in t:
            v = t["seed"]
            if not isinstance(v, int) or isinstance(v, bool) or not schema.fits(schema.Tuning, "seed", v):
                p.add("tuning.seed", f"expected an integer in [0, 2**32 - 1], got {_typename(v)} {_show(v)}")
            else:
                kw["seed"] = v
        if t.get("budget_engine_hours") is not None:
            kw["budget_engine_hours"] = _number(
                p, "tuning.budget_engine_hours", t["budget_engine_hours"],
                f"a positive number of engine-hours of at most {_limit('budget_engine_hours')}",
                (schema.Tuning, "budget_engine_hours"))
        if not any(v is _BAD for v in kw.values()):
            tuning = Tuning(**kw)
    return method, space, tuning


def _space_engine_options(p: _Problems, raw: Any, engines: tuple[str, ...] | None,
                          known: set[str] | None) -> dict[str, Mapping[str, tuple[Any, ...]]]:
    """``space.engine_options``: engine -> engine-specific option -> its values, each a plain
    scalar (the plugin, not the plan, knows its options: one it refuses makes that engine's
    points unsupported, skipped without a launch)."""
    key = f"space.{schema.ENGINE_OPTIONS}"
    data = _mapping(p, key, raw, "a mapping of engine name to {option: [values]}")
    out: dict[str, Mapping[str, tuple[Any, ...]]] = {}
    for engine, opts in (data or {}).items():
        where = f"{key}.{engine}"
        if known is not None and engine not in known:
            p.add(where, f"unknown engine {engine!r}{did_you_mean(str(engine), known)} "
                  f"(expected one of: {', '.join(sorted(known))})")
            continue
        if engines is not None and engine not in engines:
            p.add(where, f"engine {engine!r} is not one of the space's engines ({', '.join(engines)})")
            continue
        table = _mapping(p, where, opts, "a mapping of engine-specific option to a list of values")
        dims: dict[str, tuple[Any, ...]] = {}
        for name, values in (table or {}).items():
            k = f"{where}.{name}"
            if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_-]*", name):
                p.add(k, f"expected an option name (letters, digits, _ and -), got {_show(name)}")
                continue
            if not isinstance(values, list) or not values:
                p.add(k, f"expected a non-empty list of values, got {_typename(values)} {_show(values)}")
                continue
            bad = [v for v in values if v is not None and not isinstance(v, (str, int, float, bool))]
            if bad:
                p.add(k, f"expected plain values (string, number, boolean or null), got {_show(bad[0])}")
                continue
            if len(set(map(repr, values))) != len(values):
                p.add(k, f"a value is listed twice in {_show(values)}")
                continue
            dims[name] = tuple(values)
        if dims:
            out[str(engine)] = MappingProxyType(dims)
    return out


def _guards(p: _Problems, raw: Any) -> Guards:
    """``guards:``: latency metrics' limits in ms (``p99_tpot_ms: 200``), ``max_regression``
    (``{mean_ttft_ms: 0.2}``: at most 20 % worse than the baseline) and
    ``latency_regression_pct`` (the report's flag, default 10), each checked here."""
    g = _mapping(p, "guards", raw, "a mapping such as {p99_tpot_ms: 200, max_regression: {mean_ttft_ms: 0.2}}")
    if g is None:
        return Guards()
    metric = "a latency metric such as p99_tpot_ms or mean_ttft_ms (mean, median or pNN of ttft, tpot, itl, e2el)"
    kw: dict[str, Any] = {}
    limits: list[tuple[str, float]] = []
    for key, value in g.items():
        if key == "latency_regression_pct":
            v = _number(p, "guards.latency_regression_pct", value, "a non-negative percentage such as 10",
                        (schema.Guards, "latency_regression_pct"))
            if v is not _BAD:
                kw["latency_regression_pct"] = v
        elif key == "max_regression":
            reg = _mapping(p, "guards.max_regression", value, "a mapping such as {mean_ttft_ms: 0.2} (20 % at most)")
            pairs = []
            for k, frac in (reg or {}).items():
                if not is_latency_metric(k):
                    p.add(f"guards.max_regression.{k}", f"unknown metric; expected {metric}")
                    continue
                v = _number(p, f"guards.max_regression.{k}", frac,
                            "a non-negative fraction of the baseline's figure such as 0.2 (20 %)", lo=0.0)
                if v is not _BAD:
                    pairs.append((k, v))
            kw["max_regression"] = tuple(pairs)
        elif is_latency_metric(key):
            v = _number(p, f"guards.{key}", value, "a positive number of milliseconds", lo=0.0, lo_open=True)
            if v is not _BAD:
                limits.append((key, v))
        else:
            p.add(f"guards.{key}", f"unknown key; expected {metric}, max_regression or latency_regression_pct")
    return Guards(limits=tuple(limits), **kw)


def _fraction_or_percent(value: Any) -> Any:
    """``0.9`` or ``"90%"`` -> 0.9 (anything else unchanged, for the checker to report)."""
    if isinstance(value, str) and value.strip().endswith("%"):
        try:
            return float(value.strip()[:-1]) / 100.0
        except ValueError:
            return value
    return value


def _optional_str(p: _Problems, data: Mapping[str, Any], key: str, default: Any, what: str = "a string") -> Any:
    value = data.get(key, default)
    if value is None or _str(p, key, value, what) is not _BAD:
        return value
    return default


def parse_plan(
    data: Any,
    *,
    path: Path | None = None,
    text: str = "",
    known_engines: Iterable[str] | None = None,
    check_files: bool = True,
) -> Plan:
    """Validate a parsed plan document; raise UsageError listing every problem.

    ``known_engines`` None skips the engine-name check; ``check_files`` False skips checking
    that local files exist (re-reading a finished study's plan elsewhere)."""
    label = str(path) if path is not None else "plan"
    if not isinstance(data, Mapping):
        raise UsageError(f"{label}: expected a mapping of plan keys ({', '.join(TOP_KEYS[:8])} ...), got {_typename(data)}")
    p = _Problems()
    known = set(known_engines) if known_engines is not None else None
    base_dir = path.parent if path is not None else None
    _unknown_keys(p, "", data, TOP_KEYS)
    if "version" in data and (type(data["version"]) is not int or data["version"] != 1):  # YAML's true == 1
        p.add("version", f"expected 1, got {_show(data['version'])}")

    model_id, model_name, metadata = _model(p, data.get("model"), base_dir, check_files)
    hardware = data.get("hardware", schema.default(schema.PlanDocument, "hardware"))
    if not isinstance(hardware, str) or not (hardware == "auto" or (hardware.startswith("sim:") and len(hardware) > 4)):
        p.add("hardware", f"expected 'auto' or 'sim:NAME' (e.g. sim:a100-80g-x8), got {_show(hardware)}")
    engines = _engine_list(p, "engines", data.get("engines"), known, allow_winner=False)
    if data.get("engines") is None:  # absent, or null (``engines:`` with nothing after it)
        p.add("engines", "missing; expected the list of engines to compare, e.g. [vllm, sglang]")
    serve = _options(p, "serve", data.get("serve"))
    if "model" in serve:
        p.add("serve.model", "set the model with the top-level model key")
    engine_serve = _engine_set(p, "engine_serve", data.get("engine_serve"), known)
    engine_versions = _engine_versions(p, data.get("engine_versions"), known)
    baseline = _baseline(p, data.get("baseline"), engines, known)
    candidates = _candidates(p, "candidates", data.get("candidates"), known, combination=False)
    combinations = _candidates(p, "combinations", data.get("combinations"), known, combination=True)
    _check_combination_refs(p, candidates, combinations)
    profiles = _profiles(p, data.get("profiles"), base_dir, check_files)
    main_profile = _main_profile(p, data, profiles)
    min_success = _number(p, "min_success_rate", _fraction_or_percent(data.get("min_success_rate", Plan.min_success_rate)),
                          "a fraction in [0, 1] such as 0.9 (or '90%')", (schema.PlanDocument, "min_success_rate"))
    min_improvement = _number(p, "min_improvement_pct", data.get("min_improvement_pct", Plan.min_improvement_pct),
                              f"a non-negative percentage of at most {_limit('min_improvement_pct')}",
                              (schema.PlanDocument, "min_improvement_pct"))
    timeouts = _timeouts(p, data.get("timeouts"))
    decision = replace(_decision(p, data), guards=_guards(p, data.get("guards")))
    time_scale = _time_scale(p, data.get("simulation"))
    sim_engine_versions = _sim_engine_versions(p, data.get("simulation"))
    cost = _cost(p, data.get("cost"))
    accuracy = _accuracy(p, data.get("accuracy"), check_files, base_dir) if "accuracy" in data else None
    method, space, tuning = _method(p, data, engines, known)
    if any(pr.name == ACCURACY_PROFILE for pr in profiles):
        p.add(f"profiles.{ACCURACY_PROFILE}", "the name is reserved for the accuracy measurement; choose another")
    title = _optional_str(p, data, "title", None)
    objective = _optional_str(p, data, "objective", DEFAULT_OBJECTIVE)
    name = _optional_str(p, data, "name", None, "a short study name")
    if isinstance(name, str) and not re.fullmatch(schema.STUDY_NAME, name):
        # the name becomes perflab-studies/<name>: no separator, no '..', nothing hidden
        p.add("name", f"expected a short study name of letters, digits, '.', '_' or '-' (no '/', no '..'), got {_show(name)}")
    notes = data.get("notes", [])
    if not isinstance(notes, list) or not all(isinstance(n, str) for n in notes):
        p.add("notes", f"expected a list of strings, got {_show(notes)}")

    if p.items:
        count = f"{len(p.items)} problems: " if len(p.items) > 1 else ""
        raise UsageError(f"{label}: {count}{'; '.join(p.items)}")
    if model_id is None or engines is None or baseline is None or main_profile is None:
        # every path to a missing piece adds a problem above; this is the net under them
        raise UsageError(f"{label}: incomplete plan: expected model, engines, profiles and a baseline")
    return Plan(
        name=name or (path.stem if path is not None else "study"),
        model=model_id,
        engines=engines,
        profiles=tuple(profiles),
        main_profile=main_profile,
        baseline=baseline,
        path=path,
        text=text,
        title=title,
        objective=objective,
        model_name=model_name,
        model_metadata=MappingProxyType(dict(metadata)),
        hardware=hardware,
        serve=PlanServe.from_plan(model_id, serve),
        engine_serve=MappingProxyType({k: MappingProxyType(v) for k, v in engine_serve.items()}),
        engine_versions=MappingProxyType(engine_versions),
        candidates=tuple(candidates),
        combinations=tuple(combinations),
        min_success_rate=min_success,
        min_improvement_pct=min_improvement,
        timeouts=timeouts,
        time_scale=time_scale,
        notes=tuple(notes),
        sim_engine_versions=MappingProxyType(sim_engine_versions),
        decision=decision,
        cost=cost,
        accuracy=accuracy,
        method=method,
        space=space,
        tuning=tuning,
    )


# A plan is a few hundred nodes; a document whose aliases expand past this is an attack
# ("billion laughs"), refused before anything walks the expanded tree.
MAX_YAML_NODES = 100_000


def _yaml_expanded_size(node: yaml.Node, limit: int) -> int:
    """The number of nodes ``node`` expands to once every alias is followed (a shared
    node counts each time it is referenced); stops counting past ``limit``."""
    memo: dict[int, int] = {}
    active: set[int] = set()

    def size(n: yaml.Node) -> int:
        key = id(n)
        if key in memo:
            return memo[key]
        if key in active:  # a recursive alias: it expands forever
            return limit + 1
        active.add(key)
        total = 1
        if isinstance(n, yaml.SequenceNode):
            for child in n.value:
                total += size(child)
                if total > limit:
                    break
        elif isinstance(n, yaml.MappingNode):
            for k, v in n.value:
                total += size(k) + size(v)
                if total > limit:
                    break
        active.discard(key)
        memo[key] = total
        return total

    return size(node)


def safe_load_bounded(text: str, label: str, limit: int = MAX_YAML_NODES) -> Any:
    """``yaml.safe_load`` that refuses documents whose anchors/aliases expand past ``limit`` nodes."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        if _yaml_expanded_size(node, limit) > limit:
            raise UsageError(f"{label}: refused: its YAML aliases expand to more than {limit} nodes "
                             f"(a plan needs a few hundred; remove the alias bomb)")
        return loader.construct_document(node)
    finally:
        loader.dispose()


def read_text(path: Path) -> str:
    """Read a plan file; one-line UsageError on any problem."""
    if not path.exists():
        raise UsageError(f"{path}: no such plan file; expected a YAML or TOML plan (see docs/plan-reference.md)")
    if not path.is_file():
        raise UsageError(f"{path}: not a file; expected a YAML or TOML plan")
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: cannot read ({exc})") from None


def load_plan(path: str | Path, known_engines: Iterable[str] | None = None) -> Plan:
    """Read, parse and validate a plan file."""
    path = Path(path)
    return load_plan_text(read_text(path), path=path, known_engines=known_engines)


def load_plan_text(text: str, *, path: str | Path = "plan.yaml", known_engines: Iterable[str] | None = None,
                   check_files: bool = True) -> Plan:
    """Parse a plan given as text (the embedded demo plan, a study's stored copy, tests);
    ``path`` names it in messages, gives its format (.toml or YAML) and resolves relative files."""
    path = Path(path)
    if path.suffix.lower() == ".toml":
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise UsageError(f"{path}: invalid TOML ({exc})") from None
    else:
        try:
            data = safe_load_bounded(text, str(path))
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
            problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
            raise UsageError(f"{path}: {where}invalid YAML ({problem})") from None
    redact.register(redact.secrets_in(data))  # before a validation message can quote one
    return parse_plan(data, path=path, text=text, known_engines=known_engines, check_files=check_files)


def engines_of(plan: Plan) -> list[str]:
    """Every engine a plan may launch (``winner`` is one of plan.engines)."""
    out = list(plan.engines) + [e for e in (plan.space.engines if plan.space else ()) if e not in plan.engines]
    for name in [plan.baseline.engine] + [e for c in (*plan.candidates, *plan.combinations) for e in c.engines] + [
        e for c in (*plan.candidates, *plan.combinations) for v in c.variants for e in (v.engines or ())
    ]:
        if name != WINNER and name not in out:
            out.append(name)
    return out


def reference_config(plan: Plan, engine: str) -> Configuration:
    """The configuration ``engine``'s candidates are compared with: the baseline for its
    engine, the engine's defaults for the others."""
    return plan.baseline_config() if engine == plan.baseline.engine else plan.engine_defaults(engine)


def space_config(plan: Plan, point: Mapping[str, Any]) -> Configuration:
    """A point of ``plan.space`` (``{"engine": ..., option: value}``) as the configuration
    measured: the engine's defaults in this plan with the point's options (None: the engine's own)."""
    engine = point["engine"]
    prefix = engine_dim(engine, "")
    cfg = plan.engine_defaults(engine).with_delta({k: v for k, v in point.items() if k != "engine" and "." not in k})
    own = {k[len(prefix):]: v for k, v in point.items() if k.startswith(prefix)}
    if not own:
        return cfg
    merged = dict(cfg.options.get(schema.ENGINE_OPTIONS) or {})
    for k, v in own.items():  # None: the engine's own default, so the key goes
        if v is None:
            merged.pop(k, None)
        else:
            merged[k] = v
    return Configuration(engine, {**cfg.options, schema.ENGINE_OPTIONS: merged})


def job_for(plan: Plan, config: Configuration) -> AccuracyJob | None:
    """The accuracy measurement ``config`` needs in a study of ``plan`` (None: no gate)."""
    spec = plan.accuracy
    if spec is None:
        return None
    ref = reference_config(plan, config.engine)
    reference = ref.canonical() == config.canonical()
    task = spec.task is not None and (reference or not is_lossless(spec, ref, config))
    return AccuracyJob(spec, reference, task)
