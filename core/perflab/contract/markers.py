"""pluggy's markers for perflab's hooks, declared once below everything that uses them.

:mod:`perflab.contract.hookspecs` declares the hooks with :data:`hookspec`; plugins (and the engine base
class, :mod:`perflab.contract.plugin_base`) implement them with :data:`hookimpl`. They live here rather
than in the hookspecs so that the engine base can be imported by the hookspecs' annotations
without an import cycle.
"""

from __future__ import annotations

import pluggy

PROJECT = "perflab"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)
