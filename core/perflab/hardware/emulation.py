"""Emulated hardware, asked in one place: whether an environment runs an emulated machine, and
that machine's NVML-compatible module.

An activated environment (``perflab_activate_hardware``: perflab-sim's ``sim:NAME``) says so
itself: :data:`SPEC_ENV` names the spec it stands for, and the stand-ins it names
(:mod:`perflab.hardware.standins`) replace the real tools. The core imports no emulator.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from perflab.hardware.standins import NVML_ENV, standin

#: set in an activated environment to the hardware spec it stands for (``sim:a100-80g-x8``)
SPEC_ENV = "PERFLAB_HARDWARE_SPEC"
#: the spec prefix of simulated machines: reports mark them "(simulated)"
SIM_PREFIX = "sim:"


def machine(env: Mapping[str, str]) -> str | None:
    """The emulated machine ``env`` runs (the name after ``sim:``), or None on a real machine."""
    spec = env.get(SPEC_ENV, "")
    return spec[len(SIM_PREFIX):] or None if spec.startswith(SIM_PREFIX) else None


def nvml(env: Mapping[str, str]) -> Any | None:
    """The activated machine's NVML-compatible module (pynvml's function names), or None."""
    factory = standin(env, NVML_ENV)
    return factory(env) if factory is not None else None
