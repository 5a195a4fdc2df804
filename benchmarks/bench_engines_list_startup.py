"""How long `perflab engines list` takes from a cold process, next to `python -c pass`.

Runs the `perflab` console script of the same environment as the Python running this file
(so `.venv/bin/python benchmarks/bench_engines_list_startup.py` measures `.venv/bin/perflab`),
alternating with the bare interpreter so both see the same machine load, and prints the
medians and their difference. The target is a median of at most 0.3 s.

    .venv/bin/python benchmarks/bench_engines_list_startup.py [-n 15] [--json-output] [--target 0.3]

Exit status 1 if the median is above the target.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path


def perflab_script() -> Path:
    bindir = Path(sys.executable).parent
    script = bindir / ("perflab.exe" if os.name == "nt" else "perflab")
    if not script.exists():
        sys.exit(f"no perflab console script beside {sys.executable}: install perflab in this environment first")
    return script


def time_once(argv: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=60)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"`{' '.join(argv)}` failed with code {done.returncode}: {done.stderr.strip()}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", "--runs", type=int, default=15, help="cold runs of each command (default 15)")
    parser.add_argument("--json-output", action="store_true", help="time `engines list --json` instead of the table")
    parser.add_argument("--target", type=float, default=0.3, help="median target in seconds (default 0.3)")
    args = parser.parse_args()

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.setdefault("COLUMNS", "120")
    listing = [str(perflab_script()), "engines", "list", *(["--json"] if args.json_output else [])]
    bare = [sys.executable, "-c", "pass"]
    time_once(listing, env)  # one untimed run: byte-compile caches, page cache
    perflab_s: list[float] = []
    python_s: list[float] = []
    for _ in range(args.runs):
        python_s.append(time_once(bare, env))
        perflab_s.append(time_once(listing, env))

    p_med, b_med = statistics.median(perflab_s), statistics.median(python_s)
    print(f"runs:                         {args.runs} each, alternating")
    print(f"python -c pass       median:  {b_med:.3f} s   (min {min(python_s):.3f}, max {max(python_s):.3f})")
    print(f"{' '.join(['perflab', *listing[1:]]):<20} median:  {p_med:.3f} s   (min {min(perflab_s):.3f}, max {max(perflab_s):.3f})")
    print(f"perflab's own cost   median:  {p_med - b_med:.3f} s")
    verdict = "OK" if p_med <= args.target else "OVER TARGET"
    print(f"target:                       <= {args.target:.3f} s median: {verdict}")
    print(json.dumps({"python_median_s": round(b_med, 4), "perflab_median_s": round(p_med, 4), "target_s": args.target}))
    sys.exit(0 if p_med <= args.target else 1)


if __name__ == "__main__":
    main()
