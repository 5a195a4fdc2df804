"""How long `perflab hardware --hardware sim:910b3-x8` takes next to `sim:a100-80g-x8`, from cold processes.

The two machines' probes differ in their vendor tool: NVML (the simulator's in-process shim)
against ``npu-smi``, which the Ascend probe asks ten times for 8 NPUs (``info``, ``info -m``, a
board per chip); the simulator answers those in-process too (``PERFLAB_NPU_SMI``). Runs the
`perflab` console script beside the Python running this file, alternating the two specs so both
see the same machine load, and prints per spec the median wall time and the median CPU time of
the process and its children (``resource.getrusage``: on a shared machine CPU time is the fair
figure, wall time follows the load)::

    .venv/bin/python benchmarks/bench_hardware_sim.py [-n 7] [--max-ratio 2.0]

Exit status 1 when the Ascend machine's median CPU time is above ``--max-ratio`` times the
NVIDIA one's.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

SPECS = ("sim:a100-80g-x8", "sim:910b3-x8")


def perflab_script() -> Path:
    script = Path(sys.executable).parent / ("perflab.exe" if os.name == "nt" else "perflab")
    if not script.exists():
        sys.exit(f"no perflab console script beside {sys.executable}: install perflab in this environment first")
    return script


def time_once(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall s, CPU s of the command and everything it ran)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=120)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        sys.exit(f"`{' '.join(argv)}` failed with code {done.returncode}: {done.stderr.strip()}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", "--runs", type=int, default=7, help="cold runs of each spec (default 7)")
    parser.add_argument("--max-ratio", type=float, default=2.0,
                        help="most CPU time of sim:910b3-x8 per sim:a100-80g-x8's (default 2.0)")
    args = parser.parse_args()

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    script = str(perflab_script())
    for spec in SPECS:  # untimed: byte-compile caches, the simulator's stand-in trees
        time_once([script, "hardware", "--hardware", spec], env)
    walls: dict[str, list[float]] = {s: [] for s in SPECS}
    cpus: dict[str, list[float]] = {s: [] for s in SPECS}
    for _ in range(args.runs):
        for spec in SPECS:
            wall, cpu = time_once([script, "hardware", "--hardware", spec], env)
            walls[spec].append(wall)
            cpus[spec].append(cpu)

    medians = {s: (statistics.median(walls[s]), statistics.median(cpus[s])) for s in SPECS}
    print(f"runs: {args.runs} of each, alternating")
    for spec in SPECS:
        wall, cpu = medians[spec]
        print(f"perflab hardware --hardware {spec:<16} median wall {wall:.3f} s   CPU {cpu:.3f} s")
    ratio = medians[SPECS[1]][1] / max(medians[SPECS[0]][1], 1e-9)
    verdict = "OK" if ratio <= args.max_ratio else "OVER TARGET"
    print(f"CPU ratio {SPECS[1]} / {SPECS[0]}: {ratio:.2f} (target <= {args.max_ratio:g}): {verdict}")
    print(json.dumps({s: {"wall_median_s": round(w, 4), "cpu_median_s": round(c, 4)} for s, (w, c) in medians.items()}
                     | {"cpu_ratio": round(ratio, 3)}))
    sys.exit(0 if ratio <= args.max_ratio else 1)


if __name__ == "__main__":
    main()
