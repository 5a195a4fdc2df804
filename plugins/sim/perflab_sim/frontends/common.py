"""What every simulated engine front end needs: engine-style argument parsing that can be
tested without exiting, the simulated machine, model lookups, engine versions, log-line
clocks, and the per-engine efficiency factors calibrated against the seeds.

The front ends never import a perflab plugin: they know the engines from the engines' own
code (each module cites its sources).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import functools
import importlib.metadata
import json
import os
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, NoReturn

from perflab_sim.config import SimEngineConfig
from perflab_sim.env import HARDWARE_ENV


class EngineExit(Exception):
    """The engine process ends before serving: ``code`` with what it printed.

    ``parse()`` raises it for usage errors, ``--help``/``--version`` and failures the real
    engine detects before loading (bad config file, unknown model); ``main()`` prints it.
    """

    def __init__(
        self, code: int, stdout: str = "", stderr: str = "", signal: int | None = None, delay_s: float = 0.0
    ) -> None:
        self.code = code
        self.stdout = stdout
        self.stderr = stderr
        self.signal = signal  # the engine dies by this signal (MindIE's killpg SIGKILL)
        self.delay_s = delay_s  # seconds between the stdout lines and the failure (loading time)
        super().__init__(f"exit {code}: {(stderr or stdout).strip()[-300:]}")


@dataclass
class OutputSink:
    """Collects what an argparse parser prints, by stream, in order."""

    chunks: list[tuple[str, str]] = field(default_factory=list)

    def write(self, stream: str, text: str) -> None:
        if text:
            self.chunks.append((stream, text))

    def text(self, stream: str) -> str:
        return "".join(t for s, t in self.chunks if s == stream)

    def exit(self, code: int) -> NoReturn:
        raise EngineExit(code, self.text("stdout"), self.text("stderr"))


class EngineArgumentParser(argparse.ArgumentParser):
    """An ``argparse.ArgumentParser`` that raises :class:`EngineExit` instead of exiting, so
    usage errors carry argparse's exact text (``usage: ...`` and ``prog: error: ...``, exit 2)
    and stay testable. Sub-parsers share the sink."""

    def __init__(self, *args: Any, sink: OutputSink | None = None, **kwargs: Any) -> None:
        self.sink = sink or OutputSink()
        super().__init__(*args, **kwargs)

    def _print_message(self, message: str, file: Any = None) -> None:
        self.sink.write("stderr" if file is sys.stderr else "stdout", message)

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        if message:
            self.sink.write("stderr", message)
        self.sink.exit(status)

    def add_subparsers(self, **kwargs: Any) -> Any:
        action = super().add_subparsers(**kwargs)
        sink = self.sink
        original = action.add_parser

        def add_parser(name: str, **kw: Any) -> argparse.ArgumentParser:
            kw.setdefault("sink", sink)
            return original(name, **kw)

        action.add_parser = add_parser  # type: ignore[method-assign]
        return action


def emit(exc: EngineExit) -> int:
    """Print what the engine printed before exiting; return its exit status."""
    if exc.stdout:
        sys.stdout.write(exc.stdout)
        sys.stdout.flush()
    if exc.delay_s > 0:
        time.sleep(exc.delay_s)  # the engine was "loading" before it failed
    if exc.stderr:
        sys.stderr.write(exc.stderr)
        sys.stderr.flush()
    return exc.code


def traceback_text(frames: Sequence[tuple[str, int, str, str]], exc_line: str) -> str:
    """A Python traceback in CPython's format: frames are (file, line, function, source)."""
    out = ["Traceback (most recent call last):"]
    for filename, line, func, src in frames:
        out.append(f'  File "{filename}", line {line}, in {func}')
        if src:
            out.append(f"    {src}")
    out.append(exc_line)
    return "\n".join(out)


# --------------------------------------------------------------------------- hardware


@dataclass(frozen=True)
class SimMachine:
    """The simulated machine as an engine process sees it."""

    name: str
    kind: str  # "cuda" | "ascend"
    chip: str  # NVML name / npu-smi chip name
    memory_mib: int
    count: int  # devices in the machine
    visible: tuple[int, ...]  # device indexes this process may use (after *_VISIBLE_DEVICES)
    sm: int | None  # compute capability as an integer (80, 90); None on Ascend
    fp8: bool  # has FP8 tensor units
    spec: Any = None  # the perflab_sim.catalog.Machine

    @property
    def is_cuda(self) -> bool:
        return self.kind == "cuda"

    @property
    def is_ascend(self) -> bool:
        return self.kind == "ascend"

    def devices_for(self, need: int) -> tuple[int, ...]:
        """The devices an engine that needs ``need`` of them uses: the first visible ones (all
        of them where fewer are visible; the engine then fails by itself)."""
        return tuple(self.visible[:need])

    @property
    def family(self) -> str:
        """The key of the efficiency table: a100, h100, 910b."""
        chip = self.chip.lower()
        for key in ("a100", "h100", "h200", "910b"):
            if key in chip:
                return key
        return chip


