"""perflab engine plugin for SGLang (``python -m sglang.launch_server``).

Import-light on purpose: listing engines imports this module, so it pulls in only perflab's
boundary types; the plugin's own modules are imported inside the methods. SGLang itself is
never imported; its version comes from package metadata (perflab.installed).

Every flag, ready line and error string comes from SGLang v0.5.5.post1 (the seeds' version),
``python/sglang/srt/server_args.py`` and ``python/sglang/srt/entrypoints/http_server.py``:
https://github.com/sgl-project/sglang/tree/v0.5.5.post1/python/sglang/srt
The flags and choices that changed up to the newest release are :data:`VERSIONS`, each read
in the PyPI wheel of the release that changed it (``pip download --no-deps sglang==X``).
"""

from __future__ import annotations

from pathlib import Path

from perflab import (
    CacheReset,
    EngineInfo,
    EnginePlugin,
    HardwareSnapshot,
    HttpProbe,
    LaunchSpec,
    Maps,
    MetricsEndpoint,
    NodeGroup,
    Readiness,
    ServeConfig,
    Unsupported,
)
from perflab.contract.versions import EngineVersions, Since

ENGINE = "sglang"
SERVER_ARGS = "https://github.com/sgl-project/sglang/blob/v0.5.5.post1/python/sglang/srt/server_args.py"
HTTP_SERVER = "https://github.com/sgl-project/sglang/blob/v0.5.5.post1/python/sglang/srt/entrypoints/http_server.py"
COLLECTOR = "https://github.com/sgl-project/sglang/blob/main/python/sglang/srt/metrics/collector.py"


def _wheel(version: str, path: str) -> str:
    return f"sglang {version} (PyPI wheel): python/sglang/srt/{path}"


# 0.5.10 replaced the n-gram matcher's match windows with a trie: server_args.py dropped
# --speculative-ngram-{min,max}-match-window-size and renamed --speculative-ngram-branch-length
# to --speculative-ngram-max-trie-depth (default 18 both); 0.5.9 still has the 0.5.5 spellings
_NGRAM_TRIE = _wheel("0.5.10", "server_args.py")
_NO_WINDOWS = ("the n-gram matcher lost its match windows: it matches the last "
               "--speculative-ngram-max-trie-depth tokens against its trie (which also bounds the drafts); "
               "set speculative_config.max_trie_depth instead")

#: The SGLang versions perflab builds commands for, and every spelling perflab uses that changed
#: between them (perflab_sglang.launch and .speculative ask it by option name).
VERSIONS = EngineVersions(
    oldest="0.5.5.post1",
    newest="0.5.23",
    source="sglang 0.5.5.post1 .. 0.5.23 (PyPI wheels): srt/server_args.py, and from 0.5.14 srt/arg_groups/",
    changes=(
        Since("speculative_config.prompt_lookup_max", "0.5.5.post1", "--speculative-ngram-max-match-window-size",
              SERVER_ARGS),
        Since("speculative_config.prompt_lookup_max", "0.5.10", None, _NGRAM_TRIE, why=_NO_WINDOWS),
        Since("speculative_config.prompt_lookup_min", "0.5.5.post1", "--speculative-ngram-min-match-window-size",
              SERVER_ARGS),
        Since("speculative_config.prompt_lookup_min", "0.5.10", None, _NGRAM_TRIE, why=_NO_WINDOWS),
        Since("speculative_config.max_trie_depth", "0.5.5.post1", "--speculative-ngram-branch-length", SERVER_ARGS),
        Since("speculative_config.max_trie_depth", "0.5.10", "--speculative-ngram-max-trie-depth", _NGRAM_TRIE),
        # QUANTIZATION_CHOICES: qoq is gone from 0.5.16 (present in 0.5.15.post1), marlin from
        # 0.5.20 (present in 0.5.19; gptq_marlin and awq_marlin remain)
        Since("quantization=qoq", "0.5.5.post1", "qoq", SERVER_ARGS),
        Since("quantization=qoq", "0.5.16", None, _wheel("0.5.16", "server_args.py"),
              why="QUANTIZATION_CHOICES no longer lists qoq"),
        Since("quantization=marlin", "0.5.5.post1", "marlin", SERVER_ARGS),
        Since("quantization=marlin", "0.5.20", None, _wheel("0.5.20", "arg_groups/choices.py"),
              why="QUANTIZATION_CHOICES no longer lists marlin (gptq_marlin and awq_marlin remain)"),
        # --kv-cache-dtype choices: fp4_e2m1 is gone from 0.5.21 (present in 0.5.20, which added
        # nvfp4 and fp4_mx_block16 beside it in 0.5.16)
        Since("kv_cache_dtype=fp4_e2m1", "0.5.5.post1", "fp4_e2m1", SERVER_ARGS),
        Since("kv_cache_dtype=fp4_e2m1", "0.5.21", None, _wheel("0.5.21", "arg_groups/fields/model.py"),
              why="--kv-cache-dtype no longer accepts fp4_e2m1 (nvfp4 and fp4_mx_block16 are its FP4 recipes)"),
    ),
)


