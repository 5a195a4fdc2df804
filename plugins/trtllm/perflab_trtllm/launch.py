"""ServeConfig -> ``trtllm-serve MODEL ...`` argv plus its ``--extra_llm_api_options`` YAML.

Flags (tensorrt_llm/commands/serve.py, click options of ``serve``; the underscore spellings
are the ones the seeds use): ``--tp_size`` (alias of --tensor_parallel_size), ``--pp_size``,
``--ep_size`` (alias of --moe_expert_parallel_size), ``--max_seq_len``, ``--max_num_tokens``,
``--max_batch_size``, ``--enable_chunked_prefill`` (a flag, default off),
``--kv_cache_free_gpu_memory_fraction`` (the original name; newer releases call it
--free_gpu_memory_fraction and keep this one as an alias), ``--reasoning_parser``,
``--backend``, ``--extra_llm_api_options`` (alias ``--config``).

Everything else goes into the YAML, whose keys are LLM-API arguments
(tensorrt_llm/llmapi/llm_args.py): ``kv_cache_config.enable_block_reuse`` (prefix caching,
on by default), ``kv_cache_config.dtype`` (PyTorch backend KV-cache dtype),
``enable_attention_dp``, ``speculative_config``, and — TensorRT-engine backend only —
``quant_config.quant_algo`` / ``quant_config.kv_cache_quant_algo``.

trtllm-serve has no served-model-name option: the OpenAI server reports the MODEL argument
(the directory name for a local checkpoint; OpenAIServer.__init__ in serve/openai_server.py).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from perflab.contract.errors import UnsupportedOption
from perflab.contract.plugin_base import fraction, positive, refuse_unknown
from perflab.contract.types import FileSpec, LaunchSpec, ServeConfig
from perflab_trtllm.speculative import speculative_config

SERVE = "https://github.com/NVIDIA/TensorRT-LLM/blob/main/tensorrt_llm/commands/serve.py"
EXTRA_OPTIONS_FILE = "extra_llm_api_options.yaml"
OPTIONS = frozenset({"backend", "prequantized", "extra_llm_api_options"})
BACKENDS = frozenset({"pytorch", "tensorrt", "trt", "_autodeploy"})
TRT_ENGINE_BACKENDS = frozenset({"tensorrt", "trt"})

# QuantAlgo names (tensorrt_llm/quantization/mode.py) for the TensorRT-engine backend, which
# quantizes an HF checkpoint while building; the PyTorch backend only loads pre-quantized ones.
QUANT_ALGOS = {
    "fp8": "FP8",
    "fp8_block_scales": "FP8_BLOCK_SCALES",
    "awq": "W4A16_AWQ",
    "int4_awq": "W4A16_AWQ",
    "w4a16_awq": "W4A16_AWQ",
    "gptq": "W4A16_GPTQ",
    "w4a16_gptq": "W4A16_GPTQ",
    "w4a8_awq": "W4A8_AWQ",
    "w8a16": "W8A16",
    "w4a16": "W4A16",
    "w8a8": "W8A8_SQ_PER_CHANNEL",
    "int8_sq": "W8A8_SQ_PER_CHANNEL",
    "nvfp4": "NVFP4",
}
KV_QUANT_ALGOS = {"fp8": "FP8", "fp8_e4m3": "FP8", "int8": "INT8"}
# kv_cache_config.dtype of the PyTorch backend
KV_DTYPES = {"auto": "auto", "fp8": "fp8", "fp8_e4m3": "fp8"}
REASONING_PARSERS = {"deepseek_r1": "deepseek-r1"}  # perflab/vLLM spelling -> trtllm-serve choice


def checkpoint_is_quantized(model: str, quantization: str) -> bool:
    """A pre-quantized checkpoint names its format (Qwen/Qwen3-32B-FP8, ...-AWQ, ...-NVFP4)."""
    names = set(re.split(r"[-_./]", model.lower()))
    return any(part in names for part in re.split(r"[-_]", quantization.lower()) if part)


def reported_model_name(model: str) -> str:
    path = Path(model)
    return path.name if path.is_dir() else model


def _merge(into: dict[str, Any], extra: Mapping[str, Any], where: str = "") -> None:
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(into.get(key), dict):
            _merge(into[key], value, f"{where}{key}.")
        elif key in into and into[key] != value:
            raise UnsupportedOption(
                "trtllm",
                f"extra_llm_api_options.{where}{key}",
                f"conflicts with the value perflab derived from the serving options ({into[key]!r})",
            )
        else:
            into[key] = dict(value) if isinstance(value, Mapping) else value


def _positive(name: str, value: int) -> str:
    return positive("trtllm", name, value)


def build(config: ServeConfig, workdir: Path, env: Mapping[str, str]) -> LaunchSpec:
    """The launch, with ``env`` the device environment perflab_trtllm.plugin made."""
    refuse_unknown("trtllm", config.options, OPTIONS, "option(s)",
                   f"the TensorRT-LLM plugin knows only {', '.join(sorted(OPTIONS))}")
    backend = config.options.get("backend")
    if backend is not None and backend not in BACKENDS:
        raise UnsupportedOption(
            "trtllm", f"backend={backend}", f"--backend accepts {', '.join(sorted(BACKENDS))} ({SERVE})"
        )
    trt_engine = backend in TRT_ENGINE_BACKENDS
    warnings: list[str] = []
    llm_api: dict[str, Any] = {}

    argv = ["trtllm-serve", config.model, "--host", config.host, "--port", str(config.port)]
    if backend is not None:
        argv += ["--backend", str(backend)]

    reported = reported_model_name(config.model)
    if config.served_model_name is not None and config.served_model_name != reported:
        raise UnsupportedOption(
            "trtllm",
            f"served_model_name={config.served_model_name}",
            f"trtllm-serve has no served-model-name option; it serves the model as {reported!r}",
        )

    tp = config.tp
    if config.dp is not None and config.dp > 1:
        # Attention DP in TensorRT-LLM runs over all tensor-parallel ranks
        # (attention_dp_size = tp_size): there is no attention-TP inside a DP group.
        if tp not in (None, 1):
            raise UnsupportedOption(
                "trtllm",
                f"dp={config.dp} with tp={tp}",
                "TensorRT-LLM's attention data parallelism spans every rank (enable_attention_dp with "
                "tp_size = dp); attention cannot be tensor-parallel inside a DP group",
            )
        tp = config.dp
        llm_api["enable_attention_dp"] = True
    elif config.dp is not None:
        _positive("dp", config.dp)
    if tp is not None:
        argv += ["--tp_size", _positive("tp", tp)]
    if config.pp is not None:
        argv += ["--pp_size", _positive("pp", config.pp)]
    if config.ep is not None:
        argv += ["--ep_size", _positive("ep", config.ep)]
    if config.max_model_len is not None:
        argv += ["--max_seq_len", _positive("max_model_len", config.max_model_len)]
    if config.max_batched_tokens is not None:
        argv += ["--max_num_tokens", _positive("max_batched_tokens", config.max_batched_tokens)]
    if config.max_num_seqs is not None:
        argv += ["--max_batch_size", _positive("max_num_seqs", config.max_num_seqs)]
    if config.chunked_prefill:
        argv += ["--enable_chunked_prefill"]  # off by default: chunked_prefill=False adds nothing
    if config.mem_fraction is not None:
        argv += ["--kv_cache_free_gpu_memory_fraction", fraction("trtllm", "mem_fraction", config.mem_fraction)]
    if config.reasoning_parser is not None:
        argv += ["--reasoning_parser", REASONING_PARSERS.get(config.reasoning_parser, config.reasoning_parser)]

    if config.quantization is not None:
        q = config.quantization.lower()
        if config.options.get("prequantized") or checkpoint_is_quantized(config.model, q):
            warnings.append(
                f"quantization={config.quantization}: trtllm-serve reads it from the checkpoint's "
                "quantization config (hf_quant_config.json / config.json); no option is passed"
            )
        elif trt_engine and q in QUANT_ALGOS:
            llm_api.setdefault("quant_config", {})["quant_algo"] = QUANT_ALGOS[q]
        else:
            raise UnsupportedOption(
                "trtllm",
                f"quantization={config.quantization}",
                "the PyTorch backend serves only pre-quantized checkpoints (e.g. a ...-FP8 model); "
                f"on-the-fly quantization needs backend=tensorrt with one of {', '.join(sorted(QUANT_ALGOS))}",
            )
    if config.kv_cache_dtype is not None:
        kv = config.kv_cache_dtype.lower()
        if trt_engine:
            if kv in KV_QUANT_ALGOS:
                llm_api.setdefault("quant_config", {})["kv_cache_quant_algo"] = KV_QUANT_ALGOS[kv]
            elif kv != "auto":
                raise UnsupportedOption(
                    "trtllm",
                    f"kv_cache_dtype={config.kv_cache_dtype}",
                    f"quant_config.kv_cache_quant_algo accepts {', '.join(KV_QUANT_ALGOS)}",
                )
        elif kv in KV_DTYPES:
            llm_api.setdefault("kv_cache_config", {})["dtype"] = KV_DTYPES[kv]
        else:
            raise UnsupportedOption(
                "trtllm",
                f"kv_cache_dtype={config.kv_cache_dtype}",
                f"kv_cache_config.dtype accepts {', '.join(KV_DTYPES)}",
            )
    if config.prefix_caching is not None:
        llm_api.setdefault("kv_cache_config", {})["enable_block_reuse"] = bool(config.prefix_caching)
    if config.speculative_config is not None:
        llm_api["speculative_config"] = speculative_config(config.speculative_config)
    user_api = config.options.get("extra_llm_api_options")
    if user_api is not None:
        if not isinstance(user_api, Mapping):
            raise UnsupportedOption("trtllm", "extra_llm_api_options", "expected a mapping of LLM-API arguments")
        _merge(llm_api, user_api)

    files: tuple[FileSpec, ...] = ()
    if llm_api:
        import yaml  # only needed when there is something to write

        path = str(Path(workdir) / EXTRA_OPTIONS_FILE)
        files = (FileSpec(path=path, content=yaml.safe_dump(llm_api, sort_keys=False)),)
        argv += ["--extra_llm_api_options", path]
    argv += list(config.extra_args)

    return LaunchSpec(
        engine="trtllm",
        argv=tuple(argv),
        host=config.host,
        port=int(config.port or 8000),
        served_model_name=reported,
        env=env,
        files=files,
        warnings=tuple(warnings),
    )
