"""The engine-neutral serving options shared by `engines command`, `launch` and plan files.

Each option is one field of :class:`perflab.contract.types.ServeConfig`, declared there once
(:func:`perflab.contract.types.serve_options`); this module derives the click options and turns their
values back into a ServeConfig. The plugins map those fields to their engine's real flags or
config keys.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import click

from perflab.contract.errors import UsageError
from perflab.contract.types import ServeConfig, ServeOption
from perflab.contract.types import serve_options as declared_options


def parse_env_pairs(pairs: tuple[str, ...] | list[str], what: str = "--env") -> dict[str, str]:
    """``KEY=VALUE`` pairs (``--env``, ``--engine-option``) as a mapping; a pair without ``=`` or
    without a key is a usage error."""
    out: dict[str, str] = {}
    for p in pairs:
        key, sep, value = p.partition("=")
        if not sep or not key:
            raise UsageError(f"{what} {p!r}: expected KEY=VALUE")
        out[key] = value
    return out


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


def parse_json_object(
    value: str | None, what: str, example: str = '{"method": "mtp", "num_speculative_tokens": 4}'
) -> dict[str, Any] | None:
    """A JSON object given on the command line (``--speculative-config``, ``--extra-body``)."""
    if value is None:
        return None
    try:
        obj = json.loads(value)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{what}: invalid JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(obj, dict):
        raise UsageError(f"{what}: expected a JSON object such as '{example}'")
    return obj


def parse_engine_options(pairs: tuple[str, ...], what: str = "--engine-option") -> dict[str, Any]:
    """``--engine-option key=value``; values are JSON when they parse as JSON, else strings."""
    out: dict[str, Any] = {}
    for key, value in parse_env_pairs(pairs, what).items():
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


# kind -> (click.option keyword arguments, the ServeConfig value from the option's CLI value and flag)
_CLI_KINDS: dict[str, tuple[dict[str, Any], Callable[[Any, str], Any]]] = {
    "str": ({}, lambda v, flag: v),
    "pos_int": ({"type": click.IntRange(min=1)}, lambda v, flag: v),
    "bool": ({"default": None}, lambda v, flag: v),
    "fraction": ({"type": click.FloatRange(0.0, 1.0, min_open=True)}, lambda v, flag: v),
    "port": ({"type": click.IntRange(1, 65535)}, lambda v, flag: v),
    "json": ({"metavar": "JSON"}, parse_json_object),
    "devices": ({}, lambda v, flag: parse_devices(v)),
    "args": ({"multiple": True, "metavar": "ARG"}, lambda v, flag: tuple(v)),
    "env": ({"multiple": True, "metavar": "KEY=VALUE"}, parse_env_pairs),
    "options": ({"multiple": True, "metavar": "KEY=VALUE"}, parse_engine_options),
}


def _cli_options() -> tuple[ServeOption, ...]:
    return tuple(o for o in declared_options() if o.flag is not None)


def _click_option(opt: ServeOption) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    assert opt.flag is not None
    decls = [f"{opt.flag}/--no-{opt.flag[2:]}" if opt.kind == "bool" else opt.flag]
    if opt.short:
        decls.append(opt.short)
    kw: dict[str, Any] = {"help": opt.help, **_CLI_KINDS[opt.kind][0]}
    if opt.required:
        kw["required"] = True
    elif opt.default is not None and not kw.get("multiple"):
        kw.update(default=opt.default, show_default=True)
    return click.option(*decls, opt.name, **kw)


def serve_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate a click command with every serving option (keyword arguments named like the
    ServeConfig fields; :func:`pop_serve_config` takes them back)."""
    for opt in reversed(_cli_options()):
        fn = _click_option(opt)(fn)
    return fn


def pop_serve_config(kwargs: dict[str, Any]) -> ServeConfig:
    """Remove the serving options from a command's kwargs and build the ServeConfig."""
    values: dict[str, Any] = {}
    for opt in _cli_options():
        assert opt.flag is not None
        values[opt.name] = _CLI_KINDS[opt.kind][1](kwargs.pop(opt.name), opt.flag)
    return ServeConfig(**values)


hardware_option = click.option(
    "--hardware",
    default="auto",
    show_default=True,
    metavar="auto|sim:NAME",
    help="Probe this machine (auto), or simulate a catalog machine such as sim:a100-80g-x8.",
)
json_option = click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON instead of a table.")
engine_version_option = click.option(
    "--engine-version",
    metavar="VERSION",
    help="Build the command for this engine version (planning for another machine). "
         "Default: the version installed here, else the newest the plugin maps.",
)
