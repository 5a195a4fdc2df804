"""The perflab plugin contract: every hook an engine or hardware plugin may implement.

This is the one file a plugin author needs to read. A plugin is an object (an instance, or a
module) with functions named like the specs below, decorated with :data:`perflab.hookimpl`,
exposed through an entry point in the group ``perflab``::

    # pyproject.toml of perflab-plugin-myengine
    [project.entry-points.perflab]
    myengine = "perflab_myengine:plugin"   # an instance of a perflab.EnginePlugin subclass

An engine plugin is best written as a subclass of :class:`perflab.EnginePlugin`
(:mod:`perflab.plugin_base`): its hook implementations do the engine-name guard and call
plain methods without the ``engine`` argument, with defaults for version detection, device
visibility, option refusal and crash signatures. A module with these functions
(``myengine = "perflab_myengine"``) is contract v1 as well and keeps working.

Conventions
-----------
* Values crossing the boundary are the frozen dataclasses of :mod:`perflab.types`.
* Engine hooks receive ``engine`` (the registered name). A plugin answers only for the
  engines it registered and returns ``None`` otherwise; ``firstresult`` hooks then fall
  through to the plugin that owns the engine.
* Hooks never import the engine (torch, vllm, ...) into perflab's process, never start
  processes except where a hook says so, and never use ``shell=True``.
* A hook may omit trailing parameters it does not need: pluggy passes only the arguments an
  implementation names. An implementation naming a parameter that is not in the spec is
  reported as incompatible by ``perflab engines list``.
* Every call has a deadline (:data:`HOOK_DEADLINES_S`, per hook; ``PERFLAB_HOOK_DEADLINE_S``
  lowers them all): a hook runs in a worker thread, and one still running at its deadline is
  abandoned and named as its plugin's fault. Return promptly; never block on the network or
  a process without a timeout of your own well inside the deadline.

Versioning
----------
:data:`HOOKSPEC_VERSION` is bumped on any change of a signature or meaning. Plugins may
declare the contract versions they support with an attribute ``PERFLAB_HOOKSPEC_VERSIONS =
(1,)`` (module level, or on the class: :class:`perflab.EnginePlugin` declares it); a plugin
declaring versions that exclude the core's is listed as incompatible and not used. Adding an
optional hook (``perflab_describe_file``, ``perflab_cache_reset``, ``perflab_metrics_endpoint``,
``perflab_build_group_launch``) changes no existing signature and keeps the version.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from perflab.types import (
        Accelerator,
        CacheReset,
        CrashCause,
        EngineInfo,
        HardwareSnapshot,
        LaunchSpec,
        MetricsEndpoint,
        NodeGroup,
        Readiness,
        ServeConfig,
        Unsupported,
    )

PROJECT = "perflab"
HOOKSPEC_VERSION = 1

#: How long one call of each hook may take, in seconds. A call past its deadline is abandoned
#: (Python cannot kill a thread: it runs on in a daemon thread that ends with perflab) and
#: reported as that plugin's fault in one line (:class:`perflab.errors.HookDeadlineExceeded`):
#: a question the core needed answered (``perflab_build_launch``) fails that launch; a hook
#: whose failure the core can absorb is skipped (a hardware probe becomes an error line); a
#: ``perflab_teardown`` past its deadline is a teardown leftover, which stops a study cleanly
#: after perflab's own process-tree teardown has run. Pure hooks get seconds; hooks that may
#: run a tool (``--version``, ``npu-smi``) or clean files get more.
HOOK_DEADLINES_S: Mapping[str, float] = MappingProxyType({
    "perflab_register_engines": 10.0,
    "perflab_probe_hardware": 30.0,
    "perflab_activate_hardware": 60.0,  # may write a tree of stand-in executables
    "perflab_engine_version": 60.0,
    "perflab_check_support": 10.0,
    "perflab_build_launch": 10.0,
    "perflab_build_group_launch": 10.0,
    "perflab_readiness": 10.0,
    "perflab_classify_crash": 10.0,
    "perflab_teardown": 60.0,
    "perflab_describe_file": 10.0,
    "perflab_cache_reset": 10.0,
    "perflab_metrics_endpoint": 10.0,
    "perflab_register_bench_backends": 10.0,
})
#: A hook missing from HOOK_DEADLINES_S (a test's, a deprecated one) gets this.
DEFAULT_HOOK_DEADLINE_S = 10.0
#: Set to a number of seconds: every hook's deadline is at most that (tests, an impatient CI).
DEADLINE_ENV = "PERFLAB_HOOK_DEADLINE_S"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


# --------------------------------------------------------------------------- registration


@hookspec
def perflab_register_engines(register: Callable[[EngineInfo], None]) -> None:
    """Register the engines this plugin provides.

    :param register: call it once per engine with an :class:`~perflab.types.EngineInfo`.
        Registering a name another distribution already registered is an error that names
        both distributions; the second registration is ignored.
    :returns: nothing.

    Example::

        @hookimpl
        def perflab_register_engines(register):
            register(EngineInfo(name="vllm", display_name="vLLM", accelerators=("cuda",),
                                executable="vllm", distributions=("vllm",)))
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
    :returns: a list of :class:`~perflab.types.Accelerator`, or ``None``.

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


