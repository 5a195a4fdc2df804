"""A cached layer on the vLLM CPU environment: what :mod:`perflab.realengine.sglang` and
:mod:`perflab.realengine.transformers_serve` share.

A layer is one folder beside the vLLM environment (``$PERFLAB_ENGINE_CACHE``), built by its
module's steps under a file lock and marked complete (:data:`~perflab.realengine.env.STAMP`,
holding the recipe) only once every step passed, so a half-built layer is never used: a
folder whose stamp does not name the current recipe is removed and built again. The recipe
hashes what the layer pins, the base environment's own recipe (a rebuilt base rebuilds its
layers) and the source of the module that builds it.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from perflab.realengine.env import STAMP, RealEngineEnv

__all__ = ["ensure_layer", "purelib", "recipe", "stamp", "step"]


def stamp(target: Path) -> dict[str, object]:
    """The completion stamp of an environment or layer folder ({} if none or unreadable)."""
    try:
        got = json.loads((target / STAMP).read_text())
    except (OSError, ValueError):
        return {}
    return got if isinstance(got, dict) else {}


def recipe(parts: Iterable[object], base: RealEngineEnv, source: Path) -> str:
    """The layer's key: ``parts`` (its pins), ``base``'s recipe and the ``source`` building it."""
    h = hashlib.sha256()
    for part in (*parts, stamp(base.root).get("recipe", "")):
        h.update(str(part).encode() + b"\0")
    h.update(source.read_bytes())
    return h.hexdigest()[:12]


def purelib(python: Path) -> Path:
    """``python``'s site-packages (its ``purelib``)."""
    out = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, check=True, timeout=60)
    return Path(out.stdout.strip())


def step(argv: list[str], what: str, timeout: float, extra_env: dict[str, str] | None = None) -> None:
    """One build step; a failure raises with the step's name and its output's last lines."""
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False,
                          env={**os.environ, **extra_env} if extra_env else None)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise RuntimeError(f"{what} failed (exit {proc.returncode}):\n{tail}")


def ensure_layer(top: Path, name: str, key: str, load: Callable[[Path], RealEngineEnv | None],
                 build: Callable[[Path], dict[str, object]]) -> RealEngineEnv:
    """The layer ``top/name`` of recipe ``key``: ``load(target)`` when its stamp names ``key``,
    else (under ``top/name.lock``) an empty folder handed to ``build(target)``, whose returned
    facts are stamped with the recipe and the build's seconds once it has passed."""
    top.mkdir(parents=True, exist_ok=True)
    target = top / name
    with open(top / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        env = load(target) if stamp(target).get("recipe") == key else None
        if env is not None:
            return env
        started = time.monotonic()
        if target.exists():
            shutil.rmtree(target)  # incomplete or from another recipe: never half-used
        target.mkdir(parents=True)
        facts = build(target)
        install_s = time.monotonic() - started
        (target / STAMP).write_text(json.dumps({"recipe": key, **facts, "install_s": round(install_s, 1)}) + "\n")
        env = load(target)
        if env is None:
            raise RuntimeError(f"the layer {target} was built but does not load")
        return RealEngineEnv(**{**env.__dict__, "install_s": install_s})
