"""Finding, loading and validating plugins.

Entry points in the group ``perflab`` are loaded one at a time, so that one broken plugin
is recorded (and shown by ``perflab engines list``) while every other keeps working.
``--strict`` (or ``PERFLAB_STRICT_PLUGINS=1``) turns any load problem into an error, for CI.

Environment:

* ``PERFLAB_LOAD_PLUGINS`` — unset: load all; empty: load none; a comma list of
  distribution names (``perflab-plugin-vllm``) or entry-point names (``vllm``): only those.
* ``PERFLAB_DISABLE_PLUGINS`` — a comma list of the same names never to load (never
  imported; recorded with status ``disabled`` so ``perflab engines list`` shows them).
* ``PERFLAB_HOOK_DEADLINE_S`` (:data:`perflab.contract.hookspecs.DEADLINE_ENV`) — seconds: no hook
  call may take longer (each hook's own deadline is :data:`perflab.contract.hookspecs.HOOK_DEADLINES_S`).

Every hook implementation is wrapped at registration so that each call, whoever makes it
(``pm.hook.X(...)`` or a loop over ``get_hookimpls()``), runs under its hook's deadline.

Built-in plugins (the NVML and npu-smi hardware probes) are always loaded; they are part of
the core, not of an engine.

A registered engine is an :class:`EngineRecord` (``pm.engine(name)``): the core calls its
methods directly (``pm.engine("vllm").build_launch(...)``), which add the core's checks,
defaults and validation to the engine object's answers (``rec.engine``, a :class:`BoundedEngine`
keeping each call to its deadline).
"""

from __future__ import annotations

import contextvars
import dataclasses
import importlib
import importlib.metadata
import inspect
import math
import os
import re
import threading
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

import pluggy

from perflab.contract import hookspecs
from perflab.contract.crashes import fallback_cause, with_signal
from perflab.contract.errors import (
    HookDeadlineExceeded,
    PerflabError,
    PluginLoadError,
    UnknownEngine,
    UnsupportedOption,
    UsageError,
)
from perflab.contract.plugin_base import EnginePlugin, OptionMapping, address_tokens
from perflab.contract.types import (
    CacheReset,
    CrashCause,
    EngineInfo,
    HardwareSnapshot,
    HttpProbe,
    LaunchSpec,
    MetricsEndpoint,
    NodeGroup,
    Readiness,
    RequestExtensions,
    ServeConfig,
    Unsupported,
)
from perflab.contract.versions import EngineVersions, Origin, VersionChoice, choose_version

BUILTIN_PLUGINS: tuple[str, ...] = (
    "perflab.hardware.nvml",
    "perflab.hardware.npusmi",
    "perflab.hardware.cpu",
)

Status = Literal["ok", "load-error", "incompatible", "disabled"]
# Statuses that are not a problem: ``disabled`` is the user's choice, not a broken plugin.
FINE: tuple[Status, ...] = ("ok", "disabled")

#: The engine method that builds a multi-node launch: an engine that does not override it runs
#: on one node (errors name it so a plugin's author knows what to add).
GROUP_LAUNCH = "build_group_launch"


@dataclass(frozen=True)
class PluginRecord:
    """One plugin as the manager saw it."""

    name: str  # entry-point name, or module name for built-ins
    module: str
    distribution: str | None
    version: str | None
    status: Status
    error: str | None = None
    hooks: tuple[str, ...] = ()
    engines: tuple[str, ...] = ()
    builtin: bool = False
    warnings: tuple[str, ...] = ()  # deprecations (pluggy warn_on_impl) and other notes


#: The readiness of an engine whose plugin names none: ``GET /health``, then a one-token completion.
DEFAULT_READINESS = Readiness(http=(HttpProbe("/health"),), generation_path="/v1/completions")


