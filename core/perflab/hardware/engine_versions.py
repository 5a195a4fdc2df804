"""Engine versions an activated machine reports, as one environment value, declared once.

``vllm=0.17.1,sglang=0.5.9``: a plan's ``simulation.engine_versions`` reaches the activated
machine through :data:`perflab.hardware.emulation.ENGINE_VERSIONS_ENV` in this form (perflab-sim also
reads a variable of its own in it). ``source`` names the setting an error is about.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from perflab.contract.errors import UsageError
from perflab.hardware.emulation import ENGINE_VERSIONS_ENV

#: perflab's engine names a version may be set for
KNOWN_ENGINES = ("vllm", "sglang", "trtllm", "vllm-ascend", "mindie")
ALIASES = {"tensorrt_llm": "trtllm", "tensorrt-llm": "trtllm", "vllm_ascend": "vllm-ascend"}
VERSION_RE = re.compile(r"^\d+(?:\.\d+)*[A-Za-z0-9.+-]*$")


def engine_name(name: str, source: str = ENGINE_VERSIONS_ENV) -> str:
    """perflab's name for ``name`` (an engine or distribution name); UsageError if none."""
    key = name.strip().lower()
    key = ALIASES.get(key, key)
    if key not in KNOWN_ENGINES:
        raise UsageError(
            f"{source}: unknown engine {name.strip()!r} (expected one of: {', '.join(KNOWN_ENGINES)})"
        )
    return key


def check_version(engine: str, version: object, source: str = ENGINE_VERSIONS_ENV) -> str:
    text = str(version).strip()
    if not VERSION_RE.match(text):
        raise UsageError(f"{source}: {engine}={text!r} is not a version (expected e.g. 0.17.1)")
    return text


def parse_versions(value: str | None, source: str = ENGINE_VERSIONS_ENV) -> dict[str, str]:
    """``"vllm=0.17.1,sglang=0.5.9"`` -> ``{"vllm": "0.17.1", "sglang": "0.5.9"}``."""
    out: dict[str, str] = {}
    for item in (value or "").split(","):
        if not item.strip():
            continue
        name, sep, version = item.partition("=")
        if not sep:
            raise UsageError(f"{source}: expected ENGINE=VERSION, got {item.strip()!r}")
        engine = engine_name(name, source)
        out[engine] = check_version(engine, version, source)
    return out


def format_versions(versions: Mapping[str, str], source: str = ENGINE_VERSIONS_ENV) -> str:
    """The value for ``versions`` (validated)."""
    checked = {engine_name(k, source): check_version(k, v, source) for k, v in versions.items()}
    return ",".join(f"{k}={v}" for k, v in sorted(checked.items()))
