"""The plan schema (perflab.lab.plan_schema) as JSON Schema: every shipped plan validates against
it, an unknown key or a wrong type fails it, its keys per section are the parser's, the copy in
docs/ is current, and `perflab plan schema` prints and writes it. And a plan's ``serve`` is typed
(a ServeConfig) from the parser on."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from test_plan_types import FULL, FULL_BY_PATH, KNOWN, WRONG, _key_text, _paths, _set

from perflab.contract.errors import UsageError
from perflab.lab.plan import parse_plan
from perflab.lab.plan_schema import json_schema, schema_text

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = json_schema()
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)
EXAMPLES = sorted((ROOT / "examples").glob("**/*.yaml"))


def _errors(doc: Any) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in VALIDATOR.iter_errors(doc)]


def test_the_schema_is_valid_json_schema() -> None:
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    assert json.loads(schema_text()) == SCHEMA


def _shipped_plans() -> list[tuple[str, Any]]:
    plans = [(str(p.relative_to(ROOT)), yaml.safe_load(p.read_text())) for p in EXAMPLES]
    from perflab.lab.demo import DEMO_PLAN

    plans.append(("perflab demo's plan", yaml.safe_load(DEMO_PLAN)))
    # the plan reference's complete example (the README has no plan of its own: it points there)
    reference = (ROOT / "docs" / "plan-reference.md").read_text()
    block = reference.split("## A complete example", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    plans.append(("docs/plan-reference.md's complete example", yaml.safe_load(block)))
    plans += [("tests' plan using every key", FULL), ("the same, model by path", FULL_BY_PATH)]
    return plans


@pytest.mark.parametrize(("name", "doc"), _shipped_plans(), ids=lambda v: v if isinstance(v, str) else "")
def test_every_shipped_plan_validates_against_the_schema(name: str, doc: Any) -> None:
    assert EXAMPLES, "no example plans found"
    assert _errors(doc) == [], name


def test_every_example_names_the_schema_for_editors() -> None:
    for path in EXAMPLES:
        first = path.read_text().splitlines()[0]
        assert first == "# yaml-language-server: $schema=../docs/plan.schema.json", path


# --------------------------------------------------------------------------- the schema's sections


def _resolve(node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        node = SCHEMA["$defs"][node["$ref"].rsplit("/", 1)[-1]]
    return node


def _branch(node: dict[str, Any], kind: str) -> dict[str, Any]:
    """The ``kind`` ("object" or "array") branch of a (possibly nullable, union) schema node."""
    node = _resolve(node)
    for b in (node, *node.get("anyOf", ())):
        b = _resolve(b)
        if b.get("type") == kind:
            return b
    raise AssertionError(f"no {kind} in {node}")


def _section(path: tuple[Any, ...]) -> dict[str, Any]:
    """The object schema of the section at ``path`` of a plan document."""
    node: dict[str, Any] = SCHEMA
    for k in path:
        if isinstance(k, int):
            node = _branch(node, "array")["items"]
        else:
            obj = _branch(node, "object")
            node = obj.get("properties", {}).get(k) or obj["additionalProperties"]
    return _branch(node, "object")


# every section of FULL with a closed set of keys (guards and sweep are checked below)
SECTIONS: list[tuple[Any, ...]] = [
    (), ("model",), ("serve",), ("engine_serve", "sglang"), ("baseline",), ("baseline", "serve"),
    ("candidates", 0), ("candidates", 0, "variants", 0), ("candidates", 0, "variants", 0, "set"),
    ("candidates", 0, "variants", 0, "engine_set", "vllm"), ("candidates", 1), ("combinations", 0),
    ("profiles", "short"), ("timeouts",), ("simulation",), ("slo",), ("cost",), ("accuracy",),
]


def _parser_keys(path: tuple[Any, ...]) -> list[str]:
    """The keys the parser accepts at ``path``: its unknown-key message lists them."""
    node = FULL if path[:1] != ("model",) else FULL_BY_PATH
    doc = _set(node, (*path, "zz_unknown"), 1)
    with pytest.raises(UsageError) as err:
        parse_plan(doc, known_engines=KNOWN, check_files=False)
    where = f"{_key_text(path)}.zz_unknown" if path else "zz_unknown"
    m = re.search(re.escape(where) + r": unknown key[^;]*; expected one of: ([^;]*)", str(err.value))
    assert m, str(err.value)
    return m[1].split(", ")


@pytest.mark.parametrize("path", SECTIONS, ids=lambda p: _key_text(p) or "top")
def test_the_schemas_keys_per_section_are_the_parsers(path: tuple[Any, ...]) -> None:
    section = _section(path)
    assert section.get("additionalProperties") is False, "the schema must refuse unknown keys too"
    accepted = _parser_keys(path)
    if path == ("serve",):  # the parser names model among the options, then refuses it there
        accepted.remove("model")
    assert list(section["properties"]) == accepted


def test_the_open_sections_keys_are_the_parsers() -> None:
    from perflab.lab.decide import GUARD_KEYS, LoadKind, is_latency_metric

    guards = _section(("guards",))
    assert set(guards["properties"]) == set(GUARD_KEYS)
    (pattern,) = guards["patternProperties"]
    for key in ("p99_tpot_ms", "mean_ttft_ms", "median_itl_ms", "p99.9_e2el_ms", "p99_tpot", "max_ttft_ms"):
        assert bool(re.fullmatch(pattern, key)) == is_latency_metric(key), key
    assert set(_section(("profiles", "curve", "sweep"))["properties"]) == set(LoadKind)


def test_the_keys_other_modules_name_are_the_schemas() -> None:
    from perflab.lab.accuracy import ACCURACY_KEYS
    from perflab.lab.decide import SLO_KEYS
    from perflab.observe.energy import COST_KEYS

    assert tuple(_section(("slo",))["properties"]) == SLO_KEYS
    assert tuple(_section(("cost",))["properties"]) == COST_KEYS
    assert tuple(_section(("accuracy",))["properties"]) == ACCURACY_KEYS


# --------------------------------------------------------------------------- what the schema refuses


@pytest.mark.parametrize("path", SECTIONS, ids=lambda p: _key_text(p) or "top")
def test_an_unknown_key_fails_the_schema(path: tuple[Any, ...]) -> None:
    node = FULL if path[:1] != ("model",) else FULL_BY_PATH
    assert _errors(_set(node, (*path, "zz_unknown"), 1))


@pytest.mark.parametrize(("path", "value"), [
    (("engines",), 3),
    (("engines",), []),
    (("model",), 7),
    (("profiles",), {}),
    (("profiles", "short", "num_prompts"), "many"),
    (("profiles", "short", "num_prompts"), 0),
    (("profiles", "short", "num_prompts"), 10_000_001),  # past its limit
    (("profiles", "short", "request_rate"), "fast"),
    (("profiles", "short", "dataset"), "imagenet"),
    (("serve", "tp"), "two"),
    (("serve", "prefix_caching"), "yes"),
    (("serve", "mem_fraction"), 1.5),
    (("serve", "devices"), [0, 0]),
    (("timeouts", "benchmark_s"), -1),
    (("decide_by",), "latency"),
    (("repeats",), 101),
    (("cost", "currency"), "dollars"),
    (("accuracy", "lossless"), ["no_such_option"]),
    (("name",), "../escape"),
    (("hardware",), "gpu"),
    (("notes",), "one note"),
    (("profiles", "short", "label"), "   "),  # blank
    (("serve", "reasoning_parser"), ""),
], ids=lambda v: _key_text(v) if isinstance(v, tuple) else None)
def test_a_wrong_type_or_value_fails_the_schema_and_the_parser(path: tuple[Any, ...], value: Any) -> None:
    doc = _set(FULL, path, value)
    assert _errors(doc), (path, value)
    with pytest.raises(UsageError, match=re.escape(_key_text(path))):
        parse_plan(doc, known_engines=KNOWN, check_files=False)


def test_the_schema_refuses_nothing_the_parser_accepts() -> None:
    """Every key of the full plan given every YAML type: a value the parser accepts validates
    (the schema never marks a plan perflab runs). The converse does not hold: engine names,
    files and references are the parser's alone."""
    stricter = []
    for doc in (FULL, FULL_BY_PATH):
        for path in _paths(doc):
            if doc is FULL_BY_PATH and path[0] != "model":
                continue
            for kind, value in WRONG.items():
                if kind == "timestamp":
                    continue  # a date is no JSON value; the schema validates JSON-like documents
                changed = _set(doc, path, value)
                try:
                    parse_plan(changed, known_engines=KNOWN, check_files=False)
                except UsageError:
                    continue
                stricter += [f"{_key_text(path)}={kind}: {e}" for e in _errors(changed)[:1]]
    assert not stricter, stricter


