"""perflab-sim's perflab plugin: how the simulator reaches the core, through hooks any plugin
could use (docs/writing-plugins.md). It registers no engine: the stand-ins it installs answer
to the real engines' plugins exactly as the real programs would."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from perflab import hookimpl

#: the --hardware prefix this plugin owns
PREFIX = "sim:"


@hookimpl
def perflab_activate_hardware(spec: str, env: Mapping[str, str]) -> dict[str, str] | None:
    """``sim:NAME``: the environment that runs the simulated machine NAME; other specs: None."""
    if not spec.startswith(PREFIX):
        return None
    import perflab_sim  # the simulator loads only when a simulated machine is asked for

    return perflab_sim.activate(spec[len(PREFIX):], env)


def device_clock(env: Mapping[str, str], devices: Sequence[int]) -> float | None:
    """:data:`perflab.hardware.standins.DEVICE_CLOCK_ENV`: the simulated engines' model time."""
    from perflab_sim import load, state

    return load.model_time(state.state_dir(env), devices)


def device_memory(env: Mapping[str, str], devices: Sequence[int]) -> list[tuple[int, int, str, int]]:
    """:data:`perflab.hardware.standins.DEVICE_MEMORY_ENV`: the simulated device-memory registry."""
    from perflab_sim import state

    out = []
    for h in state.holders(state.state_dir(env)):
        for d in devices:
            mib = h.on(d)
            if mib:
                out.append((d, h.pid, h.name, mib))
    return out