# --------------------------------------------------------------------------- version


@hookspec(firstresult=True)
def perflab_engine_version(engine: str, env: Mapping[str, str]) -> str | None:
    """Return the installed version of ``engine``, or ``None`` if it is not installed.

    Must not import the engine: read package metadata (``importlib.metadata.version``),
    a version file, or run the engine's executable with ``--version`` (argv list, short
    timeout) found on ``env["PATH"]``.

    :param engine: the registered engine name.
    :param env: environment whose ``PATH`` locates the executable.
    :returns: a version string such as ``"0.11.0"``, or ``None``.

    Example::

        @hookimpl
        def perflab_engine_version(engine, env):
            if engine != "vllm":
                return None
            try:
                return importlib.metadata.version("vllm")
            except importlib.metadata.PackageNotFoundError:
                return None
    """


# --------------------------------------------------------------------------- preflight


@hookspec
def perflab_check_support(
    engine: str,
    config: ServeConfig,
    hardware: HardwareSnapshot,
    version: str | None,
) -> list[Unsupported] | None:
    """Say, before anything is launched, why ``config`` cannot work on ``hardware``.

    Called for every implementation (a hardware plugin may veto too); reasons are
    concatenated. ``severity="error"`` refuses the launch (``--force`` overrides);
    ``severity="warning"`` is shown and recorded. Options the engine cannot express at all
    belong here too, so nothing is silently dropped.

    :param engine: the registered engine name.
    :param config: the serving options.
    :param hardware: the probed (or simulated) accelerators.
    :param version: the engine version if known, for version-dependent knowledge.
    :returns: a list of :class:`~perflab.types.Unsupported` (empty or ``None``: no objection).

    Example::

        @hookimpl
        def perflab_check_support(engine, config, hardware):
            if engine == "sglang" and config.quantization == "fp8":
                old = [a for a in hardware.of_kind("cuda") if a.sm < 89]
                if old:
                    return [Unsupported("quantization=fp8", f"{old[0].name} is SM{old[0].sm}; "
                            "SGLang's FP8 kernels need SM89+", source="https://...")]
            return None
    """


# --------------------------------------------------------------------------- launch


@hookspec(firstresult=True)
def perflab_build_launch(
    engine: str,
    config: ServeConfig,
    hardware: HardwareSnapshot,
    workdir: Path,
    version: str | None,
) -> LaunchSpec | None:
    """Build the exact command that serves ``config`` with ``engine``.

    Pure: writes nothing, starts nothing. Files the engine needs (MindIE's config.json) are
    returned in ``LaunchSpec.files`` and written by the supervisor under ``workdir``.
    ``config.port`` is always set when this is called; host and port must appear explicitly
    in the argv or files. Raise :class:`perflab.errors.UnsupportedOption` for an option the
    engine cannot express.

    :param engine: the registered engine name.
    :param config: the serving options (port already chosen).
    :param hardware: the accelerators; ``config.devices`` selects among them.
    :param workdir: the run directory (for config files, caches).
    :param version: the engine version if known.
    :returns: a :class:`~perflab.types.LaunchSpec`, or ``None`` for engines not yours.

    Example::

        @hookimpl
        def perflab_build_launch(engine, config, hardware, workdir):
            if engine != "vllm":
                return None
            argv = ["vllm", "serve", config.model, "--host", config.host, "--port", str(config.port)]
            if config.tp:
                argv += ["-tp", str(config.tp)]
            return LaunchSpec(engine="vllm", argv=tuple(argv), host=config.host,
                              port=config.port, served_model_name=config.name)
    """


# --------------------------------------------------------------------------- multi-node launch