class BoundedEngine:
    """A registered engine object as the core calls it: each method the core calls
    (``EnginePlugin.METHODS``) runs under its deadline and is named as its plugin's fault past
    it; the answers are the plugin's own (:class:`EngineRecord` adds the core's rules)."""

    def __init__(self, engine: EnginePlugin, plugin: str, deadline: Callable[[str], float]) -> None:
        self.wrapped = engine
        self.plugin = plugin
        self.deadline = deadline

    def _call(self, method: str, *args: Any) -> Any:  # its callers declare what the method returns
        return call_with_deadline(getattr(self.wrapped, method), args, {}, plugin=self.plugin, hook=method,
                                  deadline_s=self.deadline(method))

    # what the engine declares (class attributes, read as they are)

    @property
    def info(self) -> EngineInfo:
        return self.wrapped.info

    @property
    def serve_options(self) -> Mapping[str, OptionMapping]:
        return self.wrapped.serve_options

    @property
    def address_flags(self) -> tuple[str, ...]:
        return self.wrapped.address_flags

    @property
    def owned_args(self) -> tuple[str, ...]:
        return self.wrapped.owned_args

    @property
    def engine_versions(self) -> EngineVersions | None:
        return self.wrapped.engine_versions

    @property
    def request_extensions(self) -> RequestExtensions | None:
        return self.wrapped.request_extensions

    def implemented(self) -> tuple[str, ...]:
        return self.wrapped.implemented()

    def spans_nodes(self) -> bool:
        return self.wrapped.spans_nodes()

    # the methods the core calls, each under its deadline

    def version(self, env: Mapping[str, str]) -> str | None:
        return self._call("version", env)

    def check_support(self, config: ServeConfig, hardware: HardwareSnapshot, version: str | None) -> list[Unsupported] | None:
        return self._call("check_support", config, hardware, version)

    def build_launch(self, config: ServeConfig, hardware: HardwareSnapshot, workdir: Path,
                     version: str | None) -> LaunchSpec | None:
        return self._call("build_launch", config, hardware, workdir, version)

    def build_group_launch(self, config: ServeConfig, hardware: HardwareSnapshot, group: NodeGroup, workdir: Path,
                           version: str | None) -> Sequence[LaunchSpec] | None:
        return self._call("build_group_launch", config, hardware, group, workdir, version)

    def readiness(self, launch: LaunchSpec) -> Readiness | None:
        return self._call("readiness", launch)

    def classify_crash(self, exit_code: int | None, log_tail: str) -> CrashCause | None:
        return self._call("classify_crash", exit_code, log_tail)

    def teardown(self, launch: LaunchSpec, workdir: Path) -> None:
        self._call("teardown", launch, workdir)

    def describe_file(self, path: str, content: str) -> list[str] | None:
        return self._call("describe_file", path, content)

    def cache_reset(self, launch: LaunchSpec) -> CacheReset | None:
        return self._call("cache_reset", launch)

    def metrics(self, launch: LaunchSpec) -> MetricsEndpoint | None:
        return self._call("metrics", launch)


