"""Faults and time: what ``PERFLAB_SIM_FAULT`` injects into a simulated engine, and how fast its
simulated time runs (``PERFLAB_SIM_TIME_SCALE``; both names are :mod:`perflab_sim.env`'s).

Simulated time runs the time scale times faster than real time (default 1): a step the
performance model says takes 50 ms is delivered 50 ms / scale after the previous one (the
engine's model clock, :mod:`perflab_sim.clock`, keeps the model's time whatever the host does). Faults (comma separated):
``crash-at-start``, ``crash-after:N``, ``hang-after:N``, ``slow-start:S``, ``bind-fail``,
``ready-then-bind-fail``, ``ignore-sigterm``, ``health-lies``, ``orphan-workers``,
``lying-usage`` (see docs/simulator.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from perflab_sim.env import FAULT_ENV, time_scale

__all__ = ["EXIT_DEADLINE_S", "FAULT_NAMES", "MAX_LAG_S", "Faults", "parse_faults", "time_scale"]

# Real seconds the step clock may run behind and still catch up (steps then run back to back):
# a host hiccup that short (HTTP bursts, another process on the cores) costs no simulated
# throughput. Beyond it the time is lost and counted (the "runs behind" warning).
MAX_LAG_S = 0.5
# After SIGTERM/SIGINT the engine exits within this many real seconds whatever it is doing:
# a watchdog thread ends it (workers killed, memory released) if the orderly shutdown has not
# (an event loop flooded by a benchmark, a stdout pipe nobody drains any more).
EXIT_DEADLINE_S = 1.0
FAULT_NAMES = (
    "crash-at-start", "crash-after", "hang-after", "slow-start", "bind-fail", "ready-then-bind-fail",
    "ignore-sigterm", "health-lies", "orphan-workers", "lying-usage",
)


@dataclass(frozen=True)
class Faults:
    crash_at_start: bool = False
    crash_after: int | None = None
    hang_after: int | None = None
    slow_start_s: float = 0.0
    bind_fail: bool = False
    ready_then_bind_fail: bool = False
    ignore_sigterm: bool = False
    health_lies: bool = False
    orphan_workers: bool = False
    lying_usage: bool = False  # every usage block says prompt_tokens -5, completion_tokens 1000000 (issue 24)


def parse_faults(value: str | None) -> Faults:
    """``"crash-after:3,ignore-sigterm"`` -> Faults; ValueError names an unknown fault."""
    kw: dict[str, Any] = {}
    for item in (value or "").split(","):
        item = item.strip()
        if not item:
            continue
        name, _, arg = item.partition(":")
        if name not in FAULT_NAMES:
            raise ValueError(f"unknown {FAULT_ENV} fault {name!r} (known: {', '.join(FAULT_NAMES)})")
        key = name.replace("-", "_")
        if name in ("crash-after", "hang-after"):
            kw[key] = int(arg or 0)
        elif name == "slow-start":
            kw["slow_start_s"] = float(arg or 0)
        else:
            kw[key] = True
    return Faults(**kw)