@hookspec(firstresult=True)
def perflab_build_group_launch(
    engine: str,
    config: ServeConfig,
    hardware: HardwareSnapshot,
    group: NodeGroup,
    workdir: Path,
    version: str | None,
) -> list[LaunchSpec] | None:
    """Build one launch per node rank for an engine that spans several nodes (``config.nodes``).

    Pure, like :func:`perflab_build_launch`. Element ``r`` is what node ``group.nodes[r]``
    runs; element 0 serves HTTP on ``config.host:config.port`` and is the only one probed for
    readiness; the others join rank 0 at ``group.serving.address:group.rendezvous_port``. Each
    rank's devices are ``group.nodes[r].devices`` (set the visible-devices variable from them).
    ``config.tp``/``pp``/``dp`` are the whole group's sizes. The core runs every rank as one
    group: any rank dying crashes the group and every rank is torn down. Optional: added in
    contract v1 without changing any existing signature, so :data:`HOOKSPEC_VERSION` stays 1;
    an engine without it is refused for ``nodes`` above 1.

    :param engine: the registered engine name.
    :param config: the serving options (port already chosen; ``nodes`` = ``group.size``).
    :param hardware: the accelerators of one node.
    :param group: the nodes (rank, address, devices) and the rendezvous port.
    :param workdir: the run directory.
    :param version: the engine version if known.
    :returns: ``group.size`` :class:`~perflab.types.LaunchSpec` in rank order, or ``None``
        for engines not yours.

    Example::

        @hookimpl
        def perflab_build_group_launch(engine, config, hardware, group, workdir):
            if engine != "sglang":
                return None
            head = f"{group.serving.address}:{group.rendezvous_port}"
            return [LaunchSpec(engine="sglang", argv=(*base_argv(config), "--nnodes", str(group.size),
                               "--node-rank", str(n.rank), "--dist-init-addr", head), ...)
                    for n in group.nodes]
    """


# --------------------------------------------------------------------------- readiness


@hookspec(firstresult=True)
def perflab_readiness(engine: str, launch: LaunchSpec) -> Readiness | None:
    """Say how to tell that the launched engine really serves.

    :param engine: the registered engine name.
    :param launch: the spec being started (ports, served model name).
    :returns: a :class:`~perflab.types.Readiness`: HTTP probes that must answer 2xx, the
        path of a one-token generation probe, the engine's ready log line (informative),
        a startup timeout, and optionally ``served_version_check``: an async
        ``check(base_url, detected_version)`` the supervisor awaits once the engine is ready,
        returning a one-line warning when the engine serves another version than the one
        detected (vLLM: ``GET /version``). ``None`` for engines not yours (the core's default
        is ``GET /health`` then a one-token ``/v1/completions``).

    Example::

        @hookimpl
        def perflab_readiness(engine, launch):
            if engine == "sglang":
                return Readiness(http=(HttpProbe("/health"), HttpProbe("/v1/models")),
                                 ready_log_patterns=(r"The server is fired up and ready to roll!",))
    """


# --------------------------------------------------------------------------- crashes


@hookspec(firstresult=True)
def perflab_classify_crash(
    engine: str,
    exit_code: int | None,
    log_tail: str,
) -> CrashCause | None:
    """Name why the engine died (or is dying) from its exit code and the end of its log.

    Called when the process exits before being ready or while serving, and on log lines
    matching a fatal pattern. Prefer the *first* root cause in the log over the last
    wrapper error (vLLM's "Engine core initialization failed" hides the real one earlier).

    :param engine: the registered engine name.
    :param exit_code: the process exit code (negative: killed by that signal), or ``None`` if
        it is still running (its health checks failed, or readiness gave up).
    :param log_tail: the engine's combined stdout/stderr: every notable (non-INFO/DEBUG) line
        of the whole output as it streamed, merged in log order with the last 400 lines
        (see :func:`perflab.crashes.is_notable`). Match with
        :func:`perflab.crashes.earliest_line` / :func:`~perflab.crashes.first_signature`,
        which skip INFO lines and traceback source lines.
    :returns: a :class:`~perflab.types.CrashCause`, or ``None`` if unknown (the core then
        reports a generic "exited with code N" cause with the last error-looking line).

    Example::

        @hookimpl
        def perflab_classify_crash(engine, exit_code, log_tail):
            if engine == "trtllm" and "KeyError: 'weight'" in log_tail:
                return CrashCause("checkpoint-key-missing", "The checkpoint lacks a layer TensorRT-LLM expects.",
                                  line="KeyError: 'weight'", hint="Use the unquantized model or a supported quantization.")
    """


# --------------------------------------------------------------------------- teardown


