"""The base class of an engine: the object a plugin registers, its defaults and helpers.

An engine plugin subclasses :class:`EnginePlugin`, declares what it knows as class
attributes, overrides the methods it needs and exposes one instance through its entry point;
that instance registers itself (``perflab_register_engines``) and the core calls its methods
directly, so no method takes an engine name::

    # pyproject.toml
    [project.entry-points.perflab]
    myengine = "perflab_myengine:plugin"

    # perflab_myengine/__init__.py  (imports only perflab's types: `perflab engines list` loads it)
    class MyEngine(EnginePlugin):
        info = EngineInfo(name="myengine", display_name="MyEngine", accelerators=("cuda",),
                          executable="myengine-serve", distributions=("myengine",))
        visible_devices_env = "CUDA_VISIBLE_DEVICES"
        address_flags = ("--host", "--port")
        serve_options = {"tp": Maps("--tp N", source="https://..."), ...}  # every ServeConfig field

        def build_launch(self, config, hardware, workdir, version):
            from perflab_myengine.launch import build  # heavy modules inside the method
            return build(config, self.device_env(config))

    plugin = MyEngine()

Defaults: :meth:`EnginePlugin.version` from ``info.distributions``/``info.executable``
(:mod:`perflab.installed`), :meth:`EnginePlugin.device_env` from ``visible_devices_env``
(with ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` for CUDA), :meth:`EnginePlugin.check_support` refusing
every set option the plugin :class:`Refuses`, :meth:`EnginePlugin.classify_crash` matching
``crash_signatures`` then the core's shared ones, readiness ``None`` (the core's default), the
prefix-cache reset from ``prefix_cache_reset`` (None: the engine is never reset), the Prometheus
endpoint from ``metrics_endpoint`` (None: nothing is scraped).
"""

from __future__ import annotations

import dataclasses
import importlib
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from perflab.contract.errors import UnsupportedOption, UsageError
from perflab.contract.markers import hookimpl
from perflab.contract.types import (
    CacheReset,
    CrashCause,
    EngineInfo,
    HardwareSnapshot,
    LaunchSpec,
    MetricsEndpoint,
    NodeGroup,
    Readiness,
    RequestExtensions,
    ServeConfig,
    Unsupported,
)

if TYPE_CHECKING:
    from perflab.contract.crashes import Signature
    from perflab.contract.versions import EngineVersions

#: NVML (and so perflab's device indexes) numbers GPUs in PCI bus order; CUDA's default order
#: is "fastest first". Without this, --devices 0 could be another GPU for the engine.
#: https://docs.nvidia.com/cuda/cuda-c-programming-guide/index.html#env-vars
CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
CUDA_ORDER: Mapping[str, str] = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


@dataclass(frozen=True)
class Maps:
    """A serving option the engine expresses: ``how`` (its flag or config key), and where the
    engine documents it."""

    how: str
    source: str = ""


@dataclass(frozen=True)
class Refuses:
    """A serving option the engine cannot express: why, and where that knowledge comes from.
    :meth:`EnginePlugin.refused` (the default ``check_support``) turns a set one into an error;
    with ``always=False`` the engine takes some values (MindIE: ``kv_cache_dtype=auto``) and the
    plugin's ``build_launch`` refuses the others instead."""

    why: str
    source: str = ""
    always: bool = True


OptionMapping = Maps | Refuses


class DevicesConflict(UnsupportedOption, UsageError):
    """``--env <visible devices variable>`` contradicts ``--devices``: a user mistake the
    engine cannot express either way."""

    def __init__(self, engine: str, variable: str, given: str, wanted: str) -> None:
        super().__init__(engine, "devices", f"--env {variable}={given} contradicts --devices {wanted}; give only one of them")


def is_set(config: ServeConfig, name: str) -> bool:
    """Whether field ``name`` of ``config`` differs from its default (None, (), {})."""
    fld = next(f for f in dataclasses.fields(ServeConfig) if f.name == name)
    value = getattr(config, name)
    if fld.default is not dataclasses.MISSING:
        return bool(value != fld.default)
    if fld.default_factory is not dataclasses.MISSING:
        return bool(value != fld.default_factory())
    return True  # a required field (model) is always set