def test_a_model_needs_exactly_one_of_id_and_path() -> None:
    both = copy.deepcopy(FULL)
    both["model"]["path"] = "weights"
    assert _errors(both)
    neither = copy.deepcopy(FULL)
    del neither["model"]["id"]
    assert _errors(neither)


def test_the_schema_states_the_limits_the_parser_enforces() -> None:
    from perflab.lab.plan import LIMITS

    named = {node["x-perflab-limit"] for node in _walk(SCHEMA) if "x-perflab-limit" in node}
    assert named == set(LIMITS)


@pytest.mark.parametrize(("path", "ok", "bad"), [
    (("timeouts", "device_wait_s"), 0, -1),
    (("timeouts", "benchmark_s"), 0.5, 0),
    (("simulation", "time_scale"), 1, 0.99),
    (("profiles", "short", "range_ratio"), 0.0, 1.0),
    (("profiles", "short", "burstiness"), 0.001, 0),
    (("profiles", "short", "seed"), -(2**63), -(2**63) - 1),
    (("profiles", "curve", "sweep", "max_concurrency"), [1, 1_000_000], [0, 4]),
    (("slo", "percentile"), 100, 0),
    (("min_success_rate",), "100%", 1.01),
    (("min_improvement_pct",), 0, -0.5),
    (("warmup",), 0, -1),
    (("cost", "currency"), "eur", "US"),
    (("accuracy", "max_drop"), 0, -1),
    (("guards", "latency_regression_pct"), 0, -1),
    (("profiles", "short", "request_rate"), 0.5, float("nan")),
    (("timeouts", "stall_s"), 1, float("nan")),
], ids=lambda v: _key_text(v) if isinstance(v, tuple) else None)
def test_the_parser_takes_its_bounds_from_the_schema(path: tuple[Any, ...], ok: Any, bad: Any) -> None:
    """The parser asks the schema's models whether a number is within bounds: the same bound on
    both sides of the line, and in the JSON Schema editors read."""
    parse_plan(_set(FULL, path, ok), known_engines=KNOWN, check_files=False)
    with pytest.raises(UsageError, match=re.escape(_key_text(path))):
        parse_plan(_set(FULL, path, bad), known_engines=KNOWN, check_files=False)
    if bad == bad:  # JSON has no NaN
        assert _errors(_set(FULL, path, bad))
    assert not _errors(_set(FULL, path, ok))


