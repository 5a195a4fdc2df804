"""SGLang's installed version, read from package metadata — never by importing sglang."""

from __future__ import annotations

import importlib.metadata
import os
import sys
from collections.abc import Iterable, Mapping


def search_path(env: Mapping[str, str]) -> list[str]:
    """Where the engine's interpreter finds packages: ``PYTHONPATH`` first (as Python itself
    orders it; the simulator puts its ``sglang-*.dist-info`` there), then our own sys.path."""
    extra = [d for d in env.get("PYTHONPATH", "").split(os.pathsep) if d]
    return [*extra, *sys.path]


def installed_version(distributions: Iterable[str], env: Mapping[str, str]) -> str | None:
    path = search_path(env)
    for name in distributions:
        for dist in importlib.metadata.distributions(name=name, path=path):
            version = dist.version
            if version:
                return str(version)
    return None
