"""The simulated ``python -m sglang.launch_server`` (SGLang 0.5.5).

Sources (PyPI wheel sglang==0.5.5, read for this module):

- python/sglang/launch_server.py: ``prepare_server_args(sys.argv[1:])``.
- python/sglang/srt/server_args.py: ``prepare_server_args`` parses with a plain
  ``argparse.ArgumentParser()`` (prog: ``launch_server.py``), merging a ``--config`` YAML
  first (server_args_config_parser.py); the options are in :mod:`.sglang_args`.
  ``_handle_gpu_memory_settings``: on 60-90 GiB GPUs chunked_prefill_size 8192 and
  cuda_graph_max_bs 256 (tp < 4) / 512; ``mem_fraction_static = (gpu_mem - reserved) /
  gpu_mem`` with reserved = 512 + 1.5 x chunk + 2 x graph bs + tp x pp / 8 x 1024 MiB
  (at least 10 GiB on > 60 GiB GPUs, + 2 GiB for EAGLE/NEXTN drafts).
- srt/model_executor/model_runner.py: max_num_reqs = min(max(tokens / context_len x 512,
  2048), 4096); srt/managers/tp_worker.py: max_running_requests = min(that, tokens // 2).
- srt/entrypoints/http_server.py: ``/health``, ``/health_generate``; uvicorn binds after the
  model is loaded, a warm-up ``POST /generate`` runs, then
  ``The server is fired up and ready to roll!``. Log format (utils/common.py
  ``configure_logger``): ``[YYYY-MM-DD HH:MM:SS] message``, `` TP0`` inside the brackets in
  scheduler processes; uvicorn lines ``[...] INFO:     ...`` (``set_uvicorn_logging_configs``).
- srt/managers/scheduler.py ``Scheduler hit an exception: ...`` then the launcher's
  ``Received sigquit from a child process. It usually means the child failed.`` and
  ``kill_process_tree`` (SIGKILL) — how a scheduler crash ends the server.
- Processes: ``sglang::scheduler_TP<n>`` per rank, ``sglang::detokenizer``.
- FP8 block-quantized checkpoints on SM80: Triton cannot compile the e4m3 kernels,
  ``ValueError: type fp8e4nv not supported in this architecture. The supported fp8 dtypes are
  ('fp8e4b15', 'fp8e5')`` (https://github.com/sgl-project/sglang/issues/5871); seed 001:
  "Running SGLang with FP8 quantization on A100 GPUs does not work".
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from perflab_sim.config import EngineBehaviour, SimEngineConfig
from perflab_sim.frontends import common
from perflab_sim.frontends.common import EngineArgumentParser, EngineExit, SimMachine
from perflab_sim.frontends.sglang_args import V0_5_5

DEFAULT_VERSION = "0.5.5.post1"  # seeds 001/002
# The options reproduced are 0.5.5's (sglang_args); other releases (seed 004 measured 0.5.9)
# are simulated with them and the log says so.
KNOWN_OPTIONS = "0.5.5"
PROG = "launch_server.py"  # argparse's prog: basename of sys.argv[0] under `python -m`

# SGLang 0.5.10 replaced the n-gram matcher's match windows with a trie (server_args.py of the
# 0.5.10 wheel against 0.5.9's): --speculative-ngram-{min,max}-match-window-size are gone and
# --speculative-ngram-branch-length is --speculative-ngram-max-trie-depth (default 18 both). A
# simulated 0.5.10 or later parses them so (perflab_sglang.VERSIONS builds them so).
NGRAM_TRIE_SINCE = "0.5.10"
NGRAM_WINDOWS = ("--speculative-ngram-min-match-window-size", "--speculative-ngram-max-match-window-size")
NGRAM_RENAMED = {"--speculative-ngram-branch-length": "--speculative-ngram-max-trie-depth"}
# 0.5.10's _handle_ngram: speculative_num_draft_tokens defaults to 12 (0.5.5: the max window, 12)
NGRAM_DRAFTS = 12

# --speculative-algorithm -> the runtime's method names
SPEC_METHODS = {"NEXTN": "mtp", "EAGLE": "eagle", "EAGLE3": "eagle3", "STANDALONE": "draft_model", "NGRAM": "ngram"}


def _named(name: str, fn: Any) -> Any:
    fn.__name__ = name
    return fn


def _json_list_type(value: str) -> Any:
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        raise argparse.ArgumentTypeError(f"Invalid JSON list: {value}. Please provide a valid JSON list.") from None


def _nullable_str(val: str) -> str | None:
    if not val or val == "None":
        return None
    return val


TYPES: dict[str, Any] = {
    "str": str,
    "int": int,
    "float": float,
    "json_list_type": _named("json_list_type", _json_list_type),
    "nullable_str": _named("nullable_str", _nullable_str),
}


def ngram_trie(version: str) -> bool:
    """Whether SGLang ``version`` has the n-gram trie's flags (0.5.10 on), not the match windows."""
    return common.version_tuple(version) >= common.version_tuple(NGRAM_TRIE_SINCE)


