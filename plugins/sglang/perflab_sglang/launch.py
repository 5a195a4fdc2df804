"""ServeConfig -> ``python -m sglang.launch_server`` argv.

Flag spellings are those of SGLang v0.5.5.post1 ``ServerArgs.add_cli_args``
(python/sglang/srt/server_args.py), except where a later version changed them:
perflab_sglang.VERSIONS, asked with the version the launch is for. Choices:

* ``max_batched_tokens`` (vLLM's per-step token budget) -> ``--chunked-prefill-size N
  --max-prefill-tokens N``. SGLang's PrefillAdder stops adding prefill work at whichever of
  the two budgets runs out first (``rem_chunk_tokens`` = chunked_prefill_size,
  ``rem_input_tokens`` = max_prefill_tokens, default 16384; schedule_policy.py), so setting
  only one would leave the other (default) bound in force.
* ``chunked_prefill=False`` -> ``--chunked-prefill-size -1`` ("Setting this to -1 means
  disabling chunked prefill"); the token budget, if any, then goes to --max-prefill-tokens.
* ``prefix_caching=False`` -> ``--disable-radix-cache`` (the radix cache is on by default).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping

from perflab.contract.errors import UnsupportedOption
from perflab.contract.plugin_base import fraction, positive, refuse_unknown
from perflab.contract.types import GroupNode, LaunchSpec, NodeGroup, ServeConfig
from perflab_sglang import VERSIONS
from perflab_sglang.speculative import speculative_args

SERVER_ARGS = "https://github.com/sgl-project/sglang/blob/v0.5.5.post1/python/sglang/srt/server_args.py"

# QUANTIZATION_CHOICES in server_args.py (v0.5.5.post1); those later releases dropped are in VERSIONS
QUANTIZATIONS = frozenset(
    {
        "awq", "fp8", "gptq", "marlin", "gptq_marlin", "awq_marlin", "bitsandbytes", "gguf",
        "modelopt", "modelopt_fp8", "modelopt_fp4", "petit_nvfp4", "w8a8_int8", "w8a8_fp8",
        "moe_wna16", "qoq", "w4afp8", "mxfp4", "auto-round", "compressed-tensors",
    }
)  # fmt: skip
# --kv-cache-dtype choices; vLLM's "fp8" means e4m3
KV_CACHE_DTYPES = {
    "auto": "auto",
    "fp8": "fp8_e4m3",
    "fp8_e4m3": "fp8_e4m3",
    "fp8_e5m2": "fp8_e5m2",
    "bf16": "bf16",
    "bfloat16": "bfloat16",
    "fp4_e2m1": "fp4_e2m1",
}
# vLLM's parser names -> SGLang's ReasoningParser.DetectorMap keys (srt/parser/reasoning_parser.py)
REASONING_PARSERS = {"deepseek_r1": "deepseek-r1", "deepseek_v3": "deepseek-v3", "gpt_oss": "gpt-oss"}
OPTIONS = frozenset({"python"})  # engine-specific ServeConfig.options this plugin understands


def _positive(name: str, value: int) -> str:
    return positive("sglang", name, value)


def build_argv(config: ServeConfig, version: str | None = None) -> list[str]:
    """The argv for SGLang ``version`` (None: the newest perflab maps)."""
    refuse_unknown("sglang", config.options, OPTIONS, "option(s)",
                   f"the SGLang plugin knows only {', '.join(sorted(OPTIONS))}")
    python = str(config.options.get("python") or sys.executable)
    argv = [python, "-m", "sglang.launch_server", "--model-path", config.model]
    argv += ["--host", config.host, "--port", str(config.port)]
    if config.served_model_name:
        argv += ["--served-model-name", config.served_model_name]
    for field, flag in (("tp", "--tp-size"), ("pp", "--pp-size"), ("dp", "--dp-size"), ("ep", "--ep-size")):
        value = getattr(config, field)
        if value is not None:
            argv += [flag, _positive(field, value)]
    if config.max_model_len is not None:
        argv += ["--context-length", _positive("max_model_len", config.max_model_len)]
    budget = config.max_batched_tokens
    if budget is not None:
        _positive("max_batched_tokens", budget)
    if config.chunked_prefill is False:
        argv += ["--chunked-prefill-size", "-1"]
    elif budget is not None:
        argv += ["--chunked-prefill-size", str(budget)]
    if budget is not None:
        argv += ["--max-prefill-tokens", str(budget)]
    if config.max_num_seqs is not None:
        argv += ["--max-running-requests", _positive("max_num_seqs", config.max_num_seqs)]
    if config.quantization is not None:
        if config.quantization not in QUANTIZATIONS:
            raise UnsupportedOption(
                "sglang",
                f"quantization={config.quantization}",
                f"--quantization accepts {', '.join(sorted(QUANTIZATIONS))}",
            )
        q = config.quantization
        argv += ["--quantization", VERSIONS.how("sglang", f"quantization={q}", version, default=q)]
    if config.kv_cache_dtype is not None:
        kv = KV_CACHE_DTYPES.get(config.kv_cache_dtype)
        if kv is None:
            raise UnsupportedOption(
                "sglang",
                f"kv_cache_dtype={config.kv_cache_dtype}",
                f"--kv-cache-dtype accepts {', '.join(KV_CACHE_DTYPES)}",
            )
        argv += ["--kv-cache-dtype", VERSIONS.how("sglang", f"kv_cache_dtype={kv}", version,
                                                  f"kv_cache_dtype={config.kv_cache_dtype}", default=kv)]
    if config.prefix_caching is False:
        argv += ["--disable-radix-cache"]
    if config.speculative_config is not None:
        argv += speculative_args(config.speculative_config, version)
    if config.mem_fraction is not None:
        argv += ["--mem-fraction-static", fraction("sglang", "mem_fraction", config.mem_fraction)]
    if config.reasoning_parser is not None:
        argv += ["--reasoning-parser", REASONING_PARSERS.get(config.reasoning_parser, config.reasoning_parser)]
    argv += list(config.extra_args)
    return argv


def build(config: ServeConfig, env: Mapping[str, str], version: str | None = None) -> LaunchSpec:
    """The launch for SGLang ``version``, with ``env`` the device environment perflab_sglang.plugin made."""
    return LaunchSpec(
        engine="sglang",
        argv=tuple(build_argv(config, version)),
        host=config.host,
        port=int(config.port or 30000),
        served_model_name=config.name,
        env=env,
    )


def build_group(config: ServeConfig, group: NodeGroup, env_for: Callable[[GroupNode], Mapping[str, str]],
                version: str | None = None) -> list[LaunchSpec]:
    """One launch per node rank: the single-node argv plus ``--nnodes N --node-rank R
    --dist-init-addr HOST:PORT`` (server_args.py v0.5.5.post1: ``nnodes: int = 1``, ``node_rank:
    int = 0``, ``dist_init_addr: Optional[str]`` "The host address for initializing distributed
    backend (e.g., `192.168.0.2:25000`)"; ``--tp-size`` is the whole group's: each node runs
    tp/nnodes scheduler ranks). Rank 0 serves HTTP; launch_server.py on a node_rank >= 1 runs its
    schedulers only (no tokenizer manager, no HTTP server)."""
    single = build_argv(config, version)
    head = f"{group.serving.address}:{group.rendezvous_port}"
    out = []
    for node in group.nodes:
        argv = [*single, "--nnodes", str(group.size), "--node-rank", str(node.rank), "--dist-init-addr", head]
        out.append(LaunchSpec(engine="sglang", argv=tuple(argv), host=config.host, port=int(config.port or 30000),
                              served_model_name=config.name, env=env_for(node)))
    return out
