"""Test helpers for perflab plugins, shipped with the core.

* :class:`EngineConformance` — subclass it in your plugin's tests to run the conformance
  suite against your installed plugin.
* :func:`sample_hardware` — a plausible accelerator inventory for preflight/launch tests.
* The pytest plugin (:mod:`perflab.testing.pytest_plugin`, registered through the ``pytest11``
  entry point) adds fixtures: ``perflab_plugin_manager``, ``perflab_hardware``,
  ``perflab_isolated_plugins``.

The two names load on first use (PEP 562): pytest imports this package for its plugin in
every run where perflab is installed, and the conformance kit costs a quarter of a second.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from perflab.testing.conformance import EngineConformance, sample_hardware

__all__ = ["EngineConformance", "sample_hardware"]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module 'perflab.testing' has no attribute {name!r}")
    from perflab.testing import conformance

    value = getattr(conformance, name)
    globals()[name] = value
    return value