def set_value(config: ServeConfig, name: str) -> str:
    """``name=value`` as Unsupported.what spells an option."""
    value = getattr(config, name)
    if isinstance(value, Mapping):
        value = dict(value)
    return f"{name}={value}"


def address_tokens(argv: Sequence[str], flags: Sequence[str]) -> tuple[str, ...]:
    """The tokens of ``argv`` that only carry the address: each of ``flags`` with its value
    (``--port 8000`` or ``--port=8000``), in argv order."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in flags and i + 1 < len(argv):
            out += [arg, argv[i + 1]]
            i += 2
            continue
        if any(arg.startswith(f + "=") for f in flags):
            out.append(arg)
        i += 1
    return tuple(out)


class EnginePlugin:
    """Subclass, set the class attributes, override the plain methods; register an instance."""

    PERFLAB_HOOKSPEC_VERSIONS: ClassVar[tuple[int, ...]] = (2,)

    #: the engine this object is (its registered name, display name, accelerators, ...)
    info: ClassVar[EngineInfo]
    #: the environment variable that selects devices (``CUDA_VISIBLE_DEVICES``,
    #: ``ASCEND_RT_VISIBLE_DEVICES``); None: the plugin selects devices itself
    visible_devices_env: ClassVar[str | None] = None
    #: the flags of the launch argv that carry only the address perflab chose (``--host``,
    #: ``--port``): the serving script leaves them out, as the seeds' commands do
    address_flags: ClassVar[tuple[str, ...]] = ()
    #: other names an ``extra_args`` entry may not set (the part before ``=``), because perflab
    #: sets them for every launch (MindIE's ``ServerConfig.port=...`` overrides); with
    #: ``address_flags``, what :meth:`perflab.plugins.EngineRecord.owned_flags` refuses
    owned_args: ClassVar[tuple[str, ...]] = ()
    #: the engine's own crash signatures, most specific first (the core's shared ones follow);
    #: or "module:NAME" of a tuple, imported on the first crash (keeps the plugin import-light)
    crash_signatures: ClassVar[tuple[Signature, ...] | str] = ()
    #: every ServeConfig field: how the engine expresses it, or why it cannot
    serve_options: ClassVar[Mapping[str, OptionMapping]] = {}
    #: patterns reading the version from ``EXECUTABLE --version`` when no distribution
    #: metadata says it; empty: the executable is never run
    version_output: ClassVar[tuple[re.Pattern[str], ...]] = ()
    #: the engine versions this plugin builds commands for and the spellings that changed
    #: between them (:mod:`perflab.contract.versions`); None: the plugin maps one version only,
    #: and the core passes ``build_launch`` the installed version (or None)
    engine_versions: ClassVar[EngineVersions | None] = None
    #: how to empty the engine's prefix cache between measurements (the optional
    #: ``cache_reset`` engine method); None: the engine cannot, the lab does not try
    prefix_cache_reset: ClassVar[CacheReset | None] = None
    #: where the engine serves its Prometheus metrics and what its names mean (the optional
    #: ``metrics`` engine method); None: the lab scrapes nothing
    metrics_endpoint: ClassVar[MetricsEndpoint | None] = None
    #: which of perflab's request extensions (``ignore_eos``, ``repetition_penalty``) the engine's
    #: server takes; None: all of them (vLLM's, also SGLang's and TensorRT-LLM's)
    request_extensions: ClassVar[RequestExtensions | None] = None

    # ------------------------------------------------------------------ registration

    @hookimpl
    def perflab_register_engines(self, register: Callable[[EnginePlugin], None]) -> None:
        """An instance exposed as an entry point is its own plugin: it registers itself."""
        register(self)

    #: the methods the core calls on a registered engine (each under its deadline,
    #: :data:`perflab.contract.hookspecs.HOOK_DEADLINES_S`)
    METHODS: ClassVar[tuple[str, ...]] = (
        "version", "check_support", "build_launch", "build_group_launch", "readiness", "classify_crash",
        "teardown", "describe_file", "cache_reset", "metrics",
    )
    #: the methods whose base version does nothing (the core's own default applies): an engine
    #: that does not override one does not really provide it
    #: (cache_reset, metrics: unless the class declares prefix_cache_reset, metrics_endpoint)
    NOOP_DEFAULTS: ClassVar[tuple[str, ...]] = (
        "readiness", "teardown", "describe_file", "cache_reset", "metrics", "build_group_launch",
    )
    #: the methods a class attribute answers (without overriding the method)
    DECLARED_BY: ClassVar[Mapping[str, str]] = {"cache_reset": "prefix_cache_reset", "metrics": "metrics_endpoint"}

    def implemented(self) -> tuple[str, ...]:
        """The methods this engine really provides: what ``perflab engines list`` shows."""

        def answers(method: str) -> bool:
            declared = self.DECLARED_BY.get(method)
            if declared is not None and getattr(self, declared) is not None:
                return True
            return method not in self.NOOP_DEFAULTS or getattr(type(self), method) is not getattr(EnginePlugin, method)

        return tuple(m for m in self.METHODS if answers(m))

    def spans_nodes(self) -> bool:
        """Whether this engine builds multi-node launches (overrides ``build_group_launch``)."""
        return "build_group_launch" in self.implemented()

    # ------------------------------------------------------------------ what a plugin overrides

    def version(self, env: Mapping[str, str]) -> str | None:
        """The installed engine version (default: :func:`perflab.installed.installed_version`
        from ``info.distributions``, ``info.executable`` and ``version_output``)."""
        from perflab.installed import installed_version

        return installed_version(self.info.distributions, env, self.info.executable, self.version_output)

    def check_support(self, config: ServeConfig, hardware: HardwareSnapshot, version: str | None) -> list[Unsupported]:
        """Why ``config`` cannot work here (default: the set options this plugin refuses)."""
        return self.refused(config)

    def build_launch(self, config: ServeConfig, hardware: HardwareSnapshot, workdir: Path, version: str | None) -> LaunchSpec:
        raise NotImplementedError(f"{type(self).__name__} must implement build_launch()")

    def build_group_launch(self, config: ServeConfig, hardware: HardwareSnapshot, group: NodeGroup, workdir: Path,
                           version: str | None) -> list[LaunchSpec] | None:
        """One launch per node rank of ``group`` (default None: the engine runs on one node
        only, and the core refuses ``nodes`` above 1)."""
        return None

    def readiness(self, launch: LaunchSpec) -> Readiness | None:
        """How to tell the engine serves (default None: ``GET /health`` + one-token completion)."""
        return None

    def classify_crash(self, exit_code: int | None, log_tail: str) -> CrashCause | None:
        """The first of ``crash_signatures`` + the core's shared ones found in the log."""
        from perflab.contract.crashes import SHARED_SIGNATURES, first_signature

        own = self.crash_signatures
        if isinstance(own, str):
            module, _, name = own.partition(":")
            own = getattr(importlib.import_module(module), name)
        return first_signature(log_tail, (*own, *SHARED_SIGNATURES))

    def teardown(self, launch: LaunchSpec, workdir: Path) -> None:
        """Clean up what the engine leaves behind (default: nothing)."""

    def describe_file(self, path: str, content: str) -> list[str] | None:
        """The serving script's lines for a file this plugin wrote (default None)."""
        return None

    def cache_reset(self, launch: LaunchSpec) -> CacheReset | None:
        """How to empty this launch's prefix cache (default: ``prefix_cache_reset``)."""
        return self.prefix_cache_reset

    def metrics(self, launch: LaunchSpec) -> MetricsEndpoint | None:
        """Where this launch serves its Prometheus metrics (default: ``metrics_endpoint``)."""
        return self.metrics_endpoint

    # ------------------------------------------------------------------ helpers

    def refused(self, config: ServeConfig) -> list[Unsupported]:
        """An error for each set option this plugin :class:`Refuses` whatever its value."""
        return [
            Unsupported(set_value(config, name), how.why, source=how.source)
            for name, how in self.serve_options.items()
            if isinstance(how, Refuses) and how.always and is_set(config, name)
        ]

    def raise_refused(self, config: ServeConfig) -> None:
        """Raise :class:`~perflab.contract.errors.UnsupportedOption` for the first set option this plugin
        :class:`Refuses` (for ``build_launch``: a forced launch must not drop it silently)."""
        for problem in self.refused(config):
            raise UnsupportedOption(self.info.name, problem.what, problem.why)

    def device_env(self, config: ServeConfig, variable: str | None = None) -> dict[str, str]:
        """The engine's environment: the visible devices (``variable``, default
        ``visible_devices_env``; CUDA also gets ``CUDA_DEVICE_ORDER=PCI_BUS_ID``), then the
        user's ``extra_env``. An ``extra_env`` entry for the device variable that disagrees
        with ``devices`` is a user error, not a silent override."""
        variable = variable or self.visible_devices_env
        env: dict[str, str] = {}
        if config.devices is not None and variable is not None:
            wanted = ",".join(str(d) for d in config.devices)
            given = config.extra_env.get(variable)
            if given is not None and given != wanted:
                raise DevicesConflict(self.info.name, variable, given, wanted)
            if variable == CUDA_VISIBLE_DEVICES:
                env.update(CUDA_ORDER)
            env[variable] = wanted
        env.update(config.extra_env)
        return env



