"""The core runs without perflab-sim: `engines list` and `engines command` work, and
`--hardware sim:...` says in one line which package provides it.

A subprocess where the simulator cannot be imported (sys.modules entry None, its plugin
disabled) stands for a venv without it: fast, and it fails on any import of perflab_sim the
core makes on these paths. The fresh-venv test in test_plugin_manager.py installs the core
wheel and a plugin wheel without perflab-sim and lists the engines. And the core's code names
nothing of the simulator: its wire names are the core's neutral protocols.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

CORE = Path(__file__).resolve().parents[1] / "core" / "perflab"
#: what the core's code may not spell (docstrings and comments aside): the simulator's
#: variables, its old wire names and its package. The core speaks neutral protocols that any
#: engine may offer (perflab.bench.serverclock: the server clock, the time-scale header).
SIMULATOR_NAMES = re.compile(r"PERFLAB_SIM_|sim[-_]clock|sim[-_]time[-_]scale|sim[-_]fingerprint|perflab[-_]sim", re.I)
#: the one string allowed to name the simulator's distribution: which package provides
#: ``--hardware sim:...`` (perflab.hardware.PROVIDERS), so the one-line error can say it
INSTALL_HINT = "pip install perflab-sim"

BLOCKED = (
    "import sys; sys.modules['perflab_sim'] = None\n"  # as if perflab-sim were not installed
    "from perflab.cli import main\n"
    "sys.argv = ['perflab'] + sys.argv[1:]\n"
    "main()\n"
)


def _perflab(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PERFLAB_DISABLE_PLUGINS": "perflab-sim"}
    env.pop("PERFLAB_LOAD_PLUGINS", None)
    return subprocess.run([sys.executable, "-c", BLOCKED, *args], env=env, capture_output=True, text=True, timeout=120)


def test_engines_list_and_command_without_the_simulator() -> None:
    listed = _perflab("engines", "list")
    assert listed.returncode == 0, listed.stderr
    assert "vllm" in listed.stdout
    command = _perflab("engines", "command", "vllm", "--model", "Qwen/Qwen3-32B")
    assert "vllm serve Qwen/Qwen3-32B" in command.stdout, command.stdout + command.stderr
    assert "perflab_sim" not in command.stderr


def test_sim_hardware_without_the_simulator_names_its_package_in_one_line() -> None:
    out = _perflab("engines", "command", "vllm", "--model", "Qwen/Qwen3-32B", "--hardware", "sim:a100-80g-x8")
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "perflab-sim" in lines[0] and "./plugins/sim" in lines[0], out.stderr


def test_the_lab_imports_without_the_simulator() -> None:
    """run, launch and bench load these modules: none may import perflab_sim at import time."""
    code = ("import sys; sys.modules['perflab_sim'] = None\n"
            "import perflab.lab.run.executor, perflab.lab.run.runner, perflab.lab.run.backends.ray, perflab.bench.runner, "
            "perflab.observe.telemetry, perflab.testing.conformance, perflab.cli")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_a_third_party_plugin_activates_its_own_hardware_spec(monkeypatch) -> None:
    """perflab_activate_hardware: the plugin owning the spec answers with the environment the
    probes run under; a spec nobody owns is one usage error; `auto` is never offered."""
    import pytest

    from perflab import hookimpl
    from perflab.contract.errors import UsageError
    from perflab.hardware import resolve
    from perflab.plugins import PluginManager, module_plugin

    offered: list[str] = []

    @hookimpl
    def perflab_activate_hardware(spec, env):
        offered.append(spec)
        return {**env, "EMU_MACHINE": spec[4:]} if spec.startswith("emu:") else None

    monkeypatch.setenv("PERFLAB_LOAD_PLUGINS", "")  # only the plugin below (and the core's probes)
    pm = PluginManager()
    assert pm.add_plugin(module_plugin("perflab_emu", perflab_activate_hardware=perflab_activate_hardware)).status == "ok"
    snapshot, env = resolve(pm, "emu:box-1", {"PATH": os.environ.get("PATH", "")})
    assert env["EMU_MACHINE"] == "box-1" and offered == ["emu:box-1"]
    assert snapshot.simulated is False  # activation alone does not make a machine simulated
    with pytest.raises(UsageError, match="expected 'auto'"):
        resolve(pm, "tpu:v5", {})
    resolve(pm, "auto", {"PATH": os.environ.get("PATH", "")})
    assert offered == ["emu:box-1", "tpu:v5"]


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def test_the_core_code_names_nothing_of_the_simulator() -> None:
    """No string, identifier or import of the core's code names the simulator (its variables,
    the wire names it once had, its package), but the install hint for ``sim:``."""
    offenders = []
    for path in sorted(CORE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docs = _docstrings(tree)
        for node in ast.walk(tree):
            spelled: list[str] = []
            if isinstance(node, ast.Constant) and isinstance(node.value, (str, bytes)) and id(node) not in docs:
                text = node.value if isinstance(node.value, str) else node.value.decode("latin-1")
                if INSTALL_HINT not in text:
                    spelled.append(text)
            elif isinstance(node, ast.Name):
                spelled.append(node.id)
            elif isinstance(node, ast.Attribute):
                spelled.append(node.attr)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                spelled.append(node.name)
            elif isinstance(node, ast.arg):
                spelled.append(node.arg)
            elif isinstance(node, ast.alias):
                spelled += [node.name, node.asname or ""]
            elif isinstance(node, ast.ImportFrom):
                spelled.append(node.module or "")
            offenders += [f"{path.relative_to(CORE)}:{getattr(node, 'lineno', 0)}: {s[:80]!r}"
                          for s in spelled if SIMULATOR_NAMES.search(s)]
    assert offenders == []
