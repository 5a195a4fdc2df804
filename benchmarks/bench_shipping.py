"""What shipping a run's files from a Ray node to the driver costs (perflab.lab.run.backends.shipping): an
engine log of each size written into a stage, shipped whole (``final``) and written into a run
directory by the driver's ``receive`` — the Files events, the bytes that travel (a log over
``SHIP_CAP`` travels as its head and tail) and the time, Ray's transport not included.

    .venv/bin/python benchmarks/bench_shipping.py [--sizes 20000,8388608,104857600]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from perflab.lab.run.backends.shipping import Stage, receive


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default=f"20000,{8 << 20},{100 << 20}", help="log sizes in bytes, comma-separated")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "study" / "runs" / "001-x"
        run.mkdir(parents=True)
        for size in (int(x) for x in args.sizes.split(",")):
            stage = Stage(run, root=Path(tmp) / "node", suffix=f"-{size}")
            (stage.path / "engine.log").write_bytes(os.urandom(size))
            t0 = time.perf_counter()
            events = shipped = 0
            for ev in stage.ship(final=True):
                events += 1
                shipped += sum(len(p.data) for p in ev.parts)
                receive(run, ev)
            took = time.perf_counter() - t0
            print(f"log {size / 2**20:8.2f} MiB: {events:3d} Files events, {shipped / 2**20:6.2f} MiB shipped, "
                  f"ship + receive {took * 1000:6.1f} ms")
            stage.remove()


if __name__ == "__main__":
    main()
