"""Crash-detection latency and teardown time of the engine supervisor.

* crash detection: time from the engine process' exit to the supervisor's ``crashed``
  state (cause classified, ``died`` set). The exit time is taken independently of the
  supervisor, by a thread blocked in ``select()`` on its own pidfd of the engine (readable at
  the exit; the engine is the keeper's child, not ours, so ``waitid`` cannot be used). The issue's bound is 1 s; the expected value is milliseconds.
* teardown: ``LaunchOutcome.teardown_s`` of an engine that exits on SIGTERM, and of one that
  ignores SIGTERM (it must take about ``--grace`` and then be SIGKILLed).

Engines: ``fake`` (default) is the stdlib fake engine of tests/test_supervisor.py, so the
numbers measure the supervisor alone; ``sim`` is the simulated vLLM (``--hardware
sim:a100-80g-x8``, faults through PERFLAB_SIM_FAULT), which adds its worker processes.

    .venv/bin/python benchmarks/bench_lifecycle.py [-n 10] [--engine fake|sim] [--grace 1] [--json-output]

Exit status 1 if a crash took 1 s or more to detect, or a teardown left something behind.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import anyio

ROOT = Path(__file__).resolve().parent.parent


class ExitClock:
    def __init__(self) -> None:
        self.exited_at: float | None = None

    def watch(self, pid: int) -> None:
        import select

        fd = os.pidfd_open(pid)  # opened now, while the process surely exists

        def wait() -> None:
            try:
                select.select([fd], [], [])
            finally:
                os.close(fd)
            self.exited_at = time.time()

        threading.Thread(target=wait, daemon=True).start()


class Setup:
    """What supervise() needs for one engine kind, and the fault / mode spelling."""

    def __init__(self, kind: str, tmp: Path) -> None:
        from perflab.contract.types import ServeConfig

        self.kind, self.tmp = kind, tmp
        if kind == "fake":
            sys.path.insert(0, str(ROOT / "tests"))
            from test_supervisor import Fake  # the tests' fake engine and plugin

            fake = Fake(tmp)
            self.pm, self.hardware, self.env = fake.pm, fake.hardware, fake.env
            self.engine = "fake"
            self.config = lambda mode: ServeConfig(model="fake/model", options={"mode": mode})
            self.base_env = dict(self.env)
            self.modes = {"crash": "crash-at-start", "normal": "normal", "stubborn": "ignore-sigterm,workers:2"}
        else:
            from perflab.hardware import resolve
            from perflab.plugins import load

            self.pm = load()
            self.engine = "vllm"
            state = tmp / "sim-state"  # our own simulated device memory, apart from other runs'
            state.mkdir()
            self.hardware, self.base_env = resolve(self.pm, "sim:a100-80g-x8", {
                **os.environ, "PERFLAB_SIM_TIME_SCALE": "20", "PERFLAB_SIM_STATE_DIR": str(state)})
            self.config = lambda mode: ServeConfig(model="Qwen/Qwen3-32B", tp=2)
            self.modes = {"crash": "crash-at-start", "normal": "", "stubborn": "ignore-sigterm"}

    def env_for(self, mode: str) -> dict[str, str]:
        if self.kind == "fake":
            return self.base_env
        env = dict(self.base_env)
        if mode:
            env["PERFLAB_SIM_FAULT"] = mode
        else:
            env.pop("PERFLAB_SIM_FAULT", None)
        return env


async def one(setup: Setup, which: str, grace: float, n: int) -> dict[str, Any]:
    from perflab.supervisor import supervise

    mode = setup.modes[which]
    clock = ExitClock()
    inst = supervise(setup.pm, setup.engine, setup.config(mode), hardware=setup.hardware, env=setup.env_for(mode),
                     workdir=setup.tmp / f"{which}-{n}", startup_timeout=120, grace=grace, on_started=clock.watch,
                     memory_settle_s=2.0)
    async with inst:
        o = inst.outcome
        if which != "crash" and o.state != "ready":
            raise SystemExit(f"{which}: engine not ready: {o.to_json()['reason']}")
    o = inst.outcome
    row: dict[str, Any] = {"state": o.state, "teardown_s": o.teardown_s, "leftovers": o.leftovers}
    if which == "crash":
        crashed_at = next((t for s, t in o.transitions if s == "crashed"), None)
        if crashed_at is None or clock.exited_at is None:
            raise SystemExit(f"crash run did not crash: {o.to_json()}")
        row["detect_s"] = crashed_at - clock.exited_at
        row["cause"] = o.cause.name if o.cause else None
    return row


def stats(values: list[float]) -> dict[str, float]:
    values = sorted(values)
    return {
        "median": statistics.median(values),
        "p90": values[min(len(values) - 1, int(round(0.9 * (len(values) - 1))))],
        "max": values[-1],
    }


async def bench(kind: str, n: int, grace: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-lifecycle-") as tmp:
        setup = Setup(kind, Path(tmp))
        out: dict[str, Any] = {"engine": kind, "n": n, "grace_s": grace}
        runs: dict[str, list[dict[str, Any]]] = {"crash": [], "normal": [], "stubborn": []}
        for i in range(n):
            for which in runs:
                runs[which].append(await one(setup, which, grace, i))
        out["crash_detection_s"] = stats([r["detect_s"] for r in runs["crash"]])
        out["crash_causes"] = sorted({str(r["cause"]) for r in runs["crash"]})
        out["teardown_normal_s"] = stats([r["teardown_s"] for r in runs["normal"]])
        out["teardown_ignore_sigterm_s"] = stats([r["teardown_s"] for r in runs["stubborn"]])
        out["leftovers"] = [x for rs in runs.values() for r in rs for x in r["leftovers"]]
        return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", type=int, default=10, help="runs of each kind (default 10)")
    ap.add_argument("--engine", choices=("fake", "sim"), default="fake")
    ap.add_argument("--grace", type=float, default=1.0, help="SIGTERM -> SIGKILL grace (default 1 s)")
    ap.add_argument("--json-output", action="store_true", help="print JSON instead of a table")
    args = ap.parse_args()
    import logging

    import structlog

    # The supervisor's per-transition events would drown the table: warnings only, on stderr.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
                        logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    out = anyio.run(bench, args.engine, args.n, args.grace)
    if args.json_output:
        print(json.dumps(out, indent=2))
    else:
        print(f"engine: {out['engine']}   runs: {out['n']} each   grace: {out['grace_s']:g} s")
        print(f"{'measure':<32}{'median':>10}{'p90':>10}{'max':>10}")
        for key, label in (("crash_detection_s", "crash detection (exit->crashed)"),
                           ("teardown_normal_s", "teardown, exits on SIGTERM"),
                           ("teardown_ignore_sigterm_s", "teardown, ignores SIGTERM")):
            s = out[key]
            print(f"{label:<32}{s['median'] * 1000:>8.1f}ms{s['p90'] * 1000:>8.1f}ms{s['max'] * 1000:>8.1f}ms")
        print(f"crash causes: {', '.join(out['crash_causes'])}")
        print(f"leftovers: {len(out['leftovers'])}" + "".join(f"\n  {x}" for x in out["leftovers"]))
    bad = out["crash_detection_s"]["max"] >= 1.0 or out["leftovers"]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
