"""Stand-ins an activated environment may name for the machine's tools, declared once.

A plugin that activates a hardware spec (``perflab_activate_hardware``, e.g. perflab-sim's
``sim:NAME``) may set these variables in the environment it returns, each to
``module:callable`` importable by perflab; the core then calls the callable instead of reading
the real tool. They travel with the environment, so a Ray node or an engine's own process
sees the same stand-ins. Unset: the real tools (pynvml, npu-smi), as on any machine.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

#: ``callable(env) -> object`` with pynvml's function names (``nvmlInit``,
#: ``nvmlDeviceGetHandleByIndex`` ...): read instead of pynvml by the NVIDIA probe and telemetry
NVML_ENV = "PERFLAB_NVML"
#: ``callable(env, devices) -> float | None``: the engines' own clock on those devices (seconds,
#: at their latest publication); telemetry stamps each sample with it (``engine_t``)
DEVICE_CLOCK_ENV = "PERFLAB_DEVICE_CLOCK"
#: ``callable(env, devices) -> list[(device, pid, name, mib)]``: the processes holding memory on
#: those devices (the stand-in for NVML's and npu-smi's process lists; the integrity check)
DEVICE_MEMORY_ENV = "PERFLAB_DEVICE_MEMORY"

#: ``callable(env, args) -> str``: what ``npu-smi *args`` prints on stdout, raising on what the
#: tool would fail with; asked instead of running the ``npu-smi`` found on PATH (the Ascend probe
#: and telemetry), which on an emulated machine is a Python process per call (ten per probe of an
#: 8-NPU machine)
NPU_SMI_ENV = "PERFLAB_NPU_SMI"

#: every stand-in variable -> its meaning (docs/writing-plugins.md lists them)
VARIABLES: dict[str, str] = {
    NVML_ENV: "module:callable(env) returning an object with pynvml's function names",
    DEVICE_CLOCK_ENV: "module:callable(env, devices) returning the engines' own clock on those devices, or None",
    DEVICE_MEMORY_ENV: "module:callable(env, devices) returning (device, pid, name, MiB) per process holding device memory",
    NPU_SMI_ENV: "module:callable(env, args) returning what `npu-smi *args` prints on stdout",
}


def standin(env: Mapping[str, str], variable: str) -> Callable[..., Any] | None:
    """The callable ``env[variable]`` names (``module:attr``); None when unset. ValueError
    when it is not of that form; ImportError / AttributeError when it does not resolve."""
    target = env.get(variable, "").strip()
    if not target:
        return None
    module, sep, attr = target.partition(":")
    if not sep or not module or not attr:
        raise ValueError(f"{variable}={target!r}: expected module:callable")
    fn = getattr(importlib.import_module(module), attr)
    if not callable(fn):
        raise ValueError(f"{variable}={target!r}: {attr} is not callable")
    return fn
