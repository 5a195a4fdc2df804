"""How much streaming load can the benchmark client itself take? (perflab issue #4)

Starts a minimal, fast OpenAI-style streaming server on loopback in its own process (raw
asyncio protocol on uvloop, one SSE chunk per token, callbacks instead of tasks), then drives
it at several concurrencies with 0 ms and 20 ms between tokens, with:

- ``perflab``: perflab's client through its public API (``run_benchmark_sync``), raw stack;
- ``perflab-aiohttp``: the same with ``--http-stack aiohttp``;
- ``perflab-w2``: ``--workers 2`` (at concurrency >= 512);
- ``bare-aiohttp``: a bare aiohttp + uvloop loop of a few dozen lines (one Python process'
  practical limit: no parsing at all, a timestamp per read);
- ``httpx``: httpx's own connection pool, streaming (the stack not chosen);
- ``guidellm``: when the ``guidellm`` command is installed.

For each it prints the achieved requests/s, streamed chunks/s, client CPU per chunk (the
client's process CPU time during the run / chunks), and the error of the measured TTFT: the
client's receive time of the first chunk minus the server's own send time of it (both
``time.perf_counter()``, CLOCK_MONOTONIC, one clock for the whole machine), p50 and p99.

Run::

    .venv/bin/python benchmarks/bench_client_capacity.py            # full matrix, about 2.5 min
    .venv/bin/python benchmarks/bench_client_capacity.py --quick    # 64 and 512 only

It bounds its own run time (``--budget-s``; each run also stops at ``--run-timeout-s``) and
always stops its server process.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from time import perf_counter, process_time

# --------------------------------------------------------------------------- the server

CHUNK = (
    b'data: {"id":"chatcmpl-0","object":"chat.completion.chunk","created":0,"model":"m",'
    b'"choices":[{"index":0,"delta":{"content":" tok"},"logprobs":null,"finish_reason":null}]}\n\n'
)
HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\nConnection: keep-alive\r\n\r\n"


def _frame(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


FRAMED_CHUNK = _frame(CHUNK)


def _tail(n: int, prompt_tokens: int) -> bytes:
    usage = (
        b'data: {"id":"chatcmpl-0","object":"chat.completion.chunk","created":0,"model":"m","choices":[],'
        b'"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}}\n\n' % (prompt_tokens, n, n + prompt_tokens)
    )
    return _frame(usage) + _frame(b"data: [DONE]\n\n") + b"0\r\n\r\n"


def serve(gap_ms: float) -> None:
    """The streaming server (``--serve``): prints its port, runs until SIGTERM."""
    import uvloop

    gap = gap_ms / 1000.0
    first_sent: dict[str, float] = {}

    class Stream:
        __slots__ = ("proto", "n", "k", "rid", "tail")

        def __init__(self, proto: Proto, n: int, rid: str | None, tail: bytes) -> None:
            self.proto, self.n, self.k, self.rid, self.tail = proto, n, 0, rid, tail

        def step(self) -> None:
            t = self.proto.transport
            if t.is_closing():
                return
            if self.k == 0 and self.rid:
                first_sent[self.rid] = perf_counter()
            t.write(FRAMED_CHUNK)
            self.k += 1
            if self.k >= self.n:
                t.write(self.tail)
                self.proto.busy = False
                self.proto.maybe_next()
            elif gap:
                loop.call_later(gap, self.step)
            else:
                loop.call_soon(self.step)

    class Proto(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport = transport  # type: ignore[assignment]
            self.buf = b""
            self.busy = False

        def data_received(self, data: bytes) -> None:
            self.buf += data
            self.maybe_next()

        def maybe_next(self) -> None:
            if self.busy:
                return
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            lines = self.buf[:end].decode("latin-1").split("\r\n")
            length, rid = 0, None
            for line in lines[1:]:
                name, _, value = line.partition(":")
                name = name.strip().lower()
                if name == "content-length":
                    length = int(value)
                elif name == "x-request-id":
                    rid = value.strip()
            if len(self.buf) < end + 4 + length:
                return
            body = self.buf[end + 4 : end + 4 + length]
            self.buf = self.buf[end + 4 + length :]
            if lines[0].startswith("GET /stats"):
                payload = json.dumps(first_sent).encode()
                first_sent.clear()
                self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(payload), payload))
                return self.maybe_next()
            try:
                req = json.loads(body)
            except ValueError:
                req = {}
            n = int(req.get("max_completion_tokens") or req.get("max_tokens") or 16)
            prompt = req.get("prompt") or " ".join(str(m.get("content", "")) for m in req.get("messages", []))
            self.busy = True
            self.transport.write(HEAD)
            Stream(self, max(1, n), rid, _tail(n, max(1, len(str(prompt).split())))).step()

    async def main() -> None:
        server = await loop.create_server(Proto, "127.0.0.1", 0, backlog=8192)
        print(server.sockets[0].getsockname()[1], flush=True)
        stop = asyncio.Event()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        await stop.wait()
        server.close()

    loop = uvloop.new_event_loop()
    asyncio.set_event_loop(loop)
    loop.run_until_complete(main())


class Server:
    """The server in its own process; always stopped on exit."""

    def __init__(self, gap_ms: float) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--serve", "--gap-ms", str(gap_ms)], stdout=subprocess.PIPE, text=True
        )
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if not line.strip().isdigit():
            self.stop()
            raise RuntimeError("capacity server did not start")
        self.port = int(line)
        self.url = f"http://127.0.0.1:{self.port}"

    def first_sent(self) -> dict[str, float]:
        import urllib.request

        with urllib.request.urlopen(f"{self.url}/stats", timeout=10) as resp:
            return json.loads(resp.read())

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


# --------------------------------------------------------------------------- measurements


@dataclass
class Run:
    client: str
    concurrency: int
    gap_ms: float
    requests: int = 0
    chunks: int = 0
    duration_s: float = 0.0
    cpu_s: float = 0.0
    ttft_errors_ms: list[float] = field(default_factory=list)
    note: str = ""

    def row(self) -> str:
        if self.note and not self.requests:
            return f"{self.client:<16} {self.concurrency:>5} {self.gap_ms:>4g}  {self.note}"
        rps = self.requests / self.duration_s if self.duration_s else 0.0
        cps = self.chunks / self.duration_s if self.duration_s else 0.0
        cpu = self.cpu_s / self.chunks * 1000 if self.chunks else float("nan")
        errs = sorted(self.ttft_errors_ms)
        p50 = _pct(errs, 50)
        p99 = _pct(errs, 99)
        return (
            f"{self.client:<16} {self.concurrency:>5} {self.gap_ms:>4g} {rps:>9.0f} {cps:>11,.0f} {cpu:>9.4f}"
            f" {p50:>8.2f} {p99:>8.2f}  {self.note}"
        )


def _pct(xs: list[float], p: float) -> float:
    if not xs:
        return float("nan")
    k = (len(xs) - 1) * p / 100
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


HEADER = (
    f"{'client':<16} {'conc':>5} {'gap':>4} {'req/s':>9} {'chunks/s':>11} {'cpu ms/ch':>9} {'ttft-err':>8} {'p99':>8}\n"
    f"{'':<16} {'':>5} {'ms':>4} {'':>9} {'':>11} {'':>9} {'p50 ms':>8} {'ms':>8}"
)


def run_perflab(server: Server, conc: int, gap_ms: float, n: int, tokens: int, *, stack: str = "raw", workers: int = 1) -> Run:
    from perflab.bench import BenchRequest, run_benchmark_sync

    req = BenchRequest(
        base_urls=(server.url,),
        model="m",
        num_prompts=n,
        random_input_len=8,
        random_output_len=tokens,
        max_concurrency=conc,
        tokenizer="whitespace",
        http_stack=stack,
        workers=workers,
        timeout=120,
    )
    server.first_sent()  # drop the probe's record
    result = run_benchmark_sync(req)
    sent = server.first_sent()
    name = "perflab" + ("" if stack == "raw" else "-" + stack) + (f"-w{workers}" if workers > 1 else "")
    run = Run(name, conc, gap_ms)
    ok = [t for t in result.requests if t.success]
    run.requests = len(ok)
    run.chunks = sum(len(t.chunk_times) for t in ok)
    run.duration_s = result.metrics["duration"]
    run.cpu_s = result.info["client_cpu_s"]
    origin, prefix = result.info["origin_perf_counter"], result.info["request_id_prefix"]
    for t in ok:
        s = sent.get(f"{prefix}{t.index}")
        if s is not None:
            run.ttft_errors_ms.append((origin + t.start + t.ttft - s) * 1000)
    if result.metrics["failed"]:
        run.note = f"{result.metrics['failed']} failed: {result.errors[0][:60]}"
    return run


BODY = json.dumps({"model": "m", "messages": [{"role": "user", "content": "a b c d e f g h"}], "max_tokens": 0, "stream": True}).encode()


def _body(tokens: int) -> bytes:
    return BODY.replace(b'"max_tokens":0', b'"max_tokens":%d' % tokens).replace(b'"max_tokens": 0', b'"max_tokens": %d' % tokens)


async def _bare_aiohttp(url: str, conc: int, n: int, tokens: int, deadline_s: float) -> tuple[int, int, float, float, dict[str, float]]:
    """The bare loop: aiohttp + uvloop, a timestamp per read and nothing else."""
    import aiohttp

    body = _body(tokens)
    first: dict[str, float] = {}
    counts = [0, 0]
    sem = asyncio.Semaphore(conc)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def one(i: int) -> None:
            rid = f"bare-{i}"
            async with sem, session.post(url, data=body, headers={"content-type": "application/json", "x-request-id": rid}) as r:
                got = False
                async for data in r.content.iter_any():
                    if not got:
                        first[rid] = perf_counter()
                        got = True
                    counts[1] += data.count(b'"choices":[{')
            counts[0] += 1

        gc.collect()
        gc.freeze()
        cpu0, t0 = process_time(), perf_counter()
        tasks = [asyncio.ensure_future(one(i)) for i in range(n)]
        await asyncio.wait(tasks, timeout=deadline_s)
        dt, cpu = perf_counter() - t0, process_time() - cpu0
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        gc.unfreeze()
    return counts[0], counts[1], dt, cpu, first


async def _httpx(url: str, conc: int, n: int, tokens: int, deadline_s: float) -> tuple[int, int, float, float, dict[str, float]]:
    """httpx with its own connection pool (what encode/httpx issue 3215 is about)."""
    import httpx

    body = _body(tokens)
    first: dict[str, float] = {}
    counts = [0, 0]
    sem = asyncio.Semaphore(conc)
    limits = httpx.Limits(max_connections=conc, max_keepalive_connections=conc)
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(deadline_s + 5)) as client:

        async def one(i: int) -> None:
            rid = f"httpx-{i}"
            async with sem, client.stream("POST", url, content=body, headers={"content-type": "application/json", "x-request-id": rid}) as r:
                got = False
                async for data in r.aiter_raw():
                    if not got:
                        first[rid] = perf_counter()
                        got = True
                    counts[1] += data.count(b'"choices":[{')
            counts[0] += 1

        gc.collect()
        gc.freeze()
        cpu0, t0 = process_time(), perf_counter()
        tasks = [asyncio.ensure_future(one(i)) for i in range(n)]
        await asyncio.wait(tasks, timeout=deadline_s)
        dt, cpu = perf_counter() - t0, process_time() - cpu0
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        gc.unfreeze()
    return counts[0], counts[1], dt, cpu, first


def run_loop(kind: str, server: Server, conc: int, gap_ms: float, n: int, tokens: int, deadline_s: float) -> Run:
    import uvloop

    server.first_sent()
    fn = _bare_aiohttp if kind == "bare-aiohttp" else _httpx
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        done, chunks, dt, cpu, first = runner.run(fn(f"{server.url}/v1/chat/completions", conc, n, tokens, deadline_s))
    sent = server.first_sent()
    run = Run(kind, conc, gap_ms, done, chunks, dt, cpu)
    run.ttft_errors_ms = [(first[k] - sent[k]) * 1000 for k in first if k in sent]
    if done < n:
        run.note = f"stopped at the {deadline_s:g} s limit ({done}/{n} requests)"
    return run


def run_guidellm(server: Server, conc: int, gap_ms: float, n: int, tokens: int, deadline_s: float) -> Run:
    run = Run("guidellm", conc, gap_ms)
    exe = shutil.which("guidellm")
    if exe is None:
        run.note = "not installed (pip install guidellm to compare)"
        return run
    out = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"guidellm-{os.getpid()}.json")
    argv = [
        exe, "benchmark", "--target", server.url, "--model", "m", "--rate-type", "concurrent",
        "--rate", str(conc), "--max-requests", str(n), "--max-seconds", str(int(deadline_s)),
        "--data", f"prompt_tokens=8,output_tokens={tokens}", "--output-path", out,
    ]  # fmt: skip
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=deadline_s + 60)
    except subprocess.TimeoutExpired:
        run.note = "timed out"
        return run
    if proc.returncode != 0:
        lines = [ln for ln in (proc.stderr or proc.stdout).splitlines() if ln.strip()]
        run.note = "failed: " + (lines[-1][:80] if lines else f"exit {proc.returncode}")
        return run
    try:
        data = json.loads(open(out, encoding="utf-8").read())
        bench = data["benchmarks"][0]
        m = bench["metrics"]
        run.duration_s = float(bench.get("duration") or bench["run_stats"]["end_time"] - bench["run_stats"]["start_time"])
        run.requests = int(m["request_totals"]["successful"])
        run.chunks = int(m["output_tokens_per_second"]["successful"]["mean"] * run.duration_s)
        run.note = "chunks = output tokens (guidellm's count)"
    except (OSError, KeyError, ValueError, TypeError) as exc:
        run.note = f"result not understood: {type(exc).__name__}: {exc}"
    return run


# --------------------------------------------------------------------------- main


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--gap-ms", type=float, default=0.0, help=argparse.SUPPRESS)
    ap.add_argument("--quick", action="store_true", help="concurrency 64 and 512 only")
    ap.add_argument("--concurrency", default="1,64,512,2048")
    ap.add_argument("--gaps", default="0,20", help="ms between tokens")
    ap.add_argument("--clients", default="perflab,perflab-aiohttp,perflab-w2,bare-aiohttp,httpx,guidellm")
    ap.add_argument("--budget-s", type=float, default=150.0, help="stop starting new runs after this long")
    ap.add_argument("--run-timeout-s", type=float, default=6.0, help="per run (bare/httpx loops are cut there)")
    args = ap.parse_args()
    if args.serve:
        serve(args.gap_ms)
        return 0

    concs = [64, 512] if args.quick else [int(c) for c in args.concurrency.split(",")]
    gaps = [float(g) for g in args.gaps.split(",")]
    clients = args.clients.split(",")
    t_start = time.monotonic()
    print(f"bench_client_capacity: {os.cpu_count()} CPUs, python {sys.version.split()[0]}; server: raw uvloop protocol, own process")
    print(HEADER)
    all_runs: list[Run] = []
    for gap in gaps:
        with Server(gap) as server:
            for conc in concs:
                # Sizes aim at 1-4 s per run on a 2-core machine.
                tokens = 64 if gap == 0 else 25
                n = max(2 * conc, 8) if gap else max(2 * conc, 400)
                if conc == 1:
                    n = 40 if gap == 0 else 4
                for client in clients:
                    if time.monotonic() - t_start > args.budget_s:
                        print(f"-- budget of {args.budget_s:g} s spent, remaining runs skipped")
                        return _summary(all_runs)
                    if client == "perflab-w2" and conc < 512:
                        continue
                    if client in ("perflab", "perflab-aiohttp", "perflab-w2"):
                        stack = "aiohttp" if client == "perflab-aiohttp" else "raw"
                        run = run_perflab(server, conc, gap, n, tokens, stack=stack, workers=2 if client == "perflab-w2" else 1)
                    elif client in ("bare-aiohttp", "httpx"):
                        run = run_loop(client, server, conc, gap, n, tokens, args.run_timeout_s)
                    elif client == "guidellm":
                        run = run_guidellm(server, conc, gap, n, tokens, args.run_timeout_s)
                    else:
                        print(f"unknown client {client!r}", file=sys.stderr)
                        return 2
                    all_runs.append(run)
                    print(run.row(), flush=True)
    return _summary(all_runs)


def _summary(runs: list[Run]) -> int:
    by = {(r.client, r.concurrency, r.gap_ms): r for r in runs}
    print("\nperflab vs bare aiohttp loop (chunks/s ratio; best perflab variant):")
    for (client, conc, gap), bare in sorted(by.items(), key=lambda kv: (kv[0][2], kv[0][1])):
        if client != "bare-aiohttp" or not bare.duration_s:
            continue
        mine = [by[k] for k in by if k[0].startswith("perflab") and k[1:] == (conc, gap) and by[k].duration_s]
        if not mine:
            continue
        best = max(mine, key=lambda r: r.chunks / r.duration_s)
        ratio = (best.chunks / best.duration_s) / (bare.chunks / bare.duration_s)
        print(f"  conc {conc:>5} gap {gap:>3g} ms: {ratio:6.2f}x ({best.client})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
