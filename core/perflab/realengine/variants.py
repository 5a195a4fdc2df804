"""Variants of the tiny model for the accuracy checks of the real-engine lane.

The tiny model (``tinymodel.py``) draws its weights with standard deviation 0.02: its residual
stream is then dominated by the current token's embedding and, with tied embeddings, greedy
decoding repeats one token forever (``" 54 54 54 ..."`` for most prompts, whatever they ask).
Two answer sets of such a model agree whether or not the engine changed anything, so agreement
could not tell a lossy configuration from a lossless one. These variants are derived from the
built model, deterministically, and leave it (and the lane's other tests) untouched:

``varied``
    every weight but the norms scaled by :data:`VARIED_SCALE` (standard deviation 0.3): greedy
    answers are context-dependent text with a new token almost every step (27-32 distinct
    tokens in 32), confident enough (top logprob about -0.5) that a lossless change keeps them.
``perturbed``
    ``varied`` with Gaussian noise of :data:`PERTURB_REL` times each tensor's own standard
    deviation added to every weight but the norms (seeded): a genuinely lossy model, the way
    weight quantization is, with the same architecture, tokenizer and serving flags.

Like ``tinymodel.py``, the builder runs under the *engine's* Python (numpy, safetensors)::

    /path/to/vllm-env/bin/python core/perflab/realengine/variants.py SRC_MODEL OUT_DIR NAME

perflab's side (:func:`ensure_variant`) caches each variant beside the model, keyed by a hash
of this file and the source weights, built under a lock and published by an atomic rename.
This file is not part of the engine environment's recipe hash on purpose: adding or changing a
variant never rebuilds the environment.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from perflab.realengine.env import RealEngineEnv

VARIANTS = ("varied", "perturbed")
#: 0.02 * 15 = 0.3: measured with transformers on the tiny model, 0.02 repeats one token,
#: 0.1 gives varied but near-uniform tokens (top logprob about -3), 0.3 varied and confident.
VARIED_SCALE = 15.0
#: noise relative to each tensor's standard deviation: 0.3 % already changes 3 of 8 greedy
#: answers of ``varied`` within 32 tokens, 3 % changes every one within 8 tokens.
PERTURB_REL = 0.05
PERTURB_SEED = 20261128
WEIGHTS = "model.safetensors"


def _is_norm(name: str) -> bool:
    return name.endswith("norm.weight")


def build(src: Path, out: Path, name: str) -> Path:
    """Write variant ``name`` of the model in ``src`` to ``out`` (runs under the engine's Python)."""
    import numpy as np
    from safetensors.numpy import load_file, save_file

    if name not in VARIANTS:
        raise ValueError(f"unknown variant {name!r}: one of {', '.join(VARIANTS)}")
    out.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file() and f.name != WEIGHTS:
            shutil.copy2(f, out / f.name)
    tensors = load_file(str(src / WEIGHTS))
    rng = np.random.default_rng(PERTURB_SEED)
    result = {}
    for key in sorted(tensors):  # sorted: the noise drawn for each tensor never depends on file order
        w = tensors[key].astype(np.float32)
        if not _is_norm(key):
            w = w * np.float32(VARIED_SCALE)
            if name == "perturbed":
                w = w + rng.standard_normal(w.shape, dtype=np.float32) * np.float32(PERTURB_REL * float(w.std()))
        result[key] = np.ascontiguousarray(w, dtype=np.float32)
    save_file(result, str(out / WEIGHTS), metadata={"format": "pt"})
    return out


def _key(src: Path, name: str) -> str:
    h = hashlib.sha256()
    h.update(Path(__file__).read_bytes())
    h.update(name.encode())
    with open(src / WEIGHTS, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()[:12]


def ensure_variant(env: RealEngineEnv, name: str, *, timeout: float = 300.0,
                   progress: Callable[[str], None] | None = None) -> Path:
    """The model directory of variant ``name`` of ``env``'s tiny model, built once (seconds,
    told to ``progress`` first)."""
    if name not in VARIANTS:
        raise ValueError(f"unknown variant {name!r}: one of {', '.join(VARIANTS)}")
    base = env.root / "variants"
    base.mkdir(exist_ok=True)
    target = base / f"{name}-{_key(env.model, name)}"
    with open(base / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / WEIGHTS).exists():
            return target
        for stale in base.glob(f"{name}-*"):  # an older recipe's, or a build cut short
            shutil.rmtree(stale, ignore_errors=True)
        partial = base / f".{target.name}.{os.getpid()}"
        if progress is not None:
            progress(f"building the {name} variant of the tiny model (~5 s)...")
        proc = subprocess.run([str(env.python), __file__, str(env.model), str(partial), name],
                              capture_output=True, text=True, timeout=timeout, check=False)
        if proc.returncode != 0:
            shutil.rmtree(partial, ignore_errors=True)
            tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
            raise RuntimeError(f"building the {name} variant of the tiny model failed (exit {proc.returncode}):\n{tail}")
        partial.rename(target)
        return target


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(f"usage: variants.py SRC_MODEL OUT_DIR {{{','.join(VARIANTS)}}}", file=sys.stderr)
        return 2
    print(build(Path(argv[0]), Path(argv[1]), argv[2]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
