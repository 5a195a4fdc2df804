"""A tiny OpenAI-compatible streaming server for the benchmark client's tests.

It runs on its own event loop in a background thread (the client under test runs its own
loop in the test's thread), binds port 0, and streams like vLLM: one SSE event per token
(" tok" per token, as perflab's simulator), a final usage chunk, ``data: [DONE]``. Prompt
tokens are counted by whitespace like the simulator. The ``model`` field picks a behaviour:

- ``ok`` (anything else): normal stream;
- ``multi-K``: K tokens per chunk (speculative decoding);
- ``error-after-K``: ``data: {"error": ...}`` after K tokens, then the stream ends;
- ``http-500``: an HTTP 500 with an OpenAI error body;
- ``no-usage``: no usage chunk;
- ``hang-after-K``: K tokens, then nothing more (the connection stays open: a hung engine);
- ``queued-MS``: one request at a time (the others wait, without a byte), each taking MS
  milliseconds and then written whole in one burst — tokens, usage and ``[DONE]`` — as the real
  vLLM CPU build answered 3000 requests at once with ``--max-num-seqs 4`` (its API server
  merges a request's deltas while it is behind);
- ``sim``: adds the header ``x-perflab-time-scale: <time_scale>`` (TIME_SCALE_HEADER);
- ``lying-usage``: a normal stream whose usage says ``prompt_tokens: -5``,
  ``completion_tokens: 1000000`` (issue 24 item 8);
- ``beyond-max-K``: K tokens more than max_tokens, usage counting them truly;
- ``endless``: a token every 10 ms for ever (until the client closes the connection); the
  one-token test request is answered normally.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator

import pytest
from aiohttp import web

from perflab.bench.serverclock import TIME_SCALE_HEADER


class FakeOpenAIServer:
    def __init__(self, *, gap_s: float = 0.0, time_scale: float = 1.0) -> None:
        self.gap_s = gap_s
        self.time_scale = time_scale
        self.requests: list[dict] = []
        self.headers: list[dict] = []
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stopping = False
        self._engine: asyncio.Lock | None = None  # queued-MS: one request at a time

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # ------------------------------------------------------------------ handlers

    async def _stream(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append(body)
        self.headers.append({k.lower(): v for k, v in request.headers.items()})
        model = str(body.get("model", "ok"))
        chat = "messages" in body
        if chat:
            prompt = "\n".join(m["content"] for m in body["messages"] if isinstance(m.get("content"), str))
            n = int(body.get("max_completion_tokens") or body.get("max_tokens") or 16)
        else:
            prompt = body["prompt"]
            n = int(body.get("max_tokens") or 16)
        prompt_tokens = max(1, len(prompt.split()))
        if model == "http-500":
            return web.json_response({"error": {"message": "engine is dead", "type": "InternalServerError", "code": 500}}, status=500)
        per_chunk = int(model.split("-")[1]) if model.startswith("multi-") else 1
        error_after = int(model.split("-")[2]) if model.startswith("error-after-") else None
        hang_after = int(model.split("-")[2]) if model.startswith("hang-after-") else None
        if model.startswith("beyond-max-"):
            n += int(model.split("-")[2])
        if model == "endless" and n > 1:
            n = 1 << 62
        headers = {"Content-Type": "text/event-stream"}
        if model == "sim":
            headers[TIME_SCALE_HEADER] = repr(self.time_scale)
        resp = web.StreamResponse(headers=headers)
        await resp.prepare(request)

        def event(obj: object) -> bytes:
            return b"data: " + json.dumps(obj).encode() + b"\n\n"

        if model.startswith("queued-"):
            if self._engine is None:
                self._engine = asyncio.Lock()
            async with self._engine:
                await asyncio.sleep(int(model.split("-")[1]) / 1000)
                text = " tok"
                pieces = [event({"id": "x", "object": "chunk", "model": model,
                                 "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None} if chat
                                             else {"index": 0, "text": text, "finish_reason": None}]}) for _ in range(n)]
                usage = {"prompt_tokens": prompt_tokens, "completion_tokens": n, "total_tokens": prompt_tokens + n}
                pieces.append(event({"id": "x", "object": "chunk", "model": model, "choices": [], "usage": usage}))
                await resp.write(b"".join(pieces) + b"data: [DONE]\n\n")
            await resp.write_eof()
            return resp
        sent = 0
        while sent < n:
            if error_after is not None and sent >= error_after:
                await resp.write(event({"error": {"message": "CUDA out of memory", "type": "InternalServerError", "code": 500}}))
                await resp.write_eof()
                return resp
            if hang_after is not None and sent >= hang_after:
                # until the client closes the connection (aiohttp no longer cancels handlers)
                while request.transport is not None and not request.transport.is_closing() and not self._stopping:
                    await asyncio.sleep(0.02)
                return resp
            k = min(per_chunk, n - sent)
            text = " tok" * k
            choice = {"index": 0, "delta": {"content": text}, "finish_reason": None} if chat else {"index": 0, "text": text, "finish_reason": None}
            try:
                await resp.write(event({"id": "x", "object": "chunk", "model": model, "choices": [choice]}))
            except ConnectionResetError:  # the client cut the stream
                return resp
            sent += k
            if model == "endless" and (request.transport is None or request.transport.is_closing() or self._stopping):
                return resp
            if self.gap_s or model == "endless":
                await asyncio.sleep(self.gap_s or 0.01)
            else:
                await asyncio.sleep(0)
        if model != "no-usage":
            usage = {"prompt_tokens": prompt_tokens, "completion_tokens": n, "total_tokens": prompt_tokens + n}
            if model == "lying-usage":
                usage = {"prompt_tokens": -5, "completion_tokens": 1000000, "total_tokens": 999995}
            await resp.write(event({"id": "x", "object": "chunk", "model": model, "choices": [], "usage": usage}))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    # ------------------------------------------------------------------ lifecycle

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._stream)
        app.router.add_post("/v1/completions", self._stream)
        self._runner = web.AppRunner(app, access_log=None)
        loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._ready.set()
        loop.run_forever()
        loop.run_until_complete(self._runner.cleanup())
        loop.close()

    def start(self) -> FakeOpenAIServer:
        self._thread = threading.Thread(target=self._run, name="fake-openai", daemon=True)
        self._thread.start()
        assert self._ready.wait(10), "fake server did not start"
        return self

    def stop(self) -> None:
        self._stopping = True
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(10)


@pytest.fixture
def fake_server() -> Iterator[FakeOpenAIServer]:
    server = FakeOpenAIServer().start()
    try:
        yield server
    finally:
        server.stop()
