"""Emulated hardware, asked in one place: whether an environment runs an emulated machine, and
that machine's NVML-compatible module.

Today the one emulator is perflab-sim (a distribution of its own, ./plugins/sim); without it
installed nothing is emulated and the probes read the real machine. This module is the single
place the core still reaches into it (to be replaced by a hook, docs/simulator.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def machine(env: Mapping[str, str]) -> str | None:
    """The emulated machine ``env`` runs (a catalog name), or None on a real machine."""
    try:
        from perflab_sim.env import HARDWARE_ENV
    except ImportError:  # perflab-sim not installed: nothing can be emulated
        return None
    return env.get(HARDWARE_ENV) or None


def nvml(env: Mapping[str, str]) -> Any | None:
    """The emulated machine's NVML-compatible module (pynvml's function names), or None."""
    if machine(env) is None:
        return None
    from perflab_sim.nvml import NvmlShim

    return NvmlShim(env)