@hookspec
def perflab_teardown(engine: str, launch: LaunchSpec, workdir: Path) -> None:
    """Clean up what the engine leaves behind after its process group is gone.

    The core already signals the whole process group and every descendant, reaps them, and
    checks that the ports are free; this hook is for the rest (shared-memory segments, lock
    files, IPC sockets in ``/tmp``). Called for every implementation, even after a crash.
    Must not raise for engines not yours.

    :param engine: the registered engine name.
    :param launch: the spec that was started.
    :param workdir: the run directory.
    :returns: nothing.

    Example::

        @hookimpl
        def perflab_teardown(engine, launch, workdir):
            if engine == "mindie":
                for p in Path("/dev/shm").glob("mindie_*"):
                    p.unlink(missing_ok=True)
    """


# --------------------------------------------------------------------------- serving script


@hookspec(firstresult=True)
def perflab_describe_file(engine: str, path: str, content: str) -> list[str] | None:
    """Say what a file of ``LaunchSpec.files`` sets, for the recommended serving script.

    The lab's "Serving script" box must not point into a study directory, so a config file the
    plugin wrote (MindIE's config.json) is shown by what it sets, one line each. Optional:
    added in contract v1 without changing any existing signature, so
    :data:`HOOKSPEC_VERSION` stays 1; without an answer the script says the file was written
    by perflab.

    :param engine: the registered engine name.
    :param path: the file's path as in :class:`~perflab.types.FileSpec`.
    :param content: the file's content.
    :returns: the lines to show (``Key.Path = value``), or ``None`` for files (or engines)
        not yours.

    Example::

        @hookimpl
        def perflab_describe_file(engine, path, content):
            if engine != "mindie" or Path(path).name != "config.json":
                return None
            return [f"{k} = {json.dumps(v)}" for k, v in changed_keys(json.loads(content)).items()]
    """


# --------------------------------------------------------------------------- cache state


@hookspec(firstresult=True)
def perflab_cache_reset(engine: str, launch: LaunchSpec) -> CacheReset | None:
    """Say how to empty the engine's prefix cache, so that one measurement cannot warm the next.

    The lab sends it on the serving port before each measured benchmark of a launch (after the
    first one too: the readiness probe's prompt is cached). A failed reset is a warning in the
    study log, never a failure of the configuration. Optional: added in contract v1 without
    changing any existing signature, so :data:`HOOKSPEC_VERSION` stays 1; without an answer
    the engine is not reset. :class:`perflab.EnginePlugin` answers its class attribute
    ``prefix_cache_reset``.

    :param engine: the registered engine name.
    :param launch: the spec that was started (its ``env`` says whether a conditional path is
        registered).
    :returns: a :class:`~perflab.types.CacheReset` (method, path, the JSON field that must be
        true, a hint for a 404), or ``None`` when the engine cannot reset its cache over HTTP.

    Example::

        @hookimpl
        def perflab_cache_reset(engine, launch):
            if engine != "sglang":
                return None
            # python/sglang/srt/entrypoints/http_server.py: GET/POST /flush_cache, 400 while busy
            return CacheReset("/flush_cache", source="https://github.com/sgl-project/sglang/...")
    """


# --------------------------------------------------------------------------- engine metrics


@hookspec(firstresult=True)
def perflab_metrics_endpoint(engine: str, launch: LaunchSpec) -> MetricsEndpoint | None:
    """Say where the engine serves its Prometheus metrics and which names mean what.

    The lab scrapes it about every engine second of every measured benchmark (every replica of
    the launch), keeps the time series in the run directory and summarizes KV-cache usage,
    running and waiting requests, preemptions, prefix-cache hit rate and speculative-decoding
    acceptance as the measurement's ``server_metrics`` (:mod:`perflab.observe.metrics`). A
    failed scrape is logged once, never a failure of the measurement. Optional: added in
    contract v1 without changing any existing signature, so :data:`HOOKSPEC_VERSION` stays 1;
    without an answer nothing is scraped. :class:`perflab.EnginePlugin` answers its class
    attribute ``metrics_endpoint``.

    :param engine: the registered engine name.
    :param launch: the spec that was started (a metrics port of its own is read from it).
    :returns: a :class:`~perflab.types.MetricsEndpoint` (path, port when not the serving port,
        the engine's names for each role, the source of those names), or ``None`` when the
        engine serves no Prometheus metrics.

    Example::

        @hookimpl
        def perflab_metrics_endpoint(engine, launch):
            if engine != "sglang":
                return None
            # python/sglang/srt/metrics/collector.py (SchedulerMetricsCollector)
            return MetricsEndpoint("/metrics", running="sglang:num_running_reqs",
                                   kv_cache_usage="sglang:token_usage", source="https://github.com/...")
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
