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
#: set by the lab before activating a spec other than ``auto``: the directory the activated
#: machine keeps its state in for this study (one per node), so machines activated elsewhere on
#: the host do not share it (perflab-sim: its device-memory registry)
MACHINE_STATE_ENV = "PERFLAB_MACHINE_STATE_DIR"
#: set in an activated environment whose engines run faster than real time: the name of the
#: variable they take the time scale from (engine seconds per real second); the lab writes a
#: plan's ``simulation.time_scale`` into it. Unset: the machine runs in real time
TIME_SCALE_VAR_ENV = "PERFLAB_TIME_SCALE_VAR"
#: set by the lab from a plan's ``simulation.engine_versions``: the engine versions an activated
#: machine should report (``vllm=0.17.1,sglang=0.5.9``, :mod:`perflab.hardware.engine_versions`)
ENGINE_VERSIONS_ENV = "PERFLAB_ENGINE_VERSIONS"


def machine(env: Mapping[str, str]) -> str | None:
    """The emulated machine ``env`` runs (the name after ``sim:``), or None on a real machine."""
    spec = env.get(SPEC_ENV, "")
    return spec[len(SIM_PREFIX):] or None if spec.startswith(SIM_PREFIX) else None


def nvml(env: Mapping[str, str]) -> Any | None:
    """The activated machine's NVML-compatible module (pynvml's function names), or None."""
    factory = standin(env, NVML_ENV)
    return factory(env) if factory is not None else None
