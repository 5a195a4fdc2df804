"""A stand-in for llama.cpp's llama-server: its real flags, /health semantics, version format
and log lines (as in fixtures/server.log, captured from llama-server 0.6.0-dev)."""

import argparse
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

p = argparse.ArgumentParser(prog="llama-server")
p.add_argument("-m", "--model")
p.add_argument("-hf", "--hf-repo")
p.add_argument("--host", default="127.0.0.1")
p.add_argument("--port", type=int, default=8080)
p.add_argument("-a", "--alias")
p.add_argument("-c", "--ctx-size", type=int)
p.add_argument("-np", "--parallel", type=int)
p.add_argument("-b", "--batch-size", type=int)
p.add_argument("-ctk", "--cache-type-k")
p.add_argument("-ctv", "--cache-type-v")
p.add_argument("--cache-prompt", action="store_true")
p.add_argument("--no-cache-prompt", action="store_true")
p.add_argument("--reasoning-format")
p.add_argument("-ngl", "--n-gpu-layers")
p.add_argument("-sm", "--split-mode")
p.add_argument("-fa", "--flash-attn")
p.add_argument("--version", action="store_true")
args = p.parse_args()
if args.version:
    # the real format (llama_print_build_info); build number and commit are the stand-in's own
    print("version: 0.6.0-dev (build 1, commit abcdef0)\nbuilt with cc for x86_64-linux-gnu", file=sys.stderr)
    sys.exit(0)
name = args.alias or args.model or args.hf_repo
loaded = threading.Event()


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
            if loaded.is_set():
                self._json(200, {"status": "ok"})
            else:
                self._json(503, {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}})
        elif self.path == "/v1/models":
            self._json(200, {"object": "list", "data": [{"id": name, "object": "model", "owned_by": "llamacpp"}]})
        else:
            self._json(404, {"error": {"code": 404, "message": "File Not Found"}})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        n = int(body.get("max_tokens") or 16)
        if not loaded.is_set():
            return self._json(503, {"error": {"code": 503, "message": "Loading model"}})
        choice = {"index": 0, "text": " hi" * n, "finish_reason": "length"}
        if self.path == "/v1/chat/completions":
            choice = {"index": 0, "message": {"role": "assistant", "content": " hi" * n}, "finish_reason": "length"}
        self._json(200, {"object": "text_completion", "model": name, "choices": [choice],
                         "usage": {"prompt_tokens": 2, "completion_tokens": n, "total_tokens": n + 2}})

    def log_message(self, *a):
        pass


server = ThreadingHTTPServer((args.host, args.port), H)
threading.Thread(target=server.serve_forever, daemon=True).start()
print("0.00.001.521 I srv  llama_server: initializing ...", flush=True)
print(f"0.00.006.742 I srv    load_model: loading model '{args.model or args.hf_repo}'", flush=True)
threading.Event().wait(0.2)  # "loading the model" while /health says 503
slots = args.parallel or 4
print(f"0.00.076.879 I srv    load_model: initializing, n_slots = {slots}, n_ctx_slot = {(args.ctx_size or 4096) // slots}, "
      "kv_unified = 'false'", flush=True)
loaded.set()
print("0.00.080.592 I srv  llama_server: model loaded", flush=True)
print(f"0.00.080.619 I srv  llama_server: listening on http://{args.host}:{args.port}", flush=True)
threading.Event().wait()
