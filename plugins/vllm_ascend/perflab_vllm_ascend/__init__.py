"""perflab engine plugin for vLLM-Ascend (``vllm serve`` on Huawei Ascend NPUs).

Builds on perflab_vllm: vLLM-Ascend is a vLLM platform plugin with vLLM's own command line.
Import-light: only perflab's types at import time, the plugin's modules inside the hooks.
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

ENGINE = "vllm-ascend"

INFO = EngineInfo(
    name=ENGINE,
    display_name="vLLM-Ascend",
    accelerators=("ascend",),
    description="vLLM with the vLLM-Ascend platform plugin (vllm serve) on Huawei Ascend NPUs",
    executable="vllm",
    distributions=("vllm-ascend",),  # dist-info names are normalised: vllm_ascend-X.dist-info
    homepage="https://docs.vllm.ai/projects/ascend",
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

    # Installed only when the environment that runs `vllm` has a vllm-ascend distribution:
    # any vLLM on PATH (a CUDA or CPU build) is not vLLM-Ascend.
    return installed_version(INFO.distributions, env, executable=INFO.executable)


@hookimpl
def perflab_check_support(
    engine: str, config: ServeConfig, hardware: HardwareSnapshot, version: str | None
) -> list[Unsupported] | None:
    if engine != ENGINE:
        return None
    from perflab_vllm_ascend.support import check_support

    return check_support(engine, config, hardware, version)


@hookimpl
def perflab_build_launch(
    engine: str, config: ServeConfig, hardware: HardwareSnapshot, workdir: Path, version: str | None
) -> LaunchSpec | None:
    if engine != ENGINE:
        return None
    from perflab_vllm_ascend.launch import build_launch

    return build_launch(config)


@hookimpl
def perflab_readiness(engine: str, launch: LaunchSpec) -> Readiness | None:
    if engine != ENGINE:
        return None
    from perflab_vllm_ascend.launch import READINESS

    return READINESS


@hookimpl
def perflab_classify_crash(engine: str, exit_code: int | None, log_tail: str) -> CrashCause | None:
    if engine != ENGINE:
        return None
    from perflab_vllm_ascend.crashes import classify_ascend

    return classify_ascend(log_tail)