@dataclass(frozen=True)
class EngineRecord:
    """A registered engine as the core uses it: its object (``engine``, each method under its
    deadline), who registered it, and the core's rules around the engine's answers, so the
    supervisor, the CLI and the lab get the same answers and the same errors. A method
    here adds something to the engine's (checks, defaults, validation); the engine's plain
    answers are ``engine``'s."""

    engine: BoundedEngine
    plugin: str
    distribution: str | None
    version: str | None  # the plugin distribution's version

    @property
    def info(self) -> EngineInfo:
        return self.engine.info

    @property
    def provider(self) -> str:
        """Who registered the engine, as errors name it: its distribution, else its plugin."""
        return self.distribution or self.plugin

    # ------------------------------------------------------------------ version

    def bench_extensions(self) -> tuple[str, ...] | None:
        """The request extensions the bench may send this engine (BenchRequest.extensions):
        those its server takes, None for all of them."""
        declared = self.engine.request_extensions
        return None if declared is None else tuple(sorted(declared.takes))

    def choose_version(self, env: Mapping[str, str], asked: str | None = None,
                       origin: Origin = "asked") -> VersionChoice:
        """The engine version to build command lines for: ``asked`` (``--engine-version``, or
        the plan's ``engine_versions`` with ``origin="plan"``), else the version installed in
        ``env``, else the newest the plugin maps (:func:`perflab.contract.versions.choose_version`).
        The installed version is read even when one is asked for, so the two can be told apart."""
        installed = self.engine.version(env)
        return choose_version(self.info.name, self.info.display_name, self.engine.engine_versions, asked,
                              None if installed is None else str(installed), origin)

    # ------------------------------------------------------------------ preflight

    def core_checks(self, config: ServeConfig, hardware: HardwareSnapshot) -> list[Unsupported]:
        """Checks that hold for every engine: enough devices for the parallel sizes asked."""
        info = self.info
        out: list[Unsupported] = []
        if not hardware.accelerators:
            return out  # nothing probed (dry run on a laptop): no device arithmetic possible
        pool = [a for a in hardware.accelerators if a.kind in info.accelerators]
        if not pool:
            kinds = sorted({a.kind for a in hardware.accelerators})
            out.append(
                Unsupported(
                    "hardware",
                    f"{info.display_name} runs on {'/'.join(info.accelerators)}; this machine has {'/'.join(kinds)}",
                    source="perflab",
                )
            )
            return out
        if config.devices is not None:
            known = {a.index for a in pool}
            missing = [d for d in config.devices if d not in known]
            if missing:
                out.append(
                    Unsupported(
                        "devices",
                        f"device(s) {', '.join(map(str, missing))} do not exist (have {', '.join(map(str, sorted(known)))})",
                        source="perflab",
                    )
                )
                return out
            available = len(config.devices)
        else:
            available = len(pool)
        if config.devices_per_node > available:
            per_node = f" over {config.node_count} nodes: {config.devices_per_node} per node" if config.node_count > 1 else ""
            out.append(
                Unsupported(
                    "parallel size",
                    f"tp×pp×dp = {config.tp or 1}×{config.pp or 1}×{config.dp or 1} = {config.world_size} "
                    f"needs {config.world_size} devices{per_node}, {available} available",
                    source="perflab",
                )
            )
        return out

    def nodes_refusal(self, config: ServeConfig) -> list[Unsupported]:
        """The one-line refusal of ``nodes`` above 1 for an engine whose plugin has no group launch."""
        if config.node_count <= 1 or self.engine.spans_nodes():
            return []
        return [Unsupported(f"nodes={config.nodes}",
                            f"{self.info.display_name} runs on one node in perflab: its plugin has no multi-node "
                            f"launch ({GROUP_LAUNCH})",
                            source="perflab")]

    def check_support(self, config: ServeConfig, hardware: HardwareSnapshot, version: str | None) -> list[Unsupported]:
        """Every objection, the core's first, then the engine's."""
        out = [*self.nodes_refusal(config), *self.core_checks(config, hardware)]
        out.extend(self.engine.check_support(config, hardware, version) or [])
        return out

    def owned_flags(self) -> tuple[str, ...]:
        """What perflab sets itself for every launch of the engine, so extra arguments may not: the
        plugin's ``address_flags`` (host and port, which perflab chooses and probes) and
        ``owned_args`` (MindIE's ``ServerConfig.port``: its extra arguments are config.json overrides)."""
        return (*self.engine.address_flags, *self.engine.owned_args)

    def owned_flag_problems(self, extra_args: Sequence[str]) -> list[str]:
        """One line per extra argument that sets a flag perflab owns for the engine (``--port=18555``:
        the engine would serve on another port than the one perflab chose and waits on)."""
        owned = self.owned_flags()
        out = []
        for arg in extra_args:
            name = arg.split("=", 1)[0]  # '--port=1' and '--port' '1' alike; 'ServerConfig.port=1'
            if name in owned:
                out.append(f"extra argument {arg!r}: perflab sets {name} itself for {self.info.name} "
                           f"(it chooses the address it waits on); remove it")
        return out

    # ------------------------------------------------------------------ launch

    def build_launch(self, config: ServeConfig, hardware: HardwareSnapshot, workdir: Path,
                     version: str | None) -> LaunchSpec:
        """The engine's launch of ``config`` (its default port when none is set), checked: no
        extra argument may set a flag perflab owns, and the plugin must return a valid argv."""
        problems = self.owned_flag_problems(config.extra_args)
        if problems:  # every engine, not only those whose plugin checks: the same refusal as a plan's
            raise UsageError("; ".join(problems))
        if config.port is None:
            config = config.replace(port=self.info.default_port)
        spec = self.engine.build_launch(config, hardware, workdir, version)
        if spec is None:
            raise PerflabError(f"plugin {self.provider} registered engine {self.info.name!r} but built no launch for it")
        if not isinstance(spec, LaunchSpec) or not spec.argv or not all(isinstance(a, str) for a in spec.argv):
            raise PerflabError(f"plugin {self.provider} returned an invalid launch spec for {self.info.name!r}")
        return self.with_address(spec)

    def build_group_launch(self, config: ServeConfig, hardware: HardwareSnapshot, group: NodeGroup, workdir: Path,
                           version: str | None) -> list[LaunchSpec]:
        """One launch per rank of ``group`` (the plugin's :data:`GROUP_LAUNCH`); UnsupportedOption
        when the engine has none."""
        specs = self.engine.build_group_launch(config, hardware, group, workdir, version)
        if specs is None:
            raise UnsupportedOption(self.info.name, f"nodes={group.size}",
                                    f"its plugin has no multi-node launch ({GROUP_LAUNCH})")
        specs = list(specs)
        if len(specs) != group.size or not all(isinstance(s, LaunchSpec) and s.argv for s in specs):
            raise PerflabError(f"plugin {self.provider} returned no valid launch per rank of a "
                               f"{group.size}-node group for {self.info.name!r}")
        return [self.with_address(s) for s in specs]

    def with_address(self, spec: LaunchSpec) -> LaunchSpec:
        """``spec`` with its ``address_args`` read from the argv's ``address_flags`` when the
        engine set none (the serving script leaves those tokens out)."""
        flags = self.engine.address_flags
        if not flags or spec.address_args:
            return spec
        return dataclasses.replace(spec, address_args=address_tokens(spec.argv, flags))

    # ------------------------------------------------------------------ serving, crashes

    def readiness(self, launch: LaunchSpec) -> Readiness:
        """How to tell ``launch`` serves: the plugin's answer, else :data:`DEFAULT_READINESS`."""
        return self.engine.readiness(launch) or DEFAULT_READINESS

    def classify_crash(self, exit_code: int | None, log_tail: str) -> CrashCause:
        """The plugin's named cause (noting a death by signal), or the core's: ``killed-by-signal``
        for a signal, else ``unknown`` quoting the first exception line (see perflab.contract.crashes)."""
        cause = self.engine.classify_crash(exit_code, log_tail)
        if cause is not None:
            return with_signal(cause, exit_code)
        return fallback_cause(exit_code, log_tail)

    def metrics(self, launch: LaunchSpec) -> MetricsEndpoint | None:
        """Where ``launch`` serves its Prometheus metrics (the engine's optional ``metrics``); None
        when the engine names none (nothing is scraped)."""
        answer = self.engine.metrics(launch)
        if answer is not None and not isinstance(answer, MetricsEndpoint):
            raise PerflabError(f"the {self.info.name} plugin's metrics() returned {type(answer).__name__}, "
                               f"not a MetricsEndpoint")
        return answer


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _name_list(value: str | None) -> set[str] | None:
    if value is None:
        return None
    return {_norm(v.strip()) for v in value.split(",") if v.strip()}


