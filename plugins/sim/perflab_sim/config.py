"""What a simulated engine front end (the stand-in ``vllm``, ``sglang.launch_server``,
``trtllm-serve``, ``mindieservice_daemon``) hands to the shared simulation runtime after it
has parsed its engine's real flags or config file.

The front ends (``perflab_sim.frontends.*``) own engine knowledge: flag names, defaults,
log lines, health paths and engine-specific failures. The runtime (``perflab_sim.runtime``)
owns the HTTP server, the continuous-batching performance model, worker processes and
fault injection. Neither imports a perflab plugin.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from perflab_sim.perfmodel import ACTIVATION_BYTES


@dataclass(frozen=True)
class EngineBehaviour:
    """Engine-specific runtime behaviour a front end sets, all optional (the defaults are
    vLLM's). Lines marked "format" are templates the runtime fills with the named values."""

    # bind first and answer health 503 until loaded (SGLang, MindIE)
    bind_before_load: bool = False
    # health paths on the extra ports (MindIE's management port); those ports answer nothing else
    health_paths_by_port: Mapping[int, tuple[str, ...]] = field(default_factory=dict)
    # extra ports bound on an address of their own (MindIE's management and metrics ports on
    # ``managementIpAddress``)
    port_hosts: Mapping[int, str] = field(default_factory=dict)
    # format (client, method, path, status, reason): one line per request
    access_log: str | None = None
    # format (prompt_tps, gen_tps, running, waiting, kv_pct, prefix_hit_pct): printed every
    # ``stats_interval_s`` real seconds while busy
    stats_line: str | None = None
    stats_interval_s: float = 10.0
    # stderr lines for the crash faults; empty: a vLLM-like traceback
    crash_lines: tuple[str, ...] = ()
    crash_at_start_lines: tuple[str, ...] = ()
    # format (need_gib, total_gib, budget_gib): the weights do not fit
    oom_lines: tuple[str, ...] = ()
    # format (free_gib, total_gib, fraction, requested_gib, device): another engine holds memory
    insufficient_memory_lines: tuple[str, ...] = ()
    # format (host, port, errno, reason): a port in use; empty: uvicorn's line
    bind_error_lines: tuple[str, ...] = ()
    # that failure ends by this signal instead of an exit status
    bind_error_signal: int | None = None
    # every other failure (front-end ``fail_lines``, memory, crash faults) ends by this signal,
    # the workers killed first (MindIE's killpg(SIGKILL) / abort(), SGLang's kill_process_tree)
    fail_signal: int | None = None
    # mean length at which a request without ``ignore_eos`` stops by itself (exponential,
    # seeded by the prompt)
    eos_mean_tokens: float = 16384.0
    owned_by: str | None = None  # ``/v1/models`` owner; None: the engine name
    process_name: str | None = None  # the server's name in ``npu-smi``'s process table; None: argv[0]
    api_keys: tuple[str, ...] = ()  # bearer tokens the guarded paths need (vLLM's --api-key)
    # the prefix-cache reset the engine serves (None: none): its path, methods, and how it
    # answers — "vllm" (200 {"success": bool}, false while a running request holds blocks) or
    # "sglang" (200 "Cache flushed." / 400 while requests run or wait); see perflab_sim.routing
    cache_reset_path: str | None = None
    cache_reset_methods: tuple[str, ...] = ("POST",)
    cache_reset_style: str = "vllm"
    # multi-node (perflab_sim.group), format (host, port, timeout_s, joined, expected): rank 0
    # saw too few ranks join; format (host, port, timeout_ms): a rank could not reach rank 0;
    # format (host, port, rank): a joined rank's connection closed (its process died); empty:
    # PyTorch's c10d texts (perflab_sim.group)
    rendezvous_timeout_lines: tuple[str, ...] = ()
    join_timeout_lines: tuple[str, ...] = ()
    peer_lost_lines: tuple[str, ...] = ()
    # the engine's settings the front end parsed but the simulator does not model (recorded
    # for inspection: vLLM's compilation_config, TensorRT-LLM's backend, ...)
    settings: Mapping[str, object] = field(default_factory=dict)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> EngineBehaviour:
        """From JSON (``python -m perflab_sim.runtime``): port keys become ints, lists tuples."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ValueError(f"unknown engine behaviour {', '.join(unknown)} (known: {', '.join(sorted(known))})")
        out: dict[str, Any] = {}
        for key, value in raw.items():
            if key == "health_paths_by_port":
                value = {int(p): tuple(v) for p, v in dict(value).items()}
            elif key == "port_hosts":
                value = {int(p): str(h) for p, h in dict(value).items()}
            elif isinstance(value, list):
                value = tuple(value)
            out[key] = value
        return cls(**out)


@dataclass(frozen=True)
class SimEngineConfig:
    engine: str  # "vllm" | "vllm-ascend" | "sglang" | "trtllm" | "mindie"
    engine_version: str
    model: str  # as given on the command line / in config.json
    served_model_names: tuple[str, ...]  # names accepted in requests
    host: str
    port: int
    extra_ports: tuple[int, ...] = ()  # e.g. MindIE management/metrics ports also bound
    tp: int = 1
    pp: int = 1
    dp: int = 1
    ep: int = 1
    max_model_len: int | None = None  # None: the model's own context length
    max_num_seqs: int = 256
    max_batched_tokens: int = 8192
    quantization: str | None = None  # normalised: "fp8", "awq", "w8a8", "gptq", None
    kv_cache_dtype: str = "auto"
    prefix_caching: bool = False
    chunked_prefill: bool = True
    spec_method: str | None = None  # "mtp", "eagle", "ngram", ...
    spec_tokens: int = 0
    mem_fraction: float = 0.9
    devices: tuple[int, ...] | None = None  # visible device indexes, None: all
    # Engine behaviour ------------------------------------------------------------------
    health_paths: tuple[str, ...] = ("/health",)  # GET -> 200 once ready
    ready_lines: tuple[str, ...] = ()  # printed (stdout) once the server is listening
    startup_lines: tuple[str, ...] = ()  # printed before loading
    efficiency: float = 1.0  # engine/hardware kernel efficiency multiplier (calibrated)
    decode_efficiency: float = 1.0
    prefill_efficiency: float = 1.0
    scheduler_overhead_ms: float = 0.5  # per step
    activation_bytes: float = ACTIVATION_BYTES  # per token of max_batched_tokens and unit of hidden size
    workers: int = 0  # worker child processes to spawn (vLLM: one per TP rank when tp > 1)
    worker_title: str = "worker"
    # A failure the front end decided on (the seeds' crashes): raised after `fail_after_s`
    # of "loading", printed as the log would show it, exit code `fail_exit_code`.
    fail_lines: tuple[str, ...] = ()
    fail_exit_code: int = 1
    fail_after_s: float = 0.3
    # Added for the runtime (perflab_sim.runtime) --------------------------------------
    hardware: str | None = None  # catalog name; None: env PERFLAB_SIM_HARDWARE
    load_time_s: float = 0.3  # real seconds of "loading weights" before binding
    spec_acceptance: float | None = None  # per draft token; None: the method's default
    shutdown_lines: tuple[str, ...] = ()  # printed (stdout) on SIGTERM/SIGINT
    block_size: int = 16  # KV-cache block (tokens), also the prefix-cache granularity
    # KV admission (perflab_sim.scheduler): "max_utilization" allocates blocks as tokens are
    # computed and preempts the newest request when they run out (vLLM, SGLang, MindIE);
    # "guaranteed_no_evict" admits a request only when its whole length fits (TensorRT-LLM)
    capacity_policy: str = "max_utilization"
    # Multi-node (perflab_sim.group): this process is node rank ``node_rank`` of ``nnodes``;
    # rank 0 serves HTTP and hosts the rendezvous at ``rendezvous`` (host, port), the others
    # join it and serve nothing; ``rendezvous_timeout_s`` real seconds to wait for it
    nnodes: int = 1
    node_rank: int = 0
    rendezvous: tuple[str, int] | None = None
    rendezvous_timeout_s: float = 1800.0
    # Engine-specific runtime behaviour, all optional
    behaviour: EngineBehaviour = field(default_factory=EngineBehaviour)
