"""perflab engine plugin for llama.cpp's ``llama-server`` — an out-of-tree example.

It lives outside perflab's five engines on purpose: it is installed as its own distribution
and must pass perflab's conformance suite like any third-party plugin.

Flags are from llama.cpp's server README (tools/server/README.md, generated from
common/arg.cpp): ``-m/--model FNAME``, ``-hf/--hf-repo <user>/<model>[:quant]``,
``--host``, ``--port``, ``-a/--alias``, ``-c/--ctx-size``, ``-np/--parallel``,
``-b/--batch-size``, ``-ctk/--cache-type-k`` and ``-ctv/--cache-type-v``,
``--cache-prompt/--no-cache-prompt``, ``-ngl/--n-gpu-layers``, ``-sm/--split-mode``,
``-fa/--flash-attn``, ``--reasoning-format``. Health: ``GET /health`` answers 503
("Loading model") until the model is loaded, then 200.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

from perflab import (
    CrashCause,
    EngineInfo,
    HardwareSnapshot,
    HttpProbe,
    LaunchSpec,
    Readiness,
    ServeConfig,
    Unsupported,
    hookimpl,
)
from perflab.errors import UnsupportedOption

ENGINE = "llama-cpp"
EXECUTABLE = "llama-server"
PERFLAB_HOOKSPEC_VERSIONS = (1,)
SOURCE = "https://github.com/ggml-org/llama.cpp/blob/master/tools/server/README.md"

# KV cache types llama-server accepts for -ctk/-ctv (README, "allowed values").
KV_TYPES = {"f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"}
# perflab's kv_cache_dtype spelling -> llama.cpp's
KV_ALIASES = {"fp16": "f16", "float16": "f16", "bfloat16": "bf16", "auto": "f16"}
# --reasoning-format values (README)
REASONING_FORMATS = {"none", "deepseek", "deepseek-legacy", "auto"}
# engine options -> flags
OPTIONS = {"n_gpu_layers": "--n-gpu-layers", "split_mode": "--split-mode", "flash_attn": "--flash-attn", "ubatch_size": "--ubatch-size"}

# (name, pattern, explanation, hint) in llama.cpp's own words (src/llama-model-loader.cpp,
# tools/server/server.cpp, ggml/src/ggml-cuda/ggml-cuda.cu).
# The earliest matching line wins, so gguf.cpp's specific "invalid magic characters" (printed
# by gguf_init_from_file_impl, ggml/src/gguf.cpp: "%s: invalid magic characters: '%c%c%c%c',
# expected 'GGUF'") is named before llama-model-loader's generic "failed to load model" after it.
CRASH_PATTERNS = [
    ("not-a-gguf-file", r"invalid magic characters", "the model file is not a GGUF file (wrong format, random bytes or a corrupt download)", "point --model at a .gguf file; convert other formats with convert_hf_to_gguf.py"),
    ("address-in-use", r"couldn't bind HTTP server socket", "llama-server could not bind its port", "choose another --port or stop the process holding it"),
    ("out-of-memory", r"cudaMalloc failed: out of memory|failed to allocate .* buffer|unable to allocate .* buffer", "the model or KV cache does not fit in GPU memory", "lower --max-model-len (ctx size), --max-num-seqs, or offload fewer layers"),
    ("model-load-failed", r"error loading model|failed to load model", "the GGUF file could not be loaded (missing, truncated, or an unsupported architecture)", "check --model; llama-server needs a GGUF file or -hf repo"),
]


@hookimpl
def perflab_register_engines(register):
    register(EngineInfo(name=ENGINE, display_name="llama.cpp (llama-server)", accelerators=("cuda",),
                        description="llama.cpp's OpenAI-compatible server", executable=EXECUTABLE,
                        homepage="https://github.com/ggml-org/llama.cpp", default_port=8080))


@hookimpl
def perflab_engine_version(engine: str, env: Mapping[str, str]) -> str | None:
    if engine != ENGINE:
        return None
    exe = shutil.which(EXECUTABLE, path=env.get("PATH"))
    if exe is None:
        return None
    try:  # prints "version: 6123 (9a0e6ab1)" on stderr
        out = subprocess.run([exe, "--version"], env=dict(env), capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(r"version:\s*(\S+)(?:\s*\((\w+)\))?", out.stdout + out.stderr)
    return (f"b{m.group(1)}" + (f" ({m.group(2)})" if m.group(2) else "")) if m else None


@hookimpl
def perflab_check_support(engine: str, config: ServeConfig, hardware: HardwareSnapshot) -> list[Unsupported] | None:
    if engine != ENGINE:
        return None
    out = []
    if config.quantization is not None:
        out.append(Unsupported("quantization", "llama.cpp's quantization is chosen by the GGUF file, not a flag: pass a quantized GGUF as --model", SOURCE))
    return out


def _model_args(model: str) -> list[str]:
    # A local GGUF file -> -m; "user/repo[:quant]" -> -hf (llama-server downloads it).
    if model.endswith(".gguf") or Path(model).exists() or model.startswith(("/", ".")):
        return ["--model", model]
    return ["--hf-repo", model]


@hookimpl
def perflab_build_launch(engine: str, config: ServeConfig, hardware: HardwareSnapshot, workdir: Path) -> LaunchSpec | None:
    if engine != ENGINE:
        return None
    argv = [EXECUTABLE, *_model_args(config.model), "--host", config.host, "--port", str(config.port)]
    if config.served_model_name:
        argv += ["--alias", config.served_model_name]
    if config.max_model_len is not None:
        argv += ["--ctx-size", str(config.max_model_len)]
    if config.max_num_seqs is not None:
        argv += ["--parallel", str(config.max_num_seqs)]
    if config.max_batched_tokens is not None:
        argv += ["--batch-size", str(config.max_batched_tokens)]
    if config.kv_cache_dtype is not None:
        kv = KV_ALIASES.get(config.kv_cache_dtype, config.kv_cache_dtype)
        if kv not in KV_TYPES:
            raise UnsupportedOption(ENGINE, f"kv_cache_dtype={config.kv_cache_dtype}", f"llama-server accepts {', '.join(sorted(KV_TYPES))}")
        argv += ["--cache-type-k", kv, "--cache-type-v", kv]
    if config.prefix_caching is not None:
        argv.append("--cache-prompt" if config.prefix_caching else "--no-cache-prompt")
    if config.reasoning_parser is not None:
        if config.reasoning_parser not in REASONING_FORMATS:
            raise UnsupportedOption(ENGINE, f"reasoning_parser={config.reasoning_parser}", f"--reasoning-format takes {', '.join(sorted(REASONING_FORMATS))}")
        argv += ["--reasoning-format", config.reasoning_parser]
    for field, why in {
        "tp": "llama.cpp splits layers over all visible GPUs; use --devices and --engine-option split_mode=row",
        "pp": "no pipeline-parallel flag", "dp": "one process serves one model; run replicas instead",
        "ep": "no expert-parallel flag", "chunked_prefill": "no such switch (prompt processing is batched by --batch-size)",
        "speculative_config": "speculative decoding needs a draft GGUF (-md); pass it with --extra-arg",
        "mem_fraction": "llama.cpp sizes memory from --ctx-size and offloaded layers, not a fraction",
        "quantization": "choose a quantized GGUF file instead",
    }.items():
        value = getattr(config, field)
        if value is not None and not (field == "tp" and value == 1):
            raise UnsupportedOption(ENGINE, field, why)
    for key, value in config.options.items():
        if key not in OPTIONS:
            raise UnsupportedOption(ENGINE, f"option {key!r}", f"known engine options: {', '.join(sorted(OPTIONS))}")
        argv += [OPTIONS[key], str(value)]
    argv += list(config.extra_args)
    env = dict(config.extra_env)
    if config.devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, config.devices))
    return LaunchSpec(engine=ENGINE, argv=tuple(argv), host=config.host, port=config.port,
                      served_model_name=config.name, env=env)


@hookimpl
def perflab_readiness(engine: str, launch: LaunchSpec) -> Readiness | None:
    if engine != ENGINE:
        return None
    # tools/server/server.cpp logs "server is listening on http://H:P - starting the main loop"
    return Readiness(http=(HttpProbe("/health"), HttpProbe("/v1/models")), generation_path="/v1/completions",
                     # older llama-server: "main: server is listening on http://H:P - starting the main
                     # loop"; current (the real log in /work/shared/fixtures/real/llama-server, 0.6.0-dev):
                     # "llama_server: model loaded" then "llama_server: listening on http://H:P". A ready
                     # line only wakes the probes at once; it proves nothing by itself.
                     ready_log_patterns=(r"server is listening on .* - starting the main loop",
                                         r"llama_server: model loaded$", r"llama_server: listening on http://"),
                     startup_timeout_s=900)


@hookimpl
def perflab_classify_crash(engine: str, exit_code: int | None, log_tail: str) -> CrashCause | None:
    if engine != ENGINE:
        return None
    for line in log_tail.splitlines():
        for name, pattern, explanation, hint in CRASH_PATTERNS:
            if re.search(pattern, line):
                return CrashCause(name, explanation, line=line, hint=hint, source=SOURCE)
    return None
