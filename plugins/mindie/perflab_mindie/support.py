"""What MindIE is known not to do, said before anything is launched.

(MindIE on non-Ascend hardware is refused by perflab's core device checks.)
"""

from __future__ import annotations

from perflab.contract.types import HardwareSnapshot, ServeConfig, Unsupported
from perflab_mindie.models import is_moe
from perflab_mindie.version import release

DOCS = "https://github.com/Ascend/MindIE-LLM/blob/master/docs/zh/user_guide/feature"
SEED_000 = (
    "seed 000 (Qwen3-30B-A3B on Ascend 910B, MindIE 2.1RC1): prefix caching -> 'Crash, not supported for the model'"
)
# GPUStack's MindIE backend refuses these combinations before launching
# (AscendMindIEParameters._validate): "--enable-prefix-caching is not supported when
# --data-parallel-size > 1", "--enable-split is not supported when --data-parallel-size > 1".
GPUSTACK = "https://github.com/gpustack/gpustack/blob/main/gpustack/worker/backends/ascend_mindie.py"
LAST_CRASHING_RELEASE = (2, 1)


def check(config: ServeConfig, hardware: HardwareSnapshot, version: str | None) -> list[Unsupported]:
    out: list[Unsupported] = []
    dp = config.dp or 1
    if config.prefix_caching and is_moe(config.model):
        known_bad = (rel := release(version)) is None or rel <= LAST_CRASHING_RELEASE
        out.append(
            Unsupported(
                "prefix_caching",
                f"{config.model} is a MoE model (by its id) and MindIE "
                f"{version or '≤ 2.1'} crashes with prefix caching on it — {SEED_000}"
                + ("" if known_bad else "; newer MindIE docs list Qwen3 support, so this may work"),
                source=f"{DOCS}/prefix_cache.md",
                severity="error" if known_bad else "warning",
            )
        )
    if dp > 1:  # GPUStack's refusals
        refusals = {"prefix_caching": f"MindIE does not support prefix caching with data parallel (dp={dp})",
                    "chunked_prefill": f"MindIE's chunked prefill (SplitFuse) does not support data parallel (dp={dp})"}
        out += [Unsupported(option, why, source=GPUSTACK) for option, why in refusals.items() if getattr(config, option)]
    if config.chunked_prefill and config.speculative_config is not None:
        out.append(
            Unsupported(
                "chunked_prefill",
                "MindIE's SplitFuse cannot be combined with MTP / speculative decoding",
                source=f"{DOCS}/splitFuse.md",
            )
        )
    return out
