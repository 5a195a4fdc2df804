"""Hardware probing: runs every ``perflab_probe_hardware`` implementation.

The built-in probes live beside this file (``nvml.py`` for NVIDIA through nvidia-ml-py,
``npusmi.py`` for Huawei Ascend through ``npu-smi``, ``cpu.py`` for the host CPU); third
parties add accelerator families with the same hook. The CPU is reported only when no probe
found an accelerator: then it is the device CPU engines (vLLM's CPU build, llama.cpp) run on. On a machine another plugin activates (``--hardware sim:NAME``: perflab-sim), the same probes
run against its stand-ins, so the parsing code is exercised exactly as on a real host.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from typing import cast

from perflab.contract.types import Accelerator, HardwareSnapshot
from perflab.hardware import emulation
from perflab.plugins import PluginManager

CPU_KIND = "cpu"  # perflab.hardware.cpu.KIND (not imported: that module imports this one)


def probe(pm: PluginManager, env: Mapping[str, str] | None = None) -> HardwareSnapshot:
    """Ask every hardware plugin; a failing probe becomes an error line, not an exception."""
    env = dict(os.environ if env is None else env)
    accelerators: list[Accelerator] = []
    errors: list[str] = []
    for impl in pm.pm.hook.perflab_probe_hardware.get_hookimpls():
        try:
            found = impl.function(**({"env": env} if "env" in impl.argnames else {}))
        except Exception as exc:  # one broken probe must not hide the others
            errors.append(f"{impl.plugin_name}: {type(exc).__name__}: {exc}")
            continue
        # pluggy types an implementation's result as object: the hookspec's, a list of Accelerator
        accelerators.extend(cast("list[Accelerator]", found or []))
    if any(a.kind != CPU_KIND for a in accelerators):
        accelerators = [a for a in accelerators if a.kind != CPU_KIND]
    sim = emulation.machine(env)
    return HardwareSnapshot(
        accelerators=tuple(accelerators),
        simulated=sim is not None,
        name=sim,
        host=socket.gethostname(),
        errors=tuple(errors),
    )


#: --hardware prefixes a package outside the core provides -> how to install it (one line when missing)
PROVIDERS: dict[str, str] = {"sim:": "perflab-sim (pip install perflab-sim, or ./plugins/sim from a perflab checkout)"}


def resolve(pm: PluginManager, spec: str = "auto", base_env: Mapping[str, str] | None = None) -> tuple[HardwareSnapshot, dict[str, str]]:
    """Turn ``--hardware auto|SPEC`` into (snapshot, environment to launch engines with).

    ``auto`` probes this machine. Any other spec (``sim:NAME``: perflab-sim's simulated
    machines) is activated by the plugin that owns it (``perflab_activate_hardware``), and the
    same probes run under the environment it returns.
    """
    env = dict(os.environ if base_env is None else base_env)
    if spec == "auto":
        return probe(pm, env), env
    env = activate(pm, spec, env)
    return probe(pm, env), env


def activate(pm: PluginManager, spec: str, env: Mapping[str, str]) -> dict[str, str]:
    """The environment the spec ``spec`` (not ``auto``) runs under, from the plugin that owns it
    (``perflab_activate_hardware``), with :data:`emulation.SPEC_ENV` set to ``spec``; a
    one-line UsageError when no installed plugin owns it."""
    from perflab.contract.errors import UsageError

    activated = pm.hook.perflab_activate_hardware(spec=spec, env=dict(env))
    if activated is not None:
        out = dict(activated)
        out[emulation.SPEC_ENV] = spec  # what the activated environment stands for
        return out
    for prefix, package in PROVIDERS.items():
        if spec.startswith(prefix):
            raise UsageError(f"--hardware {spec!r}: {prefix}... hardware is provided by {package}, which is not installed")
    raise UsageError(f"--hardware {spec!r}: expected 'auto' or 'sim:NAME' (e.g. sim:a100-80g-x8)")
