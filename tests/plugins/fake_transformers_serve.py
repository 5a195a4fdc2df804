"""A stand-in for ``transformers serve`` (5.19.0) for the conformance kit's full cycle: the flags
perflab emits, the model preloaded before Uvicorn's lines (as in
fixtures/real/transformers-5.19.0-cpu/serve-ready.log), /health, the pinned model, and the 422
for fields outside the OpenAI schema (serving/utils.py ``_validate_request``)."""

import argparse
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

p = argparse.ArgumentParser(prog="transformers")
p.add_argument("command", choices=["serve"])
p.add_argument("force_model")
p.add_argument("--device", default="auto")
p.add_argument("--dtype", default="auto")
p.add_argument("--host", default="localhost")
p.add_argument("--port", type=int, default=8000)
p.add_argument("--continuous-batching", action="store_true")
p.add_argument("--cb-max-batch-tokens", type=int)
p.add_argument("--cb-max-memory-percent", type=float)
p.add_argument("--quantization")
args = p.parse_args()
OPENAI = {"model", "messages", "max_tokens", "max_completion_tokens", "stream", "stream_options", "temperature", "prompt"}


class H(BaseHTTPRequestHandler):
    def _json(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/health":
            return self._json(200, {"status": "ok"})
        self._json(404, {"detail": "Not Found"})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        unexpected = set(body) - OPENAI
        if unexpected:
            return self._json(422, {"detail": f"Unexpected fields in the request: {unexpected}"})
        if body.get("model") not in (None, args.force_model):
            return self._json(400, {"detail": f"Server is pinned to '{args.force_model}'; requested '{body['model']}'."})
        n = int(body.get("max_tokens") or 16)
        choice = {"index": 0, "message": {"role": "assistant", "content": " hi" * n}, "finish_reason": "length"}
        self._json(200, {"object": "chat.completion", "model": args.force_model, "choices": [choice],
                         "usage": {"prompt_tokens": 2, "completion_tokens": n, "total_tokens": n + 2}})

    def log_message(self, *a):
        pass


print(f"[transformers] Loading {args.force_model}@main", flush=True)
server = ThreadingHTTPServer((args.host, args.port), H)
threading.Thread(target=server.serve_forever, daemon=True).start()
print("INFO:     Application startup complete.", flush=True)
print(f"INFO:     Uvicorn running on http://{args.host}:{args.port} (Press CTRL+C to quit)", flush=True)
threading.Event().wait()
