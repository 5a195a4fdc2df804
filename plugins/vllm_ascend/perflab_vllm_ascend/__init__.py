"""perflab engine plugin for vLLM-Ascend (``vllm serve`` on Huawei Ascend NPUs).

Builds on perflab_vllm: vLLM-Ascend is a vLLM platform plugin with vLLM's own command line,
so the plugin is perflab_vllm's with another name, device variable, options table, preflight
and crash causes. Import-light: only perflab's types (and perflab_vllm's light module) at
import time, the plugin's modules inside the methods.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from perflab import CrashCause, EngineInfo, HardwareSnapshot, Maps, ServeConfig, Unsupported
from perflab_vllm import VLLM, VLLM_SERVE_OPTIONS

if TYPE_CHECKING:
    from perflab_vllm.flags import EngineOption

ENGINE = "vllm-ascend"
PLATFORM = "https://github.com/vllm-project/vllm-ascend/blob/v0.11.0rc2/vllm_ascend/platform.py"

# Installed only when the environment that runs `vllm` has a vllm-ascend distribution: any
# vLLM on PATH (a CUDA or CPU build) is not vLLM-Ascend. dist-info names are normalised
# (vllm_ascend-X.dist-info).
INFO = EngineInfo(name=ENGINE, display_name="vLLM-Ascend", accelerators=("ascend",), executable="vllm",
                  description="vLLM with the vLLM-Ascend platform plugin (vllm serve) on Huawei Ascend NPUs",
                  distributions=("vllm-ascend",), homepage="https://docs.vllm.ai/projects/ascend", default_port=8000)


class VLLMAscend(VLLM):
    info = INFO
    # NPUPlatform.device_control_env_var (vllm_ascend/platform.py)
    visible_devices_env = "ASCEND_RT_VISIBLE_DEVICES"
    serve_options = {
        **VLLM_SERVE_OPTIONS,
        "devices": Maps("ASCEND_RT_VISIBLE_DEVICES", PLATFORM),
        "options": Maps("perflab_vllm's options plus additional_config (--additional-config)",
                        "https://github.com/vllm-project/vllm-ascend/blob/v0.11.0rc2/vllm_ascend/ascend_config.py"),
    }

    def engine_options(self) -> Sequence[EngineOption]:
        from perflab_vllm_ascend.launch import ASCEND_OPTIONS

        return ASCEND_OPTIONS

    def device_variable(self, hardware: HardwareSnapshot) -> str | None:
        return self.visible_devices_env

    def check_support(self, config: ServeConfig, hardware: HardwareSnapshot, version: str | None) -> list[Unsupported]:
        from perflab_vllm_ascend.support import check_support

        return [*self.refused(config), *check_support(self.info.name, config, hardware, version)]

    def classify_crash(self, exit_code: int | None, log_tail: str) -> CrashCause | None:
        from perflab_vllm_ascend.crashes import classify_ascend

        return classify_ascend(log_tail)


plugin = VLLMAscend()
