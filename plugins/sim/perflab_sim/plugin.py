"""perflab-sim's perflab plugin: how the simulator reaches the core, through hooks any plugin
could use (docs/writing-plugins.md). It registers no engine: the stand-ins it installs answer
to the real engines' plugins exactly as the real programs would."""

from __future__ import annotations

from collections.abc import Mapping

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