def _walk(node: Any) -> list[dict[str, Any]]:
    if isinstance(node, dict):
        return [node, *(n for v in node.values() for n in _walk(v))]
    if isinstance(node, list):
        return [n for v in node for n in _walk(v)]
    return []


# --------------------------------------------------------------------------- published


def test_the_copy_in_docs_is_current() -> None:
    """docs/plan.schema.json, which the examples name: regenerate with
    `perflab plan schema --write docs/plan.schema.json`."""
    assert (ROOT / "docs" / "plan.schema.json").read_text() == schema_text()


def test_perflab_plan_schema_prints_and_writes_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from perflab.cli import main

    main(["plan", "schema"])
    assert json.loads(capsys.readouterr().out) == SCHEMA
    out = tmp_path / "plan.schema.json"
    main(["plan", "schema", "--write", str(out)])
    assert out.read_text() == schema_text()
    with pytest.raises(SystemExit) as exc:
        main(["plan", "schema", "--write", str(tmp_path / "missing" / "x.json")])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("perflab: error: ") and "cannot write the schema" in err[0]


# --------------------------------------------------------------------------- serve, typed


def test_a_plans_serve_is_a_serve_config_with_the_lab_options() -> None:
    from perflab.contract.types import ServeConfig
    from perflab.lab.options import LAB_OPTIONS, PlanServe

    plan = parse_plan(FULL, known_engines=KNOWN, check_files=False)
    serve = plan.serve
    assert isinstance(serve, ServeConfig) and isinstance(serve, PlanServe)
    assert serve.model == plan.model
    assert (serve.tp, serve.prefix_caching, serve.mem_fraction, serve.replicas) == (2, True, 0.9, 1)
    assert serve.extra_args == ("--seed", "1") and dict(serve.extra_env) == {"A": "b"}
    assert dict(serve.options) == {"x": 1} and serve.devices == (0, 1)
    # the lab options are PlanServe's own fields, nothing else
    own = {f for f in PlanServe.__dataclass_fields__} - set(ServeConfig.__dataclass_fields__)
    assert own == {o.name for o in LAB_OPTIONS}