def _visible(value: str | None, count: int) -> tuple[int, ...]:
    if value is None:
        return tuple(range(count))
    out: list[int] = []
    for part in value.split(","):
        part = part.strip()
        if not part:
            continue
        if not part.isdigit() or int(part) >= count:
            break  # CUDA stops at the first invalid entry; later ones are ignored
        out.append(int(part))
    return tuple(out)


def sim_machine(env: Mapping[str, str]) -> SimMachine:
    """The machine named by ``PERFLAB_SIM_HARDWARE`` with the devices this process sees.

    Not set or unknown: :class:`EngineExit` (status 1), since a stand-in run outside the
    simulator has no hardware at all.
    """
    from perflab.contract.errors import PerflabError
    from perflab_sim import catalog

    name = env.get(HARDWARE_ENV)
    if not name:
        raise EngineExit(
            1,
            stderr=f"perflab simulator: {HARDWARE_ENV} is not set; this stand-in only runs under "
            "`perflab ... --hardware sim:NAME`\n",
        )
    try:
        m = catalog.get(name)
    except PerflabError as exc:
        raise EngineExit(1, stderr=f"perflab simulator: {exc}\n") from None
    var = "CUDA_VISIBLE_DEVICES" if m.is_cuda else "ASCEND_RT_VISIBLE_DEVICES"
    raw = env.get(var)
    if raw is None and m.is_ascend:
        raw = env.get("ASCEND_VISIBLE_DEVICES")
    cc = m.chip.compute_capability
    return SimMachine(
        name=m.name,
        kind=m.kind,
        chip=m.chip.name,
        memory_mib=m.chip.memory_mib,
        count=m.count,
        visible=_visible(raw, m.count),
        sm=cc[0] * 10 + cc[1] if cc else None,
        fp8=m.chip.fp8_tflops is not None,
        spec=m,
    )


# --------------------------------------------------------------------------- models

# Sizes of the feed-forward projections (Hugging Face config.json: intermediate_size,
# moe_intermediate_size) that decide whether a block-quantized FP8 checkpoint can be sharded:
# the engines require each rank's slice to be a multiple of the 128x128 quantization block.
# https://huggingface.co/Qwen/Qwen3-32B/blob/main/config.json (25600),
# https://huggingface.co/Qwen/Qwen3-30B-A3B/blob/main/config.json (6144 / moe 768),
# https://huggingface.co/Qwen/Qwen3-235B-A22B-Instruct-2507/blob/main/config.json (12288 / moe 1536),
# Qwen3-8B 12288, Qwen3-14B 17408, Qwen3.5-9B 12288.
FFN_SIZES: dict[str, tuple[int, int | None]] = {
    "qwen3-8b": (12288, None),
    "qwen3-14b": (17408, None),
    "qwen3-32b": (25600, None),
    "qwen3-30b-a3b": (6144, 768),
    "qwen3-235b-a22b": (12288, 1536),
    "qwen3-235b-a22b-instruct-2507": (12288, 1536),
    "qwen3.5-9b": (12288, None),
}
FP8_BLOCK = 128  # weight_block_size [128, 128] of Qwen's official FP8 checkpoints (model cards)


def ffn_sizes(model_name: str) -> tuple[int, int | None] | None:
    return FFN_SIZES.get(model_name.split("/")[-1].lower())


def lookup_model(name: str) -> Any:
    """``perflab.models.lookup``; raises ``perflab.models.UnknownModel``."""
    from perflab import models

    return models.lookup(name)


def unknown_model_error() -> type[Exception]:
    from perflab import models

    return models.UnknownModel


def architecture(spec: Any) -> str:
    """The ``architectures[0]`` of the model's config.json."""
    base = spec.name.split("/")[-1].lower()
    if base.startswith("qwen3.5"):
        return "Qwen3_5ForConditionalGeneration"
    return "Qwen3MoeForCausalLM" if spec.is_moe else "Qwen3ForCausalLM"


# --------------------------------------------------------------------------- versions


def dist_version(names: Sequence[str], default: str, env: Mapping[str, str] | None = None) -> str:
    """The installed version of the first distribution in ``names`` that is found on
    ``env["PYTHONPATH"]``, then on ``sys.path`` (the simulator's activation writes
    ``*.dist-info`` for the simulated engines there), else ``default``."""
    paths = [p for p in (env or {}).get("PYTHONPATH", "").split(os.pathsep) if p] + [p for p in sys.path if p]
    for name in names:
        for dist in importlib.metadata.distributions(name=name, path=paths):
            if dist.version:
                return str(dist.version)
    return default