def call_with_deadline(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: Mapping[str, Any], *,
                       plugin: str, hook: str, deadline_s: float) -> Any:
    """``fn(*args, **kwargs)`` in a daemon thread, waited for at most ``deadline_s`` seconds.

    Its result or exception is the caller's; past the deadline it raises
    :class:`~perflab.contract.errors.HookDeadlineExceeded`. The thread cannot be killed (Python has no
    way to): it is abandoned, and being a daemon it never holds perflab's exit.
    """
    box: dict[str, Any] = {}
    done = threading.Event()
    context = contextvars.copy_context()  # structlog's bound context follows the call

    def target() -> None:
        try:
            box["value"] = context.run(fn, *args, **kwargs)
        except BaseException as exc:  # handed to the caller, whatever it is
            box["error"] = exc
        finally:
            done.set()

    threading.Thread(target=target, name=f"perflab-hook:{plugin}:{hook}", daemon=True).start()
    if not done.wait(deadline_s):
        import structlog  # here, not at import: structlog loads rich, which `engines list --json` never needs

        structlog.get_logger("perflab.plugins").warning("plugin.hook-deadline", plugin=plugin, hook=hook,
                                                        deadline_s=deadline_s)
        raise HookDeadlineExceeded(plugin, hook, deadline_s)
    if "error" in box:
        raise box["error"]
    return box.get("value")


