"""ServeConfig -> ``mindieservice_daemon`` with a config.json written under the run directory.

MindIE has no serving flags: ``mindieservice_daemon`` (installed as
``$MIES_INSTALL_PATH/bin/mindieservice_daemon``) reads the JSON named by
``MIES_CONFIG_JSON_PATH`` (environment_variable.md). The bare name is launched so that the
PATH the run uses decides which daemon runs (MindIE's bin directory, or perflab's
simulator); ``options.daemon`` gives an explicit path.

Environment set here: ``MIES_CONFIG_JSON_PATH``; ``MINDIE_LOG_TO_STDOUT=1`` (MindIE logs only to
files by default, and crash classification reads the console); ``NPU_MEMORY_FRACTION`` for
mem_fraction (share of NPU memory for weights, KV cache and workspace).
"""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path

from perflab.contract.errors import UnsupportedOption
from perflab.contract.plugin_base import fraction, refuse_unknown
from perflab.contract.types import FileSpec, HardwareSnapshot, LaunchSpec, ServeConfig
from perflab_mindie.config_json import build_config
from perflab_mindie.models import default_model_name, valid_model_name

DAEMON = "mindieservice_daemon"
CONFIG_FILE = "config.json"
CONFIG_MODE = 0o640  # MindIE rejects config files writable by group/others
OPTIONS = frozenset({"daemon", "management_port", "metrics_port", "model_type", "prequantized"})


def _ip(host: str) -> str:
    if host == "localhost":
        return "127.0.0.1"
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        raise UnsupportedOption(
            "mindie", f"host={host}", "ServerConfig.ipAddress must be an IPv4 or IPv6 address"
        ) from None


def _devices(config: ServeConfig, hardware: HardwareSnapshot) -> list[int]:
    world = config.world_size
    if config.devices is not None:
        chosen = list(config.devices)
    else:
        chosen = sorted(a.index for a in hardware.of_kind("ascend")) or list(range(world))
    if len(chosen) < world:
        raise UnsupportedOption(
            "mindie", f"devices={chosen}", f"worldSize {world} (tp×pp×dp) needs {world} NPUs in npuDeviceIds"
        )
    return chosen[:world]  # worldSize must equal the number of NPUs listed


def _port(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1024 <= value <= 65535:
        raise UnsupportedOption("mindie", f"{name}={value!r}", "MindIE ports must be in [1024, 65535]")
    return value


def _model_context(model: str, hardware: HardwareSnapshot) -> int | None:
    from perflab.lab.run.preflight import model_context

    return model_context(model, simulated=hardware.simulated)


def build(config: ServeConfig, hardware: HardwareSnapshot, workdir: Path) -> LaunchSpec:
    refuse_unknown("mindie", config.options, OPTIONS, "option(s)", f"the MindIE plugin knows only {', '.join(sorted(OPTIONS))}")
    port = _port("port", config.port)
    management = _port("management_port", config.options.get("management_port", port + 1))
    metrics = _port("metrics_port", config.options.get("metrics_port", port + 2))
    if len({port, management, metrics}) != 3:
        raise UnsupportedOption("mindie", "ports", "business, management and metrics ports must differ")
    name = config.served_model_name or default_model_name(config.model)
    if not valid_model_name(name):
        raise UnsupportedOption(
            "mindie",
            f"served_model_name={name}",
            "ModelConfig.modelName allows letters, digits, '-', '.', '_' (no '/'), not at either end, ≤256 characters",
        )
    env = dict(config.extra_env)
    if config.devices is not None and "ASCEND_RT_VISIBLE_DEVICES" in env:
        raise UnsupportedOption(
            "mindie",
            "devices",
            "npuDeviceIds are chip logic IDs; ASCEND_RT_VISIBLE_DEVICES in extra_env would renumber them",
        )
    document, warnings = build_config(
        config,
        ip=_ip(config.host),
        port=port,
        management_port=management,
        metrics_port=metrics,
        devices=_devices(config, hardware),
        model_name=name,
        model_context=_model_context(config.model, hardware),
    )
    path = str(Path(workdir) / CONFIG_FILE)
    env["MIES_CONFIG_JSON_PATH"] = path
    env.setdefault("MINDIE_LOG_TO_STDOUT", "1")
    # the Prometheus /metrics on metricsPort answers only with the service monitor on (MindIE
    # Service's "服务监控指标查询接口(普罗格式)"); perflab scrapes it during every benchmark
    env.setdefault("MIES_SERVICE_MONITOR_MODE", "1")
    if config.mem_fraction is not None:
        env["NPU_MEMORY_FRACTION"] = fraction("mindie", "mem_fraction", config.mem_fraction, "NPU_MEMORY_FRACTION must be in (0, 1]")
    return LaunchSpec(
        engine="mindie",
        argv=(str(config.options.get("daemon") or DAEMON),),
        host=config.host,
        port=port,
        served_model_name=name,
        env=env,
        files=(
            FileSpec(path=path, content=json.dumps(document, indent=4, ensure_ascii=False) + "\n", mode=CONFIG_MODE),
        ),
        extra_ports=(management, metrics),
        warnings=tuple(warnings),
    )
