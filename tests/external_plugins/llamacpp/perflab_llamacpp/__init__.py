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

As the real server behaves (tools/server/server.cpp, common/arg.cpp; the captured log of
llama-server 0.6.0-dev in tests/fixtures/server.log):

* ready line: ``srv  llama_server: listening on http://H:P`` (0.6.x, where ``main`` became
  ``llama_server`` — tools/server/main.cpp), ``main: server is listening on http://H:P``
  before (server.cpp ``LOG_INF("%s: server is listening on %s\n", __func__, ...)``);
* ``--version`` prints ``version: X.Y.Z (build N, commit H)`` (``llama_print_build_info``,
  common/build-info.cpp.in), older builds ``version: N (H)``;
* ``--ctx-size`` is the KV cache of all ``--parallel`` slots together: each slot gets
  ``n_ctx / n_parallel`` (``n_ctx_slot`` in server.cpp; the log prints ``n_slots = 4,
  n_ctx_slot = 1024``), so perflab's per-request ``max_model_len`` becomes
  ``--ctx-size max_model_len*slots --parallel slots``;
* it runs on CPU as well as on GPUs (``-ngl`` offloads layers; without a GPU backend
  everything runs on the CPU), so ``cpu`` is among its accelerators.
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
    EnginePlugin,
    HardwareSnapshot,
    HttpProbe,
    LaunchSpec,
    Readiness,
    ServeConfig,
    Unsupported,
    hookimpl,
)
from perflab.contract.errors import UnsupportedOption

ENGINE = "llama-cpp"
EXECUTABLE = "llama-server"
PERFLAB_HOOKSPEC_VERSIONS = (2,)
SOURCE = "https://github.com/ggml-org/llama.cpp/blob/master/tools/server/README.md"

# KV cache types llama-server accepts for -ctk/-ctv (README, "allowed values").
KV_TYPES = {"f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"}
# perflab's kv_cache_dtype spelling -> llama.cpp's
KV_ALIASES = {"fp16": "f16", "float16": "f16", "bfloat16": "bf16", "auto": "f16"}
# --reasoning-format values (README)
REASONING_FORMATS = {"none", "deepseek", "deepseek-legacy", "auto"}
#: Slots when only max_model_len is given: llama-server's own default, since with no
#: ``--parallel`` it sets ``n_parallel = 4`` (and a unified KV cache; server.cpp main()).
#: perflab passes it explicitly so that each slot holds exactly max_model_len tokens.
DEFAULT_SLOTS = 4
#: ``version: X.Y.Z (build N, commit H)`` and the older ``version: N (H)``
VERSION_RE = re.compile(r"version:\s*(?P<version>\S+)\s*\((?:build\s+(?P<build>\d+),\s*commit\s+(?P<commit>\w+)|(?P<old_commit>\w+))\)")
VERSION_TIMEOUT_S = 5.0  # a C++ binary printing two lines; never wait long
#: The ready line of 0.6.x and of the releases before it (see the module docstring).
READY_PATTERNS = (r"llama_server: listening on https?://\S+", r"server is listening on https?://\S+")
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




def parse_version(text: str) -> str | None:
    """``X.Y.Z (build N, commit H)`` from ``llama-server --version``; old
    builds (``version: 6123 (9a0e6ab1)``) give ``b6123 (9a0e6ab1)``, the release tag name."""
    m = VERSION_RE.search(text)
    if m is None:
        return None
    if m.group("build"):
        return f"{m.group('version')} (build {m.group('build')}, commit {m.group('commit')})"
    version = m.group("version")
    return f"{'b' if version.isdigit() else ''}{version} ({m.group('old_commit')})"


