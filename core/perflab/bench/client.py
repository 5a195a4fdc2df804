"""The HTTP side of the benchmark client: requests built ahead, responses captured raw.

Two stacks, chosen by measurement (``benchmarks/bench_client_capacity.py``, docs/benchmark.md):

``raw`` (default)
    A minimal HTTP/1.1 client on asyncio (uvloop when installed): keep-alive connection
    pool, chunked transfer decoding, no per-line limit. The receive time of every read is
    taken in ``data_received`` — when the event loop sees the bytes, not when a coroutine
    gets around to them — and no coroutine wakes up per chunk: one future per request.
    It spends about a third less CPU per chunk than a bare aiohttp loop and keeps TTFT
    errors lower under load. No proxies, no HTTP/2, no redirects: use ``aiohttp`` for those.
``aiohttp``
    ``aiohttp.ClientSession`` with ``iter_any()`` (no line limit; ``trust_env`` honours
    ``HTTP(S)_PROXY``). httpx was measured too and left out: its connection pool slows down
    at high concurrency (encode/httpx issue 3215).

Both fill a :class:`~perflab.bench.trace.Capture` per request and parse nothing while the
benchmark runs.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from time import perf_counter
from typing import Any
from urllib.parse import urlsplit

from perflab.bench.request import STREAM_DEADLINE_FLOOR_TOK_S, STREAM_DEADLINE_MIN_S, BenchRequest, stream_deadline_s
from perflab.bench.serverclock import SERVER_CLOCK_HEADER, clock_header_value
from perflab.bench.trace import Capture
from perflab.contract.errors import UsageError

USER_AGENT = "perflab-bench"
MAX_HEAD_BYTES = 64 * 1024
DEFAULT_TIMEOUT_S = 6 * 60 * 60  # vLLM's AIOHTTP_TIMEOUT


@dataclass(frozen=True, slots=True)
class Target:
    scheme: str
    host: str
    port: int
    path: str  # the full request path, endpoint included

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.scheme, self.host, self.port)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}{self.path}"

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.scheme == "https" else 80
        return host if self.port == default else f"{host}:{self.port}"


def make_target(base_url: str, endpoint: str) -> Target:
    """``base_url`` + ``endpoint``; a base ending in ``/v1`` and an endpoint starting with
    ``/v1/`` are joined once (``http://h:8000/v1`` + ``/v1/completions``)."""
    parts = urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"--base-url {base_url!r}: expected http://HOST:PORT or https://HOST:PORT")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise UsageError(f"--base-url {base_url!r}: invalid port") from None
    base = parts.path.rstrip("/")
    if not endpoint.startswith("/"):
        endpoint = "/" + endpoint
    if base.endswith("/v1") and endpoint.startswith("/v1/"):
        base = base[:-3]
    return Target(parts.scheme, parts.hostname, port, base + endpoint)


def build_payload(req: BenchRequest, prompt: str, max_tokens: int) -> dict[str, Any]:
    """The JSON body, as ``vllm bench serve`` sends it (streaming, usage included).

    Chat prompts are sent as a plain string content (accepted by every OpenAI-compatible
    server, unlike the list-of-parts form), and ``max_tokens`` is sent beside
    ``max_completion_tokens`` for servers that only know the older name.
    """
    stream_options: dict[str, Any] = {"include_usage": True}
    if req.continuous_usage_stats:
        stream_options["continuous_usage_stats"] = True
    payload: dict[str, Any] = {"model": req.request_model}
    if req.backend == "openai-chat":
        payload["messages"] = [{"role": "user", "content": prompt}]
        payload["max_completion_tokens"] = max_tokens
        payload["max_tokens"] = max_tokens
    else:
        payload["prompt"] = prompt
        payload["max_tokens"] = max_tokens
        if req.takes("repetition_penalty"):
            payload["repetition_penalty"] = 1.0
    payload["stream"] = True
    payload["stream_options"] = stream_options
    if req.temperature is not None:
        payload["temperature"] = req.temperature
    if req.send_ignore_eos:
        payload["ignore_eos"] = True
    payload.update(dict(req.extra_body))
    return payload


