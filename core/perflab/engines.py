"""Calling the engine hooks with the core's defaults and checks around them.

Everything that asks a plugin something about an engine goes through here, so the
supervisor, the CLI and the lab get the same answers (and the same errors).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path

from perflab.contract.errors import PerflabError, UnsupportedOption, UsageError
from perflab.contract.plugin_base import address_tokens
from perflab.contract.types import (
    CrashCause,
    HardwareSnapshot,
    HttpProbe,
    LaunchSpec,
    MetricsEndpoint,
    NodeGroup,
    Readiness,
    ServeConfig,
    Unsupported,
)
from perflab.plugins import PluginManager

DEFAULT_READINESS = Readiness(http=(HttpProbe("/health"),), generation_path="/v1/completions")


def engine_version(pm: PluginManager, engine: str, env: Mapping[str, str]) -> str | None:
    return pm.engine(engine).engine.version(env)


def metrics_endpoint(pm: PluginManager, engine: str, launch: LaunchSpec) -> MetricsEndpoint | None:
    """Where ``launch`` serves its Prometheus metrics (the engine's optional ``metrics``); None
    when the engine names none or is not registered (nothing is scraped)."""
    rec = pm.engines.get(engine)
    answer = rec.engine.metrics(launch) if rec is not None else None
    if answer is not None and not isinstance(answer, MetricsEndpoint):
        raise PerflabError(f"the {engine} plugin's metrics() returned {type(answer).__name__}, not a MetricsEndpoint")
    return answer


def core_checks(pm: PluginManager, engine: str, config: ServeConfig, hardware: HardwareSnapshot) -> list[Unsupported]:
    """Checks that hold for every engine: enough devices for the parallel sizes asked."""
    info = pm.engine(engine).info
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


GROUP_HOOK = "build_group_launch"


def spans_nodes(pm: PluginManager, engine: str) -> bool:
    """Whether ``engine`` builds multi-node launches (overrides :data:`GROUP_HOOK`)."""
    return bool(pm.engine(engine).engine.spans_nodes())


def nodes_refusal(pm: PluginManager, engine: str, config: ServeConfig) -> list[Unsupported]:
    """The one-line refusal of ``nodes`` above 1 for an engine whose plugin has no group launch."""
    if config.node_count <= 1 or spans_nodes(pm, engine):
        return []
    info = pm.engine(engine).info
    return [Unsupported(f"nodes={config.nodes}",
                        f"{info.display_name} runs on one node in perflab: its plugin has no multi-node launch ({GROUP_HOOK})",
                        source="perflab")]


def check_support(
    pm: PluginManager,
    engine: str,
    config: ServeConfig,
    hardware: HardwareSnapshot,
    version: str | None,
) -> list[Unsupported]:
    """Every objection, the core's first, then the engine's."""
    out = [*nodes_refusal(pm, engine, config), *core_checks(pm, engine, config, hardware)]
    out.extend(pm.engine(engine).engine.check_support(config, hardware, version) or [])
    return out


def owned_flags(pm: PluginManager, engine: str) -> tuple[str, ...]:
    """What perflab sets itself for every launch of ``engine``, so extra arguments may not: the
    plugin's ``address_flags`` (host and port, which perflab chooses and probes) and
    ``owned_args`` (MindIE's ``ServerConfig.port``: its extra arguments are config.json overrides)."""
    obj = pm.engine(engine).engine
    return (*obj.address_flags, *obj.owned_args)


def owned_flag_problems(pm: PluginManager, engine: str, extra_args: tuple[str, ...] | list[str]) -> list[str]:
    """One line per extra argument that sets a flag perflab owns for ``engine`` (``--port=18555``:
    the engine would serve on another port than the one perflab chose and waits on)."""
    owned = owned_flags(pm, engine)
    out = []
    for arg in extra_args:
        name = arg.split("=", 1)[0]  # '--port=1' and '--port' '1' alike; 'ServerConfig.port=1'
        if name in owned:
            out.append(f"extra argument {arg!r}: perflab sets {name} itself for {engine} "
                       f"(it chooses the address it waits on); remove it")
    return out


def build_launch(
    pm: PluginManager,
    engine: str,
    config: ServeConfig,
    hardware: HardwareSnapshot,
    workdir: Path,
    version: str | None,
) -> LaunchSpec:
    rec = pm.engine(engine)
    problems = owned_flag_problems(pm, engine, config.extra_args)
    if problems:  # every engine, not only those whose plugin checks: the same refusal as a plan's
        raise UsageError("; ".join(problems))
    if config.port is None:
        config = config.replace(port=rec.info.default_port)
    spec = rec.engine.build_launch(config, hardware, workdir, version)
    if spec is None:
        raise PerflabError(
            f"plugin {rec.distribution or rec.plugin} registered engine {engine!r} but built no launch for it"
        )
    if not isinstance(spec, LaunchSpec) or not spec.argv or not all(isinstance(a, str) for a in spec.argv):
        raise PerflabError(f"plugin {rec.distribution or rec.plugin} returned an invalid launch spec for {engine!r}")
    return with_address(spec, rec.engine.address_flags)


def with_address(spec: LaunchSpec, flags: tuple[str, ...]) -> LaunchSpec:
    """``spec`` with its ``address_args`` read from the argv's ``flags`` when the engine set none
    (the serving script leaves those tokens out)."""
    if not flags or spec.address_args:
        return spec
    return dataclasses.replace(spec, address_args=address_tokens(spec.argv, flags))


def readiness(pm: PluginManager, engine: str, launch: LaunchSpec) -> Readiness:
    rec = pm.engines.get(engine)  # not registered (a launch replayed without its plugin): the default
    return (rec.engine.readiness(launch) if rec is not None else None) or DEFAULT_READINESS


def classify_crash(pm: PluginManager, engine: str, exit_code: int | None, log_tail: str) -> CrashCause:
    """The plugin's named cause (noting a death by signal), or the core's: ``killed-by-signal``
    for a signal, else ``unknown`` quoting the first exception line (see perflab.contract.crashes)."""
    from perflab.contract.crashes import fallback_cause, with_signal

    rec = pm.engines.get(engine)
    cause = rec.engine.classify_crash(exit_code, log_tail) if rec is not None else None
    if cause is not None:
        return with_signal(cause, exit_code)
    return fallback_cause(exit_code, log_tail)


def parse_env_pairs(pairs: tuple[str, ...] | list[str], what: str = "--env") -> dict[str, str]:
    out: dict[str, str] = {}
    for p in pairs:
        key, sep, value = p.partition("=")
        if not sep or not key:
            raise UsageError(f"{what} {p!r}: expected KEY=VALUE")
        out[key] = value
    return out


def build_group_launch(
    pm: PluginManager,
    engine: str,
    config: ServeConfig,
    hardware: HardwareSnapshot,
    group: NodeGroup,
    workdir: Path,
    version: str | None,
) -> list[LaunchSpec]:
    """One launch per rank of ``group`` (the plugin's :data:`GROUP_HOOK`); UnsupportedOption
    when the engine has none."""
    rec = pm.engine(engine)
    specs = rec.engine.build_group_launch(config, hardware, group, workdir, version)
    if specs is None:
        raise UnsupportedOption(engine, f"nodes={group.size}", f"its plugin has no multi-node launch ({GROUP_HOOK})")
    specs = list(specs)
    if len(specs) != group.size or not all(isinstance(s, LaunchSpec) and s.argv for s in specs):
        raise PerflabError(f"plugin {rec.distribution or rec.plugin} returned no valid launch per rank of a "
                           f"{group.size}-node group for {engine!r}")
    return [with_address(s, rec.engine.address_flags) for s in specs]
