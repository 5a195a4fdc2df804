"""perflab engine plugin for Hugging Face ``transformers serve``.

Import-light on purpose: listing engines imports this module, so it pulls in only perflab's
boundary types; the plugin's own modules are imported inside the methods. transformers is
never imported; its version comes from package metadata (perflab.installed, the environment
that owns the ``transformers`` console script).

Every flag, ready line and error string comes from transformers 5.19.0 (the real lane's,
in the vLLM CPU environment): ``transformers/cli/serve.py`` (Typer's ``Serve`` command),
``transformers/cli/serving/`` (server.py, model_manager.py, utils.py).
"""

from __future__ import annotations

from pathlib import Path

from perflab import (
    EngineInfo,
    EnginePlugin,
    HardwareSnapshot,
    HttpProbe,
    LaunchSpec,
    Maps,
    Readiness,
    Refuses,
    ServeConfig,
    Unsupported,
)
from perflab.contract.types import RequestExtensions
from perflab.contract.versions import EngineVersions

ENGINE = "transformers"
SERVE = "transformers 5.19.0: transformers/cli/serve.py"
MODEL_MANAGER = "transformers 5.19.0: transformers/cli/serving/model_manager.py"
SERVING_UTILS = "transformers 5.19.0: transformers/cli/serving/utils.py"
SERVER = "transformers 5.19.0: transformers/cli/serving/server.py"
_ONE_PROCESS = "transformers serve is one process holding one model copy (no tensor, pipeline or data parallelism)"

#: The transformers versions perflab builds ``transformers serve`` for: the real lane's only
#: (serve.py was rewritten on Typer in the 5.x series; older servers had other flags).
VERSIONS = EngineVersions(oldest="5.19.0", newest="5.19.0", source=SERVE)

#: serving/utils.py BaseHandler._validate_request: any key outside the OpenAI request schema
#: (TransformersCompletionCreateParams / TransformersTextCompletionCreateParams) is HTTP 422
#: "Unexpected fields in the request: {'ignore_eos'}" — so neither of vLLM's extensions is
#: sent, and output lengths are counted, not forced (tests/real/test_real_transformers.py).
REQUEST_EXTENSIONS = RequestExtensions(frozenset(), source=SERVING_UTILS)
OUTPUT_LENGTHS = Unsupported(
    "ignore_eos", "transformers serve refuses ignore_eos (HTTP 422): output lengths cannot be forced; each answer "
    "ends at the model's EOS or max_tokens, and perflab counts and reports the tokens it generated (usage)",
    source=SERVING_UTILS, severity="warning")


class Transformers(EnginePlugin):
    # default_port: serve.py ``port: int = 8000``
    info = EngineInfo(name=ENGINE, display_name="transformers serve", accelerators=("cuda", "cpu"),
                      executable="transformers", distributions=("transformers",),
                      description="Hugging Face transformers' OpenAI-compatible server (transformers serve)",
                      homepage="https://huggingface.co/docs/transformers/serving", default_port=8000)
    visible_devices_env = "CUDA_VISIBLE_DEVICES"
    address_flags = ("--host", "--port")
    crash_signatures = "perflab_transformers.crashes:SIGNATURES"
    engine_versions = VERSIONS
    request_extensions = REQUEST_EXTENSIONS

    serve_options = {
        "model": Maps("FORCE_MODEL (serve's positional argument: preloaded, the only model served)", SERVE),
        "served_model_name": Refuses("transformers serve has no served-model-name flag: with a forced model it "
                                     "answers only to that model's id (HTTP 400 'Server is pinned to ...')",
                                     SERVING_UTILS),
        "tp": Refuses(_ONE_PROCESS, SERVE),
        "pp": Refuses(_ONE_PROCESS, SERVE),
        "dp": Refuses(_ONE_PROCESS + "; run replicas instead", SERVE),
        "nodes": Refuses(_ONE_PROCESS, SERVE),
        "ep": Refuses(_ONE_PROCESS, SERVE),
        "max_model_len": Refuses("transformers serve has no context-length flag (the model's config bounds it)", SERVE),
        "max_batched_tokens": Maps("--cb-max-batch-tokens (turns on --continuous-batching)", SERVE),
        "max_num_seqs": Refuses("transformers serve has no batch-size flag (continuous batching sizes its batches "
                                "from --cb-max-batch-tokens and the KV cache)", SERVE),
        "quantization": Maps("--quantization (bnb-4bit, bnb-8bit)", MODEL_MANAGER),
        "kv_cache_dtype": Refuses("transformers serve has no KV-cache dtype flag (the cache takes the model's dtype)",
                                  SERVE),
        "prefix_caching": Refuses("transformers serve has no prefix-caching switch", SERVE),
        "chunked_prefill": Refuses("transformers serve has no chunked-prefill switch", SERVE),
        "speculative_config": Refuses("transformers serve has no speculative-decoding flag", SERVE),
        "mem_fraction": Maps("--cb-max-memory-percent (turns on --continuous-batching)", SERVE),
        "reasoning_parser": Refuses("transformers serve has no reasoning parser (--reasoning on|off|auto only "
                                    "switches the chat template's thinking)", SERVE),
        "host": Maps("--host", SERVE),
        "port": Maps("--port", SERVE),
        "devices": Maps("CUDA_VISIBLE_DEVICES, with --device cpu (no CUDA GPU), cuda (one GPU) or auto (several)",
                        MODEL_MANAGER),
        "extra_args": Maps("appended to the argv", SERVE),
        "extra_env": Maps("the engine's environment", SERVE),
        "options": Maps("perflab_transformers.launch.OPTIONS: dtype, attn_implementation, continuous_batching, "
                        "cb_block_size, cb_num_blocks, cb_use_cuda_graph, compile, trust_remote_code, device, "
                        "default_seed, log_level", SERVE),
    }

    def check_support(self, config: ServeConfig, hardware: HardwareSnapshot, version: str | None) -> list[Unsupported]:
        # a caveat on every benchmark of this engine, said where the launch and the report show
        # preflight's answers: its answers' lengths are the model's own, never forced
        return [*self.refused(config), OUTPUT_LENGTHS]

    def build_launch(self, config: ServeConfig, hardware: HardwareSnapshot, workdir: Path, version: str | None) -> LaunchSpec:
        from perflab_transformers.launch import build

        self.raise_refused(config)
        return build(config, hardware, self.device_env(config))

    def readiness(self, launch: LaunchSpec) -> Readiness:
        # server.py: GET /health answers {"status": "ok"} (503 once the continuous-batching
        # worker died); Uvicorn starts only after the forced model is loaded (serve.py builds
        # ModelManager, which preloads it, before uvicorn.Server.run), so its ready line means
        # the model is in memory. The one-token generation proves it serves.
        return Readiness(
            http=(HttpProbe("/health"),),
            generation_path="/v1/chat/completions",
            ready_log_patterns=(r"Uvicorn running on ", r"Application startup complete\."),
            # loading a large checkpoint (and torch.compile with compile=true) takes minutes
            startup_timeout_s=1800.0,
        )


plugin = Transformers()
