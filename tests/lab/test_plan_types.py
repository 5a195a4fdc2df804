"""Every plan key, at every depth, given every wrong YAML type gets a one-line UsageError naming
the key (never a traceback: AssertionError, TypeError 'unhashable type' ...); and plan errors
that used to surface only after an engine started are refused when the plan is read."""

from __future__ import annotations

import copy
import datetime
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from perflab.contract.errors import UsageError
from perflab.lab.plan import LIMITS, parse_plan

KNOWN = ["vllm", "vllm-ascend", "sglang", "trtllm", "mindie"]

# A plan that uses every key the schema has (each profile kind, variants, combinations,
# options of every kind), so that walking it reaches every key at every depth.
FULL = yaml.safe_load("""
version: 1
name: full
title: Every key
objective: Everything at once.
model: {id: Qwen/Qwen3-32B, name: Qwen3-32B, metadata: {params: 32B}}
hardware: sim:a100-80g-x8
engines: [vllm, sglang]
serve: {max_model_len: 32768, tp: 2, prefix_caching: true, mem_fraction: 0.9, kv_cache_dtype: fp8,
        extra_args: [--seed, 1], env: {A: b}, engine_options: {x: 1}, devices: [0, 1], replicas: 1,
        served_model_name: qwen, pp: 1, dp: 1, nodes: 1, ep: 1, max_batched_tokens: 8192, max_num_seqs: 256,
        chunked_prefill: true, speculative_config: {method: ngram}, reasoning_parser: qwen3, quantization: awq}
engine_serve: {sglang: {mem_fraction: 0.85}}
engine_versions: {sglang: "0.5.23"}
baseline: {engine: vllm, serve: {max_num_seqs: 256}, label: Defaults}
candidates:
  - name: Quantization
    engines: [winner, vllm]
    description: fp8
    variants:
      - {name: FP8, set: {quantization: fp8, model: Qwen/Qwen3-32B-FP8}, engine_set: {vllm: {max_num_seqs: 128}},
         engines: [vllm]}
  - {name: Perf, set: {extra_args: "--performance-mode=throughput"}}
combinations:
  - {name: Both, of: [Quantization/FP8, Perf], base: best, description: all, engines: [winner]}
profiles:
  short: {label: Short Prompt, dataset: random, input_len: 128, output_len: 4, num_prompts: 100, request_rate: inf,
          max_concurrency: 8, seed: 1, backend: openai-chat, endpoint: /v1/chat/completions, burstiness: 1.0,
          range_ratio: 0.1, prefix_len: 4}
  curve: {dataset: synthetic-sharegpt, num_prompts: 64, sweep: {max_concurrency: [1, 4]}}
  prefixes: {dataset: prefix-repetition, prefix_len: 16, num_prefixes: 2, input_len: 8, output_len: 4, num_prompts: 8}
  chat: {dataset: multi-turn, turns: 2, input_len: 8, output_len: 4, num_prompts: 8}
  gpt: {dataset: sharegpt, dataset_path: sharegpt.json, num_prompts: 8}
main_profile: short
min_success_rate: 0.9
min_improvement_pct: 1
timeouts: {startup_s: 60, benchmark_s: 600, teardown_s: 5, stall_s: 30, device_wait_s: 0}
simulation: {time_scale: 20, engine_versions: {vllm: "0.11.0"}}
decide_by: throughput
slo: {tpot_ms: 50, ttft_ms: 2000, e2el_ms: 9000, percentile: 99}
search: max_concurrency
repeats: 2
warmup: 4
early_stop: true
cost: {per_accelerator_hour: 2.5, currency: USD}
guards: {p99_tpot_ms: 200, max_regression: {mean_ttft_ms: 0.2}, latency_regression_pct: 10}
accuracy: {task: perflab_arith, limit: 100, max_drop: 1.0, agreement: true, agreement_margin: 10, concurrency: 8,
           api: chat, lossless: [extra_args], timeout_s: 600}
notes: [one, two]
""")

# the same with the model given by path (model.id and model.path exclude each other)
FULL_BY_PATH = {**FULL, "model": {"path": "weights/qwen3", "name": "Qwen3-32B", "metadata": {"params": "32B"}}}

