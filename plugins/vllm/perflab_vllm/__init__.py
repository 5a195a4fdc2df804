"""perflab engine plugin for vLLM (``vllm serve``).

Import-light on purpose: ``perflab engines list`` loads this module, so it imports only
perflab's types here and the plugin's own modules inside the hooks. It never imports vllm.
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

INFO = EngineInfo(
    name=ENGINE,
    display_name="vLLM",
    accelerators=("cuda",),
    description="vLLM's OpenAI-compatible server (vllm serve) on NVIDIA GPUs",
    executable="vllm",
    distributions=("vllm",),
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

    return build_launch(config)


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
