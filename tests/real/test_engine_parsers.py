"""The engines' own argument parsers read perflab's command lines (issue 27, item 9).

For vLLM (the CPU build the real lane runs) and SGLang (its parser, installed ``--no-deps``
beside that build's CPU torch), at least 40 combinations of perflab's serving options each are
built through the engine's plugin and parsed by the engine (parserlane.py); every value perflab
set must come out as perflab meant it, and nothing else may move from the engine's default.
A command line the engine rejects fails here, loudly: the summary at the end of the run lists
the combinations tried and accepted per engine and version.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner
from parserlane import EVERYTHING, EVERYTHING_CLI, HARDWARE, PORT, build_all, run_lane

from perflab.cli import cli
from perflab.hardware import resolve
from perflab.plugins import load
from perflab.realengine import RealEngineEnv

MIN_COMBINATIONS = 40
#: the environment each engine's parser runs in (tests/real/conftest.py)
ENV_FIXTURES = {"vllm": "vllm_env", "sglang": "sglang_parser_env"}


@pytest.mark.parametrize("engine", list(ENV_FIXTURES))
def test_the_engines_parser_reads_perflabs_command_lines(
        engine: str, request: pytest.FixtureRequest, record_property: Callable[[str, object], None],
        tmp_path: Path) -> None:
    env: RealEngineEnv = request.getfixturevalue(ENV_FIXTURES[engine])
    result = run_lane(load(), env, tmp_path)
    record_property("parser_lane", result.summary())  # printed by tests/real/conftest.py
    accepted = {repr(o.options) for o in result.accepted}
    assert len(accepted) >= MIN_COMBINATIONS, (
        f"only {len(accepted)} of {result.combinations} combinations reached {engine}'s parser and passed it")
    assert not result.failures, (
        f"{engine} {env.version}'s own parser disagrees with perflab on {len(result.failures)} of "
        f"{len(result.built)} command lines:\n" + "\n".join(result.failures))


@pytest.mark.parametrize("engine", list(ENV_FIXTURES))
def test_the_lane_builds_what_engines_command_prints(engine: str, tmp_path: Path) -> None:
    """The lane's command lines are the ones a user gets: ``perflab engines command --json``."""
    pm = load()
    model = "Qwen/Qwen3-32B"
    args = ["engines", "command", engine, "-m", model, "--port", str(PORT), "--hardware", HARDWARE, "--json",
            *EVERYTHING_CLI]
    result = CliRunner().invoke(cli, args, obj={"pm": pm}, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    printed = json.loads(result.stdout)["argv"]
    hardware, env = resolve(pm, HARDWARE)
    version = pm.engine(engine).engine.version(env)  # what engines command asks too
    [outcome] = build_all(pm, engine, version, model, hardware, tmp_path, [EVERYTHING[0]])
    assert printed == outcome.argv