class SGLang(EnginePlugin):
    # no executable: launched through a Python interpreter, installed == distribution present;
    # default_port: ServerArgs.port's default
    info = EngineInfo(name=ENGINE, display_name="SGLang", accelerators=("cuda",), executable=None,
                      description="SGLang runtime, OpenAI-compatible server (python -m sglang.launch_server)",
                      distributions=("sglang",), homepage="https://github.com/sgl-project/sglang", default_port=30000)
    visible_devices_env = "CUDA_VISIBLE_DEVICES"
    address_flags = ("--host", "--port")
    crash_signatures = "perflab_sglang.crashes:SIGNATURES"
    engine_versions = VERSIONS
    # http_server.py (v0.5.5.post1): @app.api_route("/flush_cache", methods=["GET", "POST"]) flushes
    # the radix cache; 400 while requests are running or waiting, 200 "Cache flushed." otherwise
    prefix_cache_reset = CacheReset("/flush_cache", "POST", source=HTTP_SERVER)
    # /metrics on the serving port, only with --enable-metrics (server_args.py; perflab does not
    # add it: the launch reproduces the seeds' commands; a 404 is logged once with the hint):
    # SchedulerMetricsCollector (python/sglang/srt/metrics/collector.py). SGLang exports the
    # prefix hit rate and the speculative acceptance as gauges; a retraction (the KV cache is
    # full: a running request goes back to the queue) is its preemption
    # (sglang:num_retracted_requests_total, newer than the sglang:num_retracted_reqs gauge;
    # checked in sgl-project/sglang 00ae9c1, collector.py: Counter(name=
    # "sglang:num_retracted_requests_total") — prometheus-client's family name drops "_total")
    metrics_endpoint = MetricsEndpoint(
        "/metrics", kv_cache_usage="sglang:token_usage", running="sglang:num_running_reqs",
        waiting="sglang:num_queue_reqs", preemptions="sglang:num_retracted_requests",
        prefix_cache_hit_rate="sglang:cache_hit_rate", spec_decode_acceptance="sglang:spec_accept_rate",
        source=COLLECTOR,
        missing_hint="SGLang serves /metrics only with --enable-metrics: add it with "
                     "engine_serve: {sglang: {extra_args: [--enable-metrics]}} to see its metrics in the report")

    # ServerArgs.add_cli_args (server_args.py, v0.5.5.post1); the choices are in perflab_sglang.launch
    serve_options = {
        "model": Maps("--model-path", SERVER_ARGS),
        "served_model_name": Maps("--served-model-name", SERVER_ARGS),
        "tp": Maps("--tp-size", SERVER_ARGS),
        "pp": Maps("--pp-size", SERVER_ARGS),
        "dp": Maps("--dp-size", SERVER_ARGS),
        "nodes": Maps("--nnodes N --node-rank R --dist-init-addr HOST:PORT, one launch per node", SERVER_ARGS),
        "ep": Maps("--ep-size", SERVER_ARGS),
        "max_model_len": Maps("--context-length", SERVER_ARGS),
        "max_batched_tokens": Maps("--chunked-prefill-size N --max-prefill-tokens N", SERVER_ARGS),
        "max_num_seqs": Maps("--max-running-requests", SERVER_ARGS),
        "quantization": Maps("--quantization", SERVER_ARGS),
        "kv_cache_dtype": Maps("--kv-cache-dtype (fp8 -> fp8_e4m3)", SERVER_ARGS),
        "prefix_caching": Maps("--disable-radix-cache when false", SERVER_ARGS),
        "chunked_prefill": Maps("--chunked-prefill-size -1 when false", SERVER_ARGS),
        "speculative_config": Maps("--speculative-algorithm/-num-steps/-eagle-topk/-num-draft-tokens; n-gram "
                                   "settings per version (VERSIONS)", SERVER_ARGS),
        "mem_fraction": Maps("--mem-fraction-static", SERVER_ARGS),
        "reasoning_parser": Maps("--reasoning-parser", SERVER_ARGS),
        "host": Maps("--host", SERVER_ARGS),
        "port": Maps("--port", SERVER_ARGS),
        "devices": Maps("CUDA_VISIBLE_DEVICES", SERVER_ARGS),
        "extra_args": Maps("appended to the argv", SERVER_ARGS),
        "extra_env": Maps("the engine's environment", SERVER_ARGS),
        "options": Maps("python: the interpreter that runs sglang.launch_server", SERVER_ARGS),
    }


    def check_support(self, config: ServeConfig, hardware: HardwareSnapshot, version: str | None) -> list[Unsupported]:
        from perflab_sglang.support import check

        return [*self.refused(config), *check(config, hardware)]

    def build_launch(self, config: ServeConfig, hardware: HardwareSnapshot, workdir: Path, version: str | None) -> LaunchSpec:
        from perflab_sglang.launch import build

        return build(config, self.device_env(config), version)

    def build_group_launch(self, config: ServeConfig, hardware: HardwareSnapshot, group: NodeGroup, workdir: Path,
                           version: str | None) -> list[LaunchSpec]:
        from perflab_sglang.launch import build_group

        return build_group(config, group, lambda node: self.device_env(config.replace(devices=node.devices)), version)

    def readiness(self, launch: LaunchSpec) -> Readiness:
        # /health and /health_generate both run a one-token generation once the server is Up
        # (503 while Starting), see health_generate() in http_server.py.
        return Readiness(
            http=(HttpProbe("/health"), HttpProbe("/health_generate")),
            generation_path="/v1/completions",
            ready_log_patterns=(r"The server is fired up and ready to roll!",),  # _wait_and_warmup()
        )


plugin = SGLang()
