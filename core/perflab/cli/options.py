"""The engine-neutral serving options shared by `engines command`, `launch` and plan files.

Each option maps to one field of :class:`perflab.types.ServeConfig`; the plugins map those
fields to their engine's real flags or config keys.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import click

from perflab.engines import parse_env_pairs
from perflab.errors import UsageError
from perflab.types import ServeConfig


def parse_devices(value: str | None) -> tuple[int, ...] | None:
    if value is None or value == "":
        return None
    try:
        devs = tuple(int(v) for v in value.split(","))
    except ValueError:
        raise UsageError(f"--devices {value!r}: expected a comma list of device indexes such as 0,1,2,3") from None
    if len(set(devs)) != len(devs) or any(d < 0 for d in devs):
        raise UsageError(f"--devices {value!r}: indexes must be distinct and non-negative")
    return devs


def parse_json_object(value: str | None, what: str) -> dict[str, Any] | None:
    if value is None:
        return None
    try:
        obj = json.loads(value)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{what}: invalid JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(obj, dict):
        raise UsageError(f"{what}: expected a JSON object such as '{{\"method\": \"mtp\", \"num_speculative_tokens\": 4}}'")
    return obj


def parse_engine_options(pairs: tuple[str, ...]) -> dict[str, Any]:
    """``--engine-option key=value``; values are JSON when they parse as JSON, else strings."""
    out: dict[str, Any] = {}
    for key, value in parse_env_pairs(pairs, "--engine-option").items():
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


_OPTIONS: list[Callable[[Callable[..., Any]], Callable[..., Any]]] = [
    click.option("--model", "-m", required=True, help="Model id (Hugging Face) or local path."),
    click.option("--served-model-name", help="Name clients use in requests (default: the model)."),
    click.option("--tp", type=click.IntRange(min=1), help="Tensor-parallel size."),
    click.option("--pp", type=click.IntRange(min=1), help="Pipeline-parallel size."),
    click.option("--dp", type=click.IntRange(min=1), help="Data-parallel size."),
    click.option("--ep", type=click.IntRange(min=1), help="Expert-parallel size (vLLM: must equal tp×dp; it maps to --enable-expert-parallel)."),
    click.option("--max-model-len", type=click.IntRange(min=1), help="Maximum context length (prompt + output)."),
    click.option("--max-batched-tokens", type=click.IntRange(min=1), help="Token budget of one scheduler step."),
    click.option("--max-num-seqs", type=click.IntRange(min=1), help="Maximum concurrent sequences (batch size)."),
    click.option("--quantization", "-q", help="Quantization method as the engine names it (fp8, awq, ascend, ...)."),
    click.option("--kv-cache-dtype", help="KV cache data type (auto, fp8, ...)."),
    click.option("--prefix-caching/--no-prefix-caching", default=None, help="Turn automatic prefix caching on or off (default: engine's)."),
    click.option("--chunked-prefill/--no-chunked-prefill", default=None, help="Turn chunked prefill on or off (default: engine's)."),
    click.option("--speculative-config", metavar="JSON", help='Speculative decoding as JSON, e.g. \'{"method":"mtp","num_speculative_tokens":4}\'.'),
    click.option("--mem-fraction", type=click.FloatRange(0.0, 1.0, min_open=True), help="Fraction of accelerator memory the engine may use."),
    click.option("--reasoning-parser", help="Reasoning parser (e.g. qwen3)."),
    click.option("--host", default="127.0.0.1", show_default=True, help="Address the engine binds."),
    click.option("--port", type=click.IntRange(1, 65535), help="Port the engine serves on (default: engine's usual port for a dry run, a free one for launch)."),
    click.option("--devices", help="Accelerator indexes to use, e.g. 0,1,2,3 (sets CUDA_VISIBLE_DEVICES / ASCEND_RT_VISIBLE_DEVICES)."),
    click.option("--extra-arg", "extra_args", multiple=True, metavar="ARG", help="Argument passed to the engine verbatim (repeatable), e.g. --extra-arg=--performance-mode=throughput."),
    click.option("--env", "env_pairs", multiple=True, metavar="KEY=VALUE", help="Environment variable for the engine (repeatable)."),
    click.option("--engine-option", "engine_options", multiple=True, metavar="KEY=VALUE", help="Engine-specific option understood by the plugin (repeatable)."),
]


def serve_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate a click command with every serving option."""
    for opt in reversed(_OPTIONS):
        fn = opt(fn)
    return fn


SERVE_OPTION_NAMES = (
    "model", "served_model_name", "tp", "pp", "dp", "ep", "max_model_len", "max_batched_tokens",
    "max_num_seqs", "quantization", "kv_cache_dtype", "prefix_caching", "chunked_prefill",
    "speculative_config", "mem_fraction", "reasoning_parser", "host", "port", "devices",
    "extra_args", "env_pairs", "engine_options",
)


def pop_serve_config(kwargs: dict[str, Any]) -> ServeConfig:
    """Remove the serving options from a command's kwargs and build the ServeConfig."""
    v = {k: kwargs.pop(k) for k in SERVE_OPTION_NAMES}
    return ServeConfig(
        model=v["model"],
        served_model_name=v["served_model_name"],
        tp=v["tp"],
        pp=v["pp"],
        dp=v["dp"],
        ep=v["ep"],
        max_model_len=v["max_model_len"],
        max_batched_tokens=v["max_batched_tokens"],
        max_num_seqs=v["max_num_seqs"],
        quantization=v["quantization"],
        kv_cache_dtype=v["kv_cache_dtype"],
        prefix_caching=v["prefix_caching"],
        chunked_prefill=v["chunked_prefill"],
        speculative_config=parse_json_object(v["speculative_config"], "--speculative-config"),
        mem_fraction=v["mem_fraction"],
        reasoning_parser=v["reasoning_parser"],
        host=v["host"],
        port=v["port"],
        devices=parse_devices(v["devices"]),
        extra_args=tuple(v["extra_args"]),
        extra_env=parse_env_pairs(v["env_pairs"]),
        options=parse_engine_options(v["engine_options"]),
    )


hardware_option = click.option(
    "--hardware",
    default="auto",
    show_default=True,
    metavar="auto|sim:NAME",
    help="Probe this machine (auto), or simulate a catalog machine such as sim:a100-80g-x8.",
)
json_option = click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON instead of a table.")
