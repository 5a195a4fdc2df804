"""The simulator's environment variables, declared once: their names, what each means, and the
format of the values other parts of perflab write (the time scale, the engine versions).

Everything that reads or sets a ``PERFLAB_SIM_*`` variable imports the name from here: the
simulator's stand-ins, probes and tools, and the simulator's tests. The core names none of them
(it reaches an activated machine through :mod:`perflab.hardware.standins`). This module imports
nothing of the simulator, only the standard library, :mod:`perflab.contract.errors` and the core's
engine-versions format (:mod:`perflab.hardware.engine_versions`), so a stand-in learns a
variable's name without loading the simulator. docs/simulator.md lists
:data:`VARIABLES` (a test keeps them in step).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from perflab.hardware import engine_versions
from perflab.hardware.engine_versions import KNOWN_ENGINES as KNOWN_ENGINES  # re-exported (versions.py)

HARDWARE_ENV = "PERFLAB_SIM_HARDWARE"
STATE_ENV = "PERFLAB_SIM_STATE_DIR"
TIME_SCALE_ENV = "PERFLAB_SIM_TIME_SCALE"
FAULT_ENV = "PERFLAB_SIM_FAULT"
FAULT_NODE_RANK_ENV = "PERFLAB_SIM_FAULT_NODE_RANK"
ENGINE_VERSIONS_ENV = "PERFLAB_SIM_ENGINE_VERSIONS"
WORKER_ENV = "PERFLAB_SIM_WORKER"

#: every PERFLAB_SIM_* variable -> its one-line meaning (docs/simulator.md lists these)
VARIABLES: dict[str, str] = {
    HARDWARE_ENV: "the catalog machine being simulated (e.g. h100-80g-x8); set: the probes and stand-ins simulate it",
    STATE_ENV: "directory of the simulated device-memory registry (one JSON file per process holding memory)",
    TIME_SCALE_ENV: "simulated seconds per real second, a positive number (default 1)",
    FAULT_ENV: "faults a stand-in engine injects, comma separated (e.g. crash-after:3,ignore-sigterm)",
    FAULT_NODE_RANK_ENV: "in a multi-node launch, the node rank whose process injects the faults (default: every rank)",
    ENGINE_VERSIONS_ENV: "engine versions the simulated machine reports, e.g. vllm=0.17.1,sglang=0.5.9",
    WORKER_ENV: "internal: a simulated worker process's arguments (JSON), set by the engine that spawns it",
}


def time_scale(env: Mapping[str, str]) -> float:
    """``PERFLAB_SIM_TIME_SCALE`` in ``env`` (default 1); ValueError if not a positive number."""
    raw = env.get(TIME_SCALE_ENV, "").strip()
    if not raw:
        return 1.0
    scale = float(raw)
    if not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"{TIME_SCALE_ENV} must be a positive number, not {raw!r}")
    return scale


# PERFLAB_SIM_ENGINE_VERSIONS: the value format is the core's (perflab.hardware.engine_versions),
# errors name this variable


def engine_name(name: str) -> str:
    return engine_versions.engine_name(name, ENGINE_VERSIONS_ENV)


def parse_versions(value: str | None, source: str = ENGINE_VERSIONS_ENV) -> dict[str, str]:
    return engine_versions.parse_versions(value, source)


def format_versions(versions: Mapping[str, str]) -> str:
    return engine_versions.format_versions(versions, ENGINE_VERSIONS_ENV)


def fault_applies(env: Mapping[str, str], node_rank: int) -> bool:
    """Whether the process of node rank ``node_rank`` injects ``PERFLAB_SIM_FAULT``
    (``PERFLAB_SIM_FAULT_NODE_RANK`` unset: every rank does); ValueError if it is not a rank."""
    raw = env.get(FAULT_NODE_RANK_ENV, "").strip()
    if not raw:
        return True
    if not raw.isdigit():
        raise ValueError(f"{FAULT_NODE_RANK_ENV} must be a node rank (0, 1, ...), not {raw!r}")
    return int(raw) == node_rank
