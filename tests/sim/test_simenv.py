"""perflab_sim.env declares every PERFLAB_SIM_* variable once; the docs list them from it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from perflab.contract.errors import UsageError
from perflab_sim import env as simenv

ROOT = Path(__file__).resolve().parents[2]


def test_docs_list_exactly_the_declared_variables() -> None:
    text = (ROOT / "docs" / "simulator.md").read_text()
    table = text.split("<!-- simenv:start -->", 1)[1].split("<!-- simenv:end -->", 1)[0]
    rows = dict(re.findall(r"^\| `(PERFLAB_SIM_\w+)` \| (.+) \|$", table, re.M))
    assert rows == simenv.VARIABLES


def test_no_other_module_spells_a_variable_name() -> None:
    """Code names the variables through perflab_sim.env; a literal elsewhere is a second declaration."""
    pkg = ROOT / "core" / "perflab"
    offenders = []
    for path in pkg.rglob("*.py"):
        if path.name == "simenv.py":
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if re.search(r"""["']PERFLAB_SIM_\w+["']""", code):
                offenders.append(f"{path.relative_to(pkg)}:{n}")
    assert offenders == []


def test_simenv_loads_nothing_of_the_simulator() -> None:
    """env.py imports nothing of the simulator: the standard library, perflab.contract.errors and the core's
    engine-versions format only (importing it by module path runs the package's __init__: read
    its imports)."""
    import ast

    import perflab_sim.env as mod
    tree = ast.parse(Path(mod.__file__).read_text())
    names = [a.name for n in tree.body if isinstance(n, ast.Import) for a in n.names]
    names += [n.module or "" for n in tree.body if isinstance(n, ast.ImportFrom)]
    assert not [n for n in names if n.startswith("perflab_sim")]
    assert {n for n in names if n.startswith("perflab")} <= {"perflab.contract.errors", "perflab.hardware",
                                                             "perflab.hardware.engine_versions"}


def test_time_scale() -> None:
    assert simenv.time_scale({}) == 1.0
    assert simenv.time_scale({simenv.TIME_SCALE_ENV: " 20 "}) == 20.0
    for bad in ("0", "-1", "nan", "inf"):
        with pytest.raises(ValueError, match="PERFLAB_SIM_TIME_SCALE must be a positive number"):
            simenv.time_scale({simenv.TIME_SCALE_ENV: bad})


def test_engine_versions_round_trip() -> None:
    value = simenv.format_versions({"tensorrt_llm": "1.3.0", "vllm": "0.17.1"})
    assert value == "trtllm=1.3.0,vllm=0.17.1"
    assert simenv.parse_versions(value) == {"trtllm": "1.3.0", "vllm": "0.17.1"}
    with pytest.raises(UsageError, match="unknown engine 'llamacpp'"):
        simenv.parse_versions("llamacpp=1")
    with pytest.raises(UsageError, match="is not a version"):
        simenv.parse_versions("vllm=latest")
