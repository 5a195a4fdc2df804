"""Run-to-run noise of the simulator: the same benchmark N times, idle and beside a CPU hog.

One simulated engine (the demo's: vLLM serving Qwen/Qwen3-32B on ``sim:a100-80g-x8``) is
launched by perflab's supervisor and benchmarked N times with the demo's main profile
(synthetic ShareGPT, 1000 prompts, all at once), first on an idle machine, then while
``--hogs`` CPU-bound processes run beside it. Each run is measured twice from the same
captures: by the wall clock (``host``: arrival times × time scale, the simulator's numbers
before issue #12) and by the engine's model clock (``model``: the ``: perflab-sim-clock``
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
    from perflab.hardware import resolve
    from perflab.lab.demo import demo_plan
    from perflab.plugins import load
    from perflab.supervisor import supervise
    from perflab.types import ServeConfig

    state = workdir / "sim-state"
    state.mkdir()
    pm = load()
    env = {**os.environ, "PERFLAB_SIM_TIME_SCALE": f"{args.time_scale:g}", "PERFLAB_SIM_STATE_DIR": str(state)}
    hw, env = resolve(pm, "sim:a100-80g-x8", env)
    plan = demo_plan()
    profile = plan.profile(args.profile)
    config = ServeConfig(model=plan.model, max_model_len=32768)  # the demo's vLLM
    out: dict[str, Any] = {}
    async with supervise(pm, "vllm", config, hardware=hw, env=env, workdir=workdir / "run", grace=2.0,
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--time-scale", type=float, default=40.0, help="the demo's (40)")
    ap.add_argument("--profile", default="sharegpt", help="a profile of the demo plan (default: its main profile)")
    ap.add_argument("--hogs", type=int, default=1, help="CPU-bound processes beside the busy runs")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    import structlog

    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))  # stdout: the figures only
    with tempfile.TemporaryDirectory(prefix="perflab-noise-") as tmp:
        data = anyio.run(measure, args, Path(tmp))
    summary = {load: {clock: {k: {"rsd_pct": rsd([r[k] for r in runs]),
                                  "min": min(r[k] for r in runs), "max": max(r[k] for r in runs)} for k in KEYS}
                      for clock, runs in by_clock.items()} for load, by_clock in data.items()}
    if args.json:
        print(json.dumps({"runs": data, "summary": summary, "time_scale": args.time_scale, "hogs": args.hogs}, indent=2))
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
