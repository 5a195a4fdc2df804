"""The vLLM-Ascend launch: vLLM's own ``vllm serve`` with the NPU device variable.

vLLM-Ascend is a vLLM platform plugin, so the command line is vLLM's (perflab_vllm's flag
table). What differs: NPUs are selected with ``ASCEND_RT_VISIBLE_DEVICES``
(``NPUPlatform.device_control_env_var`` in vllm_ascend/platform.py), ``--additional-config``
carries the Ascend-specific knobs (read by vllm_ascend/ascend_config.py), and
``--gpu-memory-utilization`` keeps its name on NPUs.
"""

from __future__ import annotations

from perflab.types import LaunchSpec, Readiness, ServeConfig
from perflab_vllm.flags import VLLM_OPTIONS, EngineOption, device_env, serve_argv
from perflab_vllm.launch import READINESS as VLLM_READINESS

ENGINE = "vllm-ascend"
DEVICE_VARIABLE = "ASCEND_RT_VISIBLE_DEVICES"
ASCEND_CONFIG = "https://github.com/vllm-project/vllm-ascend/blob/v0.11.0rc2/vllm_ascend/ascend_config.py"

#: vLLM's engine options plus the Ascend knob vLLM passes through to the platform plugin.
ASCEND_OPTIONS: tuple[EngineOption, ...] = (
    *VLLM_OPTIONS,
    EngineOption(
        "additional_config",
        "--additional-config",
        "json",
        "vLLM-Ascend's own settings, e.g. {\"pa_shape_list\":[48,64,72,80]}",
        source=ASCEND_CONFIG,
    ),
)

#: Same API server, same probes and ready lines as vLLM.
READINESS: Readiness = VLLM_READINESS


def build_launch(config: ServeConfig) -> LaunchSpec:
    argv, warnings = serve_argv(ENGINE, config, ASCEND_OPTIONS)
    return LaunchSpec(
        engine=ENGINE,
        argv=tuple(argv),
        host=config.host,
        port=int(config.port or 0),
        served_model_name=config.name,
        env=device_env(config, DEVICE_VARIABLE),
        warnings=tuple(warnings),
    )