def build_parser(version: str = KNOWN_OPTIONS) -> EngineArgumentParser:
    parser = EngineArgumentParser(prog=PROG)
    trie = ngram_trie(version)
    for opts, kw in V0_5_5:
        if trie and opts[0] in NGRAM_WINDOWS:
            continue
        if trie:
            opts = tuple(NGRAM_RENAMED.get(o, o) for o in opts)
        kw = dict(kw)
        if "type" in kw:
            kw["type"] = TYPES[kw["type"]]
        if kw.get("action") == "lora_paths":
            kw.pop("action")
        parser.add_argument(*opts, **kw)
    return parser


def _merge_config(argv: list[str], parser: argparse.ArgumentParser) -> list[str]:
    """``ConfigArgumentMerger.merge_config_with_args`` (server_args_config_parser.py)."""
    if "--config" not in argv:
        return argv
    if argv.count("--config") > 1:
        raise _error("ValueError: Multiple config files specified! Only one allowed.")
    i = argv.index("--config")
    if i == len(argv) - 1:
        raise _error("ValueError: No config file specified after --config flag!")
    path = Path(argv[i + 1])
    if path.suffix.lower() not in (".yaml", ".yml"):
        raise _error(f"ValueError: Config file must be YAML format, got: {path.suffix}")
    if not path.exists():
        raise _error(f"ValueError: Config file not found: {path}")
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise _error("ValueError: Config file must contain a dictionary at root level")
    store_true = {a.dest for a in parser._actions if isinstance(a, argparse._StoreTrueAction)}
    out: list[str] = []
    for key, value in data.items():
        if isinstance(value, bool):
            if key.replace("-", "_") in store_true:
                if value:
                    out.append(f"--{key}")
            elif value:
                out.append(f"--{key}")
        elif isinstance(value, list):
            if value:
                out.append(f"--{key}")
                out.extend(str(v) for v in value)
        else:
            out += [f"--{key}", str(value)]
    return out + argv[:i] + argv[i + 2 :]


def _error(exc_line: str) -> EngineExit:
    tb = common.traceback_text(
        [("/sgl-workspace/sglang/python/sglang/launch_server.py", 24, "<module>", "server_args = prepare_server_args(sys.argv[1:])")],
        exc_line,
    )
    return EngineExit(1, stderr=tb + "\n")


class SglangLog:
    def __init__(self) -> None:
        self.pid = common.pid()

    def line(self, message: str, rank: str = "") -> str:
        stamp = common.now().strftime("%Y-%m-%d %H:%M:%S")
        return f"[{stamp}{' ' + rank if rank else ''}] {message}"

    def uvicorn(self, level: str, message: str) -> str:
        stamp = common.now().strftime("%Y-%m-%d %H:%M:%S")
        return f"[{stamp}] {(level + ':').ljust(9)} {message}"


def _gpu_memory_defaults(machine: SimMachine, tp: int, pp: int, chunk: int | None, graph_bs: int | None) -> tuple[int, int]:
    gpu_mem = machine.memory_mib
    npu = machine.is_ascend
    if gpu_mem < 20 * 1024:
        c, g = 2048, 8
    elif npu and gpu_mem < 32 * 1024:
        c, g = 32768, 16 if tp < 4 else 64
    elif gpu_mem < 35 * 1024:
        c, g = 2048, 24 if tp < 4 else 80
    elif gpu_mem < 60 * 1024:
        c, g = 4096, 32 if tp < 4 else 160
    elif npu and gpu_mem < 64 * 1024:
        c, g = 32768, 64 if tp < 4 else 128
    elif gpu_mem < 160 * 1024:
        c, g = 8192, 256 if tp < 4 else 512
    else:
        c, g = 16384, 512
    return (chunk if chunk is not None else c), (graph_bs if graph_bs is not None else g)


