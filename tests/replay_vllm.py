"""A stand-in for vLLM 0.32's API server that replays a real fault log (stdlib only).

    python replay_vllm.py --host H --port P --log faults/CASE.log [--exit-code N] [options]

Start-up faults (the log has no "Starting vLLM server on" line): print the log, then exit with
``--exit-code`` (negative: die by that signal), as the real server did. Otherwise print the log
up to the ready line, serve /health, /v1/models and /v1/completions, and ``--fault-after`` s
after the first generation replay the rest of the log and behave as the real server did:

* ``--fault engine-core-died``: GET /health answers 200 once more, then 503; POST answers 500
  with vLLM's EngineDeadError body; the process exits 0 after 1.1 s unless ``--keep-alive``
  (VLLM_KEEP_ALIVE_ON_ENGINE_DEATH=1), then it lives on (observed, faults.json).
* ``--fault sigkill``: the process kills itself with SIGKILL (``kill -9`` of the API server).

Readiness options: ``--health-503-until-ready S`` (listen at once, /health 503 for S seconds,
then print the ready line and answer 200), ``--gen-status N`` (every generation answers HTTP N),
``--api-key K`` (as vLLM 0.32's AuthenticationMiddleware: /v1/* without the key answer 401
``{"error": "Unauthorized"}``, entrypoints/serve/middleware/authenticate.py).
Each request is logged as uvicorn does (an INFO line), for the tests to count.
"""

import argparse
import http.server
import json
import os
import re
import signal
import threading
import time

ap = argparse.ArgumentParser()
ap.add_argument("--host")
ap.add_argument("--port", type=int)
ap.add_argument("--log")
ap.add_argument("--exit-code", type=int, default=1)
ap.add_argument("--fault", default="")
ap.add_argument("--fault-after", type=float, default=0.3)
ap.add_argument("--keep-alive", action="store_true")
# after the death, GET /health never answers (an API server swamped by open streams)
ap.add_argument("--health-hangs-when-dead", action="store_true")
ap.add_argument("--health-503-until-ready", type=float, default=0.0)
ap.add_argument("--gen-status", type=int, default=200)
# like vLLM's: /v1/* answer 401 without "Authorization: Bearer KEY"; REPLAY_API_KEY stands for a
# key perflab cannot know (set outside the engine's argv and VLLM_API_KEY)
ap.add_argument("--api-key", default=os.environ.get("REPLAY_API_KEY", ""))
a = ap.parse_args()

DEAD_BODY = {"error": {"message": "EngineCore encountered an issue. See stack trace (above) for the root cause.",
                       "type": "InternalServerError", "param": None, "code": 500}}
lines = open(a.log, encoding="utf-8").read().splitlines()
ready_at = next((i for i, ln in enumerate(lines) if "Starting vLLM server on" in ln), None)


def say(line):
    os.write(1, (line + "\n").encode())


def die(code):
    if code < 0:
        if -code != signal.SIGKILL:
            signal.signal(-code, signal.SIG_DFL)  # Python turns SIGINT into KeyboardInterrupt
        os.kill(os.getpid(), -code)
        time.sleep(5)
    os._exit(code)


if ready_at is None:
    for ln in lines:
        say(ln)
    die(a.exit_code)

for ln in lines[:ready_at]:
    say(ln)

state = {"ready": a.health_503_until_ready <= 0, "dead": False, "health_after_death": 0, "faulted": False}
rest = lines[ready_at + 1:]
first_post = next((i for i, ln in enumerate(rest) if '"POST /v1/completions' in ln), -1)


def fault():
    time.sleep(a.fault_after)
    if a.fault == "sigkill":
        die(-signal.SIGKILL)
    for ln in rest[first_post + 1:]:
        if '"GET /health' in ln or '"POST /v1/' in ln:
            continue  # the capture's own requests; this replay logs the test's
        say(ln)
    state["dead"] = True
    if not a.keep_alive:
        time.sleep(1.1)
        say("INFO:     Finished server process")
        die(0)


class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        say('INFO:     %s - "%s" %s' % (self.client_address[0], self.requestline, args[1] if len(args) > 1 else ""))

    def send(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def unauthorized(self):
        if a.api_key and self.path.startswith("/v1") and self.headers.get("Authorization") != f"Bearer {a.api_key}":
            self.send(401, {"error": "Unauthorized"})
            return True
        return False

    def do_GET(self):
        if self.unauthorized():
            return
        if self.path == "/health":
            if state["dead"] and a.health_hangs_when_dead:
                time.sleep(3600)
            if state["dead"]:
                state["health_after_death"] += 1
                self.send(200 if state["health_after_death"] == 1 else 503, {})
            else:
                self.send(200 if state["ready"] else 503, {})
        elif self.path == "/v1/models":
            self.send(200, {"object": "list", "data": [{"id": "tiny", "object": "model"}]})
        else:
            self.send(404, {"detail": "Not Found"})

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.unauthorized():
            return
        if state["dead"]:
            self.send(500, DEAD_BODY)
            return
        if a.gen_status != 200:
            self.send(a.gen_status, {"error": {"message": f"replayed HTTP {a.gen_status}", "code": a.gen_status}})
            return
        self.send(200, {"object": "text_completion", "model": "tiny",
                        "choices": [{"index": 0, "text": " hi", "finish_reason": "length"}],
                        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})
        if a.fault and not state["faulted"]:
            state["faulted"] = True
            threading.Thread(target=fault, daemon=True).start()


class S(http.server.ThreadingHTTPServer):
    allow_reuse_address = True
    daemon_threads = True


server = S((a.host, a.port), H)
if a.health_503_until_ready > 0:
    threading.Thread(target=server.serve_forever, daemon=True).start()
    time.sleep(a.health_503_until_ready)
    state["ready"] = True
say(re.sub(r"http://\S+", f"http://{a.host}:{a.port}", lines[ready_at]))
for ln in rest[: max(first_post, 0)]:
    if '"GET /health' not in ln:
        say(ln)
if a.health_503_until_ready > 0:
    while True:
        time.sleep(3600)
server.serve_forever()
