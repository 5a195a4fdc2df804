"""perflab's pytest plugin costs nothing in a pytest run that uses none of its fixtures.

pytest imports ``perflab.testing.pytest_plugin`` (entry point ``pytest11``) in every run of any
project where perflab is installed, so the plugin module imports only pytest, and the
packages above it (``perflab``, ``perflab.testing``) load their public names on first use.
Measured with ``python -X importtime -c "import pytest; import perflab.testing.pytest_plugin"``
on the 2-core development machine (busy): 101 ms median (34 ms at best) before, 1.3 ms after.
"""

from __future__ import annotations

import ast
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import perflab

INIT = Path(__file__).resolve().parents[1] / "core" / "perflab" / "__init__.py"

RECORDER = """
import json, sys

def pytest_sessionfinish(session):
    loaded = sorted(m for m in sys.modules if m == "perflab" or m.startswith("perflab."))
    with open("loaded.json", "w") as f:
        json.dump(loaded, f)
"""


def _pytest(directory: Path) -> subprocess.CompletedProcess[str]:
    """pytest in ``directory`` as a project of its own would run it: plugins autoloaded."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "PYTEST_DISABLE_PLUGIN_AUTOLOAD")}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
                          cwd=directory, env=env, capture_output=True, text=True, timeout=120)


def test_a_run_without_perflab_fixtures_loads_only_the_plugin_module(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(RECORDER)
    (tmp_path / "test_plain.py").write_text("def test_plain():\n    assert 1 + 1 == 2\n")
    done = _pytest(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    loaded = json.loads((tmp_path / "loaded.json").read_text())
    # the plugin itself was loaded (else this test proves nothing), and nothing else of perflab's
    assert loaded == ["perflab", "perflab.testing", "perflab.testing.pytest_plugin"], loaded


def test_the_fixtures_load_perflab_when_used(tmp_path: Path) -> None:
    (tmp_path / "test_fixtures.py").write_text(
        "def test_fixtures(perflab_plugin_manager, perflab_hardware, perflab_isolated_plugins):\n"
        "    from perflab.contract.types import HardwareSnapshot\n"
        "    from perflab.plugins import PluginManager\n"
        "    assert isinstance(perflab_plugin_manager, PluginManager)\n"
        "    assert 'vllm' in perflab_plugin_manager.engine_names()\n"
        "    hw = perflab_hardware('cuda', 2)\n"
        "    assert isinstance(hw, HardwareSnapshot) and len(hw.accelerators) == 2\n"
        "    assert perflab_isolated_plugins().engine_names() == []\n"
    )
    done = _pytest(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_lazy_names_are_the_declared_ones() -> None:
    """``perflab``'s TYPE_CHECKING imports (what type checkers see), its ``__all__`` and the
    modules its ``__getattr__`` searches agree, and every public name resolves to the object
    its module declares."""
    tree = ast.parse(INIT.read_text(encoding="utf-8"))
    typed = {(node.module, a.name) for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
             and node.module and node.module.startswith("perflab.") for a in node.names}
    assert {name for _, name in typed} == set(perflab.__all__) - {"__version__"}
    assert {module for module, _ in typed} == set(perflab._HOMES)  # the module's own table, read by its test
    for module, name in typed:
        assert getattr(perflab, name) is getattr(importlib.import_module(module), name), name
    assert {"hookimpl", "EnginePlugin"} <= set(dir(perflab))
