"""A simulated engine worker process (one tensor-parallel rank, like vLLM's workers).

It holds its devices' memory in the registry (:mod:`perflab_sim.state`) and waits for a signal.
Like real engine workers it does not watch its parent: if the server dies without stopping it
(SIGKILL to the server alone), the worker lives on and its memory stays in use until someone
kills it — which is what perflab's teardown must catch. SIGTERM/SIGINT end it at once, unless
the ``ignore-sigterm`` fault is on, when only SIGKILL does.

Started by :func:`spawn` with ``argv[0]`` set to the worker's title (``VllmWorker TP0``), so
process listings show the engine's name for it; its ``comm`` is set to the same (15 chars).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from perflab_sim.env import WORKER_ENV as ARGS_ENV


def set_process_name(name: str) -> None:
    """Linux ``comm`` (what ``ps -o comm``/psutil ``name()`` show), best effort."""
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        pr_set_name = 15
        libc.prctl(pr_set_name, name.encode()[:15], 0, 0, 0)
    except (OSError, AttributeError):
        pass


def spawn(
    title: str,
    engine: str,
    devices: Sequence[int],
    mib: Sequence[int],
    state_dir: Path | None,
    ignore_sigterm: bool,
    env: Mapping[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """Start a worker; it registers its memory before printing nothing and waiting."""
    args = {
        "title": title,
        "engine": engine,
        "devices": list(devices),
        "mib": list(mib),
        "state_dir": str(state_dir) if state_dir else None,
        "ignore_sigterm": ignore_sigterm,
        "path": sys.path,
    }
    child_env = dict(os.environ if env is None else env)
    child_env[ARGS_ENV] = json.dumps(args)
    # argv[0] is the title; the interpreter finds perflab through the parent's sys.path.
    bootstrap = (
        "import json,os,sys;a=json.loads(os.environ['" + ARGS_ENV + "']);"
        "sys.path[:0]=[p for p in a['path'] if p not in sys.path];"
        "from perflab_sim.worker import main;main(a)"
    )
    return subprocess.Popen(
        [title, "-c", bootstrap],
        executable=sys.executable,
        env=child_env,
        stdin=subprocess.DEVNULL,
        close_fds=True,
    )


def main(args: Mapping[str, Any]) -> None:  # the JSON the parent wrote
    from perflab_sim import state

    os.environ.pop(ARGS_ENV, None)
    title = str(args["title"])
    set_process_name(title)
    directory = Path(str(args["state_dir"])) if args.get("state_dir") else None

    def stop(signum: int, frame: object) -> None:
        if directory is not None:
            state.unregister(directory)
        os._exit(0)

    if args.get("ignore_sigterm"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
    if directory is not None:
        devices = [int(d) for d in args.get("devices", [])]
        mib = [int(m) for m in args.get("mib", [])]
        state.register(directory, str(args["engine"]), title, devices, mib)
    while True:
        signal.pause()
