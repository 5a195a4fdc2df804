"""pytest plugin shipped with perflab (entry point ``pytest11``): fixtures for plugin tests.

Kept import-light: it is loaded by every pytest run in an environment where perflab is
installed, so perflab itself is imported only when a fixture is used.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest


@pytest.fixture
def perflab_plugin_manager() -> Any:
    """A plugin manager loaded the way the CLI loads it (built-ins plus entry points)."""
    from perflab.plugins import load

    return load()


@pytest.fixture
def perflab_hardware() -> Callable[..., Any]:
    """Factory: ``perflab_hardware("cuda", 8)`` -> a HardwareSnapshot of 8 sample devices."""
    from perflab.testing.conformance import sample_hardware

    return sample_hardware


@pytest.fixture
def perflab_isolated_plugins(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Any]]:
    """Factory for a manager with only the plugin objects you pass (no entry points).

    ``pm = perflab_isolated_plugins(my_module)`` — handy to test a plugin module before it
    is installed, or to test how perflab treats a broken one.
    """
    from perflab.plugins import PluginManager

    def make(*plugins: object, builtins: bool = False) -> Any:
        pm = PluginManager(entrypoints=False, builtins=builtins)
        for p in plugins:
            pm.add_plugin(p)
        return pm

    yield make