def _deadline_cap(value: str | None, where: str) -> float:
    if value is None or not value.strip():
        return math.inf
    try:
        cap = float(value)
    except ValueError:
        cap = math.nan
    if not cap > 0:  # also refuses nan
        raise UsageError(f"{where}={value!r}: expected a positive number of seconds")
    return cap


def _spec_params() -> dict[str, tuple[str, ...]]:
    specs: dict[str, tuple[str, ...]] = {}
    for name, fn in vars(hookspecs).items():
        if name.startswith("perflab_") and callable(fn):
            specs[name] = tuple(inspect.signature(fn).parameters)
    return specs


def check_compatibility(plugin: object) -> str | None:
    """Return why ``plugin`` does not fit this core's contract, or ``None`` if it fits."""
    versions = getattr(plugin, "PERFLAB_HOOKSPEC_VERSIONS", None)
    if versions is not None and hookspecs.HOOKSPEC_VERSION not in tuple(versions):
        return (
            f"supports hook contract version(s) {tuple(versions)}, "
            f"this perflab provides version {hookspecs.HOOKSPEC_VERSION}"
        )
    specs = _spec_params()
    for attr in dir(plugin):
        if not attr.startswith("perflab_"):
            continue
        impl = getattr(plugin, attr)
        if not callable(impl) or not hasattr(impl, f"{hookspecs.PROJECT}_impl"):
            continue
        if attr not in specs:
            return f"implements unknown hook {attr}() (not in perflab hook contract v{hookspecs.HOOKSPEC_VERSION})"
        extra = [p for p in inspect.signature(impl).parameters if p not in specs[attr]]
        if extra:
            return f"{attr}() takes argument(s) {', '.join(extra)} that the hook spec does not provide"
    return None


def _hooks_of(plugin: object) -> tuple[str, ...]:
    hooks = tuple(
        sorted(
            a
            for a in dir(plugin)
            if a.startswith("perflab_") and hasattr(getattr(plugin, a), f"{hookspecs.PROJECT}_impl")
        )
    )
    return hooks


