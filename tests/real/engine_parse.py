"""Parse command lines with an engine's own argument parser; run by the engine's Python.

    ENGINE_PYTHON engine_parse.py vllm|sglang < argvs.json > parsed.json

stdin: a JSON list of argvs as perflab builds them (``vllm serve MODEL ...`` or ``python -m
sglang.launch_server ...``). stdout: one JSON object per argv, in order: ``{"ok": true,
"values": {...}}`` with every value the engine parsed (vLLM: ``AsyncEngineArgs.from_cli_args``'s
fields over the serve namespace; SGLang: ``prepare_server_args``'s record), or ``{"ok": false,
"error": ...}`` with what the parser said. This file imports the engine, never perflab: the
engine's environment has no perflab in it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import io
import json
import logging
import sys
from collections.abc import Callable
from typing import Any


def jsonable(value: Any) -> Any:
    """Parsed values as JSON: enums by name, config objects as their fields, anything else by repr."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, enum.Enum):  # a str enum's name is its value; others' values are codes
        return value.name
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [jsonable(v) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return jsonable(dump())
    return repr(value)


def vllm_parser() -> Callable[[list[str]], dict[str, Any]]:
    """``vllm serve``'s parser, built the way the ``vllm`` CLI builds it (vllm/entrypoints/cli/main.py)."""
    from vllm import platforms

    # As `vllm bench` does (vllm/entrypoints/cli/main.py): never infer a device from a platform
    # this machine cannot name; the CPU build already resolves to its CPU platform.
    if platforms.current_platform.is_unspecified():
        from vllm.platforms.cpu import CpuPlatform

        platforms.current_platform = CpuPlatform()
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    serve = ServeSubcommand()
    root = FlexibleArgumentParser(prog="vllm")
    serve.subparser_init(root.add_subparsers(dest="subparser", required=True))

    def parse(argv: list[str]) -> dict[str, Any]:
        if argv[:2] != ["vllm", "serve"]:
            raise ValueError(f"not a vllm serve command line: {argv[:2]}")
        args = root.parse_args(argv[1:])
        if args.model_tag is not None:  # what ServeSubcommand.cmd does first
            args.model = args.model_tag
        serve.validate(args)
        engine_args = AsyncEngineArgs.from_cli_args(args)
        values = {k: jsonable(v) for k, v in vars(args).items() if k != "dispatch_function"}
        values.update({f.name: jsonable(getattr(engine_args, f.name)) for f in dataclasses.fields(engine_args)})
        return values

    return parse


def sglang_parser() -> Callable[[list[str]], dict[str, Any]]:
    """SGLang's own: ``prepare_server_args`` (``ServerArgs.add_cli_args`` + ``from_cli_args``)."""
    from sglang.srt.server_args import ServerArgs, prepare_server_args

    def parse(argv: list[str]) -> dict[str, Any]:
        if argv[1:3] != ["-m", "sglang.launch_server"]:
            raise ValueError(f"not an sglang.launch_server command line: {argv[:3]}")
        server_args = prepare_server_args(argv[3:])
        return {name: jsonable(getattr(server_args, name)) for name in _field_names(ServerArgs, server_args)}

    return parse


def _field_names(cls: type, record: Any) -> list[str]:
    try:
        from sglang.srt.server_args import record_fields  # type: ignore[attr-defined]

        return [f.name for f in record_fields(cls)]
    except ImportError:  # a plain dataclass in the releases before the record types
        return [f.name for f in dataclasses.fields(record)]


PARSERS: dict[str, Callable[[], Callable[[list[str]], dict[str, Any]]]] = {
    "vllm": vllm_parser,
    "sglang": sglang_parser,
}


def main() -> None:
    engine = sys.argv[1]
    argvs = json.load(sys.stdin)
    out = sys.stdout
    sys.stdout = sys.stderr  # engine log lines never mix with the JSON answer
    parse = PARSERS[engine]()
    results = []
    for argv in argvs:
        said = io.StringIO()
        try:
            with contextlib.redirect_stderr(said):
                values = parse(argv)
        except SystemExit as exc:  # argparse's error(): the message went to stderr
            results.append({"ok": False, "error": said.getvalue().strip() or f"exit {exc.code}"})
        except Exception as exc:  # noqa: BLE001 — the engine's own validation, reported per argv
            results.append({"ok": False, "error": f"{type(exc).__name__}: {exc}"})
        else:
            results.append({"ok": True, "values": values})
    json.dump(results, out)
    out.write("\n")


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    main()