# method: search, with every key of space and tuning (without candidates: the search alone)
FULL_SEARCH = {**{k: v for k, v in FULL.items() if k not in ("candidates", "combinations")}, "method": "search",
               "space": {"engine": ["vllm", "sglang"], "model": ["Qwen/Qwen3-32B", "Qwen/Qwen3-32B-FP8"],
                         **{k: [None] for k in ("served_model_name", "tp", "pp", "dp", "nodes", "ep", "max_model_len",
                                                "max_batched_tokens", "max_num_seqs", "quantization", "kv_cache_dtype",
                                                "prefix_caching", "chunked_prefill", "mem_fraction", "reasoning_parser",
                                                "replicas")},
                         "engine_options": {"vllm": {"block_size": [None]}}},
               "tuning": {"trials": 8, "seed": 1, "budget_engine_hours": 12.5}}

WRONG: dict[str, Any] = {
    "null": None, "bool": True, "int": 7, "float": 2.5, "str": "text", "list": [1, "a"], "mapping": {"k": [1]},
    "timestamp": datetime.date(2024, 1, 1),  # YAML's `2024-01-01` (and TOML's dates)
}


def _paths(node: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every key path of a YAML document (mapping keys and list indices), parents first."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield (*path, k)
            yield from _paths(v, (*path, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield (*path, i)
            yield from _paths(v, (*path, i))


def _set(doc: Any, path: tuple[Any, ...], value: Any) -> Any:
    out = copy.deepcopy(doc)
    node = out
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = value
    return out


def _key_text(path: tuple[Any, ...]) -> str:
    """How a problem names the key: ``profiles.short.num_prompts``, ``candidates[0].name``."""
    out = ""
    for k in path:
        out += f"[{k}]" if isinstance(k, int) else (f".{k}" if out else str(k))
    return out


def test_the_full_plan_is_valid_and_uses_every_key_the_schema_declares() -> None:
    from perflab.lab import plan as schema
    from perflab.lab.accuracy import ACCURACY_KEYS
    from perflab.lab.decide import GUARD_KEYS, SLO_KEYS
    from perflab.lab.options import PLAN_OPTIONS
    from perflab.observe.energy import COST_KEYS

    for doc in (FULL, FULL_BY_PATH):
        plan = parse_plan(doc, known_engines=KNOWN, check_files=False)
        assert len(plan.profiles) == 5 and plan.combinations
    plan = parse_plan(FULL_SEARCH, known_engines=KNOWN, check_files=False)
    assert plan.method == "search" and plan.space is not None and plan.space.size == 4 and plan.tuning.trials == 8
    used = {_key_text(tuple(k for k in p if not isinstance(k, int)))
            for doc in (FULL, FULL_BY_PATH, FULL_SEARCH) for p in _paths(doc)}
    step = "candidates.variants"
    declared = {
        *schema.TOP_KEYS, *(f"model.{k}" for k in schema.MODEL_KEYS), *(f"baseline.{k}" for k in schema.BASELINE_KEYS),
        *(f"candidates.{k}" for k in schema.CANDIDATE_KEYS if k not in ("set", "engine_set")),
        *(f"combinations.{k}" for k in schema.COMBINATION_KEYS if k not in ("set", "engine_set", "variants")),
        *(f"{step}.{k}" for k in schema.VARIANT_KEYS if k != "of"), *(f"serve.{k}" for k in PLAN_OPTIONS if k != "model"),
        *(f"timeouts.{k}" for k in schema.TIMEOUT_KEYS), *(f"simulation.{k}" for k in schema.SIMULATION_KEYS),
        *(f"slo.{k}" for k in SLO_KEYS), *(f"cost.{k}" for k in COST_KEYS),
        *(f"guards.{k}" for k in GUARD_KEYS), *(f"accuracy.{k}" for k in ACCURACY_KEYS),
        *(f"space.{k}" for k in schema.SPACE_KEYS), *(f"tuning.{k}" for k in schema.TUNING_KEYS),
    }
    profile_keys = {p[2] for p in _paths(FULL) if p[0] == "profiles" and len(p) == 3}
    assert declared <= used, sorted(declared - used)
    assert set(schema.PROFILE_KEYS) <= profile_keys, sorted(set(schema.PROFILE_KEYS) - profile_keys)


CASES = [(doc, path, kind) for doc in (FULL, FULL_BY_PATH) for path in _paths(doc)
         if doc is FULL or path[0] == "model" for kind in WRONG]


@pytest.mark.parametrize(("doc", "path", "kind"), CASES,
                         ids=[f"{_key_text(p)}{'(path)' if d is FULL_BY_PATH else ''}={k}" for d, p, k in CASES])
def test_every_key_given_every_yaml_type_is_accepted_or_named_in_one_line(doc: Any, path: tuple[Any, ...],
                                                                          kind: str) -> None:
    doc = _set(doc, path, WRONG[kind])
    try:
        parse_plan(doc, known_engines=KNOWN, check_files=False)
    except UsageError as exc:
        message = str(exc)
        assert "\n" not in message
        # the problem names the key, or (a list item) the list it is in
        names = {_key_text(path[:i]) for i in range(1, len(path) + 1)}
        if path[0] == "candidates":  # a candidate renamed or gone: the combination naming it says so
            names.add("combinations[0].of")
        assert any(n in message for n in names if n), (path, message)


# --------------------------------------------------------------------------- bounds

# each LIMITS entry -> where FULL has such a number
LIMIT_PATHS: dict[str, tuple[Any, ...]] = {
    "num_prompts": ("profiles", "short", "num_prompts"),
    "input_len": ("profiles", "short", "input_len"),
    "output_len": ("profiles", "short", "output_len"),
    "prefix_len": ("profiles", "short", "prefix_len"),
    "max_concurrency": ("profiles", "short", "max_concurrency"),
    "num_prefixes": ("profiles", "prefixes", "num_prefixes"),
    "turns": ("profiles", "chat", "turns"),
    "request_rate": ("profiles", "short", "request_rate"),
    "burstiness": ("profiles", "short", "burstiness"),
    "seed": ("profiles", "short", "seed"),
    "sweep": ("profiles", "curve", "sweep", "max_concurrency"),
    "repeats": ("repeats",),
    "warmup": ("warmup",),
    "timeout_s": ("timeouts", "benchmark_s"),
    "slo_ms": ("slo", "tpot_ms"),
    "min_improvement_pct": ("min_improvement_pct",),
    "time_scale": ("simulation", "time_scale"),
    "per_accelerator_hour": ("cost", "per_accelerator_hour"),
    "accuracy_limit": ("accuracy", "limit"),
    "accuracy_concurrency": ("accuracy", "concurrency"),
    "accuracy_points": ("accuracy", "max_drop"),
    "trials": ("tuning", "trials"),
    "budget_engine_hours": ("tuning", "budget_engine_hours"),
}
# the limits of keys FULL cannot hold (method: search's): where FULL_SEARCH has them
IN_FULL_SEARCH = {"trials", "budget_engine_hours"}


def _doc(name: str) -> dict[str, Any]:
    return FULL_SEARCH if name in IN_FULL_SEARCH else FULL


def _at(name: str, over: bool) -> Any:
    if name == "sweep":  # a number of load points
        return list(range(1, int(LIMITS["sweep"]) + 1 + over))
    value = LIMITS[name]
    if isinstance(value, int):
        return value + 1 if over else value
    return value * 1.01 if over else value


def test_every_limit_is_exercised() -> None:
    assert set(LIMIT_PATHS) == set(LIMITS)


@pytest.mark.parametrize("name", sorted(LIMITS))
def test_a_number_past_its_limit_is_refused_in_one_line_naming_key_and_limit(name: str) -> None:
    path = LIMIT_PATHS[name]
    with pytest.raises(UsageError) as err:
        parse_plan(_set(_doc(name), path, _at(name, over=True)), known_engines=KNOWN, check_files=False)
    message = str(err.value)
    assert "\n" not in message and _key_text(path) in message, message
    if name != "seed":
        assert "at most" in message or " to " in message, message


@pytest.mark.parametrize("name", sorted(set(LIMITS) - {"num_prefixes"}))  # num_prefixes also needs as many prompts
def test_a_number_at_its_limit_is_accepted(name: str) -> None:
    parse_plan(_set(_doc(name), LIMIT_PATHS[name], _at(name, over=False)), known_engines=KNOWN, check_files=False)


def test_the_plan_reference_states_every_limit() -> None:
    from perflab.lab.plan import _limit

    text = (Path(__file__).resolve().parents[2] / "docs" / "plan-reference.md").read_text()
    for name in LIMITS:
        assert f"| `{name}` | {_limit(name)} |" in text, name


# --------------------------------------------------------------------------- refused before anything starts

OWNED_PORT = """
model: Qwen/Qwen3-8B
hardware: sim:a100-80g-x8
engines: [vllm, sglang]
candidates:
  - {name: Seqs, set: {max_num_seqs: 64}}
  - {name: Pinned, set: {extra_args: ["--port=18555"]}}
profiles: {p: {input_len: 8, output_len: 2, num_prompts: 4}}
"""


def test_an_extra_arg_setting_a_flag_perflab_owns_is_refused_for_every_engine_it_may_run_on() -> None:
    from perflab.lab.plan import load_plan_text
    from perflab.lab.run.preflight import refuse_owned_flags
    from perflab.plugins import load

    pm = load()
    plan = load_plan_text(OWNED_PORT, path="p.yaml", known_engines=pm.engine_names())
    with pytest.raises(UsageError) as err:
        refuse_owned_flags(pm, plan)
    message = str(err.value)
    assert "\n" not in message and message.startswith("p.yaml: 2 problems: ")
    for engine in ("vllm", "sglang"):  # 'winner' may be either
        assert f"candidates[1] ('Pinned'/'Pinned') on {engine}: extra argument '--port=18555': perflab sets --port" in message
    ok = load_plan_text(OWNED_PORT.replace("--port=18555", "--enable-metrics"), path="p.yaml", known_engines=pm.engine_names())
    refuse_owned_flags(pm, ok)


@pytest.mark.parametrize(("engine", "args", "owned"), [
    ("sglang", ("--host", "0.0.0.0"), "--host"),
    ("trtllm", ("--port=18555",), "--port"),
    ("vllm", ("--port", "18555"), "--port"),
    ("mindie", ("ServerConfig.port=18555",), "ServerConfig.port"),  # its extra arguments are config.json overrides
])
def test_a_launch_of_any_engine_refuses_an_owned_flag_in_its_extra_args(tmp_path: Path, engine: str,
                                                                        args: tuple[str, ...], owned: str) -> None:
    """The check a plan gets is the one every launch makes; SGLang's, TensorRT-LLM's and MindIE's
    plugins had none of their own (the engine got a second port, or MindIE's config.json another)."""
    from perflab.contract.types import ServeConfig
    from perflab.hardware import resolve
    from perflab.plugins import load

    pm = load()
    hardware, _ = resolve(pm, "sim:a100-80g-x8")
    with pytest.raises(UsageError, match=f"perflab sets {owned} itself for {engine}"):
        pm.engine(engine).build_launch(ServeConfig(model="m", port=9000, extra_args=args), hardware, tmp_path, None)


@pytest.mark.parametrize(("text", "key"), [
    (OWNED_PORT, "candidates[1] ('Pinned'/'Pinned') on vllm"),
    (OWNED_PORT.replace("num_prompts: 4", "num_prompts: 1000000000000"), "profiles.p.num_prompts"),
    (OWNED_PORT.replace("engines: [vllm, sglang]", "engines: null"), "engines"),
    (OWNED_PORT + "main_profile: [p]\n", "main_profile"),
    (OWNED_PORT + "decide_by: {a: 1}\n", "decide_by"),
    (OWNED_PORT + "search: [max_concurrency]\n", "search"),
], ids=["owned-flag", "num-prompts", "engines-null", "main-profile-list", "decide-by-mapping", "search-list"])
def test_perflab_run_refuses_the_plan_with_exit_2_one_line_and_nothing_started(tmp_path: Path, capsys: Any,
                                                                                text: str, key: str) -> None:
    from perflab.cli import main

    path = tmp_path / "plan.yaml"
    path.write_text(text)
    with pytest.raises(SystemExit) as exc:
        main(["run", str(path), "--out", str(tmp_path / "study")])
    err = capsys.readouterr().err
    assert exc.value.code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"perflab: error: {path}: ") and f"{key}: " in lines[0], err
    assert "Traceback" not in err
    assert not (tmp_path / "study").exists()  # nothing started, nothing written


@pytest.mark.parametrize("blank", ["", "   "])
def test_a_blank_string_is_refused_as_blank_not_as_a_string_that_is_not_a_string(blank: str) -> None:
    # was: "candidates[0].variants[0].name: expected a string, got a string ''" -- a message that
    # contradicts itself; the user must learn that the value is blank
    doc = copy.deepcopy(FULL)
    doc["candidates"][0]["variants"][0]["name"] = blank
    with pytest.raises(UsageError) as err:
        parse_plan(doc, known_engines=KNOWN)
    message = str(err.value)
    assert "\n" not in message
    assert f"candidates[0].variants[0].name: expected a string that is not blank, got {blank!r}" in message
    assert "got a string" not in message


def test_yaml_infinity_is_the_request_rate_the_message_offers() -> None:
    """`request_rate: .inf` (YAML's infinity, a float) means what 'inf' means; -.inf stays refused."""
    import math

    doc = copy.deepcopy(FULL)
    doc["profiles"]["short"]["request_rate"] = float("inf")
    plan = parse_plan(doc, known_engines=KNOWN, check_files=False)
    assert math.isinf(next(p for p in plan.profiles if p.name == "short").request_rate)
    doc["profiles"]["short"]["request_rate"] = float("-inf")
    with pytest.raises(UsageError, match="request_rate"):
        parse_plan(doc, known_engines=KNOWN, check_files=False)
