"""The vLLM-Ascend launch: vLLM's own ``vllm serve`` (perflab_vllm.launch) with the NPU device variable.

vLLM-Ascend is a vLLM platform plugin, so the command line is vLLM's (perflab_vllm's flag
table). What differs: NPUs are selected with ``ASCEND_RT_VISIBLE_DEVICES``
(``NPUPlatform.device_control_env_var`` in vllm_ascend/platform.py), ``--additional-config``
carries the Ascend-specific knobs (read by vllm_ascend/ascend_config.py), and
``--gpu-memory-utilization`` keeps its name on NPUs.
"""

from __future__ import annotations

from perflab_vllm.flags import VLLM_OPTIONS, EngineOption

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