@dataclass(frozen=True, slots=True)
class Prepared:
    """One request, fully encoded before the run."""

    index: int
    target: Target
    body: bytes
    headers: tuple[tuple[str, str], ...]
    raw: bytes  # the whole HTTP/1.1 request, for the raw stack
    max_tokens: int | None = None  # the answer's cap (output_cap), None: the payload has none
    # seconds the stream may last after its first byte (request.stream_deadline_s); None: no limit
    deadline_s: float | None = None


def output_cap(payload: Mapping[str, Any]) -> int | None:
    """The most output tokens a request's answer can hold: its ``max_tokens`` (and
    ``max_completion_tokens``, the larger where a server might read either; a plan's
    ``extra_body`` may have set them); None when it has neither as a whole number."""
    caps = [v for k in ("max_tokens", "max_completion_tokens")
            if isinstance(v := payload.get(k), int) and not isinstance(v, bool) and v >= 0]
    return max(caps) if caps else None


def request_headers(req: BenchRequest, count: int | None = None) -> list[tuple[str, str]]:
    """The headers of a run of ``count`` requests (default ``req.num_prompts``)."""
    headers = [("Content-Type", "application/json"), ("Accept", "text/event-stream"), ("User-Agent", USER_AGENT)]
    api_key = os.environ.get("OPENAI_API_KEY")
    if api_key and not any(k.lower() == "authorization" for k, _ in req.headers):  # an explicit one wins
        headers.append(("Authorization", f"Bearer {api_key}"))
    headers.extend(req.headers)
    if req.server_clock:  # the lab knows the engine is simulated: ask for its model-clock stamps
        # all prompts at once: one arrival time for the batch; a closed loop: no client reaction
        # time in model time (perflab.bench.serverclock.clock_header_value; a new id per call: per run)
        headers.append((SERVER_CLOCK_HEADER, clock_header_value(
            count=req.num_prompts if count is None else count, request_rate=req.request_rate,
            max_concurrency=req.max_concurrency, engines=len(req.base_urls), tag=secrets.token_hex(4))))
    return headers


def prepare(index: int, target: Target, payload: Mapping[str, Any], headers: Sequence[tuple[str, str]], request_id: str | None,
            *, deadline: bool = False) -> Prepared:
    """One request encoded; ``deadline``: its stream is cut :func:`stream_deadline_s` after its
    first byte (the run has no explicit ``--timeout``)."""
    body = json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    hdrs = list(headers)
    if request_id:
        hdrs.append(("x-request-id", request_id))
    lines = [f"POST {target.path} HTTP/1.1", f"Host: {target.host_header}"]
    lines += [f"{k}: {v}" for k, v in hdrs]
    lines.append(f"Content-Length: {len(body)}")
    raw = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
    cap = output_cap(payload)
    return Prepared(index, target, body, tuple(hdrs), raw, cap, stream_deadline_s(cap) if deadline else None)


# --------------------------------------------------------------------------- raw HTTP/1.1

_HEAD, _BODY, _DONE = 0, 1, 2
_CHUNKED, _LENGTH, _UNTIL_CLOSE = 0, 1, 2


