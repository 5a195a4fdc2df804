"""Calling the engine hooks with the core's defaults and checks around them.

Everything that asks a plugin something about an engine goes through here, so the
supervisor, the CLI and the lab get the same answers (and the same errors).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from perflab.errors import PerflabError, UsageError
from perflab.plugins import PluginManager
from perflab.types import (
    CrashCause,
    HardwareSnapshot,
    HttpProbe,
    LaunchSpec,
    MetricsEndpoint,
    Readiness,
    ServeConfig,
    Unsupported,
)

DEFAULT_READINESS = Readiness(http=(HttpProbe("/health"),), generation_path="/v1/completions")


def engine_version(pm: PluginManager, engine: str, env: Mapping[str, str]) -> str | None:
    pm.engine(engine)
    return pm.hook.perflab_engine_version(engine=engine, env=env)


def metrics_endpoint(pm: PluginManager, engine: str, launch: LaunchSpec) -> MetricsEndpoint | None:
    """Where ``launch`` serves its Prometheus metrics (the optional ``perflab_metrics_endpoint``
    hook); None when the engine's plugin names none (nothing is scraped)."""
    answer = pm.hook.perflab_metrics_endpoint(engine=engine, launch=launch)
    if answer is not None and not isinstance(answer, MetricsEndpoint):
        raise PerflabError(f"the {engine} plugin's perflab_metrics_endpoint returned {type(answer).__name__}, not a MetricsEndpoint")
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
    if config.world_size > available:
        out.append(
            Unsupported(
                "parallel size",
                f"tp×pp×dp = {config.tp or 1}×{config.pp or 1}×{config.dp or 1} = {config.world_size} "
                f"needs {config.world_size} devices, {available} available",
                source="perflab",
            )
        )
    return out


def check_support(
    pm: PluginManager,
    engine: str,
    config: ServeConfig,
    hardware: HardwareSnapshot,
    version: str | None,
) -> list[Unsupported]:
    """Every objection, the core's first, then each plugin's (all implementations)."""
    out = core_checks(pm, engine, config, hardware)
    for answer in pm.hook.perflab_check_support(engine=engine, config=config, hardware=hardware, version=version):
        out.extend(answer or [])
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
    if config.port is None:
        config = config.replace(port=rec.info.default_port)
    spec = pm.hook.perflab_build_launch(
        engine=engine, config=config, hardware=hardware, workdir=workdir, version=version
    )
    if spec is None:
        raise PerflabError(
            f"plugin {rec.distribution or rec.plugin} registered engine {engine!r} but built no launch for it"
        )
    if not isinstance(spec, LaunchSpec) or not spec.argv or not all(isinstance(a, str) for a in spec.argv):
        raise PerflabError(f"plugin {rec.distribution or rec.plugin} returned an invalid launch spec for {engine!r}")
    return spec


def readiness(pm: PluginManager, engine: str, launch: LaunchSpec) -> Readiness:
    return pm.hook.perflab_readiness(engine=engine, launch=launch) or DEFAULT_READINESS


def classify_crash(pm: PluginManager, engine: str, exit_code: int | None, log_tail: str) -> CrashCause:
    """The plugin's named cause (noting a death by signal), or the core's: ``killed-by-signal``
    for a signal, else ``unknown`` quoting the first exception line (see perflab.crashes)."""
    from perflab.crashes import fallback_cause, with_signal

    cause = pm.hook.perflab_classify_crash(engine=engine, exit_code=exit_code, log_tail=log_tail)
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
