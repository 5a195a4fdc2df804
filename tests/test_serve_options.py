"""A serving option is declared once (``ServeOption`` metadata on ``ServeConfig``): the CLI
options, the plan keys and checks, the deltas and docs/plan-reference.md all come from it."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, get_args

import click
import pytest
from click.testing import CliRunner

from perflab.cli import options as cli_options
from perflab.contract.errors import UsageError
from perflab.contract.types import OPTION_KINDS, OptionKind, ServeConfig, ServeOption, serve_options
from perflab.lab import options as lab_options
from perflab.lab import plan as lab_plan
from perflab.lab.options import LAB_OPTIONS, PLAN_OPTIONS, Configuration, apply_delta, options_table, with_options_table
from perflab.lab.plan import load_plan_text

DOCS = Path(__file__).resolve().parents[1] / "docs"

# one valid plan value per kind, and what it becomes on ServeConfig
PLAN_VALUE: dict[str, tuple[Any, Any]] = {
    "str": ("abc", "abc"),
    "pos_int": (3, 3),
    "bool": (False, False),
    "fraction": (1, 1.0),
    "port": (8001, 8001),
    "json": ({"method": "mtp", "num_speculative_tokens": 4}, {"method": "mtp", "num_speculative_tokens": 4}),
    "devices": ([2, 0], (2, 0)),
    "args": ("--a=1 --b 2", ("--a=1", "--b", "2")),
    "env": ({"A": 1, "B": True, "C": None}, {"A": "1", "B": "true", "C": ""}),
    "options": ({"block_size": 16}, {"block_size": 16}),
}
# one CLI spelling per kind: (arguments after the flag, the ServeConfig value)
CLI_VALUE: dict[str, tuple[list[str], Any]] = {
    "str": (["abc"], "abc"),
    "pos_int": (["3"], 3),
    "fraction": (["0.5"], 0.5),
    "port": (["8001"], 8001),
    "json": (['{"method":"mtp"}'], {"method": "mtp"}),
    "devices": (["2,0"], (2, 0)),
    "args": (["--x=1"], ("--x=1",)),
    "env": (["A=b=c"], {"A": "b=c"}),
    "options": (["n=4"], {"n": 4}),
}


def test_every_field_declares_its_option_in_field_order() -> None:
    fields = dataclasses.fields(ServeConfig)
    opts = serve_options()
    assert [o.name for o in opts] == [f.name for f in fields]
    assert all(isinstance(f.metadata["perflab"], ServeOption) for f in fields)
    flags = [o.flag for o in opts if o.flag] + [o.short for o in opts if o.short]
    keys = [o.plan_key for o in (*opts, *LAB_OPTIONS) if o.plan_key]
    assert len(set(flags)) == len(flags) and len(set(keys)) == len(keys)
    assert all(o.kind in OPTION_KINDS and o.help and o.expect for o in (*opts, *LAB_OPTIONS))
    # the renames at the seams are declared on the field, nowhere else
    by_name = {o.name: o for o in opts}
    assert (by_name["extra_env"].plan_key, by_name["extra_env"].flag) == ("env", "--env")
    assert (by_name["options"].plan_key, by_name["options"].flag) == ("engine_options", "--engine-option")
    assert (by_name["extra_args"].plan_key, by_name["extra_args"].flag) == ("extra_args", "--extra-arg")
    assert by_name["model"].required and by_name["host"].default == "127.0.0.1"
    assert by_name["host"].plan_key is None and by_name["port"].plan_key is None


def test_every_kind_is_handled_by_the_cli_the_plan_checks_and_the_deltas() -> None:
    assert set(get_args(OptionKind)) == set(OPTION_KINDS)
    assert set(cli_options._CLI_KINDS) == set(OPTION_KINDS)
    assert set(lab_plan._KIND_CHECKS) == set(OPTION_KINDS)
    assert set(PLAN_VALUE) == set(OPTION_KINDS)


def test_an_unknown_kind_is_refused_at_declaration() -> None:
    with pytest.raises(ValueError, match="unknown kind 'number'"):
        ServeOption("number", "help", name="x")  # type: ignore[arg-type]


def _command() -> click.Command:
    seen: dict[str, ServeConfig] = {}

    @click.command()
    @cli_options.serve_options
    def cmd(**kwargs: Any) -> None:
        seen["config"] = cli_options.pop_serve_config(kwargs)
        assert kwargs == {}  # every serving option popped, nothing else there

    cmd.seen = seen  # type: ignore[attr-defined]
    return cmd


def test_the_click_options_are_the_declared_ones() -> None:
    params = {p.name: p for p in _command().params if isinstance(p, click.Option)}
    cli = [o for o in serve_options() if o.flag]
    assert list(params) == [o.name for o in cli]
    for o in cli:
        p = params[o.name]
        assert p.help == o.help and o.flag in p.opts and p.required == o.required
        if o.short:
            assert o.short in p.opts
        if o.kind == "bool":
            assert p.secondary_opts == [f"--no-{o.flag[2:]}"]  # type: ignore[index]
        if o.default is not None and not p.multiple:
            assert p.default == o.default and p.show_default


@pytest.mark.parametrize("opt", [o for o in serve_options() if o.flag and not o.required], ids=lambda o: o.name)
def test_each_cli_option_lands_on_its_field(opt: ServeOption) -> None:
    assert opt.flag is not None
    if opt.kind == "bool":
        args, expected = [f"--no-{opt.flag[2:]}"], False
    else:
        tail, expected = CLI_VALUE[opt.kind]
        args = [f"{opt.flag}={tail[0]}"]
    cmd = _command()
    result = CliRunner().invoke(cmd, ["-m", "some/model", *args])
    assert result.exit_code == 0, result.output
    config = cmd.seen["config"]  # type: ignore[attr-defined]
    assert getattr(config, opt.name) == expected and config.model == "some/model"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--devices", "0,0"], "--devices '0,0': indexes must be distinct and non-negative"),
        (["--env", "X"], "--env 'X': expected KEY=VALUE"),
        (["--engine-option", "y"], "--engine-option 'y': expected KEY=VALUE"),
        (["--speculative-config", "[1]"],
         "--speculative-config: expected a JSON object such as '{\"method\": \"mtp\", \"num_speculative_tokens\": 4}'"),
    ],
)
def test_cli_value_errors_name_the_declared_flag(args: list[str], message: str) -> None:
    result = CliRunner().invoke(_command(), ["-m", "m", *args])
    assert isinstance(result.exception, UsageError) and str(result.exception) == message


def test_json_object_parser_is_shared_with_bench() -> None:
    with pytest.raises(UsageError, match=r"--extra-body: expected a JSON object such as '\{\"top_p\": 0.9\}'"):
        cli_options.parse_json_object("[1]", "--extra-body", example='{"top_p": 0.9}')
    with pytest.raises(UsageError, match=r"--extra-body: invalid JSON \(Expecting value at column 1\)"):
        cli_options.parse_json_object("x", "--extra-body")


def _plan(serve: dict[str, Any]) -> str:
    return json.dumps({"model": "m", "engines": ["vllm"], "serve": serve, "profiles": {"p": {"input_len": 1, "output_len": 1}}})


def test_every_plan_key_is_accepted_and_lands_on_its_field() -> None:
    serve = {k: PLAN_VALUE[o.kind][0] for k, o in PLAN_OPTIONS.items() if k != "model"}
    plan = load_plan_text(_plan(serve), known_engines=["vllm"])
    config = plan.baseline_config()
    assert config.replicas == PLAN_VALUE["pos_int"][1]
    sc = config.serve_config()
    for o in serve_options():
        if o.plan_key and o.name != "model":
            assert getattr(sc, o.name) == PLAN_VALUE[o.kind][1], o.name


def test_the_plan_accepts_exactly_the_declared_keys() -> None:
    declared = [o.plan_key for o in (*serve_options(), *LAB_OPTIONS) if o.plan_key]
    assert list(PLAN_OPTIONS) == declared
    with pytest.raises(UsageError) as err:
        load_plan_text(_plan({"host": "0.0.0.0"}), known_engines=["vllm"])
    assert f"serve.host: unknown key; expected one of: {', '.join(declared)}" in str(err.value)


@pytest.mark.parametrize("key", list(PLAN_OPTIONS), ids=str)
def test_a_bad_plan_value_says_what_the_declaration_expects(key: str) -> None:
    bad: Any = [] if PLAN_OPTIONS[key].kind in ("str", "pos_int", "bool", "fraction", "port") else 1.5
    with pytest.raises(UsageError) as err:
        load_plan_text(_plan({key: bad}), known_engines=["vllm"])
    assert f"serve.{key}: expected {PLAN_OPTIONS[key].expect}" in str(err.value)


def test_deltas_merge_by_the_declared_kind() -> None:
    base = {"extra_args": ("--a=1",), "env": {"A": "1"}, "engine_options": {"x": 1}, "speculative_config": {"m": 1, "n": 2}}
    delta = {"extra_args": ("--a=2",), "env": {"B": "2"}, "engine_options": {"y": 2}, "speculative_config": {"m": 3}}
    assert apply_delta(base, delta) == {
        "extra_args": ("--a=2",), "env": {"A": "1", "B": "2"}, "engine_options": {"x": 1, "y": 2},
        "speculative_config": {"m": 3},  # one JSON object: replaced whole
    }
    assert Configuration("vllm", {"model": "m", "replicas": 2}).serve_config() == ServeConfig(model="m")


def test_plan_reference_table_is_generated_from_the_declarations() -> None:
    doc = (DOCS / "plan-reference.md").read_text(encoding="utf-8")
    assert with_options_table(doc) == doc, (
        "docs/plan-reference.md's serving options table is out of step with the ServeConfig declarations: "
        "run `python -m perflab.lab.options --write docs/plan-reference.md`"
    )
    table = options_table()
    for o in (*serve_options(), *LAB_OPTIONS):
        assert o.help in table and (o.flag is None or f"`{o.flag}`" in table)
        assert o.plan_key is None or f"| `{o.plan_key}` |" in table


def test_the_table_writer_rewrites_only_between_its_markers(tmp_path: Path) -> None:
    doc = tmp_path / "ref.md"
    doc.write_text(f"intro\n{lab_options._TABLE_START}\n| stale |\n{lab_options._TABLE_END}\noutro\n")
    assert lab_options.main(["--write", str(doc)]) == 0
    assert doc.read_text() == f"intro\n{lab_options._TABLE_START}\n{options_table()}{lab_options._TABLE_END}\noutro\n"
    with pytest.raises(ValueError, match="no serving options table"):
        with_options_table("no markers here")


def test_a_new_field_fails_each_plugins_conformance_until_the_plugin_maps_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """The worked example of docs/adding-a-serving-option.md: declaring ``enforce_eager`` on
    ServeConfig makes every engine plugin's conformance fail, naming the field, until its
    ``serve_options`` table maps or refuses it."""
    from perflab.contract.plugin_base import Maps
    from perflab.plugins import PluginManager
    from perflab.testing import conformance

    new = ServeOption("bool", "Never capture graphs (vLLM --enforce-eager).", name="enforce_eager")
    monkeypatch.setattr(conformance, "serve_options", lambda: (*serve_options(), new))
    pm = PluginManager()
    for engine in ("vllm", "vllm-ascend", "sglang", "trtllm", "mindie", "transformers"):
        kit = type("Kit", (conformance.EngineConformance,), {"engine": engine})()
        info = pm.engine(engine).info
        with pytest.raises(AssertionError, match="serve_options says nothing about enforce_eager"):
            kit.test_every_serve_option_is_mapped_or_refused(pm, info)
    # the plugin's mapping is the other half: with it, the check passes
    plugin = pm.pm.get_plugin(pm.engine("vllm").plugin)
    monkeypatch.setattr(plugin, "serve_options", {**plugin.serve_options, "enforce_eager": Maps("--enforce-eager")})
    kit = type("Kit", (conformance.EngineConformance,), {"engine": "vllm"})()
    kit.test_every_serve_option_is_mapped_or_refused(pm, pm.engine("vllm").info)