class _Connection(asyncio.Protocol):
    """One keep-alive connection; one request at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.cap: Capture | None = None
        self.waiter: asyncio.Future[bool] | None = None
        self.closed = False
        self.keep_alive = True
        self.got_bytes = False
        self.deadline_s: float | None = None  # the started stream's limit (Prepared.deadline_s)
        self.deadline_timer: asyncio.TimerHandle | None = None
        self._reset()

    def _reset(self) -> None:
        self.state = _HEAD
        self.head = b""
        self.mode = _UNTIL_CLOSE
        self.left = 0  # bytes left in the current chunk (or body, for Content-Length)
        self.pending = b""  # unconsumed framing bytes (a chunk-size line split across reads)
        self.need_crlf = False
        self.trailer = False

    # asyncio callbacks ------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.cap is None:
            return
        if self.state == _BODY and self.mode == _UNTIL_CLOSE:
            self._finish()
        else:
            why = f": {exc}" if exc else ""
            self._fail(f"connection closed by the server before the response ended{why}")

    def data_received(self, data: bytes) -> None:
        t = perf_counter()
        cap = self.cap
        if cap is None:  # bytes while idle: the connection is out of sync, drop it
            self.keep_alive = False
            if self.transport is not None:
                self.transport.close()
            return
        self.got_bytes = True
        if self.state == _HEAD:
            head = self.head + data if self.head else data
            end = head.find(b"\r\n\r\n")
            if end < 0:
                if len(head) > MAX_HEAD_BYTES:
                    self._fail("response headers larger than 64 KiB")
                else:
                    self.head = head
                return
            self.head = b""
            if not self._parse_head(head[:end]):
                return
            data = head[end + 4 :]
            if self.state == _HEAD:  # an interim 1xx response: parse what follows it
                if data:
                    self.data_received(data)
                return
            if self.mode == _LENGTH and self.left == 0:
                self._finish()
                return
            if not data:
                return
        if self.deadline_timer is None and self.deadline_s is not None:  # the body's first bytes
            self.deadline_timer = asyncio.get_running_loop().call_later(self.deadline_s, self.stream_timed_out, self.deadline_s)
        if self.mode == _CHUNKED:
            self._chunked(t, data)
        elif self.mode == _LENGTH:
            if len(data) >= self.left:
                cap.reads.append((t, data[: self.left]))
                self.left = 0
                self._finish()
            else:
                cap.reads.append((t, data))
                self.left -= len(data)
        else:
            cap.reads.append((t, data))

    # parsing ------------------------------------------------------------------------

    def _parse_head(self, head: bytes) -> bool:
        cap = self.cap
        assert cap is not None
        lines = head.decode("latin-1").split("\r\n")
        status_line = lines[0].split(" ", 2)
        try:
            version, status = status_line[0], int(status_line[1])
        except (IndexError, ValueError):
            self._fail(f"not an HTTP response: {lines[0][:100]!r}")
            return False
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        if 100 <= status < 200:  # 100 Continue and friends: the real response follows
            self.state = _HEAD
            return True
        cap.status = status
        cap.reason = status_line[2] if len(status_line) > 2 else ""
        cap.headers = headers
        conn = headers.get("connection", "").lower()
        self.keep_alive = not (conn == "close" or (version == "HTTP/1.0" and conn != "keep-alive"))
        if "chunked" in headers.get("transfer-encoding", "").lower():
            self.mode = _CHUNKED
        elif "content-length" in headers:
            self.mode = _LENGTH
            try:
                self.left = int(headers["content-length"])
            except ValueError:
                self._fail(f"bad Content-Length {headers['content-length']!r}")
                return False
        else:
            self.mode = _UNTIL_CLOSE
            self.keep_alive = False
        self.state = _BODY
        return True

    def _chunked(self, t: float, data: bytes) -> None:
        if self.pending:
            data = self.pending + data
            self.pending = b""
        pos, n = 0, len(data)
        pieces: list[bytes] = []
        done = False
        while pos < n:
            left = self.left
            if left:
                end = pos + left
                if end <= n:
                    pieces.append(data[pos:end])
                    self.left = 0
                    self.need_crlf = True
                    pos = end
                else:
                    pieces.append(data[pos:])
                    self.left = left - (n - pos)
                    pos = n
                continue
            if self.need_crlf:
                if n - pos < 2:
                    self.pending = data[pos:]
                    break
                if data[pos : pos + 2] != b"\r\n":
                    self._fail("malformed chunked encoding (missing CRLF after a chunk)")
                    return
                pos += 2
                self.need_crlf = False
                continue
            eol = data.find(b"\r\n", pos)
            if eol < 0:
                if n - pos > 4096:
                    self._fail("malformed chunked encoding (chunk-size line too long)")
                    return
                self.pending = data[pos:]
                break
            line = data[pos:eol]
            pos = eol + 2
            if self.trailer:
                if not line:  # the blank line that ends the message
                    done = True
                    break
                continue  # a trailer field: ignored
            try:
                size = int(line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                self._fail(f"malformed chunked encoding (chunk size {line[:40]!r})")
                return
            if size == 0:
                self.trailer = True
            else:
                self.left = size
        cap = self.cap
        if pieces and cap is not None:
            cap.reads.append((t, pieces[0] if len(pieces) == 1 else b"".join(pieces)))
        if done:
            self._finish()

    # completion ---------------------------------------------------------------------

    def _disarm(self) -> None:
        if self.deadline_timer is not None:
            self.deadline_timer.cancel()
            self.deadline_timer = None

    def _finish(self) -> None:
        cap, waiter = self.cap, self.waiter
        self.cap = self.waiter = None
        self._disarm()
        self.state = _DONE
        if cap is not None:
            cap.end = perf_counter()
        if not self.keep_alive and self.transport is not None:
            self.transport.close()
        if waiter is not None and not waiter.done():
            waiter.set_result(True)

    def _fail(self, message: str) -> None:
        cap, waiter = self.cap, self.waiter
        self.cap = self.waiter = None
        self._disarm()
        self.keep_alive = False
        if cap is not None:
            cap.error = message
            cap.end = perf_counter()
        if self.transport is not None:
            self.transport.abort()
        if waiter is not None and not waiter.done():
            waiter.set_result(False)

    def timed_out(self, timeout: float) -> None:
        self._fail(f"no complete response within {timeout:g} s (--timeout)")

    def stream_timed_out(self, limit: float) -> None:
        self._fail(stream_deadline_message(limit))

    # use ----------------------------------------------------------------------------

    def start(self, raw: bytes, cap: Capture, waiter: asyncio.Future[bool], deadline_s: float | None = None) -> None:
        self._reset()
        self.cap, self.waiter = cap, waiter
        self.got_bytes = False
        self.deadline_s = deadline_s
        assert self.transport is not None
        self.transport.write(raw)

    @property
    def reusable(self) -> bool:
        return self.keep_alive and not self.closed and self.state == _DONE and self.transport is not None and not self.transport.is_closing()


class RawClient:
    """Keep-alive pool of :class:`_Connection` per (scheme, host, port); no size limit."""

    def __init__(self, timeout: float | None = None) -> None:
        self.timeout = timeout or DEFAULT_TIMEOUT_S
        self._idle: dict[tuple[str, str, int], list[_Connection]] = {}
        self._all: set[_Connection] = set()
        self._ssl: ssl.SSLContext | None = None

    def _take(self, key: tuple[str, str, int]) -> _Connection | None:
        idle = self._idle.get(key)
        while idle:
            conn = idle.pop()
            if conn.reusable:
                return conn
        return None

    async def _connect(self, target: Target) -> _Connection:
        loop = asyncio.get_running_loop()
        ctx = None
        if target.scheme == "https":
            if self._ssl is None:
                self._ssl = ssl.create_default_context()
            ctx = self._ssl
        _, conn = await asyncio.wait_for(
            loop.create_connection(_Connection, target.host, target.port, ssl=ctx, server_hostname=target.host if ctx else None),
            self.timeout,
        )
        self._all.add(conn)
        return conn

    async def send(self, p: Prepared, cap: Capture) -> None:
        loop = asyncio.get_running_loop()
        cap.start = perf_counter()
        for attempt in range(2):
            conn = self._take(p.target.key)
            reused = conn is not None
            if conn is None:
                try:
                    conn = await self._connect(p.target)
                except (TimeoutError, OSError) as exc:
                    cap.error = f"cannot connect to {p.target.host}:{p.target.port}: {str(exc) or type(exc).__name__}"
                    cap.end = perf_counter()
                    return
            waiter: asyncio.Future[bool] = loop.create_future()
            conn.start(p.raw, cap, waiter, p.deadline_s)
            timer = loop.call_later(self.timeout, conn.timed_out, self.timeout)
            try:
                ok = await waiter
            except asyncio.CancelledError:
                conn._fail("cancelled")
                raise
            finally:
                timer.cancel()
            if ok:
                if conn.reusable:
                    self._idle.setdefault(p.target.key, []).append(conn)
                else:
                    self._all.discard(conn)
                return
            self._all.discard(conn)
            # A kept-alive connection the server had closed fails before any byte: retry
            # once on a fresh one, as HTTP clients do for idempotent-looking failures.
            if reused and not conn.got_bytes and attempt == 0:
                cap.error = None
                cap.reads.clear()
                continue
            return

    async def close(self) -> None:
        for conn in list(self._all):
            if conn.transport is not None:
                conn.transport.close()
        self._all.clear()
        self._idle.clear()


# --------------------------------------------------------------------------- aiohttp


class AiohttpClient:
    """The same capture through aiohttp (proxies from the environment, anything exotic)."""

    def __init__(self, timeout: float | None = None) -> None:
        import aiohttp

        self.timeout = timeout or DEFAULT_TIMEOUT_S
        self._aiohttp = aiohttp
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=60, enable_cleanup_closed=True),
            timeout=aiohttp.ClientTimeout(total=self.timeout),
            trust_env=True,
            auto_decompress=True,
        )

    async def send(self, p: Prepared, cap: Capture) -> None:
        aiohttp = self._aiohttp
        cap.start = perf_counter()
        for attempt in range(2):
            try:
                async with asyncio.timeout(None) as limit, \
                        self._session.post(p.target.url, data=p.body, headers=dict(p.headers)) as resp:
                    cap.status = resp.status
                    cap.reason = resp.reason or ""
                    cap.headers = {k.lower(): v for k, v in resp.headers.items()}
                    append = cap.reads.append
                    async for data in resp.content.iter_any():
                        if not cap.reads and p.deadline_s is not None:  # the body's first bytes
                            limit.reschedule(asyncio.get_running_loop().time() + p.deadline_s)
                        append((perf_counter(), data))
            except TimeoutError:
                if cap.reads and p.deadline_s is not None and limit.expired():
                    cap.error = stream_deadline_message(p.deadline_s)
                else:
                    cap.error = f"no complete response within {self.timeout:g} s (--timeout)"
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
                # A kept-alive connection the server had closed: retry once, as RawClient.
                if cap.status == 0 and attempt == 0:
                    continue
                cap.error = f"{type(exc).__name__}: {exc}"
            except aiohttp.ClientError as exc:
                cap.error = f"{type(exc).__name__}: {exc}"
            except OSError as exc:
                cap.error = f"{type(exc).__name__}: {exc}"
            break
        cap.end = perf_counter()

    async def close(self) -> None:
        await self._session.close()


def stream_deadline_message(limit: float) -> str:
    """The error of a request whose stream outlasted :func:`stream_deadline_s`."""
    return (f"the stream did not end within {limit:g} s of its first byte (the limit for its max_tokens: "
            f"{STREAM_DEADLINE_MIN_S:g} s + max_tokens at {STREAM_DEADLINE_FLOOR_TOK_S:g} token/s; --timeout sets another)")


def make_client(stack: str, timeout: float | None) -> RawClient | AiohttpClient:
    """A client for ``stack`` (create it inside the event loop that will use it)."""
    if stack == "aiohttp":
        return AiohttpClient(timeout)
    return RawClient(timeout)
