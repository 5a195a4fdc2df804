"""The simulated ``trtllm-serve`` (TensorRT-LLM 1.2.0rc1, PyTorch backend).

Sources:

- tensorrt_llm/commands/serve.py (NVIDIA/TensorRT-LLM, the 1.1/1.2.0rc revision 4c05a748 of
  the stored history): a click group ``main = DefaultGroup(commands={serve, mm_embedding_serve,
  disaggregated, disaggregated_mpi_worker})`` whose ``resolve_command`` runs ``serve`` when
  the first word is not a sub-command, so ``trtllm-serve MODEL ...`` is ``serve``; the group
  has no ``--version`` option (click rejects it). The ``serve`` options are reproduced in
  :func:`serve_command`; ``--extra_llm_api_options`` is a YAML file loaded with
  ``yaml.safe_load`` and merged into the LLM-API arguments
  (``update_llm_args_with_extra_dict``). Defaults: ``BuildConfig`` max_batch_size 2048,
  max_num_tokens 8192, max_beam_width 1; ``KvCacheConfig(free_gpu_memory_fraction=0.9)`` of
  the memory left after the weights; ``enable_block_reuse`` (prefix caching) on; chunked
  prefill off unless ``--enable_chunked_prefill``; overlap scheduler on.
- tensorrt_llm/__init__.py prints ``[TensorRT-LLM] TensorRT LLM version: X`` on import,
  i.e. before click parses anything.
- tensorrt_llm/logger.py: ``[MM/DD/YYYY-HH:MM:SS] [TRT-LLM] [I] message``; ``--log_level``
  choices internal_error, error, warning, info, verbose.
- tensorrt_llm/serve/openai_server.py: uvicorn (``INFO:     Started server process``,
  ``Application startup complete.``, ``Uvicorn running on http://H:P``); ``/health``.
- tensorrt_llm/llmapi/llm_args.py ``SchedulerConfig.capacity_scheduler_policy`` (default
  ``GUARANTEED_NO_EVICT``; ``MAX_UTILIZATION``, ``STATIC_BATCH``), settable under
  ``scheduler_config`` in ``--extra_llm_api_options``: the simulator's KV admission.
- cpp/tensorrt_llm/thop/fp8BlockScalingGemm.cpp: ``fp8_block_scaling_gemm`` dispatches on
  SM 89/90/100/103 and otherwise ``TORCH_CHECK(false, "Unsupported SM version for FP8 block
  scaling GEMM")`` -> seed 002's ``RuntimeError`` for Qwen3-32B-FP8 on A100.
- Seed 002: ``trtllm-serve Qwen/Qwen3-32B-AWQ`` ends in ``KeyError: 'weight'`` (the PyTorch
  backend's linear-weight loader reads ``weights['weight']``; AutoAWQ checkpoints store
  ``qweight``/``qzeros``/``scales``).
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Mapping, Sequence
from typing import Any

import click
import yaml

from perflab_sim.config import EngineBehaviour, SimEngineConfig
from perflab_sim.frontends import common
from perflab_sim.frontends.common import EngineExit, SimMachine

DEFAULT_VERSION = "1.2.0rc1"  # seed 002
SEVERITIES = ("internal_error", "error", "warning", "info", "verbose")  # logger.py severity_map
REASONING_PARSERS = ("deepseek-r1", "qwen3")  # llmapi/reasoning_parser.py ReasoningParserFactory.parsers
MAX_BATCH_SIZE = 2048  # BuildConfig.max_batch_size
# Peak activation bytes per max_num_tokens token and hidden unit, reserved before the KV cache
# (the PyTorch backend sizes its KV cache after a max_num_tokens forward pass). Fitted to seed
# 002's measured trtllm-serve Qwen3-32B on A100 (ShareGPT, tests/fixtures/seeds): max_num_tokens
# 16384 and 32768 ran 7.6 % and 20.8 % below 8192 (2054 -> 1898 -> 1628 tok/s, fewer
# sequences fit: peak output 1741 -> 1560 -> 1266 tok/s). vLLM's 24 (perfmodel) gave -1.7 % and
# -6.3 %; 56 gives -5.4 % and -22.0 %, and the TPOTs follow (73 / 62 ms against the seed's 80 / 66:
# python -m perflab_sim.calibrate --suite engines --case max_num_tokens).
ACTIVATION_BYTES = 56.0
MAX_NUM_TOKENS = 8192  # BuildConfig.max_num_tokens
# FP8 block-scaling GEMM kernels exist for these SMs only (fp8BlockScalingGemm.cpp).
FP8_BLOCK_SMS = (89, 90, 100, 103)
# SchedulerConfig.capacity_scheduler_policy (llmapi/llm_args.py; default GUARANTEED_NO_EVICT)
# -> the simulator's KV admission. GUARANTEED_NO_EVICT reserves each request's whole length
# at admission; MAX_UTILIZATION allocates as it goes and pauses (evicts) requests when out;
# STATIC_BATCH is modelled as GUARANTEED_NO_EVICT (the simulator does not batch statically).
CAPACITY_POLICIES = {
    "MAX_UTILIZATION": "max_utilization",
    "GUARANTEED_NO_EVICT": "guaranteed_no_evict",
    "STATIC_BATCH": "guaranteed_no_evict",
}
# speculative_config.decoding_type -> the runtime's method names
DECODING_TYPES = {"MTP": "mtp", "Eagle": "eagle", "Eagle3": "eagle3", "NGram": "ngram", "DraftTarget": "draft_model"}


class ChoiceWithAlias(click.Choice):
    """serve.py's ``ChoiceWithAlias``: ``trt`` is accepted for ``tensorrt``."""

    def __init__(self, choices: Sequence[str], aliases: Mapping[str, str]) -> None:
        super().__init__(choices, case_sensitive=True)
        self.aliases = dict(aliases)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if value in self.aliases:
            value = self.aliases[value]
        return super().convert(value, param, ctx)