def engine_version(engine: str, machine: SimMachine, env: Mapping[str, str], default: str) -> str:
    """The version the simulated ``engine`` is: what :func:`perflab_sim.activate` installed
    (its ``*.dist-info``), else the machine's default as ``PERFLAB_SIM_ENGINE_VERSIONS`` may
    override it, else ``default``."""
    from perflab_sim import versions

    fallback = default
    if machine.spec is not None:
        fallback = versions.for_machine(machine.spec, env).get(engine, default)
    dist = versions.DISTRIBUTIONS.get(engine)
    return dist_version((dist,), fallback, env) if dist else fallback


def nearest_known(version: str, known: Sequence[str]) -> str:
    """Of the ``known`` versions, the newest at or below ``version`` (the oldest when
    ``version`` predates them all)."""
    ordered = sorted(known, key=version_tuple)
    v = version_tuple(version)
    below = [k for k in ordered if version_tuple(k) <= v]
    return below[-1] if below else ordered[0]


def version_tuple(version: str) -> tuple[int, ...]:
    out: list[int] = []
    for part in version.replace("rc", ".").replace("post", ".").split("."):
        digits = "".join(ch for ch in part if ch.isdigit())
        if digits == "":
            break
        out.append(int(digits))
    return tuple(out)


# --------------------------------------------------------------------------- sockets


