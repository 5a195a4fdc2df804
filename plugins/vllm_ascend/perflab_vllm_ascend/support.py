"""What vLLM-Ascend cannot do on the given NPUs, known before launching it.

Version-aware where the engine changed: the quantization methods ``NPUPlatform`` accepts, and
the FlashComm v1 switch (renamed in v0.11.0rc1, removed after the v0.26.0 series).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from packaging.version import Version

from perflab.contract.types import HardwareSnapshot, ServeConfig, Unsupported
from perflab_vllm.support import fp8_checkpoint_by_name, option_problems, parse_version
from perflab_vllm_ascend.launch import ASCEND_OPTIONS

REPO = "https://github.com/vllm-project/vllm-ascend"
PLATFORM = f"{REPO}/blob/main/vllm_ascend/platform.py"

#: The first version from main after the releases/v0.26.0rc branch: the v0.26.0 series
#: (rc's, final, posts) is cut from that branch; anything newer comes from main.
AFTER_0_26_SERIES = Version("0.26.1.dev0")

#: ``NPUPlatform.supported_quantization`` by release (vllm_ascend/platform.py at each tag);
#: vLLM refuses any other method on NPUs with "<method> quantization is currently not
#: supported in npu" (vllm/platforms/interface.py, verify_quantization).
QUANTIZATION_SINCE: Mapping[str, Version] = {
    "ascend": Version("0.0"),  # ModelSlim W8A8/W4A8 checkpoints (--quantization ascend)
    "compressed-tensors": Version("0.12.0rc1"),
    "fp8": Version("0.21.0rc1"),  # added for DeepSeek-V4 on Ascend 950 (vllm-ascend#9757)
    "deepseek_v4_fp8": Version("0.21.0rc1"),
    "mxfp8": AFTER_0_26_SERIES,  # on main, not in releases/v0.26.0rc
    "modelopt_mxfp8": AFTER_0_26_SERIES,
}
FP8_METHODS = frozenset({"fp8", "deepseek_v4_fp8", "mxfp8", "modelopt_mxfp8"})

#: Atlas A2 (910B), A3 (910_93) and 310P NPUs have no FP8 data path; FP8 needs Ascend 950 (A5).
#: Maintainer: "for FP8 you will need the A5, for A2/A3 it's a no go" (vllm-ascend#1526);
#: --kv-cache-dtype fp8 crashes on 910B2, "FP8 is not support in A3" (vllm-ascend#8102).
NO_FP8_CHIP = re.compile(r"^(?:Ascend)?\s*(?:910|310)", re.IGNORECASE)
FP8_SOURCES = f"{REPO}/issues/1526, {REPO}/issues/8102"

FLASHCOMM1 = "VLLM_ASCEND_ENABLE_FLASHCOMM1"
#: v0.9.1 .. v0.11.0rc0 read VLLM_ASCEND_ENABLE_FLASHCOMM; vllm-ascend#3334 renamed it.
FLASHCOMM1_SINCE = Version("0.11.0rc1")
#: Removed by "[Refactor] remove FlashComm v1" (vllm-ascend#13946, merged to main 2026-08-21,
#: commit 92616f3a). releases/v0.26.0rc still reads the variable, so the first release without
#: it is the first one after the v0.26.0 series. From then on vllm_ascend/ascend_config.py only
#: warns "FlashComm is deprecated; remove enable_flashcomm1 and VLLM_ASCEND_ENABLE_FLASHCOMM1
#: from the configuration. Use upstream configuration instead".
FLASHCOMM1_REMOVED_IN = AFTER_0_26_SERIES
FLASHCOMM1_REMOVAL_SOURCE = f"{REPO}/pull/13946"


def _chips(config: ServeConfig, hardware: HardwareSnapshot) -> list[str]:
    return [a.chip or a.name for a in hardware.select(config.devices, "ascend")]


def quantization_problems(config: ServeConfig, version: Version | None, raw_version: str | None) -> list[Unsupported]:
    q = config.quantization
    if q is None:
        return []
    since = QUANTIZATION_SINCE.get(q)
    if since is None:
        known = ", ".join(QUANTIZATION_SINCE)
        return [Unsupported(f"quantization={q}", f"vLLM-Ascend accepts only {known}; vLLM refuses "
                            f"'{q} quantization is currently not supported in npu'", source=PLATFORM)]
    if version is not None and version < since:
        return [Unsupported(f"quantization={q}", f"vLLM-Ascend {raw_version} does not support {q} "
                            f"(supported from {since})", source=PLATFORM)]
    return []


def fp8_problems(config: ServeConfig, hardware: HardwareSnapshot) -> list[Unsupported]:
    no_fp8 = [c for c in _chips(config, hardware) if NO_FP8_CHIP.match(c)]
    if not no_fp8:
        return []
    out: list[Unsupported] = []
    q = config.quantization
    what = None
    if q in FP8_METHODS:
        what = f"quantization={q}"
    elif q is None and fp8_checkpoint_by_name(config.model):
        what = f"model={config.model} (an FP8 checkpoint by its name)"
    if what:
        out.append(Unsupported(what, f"Ascend {no_fp8[0]} has no FP8 support (FP8 needs Ascend 950); "
                               "use a W8A8 checkpoint with --quantization ascend", source=FP8_SOURCES))
    kv = config.kv_cache_dtype
    if kv is not None and kv.startswith("fp8"):
        out.append(Unsupported(f"kv_cache_dtype={kv}", f"Ascend {no_fp8[0]} has no FP8 KV cache "
                               "(vLLM-Ascend crashes with it on 910B)", source=FP8_SOURCES))
    return out


def flashcomm_problems(config: ServeConfig, version: Version | None, raw_version: str | None) -> list[Unsupported]:
    additional: Any = config.options.get("additional_config")
    in_additional = isinstance(additional, Mapping) and "enable_flashcomm1" in additional
    if (FLASHCOMM1 not in config.extra_env and not in_additional) or version is None:
        return []
    if FLASHCOMM1 in config.extra_env:
        what = f"{FLASHCOMM1}={config.extra_env[FLASHCOMM1]}"
    else:
        what = "additional_config.enable_flashcomm1"
    if version >= FLASHCOMM1_REMOVED_IN:
        return [Unsupported(what, f"vLLM-Ascend {raw_version} removed FlashComm v1 (first release after the "
                            "v0.26.0 series) and ignores it with a deprecation warning; upstream vLLM sequence "
                            "parallelism replaces it (DP>1, TP>1, all2all backend allgather_reducescatter)",
                            source=FLASHCOMM1_REMOVAL_SOURCE, severity="warning")]
    if version < FLASHCOMM1_SINCE and FLASHCOMM1 in config.extra_env:
        return [Unsupported(what, f"vLLM-Ascend {raw_version} ignores it: before {FLASHCOMM1_SINCE} the switch "
                            "is VLLM_ASCEND_ENABLE_FLASHCOMM", source=f"{REPO}/pull/3334", severity="warning")]
    return []


def check_support(
    engine: str, config: ServeConfig, hardware: HardwareSnapshot, version: str | None
) -> list[Unsupported]:
    parsed = parse_version(version)
    out = option_problems(engine, config, ASCEND_OPTIONS)
    out += quantization_problems(config, parsed, version)
    out += fp8_problems(config, hardware)
    out += flashcomm_problems(config, parsed, version)
    return out
