"""What MindIE needs to know about a model from its id alone (no weights are read)."""

from __future__ import annotations

import re
from pathlib import PurePosixPath

# MoE by naming convention: Qwen's active-parameter suffix (Qwen3-30B-A3B, Qwen3-235B-A22B,
# Qwen3-Next-80B-A3B), an explicit "MoE" token, Mixtral.
_MOE = re.compile(r"(?i)(?:^|[-_/.])a\d+(?:\.\d+)?b(?:$|[-_.])|(?:^|[-_/.])moe(?:$|[-_.])|mixtral")
# ModelConfig.modelName: letters, digits, '-', '.', '_', not starting or ending with - . _,
# at most 256 characters (service_parameter_configuration.md).
_MODEL_NAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,254}[A-Za-z0-9])?$")


def is_moe(model: str) -> bool:
    return bool(_MOE.search(model))


def default_model_name(model: str) -> str:
    """The served name when none is given: the last path component (``Qwen/Qwen3-30B-A3B`` ->
    ``Qwen3-30B-A3B``), since MindIE's modelName may not contain '/'."""
    return PurePosixPath(model.rstrip("/")).name or model


def valid_model_name(name: str) -> bool:
    return bool(_MODEL_NAME.match(name))


def names_quantization(model: str, quantization: str) -> bool:
    """A pre-quantized checkpoint names its format (vllm-ascend/Qwen3-8B-W8A8)."""
    names = set(re.split(r"[-_./]", model.lower()))
    return any(part in names for part in re.split(r"[-_]", quantization.lower()) if part)
