"""Which engine versions a simulated machine reports, and how to choose them.

Each catalog machine has default versions, the seeds' (``catalog.Machine.engine_versions``).
``PERFLAB_SIM_ENGINE_VERSIONS`` overrides them, e.g. ``vllm=0.17.1,sglang=0.5.9``; a plan's
``simulation.engine_versions`` reaches the simulator through it. :func:`perflab.sim.activate`
writes the chosen versions as the engines' ``*.dist-info`` (and MindIE's ``version.info``),
which is what perflab's plugins and the stand-in front ends read. Engine names are perflab's
(``vllm``, ``sglang``, ``trtllm``, ``vllm-ascend``, ``mindie``); distribution spellings
(``tensorrt_llm``, ``vllm_ascend``) are accepted too. An engine the machine does not run
(MindIE on a CUDA machine) is ignored, so one setting can serve several machines.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from perflab.errors import UsageError
from perflab.sim import catalog

ENGINE_VERSIONS_ENV = "PERFLAB_SIM_ENGINE_VERSIONS"

# engine -> the Python distribution whose metadata carries its version (MindIE has none: its
# version is the version.info file of its install tree)
DISTRIBUTIONS = {"vllm": "vllm", "sglang": "sglang", "trtllm": "tensorrt_llm", "vllm-ascend": "vllm_ascend"}
_ALIASES = {"tensorrt_llm": "trtllm", "tensorrt-llm": "trtllm", "vllm_ascend": "vllm-ascend"}
KNOWN_ENGINES = ("vllm", "sglang", "trtllm", "vllm-ascend", "mindie")
_VERSION_RE = re.compile(r"^\d+(?:\.\d+)*[A-Za-z0-9.+-]*$")


def engine_name(name: str) -> str:
    """perflab's name for ``name`` (an engine or distribution name); UsageError if none."""
    key = name.strip().lower()
    key = _ALIASES.get(key, key)
    if key not in KNOWN_ENGINES:
        raise UsageError(
            f"{ENGINE_VERSIONS_ENV}: unknown engine {name.strip()!r} (expected one of: {', '.join(KNOWN_ENGINES)})"
        )
    return key


def check_version(engine: str, version: object) -> str:
    text = str(version).strip()
    if not _VERSION_RE.match(text):
        raise UsageError(f"{ENGINE_VERSIONS_ENV}: {engine}={text!r} is not a version (expected e.g. 0.17.1)")
    return text


def parse(value: str | None) -> dict[str, str]:
    """``"vllm=0.17.1,sglang=0.5.9"`` -> ``{"vllm": "0.17.1", "sglang": "0.5.9"}``."""
    out: dict[str, str] = {}
    for item in (value or "").split(","):
        if not item.strip():
            continue
        name, sep, version = item.partition("=")
        if not sep:
            raise UsageError(f"{ENGINE_VERSIONS_ENV}: expected ENGINE=VERSION, got {item.strip()!r}")
        engine = engine_name(name)
        out[engine] = check_version(engine, version)
    return out


def format_versions(versions: Mapping[str, str]) -> str:
    """The ``PERFLAB_SIM_ENGINE_VERSIONS`` value for ``versions`` (validated)."""
    checked = {engine_name(k): check_version(k, v) for k, v in versions.items()}
    return ",".join(f"{k}={v}" for k, v in sorted(checked.items()))


def for_machine(machine: catalog.Machine, env: Mapping[str, str]) -> dict[str, str]:
    """The versions the engines of ``machine`` report: its defaults, overridden by
    ``PERFLAB_SIM_ENGINE_VERSIONS`` in ``env`` for the engines it runs."""
    versions = dict(machine.engine_versions)
    runs = catalog.ENGINES_BY_KIND[machine.kind]
    for engine, version in parse(env.get(ENGINE_VERSIONS_ENV)).items():
        if engine in runs:
            versions[engine] = version
    return versions
