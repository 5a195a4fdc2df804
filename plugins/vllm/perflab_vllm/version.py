"""The installed engine version, found without importing the engine.

Where to look, in the order the engine itself would resolve its package: the directories of
``env["PYTHONPATH"]`` (the simulator puts a ``vllm-X.dist-info`` there), the site-packages of
the virtual environment that owns the ``vllm`` executable on ``env["PATH"]`` (the engine may
live in another venv than perflab), then perflab's own ``sys.path``. Last resort: run
``vllm --version`` (argparse ``action="version"`` in vllm/entrypoints/cli/main.py).
"""

from __future__ import annotations

import glob
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

VERSION_TIMEOUT_S = 20.0  # `vllm --version` imports the CLI; it is slow but must not hang us
_VERSION_RE = re.compile(r"\b(\d+\.\d+(?:\.\d+)?(?:[a-z0-9.+-]*)?)\b")


def _venv_site_packages(executable: str | None) -> list[str]:
    if executable is None:
        return []
    prefix = Path(executable).resolve().parent.parent
    if not (prefix / "pyvenv.cfg").is_file():
        return []
    return sorted(glob.glob(str(prefix / "lib" / "python3*" / "site-packages")))


def search_path(env: Mapping[str, str], executable: str | None = None) -> list[str]:
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    paths += _venv_site_packages(executable)
    paths += [p for p in sys.path if p]
    seen: set[str] = set()
    return [p for p in paths if not (p in seen or seen.add(p))]


def metadata_version(names: Iterable[str], paths: list[str]) -> str | None:
    """The version of the first distribution named in ``names`` found on ``paths``.

    ``importlib.metadata`` normalises names, so ``vllm-ascend`` also finds
    ``vllm_ascend-0.11.0rc2.dist-info``.
    """
    for name in names:
        for dist in importlib.metadata.distributions(name=name, path=paths):
            version = dist.version
            if version:
                return version
    return None


def executable_version(executable: str, env: Mapping[str, str]) -> str | None:
    try:
        out = subprocess.run(
            [executable, "--version"],
            env=dict(env),
            capture_output=True,
            text=True,
            timeout=VERSION_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    for line in reversed(out.stdout.splitlines()):
        match = _VERSION_RE.search(line)
        if match:
            return match.group(1)
    return None


def installed_version(
    distributions: Iterable[str],
    env: Mapping[str, str],
    executable: str | None = None,
    run_executable: bool = True,
) -> str | None:
    exe = shutil.which(executable, path=env.get("PATH")) if executable else None
    found = metadata_version(distributions, search_path(env, exe))
    if found is not None or exe is None or not run_executable:
        return found
    return executable_version(exe, env)
