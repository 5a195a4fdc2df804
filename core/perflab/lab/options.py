"""Serving options as plan files write them, and the configurations built from them.

A plan speaks in the engine-neutral option names declared on :class:`perflab.contract.types.ServeConfig`
(``tp``, ``max_batched_tokens``, ``prefix_caching`` ...; their ``plan_key``: ``env`` for
``extra_env``, ``engine_options`` for ``options``) plus ``replicas``, a lab-level option: N
identical instances on disjoint device sets. Options are plain dictionaries while a study
composes them (plan defaults, engine defaults, a candidate's delta, a combination), and become
a :class:`Configuration` — hashable, with a stable key — at the end.

``python -m perflab.lab.options --write docs/plan-reference.md`` regenerates the option table
of the plan reference from these declarations.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from perflab import redact
from perflab.contract.types import ServeConfig, ServeOption, serve_options

#: the lab-level options, declared like ServeConfig's; each is a field of :class:`PlanServe`
LAB_OPTIONS: tuple[ServeOption, ...] = (
    ServeOption(
        "pos_int", "N identical instances on disjoint device sets; the benchmark spreads requests over all of "
        "them and reports their aggregate (not one instance multiplied).",
        expect="a positive integer (instances on disjoint device sets)", cli=False, name="replicas", lossless=True,
    ),
)

#: plan key -> its option, in declaration order: what a plan's ``serve`` (or a delta) may hold
PLAN_OPTIONS: Mapping[str, ServeOption] = MappingProxyType(
    {o.plan_key: o for o in (*serve_options(), *LAB_OPTIONS) if o.plan_key is not None}
)
#: the plan keys whose change cannot alter greedy outputs beyond batch noise (ServeOption.lossless)
LOSSLESS_OPTIONS: frozenset[str] = frozenset(k for k, o in PLAN_OPTIONS.items() if o.lossless)
# plan key -> ServeConfig field, for the options that are one (not replicas)
_SERVE_FIELD = {o.plan_key: o.name for o in serve_options() if o.plan_key is not None}


@dataclass(frozen=True)
class PlanServe(ServeConfig):
    """A plan's ``serve``: the ServeConfig every configuration starts from (its model is the
    plan's), with the lab-level options (:data:`LAB_OPTIONS`) beside ServeConfig's.
    ``None`` (and an empty collection) is the engine's default, as on ServeConfig."""

    replicas: int | None = None

    def plan_options(self) -> dict[str, Any]:
        """plan key -> value of every option set, in the form a study composes deltas onto
        (:func:`apply_delta`, :class:`Configuration`): the model included."""
        values = {o.plan_key: getattr(self, o.name) for o in (*serve_options(), *LAB_OPTIONS) if o.plan_key is not None}
        return {k: normalise(k, v) for k, v in values.items() if v is not None and v != () and v != {}}

    @classmethod
    def from_plan(cls, model: str, options: Mapping[str, Any]) -> PlanServe:
        """The typed form of checked plan options (plan key -> normalised value; ``None``:
        the engine's default, as when the key is absent)."""
        kw = {_SERVE_FIELD.get(k, k): v for k, v in options.items() if v is not None and k != "model"}
        return cls(model=model, **kw)


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
        kind = PLAN_OPTIONS[key].kind if key in PLAN_OPTIONS else None
        if value is None:
            out.pop(key, None)
        elif kind == "args":
            out[key] = merge_extra_args(tuple(out.get(key, ())), tuple(value))
        elif kind in ("env", "options"):
            out[key] = {**dict(out.get(key, {})), **dict(value)}
        else:
            out[key] = value
    return out


def _env_value(value: Any) -> str:
    return "" if value is None else (str(value).lower() if isinstance(value, bool) else str(value))


# kind -> the canonical, JSON-friendly form of a checked plan value (kinds not named: as given)
_NORMALISE = {
    "args": lambda v: tuple(shlex.split(v)) if isinstance(v, str) else tuple(str(x) for x in v),
    "env": lambda v: {str(k): _env_value(x) for k, x in v.items()},
    "json": lambda v: json.loads(json.dumps(dict(v))),
    "options": lambda v: json.loads(json.dumps(dict(v))),
    "devices": lambda v: tuple(int(x) for x in v),
    "fraction": float,
}


def normalise(key: str, value: Any) -> Any:
    """The canonical, JSON-friendly form of one (already validated) option value."""
    if value is None:
        return None
    convert = _NORMALISE.get(PLAN_OPTIONS[key].kind)
    return value if convert is None else convert(value)


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
        kw = {_SERVE_FIELD[key]: value for key, value in self.options.items() if key in _SERVE_FIELD}
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


# --------------------------------------------------------------------------- the docs table

_TABLE_START = "<!-- serving options: generated by `python -m perflab.lab.options --write docs/plan-reference.md` -->"
_TABLE_END = "<!-- end of serving options -->"


def options_table() -> str:
    """The Markdown table of every serving option (plan key, CLI flag, type, meaning), as
    docs/plan-reference.md shows it between its two markers."""

    def cell(text: str) -> str:
        return text.replace("|", "\\|")

    rows = ["| plan key | CLI flag | type | meaning |", "| --- | --- | --- | --- |"]
    for o in (*serve_options(), *LAB_OPTIONS):
        key = f"`{o.plan_key}`" if o.plan_key else "— (CLI only)"
        flag = "— (plans only)" if o.flag is None else (
            f"`{o.flag}` / `--no-{o.flag[2:]}`" if o.kind == "bool" else f"`{o.flag}`")
        if o.short:
            flag += f", `{o.short}`"
        meaning = o.help + (f" {o.note}" if o.note else "") + (
            f" Default: `{o.default}`." if o.default not in (None, ()) else "") + (
            " Lossless (the accuracy gate keeps only the agreement check)." if o.lossless else "")
        rows.append(f"| {key} | {flag} | {cell(o.doc_type)} | {cell(meaning)} |")
    return "\n".join(rows) + "\n"


def with_options_table(doc: str) -> str:
    """``doc`` (docs/plan-reference.md's text) with the table between its markers regenerated."""
    pattern = re.compile(re.escape(_TABLE_START) + r"\n.*?" + re.escape(_TABLE_END), re.S)
    if not pattern.search(doc):
        raise ValueError(f"no serving options table: expected the markers {_TABLE_START} and {_TABLE_END}")
    return pattern.sub(lambda _: f"{_TABLE_START}\n{options_table()}{_TABLE_END}", doc, count=1)


def main(argv: list[str]) -> int:
    """``python -m perflab.lab.options``: print the table; ``--write FILE``: regenerate it in FILE."""
    if argv[:1] == ["--write"] and len(argv) == 2:
        path = Path(argv[1])
        path.write_text(with_options_table(path.read_text(encoding="utf-8")), encoding="utf-8")
        return 0
    if argv:
        print("usage: python -m perflab.lab.options [--write docs/plan-reference.md]", file=sys.stderr)
        return 2
    sys.stdout.write(options_table())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
