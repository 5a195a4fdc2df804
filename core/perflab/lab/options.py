"""Serving options as plan files write them, and the configurations built from them.

A plan speaks in the engine-neutral field names of :class:`perflab.types.ServeConfig`
(``tp``, ``max_batched_tokens``, ``prefix_caching`` ...) plus ``replicas``, a lab-level
option: N identical instances on disjoint device sets. Options are plain dictionaries while a
study composes them (plan defaults, engine defaults, a candidate's delta, a combination), and
become a :class:`Configuration` — hashable, with a stable key — at the end.
"""

from __future__ import annotations

import hashlib
import json
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from perflab import redact
from perflab.types import ServeConfig

# name -> (kind, what the plan must give); the kinds are checked in perflab.lab.plan
OPTION_KINDS: dict[str, tuple[str, str]] = {
    "model": ("str", "a model id or local path"),
    "served_model_name": ("str", "a name"),
    "tp": ("pos_int", "a positive integer"),
    "pp": ("pos_int", "a positive integer"),
    "dp": ("pos_int", "a positive integer"),
    "ep": ("pos_int", "a positive integer"),
    "max_model_len": ("pos_int", "a positive integer"),
    "max_batched_tokens": ("pos_int", "a positive integer"),
    "max_num_seqs": ("pos_int", "a positive integer"),
    "quantization": ("str", "a quantization method name such as fp8 or awq"),
    "kv_cache_dtype": ("str", "a KV cache dtype such as fp8"),
    "prefix_caching": ("bool", "true or false"),
    "chunked_prefill": ("bool", "true or false"),
    "speculative_config": ("mapping", 'a mapping such as {method: mtp, num_speculative_tokens: 4}'),
    "mem_fraction": ("fraction", "a number in (0, 1]"),
    "reasoning_parser": ("str", "a parser name such as qwen3"),
    "devices": ("devices", "a list of distinct non-negative device indexes"),
    "extra_args": ("args", "a list of arguments such as ['--performance-mode=throughput']"),
    "env": ("env", "a mapping of environment variables"),
    "engine_options": ("mapping", "a mapping of engine-specific options"),
    "replicas": ("pos_int", "a positive integer (instances on disjoint device sets)"),
}

# options copied onto ServeConfig under another name
_SERVE_FIELD = {"env": "extra_env", "engine_options": "options"}
LAB_ONLY = frozenset({"replicas"})


def _flag_groups(args: tuple[str, ...]) -> list[tuple[str, tuple[str, ...]]]:
    """Split an argument list into (flag name, tokens): ``--a=1 --b 2 x`` -> a, b."""
    groups: list[tuple[str, tuple[str, ...]]] = []
    for arg in args:
        if arg.startswith("-") or not groups:
            name = arg.split("=", 1)[0]
            groups.append((name, (arg,)))
        else:
            name, toks = groups[-1]
            groups[-1] = (name, (*toks, arg))
    return groups


def merge_extra_args(base: tuple[str, ...], delta: tuple[str, ...]) -> tuple[str, ...]:
    """Later flags replace earlier ones of the same name (``--performance-mode=...``)."""
    merged: dict[str, tuple[str, ...]] = {}
    for name, toks in _flag_groups(base) + _flag_groups(delta):
        merged.pop(name, None)  # keep the position of the newest occurrence
        merged[name] = toks
    return tuple(t for toks in merged.values() for t in toks)


