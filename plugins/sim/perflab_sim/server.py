"""A small, fast HTTP/1.1 server on asyncio streams for the simulated engines.

Only what OpenAI-compatible clients and health probes use: keep-alive, ``Content-Length`` and
chunked request bodies, and responses that are either complete or streamed with chunked
transfer encoding (server-sent events). No framework, so one CPU core serves thousands of
token events per second alongside the benchmark client.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from email.utils import formatdate
from http import HTTPStatus
from typing import Any

MAX_BODY = 64 * 1024 * 1024


@dataclass
class Connection:
    """Per-connection state: bytes read ahead of the next request (see ``Request.watch_disconnect``)."""

    prefix: bytes = b""


@dataclass
class Request:
    method: str
    path: str
    query: str
    version: str
    headers: dict[str, str]
    body: bytes
    peer: str
    reader: asyncio.StreamReader
    conn: Connection

    def json(self) -> Any:
        return json.loads(self.body or b"null")

    async def wait_or_disconnect(self, done: asyncio.Future[Any]) -> bool:
        """Wait for ``done``; False if the client closed (or reset) the connection first.

        Reads ahead one byte to notice the close; a byte of a pipelined next request is kept
        for the next read."""
        peek = asyncio.ensure_future(self.reader.read(1))
        try:
            finished, _ = await asyncio.wait({done, peek}, return_when=asyncio.FIRST_COMPLETED)
            if peek in finished and not done.done():
                try:
                    more = peek.result()
                except ConnectionError:  # reset (a client aborting with data unread): gone too
                    return False
                if more == b"":
                    return False
                await done
            return True
        finally:
            if not peek.done():
                peek.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await peek
            elif not peek.cancelled() and peek.exception() is None and peek.result():
                self.conn.prefix += peek.result()


class Response:
    """A complete response."""

    def __init__(self, status: int = 200, body: bytes | str = b"", content_type: str | None = "application/json",
                 headers: Mapping[str, str] | None = None) -> None:
        self.status = status
        self.body = body.encode() if isinstance(body, str) else body
        self.content_type = content_type
        self.headers = dict(headers or {})


def json_response(obj: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> Response:
    return Response(status, json.dumps(obj, separators=(",", ":")), headers=headers)


@dataclass
class Stream:
    """A streamed (chunked) response; ``run(writer_fn)`` writes the body and returns when done."""

    run: Callable[[Callable[[bytes], bool]], Awaitable[None]]
    status: int = 200
    content_type: str = "text/event-stream; charset=utf-8"
    headers: dict[str, str] = field(default_factory=dict)


Handler = Callable[[Request], Awaitable[Response | Stream]]


def _status_line(status: int) -> bytes:
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = "Unknown"
    return f"HTTP/1.1 {status} {phrase}\r\n".encode()


class HttpServer:
    """Serves ``handler`` on one listening socket. ``common_headers`` go on every response."""

    def __init__(self, handler: Handler, common_headers: Mapping[str, str],
                 on_access: Callable[[Request, int], None] | None = None) -> None:
        self.handler = handler
        self.common = "".join(f"{k}: {v}\r\n" for k, v in common_headers.items()).encode()
        self.on_access = on_access
        self.connections: set[asyncio.StreamWriter] = set()
        self.server: asyncio.base_events.Server | None = None

    async def start(self, host: str, port: int) -> None:
        self.server = await asyncio.start_server(self._serve, host, port, reuse_address=True, backlog=4096)

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
        for writer in list(self.connections):
            writer.transport.abort()

    def _head(self, status: int, content_type: str | None, extra: Mapping[str, str], length: int | None) -> bytes:
        lines = [_status_line(status), b"date: ", formatdate(usegmt=True).encode(), b"\r\n", self.common]
        if content_type is not None:  # uvicorn sends none for an empty Response (captured: health.txt)
            lines += [b"content-type: ", content_type.encode(), b"\r\n"]
        for k, v in extra.items():
            lines.append(f"{k}: {v}\r\n".encode())
        if length is None:
            lines.append(b"transfer-encoding: chunked\r\n")
        else:
            lines.append(f"content-length: {length}\r\n".encode())
        lines.append(b"\r\n")
        return b"".join(lines)

    async def _read_request(self, reader: asyncio.StreamReader, peer: str, conn: Connection) -> Request | None:
        try:
            head = conn.prefix + await reader.readuntil(b"\r\n\r\n")
            conn.prefix = b""
        except (asyncio.IncompleteReadError, ConnectionError):
            return None
        except asyncio.LimitOverrunError:
            return None
        lines = head.decode("latin-1").split("\r\n")
        try:
            method, target, version = lines[0].split(" ", 2)
        except ValueError:
            return None
        headers: dict[str, str] = {}
        for line in lines[1:]:
            if not line:
                continue
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        body = b""
        if "content-length" in headers:
            n = int(headers["content-length"])
            if n > MAX_BODY:
                return None
            body = await reader.readexactly(n) if n else b""
        elif headers.get("transfer-encoding", "").lower() == "chunked":
            parts = []
            while True:
                size_line = await reader.readuntil(b"\r\n")
                size = int(size_line.split(b";")[0].strip(), 16)
                if size == 0:
                    await reader.readuntil(b"\r\n")
                    break
                parts.append(await reader.readexactly(size))
                await reader.readexactly(2)
            body = b"".join(parts)
        path, _, query = target.partition("?")
        return Request(method.upper(), path, query, version, headers, body, peer, reader, conn)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections.add(writer)
        peername = writer.get_extra_info("peername")
        peer = f"{peername[0]}:{peername[1]}" if isinstance(peername, tuple) else "-"
        conn = Connection()
        try:
            while True:
                try:
                    req = await self._read_request(reader, peer, conn)
                except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, ValueError):
                    req = None
                if req is None:
                    break
                keep_alive = req.headers.get("connection", "").lower() != "close" and req.version != "HTTP/1.0"
                resp = await self.handler(req)
                if self.on_access:
                    self.on_access(req, resp.status)
                if isinstance(resp, Response):
                    # HEAD: the GET response's status and headers (its Content-Length too), no
                    # body (RFC 9110 9.3.2; uvicorn drops the body of a HEAD response)
                    body = b"" if req.method == "HEAD" else resp.body
                    writer.write(self._head(resp.status, resp.content_type, resp.headers, len(resp.body)) + body)
                    await writer.drain()
                else:
                    writer.write(self._head(resp.status, resp.content_type, resp.headers, None))

                    def send(data: bytes) -> bool:
                        if writer.transport.is_closing():
                            return False
                        writer.write(b"%x\r\n%b\r\n" % (len(data), data))
                        return True

                    await resp.run(send)
                    if writer.transport.is_closing():
                        break
                    writer.write(b"0\r\n\r\n")
                    await writer.drain()
                if not keep_alive:
                    break
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self.connections.discard(writer)
            writer.close()
