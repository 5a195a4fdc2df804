"""The engine version a command line is built for: how versions compare, the choice order
(asked, installed, the plugin's newest), ``--engine-version`` on ``engines command`` and
``launch``, ``engine_versions:`` in plans, and the errors and warnings around them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from test_cli_engines import invoke

from perflab.contract.errors import UnsupportedOption, UsageError
from perflab.contract.versions import EngineVersions, Since, VersionChoice, choose_version, version_key
from perflab.lab.plan import parse_plan

SRC = "engine 1.0 (test)"
VERSIONS = EngineVersions(
    oldest="1.0", newest="2.0", source=SRC,
    changes=(
        Since("window", "1.0", "--window", SRC),
        Since("window", "1.5rc1", None, SRC, why="windows were removed"),
        Since("depth", "1.0", "--branch-length", SRC),
        Since("depth", "1.5rc1", "--max-depth", SRC),
        Since("new-flag", "1.0", None, SRC, why="added in 1.2"),
        Since("new-flag", "1.2", "--new-flag", SRC),
    ),
)


# --------------------------------------------------------------------------- comparing versions


def test_versions_compare_as_releases_do() -> None:
    ordered = ["0.5.5", "0.5.5.post1", "0.5.9", "0.5.10rc1", "0.5.10", "0.5.10.post1", "0.11.0rc2", "0.11.0",
               "2.1.RC1", "2.1.RC2", "2.1.RC2.B080", "2.1", "2.2.RC1"]
    assert sorted(reversed(ordered), key=version_key) == ordered
    assert version_key("0.5") == version_key("0.5.0") == version_key("v0.5.0")
    assert version_key("0.32.0+cpu") == version_key("0.32.0")  # a local build is its release


@pytest.mark.parametrize("text", ["banana", "", "1..x y", "latest"])
def test_a_malformed_version_is_a_usage_error(text: str) -> None:
    with pytest.raises(UsageError, match="is not a version"):
        version_key(text)


# --------------------------------------------------------------------------- one declaration, per version


@pytest.mark.parametrize(("version", "depth"), [("1.0", "--branch-length"), ("1.4.9", "--branch-length"),
                                                ("1.5rc1", "--max-depth"), ("2.0", "--max-depth"),
                                                (None, "--max-depth"),  # nothing known: the newest
                                                ("0.1", "--branch-length"), ("9.0", "--max-depth")])  # outside: nearest end
def test_a_spelling_holds_from_its_version_until_the_next(version: str | None, depth: str) -> None:
    assert VERSIONS.how("engine", "depth", version) == depth


def test_a_setting_a_version_lacks_is_refused_saying_since_when_and_why() -> None:
    assert VERSIONS.how("engine", "window", "1.4") == "--window"
    with pytest.raises(UnsupportedOption, match=r"window: not in engine 1\.5, gone since 1\.5rc1: windows were removed"):
        VERSIONS.how("engine", "window", "1.5")
    with pytest.raises(UnsupportedOption, match=r"new-flag: not in engine 1\.1: added in 1\.2 \(engine 1\.0"):
        VERSIONS.how("engine", "new-flag", "1.1")
    assert VERSIONS.how("engine", "new-flag", "1.2") == "--new-flag"


def test_an_option_whose_spelling_never_changed_takes_its_default() -> None:
    assert VERSIONS.how("engine", "tp", "1.0", default="--tp") == "--tp"
    with pytest.raises(KeyError):
        VERSIONS.how("engine", "tp", "1.0")


# --------------------------------------------------------------------------- the choice


def test_the_choice_is_asked_then_installed_then_the_newest() -> None:
    assert choose_version("e", "E", VERSIONS, "1.2", "1.0") == VersionChoice("e", "1.2", "asked", "1.0")
    assert choose_version("e", "E", VERSIONS, "1.2", None, "plan").label == "1.2 (the plan's engine_versions)"
    assert choose_version("e", "E", VERSIONS, None, "1.0") == VersionChoice("e", "1.0", "installed", "1.0")
    newest = choose_version("e", "E", VERSIONS, None, None)
    assert (newest.version, newest.origin, newest.warning) == ("2.0", "newest", None)
    assert "the newest version the plugin maps" in newest.label
    # a plugin that declares no versions: the installed one, or nothing
    assert choose_version("e", "E", None, None, None) == VersionChoice("e", None, "unknown")


@pytest.mark.parametrize(("version", "side", "used"), [("0.9", "older than the oldest", "1.0"),
                                                       ("2.1", "newer than the newest", "2.0")])
def test_a_version_outside_the_range_is_built_as_the_nearest_end_with_a_warning(version: str, side: str,
                                                                                used: str) -> None:
    choice = choose_version("e", "Engine", VERSIONS, version, None)
    assert choice.version == version
    assert choice.warning == (f"Engine {version} is {side} version perflab maps (1.0 .. 2.0); "
                              f"its command lines are built with Engine {used}'s options")


def test_a_malformed_asked_version_names_where_it_came_from() -> None:
    with pytest.raises(UsageError, match=r"^--engine-version: e: 'x\.y' is not a version"):
        choose_version("e", "E", VERSIONS, "x.y", None)


def test_an_unreadable_installed_version_is_built_as_the_newest_with_a_warning() -> None:
    choice = choose_version("e", "E", VERSIONS, None, "nightly")
    assert choice.version == "nightly" and "cannot compare" in (choice.warning or "")
    assert VERSIONS.how("e", "depth", "nightly") == "--max-depth"


# --------------------------------------------------------------------------- the CLI

A100 = "sim:a100-80g-x8"  # the simulated machine's SGLang is 0.5.5.post1, the seeds'
NGRAM = '{"method":"ngram","num_speculative_tokens":4,"max_trie_depth":12}'


def command(capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, Any, str]:
    code, out, err = invoke(["engines", "command", "sglang", "--model", "Qwen/Qwen3-8B", "--hardware", A100,
                             "--speculative-config", NGRAM, "--json", *extra], capsys)
    return code, json.loads(out) if code == 0 else None, err


def test_engines_command_builds_for_the_installed_version_and_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    code, data, err = command(capsys)
    assert code == 0, err
    assert data["engine_version"] == {"version": "0.5.5.post1", "from": "installed", "installed": "0.5.5.post1",
                                      "warning": None}
    assert "--speculative-ngram-branch-length" in data["argv"]


def test_engines_command_builds_for_engine_version(capsys: pytest.CaptureFixture[str]) -> None:
    code, data, err = command(capsys, "--engine-version", "0.5.23")
    assert code == 0, err
    assert data["engine_version"]["version"] == "0.5.23" and data["engine_version"]["from"] == "asked"
    assert data["engine_version"]["installed"] == "0.5.5.post1"
    i = data["argv"].index("--speculative-ngram-max-trie-depth")
    assert data["argv"][i + 1] == "12" and "--speculative-ngram-branch-length" not in data["argv"]
    code, out, err = invoke(["engines", "command", "sglang", "--model", "m", "--hardware", A100,
                             "--engine-version", "0.5.23"], capsys)
    assert code == 0 and out.startswith("# sglang 0.5.23 (--engine-version) — 8 accelerator(s)"), out


def test_engines_command_refuses_what_the_version_lacks_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    spec = '{"method":"ngram","num_speculative_tokens":4,"prompt_lookup_max":6}'
    code, out, err = invoke(["engines", "command", "sglang", "--model", "m", "--hardware", A100,
                             "--speculative-config", spec, "--engine-version", "0.5.10"], capsys)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "speculative_config.prompt_lookup_max: not in sglang 0.5.10, gone since 0.5.10" in err


def test_engines_command_warns_outside_the_plugins_range(capsys: pytest.CaptureFixture[str]) -> None:
    code, data, err = command(capsys, "--engine-version", "0.6.0")
    assert code == 0
    assert "warning: SGLang 0.6.0 is newer than the newest version perflab maps (0.5.5.post1 .. 0.5.23)" in err
    assert data["engine_version"]["warning"] and "--speculative-ngram-max-trie-depth" in data["argv"]
    code, _, err = command(capsys, "--engine-version", "0.5,9")
    assert code == 2 and "--engine-version: sglang: '0.5,9' is not a version" in err


def test_launch_says_the_version_it_built_for(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """SGLang 0.5.10 has no n-gram match window: the launch is refused before anything starts,
    and says which version it was built for (stderr) and (--json) where that came from."""
    spec = '{"method":"ngram","num_speculative_tokens":4,"prompt_lookup_max":6}'
    code, out, err = invoke(["launch", "sglang", "--model", "Qwen/Qwen3-8B", "--hardware", A100, "--speculative-config",
                             spec, "--engine-version", "0.5.10", "--check", "--json", "--workdir", str(tmp_path / "run")],
                            capsys)
    assert code == 3, err
    assert "perflab: sglang command built for 0.5.10 (--engine-version)" in err
    # it runs here, where another SGLang is installed: said too
    assert "warning: sglang's commands are built for 0.5.10 (--engine-version), but 0.5.5.post1 is installed here" in err
    data = json.loads(out)
    assert data["state"] == "unsupported" and "prompt_lookup_max" in data["reason"]
    assert data["engine_version"] == {"version": "0.5.10", "from": "asked", "installed": "0.5.5.post1", "warning": None}


# --------------------------------------------------------------------------- plans

PLAN: dict[str, Any] = {"model": "m", "engines": ["vllm", "sglang"], "profiles": {"p": {"input_len": 8, "output_len": 8, "num_prompts": 4}}}
KNOWN = {"vllm", "sglang", "trtllm"}


def test_a_plan_sets_the_version_per_engine() -> None:
    plan = parse_plan({**PLAN, "engine_versions": {"sglang": "0.5.23"}}, known_engines=KNOWN, check_files=False)
    assert dict(plan.engine_versions) == {"sglang": "0.5.23"}
    assert dict(parse_plan(PLAN, known_engines=KNOWN, check_files=False).engine_versions) == {}


@pytest.mark.parametrize(
    ("versions", "problem"),
    [
        ({"sglnag": "0.5.23"}, "engine_versions.sglnag: unknown engine 'sglnag' (did you mean 'sglang'?)"),
        ({"vllm": 0.11}, "engine_versions.vllm: expected a version string such as '0.5.23' (quote it), got 0.11"),
        ({"vllm": "newest"}, "engine_versions.vllm: 'newest' is not a version"),
        (["vllm"], "engine_versions: expected a mapping of engine name to version"),
    ],
)
def test_a_plans_engine_versions_are_checked(versions: Any, problem: str) -> None:
    with pytest.raises(UsageError) as exc:
        parse_plan({**PLAN, "engine_versions": versions}, known_engines=KNOWN, check_files=False)
    assert problem in str(exc.value)


@pytest.mark.parametrize(
    ("oldest", "newest", "changes", "problem"),
    [
        ("2.0", "1.0", (), "oldest 2.0 is newer than newest 1.0"),
        ("1.0", "2.0", (Since("x", "1.1", "--x", SRC),), "'x' needs its spelling at the oldest version, 1.0"),
        ("1.0", "2.0", (Since("x", "1.0", "--x", SRC), Since("x", "3.0", "--y", SRC)), "after the newest"),
        ("1.0", "2.0", (Since("x", "1.0", "--x", SRC), Since("x", "1.0.0", "--y", SRC)), "twice at one version"),
        ("1.0", "2.0", (Since("x", "1.0", None, SRC),), "a why where it cannot be said"),
        ("1.0", "2.0", (Since("x", "1.0", "--x", ""),), "needs a source"),
        ("1.0", "x", (), "'x' is not a version"),
    ],
)
def test_a_malformed_declaration_fails_when_the_plugin_loads(oldest: str, newest: str, changes: tuple[Since, ...],
                                                             problem: str) -> None:
    with pytest.raises((ValueError, UsageError), match=problem):
        EngineVersions(oldest, newest, SRC, changes)


def test_engines_list_says_which_versions_each_plugin_maps(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = invoke(["engines", "list", "--json"], capsys)
    assert code == 0, err
    rows = {row["engine"]: row for row in json.loads(out)["engines"]}
    assert rows["sglang"]["mapped_versions"] == {"oldest": "0.5.5.post1", "newest": "0.5.23"}
    assert rows["vllm"]["mapped_versions"] == {"oldest": "0.11.0", "newest": "0.33.0"}
