"""perflab: a performance lab for LLM inference engines.

Kept import-light: ``perflab engines list`` must start fast, so this module imports only
the hook markers and the boundary types.
"""

from perflab.contract.hookspecs import HOOKSPEC_VERSION, hookimpl
from perflab.contract.plugin_base import EnginePlugin, Maps, Refuses
from perflab.contract.types import (
    Accelerator,
    CacheReset,
    CrashCause,
    EngineInfo,
    FileSpec,
    GroupNode,
    HardwareSnapshot,
    HttpProbe,
    LaunchSpec,
    MetricsEndpoint,
    NodeGroup,
    Readiness,
    ServeConfig,
    Unsupported,
)

__version__ = "0.1.0"

__all__ = [
    "HOOKSPEC_VERSION",
    "Accelerator",
    "CacheReset",
    "CrashCause",
    "EngineInfo",
    "EnginePlugin",
    "FileSpec",
    "GroupNode",
    "HardwareSnapshot",
    "HttpProbe",
    "LaunchSpec",
    "Maps",
    "MetricsEndpoint",
    "NodeGroup",
    "Readiness",
    "Refuses",
    "ServeConfig",
    "Unsupported",
    "__version__",
    "hookimpl",
]