def older_devices(config: ServeConfig, hardware: HardwareSnapshot, min_sm: int) -> list[Any]:
    """The CUDA devices ``config`` would use whose compute capability is below ``min_sm``."""
    return [a for a in hardware.select(config.devices, "cuda") if a.sm is not None and a.sm < min_sm]


def checkpoint_tagged(model: str, tag: str) -> bool:
    """Whether a model id names a pre-quantized checkpoint (``Qwen/Qwen3-32B-FP8``: tag fp8)."""
    return re.search(rf"(?i)(?:^|[-_./]){re.escape(tag)}(?:$|[-_.])", model) is not None


def weights_what(config: ServeConfig, checkpoint: str) -> str:
    """How an Unsupported names the weights asked for: the quantization, or the checkpoint."""
    return f"quantization={config.quantization}" if config.quantization else f"model={config.model} ({checkpoint} checkpoint)"


def min_sm_refusal(config: ServeConfig, hardware: HardwareSnapshot, min_sm: int, checkpoint: str, why: str,
                   source: str) -> list[Unsupported]:
    """One error when a device ``config`` uses is older than SM``min_sm``: ``why`` follows
    "<GPU> is SM<n>; "."""
    old = older_devices(config, hardware, min_sm)
    if not old:
        return []
    return [Unsupported(weights_what(config, checkpoint), f"{old[0].name} is SM{old[0].sm}; {why}", source=source)]


def positive(engine: str, name: str, value: int) -> str:
    """``value`` as an argv token, or :class:`UnsupportedOption` when it is below 1."""
    if value < 1:
        raise UnsupportedOption(engine, f"{name}={value}", "must be at least 1")
    return str(value)


def refuse_unknown(engine: str, given: Iterable[str], known: Iterable[str], what: str, why: str) -> None:
    """Raise :class:`UnsupportedOption` naming the keys of ``given`` not in ``known``:
    ``what`` prefixes the key list ("option(s)"), ``why`` says what is understood."""
    unknown = sorted(set(given) - set(known))
    if unknown:
        raise UnsupportedOption(engine, f"{what} {', '.join(unknown)}", why)


def fraction(engine: str, name: str, value: float, why: str = "must be in (0, 1]") -> str:
    """``value`` as an argv token, or :class:`UnsupportedOption` when it is not in (0, 1]."""
    if not 0 < value <= 1:
        raise UnsupportedOption(engine, f"{name}={value}", why)
    return str(value)