def serve_command() -> click.Command:
    """``serve`` with the options of tensorrt_llm/commands/serve.py (1.2.0rc1)."""

    @click.command("serve")
    @click.argument("model", type=str)
    @click.option("--tokenizer", type=str, default=None)
    @click.option("--host", type=str, default="localhost")
    @click.option("--port", type=int, default=8000)
    @click.option("--backend", type=ChoiceWithAlias(["pytorch", "tensorrt", "_autodeploy"], {"trt": "tensorrt"}), default="pytorch")
    @click.option("--log_level", type=click.Choice(SEVERITIES), default="info")
    @click.option("--max_beam_width", type=int, default=1)
    @click.option("--max_batch_size", type=int, default=MAX_BATCH_SIZE)
    @click.option("--max_num_tokens", type=int, default=MAX_NUM_TOKENS)
    @click.option("--max_seq_len", type=int, default=None)
    @click.option("--tp_size", type=int, default=1)
    @click.option("--pp_size", type=int, default=1)
    @click.option("--ep_size", type=int, default=None)
    @click.option("--cluster_size", type=int, default=None)
    @click.option("--gpus_per_node", type=int, default=None)
    @click.option("--kv_cache_free_gpu_memory_fraction", type=float, default=0.9)
    @click.option("--num_postprocess_workers", type=int, default=0)
    @click.option("--trust_remote_code", is_flag=True, default=False)
    @click.option("--extra_llm_api_options", type=str, default=None)
    @click.option("--reasoning_parser", type=click.Choice(REASONING_PARSERS), default=None)
    @click.option("--metadata_server_config_file", type=str, default=None)
    @click.option("--server_role", type=str, default=None)
    @click.option("--fail_fast_on_attention_window_too_large", is_flag=True, default=False)
    @click.option("--disagg_cluster_uri", type=str, default=None)
    @click.option("--enable_chunked_prefill", is_flag=True, default=False)
    @click.option("--media_io_kwargs", type=str, default=None)
    def serve(**kwargs: Any) -> dict[str, Any]:
        """Running an OpenAI API compatible server

        MODEL: model name | HF checkpoint path | TensorRT engine path
        """
        return kwargs

    return serve


