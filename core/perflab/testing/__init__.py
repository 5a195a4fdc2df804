"""Test helpers for perflab plugins, shipped with the core.

* :class:`EngineConformance` — subclass it in your plugin's tests to run the conformance
  suite against your installed plugin.
* :func:`sample_hardware` — a plausible accelerator inventory for preflight/launch tests.
* The pytest plugin (:mod:`perflab.testing.pytest_plugin`, registered through the ``pytest11``
  entry point) adds fixtures: ``perflab_plugin_manager``, ``perflab_hardware``,
  ``perflab_isolated_plugins``.
"""

from perflab.testing.conformance import EngineConformance, sample_hardware

__all__ = ["EngineConformance", "sample_hardware"]
