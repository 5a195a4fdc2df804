"""The typed values that cross the plugin boundary.

Every value a hook receives or returns is one of these frozen dataclasses (or a plain
str/int/None). They are immutable so that a plugin cannot change what the core or another
plugin sees, and they serialise to JSON with :func:`to_jsonable` for run directories,
``--json`` output and the results store.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any, Literal

AcceleratorKind = Literal["cuda", "ascend", "cpu"]


def _frozen_map(value: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return MappingProxyType(dict(value or {}))


@dataclass(frozen=True)
class EngineInfo:
    """What a plugin says about one engine it provides.

    ``name`` is the key users type (``perflab launch vllm``); ``accelerators`` the kinds of
    device it runs on; ``executable`` the program perflab launches (used only to say whether
    the engine is installed); ``distributions`` the Python distributions whose installed
    version is the engine's version (read from metadata, never imported).
    """

    name: str
    display_name: str
    accelerators: tuple[str, ...]
    description: str = ""
    executable: str | None = None
    distributions: tuple[str, ...] = ()
    homepage: str = ""
    default_port: int = 8000


@dataclass(frozen=True)
class Accelerator:
    """One accelerator as a hardware probe saw it.

    Memory is in MiB. ``compute_capability`` is (major, minor) for CUDA devices;
    ``chip`` is the NPU chip name for Ascend (``910B3``). ``index`` is the index the engine
    uses (CUDA index / NPU logic id / NUMA node for ``kind="cpu"``), which is what
    ``--devices`` refers to.
    """

    vendor: str  # "nvidia" | "huawei" | a third-party vendor
    kind: str  # "cuda" | "ascend" | ...
    index: int
    name: str
    memory_total_mib: int
    memory_used_mib: int = 0
    uuid: str | None = None
    compute_capability: tuple[int, int] | None = None
    chip: str | None = None
    driver_version: str | None = None
    cuda_driver_version: str | None = None
    bus_id: str | None = None
    npu_id: int | None = None
    chip_id: int | None = None
    source: str = ""  # "nvml", "npu-smi", "sim", "procfs"
    # The host CPU as a device (kind "cpu", one entry per NUMA node; perflab.hardware.cpu):
    cores: int | None = None  # logical CPUs of the node this process may use
    cpu_list: str | None = None  # those CPUs in the kernel's cpulist syntax ("0-15,32-47")
    features: tuple[str, ...] = ()  # instruction-set flags engines dispatch on (avx512f, amx_bf16, ...)

    @property
    def sm(self) -> int | None:
        """Compute capability as the integer engines compare against (8.0 -> 80)."""
        if self.compute_capability is None:
            return None
        major, minor = self.compute_capability
        return major * 10 + minor


@dataclass(frozen=True)
class HardwareSnapshot:
    """Everything the probes found, plus whether it is simulated."""

    accelerators: tuple[Accelerator, ...] = ()
    simulated: bool = False
    name: str | None = None  # catalog name in simulation ("a100-80g-x8")
    host: str = ""
    errors: tuple[str, ...] = ()  # probe problems worth showing (not fatal)

    def of_kind(self, kind: str) -> tuple[Accelerator, ...]:
        return tuple(a for a in self.accelerators if a.kind == kind)

    def select(self, devices: tuple[int, ...] | None, kind: str | None = None) -> tuple[Accelerator, ...]:
        pool = self.of_kind(kind) if kind else self.accelerators
        if devices is None:
            return pool
        by_index = {a.index: a for a in pool}
        return tuple(by_index[i] for i in devices if i in by_index)


#: How an option's value is written and checked. kind -> (its type as the docs name it, what a
#: plan must give unless the option says more). Each consumer handles every kind once: the CLI
#: (perflab.cli.options), plan checks (perflab.lab.plan), deltas (perflab.lab.options).
OptionKind = Literal["str", "pos_int", "bool", "fraction", "port", "json", "devices", "args", "env", "options"]
OPTION_KINDS: Mapping[str, tuple[str, str]] = MappingProxyType({
    "str": ("string", "a string"),
    "pos_int": ("positive integer", "a positive integer"),
    "bool": ("boolean", "true or false"),
    "fraction": ("number in (0, 1]", "a number in (0, 1]"),
    "port": ("port number", "a port number (1-65535)"),
    "json": ("mapping", "a mapping"),  # one JSON object, replaced whole in a delta
    "devices": ("list of indexes", "a list of distinct non-negative device indexes"),
    "args": ("list of strings (or one string, split like a shell)", "a list of arguments"),
    "env": ("mapping", "a mapping of environment variables"),  # merged by key in a delta
    "options": ("mapping", "a mapping of plain values"),  # merged by key in a delta
})


@dataclass(frozen=True)
class ServeOption:
    """One serving option, declared once as metadata of its :class:`ServeConfig` field.

    Everything that spells the option derives from this: the CLI options of ``perflab launch``
    and ``perflab engines command`` (perflab.cli.options), the plan keys and their checks
    (perflab.lab.options, perflab.lab.plan), the table in docs/plan-reference.md, and the
    list a new plugin must map or refuse (each plugin's ``serve_options`` table).
    ``name`` is the ServeConfig field (filled in by :func:`serve_options`); ``flag`` the CLI
    flag (default ``--`` + the name with dashes; a ``bool`` also gets ``--no-...``), or None
    with ``cli=False``; ``plan_key`` the key in plan files (default the name), or None with
    ``plan=False``; ``expect`` what a plan must give, in its error message (default: the
    kind's); ``note`` is extra text for the docs table only; ``default`` and ``required``
    come from the field.
    """

    kind: OptionKind
    help: str
    expect: str = ""
    note: str = ""
    flag: str | None = None
    short: str | None = None
    plan_key: str | None = None
    cli: bool = True
    plan: bool = True
    name: str = ""
    default: Any = None  # the field's plain default (the CLI's): "127.0.0.1" for host
    required: bool = False  # the field has no default (model)
    lossless: bool = False  # cannot change greedy outputs beyond batch noise (the accuracy gate)

    def __post_init__(self) -> None:
        if self.kind not in OPTION_KINDS:
            raise ValueError(f"serve option {self.name or self.help!r}: unknown kind {self.kind!r}")
        if not self.expect:
            object.__setattr__(self, "expect", OPTION_KINDS[self.kind][1])
        if not self.name:
            return
        if not self.cli:
            object.__setattr__(self, "flag", None)
        elif self.flag is None:
            object.__setattr__(self, "flag", "--" + self.name.replace("_", "-"))
        object.__setattr__(self, "plan_key", (self.plan_key or self.name) if self.plan else None)

    @property
    def doc_type(self) -> str:
        """The value's type as docs/plan-reference.md names it."""
        return OPTION_KINDS[self.kind][0]


def _opt(kind: OptionKind, help: str, **more: Any) -> dict[str, ServeOption]:
    """Field metadata declaring a serving option (see :class:`ServeOption`)."""
    return {"perflab": ServeOption(kind, help, **more)}


@dataclass(frozen=True)
class ServeConfig:
    """The engine-neutral serving options of one configuration.

    ``None`` always means "the engine's own default": perflab passes nothing for it, so a
    baseline command stays as short as the seeds' (``vllm serve Qwen/Qwen3-32B``).
    A plugin maps each set field to its engine's flag or config key, or reports it as
    :class:`Unsupported`; nothing is silently dropped.

    Each field declares its option once (:class:`ServeOption` metadata): adding a serving
    option is one field here plus each plugin's mapping (docs/adding-a-serving-option.md).
    """

    model: str = field(metadata=_opt(
        "str", "Model id (Hugging Face) or local path.", short="-m", expect="a model id or local path",
        note="In a delta: another checkpoint (`Qwen/Qwen3-32B-FP8`); in `serve`, use the top-level `model` key."))
    served_model_name: str | None = field(default=None, metadata=_opt(
        "str", "Name clients use in requests (default: the model).", expect="a name", lossless=True))
    tp: int | None = field(default=None, metadata=_opt("pos_int", "Tensor-parallel size."))
    pp: int | None = field(default=None, metadata=_opt("pos_int", "Pipeline-parallel size."))
    dp: int | None = field(default=None, metadata=_opt("pos_int", "Data-parallel size."))
    nodes: int | None = field(default=None, metadata=_opt(
        "pos_int", "Nodes (machines) the engine spans; rank 0 serves (default 1).",
        note="Above 1 the engine's plugin must build one launch per node (`build_group_launch`: SGLang, vLLM "
             "data parallel); tp/pp/dp are the whole group's sizes. See the user guide, Multi-node runs."))
    ep: int | None = field(default=None, metadata=_opt(  # vLLM only knows "on" (= tp * dp)
        "pos_int", "Expert-parallel size (vLLM: must equal tp×dp; it maps to --enable-expert-parallel)."))
    max_model_len: int | None = field(default=None, metadata=_opt(
        "pos_int", "Maximum context length (prompt + output)."))
    max_batched_tokens: int | None = field(default=None, metadata=_opt(
        "pos_int", "Token budget of one scheduler step.", lossless=True))
    max_num_seqs: int | None = field(default=None, metadata=_opt(
        "pos_int", "Maximum concurrent sequences (batch size).", lossless=True))
    quantization: str | None = field(default=None, metadata=_opt(
        "str", "Quantization method as the engine names it (fp8, awq, ascend, ...).", short="-q",
        expect="a quantization method name such as fp8 or awq"))
    kv_cache_dtype: str | None = field(default=None, metadata=_opt(
        "str", "KV cache data type (auto, fp8, ...).", expect="a KV cache dtype such as fp8"))
    prefix_caching: bool | None = field(default=None, metadata=_opt(
        "bool", "Turn automatic prefix caching on or off (default: engine's).", lossless=True))
    chunked_prefill: bool | None = field(default=None, metadata=_opt(
        "bool", "Turn chunked prefill on or off (default: engine's).", lossless=True))
    speculative_config: Mapping[str, Any] | None = field(default=None, metadata=_opt(
        "json", 'Speculative decoding as JSON, e.g. \'{"method":"mtp","num_speculative_tokens":4}\'.',
        expect="a mapping such as {method: mtp, num_speculative_tokens: 4}",
        note="In a plan: a mapping such as `{method: mtp, num_speculative_tokens: 4}`.",
        lossless=True))  # the target model verifies every token: greedy outputs are the target's
    mem_fraction: float | None = field(default=None, metadata=_opt(
        "fraction", "Fraction of accelerator memory the engine may use.", lossless=True))
    reasoning_parser: str | None = field(default=None, metadata=_opt(
        "str", "Reasoning parser (e.g. qwen3).", expect="a parser name such as qwen3"))
    host: str = field(default="127.0.0.1", metadata=_opt(
        "str", "Address the engine binds.", plan=False))
    port: int | None = field(default=None, metadata=_opt(  # None: the runner picks a free port
        "port", "Port the engine serves on (default: engine's usual port for a dry run, a free one for launch).",
        plan=False))
    devices: tuple[int, ...] | None = field(default=None, metadata=_opt(
        "devices", "Accelerator indexes to use, e.g. 0,1,2,3 (sets CUDA_VISIBLE_DEVICES / ASCEND_RT_VISIBLE_DEVICES).",
        note="Default: all; replicas split them."))
    extra_args: tuple[str, ...] = field(default=(), metadata=_opt(
        "args", "Argument passed to the engine verbatim (repeatable), e.g. --extra-arg=--performance-mode=throughput.",
        flag="--extra-arg", expect="a list of arguments such as ['--performance-mode=throughput']",
        note="In a plan: `[\"--performance-mode=throughput\"]`."))
    extra_env: Mapping[str, str] = field(default_factory=dict, metadata=_opt(
        "env", "Environment variable for the engine (repeatable).", flag="--env", plan_key="env"))
    options: Mapping[str, Any] = field(default_factory=dict, metadata=_opt(  # engine-specific
        "options", "Engine-specific option understood by the plugin (repeatable).", flag="--engine-option",
        plan_key="engine_options", expect="a mapping of engine-specific options"))

    def __post_init__(self) -> None:
        # the immutable form of every collection-valued option, by its declared kind
        for opt in _SERVE_OPTIONS:
            value = getattr(self, opt.name)
            if opt.kind in ("env", "options") or (opt.kind == "json" and value is not None):
                object.__setattr__(self, opt.name, _frozen_map(value))
            elif opt.kind == "args" or (opt.kind == "devices" and value is not None):
                object.__setattr__(self, opt.name, tuple(value))

    @property
    def name(self) -> str:
        """The model name clients send in requests."""
        return self.served_model_name or self.model

    @property
    def world_size(self) -> int:
        """Devices of the whole launch (every node of a multi-node group)."""
        return (self.tp or 1) * (self.pp or 1) * (self.dp or 1)

    @property
    def node_count(self) -> int:
        return self.nodes or 1

    @property
    def devices_per_node(self) -> int:
        """Devices each node of the launch uses (world_size split evenly over the nodes)."""
        return -(-self.world_size // self.node_count)

    def replace(self, **changes: Any) -> ServeConfig:
        return dataclasses.replace(self, **changes)


def serve_options() -> tuple[ServeOption, ...]:
    """Every serving option of :class:`ServeConfig`, in field order, with ``name``, ``flag``
    and ``plan_key`` filled in. A plugin's ``serve_options`` table maps or refuses each
    ``name``; a scaffold lists them all."""
    return _SERVE_OPTIONS


_SERVE_OPTIONS = tuple(
    dataclasses.replace(
        f.metadata["perflab"],
        name=f.name,
        default=None if f.default is dataclasses.MISSING else f.default,
        required=f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING,
    )
    for f in dataclasses.fields(ServeConfig)
)


@dataclass(frozen=True)
class FileSpec:
    """A file the launch needs written before start (MindIE's config.json)."""

    path: str  # absolute, or relative to the launch's workdir
    content: str
    mode: int = 0o644


@dataclass(frozen=True)
class GroupNode:
    """One node (machine) of a multi-node launch: its rank, the address the other ranks reach
    it at, and the devices the engine uses there (None: the engine's default)."""

    rank: int
    address: str
    hostname: str = ""
    devices: tuple[int, ...] | None = None


@dataclass(frozen=True)
class NodeGroup:
    """The nodes one multi-node launch spans (``build_group_launch``): rank 0 serves
    HTTP; ``rendezvous_port`` is the port on rank 0's address where the other ranks join
    (SGLang's ``--dist-init-addr HOST:PORT``, vLLM's ``--data-parallel-rpc-port``)."""

    nodes: tuple[GroupNode, ...]
    rendezvous_port: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "nodes", tuple(self.nodes))
        if [n.rank for n in self.nodes] != list(range(len(self.nodes))):
            raise ValueError("a node group's ranks must be 0..N-1 in order")

    @property
    def size(self) -> int:
        return len(self.nodes)

    @property
    def serving(self) -> GroupNode:
        """Rank 0: the node that serves HTTP and hosts the rendezvous."""
        return self.nodes[0]


@dataclass(frozen=True)
class LaunchSpec:
    """Exactly what to run: an argv list (never a shell string) and its surroundings."""

    engine: str
    argv: tuple[str, ...]
    host: str
    port: int
    served_model_name: str
    env: Mapping[str, str] = field(default_factory=dict)  # added to the inherited environment
    files: tuple[FileSpec, ...] = ()
    cwd: str | None = None
    extra_ports: tuple[int, ...] = ()  # other ports the engine binds (MindIE management)
    warnings: tuple[str, ...] = ()
    # the argv tokens that only carry the address perflab chose ("--host", "127.0.0.1",
    # "--port", "8000"), in argv order: the serving script leaves them out (the seeds' commands
    # do); () keeps the argv as is (EnginePlugin fills it from its address_flags)
    address_args: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "env", _frozen_map(self.env))
        object.__setattr__(self, "argv", tuple(self.argv))
        object.__setattr__(self, "address_args", tuple(self.address_args))

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def ports(self) -> tuple[int, ...]:
        return (self.port, *self.extra_ports)


@dataclass(frozen=True)
class HttpProbe:
    """One HTTP check: GET ``path`` on ``port`` (None: the serving port) must answer 2xx."""

    path: str
    port: int | None = None


@dataclass(frozen=True)
class CacheReset:
    """How to empty an engine's prefix cache between measurements (the optional
    ``cache_reset`` engine method): ``method`` ``path`` on the serving port must answer 2xx and,
    with ``success_field``, a JSON object whose field is true (vLLM answers 200
    ``{"success": false}`` while blocks are still held). An engine that registers the path only
    under a condition (vLLM: ``VLLM_SERVER_DEV_MODE=1``) says so in ``missing_hint``: a 404 is
    then noted once per study with that hint, not warned about at every profile."""

    path: str
    method: str = "POST"
    success_field: str | None = None
    missing_hint: str = ""
    source: str = ""


#: The request fields beyond OpenAI's API that perflab's bench may send: vLLM's sampling
#: extensions (vllm/entrypoints/openai/protocol.py, also taken by SGLang and TensorRT-LLM).
#: ``ignore_eos`` makes the answer exactly ``max_tokens`` long (vllm bench serve turns it on for
#: the random dataset); ``repetition_penalty`` (1.0) is what vllm bench serve sends to /v1/completions.
BENCH_EXTENSIONS: tuple[str, ...] = ("ignore_eos", "repetition_penalty")


@dataclass(frozen=True)
class RequestExtensions:
    """Which of :data:`BENCH_EXTENSIONS` an engine's server takes. A server that refuses
    unknown fields (``transformers serve``: HTTP 422 "Unexpected fields in the request") is
    sent only these; without ``ignore_eos`` output lengths cannot be forced, so perflab counts
    and reports what was generated."""

    takes: frozenset[str]
    source: str = ""

    def __post_init__(self) -> None:
        unknown = set(self.takes) - set(BENCH_EXTENSIONS)
        if unknown:
            raise ValueError(f"unknown request extension(s) {sorted(unknown)}: perflab's bench sends only {BENCH_EXTENSIONS}")
        object.__setattr__(self, "takes", frozenset(self.takes))


@dataclass(frozen=True)
class MetricsEndpoint:
    """Where an engine serves its Prometheus metrics and which of its metric names mean what
    (the optional ``metrics`` engine method). The lab scrapes ``GET path`` on ``port``
    (None: the serving port) about every engine second of every measured benchmark and
    summarizes it as ``server_metrics`` (:mod:`perflab.observe.metrics`).

    Names are metric family names as the engine registers them (a counter's ``_total`` suffix
    may be given or not). Each is None when the engine does not export it: then the summary has
    no such key. Gauges: ``kv_cache_usage`` (0..1), ``running``, ``waiting``,
    ``prefix_cache_hit_rate`` and ``spec_decode_acceptance`` (0..1, used only when the counters
    are not given). Counters: ``preemptions``, ``prefix_cache_hits``/``prefix_cache_queries``
    (tokens), ``spec_decode_accepted``/``spec_decode_draft`` (tokens). ``source``: where the
    names come from (file and version); ``missing_hint``: what to do when the endpoint answers
    404 (an engine that serves it only under a flag), logged once with the failed scrape."""

    path: str = "/metrics"
    port: int | None = None
    kv_cache_usage: str | None = None
    running: str | None = None
    waiting: str | None = None
    preemptions: str | None = None
    prefix_cache_hits: str | None = None
    prefix_cache_queries: str | None = None
    prefix_cache_hit_rate: str | None = None
    spec_decode_accepted: str | None = None
    spec_decode_draft: str | None = None
    spec_decode_acceptance: str | None = None
    source: str = ""
    missing_hint: str = ""  # why a 404 may happen (SGLang: only with --enable-metrics), logged with it

    def names(self) -> dict[str, str]:
        """What each named metric means -> its name (the ones the engine exports)."""
        return {f.name: v for f in fields(self) if f.name in METRIC_ROLES and (v := getattr(self, f.name))}


#: the roles of a :class:`MetricsEndpoint`'s names, by kind (what the watcher does with them)
METRIC_GAUGES = ("kv_cache_usage", "running", "waiting", "prefix_cache_hit_rate", "spec_decode_acceptance")
METRIC_COUNTERS = ("preemptions", "prefix_cache_hits", "prefix_cache_queries", "spec_decode_accepted", "spec_decode_draft")
METRIC_ROLES = (*METRIC_GAUGES, *METRIC_COUNTERS)


@dataclass(frozen=True)
class Readiness:
    """How to tell that an engine really serves.

    The supervisor waits for every ``http`` probe to answer 2xx, then (unless
    ``generation_path`` is None) sends a one-token generation to ``generation_path`` and
    requires a token back. ``ready_log_patterns`` are regexes of the engine's own "ready"
    line; they are recorded, never trusted alone. ``served_version_check``, if given, is
    awaited once the engine is ready as ``check(base_url, detected_version)`` and returns a
    one-line warning (the engine serves another version than the one detected, or does not
    say) or None; the supervisor adds it to the outcome's warnings.
    """

    http: tuple[HttpProbe, ...] = (HttpProbe("/health"),)
    generation_path: str | None = "/v1/completions"
    ready_log_patterns: tuple[str, ...] = ()
    startup_timeout_s: float = 1800.0
    served_version_check: Callable[[str, str | None], Awaitable[str | None]] | None = None


@dataclass(frozen=True)
class Unsupported:
    """A reason a configuration cannot work (``severity="error"``) or works with a caveat
    (``severity="warning"``), and where that knowledge comes from."""

    what: str  # the option or feature, e.g. "quantization=fp8"
    why: str
    source: str = ""  # URL or file of the engine's code/docs
    severity: Literal["error", "warning"] = "error"


@dataclass(frozen=True)
class CrashCause:
    """A named reason an engine died, found in its exit code and log."""

    name: str  # stable identifier, e.g. "fp8-block-scaling-unsupported-sm"
    explanation: str
    line: str | None = None  # the matched log line
    hint: str = ""
    source: str = ""


def to_jsonable(value: Any) -> Any:
    """Turn a dataclass tree (with mapping proxies and tuples) into JSON-ready values."""
    if isinstance(value, Mapping):  # first: a record that reads as a mapping is its keys, not its fields
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    return value


def dumps(value: Any, **kw: Any) -> str:
    return json.dumps(to_jsonable(value), **kw)