def find_version(env: Mapping[str, str]) -> str | None:
    """``llama-server --version`` on ``env["PATH"]``, parsed; None when it is not there."""
    exe = shutil.which(EXECUTABLE, path=env.get("PATH"))
    if exe is None:
        return None
    try:  # prints the version on stderr (common/arg.cpp, --version)
        out = subprocess.run([exe, "--version"], env=dict(env), capture_output=True, text=True,
                             timeout=VERSION_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_version(out.stdout + out.stderr)


def support_problems(config: ServeConfig, hardware: HardwareSnapshot) -> list[Unsupported]:
    out = []
    if config.devices is not None and hardware.of_kind("cpu") and not hardware.of_kind("cuda"):
        out.append(Unsupported("devices", "on CPU llama-server has no device selection (it uses the cores it may run on; "
                               "set threads with --extra-arg=--threads=N)", SOURCE))
    out += tokenizer_problems(config.model)
    if config.quantization is not None:
        out.append(Unsupported("quantization", "llama.cpp's quantization is chosen by the GGUF file, not a flag: pass a quantized GGUF as --model", SOURCE))
    return out


def tokenizer_problems(model: str) -> list[Unsupported]:
    """Say so when perflab's client cannot count tokens as this GGUF's own tokenizer does.

    llama-server tokenizes with the vocabulary inside the GGUF; :mod:`perflab_llamacpp.gguf`
    rebuilds it as a tokenizer.json (``write_tokenizer_json``) for byte-level BPE models.
    For other kinds, token counts would silently be approximate: a warning instead.
    """
    path = Path(model)
    if not (model.endswith(".gguf") and path.is_file()):
        return []
    from perflab_llamacpp.gguf import GGUFError, UnsupportedTokenizer, read_metadata, tokenizer_json

    try:
        tokenizer_json(read_metadata(path))
    except (GGUFError, UnsupportedTokenizer, OSError) as exc:
        return [Unsupported("tokenizer", f"{exc}; without it benchmark token counts are approximate",
                            "https://github.com/ggml-org/ggml/blob/master/docs/gguf.md", severity="warning")]
    return []


def _model_args(model: str) -> list[str]:
    # A local GGUF file -> -m; "user/repo[:quant]" -> -hf (llama-server downloads it).
    if model.endswith(".gguf") or Path(model).exists() or model.startswith(("/", ".")):
        return ["--model", model]
    return ["--hf-repo", model]


def context_args(max_model_len: int | None, max_num_seqs: int | None) -> list[str]:
    """``--ctx-size`` is shared by the ``--parallel`` slots: ctx = per-request length × slots."""
    if max_model_len is None:
        return [] if max_num_seqs is None else ["--parallel", str(max_num_seqs)]
    slots = max_num_seqs or DEFAULT_SLOTS
    return ["--ctx-size", str(max_model_len * slots), "--parallel", str(slots)]


def launch(config: ServeConfig, hardware: HardwareSnapshot) -> LaunchSpec:
    argv = [EXECUTABLE, *_model_args(config.model), "--host", config.host, "--port", str(config.port)]
    if config.served_model_name:
        argv += ["--alias", config.served_model_name]
    argv += context_args(config.max_model_len, config.max_num_seqs)
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
    if config.devices is not None and hardware.of_kind("cuda"):
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, config.devices))
    return LaunchSpec(engine=ENGINE, argv=tuple(argv), host=config.host, port=config.port,
                      served_model_name=config.name, env=env)


class LlamaCpp(EnginePlugin):
    """llama-server as the object the core calls (hook contract v2)."""

    PERFLAB_HOOKSPEC_VERSIONS = PERFLAB_HOOKSPEC_VERSIONS
    info = EngineInfo(name=ENGINE, display_name="llama.cpp (llama-server)", accelerators=("cuda", "cpu"),
                      description="llama.cpp's OpenAI-compatible server", executable=EXECUTABLE,
                      homepage="https://github.com/ggml-org/llama.cpp", default_port=8080)

    def version(self, env: Mapping[str, str]) -> str | None:
        return find_version(env)

    def check_support(self, config: ServeConfig, hardware: HardwareSnapshot, version: str | None) -> list[Unsupported]:
        return support_problems(config, hardware)

    def build_launch(self, config: ServeConfig, hardware: HardwareSnapshot, workdir: Path, version: str | None) -> LaunchSpec:
        return launch(config, hardware)

    def readiness(self, launch: LaunchSpec) -> Readiness | None:
        return Readiness(http=(HttpProbe("/health"), HttpProbe("/v1/models")), generation_path="/v1/completions",
                         # a ready line only wakes the probes at once; it proves nothing by itself
                         ready_log_patterns=(*READY_PATTERNS, r"llama_server: model loaded$"), startup_timeout_s=900)

    def classify_crash(self, exit_code: int | None, log_tail: str) -> CrashCause | None:
        for line in log_tail.splitlines():
            for name, pattern, explanation, hint in CRASH_PATTERNS:
                if re.search(pattern, line):
                    return CrashCause(name, explanation, line=line, hint=hint, source=SOURCE)
        return None


@hookimpl
def perflab_register_engines(register):
    # the module is the plugin (its entry point); the engine is the object it registers
    register(LlamaCpp())
