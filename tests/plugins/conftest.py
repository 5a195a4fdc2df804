"""Helpers shared by the engine plugins' tests: the plugin manager, probed machines, argv
normalisers, installed-distribution records, the seeds' records (tests/fixtures/seeds) and a
vLLM log that both vLLM plugins classify.

Test modules import the plain helpers with ``from .conftest import ...`` (this folder is a
package, as tests/bench is); the ``pm`` fixture needs no import.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest

from perflab.contract.types import Accelerator, HardwareSnapshot
from perflab.plugins import PluginManager, load

SEEDS = Path(__file__).resolve().parents[1] / "fixtures" / "seeds"
WORKDIR = Path("/nonexistent/perflab-run")  # build_launch is pure: nothing is written


@pytest.fixture(scope="module")
def pm() -> PluginManager:
    return load()


# --------------------------------------------------------------------------- machines


def gpus(name: str, cc: tuple[int, int], n: int = 8, mib: int = 81920) -> HardwareSnapshot:
    """``n`` NVIDIA GPUs as the NVML probe reports them."""
    return HardwareSnapshot(
        accelerators=tuple(
            Accelerator(vendor="nvidia", kind="cuda", index=i, name=name, memory_total_mib=mib, compute_capability=cc)
            for i in range(n)
        )
    )


def npus(n: int = 8, chip: str = "910B3") -> HardwareSnapshot:
    """``n`` Ascend NPUs (one chip per card) as the npu-smi probe reports them."""
    return HardwareSnapshot(
        accelerators=tuple(
            Accelerator(vendor="huawei", kind="ascend", index=i, name=f"Ascend {chip}", memory_total_mib=65536,
                        chip=chip, npu_id=i, chip_id=0)
            for i in range(n)
        )
    )


# --------------------------------------------------------------------------- argv


def split_equals(argv: Any) -> list[str]:
    """``--flag=value`` -> ``--flag value``."""
    out: list[str] = []
    for token in argv:
        if token.startswith("--") and "=" in token:
            out += token.split("=", 1)
        else:
            out.append(token)
    return out


def without_host_port(argv: Any, host: str, port: int) -> list[str]:
    """The argv (``--flag=value`` split) without its always-explicit ``--host``/``--port``."""
    argv = split_equals(argv)
    for flag, value in (("--host", host), ("--port", str(port))):
        i = argv.index(flag)
        assert argv[i + 1] == value
        del argv[i : i + 2]
    return argv


def shell_argv(command: str) -> list[str]:
    """A seed command as bash splits it (backslash-newline continuations included)."""
    return shlex.split(command.replace("\\\n", " "))


# Spellings that mean the same to vLLM's argparse (vllm/engine/arg_utils.py).
VLLM_ALIASES = {
    "-tp": "--tensor-parallel-size",
    "-pp": "--pipeline-parallel-size",
    "-dp": "--data-parallel-size",
    "-q": "--quantization",
    "-O": "--compilation-config",
}


def _vllm_value(raw: str | None) -> Any:
    if raw is not None and raw[:1] in "{[":
        return json.dumps(json.loads(raw), sort_keys=True)
    return raw


def normalise(argv: list[str] | tuple[str, ...]) -> tuple[tuple[str, ...], tuple[tuple[str, Any], ...]]:
    """(positionals after ``vllm serve``, sorted (flag, value) pairs without --host/--port).

    ``-tp 4`` and ``--tensor-parallel-size=4`` normalise alike; JSON values compare as JSON.
    """
    args = list(argv)
    assert args[:2] == ["vllm", "serve"], args
    args = args[2:]
    positional: list[str] = []
    pairs: list[tuple[str, Any]] = []
    i = 0
    while i < len(args):
        tok = args[i]
        if not tok.startswith("-"):
            positional.append(tok)
            i += 1
            continue
        if "=" in tok:
            name, raw = tok.split("=", 1)
            i += 1
        elif i + 1 < len(args) and not args[i + 1].startswith("-"):
            name, raw = tok, args[i + 1]
            i += 2
        else:
            name, raw = tok, None
            i += 1
        name = VLLM_ALIASES.get(name, name)
        if name not in {"--host", "--port"}:
            pairs.append((name, _vllm_value(raw)))
    return tuple(positional), tuple(sorted(pairs, key=lambda p: (p[0], str(p[1]))))


# --------------------------------------------------------------------------- installs


def dist_info(site: Path, name: str, version: str) -> Path:
    """An installed distribution's record (``NAME-VERSION.dist-info/METADATA``) under ``site``:
    what the plugins' version hooks read instead of importing or running the engine."""
    d = site / f"{name}-{version}.dist-info"
    d.mkdir(parents=True)
    (d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return d


# --------------------------------------------------------------------------- the seeds


def seed_records(engine: str | None = None) -> list[dict[str, Any]]:
    """The seeds' configurations (tests/fixtures/seeds/seed_results.json), of one engine if named."""
    records: list[dict[str, Any]] = json.loads((SEEDS / "seed_results.json").read_text())
    return [r for r in records if engine is None or r["engine"] == engine]


def seed_summaries() -> dict[str, Any]:
    """Each seed study's summary (tests/fixtures/seeds/seed_summaries.json), by seed file name."""
    summaries: dict[str, Any] = json.loads((SEEDS / "seed_summaries.json").read_text())
    return summaries


# --------------------------------------------------------------------------- logs

# A vLLM engine that cannot fit one request of max_model_len in its KV cache (vLLM 0.11,
# vllm/v1/core/kv_cache_utils.py check_enough_kv_cache_memory): both vLLM plugins classify it.
KV_CACHE_LOG = """\
(EngineCore_DP0 pid=2207) INFO 10-20 09:14:05 [gpu_model_runner.py:2653] Model loading took 61.03 GiB and 35.1 seconds
(EngineCore_DP0 pid=2207) INFO 10-20 09:14:07 [gpu_worker.py:298] Available KV cache memory: 1.12 GiB
(EngineCore_DP0 pid=2207) ERROR 10-20 09:14:07 [core.py:708] EngineCore failed to start.
(EngineCore_DP0 pid=2207) ERROR 10-20 09:14:07 [core.py:708] Traceback (most recent call last):
(EngineCore_DP0 pid=2207) ERROR 10-20 09:14:07 [core.py:708]   File "/usr/local/lib/python3.12/dist-packages/vllm/v1/engine/core.py", line 699, in run_engine_core
(EngineCore_DP0 pid=2207) ERROR 10-20 09:14:07 [core.py:708]     engine_core = EngineCoreProc(*args, **kwargs)
(EngineCore_DP0 pid=2207) ERROR 10-20 09:14:07 [core.py:708]   File "/usr/local/lib/python3.12/dist-packages/vllm/v1/core/kv_cache_utils.py", line 716, in check_enough_kv_cache_memory
(EngineCore_DP0 pid=2207) ERROR 10-20 09:14:07 [core.py:708]     raise ValueError(
(EngineCore_DP0 pid=2207) ERROR 10-20 09:14:07 [core.py:708] ValueError: To serve at least one request with the models's max seq len (131072), (24.00 GiB KV cache is needed, which is larger than the available KV cache memory (1.12 GiB). Based on the available memory, the estimated maximum model length is 6096. Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.
(EngineCore_DP0 pid=2207) Process EngineCore_DP0:
(EngineCore_DP0 pid=2207) Traceback (most recent call last):
(EngineCore_DP0 pid=2207) ValueError: To serve at least one request with the models's max seq len (131072), (24.00 GiB KV cache is needed, which is larger than the available KV cache memory (1.12 GiB).
(APIServer pid=2051) Traceback (most recent call last):
(APIServer pid=2051)   File "/usr/local/bin/vllm", line 10, in <module>
(APIServer pid=2051)     sys.exit(main())
(APIServer pid=2051)   File "/usr/local/lib/python3.12/dist-packages/vllm/v1/engine/utils.py", line 785, in wait_for_engine_startup
(APIServer pid=2051)     raise RuntimeError("Engine core initialization failed. "
(APIServer pid=2051) RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}
"""