def _unsimulated(name: str) -> click.Command:
    @click.command(name, context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
    def cmd() -> dict[str, Any]:
        return {"_unsimulated": name}

    return cmd


class DefaultGroup(click.Group):
    """serve.py's ``DefaultGroup``: a first word that is not a sub-command means ``serve``."""

    def resolve_command(self, ctx: click.Context, args: list[str]) -> Any:
        if args and args[0] not in self.commands:
            return "serve", self.commands["serve"], args
        return super().resolve_command(ctx, args)


def build_cli() -> click.Group:
    return DefaultGroup(
        name="trtllm-serve",
        commands={
            "serve": serve_command(),
            "mm_embedding_serve": _unsimulated("mm_embedding_serve"),
            "disaggregated": _unsimulated("disaggregated"),
            "disaggregated_mpi_worker": _unsimulated("disaggregated_mpi_worker"),
        },
    )


class TrtLog:
    def __init__(self) -> None:
        self.pid = common.pid()

    def line(self, level: str, message: str) -> str:
        stamp = common.now().strftime("%m/%d/%Y-%H:%M:%S")
        return f"[{stamp}] [TRT-LLM] [{level}] {message}"

    @staticmethod
    def uvicorn(level: str, message: str) -> str:
        return f"{(level + ':').ljust(9)} {message}"


def banner(version: str) -> str:
    text = f"[TensorRT-LLM] TensorRT LLM version: {version}"
    if version != DEFAULT_VERSION:
        # the options reproduced are 1.2.0rc1's: say so wherever the banner goes
        text += (f"\n[perflab simulator] TensorRT-LLM {version} is simulated with the options of TensorRT-LLM "
                 f"{DEFAULT_VERSION}, the only release the simulator knows")
    return text


def _click_parse(argv: list[str], version: str) -> dict[str, Any]:
    """Run the click group on ``argv``; click's own output (help, usage errors) is kept."""
    cli = build_cli()
    out, err = io.StringIO(), io.StringIO()
    out.write(banner(version) + "\n")
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), cli.make_context("trtllm-serve", list(argv)) as ctx:
            result = cli.invoke(ctx)
    except click.exceptions.Exit as exc:  # --help
        raise EngineExit(exc.exit_code, stdout=out.getvalue(), stderr=err.getvalue()) from None
    except click.ClickException as exc:
        exc.show(file=err)
        raise EngineExit(exc.exit_code, stdout=out.getvalue(), stderr=err.getvalue()) from None
    if result.get("_unsimulated"):
        raise EngineExit(2, stdout=out.getvalue(), stderr=f"perflab simulator: `trtllm-serve {result['_unsimulated']}` is not simulated\n")
    return result


def parse(argv: Sequence[str], env: Mapping[str, str] | None = None) -> SimEngineConfig:
    """``trtllm-serve ARGV`` on the simulated machine."""
    env = dict(env or {})
    machine = common.sim_machine(env)
    version = common.engine_version("trtllm", machine, env, DEFAULT_VERSION)
    opts = _click_parse(list(argv), version)
    llm_api = _load_extra_options(opts.get("extra_llm_api_options"), version)
    return _configure(opts, llm_api, machine, version)


def _load_extra_options(path: str | None, version: str) -> dict[str, Any]:
    if path is None:
        return {}
    frame = ("/usr/local/lib/python3.12/dist-packages/tensorrt_llm/commands/serve.py", 361, "serve", "with open(extra_llm_api_options, 'r') as f:")
    try:
        with open(path) as f:
            data = yaml.safe_load(f)
    except OSError as exc:
        raise EngineExit(
            1, stdout=banner(version) + "\n", stderr=common.traceback_text([frame], f"{type(exc).__name__}: [Errno {exc.errno}] {exc.strerror}: '{path}'") + "\n"
        ) from None
    except yaml.YAMLError as exc:
        raise EngineExit(1, stdout=banner(version) + "\n", stderr=common.traceback_text([frame], f"yaml.{type(exc).__name__}: {exc}") + "\n") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise EngineExit(
            1,
            stdout=banner(version) + "\n",
            stderr=common.traceback_text(
                [("/usr/local/lib/python3.12/dist-packages/tensorrt_llm/llmapi/llm_utils.py", 900, "update_llm_args_with_extra_dict", "for field_name, field_value in llm_args_dict.items():")],
                f"AttributeError: '{type(data).__name__}' object has no attribute 'items'",
            )
            + "\n",
        )
    return data


