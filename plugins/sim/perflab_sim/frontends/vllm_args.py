"""The options of ``vllm serve`` in the vLLM releases the simulator stands in for.

Extracted from each release's own argparse definitions (``EngineArgs.add_cli_args`` and
``AsyncEngineArgs.add_cli_args`` in vllm/engine/arg_utils.py, ``make_arg_parser`` and
``FrontendArgs`` in vllm/entrypoints/openai/cli_args.py, ``ServeSubcommand.subparser_init`` in
vllm/entrypoints/cli/serve.py) of the PyPI wheels vllm==0.9.1, 0.11.0 and 0.17.1: option strings,
argparse action, value type and choices, with the types vLLM derives from its config
dataclasses (bool field -> ``BooleanOptionalAction``, list field -> ``nargs="+"``, Literal ->
choices unless the field also accepts ``str``). Help texts are left out. The rows are data, in perflab_sim/data/vllm_args.json: the whole
table of 0.11.0, and for the other releases the options of 0.11.0 they do not have
(``removed``) and their own or different rows (``rows``).

Row: (option strings, kind, type, choices)
  kind: "value" | "bool" (--x/--no-x) | "store_true" | "nargs+" | "nargs?" | "append" | "positional?"
  type: "str" | "int" | "float" | "json" | "dict-or-str" | "hrint" (human_readable_int: 32k, 1M)
        | "pybool" (argparse ``type=bool``); a trailing "?" is vLLM's ``optional_type``
        ("" or "None" -> None).
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

Row = tuple[tuple[str, ...], str, str | None, tuple[object, ...] | None]


def _row(raw: list[Any]) -> Row:
    options, kind, type_, choices = raw
    return tuple(options), kind, type_, None if choices is None else tuple(choices)


def _tables() -> dict[str, tuple[Row, ...]]:
    data = json.loads(resources.files("perflab_sim").joinpath("data/vllm_args.json").read_text())
    tables: dict[str, tuple[Row, ...]] = {}
    for version, entry in data.items():  # a base release comes before the releases derived from it
        rows = tuple(_row(r) for r in entry["rows"])
        if "base" in entry:
            dropped = set(entry["removed"]) | {r[0][0] for r in rows}
            rows = tuple(r for r in tables[entry["base"]] if r[0][0] not in dropped) + rows
        tables[version] = rows
    return {v: tables[v] for v in sorted(tables, key=lambda v: tuple(int(x) for x in v.split(".")))}


TABLES: dict[str, tuple[Row, ...]] = _tables()
