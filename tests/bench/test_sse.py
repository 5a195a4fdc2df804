"""SSE parsing without a line limit, and the HTTP/1.1 client's framing, on hostile byte streams."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator

import pytest
from perflab.bench.client import (
    AiohttpClient,
    Prepared,
    RawClient,
    make_target,
    prepare,
)
from perflab.bench.drive import run_in_new_loop
from perflab.bench.sse import SSEParser
from perflab.bench.trace import Capture, parse_capture

# --------------------------------------------------------------------------- the parser


def feed_all(pieces: list[bytes]) -> list[tuple[str, bytes]]:
    p = SSEParser()
    out = []
    for piece in pieces:
        out += [(e.event, e.data) for e in p.feed(piece)]
    out += [(e.event, e.data) for e in p.close()]
    return out


STREAM = b'data: {"a": 1}\n\n: keep-alive ping\n\nevent: error\ndata: line one\ndata:line two\n\ndata: [DONE]\n\n'
EXPECTED = [("message", b'{"a": 1}'), ("error", b"line one\nline two"), ("message", b"[DONE]")]


def test_whole_stream() -> None:
    assert feed_all([STREAM]) == EXPECTED


@pytest.mark.parametrize("size", [1, 2, 3, 5, 7, 13])
def test_any_split_gives_the_same_events(size: int) -> None:
    pieces = [STREAM[i : i + size] for i in range(0, len(STREAM), size)]
    assert feed_all(pieces) == EXPECTED


@pytest.mark.parametrize("eol", [b"\r\n", b"\r"])
def test_crlf_and_cr_line_endings_even_split_between_reads(eol: bytes) -> None:
    stream = STREAM.replace(b"\n", eol)
    assert feed_all([stream]) == EXPECTED
    # a CRLF cut between two reads must not count as two line ends
    for i in range(len(stream)):
        assert feed_all([stream[:i], stream[i:]]) == EXPECTED, i


def test_no_line_length_limit() -> None:
    # aiohttp's readline limit (64/128 KiB) broke vLLM's and TensorRT-LLM's clients on long chunks.
    big = json.dumps({"choices": [{"delta": {"content": "x" * 3_000_000}}]}).encode()
    pieces = [b"data: " + big[:1000], big[1000:2_000_000], big[2_000_000:] + b"\n\n"]
    assert feed_all(pieces) == [("message", big)]


def test_event_without_final_blank_line_is_kept_at_close() -> None:
    assert feed_all([b'data: {"x": 1}']) == [("message", b'{"x": 1}')]
    assert feed_all([b'data: {"x": 1}\n']) == [("message", b'{"x": 1}')]
    assert feed_all([b"\n\n: only a comment\n\n"]) == []


def test_field_without_space_and_unknown_fields() -> None:
    assert feed_all([b"data:abc\nid: 7\nretry: 10\nfoo: bar\n\n"]) == [("message", b"abc")]


# --------------------------------------------------------------------------- HTTP framing


class ScriptedServer:
    """Answers each request on a connection with the next scripted response, written in the
    given pieces with a pause between them (separate TCP segments, separate client reads)."""

    def __init__(self, responses: list[list[bytes]], close_after: int | None = None) -> None:
        self.responses = responses
        self.close_after = close_after  # close each connection after this many responses
        self.connections = 0
        self.requests: list[bytes] = []
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.port = 0

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        served = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                body = await reader.readexactly(length)
                self.requests.append(head + body)
                script = self.responses[min(len(self.requests) - 1, len(self.responses) - 1)]
                for piece in script:
                    writer.write(piece)
                    await writer.drain()
                    await asyncio.sleep(0.002)
                served += 1
                if self.close_after is not None and served >= self.close_after:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    def _run(self) -> None:
        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
            self.port = server.sockets[0].getsockname()[1]
            self._ready.set()
            await self._stop.wait()
            server.close()

        asyncio.run(main())

    def __enter__(self) -> ScriptedServer:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        assert self._ready.wait(5)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._loop is not None and self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(5)


def chunked(*payloads: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in payloads) + b"0\r\n\r\n"


HEAD_CHUNKED = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
EVENTS = [
    b'data: {"choices":[{"index":0,"delta":{"content":" tok"}}]}\n\n',
    b'data: {"choices":[{"index":0,"delta":{"content":" tok tok"}}]}\n\n',
    b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":3}}\n\n',
    b"data: [DONE]\n\n",
]


def send(port: int, stack: str, n: int = 1, timeout: float = 5.0) -> list[Capture]:
    target = make_target(f"http://127.0.0.1:{port}", "/v1/chat/completions")
    prepared = [prepare(i, target, {"model": "m", "messages": []}, [("Content-Type", "application/json")], f"r{i}") for i in range(n)]

    async def main() -> list[Capture]:
        client = RawClient(timeout) if stack == "raw" else AiohttpClient(timeout)
        caps = [Capture(i) for i in range(n)]
        try:
            for p, c in zip(prepared, caps, strict=True):  # sequential: exercises keep-alive reuse
                await client.send(p, c)
        finally:
            await client.close()
        return caps

    return run_in_new_loop(main())


@pytest.fixture(params=["raw", "aiohttp"])
def stack(request: pytest.FixtureRequest) -> str:
    return request.param


def check_ok(cap: Capture) -> None:
    assert cap.error is None and cap.status == 200, cap.error
    assert b"".join(p for _, p in cap.reads) == b"".join(EVENTS)
    t = parse_capture(cap, prompt_len=3, tokenizer=None)
    assert t.success and t.output_tokens == 3 and len(t.chunk_times) == 2


def test_chunked_stream_split_everywhere(stack: str) -> None:
    raw = HEAD_CHUNKED + chunked(*EVENTS)
    # byte by byte: every chunk-size line, CRLF and payload is cut
    with ScriptedServer([[raw[i : i + 1] for i in range(len(raw))]]) as srv:
        (cap,) = send(srv.port, stack)
    check_ok(cap)


def test_one_sse_event_over_several_http_chunks_and_reads(stack: str) -> None:
    body = b"".join(EVENTS)
    raw = HEAD_CHUNKED + chunked(body[:5], body[5:90], body[90:])
    with ScriptedServer([[raw[:50], raw[50:51], raw[51:200], raw[200:]]]) as srv:
        (cap,) = send(srv.port, stack)
    check_ok(cap)
    assert len(cap.reads) >= 2  # times per read are kept


def test_huge_single_chunk(stack: str) -> None:
    event = b'data: {"choices":[{"index":0,"delta":{"content":"' + b"y" * 1_500_000 + b'"}}]}\n\n'
    raw = HEAD_CHUNKED + chunked(event, EVENTS[2], EVENTS[3])
    with ScriptedServer([[raw]]) as srv:
        (cap,) = send(srv.port, stack)
    t = parse_capture(cap, prompt_len=1, tokenizer=None)
    assert t.success and len(t.chunk_times) == 1


def test_keep_alive_reuses_one_connection(stack: str) -> None:
    raw = HEAD_CHUNKED + chunked(*EVENTS)
    with ScriptedServer([[raw]]) as srv:
        caps = send(srv.port, stack, n=3)
        for cap in caps:
            check_ok(cap)
        assert srv.connections == 1
        assert all(b"x-request-id: r" in r for r in srv.requests)


def test_server_closing_kept_alive_connection_is_retried(stack: str) -> None:
    raw = HEAD_CHUNKED + chunked(*EVENTS)
    with ScriptedServer([[raw]], close_after=1) as srv:
        caps = send(srv.port, stack, n=3)
    for cap in caps:
        check_ok(cap)


def test_content_length_error_response(stack: str) -> None:
    body = b'{"error": {"message": "model not found", "type": "NotFoundError", "code": 404}}'
    raw = b"HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    with ScriptedServer([[raw[:30], raw[30:]]]) as srv:
        (cap,) = send(srv.port, stack)
    t = parse_capture(cap, prompt_len=1, tokenizer=None)
    assert not t.success and t.error.startswith("HTTP 404 Not Found: model not found")


def test_truncated_stream_is_a_failure(stack: str) -> None:
    raw = HEAD_CHUNKED + chunked(*EVENTS)
    cut = raw[: raw.index(b"[DONE]") - 20]  # the server dies mid-stream
    with ScriptedServer([[cut]], close_after=1) as srv:
        (cap,) = send(srv.port, stack)
    assert cap.error is not None
    assert not parse_capture(cap, prompt_len=1, tokenizer=None).success


def test_close_delimited_body_and_interim_100() -> None:
    raw = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + b"".join(EVENTS)
    with ScriptedServer([[raw]], close_after=1) as srv:
        (cap,) = send(srv.port, "raw")
    check_ok(cap)


def test_timeout(stack: str) -> None:
    raw = HEAD_CHUNKED + chunked(EVENTS[0])
    hang = [raw[:-5]] + [b""] * 1  # never sends the end; the script pauses, the client gives up
    with ScriptedServer([hang + [b"" for _ in range(200)]]) as srv:
        (cap,) = send(srv.port, stack, timeout=0.2)
    assert cap.error is not None and "0.2" in cap.error


def test_connection_refused() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (cap,) = send(port, "raw")
    assert cap.status == 0 and "cannot connect" in (cap.error or "")


def test_target_joins_v1_once() -> None:
    assert make_target("http://h:8000/v1", "/v1/completions").path == "/v1/completions"
    assert make_target("http://h:8000/v1/", "/v1/completions").path == "/v1/completions"
    assert make_target("http://h:8000/proxy", "/v1/completions").path == "/proxy/v1/completions"
    t = make_target("https://example.com", "v1/chat/completions")
    assert (t.port, t.host_header, t.url) == (443, "example.com", "https://example.com:443/v1/chat/completions")


def test_prepared_request_bytes() -> None:
    p: Prepared = prepare(0, make_target("http://127.0.0.1:9", "/v1/completions"), {"prompt": "é"}, [("A", "b")], "id-0")
    head, body = p.raw.split(b"\r\n\r\n", 1)
    assert head.startswith(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:9\r\n")
    assert b"\r\nx-request-id: id-0" in head and b"\r\nContent-Length: %d" % len(body) in head
    assert json.loads(body) == {"prompt": "é"}


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    yield