def apply_delta(base: Mapping[str, Any], delta: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``delta`` applied: a value replaces, ``None`` removes (engine default),
    ``extra_args`` merge by flag name, ``env`` and ``engine_options`` merge by key."""
    out = dict(base)
    for key, value in delta.items():
        if value is None:
            out.pop(key, None)
        elif key == "extra_args":
            out[key] = merge_extra_args(tuple(out.get(key, ())), tuple(value))
        elif key in ("env", "engine_options"):
            out[key] = {**dict(out.get(key, {})), **dict(value)}
        else:
            out[key] = value
    return out


def normalise(key: str, value: Any) -> Any:
    """The canonical, JSON-friendly form of one (already validated) option value."""
    if value is None:
        return None
    kind = OPTION_KINDS[key][0]
    if kind == "args":
        if isinstance(value, str):
            return tuple(shlex.split(value))
        return tuple(str(v) for v in value)
    if kind == "env":
        return {str(k): "" if v is None else (str(v).lower() if isinstance(v, bool) else str(v)) for k, v in value.items()}
    if kind == "mapping":
        return json.loads(json.dumps(dict(value)))
    if kind == "devices":
        return tuple(int(v) for v in value)
    if kind == "fraction":
        return float(value)
    return value


def _canonical(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _canonical(value[k]) for k in sorted(value)}
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    return value


@dataclass(frozen=True)
class Configuration:
    """One engine with its options: the unit a study launches and measures."""

    engine: str
    options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        clean = {k: v for k, v in self.options.items() if v is not None and v != () and v != {}}
        object.__setattr__(self, "options", MappingProxyType(clean))

    @property
    def replicas(self) -> int:
        return int(self.options.get("replicas", 1))

    @property
    def model(self) -> str:
        return str(self.options["model"])

    def canonical(self) -> dict[str, Any]:
        # secrets as *** (perflab.redact): what is stored and keyed; a plan's masked copy keys the same
        return {"engine": self.engine, "options": redact.redact_obj(_canonical(dict(self.options)), "options")}

    def key(self, salt: Mapping[str, Any] | None = None) -> str:
        """A stable id of what runs: same engine, options (and salt: hardware) -> same key."""
        payload = {"config": self.canonical(), "salt": _canonical(dict(salt or {}))}
        text = json.dumps(payload, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def with_delta(self, delta: Mapping[str, Any]) -> Configuration:
        return Configuration(self.engine, apply_delta(self.options, delta))

    def serve_config(self, devices: tuple[int, ...] | None = None, port: int | None = None) -> ServeConfig:
        """The ServeConfig of one instance (one replica)."""
        kw: dict[str, Any] = {}
        for key, value in self.options.items():
            if key in LAB_ONLY:
                continue
            kw[_SERVE_FIELD.get(key, key)] = value
        if devices is not None:
            kw["devices"] = devices
        return ServeConfig(port=port, **kw)

    def describe(self, base: Configuration | None = None) -> str:
        """Short human text of the options that differ from ``base`` (all when None)."""
        ref = dict(base.options) if base is not None and base.engine == self.engine else {}
        parts = []
        for key in sorted(self.options):
            value = self.options[key]
            if ref.get(key) == value:
                continue
            if key == "extra_args":
                parts.append(" ".join(value))
            elif isinstance(value, bool):
                parts.append(key if value else f"no {key}")
            else:
                parts.append(f"{key}={value if not isinstance(value, Mapping) else json.dumps(dict(value))}")
        removed = [k for k in ref if k not in self.options]
        parts += [f"{k}=default" for k in sorted(removed)]
        return redact.scrub(", ".join(parts))


def replica_devices(
    replicas: int, per_replica: int, available: tuple[int, ...], explicit: tuple[int, ...] | None = None
) -> list[tuple[int, ...]] | None:
    """Disjoint device sets for ``replicas`` instances of ``per_replica`` devices each.

    ``None`` when one instance uses the default device selection (no replicas, no explicit
    devices); raises ValueError when the machine has too few devices.
    """
    pool = tuple(explicit) if explicit is not None else tuple(available)
    if replicas == 1:
        return None if explicit is None else [pool]
    need = replicas * per_replica
    if len(pool) < need:
        raise ValueError(
            f"{replicas} replicas × {per_replica} device(s) need {need} devices, {len(pool)} available"
        )
    return [pool[i * per_replica : (i + 1) * per_replica] for i in range(replicas)]
