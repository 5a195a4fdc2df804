"""A small non-streaming OpenAI-compatible server for the accuracy tests (lm-eval's API models
send plain JSON requests and read whole answers).

It runs on its own event loop in a background thread and binds port 0. It recognises the
shipped task's questions (:func:`perflab.accuracy.tasks.find_item` on the prompt, as the
simulator does), so the score it earns is known exactly. The ``model`` field picks a behaviour:

- ``oracle``: the worked solution and ``#### <target>`` (every item right);
- ``even``: right when the target is even, ``#### -1`` otherwise;
- ``wrong``: ``#### -1``;
- ``http-500``: HTTP 500 whose error message quotes the request's Authorization header (a
  server that echoes a secret: perflab must mask it);
- ``hang``: answers (wrongly) only once ``released`` is set, or never (until the client gives up);
- ``garbage``: HTTP 200 with a JSON body that is not a completion;
- ``no-answer``: HTTP 200 with choices that carry no answer (no index, message or text).

Every request's headers and body are kept (``requests``), to check what was sent.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest
from aiohttp import web
from perflab.accuracy.tasks import find_item


class FakeEvalServer:
    def __init__(self) -> None:
        self.requests: list[tuple[dict[str, str], dict]] = []
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stopping = False
        self.released = threading.Event()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _answer(self, model: str, prompt: str) -> str:
        item = find_item(prompt)
        if item is None:
            return "I do not know."
        right = f"{item.answer}"
        if model == "oracle" or (model == "even" and item.target % 2 == 0):
            return right
        return "I think it is\n#### -1"

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        headers = {k.lower(): v for k, v in request.headers.items()}
        self.requests.append((headers, body))
        model = str(body.get("model", ""))
        if model == "http-500":
            auth = headers.get("authorization", "")
            return web.json_response({"error": {"message": f"engine failed for {auth}", "type": "InternalServerError",
                                                "code": 500}}, status=500)
        if model == "hang":
            while not self.released.is_set():
                if self._stopping or request.transport is None or request.transport.is_closing():
                    return web.Response(status=503)
                await asyncio.sleep(0.05)
        if model == "garbage":
            return web.json_response({"hello": "world"})
        if model == "no-answer":  # choices, but none carries an answer lm-eval can read
            return web.json_response({"choices": [{"finish_reason": "stop"}]})
        chat = "messages" in body
        if chat:
            prompt = "\n".join(m["content"] for m in body["messages"] if isinstance(m.get("content"), str))
        else:
            prompt = str(body["prompt"])
        text = self._answer(model, prompt)
        choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"} if chat
                  else {"index": 0, "text": text, "finish_reason": "stop"})
        return web.json_response({"id": "x", "object": "chat.completion" if chat else "text_completion",
                                  "model": model, "choices": [choice],
                                  "usage": {"prompt_tokens": len(prompt.split()), "completion_tokens": len(text.split()),
                                            "total_tokens": len(prompt.split()) + len(text.split())}})

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._handle)
        app.router.add_post("/v1/completions", self._handle)
        runner = web.AppRunner(app, access_log=None)
        loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._ready.set()
        loop.run_forever()
        loop.run_until_complete(runner.cleanup())
        loop.close()

    def start(self) -> FakeEvalServer:
        self._thread = threading.Thread(target=self._run, name="fake-eval-server", daemon=True)
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
def eval_server() -> Iterator[FakeEvalServer]:
    server = FakeEvalServer().start()
    try:
        yield server
    finally:
        server.stop()
