"""perflab engine plugin for SGLang (``python -m sglang.launch_server``).

Import-light on purpose: listing engines imports this module, so it pulls in only perflab's
boundary types and this package's own small modules (stdlib only). SGLang itself is never
imported; its version comes from package metadata.

Every flag, ready line and error string comes from SGLang v0.5.5.post1 (the seeds' version),
``python/sglang/srt/server_args.py`` and ``python/sglang/srt/entrypoints/http_server.py``:
https://github.com/sgl-project/sglang/tree/v0.5.5.post1/python/sglang/srt
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

ENGINE = "sglang"
PERFLAB_HOOKSPEC_VERSIONS = (1,)

INFO = EngineInfo(
    name=ENGINE,
    display_name="SGLang",
    accelerators=("cuda",),
    description="SGLang runtime, OpenAI-compatible server (python -m sglang.launch_server)",
    executable=None,  # launched through a Python interpreter; installed == distribution present
    distributions=("sglang",),
    homepage="https://github.com/sgl-project/sglang",
    default_port=30000,  # ServerArgs.port default
)


@hookimpl
def perflab_register_engines(register: Callable[[EngineInfo], None]) -> None:
    register(INFO)


@hookimpl
def perflab_engine_version(engine: str, env: Mapping[str, str]) -> str | None:
    if engine != ENGINE:
        return None
    from perflab_sglang.version import installed_version

    return installed_version(INFO.distributions, env)


@hookimpl
def perflab_check_support(
    engine: str, config: ServeConfig, hardware: HardwareSnapshot, version: str | None
) -> list[Unsupported] | None:
    if engine != ENGINE:
        return None
    from perflab_sglang.support import check

    return check(config, hardware)


@hookimpl
def perflab_build_launch(
    engine: str, config: ServeConfig, hardware: HardwareSnapshot, workdir: Path, version: str | None
) -> LaunchSpec | None:
    if engine != ENGINE:
        return None
    from perflab_sglang.launch import build

    return build(config)


@hookimpl
def perflab_readiness(engine: str, launch: LaunchSpec) -> Readiness | None:
    if engine != ENGINE:
        return None
    # /health and /health_generate both run a one-token generation once the server is Up
    # (503 while Starting), see health_generate() in http_server.py.
    return Readiness(
        http=(HttpProbe("/health"), HttpProbe("/health_generate")),
        generation_path="/v1/completions",
        ready_log_patterns=(r"The server is fired up and ready to roll!",),  # _wait_and_warmup()
    )


@hookimpl
def perflab_classify_crash(engine: str, exit_code: int | None, log_tail: str) -> CrashCause | None:
    if engine != ENGINE:
        return None
    from perflab_sglang.crashes import classify

    return classify(log_tail)