def _validation_error(model: str, loc: str, message: str, value: Any, kind: str) -> str:
    """pydantic's ValidationError text for one bad LLM-API field."""
    return (
        f"pydantic_core._pydantic_core.ValidationError: 1 validation error for {model}\n"
        f"{loc}\n  {message} [type={kind}, input_value={value!r}, input_type={type(value).__name__}]"
    )


def _executor_failed(log: TrtLog, rank: int, error: str, frames: list[tuple[str, int, str, str]], exc_type: str) -> list[str]:
    """The executor failing to start on ``rank``: TensorRT-LLM's error line, then the
    traceback of ``frames`` ending in ``exc_type: error``."""
    return [
        log.line("E", f"Failed to initialize executor on rank {rank}: {error}"),
        common.traceback_text(frames, f"{exc_type}: {error}"),
    ]


def _configure(o: dict[str, Any], api: dict[str, Any], machine: SimMachine, version: str) -> SimEngineConfig:
    log = TrtLog()
    head = [banner(version)]
    model = str(o["model"])
    # LLM-API arguments from the YAML override the command line (update_llm_args_with_extra_dict)
    tp = int(api.get("tensor_parallel_size", o["tp_size"]))
    pp = int(api.get("pipeline_parallel_size", o["pp_size"]))
    ep = api.get("moe_expert_parallel_size", o["ep_size"])
    max_batch = int(api.get("max_batch_size", o["max_batch_size"]))
    max_tokens = int(api.get("max_num_tokens", o["max_num_tokens"]))
    max_seq = api.get("max_seq_len", o["max_seq_len"])
    chunked = bool(api.get("enable_chunked_prefill", o["enable_chunked_prefill"]))
    attention_dp = bool(api.get("enable_attention_dp", False))
    kv_cfg = api.get("kv_cache_config", {})
    if not isinstance(kv_cfg, dict):
        raise EngineExit(1, stdout="\n".join(head) + "\n", stderr=_validation_error("TorchLlmArgs", "kv_cache_config", "Input should be a valid dictionary or instance of KvCacheConfig", kv_cfg, "model_type") + "\n")
    free_frac = float(kv_cfg.get("free_gpu_memory_fraction", o["kv_cache_free_gpu_memory_fraction"]))
    block_reuse = bool(kv_cfg.get("enable_block_reuse", True))
    kv_dtype = str(kv_cfg.get("dtype", "auto"))
    spec_cfg = api.get("speculative_config")
    spec_method, spec_tokens = None, 0
    if spec_cfg is not None:
        if not isinstance(spec_cfg, dict) or "decoding_type" not in spec_cfg:
            raise EngineExit(1, stdout="\n".join(head) + "\n", stderr=_validation_error("TorchLlmArgs", "speculative_config", "Value error, speculative_config needs a decoding_type", spec_cfg, "value_error") + "\n")
        dt = str(spec_cfg["decoding_type"])
        if dt not in DECODING_TYPES:
            raise EngineExit(1, stdout="\n".join(head) + "\n", stderr=_validation_error("TorchLlmArgs", "speculative_config.decoding_type", f"Value error, Unsupported decoding type: {dt}", dt, "value_error") + "\n")
        spec_method = DECODING_TYPES[dt]
        spec_tokens = int(spec_cfg.get("max_draft_len") or spec_cfg.get("num_nextn_predict_layers") or 1)
    overlap = not bool(api.get("disable_overlap_scheduler", False))
    sched_cfg = api.get("scheduler_config", {})
    if not isinstance(sched_cfg, dict):
        raise EngineExit(1, stdout="\n".join(head) + "\n", stderr=_validation_error("TorchLlmArgs", "scheduler_config", "Input should be a valid dictionary or instance of SchedulerConfig", sched_cfg, "model_type") + "\n")
    policy_name = str(sched_cfg.get("capacity_scheduler_policy", "GUARANTEED_NO_EVICT"))
    if policy_name not in CAPACITY_POLICIES:
        raise EngineExit(
            1,
            stdout="\n".join(head) + "\n",
            stderr=_validation_error(
                "SchedulerConfig", "capacity_scheduler_policy",
                "Input should be " + ", ".join(repr(p) for p in list(CAPACITY_POLICIES)[:-1]) + f" or {list(CAPACITY_POLICIES)[-1]!r}",
                policy_name, "enum",
            ) + "\n",
        )

    try:
        spec = common.lookup_model(model)
    except common.unknown_model_error():
        # huggingface_hub.snapshot_download of a repository that does not exist
        tb = common.traceback_text(
            [("/usr/local/lib/python3.12/dist-packages/huggingface_hub/utils/_http.py", 426, "hf_raise_for_status", "raise _format(RepositoryNotFoundError, message, response) from e")],
            f"huggingface_hub.errors.RepositoryNotFoundError: 401 Client Error. (Request ID: Root=1-sim)\n\n"
            f"Repository Not Found for url: https://huggingface.co/api/models/{model}/revision/main.\n"
            "Please make sure you specified the correct `repo_id` and `repo_type`.\n"
            "If you are trying to access a private or gated repo, make sure you are authenticated.",
        )
        raise EngineExit(1, stdout="\n".join(head) + "\n", stderr=tb + "\n") from None

    quant = spec.quant
    if o["backend"] == "tensorrt" and isinstance(api.get("quant_config"), dict):
        algo = str(api["quant_config"].get("quant_algo", "")).upper()
        quant = {"FP8": "fp8", "FP8_BLOCK_SCALES": "fp8", "W4A16_AWQ": "awq", "W8A8_SQ_PER_CHANNEL": "w8a8"}.get(algo, quant)
    context = int(max_seq or spec.context_len)
    if ep is None:
        ep = tp if spec.is_moe and attention_dp else 1
    dp = tp if attention_dp else 1

    # free_gpu_memory_fraction is of the memory free after weights and buffers; the runtime's
    # mem_fraction is of the whole device.
    total_gib = machine.memory_mib / 1024
    from perflab_sim import perfmodel

    weights_gib = perfmodel.weight_bytes(spec, quant) / max(tp * pp, 1) / 2**30
    reserve_gib = perfmodel.reserve_gib(spec, max_tokens, ACTIVATION_BYTES, max(tp * pp, 1))
    mem_fraction = min(1.0, (weights_gib + reserve_gib + free_frac * max(0.0, total_gib - weights_gib - reserve_gib)) / total_gib)

    startup = head + [
        log.line("I", "Using LLM with PyTorch backend"),
        log.line("I", "Set nccl_plugin to None."),
        log.line(
            "I",
            "neither checkpoint_format nor checkpoint_loader were provided, checkpoint_format will be set to HF.",
        ),
        log.line(
            "I",
            f"max_seq_len={context}, max_num_requests={max_batch}, max_num_tokens={max_tokens}, max_batch_size={max_batch}",
        ),
    ]

    fail: list[str] = []
    fail_after = 2.0
    need = tp * pp
    visible = machine.visible
    if need > len(visible):
        lines = _executor_failed(
            log, len(visible), "CUDA error: invalid device ordinal",
            [("/usr/local/lib/python3.12/dist-packages/tensorrt_llm/executor/worker.py", 838, "worker_main", "worker: GenerationExecutorWorker = worker_cls(")],
            "torch.AcceleratorError",
        )
        raise EngineExit(1, stdout="\n".join(startup) + "\n", stderr="\n".join(lines) + "\n", delay_s=1.0)
    if spec.quant == "awq":
        fail = _executor_failed(log, 0, "'weight'", [
            ("/usr/local/lib/python3.12/dist-packages/tensorrt_llm/_torch/pyexecutor/model_loader.py", 359, "load", "self._call_load_weights(model.load_weights, weights,"),
            ("/usr/local/lib/python3.12/dist-packages/tensorrt_llm/_torch/models/modeling_utils.py", 917, "_load_weights_impl", "module.load_weights(weights=[module_weights])"),
            ("/usr/local/lib/python3.12/dist-packages/tensorrt_llm/_torch/modules/linear.py", 283, "load_weights_vanilla_helper", "weight = load_weight_shard(weights[0]['weight'], module.tp_size,"),
        ], "KeyError")
    elif quant == "fp8" and spec.quant == "fp8" and (machine.sm or 0) not in FP8_BLOCK_SMS:
        fail = _executor_failed(log, 0, "Unsupported SM version for FP8 block scaling GEMM", [
            ("/usr/local/lib/python3.12/dist-packages/tensorrt_llm/_torch/pyexecutor/py_executor_creator.py", 436, "create_py_executor", "kv_cache_creator.estimate_max_tokens(py_executor)"),
            ("/usr/local/lib/python3.12/dist-packages/tensorrt_llm/_torch/modules/linear.py", 646, "apply", "output = torch.ops.trtllm.fp8_block_scaling_gemm("),
            ("/usr/local/lib/python3.12/dist-packages/torch/_ops.py", 1243, "__call__", "return self._op(*args, **kwargs)"),
        ], "RuntimeError")
        fail_after = 4.0  # the first GEMM runs during KV-cache estimation, after loading

    host, port = str(o["host"]), int(o["port"])
    ready = [
        TrtLog.uvicorn("INFO", f"Started server process [{log.pid}]"),
        TrtLog.uvicorn("INFO", "Waiting for application startup."),
        TrtLog.uvicorn("INFO", "Application startup complete."),
        TrtLog.uvicorn("INFO", f"Uvicorn running on http://{host}:{port} (Press CTRL+C to quit)"),
    ]
    factors = common.efficiency("trtllm", machine, spec.is_moe)
    if not overlap:
        factors = common.Factors(factors.efficiency, factors.prefill, factors.decode, factors.overhead_ms * 3)
    unmodelled = sorted(set(api) - _MODELLED_KEYS)
    fields: dict[str, Any] = dict(
        engine="trtllm", engine_version=version, model=model,
        served_model_names=(model,),  # OpenAIServer reports the MODEL argument
        host=host, port=port,
        tp=tp, pp=pp, dp=dp, ep=int(ep), devices=machine.devices_for(need),
        max_model_len=context, max_num_seqs=max_batch, max_batched_tokens=max_tokens,
        quantization=quant, kv_cache_dtype=kv_dtype,
        prefix_caching=block_reuse, chunked_prefill=chunked,
        spec_method=spec_method, spec_tokens=spec_tokens,
        mem_fraction=round(mem_fraction, 4), activation_bytes=ACTIVATION_BYTES,
        health_paths=("/health",),
        ready_lines=tuple(ready),
        startup_lines=tuple(startup),
        workers=need if need > 1 else 0,  # MPI ranks spawned by the executor (mpi4py)
        worker_title="trtllm-serve rank {rank}",  # MPI ranks run the same program
        fail_lines=tuple(fail), fail_exit_code=1, fail_after_s=fail_after,
        block_size=int(kv_cfg.get("tokens_per_block", 32)),
        capacity_policy=CAPACITY_POLICIES[policy_name],
        behaviour=EngineBehaviour(
            bind_before_load=False,
            bind_error_lines=(TrtLog.uvicorn("ERROR", f"[Errno 98] error while attempting to bind on address ('{host}', {port}): address already in use"),),
            settings={"backend": o["backend"], "overlap_scheduler": overlap, "llm_api_unmodelled_keys": unmodelled,
                      "reasoning_parser": o.get("reasoning_parser")},
        ),
    )
    return SimEngineConfig(**common.apply_factors(fields, factors))


# LLM-API keys whose effect the simulator models; others are accepted and recorded.
_MODELLED_KEYS = frozenset(
    {
        "tensor_parallel_size", "pipeline_parallel_size", "moe_expert_parallel_size", "max_batch_size", "max_num_tokens",
        "max_seq_len", "enable_chunked_prefill", "enable_attention_dp", "kv_cache_config", "speculative_config",
        "disable_overlap_scheduler", "quant_config", "scheduler_config",
    }
)  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    return common.run_main(parse, argv)
