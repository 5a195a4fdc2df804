"""Proving that an engine serves: every HTTP probe answers 2xx, then a real one-token generation.

An open port or a "ready" log line is not enough: a ready line can precede a bind failure,
and engines answer ``/health`` while their scheduler is dead. Only a generated token counts.

Polling is fast (every 50 ms, backing off to 250 ms) and the engine's own ready line wakes
the loop at once (:class:`Kick`), so "ready" is reported within milliseconds of the engine
serving. A generation probe that gets HTTP errors ``GENERATION_HTTP_ERRORS_MAX`` times in a
row, or any probe answered 401/403 (which no retry fixes), ends readiness: :class:`ProbeRefused`.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx

from perflab.contract.types import LaunchSpec, Readiness

PROBE_TIMEOUT_S = 2.0  # one health request; a healthy engine answers in milliseconds
GENERATION_TIMEOUT_S = 30.0  # the first generation may compile kernels / warm up caches
GENERATION_HTTP_ERRORS_MAX = 5  # consecutive HTTP error answers to the generation probe
NOT_RETRIED = (401, 403)  # authentication: the engine wants an API key perflab does not have
FIRST_INTERVAL_S = 0.05
MAX_INTERVAL_S = 0.25  # a closed port refuses in microseconds; polling fast costs nothing


class ProbeRefused(Exception):
    """The engine answers HTTP but refuses a readiness probe for good (the message quotes the
    answer): 401/403 on any probe, or HTTP errors to the generation probe, N times in a row."""

    def __init__(self, error: str, status: int, attempts: int, *, generation: bool) -> None:
        super().__init__(error)
        self.error = error
        self.status = status
        self.attempts = attempts
        self.generation = generation  # the generation probe (else an HTTP health probe)


class GenerationProbeFailed(ProbeRefused):
    """The generation probe was refused."""

    def __init__(self, error: str, status: int, attempts: int) -> None:
        super().__init__(error, status, attempts, generation=True)


class Kick:
    """Wakes a sleeping poll loop (the engine printed its ready line): probe now."""

    def __init__(self) -> None:
        self._event = anyio.Event()

    def set(self) -> None:
        self._event.set()

    async def sleep(self, seconds: float) -> bool:
        """Sleep ``seconds`` or until kicked; True (and re-armed) when kicked."""
        with anyio.move_on_after(seconds):
            await self._event.wait()
        if self._event.is_set():
            self._event = anyio.Event()
            return True
        return False


def url(host: str, port: int, path: str) -> str:
    h = f"[{host}]" if ":" in host else host
    return f"http://{h}:{port}{path if path.startswith('/') else '/' + path}"


def generation_body(path: str, model: str, prompt: str = "hello", max_tokens: int = 1) -> dict[str, Any]:
    if "chat" in path:
        return {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens}
    return {"model": model, "prompt": prompt, "max_tokens": max_tokens}


def generated_text(body: Any) -> str | None:
    """The text of the first choice, or None when the answer holds no generated choice.

    A one-token answer may legitimately be whitespace or (for reasoning models on the chat
    path) only ``reasoning_content``; what must exist is a choice carrying generated output.
    """
    if not isinstance(body, dict):
        return None
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None
    choice = choices[0]
    if isinstance(choice.get("text"), str):
        text: str = choice["text"]
    else:
        msg = choice.get("message")
        if not isinstance(msg, dict):
            return None
        parts = [msg.get("content"), msg.get("reasoning_content"), msg.get("reasoning")]
        text = "".join(p for p in parts if isinstance(p, str))
    if text:
        return text
    usage = body.get("usage")
    if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int) and usage["completion_tokens"] >= 1:
        return text  # a token was generated (e.g. a special token decoded to "")
    return None


@dataclass
class GenerationResult:
    ok: bool
    text: str | None = None
    error: str | None = None
    latency_s: float | None = None
    status: int | None = None  # the HTTP status when the engine answered


async def generate_once(
    client: httpx.AsyncClient,
    host: str,
    port: int,
    path: str,
    model: str,
    *,
    prompt: str = "hello",
    max_tokens: int = 1,
    timeout: float = GENERATION_TIMEOUT_S,
) -> GenerationResult:
    """Send one small generation request and say whether a token came back."""
    t0 = time.monotonic()
    try:
        r = await client.post(url(host, port, path), json=generation_body(path, model, prompt, max_tokens), timeout=timeout)
    except httpx.TimeoutException:
        return GenerationResult(False, error=f"POST {path}: no answer within {timeout:g} s")
    except httpx.HTTPError as exc:
        return GenerationResult(False, error=f"POST {path}: {type(exc).__name__}: {exc}")
    latency = time.monotonic() - t0
    if not 200 <= r.status_code < 300:
        return GenerationResult(
            False, error=f"POST {path}: HTTP {r.status_code} {r.text[:200]!r}", latency_s=latency, status=r.status_code
        )
    try:
        body = r.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return GenerationResult(False, error=f"POST {path}: answer is not JSON: {r.text[:200]!r}", latency_s=latency)
    text = generated_text(body)
    if text is None:
        return GenerationResult(False, error=f"POST {path}: no generated choice in {r.text[:200]!r}", latency_s=latency)
    return GenerationResult(True, text=text, latency_s=latency)


@dataclass
class ProbeState:
    """What the readiness loop has seen so far (for the timeout message)."""

    attempts: int = 0
    http_ok: bool = False  # every HTTP probe answered 2xx at least once
    last_error: str | None = None
    first_http_ok: float | None = None  # time.time()
    history: list[str] = field(default_factory=list)
    generation_http_errors: int = 0  # consecutive generation probes answered with an HTTP error

    def fail(self, error: str) -> None:
        if error != self.last_error:
            self.history.append(error)
            del self.history[:-20]
        self.last_error = error


async def http_probes_pass(
    client: httpx.AsyncClient,
    host: str,
    launch: LaunchSpec,
    readiness: Readiness,
    state: ProbeState,
    *,
    refuse_auth: bool = False,
) -> bool:
    """Every HTTP probe answers 2xx; with ``refuse_auth`` a 401/403 raises :class:`ProbeRefused`."""
    for probe in readiness.http:
        port = probe.port or launch.port
        try:
            r = await client.get(url(host, port, probe.path), timeout=PROBE_TIMEOUT_S)
        except httpx.TimeoutException:
            state.fail(f"GET {probe.path} (port {port}): no answer within {PROBE_TIMEOUT_S:g} s")
            return False
        except httpx.HTTPError as exc:
            state.fail(f"GET {probe.path} (port {port}): {type(exc).__name__}: {exc}")
            return False
        if not 200 <= r.status_code < 300:
            error = f"GET {probe.path} (port {port}): HTTP {r.status_code}"
            state.fail(error)
            if refuse_auth and r.status_code in NOT_RETRIED:
                # vLLM's --api-key guards /v1/* (entrypoints/serve/middleware/authenticate.py, 0.32.0)
                raise ProbeRefused(f"{error} {r.text[:200]!r}", r.status_code, 1, generation=False)
            return False
    return True


async def poll_until_ready(
    client: httpx.AsyncClient,
    host: str,
    launch: LaunchSpec,
    readiness: Readiness,
    state: ProbeState,
    *,
    first_interval: float | None = None,
    max_interval: float | None = None,
    kick: Kick | None = None,
    max_generation_http_errors: int | None = None,
) -> GenerationResult | None:
    """Return once every probe passes and (if asked) a generation worked. The caller bounds
    it with the startup deadline and races it against the process' exit; it gives up only by
    raising :class:`ProbeRefused`. ``kick`` (the ready line) makes it probe at once.
    Unset intervals and limits take the module's constants (read at call time)."""
    first_interval = FIRST_INTERVAL_S if first_interval is None else first_interval
    max_interval = MAX_INTERVAL_S if max_interval is None else max_interval
    max_errors = GENERATION_HTTP_ERRORS_MAX if max_generation_http_errors is None else max_generation_http_errors
    interval = first_interval
    while True:
        state.attempts += 1
        if await http_probes_pass(client, host, launch, readiness, state, refuse_auth=True):
            state.http_ok = True
            if state.first_http_ok is None:
                state.first_http_ok = time.time()
            if readiness.generation_path is None:
                return None
            gen = await generate_once(client, host, launch.port, readiness.generation_path, launch.served_model_name)
            if gen.ok:
                return gen
            error = gen.error or "generation failed"
            state.fail(error)
            if gen.status is None:
                state.generation_http_errors = 0
            else:
                state.generation_http_errors += 1
                if gen.status in NOT_RETRIED or state.generation_http_errors >= max_errors:
                    raise GenerationProbeFailed(error, gen.status, state.generation_http_errors)
        if kick is not None and await kick.sleep(interval):
            interval = first_interval
        else:
            if kick is None:
                await anyio.sleep(interval)
            interval = min(interval * 1.5, max_interval)
