"""Simulated engine front ends: each parses its engine's real command line (or MindIE's
config.json) the way the engine does, decides what the engine would do on the simulated
machine, and hands a :class:`perflab_sim.config.SimEngineConfig` to the runtime.

Every module exposes ``parse(argv, env) -> SimEngineConfig`` (raising
:class:`perflab_sim.frontends.common.EngineExit` where the engine exits before serving) and
``main(argv) -> int``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

# executable basename -> front-end module
EXECUTABLES: dict[str, str] = {
    "vllm": "perflab_sim.frontends.vllm",
    "trtllm-serve": "perflab_sim.frontends.trtllm",
    "mindieservice_daemon": "perflab_sim.frontends.mindie",
}
SGLANG_MODULE = "sglang.launch_server"


def frontend_for(argv: Sequence[str]) -> tuple[str, list[str]]:
    """Which front end runs ``argv`` and the arguments it parses.

    ``python -m sglang.launch_server ARGS`` is SGLang with ``ARGS``; otherwise the
    executable's basename names the engine.
    """
    if not argv:
        raise ValueError("empty argv")
    args = list(argv)
    if "-m" in args[:-1]:
        i = args.index("-m")
        if args[i + 1] == SGLANG_MODULE:
            return "perflab_sim.frontends.sglang", args[i + 2 :]
    name = os.path.basename(args[0])
    if name in EXECUTABLES:
        return EXECUTABLES[name], args[1:]
    raise ValueError(f"no simulated engine runs {args[0]!r}")
