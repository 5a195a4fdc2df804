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
from dataclasses import dataclass, field
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


@dataclass(frozen=True)
class ServeConfig:
    """The engine-neutral serving options of one configuration.

    ``None`` always means "the engine's own default": perflab passes nothing for it, so a
    baseline command stays as short as the seeds' (``vllm serve Qwen/Qwen3-32B``).
    A plugin maps each set field to its engine's flag or config key, or reports it as
    :class:`Unsupported`; nothing is silently dropped.
    """

    model: str
    served_model_name: str | None = None
    tp: int | None = None
    pp: int | None = None
    dp: int | None = None
    ep: int | None = None  # expert-parallel size; vLLM only knows "on" (= tp * dp)
    max_model_len: int | None = None
    max_batched_tokens: int | None = None
    max_num_seqs: int | None = None
    quantization: str | None = None
    kv_cache_dtype: str | None = None
    prefix_caching: bool | None = None
    chunked_prefill: bool | None = None
    speculative_config: Mapping[str, Any] | None = None
    mem_fraction: float | None = None
    reasoning_parser: str | None = None
    host: str = "127.0.0.1"
    port: int | None = None  # None: the runner picks a free port
    devices: tuple[int, ...] | None = None
    extra_args: tuple[str, ...] = ()
    extra_env: Mapping[str, str] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)  # engine-specific

    def __post_init__(self) -> None:
        object.__setattr__(self, "extra_env", _frozen_map(self.extra_env))
        object.__setattr__(self, "options", _frozen_map(self.options))
        if self.speculative_config is not None:
            object.__setattr__(self, "speculative_config", _frozen_map(self.speculative_config))
        object.__setattr__(self, "extra_args", tuple(self.extra_args))
        if self.devices is not None:
            object.__setattr__(self, "devices", tuple(self.devices))

    @property
    def name(self) -> str:
        """The model name clients send in requests."""
        return self.served_model_name or self.model

    @property
    def world_size(self) -> int:
        return (self.tp or 1) * (self.pp or 1) * (self.dp or 1)

    def replace(self, **changes: Any) -> ServeConfig:
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class FileSpec:
    """A file the launch needs written before start (MindIE's config.json)."""

    path: str  # absolute, or relative to the launch's workdir
    content: str
    mode: int = 0o644


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

    def __post_init__(self) -> None:
        object.__setattr__(self, "env", _frozen_map(self.env))
        object.__setattr__(self, "argv", tuple(self.argv))

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
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    return value


def dumps(value: Any, **kw: Any) -> str:
    return json.dumps(to_jsonable(value), **kw)
