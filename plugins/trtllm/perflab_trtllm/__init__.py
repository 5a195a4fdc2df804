"""perflab engine plugin for TensorRT-LLM (``trtllm-serve``).

Import-light on purpose: listing engines imports this module, so it pulls in only perflab's
boundary types; tensorrt_llm is never imported (its version comes from package metadata or
the ``trtllm-serve`` banner).

Flags and LLM-API keys come from NVIDIA/TensorRT-LLM ``tensorrt_llm/commands/serve.py`` and
``tensorrt_llm/llmapi/llm_args.py`` (1.x, the seeds ran v1.2.0rc1); health paths from
``tensorrt_llm/serve/openai_server.py``; the ready lines are uvicorn's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

from perflab import hookimpl
from perflab.types import (
    CrashCause,
    EngineInfo,
    HardwareSnapshot,
    HttpProbe,
    LaunchSpec,
    Readiness,
    ServeConfig,
    Unsupported,
)

ENGINE = "trtllm"
PERFLAB_HOOKSPEC_VERSIONS = (1,)

INFO = EngineInfo(
    name=ENGINE,
    display_name="TensorRT-LLM",
    accelerators=("cuda",),
    description="NVIDIA TensorRT-LLM, OpenAI-compatible server (trtllm-serve)",
    executable="trtllm-serve",
    distributions=("tensorrt_llm", "tensorrt-llm"),
    homepage="https://github.com/NVIDIA/TensorRT-LLM",
    default_port=8000,  # trtllm-serve --port default
)


@hookimpl
def perflab_register_engines(register: Callable[[EngineInfo], None]) -> None:
    register(INFO)


@hookimpl
def perflab_engine_version(engine: str, env: Mapping[str, str]) -> str | None:
    if engine != ENGINE:
        return None
    from perflab_trtllm.version import installed_version

    return installed_version(INFO.distributions, str(INFO.executable), env)


@hookimpl
def perflab_check_support(
    engine: str, config: ServeConfig, hardware: HardwareSnapshot, version: str | None
) -> list[Unsupported] | None:
    if engine != ENGINE:
        return None
    from perflab_trtllm.support import check

    return check(config, hardware)


@hookimpl
def perflab_build_launch(
    engine: str, config: ServeConfig, hardware: HardwareSnapshot, workdir: Path, version: str | None
) -> LaunchSpec | None:
    if engine != ENGINE:
        return None
    from perflab_trtllm.launch import build

    return build(config, workdir)


@hookimpl
def perflab_readiness(engine: str, launch: LaunchSpec) -> Readiness | None:
    if engine != ENGINE:
        return None
    # GET /health answers 200 once the executor is healthy (OpenAIServer.health); uvicorn
    # prints its two lines once the app is serving (uvicorn/server.py, uvicorn/lifespan/on.py).
    return Readiness(
        http=(HttpProbe("/health"),),
        generation_path="/v1/completions",
        ready_log_patterns=(
            r"Uvicorn running on \S+ \(Press CTRL\+C to quit\)",
            r"Application startup complete\.",
        ),
    )


@hookimpl
def perflab_classify_crash(engine: str, exit_code: int | None, log_tail: str) -> CrashCause | None:
    if engine != ENGINE:
        return None
    from perflab_trtllm.crashes import classify

    return classify(log_tail)
