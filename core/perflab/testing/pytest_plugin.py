"""pytest plugin shipped with perflab: fixtures for testing perflab plugins."""

from __future__ import annotations

import pytest


@pytest.fixture
def perflab_plugin_manager():
    """A plugin manager loaded the way the CLI loads it (built-ins plus entry points)."""
    from perflab.plugins import load

    return load()
