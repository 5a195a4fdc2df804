"""perflab engine plugin for Huawei MindIE (``mindieservice_daemon`` + config.json).

Import-light on purpose: listing engines imports this module, so it pulls in only perflab's
boundary types; the MindIE template is read only when a launch is built.

Knowledge comes from Ascend/MindIE-LLM (src/server/conf/config.json, the endpoint and daemon
sources, docs/zh/user_guide) and GPUStack's MindIE backend, which the seeds' "mindie serve"
commands stand for (gpustack/worker/backends/ascend_mindie.py).
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

ENGINE = "mindie"
PERFLAB_HOOKSPEC_VERSIONS = (1,)

INFO = EngineInfo(
    name=ENGINE,
    display_name="MindIE",
    accelerators=("ascend",),
    description="Huawei MindIE service on Ascend NPUs (mindieservice_daemon, OpenAI-compatible)",
    executable="mindieservice_daemon",  # $MIES_INSTALL_PATH/bin/mindieservice_daemon
    distributions=(),  # versioned by $MIES_INSTALL_PATH/../version.info, not by a Python package
    homepage="https://github.com/Ascend/MindIE-LLM",
    default_port=1025,  # ServerConfig.port in MindIE's default config.json
)


@hookimpl
def perflab_register_engines(register: Callable[[EngineInfo], None]) -> None:
    register(INFO)


@hookimpl
def perflab_engine_version(engine: str, env: Mapping[str, str]) -> str | None:
    if engine != ENGINE:
        return None
    from perflab_mindie.version import installed_version

    return installed_version(env)


@hookimpl
def perflab_check_support(
    engine: str, config: ServeConfig, hardware: HardwareSnapshot, version: str | None
) -> list[Unsupported] | None:
    if engine != ENGINE:
        return None
    from perflab_mindie.support import check

    return check(config, hardware, version)


@hookimpl
def perflab_build_launch(
    engine: str, config: ServeConfig, hardware: HardwareSnapshot, workdir: Path, version: str | None
) -> LaunchSpec | None:
    if engine != ENGINE:
        return None
    from perflab_mindie.launch import build

    return build(config, hardware, workdir)


@hookimpl
def perflab_readiness(engine: str, launch: LaunchSpec) -> Readiness | None:
    if engine != ENGINE:
        return None
    # With three distinct ports, the management port serves /health (and /v2/health/ready)
    # and the business port /v1/models and /v1/completions (http_handler.cpp:
    # ManagementInitialize / BusinessInitialize). GET /health answers 503 until healthy.
    management = launch.extra_ports[0] if launch.extra_ports else launch.port + 1
    return Readiness(
        http=(HttpProbe("/health", port=management), HttpProbe("/v1/models")),
        generation_path="/v1/completions",
        ready_log_patterns=(r"Daemon start success!",),  # src/server/daemon/llm_daemon.cpp
    )


# The address perflab picks for each launch, left out of the serving script as the seeds
# leave out --host/--port.
_ADDRESS_KEYS = frozenset({"ServerConfig.ipAddress", "ServerConfig.managementIpAddress", "ServerConfig.port",
                           "ServerConfig.managementPort", "ServerConfig.metricsPort"})


def perflab_describe_file(path: str, content: str) -> list[str] | None:
    """The serving script's view of a file this plugin wrote (perflab.lab.executor.serving_script):
    config.json as the keys perflab set on MindIE's default template, one ``Key.Path = value``
    per line, so the recommended command does not point into a study directory."""
    if Path(path).name != "config.json":
        return None
    import json

    from perflab_mindie.config_json import changed_keys

    try:
        document = json.loads(content)
    except ValueError:
        return None
    return [f"{k} = {json.dumps(v)}" for k, v in changed_keys(document).items() if k not in _ADDRESS_KEYS]


@hookimpl
def perflab_classify_crash(engine: str, exit_code: int | None, log_tail: str) -> CrashCause | None:
    if engine != ENGINE:
        return None
    from perflab_mindie.crashes import classify

    return classify(log_tail)