def _mem_fraction(machine: SimMachine, tp: int, pp: int, chunk: int, max_prefill: int, graph_bs: int, spec: str | None) -> float:
    gpu_mem = machine.memory_mib
    reserved = 512.0
    reserved += max(chunk if chunk > 0 else max_prefill, 2048) * 1.5
    reserved += graph_bs * 2
    reserved += tp * pp / 8 * 1024
    if gpu_mem > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    if spec == "STANDALONE":
        reserved += 6 * 1024
    elif spec is not None and spec != "NGRAM":
        reserved += 2 * 1024
    return round((gpu_mem - reserved) / gpu_mem, 3)


def parse(argv: Sequence[str], env: Mapping[str, str] | None = None) -> SimEngineConfig:
    """``python -m sglang.launch_server ARGV`` on the simulated machine."""
    env = dict(env or {})
    machine = common.sim_machine(env)
    version = common.engine_version("sglang", machine, env, DEFAULT_VERSION)
    parser = build_parser(version)
    note = version_note(version)
    try:
        ns = vars(parser.parse_args(_merge_config(list(argv), parser)))
    except EngineExit as exc:
        if note and exc.code != 0:
            exc.stderr = note + "\n" + exc.stderr
        raise
    # ServerArgs.from_cli_args: the long spellings' dests are renamed
    for long, short in (("tensor_parallel_size", "tp_size"), ("pipeline_parallel_size", "pp_size"),
                        ("data_parallel_size", "dp_size"), ("expert_parallel_size", "ep_size")):
        ns[short] = ns.pop(long)
    return _configure(ns, machine, version)


def version_note(version: str) -> str | None:
    """The log line saying that ``version`` runs with 0.5.5's options, if it is not 0.5.5."""
    if common.version_tuple(version)[:3] == common.version_tuple(KNOWN_OPTIONS):
        return None
    trie = f" (its n-gram flags as {NGRAM_TRIE_SINCE} renamed them)" if ngram_trie(version) else ""
    return SglangLog().line(
        f"perflab simulator: SGLang {version} is simulated with the server options of SGLang {KNOWN_OPTIONS}{trie}, "
        "the only release the simulator knows"
    )


