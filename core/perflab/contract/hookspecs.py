"""The perflab plugin contract: every hook an engine or hardware plugin may implement.

This is the one file a plugin author needs to read. A plugin is an object (an instance, or a
module) with functions named like the specs below, decorated with :data:`perflab.hookimpl`,
exposed through an entry point in the group ``perflab``::

    # pyproject.toml of perflab-plugin-myengine
    [project.entry-points.perflab]
    myengine = "perflab_myengine:plugin"   # an instance of a perflab.EnginePlugin subclass

An engine is an object: an instance of a :class:`perflab.EnginePlugin` subclass
(:mod:`perflab.contract.plugin_base`) registered through :func:`perflab_register_engines`. The core
calls its plain methods directly (no hook takes an engine name, so no plugin guards one);
the base class brings defaults for version detection, device visibility, option refusal and
crash signatures. Hooks here are what is not one engine's: registration, hardware probes,
benchmark backends.

Conventions
-----------
* Values crossing the boundary are the frozen dataclasses of :mod:`perflab.contract.types`.
* Hooks and engine methods never import the engine (torch, vllm, ...) into perflab's
  process, never start processes except where a method says so, and never use ``shell=True``.
* A hook may omit trailing parameters it does not need: pluggy passes only the arguments an
  implementation names. An implementation naming a parameter that is not in the spec is
  reported as incompatible by ``perflab engines list``.
* Every call has a deadline (:data:`HOOK_DEADLINES_S`, per hook or engine method;
  ``PERFLAB_HOOK_DEADLINE_S`` lowers them all): it runs in a worker thread, and one still
  running at its deadline is abandoned and named as its plugin's fault. Return promptly;
  never block on the network or a process without a timeout of your own well inside the deadline.

Versioning
----------
:data:`HOOKSPEC_VERSION` is bumped on any change of a signature or meaning. Plugins may
declare the contract versions they support with an attribute ``PERFLAB_HOOKSPEC_VERSIONS =
(2,)`` (module level, or on the class: :class:`perflab.EnginePlugin` declares it); a plugin
declaring versions that exclude the core's is listed as incompatible and not used.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from perflab.contract.markers import PROJECT as PROJECT  # the entry-point group and marker name
from perflab.contract.markers import hookimpl as hookimpl  # plugins import it from here too
from perflab.contract.markers import hookspec

if TYPE_CHECKING:
    from perflab.contract.plugin_base import EnginePlugin
    from perflab.contract.types import Accelerator

#: 2: engines are objects (:class:`perflab.contract.plugin_base.EnginePlugin`) registered through
#: ``perflab_register_engines``; the ten hooks with an ``engine`` argument of version 1 are gone.
#: Compatible additions within 2: ``EnginePlugin.engine_versions`` (optional; None keeps the old
#: behaviour), and the ``version`` the engine methods receive may be one asked for
#: (``--engine-version``, a plan's ``engine_versions``) rather than the installed one.
HOOKSPEC_VERSION = 2

#: How long one call of each hook may take, in seconds. A call past its deadline is abandoned
#: (Python cannot kill a thread: it runs on in a daemon thread that ends with perflab) and
#: reported as that plugin's fault in one line (:class:`perflab.contract.errors.HookDeadlineExceeded`):
#: a question the core needed answered (``build_launch``) fails that launch; a hook
#: whose failure the core can absorb is skipped (a hardware probe becomes an error line); a
#: ``teardown`` past its deadline is a teardown leftover, which stops a study cleanly
#: after perflab's own process-tree teardown has run. Pure hooks get seconds; hooks that may
#: run a tool (``--version``, ``npu-smi``) or clean files get more.
HOOK_DEADLINES_S: Mapping[str, float] = MappingProxyType({
    "perflab_register_engines": 10.0,
    "perflab_probe_hardware": 30.0,
    "perflab_activate_hardware": 60.0,  # may write a tree of stand-in executables
    "perflab_register_bench_backends": 10.0,
    # the Engine methods the core calls (perflab.contract.plugin_base.EnginePlugin), by method name
    "version": 60.0,
    "check_support": 10.0,
    "build_launch": 10.0,
    "build_group_launch": 10.0,
    "readiness": 10.0,
    "classify_crash": 10.0,
    "teardown": 60.0,
    "describe_file": 10.0,
    "cache_reset": 10.0,
    "metrics": 10.0,
})
#: A hook missing from HOOK_DEADLINES_S (a test's, a deprecated one) gets this.
DEFAULT_HOOK_DEADLINE_S = 10.0
#: Set to a number of seconds: every hook's deadline is at most that (tests, an impatient CI).
DEADLINE_ENV = "PERFLAB_HOOK_DEADLINE_S"



# --------------------------------------------------------------------------- registration


@hookspec
def perflab_register_engines(register: Callable[[EnginePlugin], None]) -> None:
    """Register the engines this plugin provides, as objects.

    :param register: call it once per engine with an instance of a
        :class:`perflab.EnginePlugin` subclass (its ``info`` names the engine). The core
        then calls that object's methods directly (``version``, ``check_support``,
        ``build_launch``, ``build_group_launch``, ``readiness``, ``classify_crash``,
        ``teardown``, ``describe_file``, ``cache_reset``, ``metrics``), each under its
        deadline in :data:`HOOK_DEADLINES_S`. Registering a name another distribution already
        registered is an error that names both distributions; the second registration is ignored.
    :returns: nothing.

    Example::

        @hookimpl
        def perflab_register_engines(register):
            register(MyEngine())   # class MyEngine(EnginePlugin): info = EngineInfo(...)

    An :class:`~perflab.EnginePlugin` instance exposed as the entry point registers itself.
    """


# --------------------------------------------------------------------------- hardware


@hookspec
def perflab_probe_hardware(env: Mapping[str, str]) -> list[Accelerator] | None:
    """Return the accelerators of one family present on this machine.

    Called for every implementation; results are concatenated. A probe whose library or
    tool is missing returns ``None`` (or an empty list) — absence is not an error. A probe
    that finds the tool but fails to read it raises; the error is shown and the other probes
    still run.

    :param env: the environment to run tools with (``PATH`` decides which ``npu-smi``
        runs; in simulation it points at perflab's stand-ins).
    :returns: a list of :class:`~perflab.contract.types.Accelerator`, or ``None``.

    Example::

        @hookimpl
        def perflab_probe_hardware(env):
            exe = shutil.which("amd-smi", path=env.get("PATH"))
            if exe is None:
                return None
            out = subprocess.run([exe, "list", "--json"], env=dict(env), capture_output=True,
                                 text=True, timeout=10, check=True).stdout
            return [Accelerator(vendor="amd", kind="rocm", index=d["gpu"], name=...,
                                memory_total_mib=..., source="amd-smi") for d in json.loads(out)]
    """


@hookspec(firstresult=True)
def perflab_activate_hardware(spec: str, env: Mapping[str, str]) -> dict[str, str] | None:
    """Activate the hardware named by ``--hardware SPEC`` when ``spec`` is this plugin's own.

    perflab handles ``auto`` itself; any other spec (such as ``sim:a100-80g-x8``) is offered to
    the plugins, first answer wins. A plugin that owns the spec returns the environment to run
    the probes and engines under (a copy of ``env`` with its changes, e.g. stand-in executables
    first on ``PATH``); a plugin that does not returns ``None``. A spec nobody owns is a usage
    error naming the package that provides it (:data:`perflab.hardware.PROVIDERS`).

    :param spec: the ``--hardware`` value, e.g. ``"sim:a100-80g-x8"``.
    :param env: the environment perflab would otherwise run under.
    :returns: the environment to run under, or ``None``.

    Example::

        @hookimpl
        def perflab_activate_hardware(spec, env):
            if not spec.startswith("emu:"):
                return None
            return {**env, "PATH": f"{install_stand_ins(spec[4:])}:{env.get('PATH', '')}"}
    """


# --------------------------------------------------------------------------- benchmark backends


@hookspec
def perflab_register_bench_backends(register: Callable[[str, Any], None]) -> None:
    """Register an external benchmark driver usable instead of the built-in client.

    :param register: call ``register(name, driver)`` where ``driver`` is a callable
        ``driver(request: perflab.bench.BenchRequest) -> perflab.bench.BenchResult``
        (run in a worker thread; it may start subprocesses with argv lists).
    :returns: nothing.

    Example::

        @hookimpl
        def perflab_register_bench_backends(register):
            register("vllm-bench", run_vllm_bench_serve)
    """
