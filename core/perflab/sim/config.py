"""What a simulated engine front end (the stand-in ``vllm``, ``sglang.launch_server``,
``trtllm-serve``, ``mindieservice_daemon``) hands to the shared simulation runtime after it
has parsed its engine's real flags or config file.

The front ends (``perflab.sim.frontends.*``) own engine knowledge: flag names, defaults,
log lines, health paths and engine-specific failures. The runtime (``perflab.sim.runtime``)
owns the HTTP server, the continuous-batching performance model, worker processes and
fault injection. Neither imports a perflab plugin.
"""

from __future__ import annotations

from dataclasses import dataclass, field


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
    workers: int = 0  # worker child processes to spawn (vLLM: one per TP rank when tp > 1)
    worker_title: str = "worker"
    # A failure the front end decided on (the seeds' crashes): raised after `fail_after_s`
    # of "loading", printed as the log would show it, exit code `fail_exit_code`.
    fail_lines: tuple[str, ...] = ()
    fail_exit_code: int = 1
    fail_after_s: float = 0.3
    # Added for the runtime (perflab.sim.runtime) --------------------------------------
    hardware: str | None = None  # catalog name; None: env PERFLAB_SIM_HARDWARE
    load_time_s: float = 0.3  # real seconds of "loading weights" before binding
    spec_acceptance: float | None = None  # per draft token; None: the method's default
    shutdown_lines: tuple[str, ...] = ()  # printed (stdout) on SIGTERM/SIGINT
    block_size: int = 16  # KV-cache block (tokens), also the prefix-cache granularity
    # KV admission (perflab.sim.scheduler): "max_utilization" allocates blocks as tokens are
    # computed and preempts the newest request when they run out (vLLM, SGLang, MindIE);
    # "guaranteed_no_evict" admits a request only when its whole length fits (TensorRT-LLM)
    capacity_policy: str = "max_utilization"
    # Engine-specific runtime behaviour, all optional (see perflab.sim.runtime for the list):
    # bind_before_load, health_paths_by_port, access_log, stats_line, stats_interval_s,
    # crash_lines, crash_at_start_lines, oom_lines, insufficient_memory_lines, eos_mean_tokens,
    # owned_by, process_name, fail_signal, bind_error_lines, bind_error_signal, port_hosts.
    extra: dict[str, object] = field(default_factory=dict)