def _configure(a: dict[str, Any], machine: SimMachine, version: str) -> SimEngineConfig:
    log = SglangLog()
    model = a["model_path"]
    tp, pp, dp = int(a["tp_size"]), int(a["pp_size"]), int(a["dp_size"])
    ep = int(a["ep_size"])
    startup = [log.line(f"server_args=ServerArgs({_server_args_repr(a)})")]
    note = version_note(version)
    if note:
        startup.insert(0, note)
    try:
        spec = common.lookup_model(model)
    except common.unknown_model_error() as exc:
        # ModelConfig -> transformers' AutoConfig on a repository that does not exist
        tb = common.traceback_text(
            [("/usr/local/lib/python3.12/dist-packages/transformers/utils/hub.py", 469, "cached_files", "raise OSError(")],
            getattr(exc, "hf_message", str(exc)),
        )
        raise EngineExit(1, stdout="\n".join(startup) + "\n", stderr=tb + "\n") from None

    spec_algo = a.get("speculative_algorithm")
    chunk, graph_bs = _gpu_memory_defaults(machine, tp, pp, a.get("chunked_prefill_size"), a.get("cuda_graph_max_bs"))
    max_prefill = int(a["max_prefill_tokens"])
    mem_fraction = a.get("mem_fraction_static")
    if mem_fraction is None:
        mem_fraction = _mem_fraction(machine, tp, pp, chunk, max_prefill, graph_bs, spec_algo)
    chunked = chunk > 0
    budget = min(chunk, max_prefill) if chunked else max_prefill
    context = int(a.get("context_length") or spec.context_len)
    quant = _quant(a.get("quantization"), spec.quant)
    kv_dtype = a.get("kv_cache_dtype") or "auto"
    prefix = not a.get("disable_radix_cache", False)

    kv_tokens = _kv_tokens(spec, machine, tp, pp, ep, quant, kv_dtype, mem_fraction, context, budget)
    max_running = a.get("max_running_requests")
    if max_running is None and spec_algo is not None:
        # _handle_speculative_decoding: "Max running requests is reset to 48 for speculative decoding."
        max_running = 48
    if max_running is None:
        pool = min(max(int(kv_tokens / context * 512), 2048), 4096) if kv_tokens else 2048
        max_running = max(1, min(kv_tokens // 2, pool)) if kv_tokens else pool
    startup += [
        log.line(f"Load weight begin. avail mem={machine.memory_mib / 1024 - 0.6:.2f} GB", "TP0"),
        log.line(
            f"max_total_num_tokens={kv_tokens}, chunked_prefill_size={chunk if chunked else -1}, "
            f"max_prefill_tokens={max_prefill}, max_running_requests={max_running}, context_len={context}, "
            f"available_gpu_mem={machine.memory_mib / 1024 * (1 - mem_fraction):.2f} GB",
            "TP0",
        ),
    ]

    fail: list[str] = []
    fail_after = 1.0
    # multi-node (server_args.py: nnodes, node_rank, dist_init_addr, dist_timeout): --tp-size is
    # the group's; each node runs tp*pp/nnodes scheduler ranks and they meet at dist_init_addr
    # (without it, engine.py initialises at tcp://127.0.0.1:<nccl_port>)
    nnodes, node_rank = int(a["nnodes"]), int(a["node_rank"])
    dist = a.get("dist_init_addr") or f"127.0.0.1:{a.get('nccl_port') or int(a['port']) + 1}"
    dist_host, _, dist_port = dist.rpartition(":")
    need = tp * pp * dp if not a.get("enable_dp_attention") else tp * pp
    need = -(-need // nnodes)
    visible = machine.visible
    if need > len(visible):
        # torch.cuda.set_device on a rank without a GPU (scheduler subprocess)
        lines = _scheduler_crash(
            log,
            len(visible),
            "torch.AcceleratorError: CUDA error: invalid device ordinal\n"
            "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.\n"
            "For debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
            "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.",
            [("/sgl-workspace/sglang/python/sglang/srt/model_executor/model_runner.py", 617, "init_torch_distributed", "torch.get_device_module(self.device).set_device(self.gpu_id)")],
        )
        raise EngineExit(137, stdout="\n".join(startup[:1]) + "\n", stderr="\n".join(lines) + "\n", signal=9, delay_s=1.0)
    if machine.is_cuda and quant == "fp8" and (machine.sm or 0) < 89:
        fail = _scheduler_crash(
            log,
            0,
            "ValueError: type fp8e4nv not supported in this architecture. The supported fp8 dtypes are ('fp8e4b15', 'fp8e5')",
            [
                ("/sgl-workspace/sglang/python/sglang/srt/layers/quantization/fp8_kernel.py", 889, "w8a8_block_fp8_matmul_triton", "_w8a8_block_fp8_matmul[grid]("),
                ("/usr/local/lib/python3.12/dist-packages/triton/runtime/jit.py", 390, "<lambda>", "return lambda *args, **kwargs: self.run(grid=grid, warmup=False, *args, **kwargs)"),
            ],
        )
        fail_after = 3.0  # during CUDA-graph capture, after the weights are loaded

    host, port = a["host"], int(a["port"])
    spec_method = SPEC_METHODS.get(spec_algo) if spec_algo else None
    spec_tokens = 0
    if spec_method == "ngram":
        # NGRAM drafts speculative_num_draft_tokens per step (default: the max match window, 12)
        drafts = a.get("speculative_num_draft_tokens")
        window = a.get("speculative_ngram_max_match_window_size", NGRAM_DRAFTS)  # absent from 0.5.10 on
        spec_tokens = int(drafts if drafts is not None else window)
    elif spec_method:
        # EAGLE/NEXTN chains: num_steps drafts (auto-chosen 3 when unset, topk 1)
        steps = a.get("speculative_num_steps")
        drafts = a.get("speculative_num_draft_tokens")
        spec_tokens = int(steps if steps is not None else (drafts - 1 if drafts else 3))
    ranks = -(-tp * pp * dp // nnodes)  # this node's scheduler processes
    first_rank = node_rank * ranks
    ready = [
        log.uvicorn("INFO", f"Started server process [{log.pid}]"),
        log.uvicorn("INFO", "Waiting for application startup."),
        log.uvicorn("INFO", "Application startup complete."),
        log.uvicorn("INFO", f"Uvicorn running on http://{host}:{port} (Press CTRL+C to quit)"),
        log.line("The server is fired up and ready to roll!"),
    ]
    factors = common.efficiency("sglang", machine, spec.is_moe)
    fields: dict[str, Any] = dict(
        engine="sglang", engine_version=version, model=model, served_model_names=(a.get("served_model_name") or model,),
        host=host, port=port,
        tp=tp, pp=pp, dp=dp, ep=ep, devices=machine.devices_for(need),
        max_model_len=context, max_num_seqs=int(max_running), max_batched_tokens=int(budget),
        quantization=quant, kv_cache_dtype=str(kv_dtype),
        prefix_caching=prefix, chunked_prefill=chunked,
        spec_method=spec_method, spec_tokens=spec_tokens,
        mem_fraction=float(mem_fraction),
        health_paths=("/health", "/health_generate"),
        ready_lines=tuple(ready),
        startup_lines=tuple(startup),
        workers=ranks,  # one scheduler process per rank (the detokenizer holds no device)
        worker_title="sglang::scheduler_TP{tp_rank}" if dp == 1 else "sglang::scheduler_DP{dp_rank}_TP{tp_rank}",
        fail_lines=tuple(fail),
        fail_exit_code=137,  # kill_process_tree(os.getpid()) sends SIGKILL to itself
        fail_after_s=fail_after,
        nnodes=nnodes, node_rank=node_rank, rendezvous=(dist_host.strip("[]") or "127.0.0.1", int(dist_port)),
        # --dist-timeout (seconds) reaches torch.distributed's init; unset: its 30-minute default
        rendezvous_timeout_s=float(a.get("dist_timeout") or 1800),
        block_size=int(a.get("page_size") or 1),
        behaviour=EngineBehaviour(
            bind_before_load=False,
            fail_signal=9,
            oom_lines=(
                "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. "
                f"Current value: self.server_args.mem_fraction_static={float(mem_fraction)}",
            ),
            # a scheduler that dies while serving (crash-after): SGLang's scheduler exception,
            # then the launcher's kill_process_tree
            crash_lines=tuple(_scheduler_crash(
                log, first_rank,
                "RuntimeError: CUDA error: an illegal memory access was encountered (simulated crash-after)",
                [("/sgl-workspace/sglang/python/sglang/srt/managers/scheduler.py", 1012, "event_loop_overlap",
                  "batch_result = self.run_batch(batch)")])),
            bind_error_lines=(
                log.uvicorn("ERROR", f"[Errno 98] error while attempting to bind on address ('{host}', {port}): address already in use"),
            ),
            settings={"reasoning_parser": a.get("reasoning_parser"), "mixed_chunk": bool(a.get("enable_mixed_chunk", False))},
            # http_server.py (v0.5.5.post1): @app.api_route("/flush_cache", methods=["GET", "POST"])
            cache_reset_path="/flush_cache", cache_reset_methods=("GET", "POST"), cache_reset_style="sglang",
        ),
    )
    return SimEngineConfig(**common.apply_factors(fields, factors))


def _scheduler_crash(log: SglangLog, rank: int, exc: str, frames: list[tuple[str, int, str, str]]) -> list[str]:
    tb = common.traceback_text(
        [("/sgl-workspace/sglang/python/sglang/srt/managers/scheduler.py", 2800, "run_scheduler_process", "scheduler = Scheduler(")] + frames,
        exc,
    )
    return [
        log.line(f"Scheduler hit an exception: {tb}", f"TP{rank}"),
        log.line("Received sigquit from a child process. It usually means the child failed."),
    ]


def _quant(flag: str | None, from_name: str | None) -> str | None:
    if flag is None:
        return from_name
    if flag in ("fp8", "w8a8_fp8", "modelopt_fp8", "modelopt"):
        return "fp8"
    if flag in ("awq", "awq_marlin"):
        return "awq"
    if flag == "w8a8_int8":
        return "w8a8"
    if flag in ("gptq", "gptq_marlin"):
        return from_name if from_name and from_name.startswith("gptq") else "gptq"
    return flag


def _kv_tokens(spec: Any, machine: SimMachine, tp: int, pp: int, ep: int, quant: str | None, kv: str, frac: float, context: int, budget: int) -> int:
    """KV-cache tokens per rank the way the runtime's memory model counts them."""
    try:
        from perflab_sim import perfmodel
    except ImportError:
        return 0
    knobs = perfmodel.Knobs(
        tp=tp, pp=pp, ep=ep, quant=quant, kv_cache_dtype=kv, mem_fraction=float(frac), max_model_len=context, max_batched_tokens=budget, block_size=1
    )
    return int(perfmodel.memory_plan(spec, machine.spec.chip, knobs).kv_capacity_tokens)


def _server_args_repr(a: Mapping[str, Any]) -> str:
    keys = ("model_path", "tokenizer_path", "host", "port", "tp_size", "pp_size", "dp_size", "ep_size", "context_length",
            "mem_fraction_static", "max_running_requests", "chunked_prefill_size", "max_prefill_tokens", "quantization",
            "kv_cache_dtype", "disable_radix_cache", "speculative_algorithm", "reasoning_parser", "served_model_name")
    return ", ".join(f"{k}={a.get(k)!r}" for k in keys)


def main(argv: Sequence[str] | None = None) -> int:
    return common.run_main(parse, argv)
