"""Which engine versions a simulated machine reports, and how to choose them.

Each catalog machine has default versions, the seeds' (``catalog.Machine.engine_versions``).
``PERFLAB_SIM_ENGINE_VERSIONS`` overrides them, e.g. ``vllm=0.17.1,sglang=0.5.9``; a plan's
``simulation.engine_versions`` reaches the simulator through it. :func:`perflab_sim.activate`
writes the chosen versions as the engines' ``*.dist-info`` (and MindIE's ``version.info``),
which is what perflab's plugins and the stand-in front ends read. Engine names are perflab's
(``vllm``, ``sglang``, ``trtllm``, ``vllm-ascend``, ``mindie``); distribution spellings
(``tensorrt_llm``, ``vllm_ascend``) are accepted too. The variable and its value format are
:mod:`perflab_sim.env`'s. An engine the machine does not run
(MindIE on a CUDA machine) is ignored, so one setting can serve several machines.
"""

from __future__ import annotations

from collections.abc import Mapping

from perflab.hardware.emulation import ENGINE_VERSIONS_ENV as LAB_VERSIONS_ENV
from perflab_sim import catalog
from perflab_sim.env import ENGINE_VERSIONS_ENV, KNOWN_ENGINES, engine_name, format_versions, parse_versions

__all__ = ["DISTRIBUTIONS", "ENGINE_VERSIONS_ENV", "KNOWN_ENGINES", "engine_name", "for_machine", "format_versions"]

# engine -> the Python distribution whose metadata carries its version (MindIE has none: its
# version is the version.info file of its install tree)
DISTRIBUTIONS = {"vllm": "vllm", "sglang": "sglang", "trtllm": "tensorrt_llm", "vllm-ascend": "vllm_ascend"}


def for_machine(machine: catalog.Machine, env: Mapping[str, str]) -> dict[str, str]:
    """The versions the engines of ``machine`` report: its defaults, overridden by
    ``PERFLAB_SIM_ENGINE_VERSIONS`` in ``env`` for the engines it runs."""
    versions = dict(machine.engine_versions)
    runs = catalog.ENGINES_BY_KIND[machine.kind]
    # PERFLAB_SIM_ENGINE_VERSIONS set by the user wins over the lab's (a plan's
    # simulation.engine_versions, perflab.hardware.emulation.ENGINE_VERSIONS_ENV)
    source = ENGINE_VERSIONS_ENV if ENGINE_VERSIONS_ENV in env else LAB_VERSIONS_ENV
    for engine, version in parse_versions(env.get(source), source).items():
        if engine in runs:
            versions[engine] = version
    return versions
