"""perflab engine plugin for TensorRT-LLM (``trtllm-serve``).

Import-light on purpose: listing engines imports this module, so it pulls in only perflab's
boundary types; tensorrt_llm is never imported (its version comes from package metadata or
the ``trtllm-serve`` banner).

Flags and LLM-API keys come from NVIDIA/TensorRT-LLM ``tensorrt_llm/commands/serve.py`` and
``tensorrt_llm/llmapi/llm_args.py`` (1.x, the seeds ran v1.2.0rc1); health paths from
``tensorrt_llm/serve/openai_server.py``; the ready lines are uvicorn's.
"""

from __future__ import annotations

import re
from pathlib import Path

from perflab import (
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

ENGINE = "trtllm"
SERVE = "https://github.com/NVIDIA/TensorRT-LLM/blob/main/tensorrt_llm/commands/serve.py"
LLM_ARGS = "https://github.com/NVIDIA/TensorRT-LLM/blob/main/tensorrt_llm/llmapi/llm_args.py"
OPENAI_SERVER = "https://github.com/NVIDIA/TensorRT-LLM/blob/main/tensorrt_llm/serve/openai_server.py"
COLLECTOR = "https://github.com/NVIDIA/TensorRT-LLM/blob/main/tensorrt_llm/metrics/collector.py"

#: trtllm-serve has no --version option of its own (its click group falls through to
#: ``serve``), but importing tensorrt_llm prints the banner ``[TensorRT-LLM] TensorRT LLM
#: version: 1.2.0rc1`` (older releases: ``TensorRT-LLM version:``) before click rejects the
#: option, so the banner is parsed whatever the exit status; a plain ``trtllm-serve, version
#: X`` line is accepted too.
VERSION_OUTPUT: tuple[re.Pattern[str], ...] = (
    re.compile(r"TensorRT[- ]LLM version:\s*v?(\S+)"),
    re.compile(r"\bversion[:\s]+v?(\d+\.\d+[\w.+-]*)", re.I),
)


class TensorRTLLM(EnginePlugin):
    info = EngineInfo(name=ENGINE, display_name="TensorRT-LLM", accelerators=("cuda",), executable="trtllm-serve",
                      description="NVIDIA TensorRT-LLM, OpenAI-compatible server (trtllm-serve)",
                      distributions=("tensorrt_llm", "tensorrt-llm"), homepage="https://github.com/NVIDIA/TensorRT-LLM",
                      default_port=8000)  # trtllm-serve --port default
    visible_devices_env = "CUDA_VISIBLE_DEVICES"
    address_flags = ("--host", "--port")
    # no prefix-cache reset over HTTP: trtllm-serve serves /v1/*, /health, /metrics, /version
    # (docs/source/commands/trtllm-serve.rst; tensorrt_llm/serve/openai_server.py register_routes)
    prefix_cache_reset = None
    # trtllm-serve's Prometheus text is on /prometheus/metrics (openai_server.py mounts
    # prometheus_client's app there; /metrics is its JSON iteration stats); names from
    # MetricsCollector (tensorrt_llm/metrics/collector.py). No preemption counter is exported
    # (trtllm_num_paused_requests is a gauge), the prefix reuse is a hit-rate gauge.
    metrics_endpoint = MetricsEndpoint(
        "/prometheus/metrics", kv_cache_usage="trtllm_kv_cache_utilization",
        running="trtllm_num_requests_running", waiting="trtllm_num_requests_waiting",
        prefix_cache_hit_rate="trtllm_kv_cache_hit_rate",
        spec_decode_accepted="trtllm_spec_decode_num_accepted_tokens",
        spec_decode_draft="trtllm_spec_decode_num_draft_tokens", source=COLLECTOR)
    crash_signatures = "perflab_trtllm.crashes:SIGNATURES"
    version_output = VERSION_OUTPUT
    # trtllm-serve's options perflab emits (--tp_size, --pp_size, --ep_size, --max_seq_len,
    # --max_num_tokens, --max_batch_size, --enable_chunked_prefill, --kv_cache_free_gpu_memory_fraction,
    # --reasoning_parser, --backend, --extra_llm_api_options) are the same in serve.py of v1.2.0rc1
    # (the seeds') and of main at 00209af (with --custom_tokenizer and the gRPC server, so after 1.2:
    # --kv_cache_free_gpu_memory_fraction is kept there as an alias of --free_gpu_memory_fraction).
    # The newest is the newest release on PyPI (1.2.1; its wheels live on pypi.nvidia.com, which
    # perflab's sources could not read, so no release wheel after 1.2.0rc1 was read itself).
    engine_versions = EngineVersions(
        oldest="1.2.0rc1",
        newest="1.2.1",
        source="NVIDIA/TensorRT-LLM tensorrt_llm/commands/serve.py at v1.2.0rc1 and at 00209af",
    )
    # serve.py click options and llm_args.py LLM-API keys (written to --extra_llm_api_options)
    serve_options = {
        "model": Maps("MODEL (the positional argument)", SERVE),
        "served_model_name": Refuses(
            "trtllm-serve has no served-model-name option; it serves the model as its MODEL argument "
            "(the directory name for a local checkpoint); that name itself is accepted", OPENAI_SERVER, always=False),
        "tp": Maps("--tp_size", SERVE),
        "pp": Maps("--pp_size", SERVE),
        "dp": Maps("enable_attention_dp with --tp_size = dp", LLM_ARGS),
        "nodes": Refuses(
            "perflab launches trtllm-serve on one node only: TensorRT-LLM spans nodes through MPI (mpirun/srun with "
            "trtllm-llmapi-launch), not one command per node; nodes=1 is accepted",
            "https://github.com/NVIDIA/TensorRT-LLM/blob/main/tensorrt_llm/llmapi/trtllm-llmapi-launch", always=False),
        "ep": Maps("--ep_size", SERVE),
        "max_model_len": Maps("--max_seq_len", SERVE),
        "max_batched_tokens": Maps("--max_num_tokens", SERVE),
        "max_num_seqs": Maps("--max_batch_size", SERVE),
        "quantization": Maps("quant_config.quant_algo (backend=tensorrt; the PyTorch backend loads pre-quantized "
                             "checkpoints only)", LLM_ARGS),
        "kv_cache_dtype": Maps("kv_cache_config.dtype (PyTorch) / quant_config.kv_cache_quant_algo", LLM_ARGS),
        "prefix_caching": Maps("kv_cache_config.enable_block_reuse", LLM_ARGS),
        "chunked_prefill": Maps("--enable_chunked_prefill", SERVE),
        "speculative_config": Maps("speculative_config (decoding_type MTP/Eagle/NGram/DraftTarget)", LLM_ARGS),
        "mem_fraction": Maps("--kv_cache_free_gpu_memory_fraction", SERVE),
        "reasoning_parser": Maps("--reasoning_parser", SERVE),
        "host": Maps("--host", SERVE),
        "port": Maps("--port", SERVE),
        "devices": Maps("CUDA_VISIBLE_DEVICES", SERVE),
        "extra_args": Maps("appended to the argv", SERVE),
        "extra_env": Maps("the engine's environment", SERVE),
        "options": Maps("backend (--backend), prequantized, extra_llm_api_options (merged into the YAML)", SERVE),
    }


    def check_support(self, config: ServeConfig, hardware: HardwareSnapshot, version: str | None) -> list[Unsupported]:
        from perflab_trtllm.support import check

        return [*self.refused(config), *check(config, hardware)]

    def build_launch(self, config: ServeConfig, hardware: HardwareSnapshot, workdir: Path, version: str | None) -> LaunchSpec:
        from perflab_trtllm.launch import build

        return build(config, workdir, self.device_env(config))

    def readiness(self, launch: LaunchSpec) -> Readiness:
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


plugin = TensorRTLLM()