def test_configurations_are_composed_from_the_typed_serve_as_from_its_keys() -> None:
    """engine_defaults / baseline_config: the same options (and keys) as applying the plan's
    serve keys, as written, onto the model."""
    from perflab.lab.options import Configuration, apply_delta, normalise

    for doc in (FULL, _set(FULL, ("serve",), {"tp": None, "prefix_caching": False, "extra_args": "--a b",
                                              "speculative_config": {}})):
        plan = parse_plan(doc, known_engines=KNOWN, check_files=False)
        serve = {k: normalise(k, v) for k, v in doc["serve"].items()}
        for engine in plan.engines:
            opts = apply_delta({"model": plan.model}, serve)
            opts = apply_delta(opts, {k: normalise(k, v) for k, v in doc["engine_serve"].get(engine, {}).items()})
            expected = Configuration(engine, opts)
            got = plan.engine_defaults(engine)
            assert got == expected and got.key() == expected.key(), engine
    assert parse_plan(_set(FULL, ("serve",), {"prefix_caching": False}), known_engines=KNOWN,
                      check_files=False).engine_defaults("vllm").options["prefix_caching"] is False


def test_the_study_frame_names_the_serve_options_set() -> None:
    """A study's frame (what a resumed plan must keep) holds the options the plan sets, so a
    refusal names them, not every field of a ServeConfig."""
    from perflab.lab.store.integrity import plan_frame

    doc = _set(FULL, ("serve",), {"tp": 2, "prefix_caching": False})
    frame = plan_frame(parse_plan(doc, known_engines=KNOWN, check_files=False))
    assert frame["serve"] == {"model": "Qwen/Qwen3-32B", "tp": 2, "prefix_caching": False}


@pytest.mark.parametrize("path", [("version",), ("combinations", 0), *(("profiles", n) for n in FULL["profiles"])],
                         ids=_key_text)
def test_what_the_schema_refuses_as_empty_or_not_an_integer_the_parser_refuses_too(path: tuple[Any, ...]) -> None:
    """YAML's ``true`` is the integer 1 to Python; a bare ``name:`` or ``-`` is null: a plan
    that left out a workload or a step must not run without it."""
    doc = _set(FULL, path, True if path == ("version",) else None)
    assert _errors(doc)
    with pytest.raises(UsageError, match=re.escape(_key_text(path))):
        parse_plan(doc, known_engines=KNOWN, check_files=False)
