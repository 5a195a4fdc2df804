"""TensorRT-LLM's installed version, without importing tensorrt_llm into perflab.

First the package metadata (``tensorrt_llm-*.dist-info``) on ``PYTHONPATH`` + sys.path; then
``trtllm-serve --version`` found on the environment's ``PATH``. trtllm-serve has no
``--version`` option of its own (its click group falls through to ``serve``), but importing
tensorrt_llm prints the banner ``[TensorRT-LLM] TensorRT LLM version: 1.2.0rc1`` (older
releases: ``TensorRT-LLM version:``) before click rejects the option, so the banner is parsed
whatever the exit status; a plain ``trtllm-serve, version X`` line is accepted too.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping

VERSION_TIMEOUT_S = 15.0
_BANNER = re.compile(r"TensorRT[- ]LLM version:\s*v?(\S+)")
_PLAIN = re.compile(r"\bversion[:\s]+v?(\d+\.\d+[\w.+-]*)", re.I)


def search_path(env: Mapping[str, str]) -> list[str]:
    extra = [d for d in env.get("PYTHONPATH", "").split(os.pathsep) if d]
    return [*extra, *sys.path]


def metadata_version(distributions: Iterable[str], env: Mapping[str, str]) -> str | None:
    path = search_path(env)
    for name in distributions:
        for dist in importlib.metadata.distributions(name=name, path=path):
            if dist.version:
                return str(dist.version)
    return None


def parse_version_output(text: str) -> str | None:
    for pattern in (_BANNER, _PLAIN):
        m = pattern.search(text)
        if m:
            return m.group(1)
    return None


def executable_version(executable: str, env: Mapping[str, str]) -> str | None:
    exe = shutil.which(executable, path=env.get("PATH"))
    if exe is None:
        return None
    try:
        done = subprocess.run(
            [exe, "--version"], env=dict(env), capture_output=True, text=True, timeout=VERSION_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_version_output(done.stdout + "\n" + done.stderr)


def installed_version(distributions: Iterable[str], executable: str, env: Mapping[str, str]) -> str | None:
    return metadata_version(distributions, env) or executable_version(executable, env)
