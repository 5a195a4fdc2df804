"""perflab: a performance lab for LLM inference engines.

Kept import-light: ``perflab engines list`` must start fast, and every pytest run where perflab
is installed imports this package (its pytest plugin, :mod:`perflab.testing.pytest_plugin`),
so the public names below -- the hook markers and the boundary types -- are loaded on first
use (PEP 562), not when the package is imported.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what type checkers and readers see; __getattr__ below is what runs
    from perflab.contract.hookspecs import HOOKSPEC_VERSION, hookimpl
    from perflab.contract.plugin_base import EnginePlugin, Maps, Refuses
    from perflab.contract.types import (
        Accelerator,
        CacheReset,
        CrashCause,
        EngineInfo,
        FileSpec,
        GroupNode,
        HardwareSnapshot,
        HttpProbe,
        LaunchSpec,
        MetricsEndpoint,
        NodeGroup,
        Readiness,
        ServeConfig,
        Unsupported,
    )

__version__ = "0.1.0"

__all__ = [
    "HOOKSPEC_VERSION",
    "Accelerator",
    "CacheReset",
    "CrashCause",
    "EngineInfo",
    "EnginePlugin",
    "FileSpec",
    "GroupNode",
    "HardwareSnapshot",
    "HttpProbe",
    "LaunchSpec",
    "Maps",
    "MetricsEndpoint",
    "NodeGroup",
    "Readiness",
    "Refuses",
    "ServeConfig",
    "Unsupported",
    "__version__",
    "hookimpl",
]

#: the modules the public names come from (tests/test_lazy_imports.py checks that these, the
#: TYPE_CHECKING imports and ``__all__`` agree)
_HOMES = ("perflab.contract.hookspecs", "perflab.contract.plugin_base", "perflab.contract.types")


def __getattr__(name: str) -> Any:
    if name in __all__:
        for home in _HOMES:
            module = importlib.import_module(home)
            if hasattr(module, name):
                value = getattr(module, name)
                globals()[name] = value  # once: later lookups are plain attribute reads
                return value
    raise AttributeError(f"module 'perflab' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
