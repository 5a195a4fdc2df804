"""perflab engine plugin for Huawei MindIE (``mindieservice_daemon`` + config.json).

Import-light on purpose: listing engines imports this module, so it pulls in only perflab's
boundary types; the MindIE template is read only when a launch is built.

Knowledge comes from Ascend/MindIE-LLM (src/server/conf/config.json, the endpoint and daemon
sources, docs/zh/user_guide) and GPUStack's MindIE backend, which the seeds' "mindie serve"
commands stand for (gpustack/worker/backends/ascend_mindie.py). The mapping of every serving
option to a config.json key is in perflab_mindie.config_json's docstring.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from perflab import (
    CrashCause,
    EngineInfo,
    EnginePlugin,
    HardwareSnapshot,
    HttpProbe,
    LaunchSpec,
    Maps,
    MetricsEndpoint,
    Readiness,
    Refuses,
    ServeConfig,
    Unsupported,
)
from perflab.contract.versions import EngineVersions

ENGINE = "mindie"
GUIDE = "https://github.com/Ascend/MindIE-LLM/tree/master/docs/zh/user_guide"
PARAMS = f"{GUIDE}/user_manual/service_parameter_configuration.md"
FEATURE = f"{GUIDE}/feature"
# MindIE Service's Prometheus interface ("服务监控指标查询接口(普罗格式)"): GET /metrics on
# ServerConfig.metricsPort (management IP), served when MIES_SERVICE_MONITOR_MODE=1; the names
# are those of MindIE-LLM's PrometheusMetrics (src/server/endpoint, prometheus_metrics.cpp;
# checked in its InitPrometheusMetrics: the gauges num_requests_running, num_requests_waiting,
# npu_cache_usage_perc, npu_prefix_cache_hit_rate and the counter num_preemptions_total, whose
# family name prometheus-client's parser gives without "_total")
METRICS_DOC = "https://www.hiascend.com/document/detail/zh/mindie/21RC1/mindieservice/servicedev/mindie_service0103.html"
METRICS = MetricsEndpoint(
    "/metrics", kv_cache_usage="npu_cache_usage_perc", running="num_requests_running",
    waiting="num_requests_waiting", preemptions="num_preemptions",
    prefix_cache_hit_rate="npu_prefix_cache_hit_rate", source=METRICS_DOC)

# The address perflab picks for each launch, left out of the serving script as the seeds
# leave out --host/--port.
_ADDRESS_KEYS = frozenset({"ServerConfig.ipAddress", "ServerConfig.managementIpAddress", "ServerConfig.port",
                           "ServerConfig.managementPort", "ServerConfig.metricsPort"})


class MindIE(EnginePlugin):
    # executable: $MIES_INSTALL_PATH/bin/mindieservice_daemon; no distributions: versioned by
    # $MIES_INSTALL_PATH/../version.info (version()); default_port: ServerConfig.port of the template
    info = EngineInfo(name=ENGINE, display_name="MindIE", accelerators=("ascend",), executable="mindieservice_daemon",
                      description="Huawei MindIE service on Ascend NPUs (mindieservice_daemon, OpenAI-compatible)",
                      distributions=(), homepage="https://github.com/Ascend/MindIE-LLM", default_port=1025)
    # no prefix-cache reset known: perflab found no cache-flush path among MindIE Service's
    # documented HTTP APIs (inference, health/status, metrics); a new launch is the only reset
    prefix_cache_reset = None
    # devices become BackendConfig.npuDeviceIds (chip logic IDs), not a visible-devices variable
    visible_devices_env = None
    # the address perflab chose and probes (config_json.build_config): no extra_args override of it
    owned_args = tuple(f"ServerConfig.{k}" for k in ("ipAddress", "managementIpAddress", "port", "managementPort",
                                                      "metricsPort"))
    # config.json's keys are those the seeds' MindIE 2.1.RC1 ran with (MindIE-LLM's user guide,
    # PARAMS); no release-tagged config.json reference of another version could be read, so every
    # other version is built as 2.1.RC1, with a warning
    engine_versions = EngineVersions(oldest="2.1.RC1", newest="2.1.RC1", source=PARAMS)
    serve_options = {
        "model": Maps("ModelConfig[0].modelWeightPath", PARAMS),
        "served_model_name": Maps("ModelConfig[0].modelName", PARAMS),
        "tp": Maps("ModelConfig[0].tp", PARAMS),
        "pp": Maps("ModelConfig[0].pp", PARAMS),
        "dp": Maps("ModelConfig[0].dp", f"{FEATURE}/data_parallel.md"),
        "nodes": Refuses(
            "perflab writes a single-node config.json (BackendConfig.multiNodesInferEnabled: false, no rank table); "
            "nodes=1 is accepted", PARAMS, always=False),
        "ep": Maps("ModelConfig[0].moe_ep (moe_tp = worldSize / ep)", f"{FEATURE}/expert_parallel.md"),
        "max_model_len": Maps("ModelDeployConfig.maxSeqLen / maxInputTokenLen, ScheduleConfig.maxIterTimes", PARAMS),
        "max_batched_tokens": Maps("ScheduleConfig.maxPrefillTokens", PARAMS),
        "max_num_seqs": Maps("ScheduleConfig.maxBatchSize / maxPrefillBatchSize", PARAMS),
        "quantization": Refuses(
            "MindIE serves weights quantized beforehand (msModelSlim, e.g. a ...-W8A8 checkpoint) and has no "
            "quantization key; a checkpoint whose name says the quantization is served with a warning", PARAMS,
            always=False),
        "kv_cache_dtype": Refuses(
            "MindIE's KV-cache int8 comes with msModelSlim-quantized weights; config.json has no key "
            "(only auto is accepted)", f"{FEATURE}/kv_cache_int8.md", always=False),
        "prefix_caching": Maps('plugin_type "prefix_cache" (+ ScheduleConfig.enablePrefixCache)', f"{FEATURE}/prefix_cache.md"),
        "chunked_prefill": Maps('plugin_type "splitfuse" + templateType "Mix"', f"{FEATURE}/splitFuse.md"),
        "speculative_config": Maps('plugin_type "mtp" with num_speculative_tokens (MTP only)', f"{FEATURE}/mtp.md"),
        "mem_fraction": Maps("NPU_MEMORY_FRACTION", PARAMS),
        "reasoning_parser": Maps("ModelConfig[0].models.<model type>.enable_reasoning", f"{FEATURE}/enable_reasoning.md"),
        "host": Maps("ServerConfig.ipAddress / managementIpAddress", PARAMS),
        "port": Maps("ServerConfig.port (managementPort, metricsPort follow)", PARAMS),
        "devices": Maps("BackendConfig.npuDeviceIds", PARAMS),
        "extra_args": Maps("config.json overrides Section.Key=JSON", PARAMS),
        "extra_env": Maps("the daemon's environment", PARAMS),
        "options": Maps("daemon, management_port, metrics_port, prequantized", PARAMS),
    }

    def version(self, env: Mapping[str, str]) -> str | None:
        from perflab_mindie.version import installed_version

        return installed_version(env)

    def check_support(self, config: ServeConfig, hardware: HardwareSnapshot, version: str | None) -> list[Unsupported]:
        from perflab_mindie.support import check

        return [*self.refused(config), *check(config, hardware, version)]

    def build_launch(self, config: ServeConfig, hardware: HardwareSnapshot, workdir: Path, version: str | None) -> LaunchSpec:
        from perflab_mindie.launch import build

        return build(config, hardware, workdir)

    def readiness(self, launch: LaunchSpec) -> Readiness:
        # With three distinct ports, the management port serves /health (and /v2/health/ready)
        # and the business port /v1/models and /v1/completions (http_handler.cpp:
        # ManagementInitialize / BusinessInitialize). GET /health answers 503 until healthy.
        management = launch.extra_ports[0] if launch.extra_ports else launch.port + 1
        return Readiness(
            http=(HttpProbe("/health", port=management), HttpProbe("/v1/models")),
            generation_path="/v1/completions",
            ready_log_patterns=(r"Daemon start success!",),  # src/server/daemon/llm_daemon.cpp
        )

    def metrics(self, launch: LaunchSpec) -> MetricsEndpoint:
        """MindIE's metrics are on the metrics port (ServerConfig.metricsPort of the launch's
        config.json; the launch's second extra port)."""
        import dataclasses

        port = launch.extra_ports[1] if len(launch.extra_ports) > 1 else None
        return dataclasses.replace(METRICS, port=port if port != launch.port else None)

    def classify_crash(self, exit_code: int | None, log_tail: str) -> CrashCause | None:
        from perflab_mindie.crashes import classify

        return classify(log_tail)

    def describe_file(self, path: str, content: str) -> list[str] | None:
        """config.json as the keys perflab set on MindIE's default template, one
        ``Key.Path = value`` per line, so the recommended command does not point into a study
        directory (the address perflab picked is left out)."""
        if Path(path).name != "config.json":
            return None
        import json

        from perflab_mindie.config_json import changed_keys

        try:
            document = json.loads(content)
        except ValueError:
            return None
        return [f"{k} = {json.dumps(v)}" for k, v in changed_keys(document).items() if k not in _ADDRESS_KEYS]


plugin = MindIE()