def port_problem(host: str, port: int) -> OSError | None:
    """Whether binding ``host:port`` would fail now (the engines bind without SO_REUSEPORT
    conflicts being possible in the simulator, so a plain bind test is faithful)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            return exc
    return None


# --------------------------------------------------------------------------- clocks


def now() -> _dt.datetime:
    return _dt.datetime.now()


def pid() -> int:
    return os.getpid()


# --------------------------------------------------------------------------- efficiency


@dataclass(frozen=True)
class Factors:
    efficiency: float = 1.0
    prefill: float = 1.0
    decode: float = 1.0
    overhead_ms: float = 0.5


FACTOR_NAMES = tuple(f.name for f in dataclasses.fields(Factors))

# Engine x hardware x model-kind efficiency: a multiplier on the runtime's roofline model
# (perflab_sim.perfmodel: sustained bandwidth and FLOPS), fitted so that the seeds' own
# commands, run offline through the scheduler (`python -m perflab_sim.calibrate --suite
# engines`), reproduce the seeds' total token throughput: ShareGPT (1000 requests arriving at
# once, lengths as perflab.bench's synthetic-sharegpt) everywhere, on A100 also seed 002's
# random workloads (128/4, 2000/100, 4000/200, 32000/100) and on H100 seed 004's other
# profiles, which is what separates the prefill factor (prompt-heavy loads) from the decode
# factor (ShareGPT's large decode batches). The
# factor absorbs both the engine's kernels/scheduler and what the roofline model misses for
# that hardware and model family, so the engines rank on each machine as the seeds measured
# them. Refit (tests/sim/test_frontends.py::test_efficiency_table_reproduces_seed_rankings and
# the calibrate table in docs/simulator.md) if perfmodel's hardware constants or the
# scheduler change.
#
# | engine      | hw   | model | factors (eff / prefill / decode) | seed command                          | total tok/s | seed     |
# |-------------|------|-------|-------------------|------------------------------------------------------|-------------|----------|
# | trtllm      | a100 | any   | 1.19 / 1.15 / 0.8 | trtllm-serve Qwen/Qwen3-32B (+ seed 002's optimized command on the random workloads) | 2054.21 | 002 §1 |
# | vllm        | a100 | dense | 1.12 / 1.1 / 0.87 | vllm serve Qwen/Qwen3-32B --max-model-len 32768 (ShareGPT and random) | 1730.98 | 002 §1 |
# | sglang      | a100 | dense | 1.25              | python3 -m sglang.launch_server --model-path Qwen/Qwen3-32B | 1398.38 | 002 §1 |
# | sglang      | a100 | moe   | 0.65              | sglang ... Qwen3-235B-A22B-Instruct-2507 --tp-size 8 | 4635.31     | 001 §1   |
# | vllm        | a100 | moe   | 0.59              | vllm serve Qwen3-235B-A22B-Instruct-2507 -tp 8       | 3792.50     | 001 §1   |
# | mindie      | 910b | moe   | 0.72              | mindie serve Qwen3-30B-A3B (worldSize 2)             | 4712.47     | 000 §1   |
# | mindie      | 910b | dense | 0.49              | mindie serve vllm-ascend/Qwen3-8B-W8A8               | 4539.88     | 000 §3   |
# | vllm-ascend | 910b | any   | 0.168             | vllm serve Qwen/Qwen3-30B-A3B -tp 2 (vLLM-Ascend 0.9.1) | 1227.19  | 000 §1   |
# | vllm        | h100 | any   | 0.68 / 2.2 / 0.77 | vllm serve Qwen/Qwen3.5-9B --reasoning-parser qwen3 --max-model-len 32768, 512 concurrent (+ the throughput, long-context, generation-heavy profiles) | 11527.14 | 004 |
# | sglang      | h100 | any   | 0.38              | sglang ... Qwen/Qwen3.5-9B --context-length 32768, 512 concurrent | 6499.41 | 004 |
#
# SGLang's higher factor on A100 comes with its smaller KV cache (mem_fraction_static 0.836 of
# an 80 GB card for a 65 GB model), which limits its batch: its throughput still ranks last, as
# measured. Seed 004 measured vLLM 0.17.1 / SGLang 0.5.9; the factors apply to whatever version
# is simulated. Unlisted combinations run at 1.0.
EFFICIENCY: dict[tuple[str, str, str], Factors] = {
    ("trtllm", "a100", "any"): Factors(efficiency=1.19, prefill=1.15, decode=0.8),
    ("vllm", "a100", "dense"): Factors(efficiency=1.12, prefill=1.1, decode=0.87),
    ("vllm", "a100", "moe"): Factors(efficiency=0.59),
    ("sglang", "a100", "dense"): Factors(efficiency=1.25),
    ("sglang", "a100", "moe"): Factors(efficiency=0.65),
    ("mindie", "910b", "moe"): Factors(efficiency=0.72),
    ("mindie", "910b", "dense"): Factors(efficiency=0.49),
    ("vllm-ascend", "910b", "any"): Factors(efficiency=0.168),
    ("vllm", "h100", "any"): Factors(efficiency=0.68, prefill=2.2, decode=0.77),
    ("sglang", "h100", "any"): Factors(efficiency=0.38),
}


def efficiency(engine: str, machine: SimMachine, is_moe: bool) -> Factors:
    kind = "moe" if is_moe else "dense"
    for key in ((engine, machine.family, kind), (engine, machine.family, "any"), (engine, "any", "any")):
        if key in EFFICIENCY:
            return EFFICIENCY[key]
    return Factors()


@functools.cache
def _version_factor_table() -> dict[str, dict[str, dict[str, Any]]]:
    data = json.loads(resources.files("perflab_sim").joinpath("data/version_factors.json").read_text())
    table = {engine: releases for engine, releases in data.items() if not engine.startswith("_")}
    for engine, releases in table.items():
        for version, row in releases.items():
            unknown = sorted(set(row) - {*FACTOR_NAMES, "why"})
            if unknown:
                raise ValueError(f"version_factors.json: {engine} {version}: unknown key(s) {', '.join(unknown)}")
    return table


def version_factors(engine: str, version: str, f: Factors) -> Factors:
    """``f`` with the multipliers perflab_sim/data/version_factors.json gives ``engine`` at
    exactly ``version`` (the simulator's own, invented version differences, there so that
    ``perflab compare`` has a known regression to find; not claims about real releases)."""
    row = _version_factor_table().get(engine, {}).get(version)
    if not row:
        return f
    scale = {k: float(v) for k, v in row.items() if k in FACTOR_NAMES}
    return dataclasses.replace(f, **{k: getattr(f, k) * m for k, m in scale.items()})


def version_factor_note(engine: str, version: str) -> str | None:
    """Why ``engine`` ``version`` behaves differently in the simulator (its ``why`` in
    data/version_factors.json), for the engine's log; None when it does not."""
    row = _version_factor_table().get(engine, {}).get(version)
    return str(row.get("why") or "a simulated version difference") if row else None


def apply_factors(fields: dict[str, Any], f: Factors) -> dict[str, Any]:
    """``fields`` (a SimEngineConfig's, with its ``engine`` and ``engine_version``) with the
    factors ``f``, adjusted for the simulated version (:func:`version_factors`)."""
    f = version_factors(fields["engine"], fields["engine_version"], f)
    fields.update(
        efficiency=f.efficiency,
        prefill_efficiency=f.prefill,
        decode_efficiency=f.decode,
        scheduler_overhead_ms=f.overhead_ms,
    )
    return fields


# --------------------------------------------------------------------------- serving


def serve(cfg: SimEngineConfig) -> int:
    """Hand the parsed configuration to the simulation runtime; its exit status."""
    from perflab_sim import runtime

    return int(runtime.serve(cfg))


def run_main(parse: Any, argv: Sequence[str] | None, env: Mapping[str, str] | None = None) -> int:
    """``main()`` of every front end: parse, then serve; engine-style exits are printed."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        cfg = parse(argv, dict(os.environ if env is None else env))
    except EngineExit as exc:
        code = emit(exc)
        if exc.signal is not None and hasattr(os, "kill"):
            from perflab_sim.lifecycle import die_by_signal

            die_by_signal(exc.signal)
        return code
    return serve(cfg)