class PluginManager:
    """pluggy's manager plus the records perflab shows and the engine registry."""

    def __init__(
        self,
        *,
        entrypoints: bool = True,
        builtins: bool = True,
        strict: bool | None = None,
        environ: Mapping[str, str] | None = None,
        hook_deadline_s: float | None = None,
    ) -> None:
        self.environ = os.environ if environ is None else environ
        # every hook's deadline is at most this (the parameter, else PERFLAB_HOOK_DEADLINE_S)
        self.deadline_cap = (hook_deadline_s if hook_deadline_s is not None
                             else _deadline_cap(self.environ.get(hookspecs.DEADLINE_ENV), hookspecs.DEADLINE_ENV))
        self.strict = strict if strict is not None else self.environ.get("PERFLAB_STRICT_PLUGINS") == "1"
        self.pm = pluggy.PluginManager(hookspecs.PROJECT)
        self.pm.add_hookspecs(hookspecs)
        self.records: list[PluginRecord] = []
        self.engines: dict[str, EngineRecord] = {}
        self.errors: list[str] = []  # problems not tied to one plugin's load (duplicates)
        if builtins:
            for mod in BUILTIN_PLUGINS:
                self._load(mod, lambda m=mod: importlib.import_module(m), None, None, builtin=True)
        if entrypoints:
            self._load_entrypoints()
        if self.strict:
            self.raise_if_broken()

    # ------------------------------------------------------------------ loading

    @property
    def hook(self) -> Any:
        return self.pm.hook

    def deadline(self, hook: str) -> float:
        """Seconds one call of ``hook`` may take (its contract deadline, lowered by the cap)."""
        return min(hookspecs.HOOK_DEADLINES_S.get(hook, hookspecs.DEFAULT_HOOK_DEADLINE_S), self.deadline_cap)

    def _bound_deadlines(self, plugin: object, name: str) -> None:
        """Make every call of ``plugin``'s hook implementations keep its hook's deadline."""
        for caller in self.pm.get_hookcallers(plugin) or []:
            for impl in caller.get_hookimpls():
                if impl.plugin is plugin:
                    # pluggy declares it Final; the deadline wraps the implementation in place
                    impl.function = self._bounded(impl.function, name, caller.name)  # type: ignore[misc]

    def _bounded(self, fn: Callable[..., Any], plugin: str, hook: str) -> Callable[..., Any]:
        deadline = self.deadline(hook)

        def call(*args: Any, **kwargs: Any) -> Any:
            return call_with_deadline(fn, args, kwargs, plugin=plugin, hook=hook, deadline_s=deadline)

        call.__wrapped__ = fn  # type: ignore[attr-defined]
        return call

    def _load_entrypoints(self) -> None:
        only = _name_list(self.environ.get("PERFLAB_LOAD_PLUGINS"))
        disabled = _name_list(self.environ.get("PERFLAB_DISABLE_PLUGINS")) or set()
        seen: set[tuple[str, str]] = set()
        for ep in importlib.metadata.entry_points(group=hookspecs.PROJECT):
            dist = ep.dist.metadata["Name"] if ep.dist is not None else None
            version = ep.dist.version if ep.dist is not None else None
            key = (ep.name, ep.value)
            if key in seen:  # the same distribution visible twice on sys.path
                continue
            seen.add(key)
            names = {_norm(ep.name)} | ({_norm(dist)} if dist else set())
            if only is not None and not (names & only):
                continue
            if names & disabled:
                self.records.append(PluginRecord(ep.name, ep.module, dist, version, "disabled"))
                continue
            self._load(ep.name, ep.load, dist, version)

    def _load(
        self,
        name: str,
        loader: Any,
        dist: str | None,
        version: str | None,
        builtin: bool = False,
    ) -> None:
        module_name = name
        try:
            plugin = loader()
        except Exception as exc:  # a broken plugin must not break perflab
            self.records.append(
                PluginRecord(name, module_name, dist, version, "load-error", f"{type(exc).__name__}: {exc}", builtin=builtin)
            )
            return
        self.add_plugin(plugin, name=name, distribution=dist, version=version, builtin=builtin)

    def add_plugin(
        self,
        plugin: object,
        *,
        name: str | None = None,
        distribution: str | None = None,
        version: str | None = None,
        builtin: bool = False,
    ) -> PluginRecord:
        """Validate and register one plugin object (module or instance); record the outcome."""
        # a module's name, or for an instance (an EnginePlugin) the module its class lives in
        module_name = getattr(plugin, "__name__", None) or type(plugin).__module__
        name = name or module_name
        hooks = _hooks_of(plugin)
        problem = check_compatibility(plugin)
        if problem is not None:
            rec = PluginRecord(name, module_name, distribution, version, "incompatible", problem, hooks, builtin=builtin)
            self.records.append(rec)
            return rec
        try:
            # pluggy emits warn_on_impl deprecations at registration: keep them for the listing
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                self.pm.register(plugin, name=name)
            notes = tuple(str(w.message) for w in caught)
        except Exception as exc:  # pluggy's validation or a duplicate plugin name
            rec = PluginRecord(name, module_name, distribution, version, "incompatible", f"{type(exc).__name__}: {exc}", hooks, builtin=builtin)
            self.records.append(rec)
            return rec
        self._bound_deadlines(plugin, name)
        engines: list[str] = []
        register_impl = getattr(plugin, "perflab_register_engines", None)
        if register_impl is not None:
            open_ = [True]  # a call abandoned at its deadline must not register anything later

            def register(engine: Any) -> None:
                if open_[0]:
                    self._register_engine(engine, name, distribution, version, engines)

            try:
                call_with_deadline(register_impl, (register,), {}, plugin=name, hook="perflab_register_engines",
                                   deadline_s=self.deadline("perflab_register_engines"))
            except Exception as exc:
                open_[0] = False
                self.pm.unregister(plugin)
                for e in engines:
                    self.engines.pop(e, None)
                rec = PluginRecord(name, module_name, distribution, version, "load-error", f"registering engines failed: {type(exc).__name__}: {exc}", hooks, builtin=builtin)
                self.records.append(rec)
                return rec
        rec = PluginRecord(name, module_name, distribution, version, "ok", None, hooks, tuple(engines), builtin, notes)
        self.records.append(rec)
        return rec

    def _register_engine(
        self, engine: Any, plugin: str, dist: str | None, version: str | None, out: list[str]
    ) -> None:
        if not isinstance(engine, EnginePlugin) or not isinstance(getattr(engine, "info", None), EngineInfo):
            raise TypeError(f"register() takes an EnginePlugin with an EngineInfo, got {type(engine).__name__}")
        info = engine.info
        existing = self.engines.get(info.name)
        if existing is not None:
            self.errors.append(
                f"engine {info.name!r} is registered by both {existing.distribution or existing.plugin} "
                f"and {dist or plugin}; using {existing.distribution or existing.plugin} "
                f"(uninstall one, or set PERFLAB_DISABLE_PLUGINS)"
            )
            return
        self.engines[info.name] = EngineRecord(BoundedEngine(engine, plugin, self.deadline), plugin, dist, version)
        out.append(info.name)

    # ------------------------------------------------------------------ queries

    @property
    def broken(self) -> list[PluginRecord]:
        return [r for r in self.records if r.status not in FINE]

    def raise_if_broken(self) -> None:
        problems = [f"{r.distribution or r.name}: {r.error}" for r in self.broken] + self.errors
        if problems:
            raise PluginLoadError("plugin problems (strict mode): " + "; ".join(problems))

    def engine(self, name: str) -> EngineRecord:
        try:
            return self.engines[name]
        except KeyError:
            raise UnknownEngine(name, list(self.engines)) from None

    def engine_names(self) -> list[str]:
        return sorted(self.engines)


def load(strict: bool | None = None, **kw: Any) -> PluginManager:
    """The manager most commands use: built-ins plus every allowed entry point."""
    return PluginManager(strict=strict, **kw)


def module_plugin(name: str, **attrs: Any) -> ModuleType:
    """Build a throwaway module-plugin from functions (handy in tests)."""
    mod = ModuleType(name)
    for k, v in attrs.items():
        setattr(mod, k, v)
    return mod

