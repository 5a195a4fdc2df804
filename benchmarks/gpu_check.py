"""perflab on a real NVIDIA GPU, in one call of at most 8 minutes (issue 28, item 3).

Run on a machine with one NVIDIA GPU (H100 80GB or H200: x86-64, Python 3.12, PyTorch,
transformers and nvidia-ml-py preinstalled, no internet), after installing the wheels
``benchmarks/gpu_wheels.py`` built (it prints the one-line install)::

    python benchmarks/gpu_check.py --out gpu-check-out

Steps, each with its own time budget (:data:`STEPS`, 7 minutes in all):

``nvml``       ``perflab hardware --json`` through the real NVML; its raw output is kept as the
               test fixture (``nvml-hardware.json``, for tests/fixtures/nvml/).
``telemetry``  perflab's telemetry (:mod:`perflab.observe.telemetry`) sampled while a torch
               matmul loop loads the GPU: power, utilisation and memory must move.
``model``      the real lane's tiny model, built from nothing (:mod:`perflab.realengine.tinymodel`).
``serve``      ``perflab launch transformers`` on the GPU (bf16, CUDA): ready, a 200-request
               ``perflab bench``, energy per output token from NVML (:func:`perflab.observe.energy.energy`),
               Ctrl-C, and teardown with the GPU's memory back to its baseline (perflab's check,
               and NVML's figures before and after).
``fault``      the same launch with the engine SIGKILLed mid-benchmark: perflab must name it.

One JSON (:class:`GpuCheck`, ``gpu-check.json``) holds every figure and each step's pass/fail and
error; a summary is printed; the exit status is 0 only if every step passed, 1 otherwise. On a
machine without an NVIDIA GPU (NVML does not start, or sees no device) it says so in one line
and exits 2 before anything slow.

This file runs under the GPU machine's Python, with perflab installed from wheels; the tests
import it (tests/test_gpu_check.py) for its JSON's shape and its refusal.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1
EXIT_OK, EXIT_FAILED, EXIT_NO_GPU = 0, 1, 2
NO_GPU = "gpu_check: no NVIDIA GPU here ({why}); this check needs one (exit 2)"

#: every step, in order, with its time budget in seconds: 420 s in all, which leaves a minute of
#: the 8 for start-up (installing the wheels, Python and torch imports) and the summary
STEPS: Mapping[str, float] = {
    "nvml": 30.0,
    "telemetry": 60.0,
    "model": 45.0,
    "serve": 170.0,
    "fault": 115.0,
}

ENGINE = "transformers"
#: how the engine is asked to run on the GPU in bfloat16 (the plugin's engine option ``dtype``:
#: perflab_transformers.launch.OPTIONS); one visible device, GPU 0, makes the plugin pass
#: ``--device cuda`` itself (perflab_transformers.launch.device)
SERVE_ARGS: tuple[str, ...] = ("--devices", "0", "--engine-option", "dtype=bfloat16")
BENCH_REQUESTS = 200
#: the workload: short prompts and answers (the tiny model's context is 2048 tokens). The bench is
#: told the engine (``--engine``): transformers serve refuses vLLM's ignore_eos extension (HTTP
#: 422), so output lengths are what it generated, counted from each answer's usage
BENCH_ARGS: tuple[str, ...] = ("--dataset", "random", "--random-input-len", "128", "--random-output-len", "64",
                               "--max-concurrency", "32", "--seed", "0")
#: the fault's benchmark: long enough that the engine is killed while requests are in flight
FAULT_REQUESTS = 5000
FAULT_KILL_AFTER_S = 3.0
#: how long a failed step's launch is given to tear down after Ctrl-C (perflab's grace is 10 s)
ABORT_WAIT_S = 20.0
#: the telemetry step: idle readings, then the load for this long, sampled every SAMPLE_S
IDLE_S, LOAD_S, SAMPLE_S = 2.0, 8.0, 0.2
#: what "moved" means under the matmul load (an H100/H200 idles near 70-120 W and draws several
#: hundred under bf16 GEMMs; the loop's three 8192² bf16 matrices and the CUDA context hold ~1 GiB)
MIN_POWER_RISE_W, MIN_UTILIZATION_PCT, MIN_MEMORY_RISE_MIB = 50.0, 50.0, 256.0
#: the matmul load, run in its own process so its CUDA context (and memory) is gone when it exits
LOAD_SCRIPT = """
import sys, time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
torch.cuda.synchronize()
print("loaded", flush=True)
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    for _ in range(20):
        c = a @ b
    torch.cuda.synchronize()
"""


# ------------------------------------------------------------------------------- the JSON


@dataclass(frozen=True)
class StepResult:
    """One step: passed or not, how long it took, the error that failed it, its figures."""

    name: str
    ok: bool
    seconds: float
    budget_s: float
    error: str | None = None
    figures: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class GpuCheck:
    """``gpu-check.json``: what the check found on one machine (:data:`SCHEMA_VERSION`)."""

    host: str
    started_utc: str
    python: str
    versions: Mapping[str, str | None]  # DISTRIBUTIONS -> installed version (None: not installed)
    steps: tuple[StepResult, ...]
    seconds: float
    schema_version: int = SCHEMA_VERSION

    @property
    def passed(self) -> bool:
        return len(self.steps) == len(STEPS) and all(s.ok for s in self.steps)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["steps"] = list(out["steps"])  # JSON's array, as from_json reads it back
        out["passed"] = self.passed
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> GpuCheck:
        """Read a ``gpu-check.json`` back; ValueError when it is not one of this schema."""
        if data.get("schema_version") != SCHEMA_VERSION:
            raise ValueError(f"schema_version {data.get('schema_version')!r}, expected {SCHEMA_VERSION}")
        steps = tuple(StepResult(**s) for s in data["steps"])
        names = [s.name for s in steps]
        if names != list(STEPS):
            raise ValueError(f"steps {names}, expected {list(STEPS)}")
        check = cls(host=data["host"], started_utc=data["started_utc"], python=data["python"],
                    versions=dict(data["versions"]), steps=steps, seconds=data["seconds"])
        if data.get("passed") != check.passed:
            raise ValueError(f"passed is {data.get('passed')!r} but the steps say {check.passed}")
        return check

    def summary(self) -> str:
        lines = [f"gpu_check on {self.host}: {'PASSED' if self.passed else 'FAILED'} in {self.seconds:.0f} s"]
        for s in self.steps:
            head = f"  {'ok  ' if s.ok else 'FAIL'} {s.name:<10} {s.seconds:6.1f} s / {s.budget_s:.0f} s"
            lines.append(head + (f"  {s.error}" if s.error else ""))
            for key, value in s.figures.items():
                if not isinstance(value, (dict, list)):
                    lines.append(f"         {key}: {value}")
        return "\n".join(lines)


class StepFailed(Exception):
    """A step's check did not hold (its message is the step's error); ``figures``: what the
    step measured before it failed, kept in the JSON all the same."""

    def __init__(self, message: str, figures: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.figures = dict(figures or {})


# ------------------------------------------------------------------------------- is there a GPU


def gpu_absent(nvml: Any | None) -> str | None:
    """Why this machine has no NVIDIA GPU for the check (None: it has one). ``nvml`` is the
    pynvml module (or anything with its function names); None: nvidia-ml-py is not installed."""
    from perflab.hardware.nvml import read_gpus

    if nvml is None:
        return "nvidia-ml-py is not installed"
    gpus = read_gpus(nvml)
    if gpus is None:
        return "NVML did not start: no NVIDIA driver"
    if not gpus:
        return "NVML sees no GPU"
    return None


def real_nvml() -> Any | None:
    """pynvml itself: an empty environment names no stand-in (perflab.hardware.standins), so a
    simulated machine's variables in this process's environment cannot pass for a GPU."""
    from perflab.hardware.nvml import load_nvml

    return load_nvml({})


# ------------------------------------------------------------------------------- helpers


class Budget:
    """A step's deadline: subprocesses get what is left of it as their timeout."""

    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        left = self.end - time.monotonic()
        if left <= 0:
            raise StepFailed("out of time")
        return left


def perflab(*args: str) -> list[str]:
    return [sys.executable, "-m", "perflab", *args]


def child_env() -> dict[str, str]:
    """The children's environment: this Python's scripts directory first on PATH, so the
    engine's command (the ``transformers`` script the wheels' pip installed beside this Python)
    is found whatever PATH the machine's shell set."""
    scripts = str(Path(sys.executable).parent)
    return {**os.environ, "PATH": os.pathsep.join([scripts, os.environ.get("PATH", os.defpath)])}


def run(argv: Sequence[str], budget: Budget) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=budget.left(), check=False,
                              env=child_env())
    except subprocess.TimeoutExpired:
        raise StepFailed(f"{' '.join(argv[2:5])} ... did not finish within the step's budget") from None


def tail(text: str, lines: int = 5) -> str:
    return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:])


class Sampler:
    """perflab's NVML telemetry (:class:`perflab.observe.telemetry.Telemetry`) read every
    ``period`` seconds in a thread, as :class:`perflab.observe.Sample`\\ s (``t``: seconds since
    the sampler started)."""

    def __init__(self, env: Mapping[str, str], devices: Sequence[int] = (0,), period: float = SAMPLE_S) -> None:
        from perflab.observe.telemetry import NVML, Telemetry

        self.telemetry = Telemetry(env, [])
        self.source, self.devices, self.period = NVML, tuple(devices), period
        self.samples: list[Any] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._t0 = time.monotonic()

    def read(self) -> Any:
        from perflab.observe import Sample

        values = self.telemetry.read(self.source, self.devices)
        if not values:
            raise StepFailed(f"NVML telemetry gave nothing: {self.telemetry.problems}")
        return Sample(time.monotonic() - self._t0, values)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.samples.append(self.read())
            except StepFailed:
                return
            self._stop.wait(self.period)

    @contextmanager
    def running(self) -> Iterator[Sampler]:
        self._thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            self._thread.join(timeout=5)
            self.telemetry.close()


def memory_used_mib(nvml: Any, device: int = 0) -> float:
    nvml.nvmlInit()
    try:
        return int(nvml.nvmlDeviceGetMemoryInfo(nvml.nvmlDeviceGetHandleByIndex(device)).used) / (1024 * 1024)
    finally:
        nvml.nvmlShutdown()


# ------------------------------------------------------------------------------- the steps


@dataclass
class Context:
    """What the steps share: where they write, the NVML module and the environment telemetry
    reads it under, the engine and how it is launched, what earlier steps made. The defaults
    are the GPU check's; the tests run the serve and fault steps against perflab's simulator
    (its NVML stand-in, ``--hardware sim:NAME``) through the same code."""

    out: Path
    nvml: Any
    env: Mapping[str, str] = field(default_factory=dict)  # {}: the real pynvml (real_nvml)
    engine: str = ENGINE
    serve_args: tuple[str, ...] = SERVE_ARGS
    model: str | None = None  # the model step's directory
    tokenizer: str | None = None  # the bench's tokenizer (default: the model's directory)
    sampling: tuple[str, ...] = ()  # the bench's sampling arguments for that model (the model step's)
    memory_total_mib: float | None = None


def step_nvml(ctx: Context, budget: Budget) -> dict[str, Any]:
    done = run(perflab("hardware", "--json"), budget)
    if done.returncode != 0:
        raise StepFailed(f"perflab hardware --json exited {done.returncode}: {tail(done.stderr)}")
    (ctx.out / "nvml-hardware.json").write_text(done.stdout)  # the raw output: the future fixture
    figures = hardware_figures(json.loads(done.stdout))
    ctx.memory_total_mib = figures["memory_total_mib"]
    return figures


def hardware_figures(snapshot: Mapping[str, Any]) -> dict[str, Any]:
    """What ``perflab hardware --json`` says of the first NVIDIA GPU, checked: read through NVML,
    on a real (not simulated) machine, with the fields an H100/H200 driver gives."""
    gpus = [a for a in snapshot.get("accelerators", []) if a.get("vendor") == "nvidia" and a.get("kind") == "cuda"]
    if not gpus:
        raise StepFailed(f"no NVIDIA GPU in perflab hardware --json (errors: {snapshot.get('errors')})")
    if snapshot.get("simulated"):
        raise StepFailed("perflab hardware reports a simulated machine")
    gpu = gpus[0]
    missing = [k for k in ("name", "uuid", "memory_total_mib", "compute_capability", "driver_version",
                           "cuda_driver_version", "bus_id") if not gpu.get(k)]
    if gpu.get("source") != "nvml":
        raise StepFailed(f"read through {gpu.get('source')!r}, not NVML")
    if missing:
        raise StepFailed(f"NVML gave no {', '.join(missing)}")
    return {
        "gpus": len(gpus),
        "name": gpu["name"],
        "memory_total_mib": gpu["memory_total_mib"],
        "memory_used_mib": gpu["memory_used_mib"],
        "compute_capability": ".".join(str(c) for c in gpu["compute_capability"]),
        "driver_version": gpu["driver_version"],
        "cuda_driver_version": gpu["cuda_driver_version"],
        "errors": list(snapshot.get("errors", [])),
    }


def step_telemetry(ctx: Context, budget: Budget) -> dict[str, Any]:
    from perflab.observe.telemetry import summarize

    sampler = Sampler(ctx.env)
    with sampler.running():
        time.sleep(IDLE_S)
        idle = list(sampler.samples)
        load = subprocess.Popen([sys.executable, "-c", LOAD_SCRIPT, str(LOAD_S)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=child_env())
        try:
            out, err = load.communicate(timeout=budget.left())
        except subprocess.TimeoutExpired:
            load.kill()
            load.communicate()
            raise StepFailed("the matmul load did not finish within the step's budget") from None
        loaded = sampler.samples[len(idle):]
    if load.returncode != 0 or "loaded" not in out:
        raise StepFailed(f"the matmul load exited {load.returncode}: {tail(err)}")
    return telemetry_figures(idle, loaded, summarize(sampler.samples, sampler.source, sampler.devices))


def telemetry_figures(idle: Sequence[Any], loaded: Sequence[Any], summary: Any) -> dict[str, Any]:
    """Idle against loaded readings (:class:`perflab.observe.Sample`): power, utilisation and
    memory must each have moved by :data:`MIN_POWER_RISE_W`, :data:`MIN_UTILIZATION_PCT`,
    :data:`MIN_MEMORY_RISE_MIB`."""
    from perflab.observe.telemetry import ENERGY, MEMORY, POWER, UTILIZATION, per_device

    def values(samples: Sequence[Any], name: str) -> list[float]:
        return [v for s in samples for v in per_device(s.values, name).values()]

    if len(idle) < 2 or len(loaded) < 2:
        raise StepFailed(f"too few readings ({len(idle)} idle, {len(loaded)} under load)")
    figures: dict[str, Any] = {"samples_idle": len(idle), "samples_loaded": len(loaded)}
    problems = []
    for name, rise, combine in ((POWER, MIN_POWER_RISE_W, min), (UTILIZATION, MIN_UTILIZATION_PCT, min),
                                (MEMORY, MIN_MEMORY_RISE_MIB, min)):
        base, under = values(idle, name), values(loaded, name)
        if not base or not under:
            problems.append(f"no {name} readings")
            continue
        figures[f"{name}_idle"] = round(combine(base), 1)
        figures[f"{name}_peak"] = round(max(under), 1)
        if max(under) - combine(base) < rise:
            problems.append(f"{name} rose {max(under) - combine(base):.1f} (< {rise:g}) under load")
    energy = values([loaded[0], loaded[-1]], ENERGY)
    if len(energy) == 2:
        figures["energy_under_load_j"] = round((energy[1] - energy[0]) / 1000.0, 1)
    figures["summary"] = summary
    if problems:
        raise StepFailed("; ".join(problems), figures)
    return figures


def step_model(ctx: Context, budget: Budget) -> dict[str, Any]:
    from perflab.realengine import tinymodel

    out = ctx.out / "tiny-model"
    done = run([sys.executable, tinymodel.__file__, str(out)], budget)
    if done.returncode != 0:
        raise StepFailed(f"tinymodel.py exited {done.returncode}: {tail(done.stderr)}")
    ctx.model = str(out)
    ctx.sampling = sampling_args(out)
    return {"path": str(out), "bytes": sum(p.stat().st_size for p in out.iterdir()), "bench_sampling": list(ctx.sampling)}


def sampling_args(model: Path) -> tuple[str, ...]:
    """How the bench asks the tiny model for answers that stream text, each of :data:`BENCH_ARGS`'
    output length: sampled, and with no end-of-sequence token to stop at. transformers serve takes
    a request's own generation config (the body's ``generation_config``, a JSON string, in place of
    the model's: transformers/cli/serving/utils.py ``_build_generation_config``; ``max_tokens``
    still applies); this one samples (``do_sample``: a ``temperature`` alone leaves the model's
    greedy decoding) and names no ``eos_token_id``.

    Greedy, the tiny model's near-uniform random weights repeat one token for ever
    (realengine/variants.py); where that token is a lone UTF-8 byte (``ý``, ``¤``: byte-level BPE)
    the answer decodes to U+FFFD only, the server streams no text and the bench counts the request
    failed ("no token received"): 2 of 24 prompts at seed 0, measured on CPU. Sampled, an answer
    could also end at its first token on the model's EOS. ``model`` is where that model is."""
    config = json.loads((model / "generation_config.json").read_text())
    generation = {"do_sample": True, "temperature": 1.0, "top_k": 0, "pad_token_id": config.get("pad_token_id")}
    return ("--extra-body", json.dumps({"generation_config": json.dumps(generation)}))


class Launch:
    """``perflab launch transformers --json`` serving in the background until Ctrl-C."""

    def __init__(self, ctx: Context, name: str, budget: Budget) -> None:
        if ctx.model is None:
            raise StepFailed("no model (the model step failed)")
        self.workdir = ctx.out / "runs" / name
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.stdout = (self.workdir / "perflab-launch.stdout").open("w")
        self.stderr_path = self.workdir / "perflab-launch.stderr"
        self.stderr = self.stderr_path.open("w")
        self.engine = ctx.engine
        argv = perflab("launch", ctx.engine, "--json", "--model", ctx.model, *ctx.serve_args, "--workdir",
                       str(self.workdir), "--startup-timeout", f"{max(1.0, budget.left() - 30):.0f}")
        self.argv = argv
        self.proc = subprocess.Popen(argv, stdout=self.stdout, stderr=self.stderr, text=True, env=child_env())

    def wait_ready(self, budget: Budget) -> dict[str, Any]:
        """launch.json once the engine is ready (perflab's "ready in" line on stderr)."""
        while True:
            text = self.stderr_path.read_text()
            if re.search(rf"perflab: {re.escape(self.engine)} ready in [0-9.]+ s", text):
                return dict(json.loads((self.workdir / "launch.json").read_text()))
            if self.proc.poll() is not None:
                raise StepFailed(f"perflab launch exited {self.proc.returncode} before ready: {self.result_line()}")
            if budget.left() < 1:
                raise StepFailed("not ready within the step's budget")
            time.sleep(0.2)

    def stop(self, timeout: float) -> dict[str, Any]:
        """Ctrl-C (if still serving), then perflab's outcome (``perflab launch --json``)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()  # perflab's keeper then stops the engine
            self.proc.wait()
            raise StepFailed("perflab launch did not finish its teardown in time") from None
        finally:
            self.stdout.close()
            self.stderr.close()
        text = (self.workdir / "perflab-launch.stdout").read_text()
        try:
            outcome = dict(json.loads(text))
        except ValueError:
            raise StepFailed(f"perflab launch printed no JSON (exit {self.proc.returncode}): {self.result_line()}") from None
        outcome["perflab_exit"] = self.proc.returncode
        return outcome

    def abort(self) -> None:
        """On a step's failure: Ctrl-C, then SIGKILL after perflab's grace (its keeper then
        stops the engine); nothing of the launch is left running."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=ABORT_WAIT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.stdout.close()
        self.stderr.close()

    def result_line(self) -> str:
        return tail(self.stderr_path.read_text(), 3)


def bench_argv(launch: Mapping[str, Any], ctx: Context, requests: int) -> list[str]:
    return perflab("bench", "--base-url", str(launch["base_url"]), "--model", str(launch["served_model_name"]),
                   "--engine", ctx.engine, "--tokenizer", str(ctx.tokenizer or ctx.model), "--num-prompts", str(requests),
                   *BENCH_ARGS, *ctx.sampling, "--json")


def step_serve(ctx: Context, budget: Budget) -> dict[str, Any]:
    from perflab.observe.energy import energy

    before = memory_used_mib(ctx.nvml)
    launch = Launch(ctx, "serve", budget)
    try:
        record = launch.wait_ready(budget)
        during = memory_used_mib(ctx.nvml)
        sampler = Sampler(ctx.env)
        with sampler.running():
            bench = run(bench_argv(record, ctx, BENCH_REQUESTS), budget)
    except BaseException:
        launch.abort()
        raise
    outcome = launch.stop(timeout=max(5.0, budget.end - time.monotonic()))
    after = memory_used_mib(ctx.nvml)
    figures: dict[str, Any] = {
        "ready_s": outcome.get("ready_s"), "teardown_s": outcome.get("teardown_s"),
        "engine_version": outcome.get("version"), "argv": record.get("argv"), "warnings": outcome.get("warnings"),
        "memory_before_mib": round(before, 1), "memory_serving_mib": round(during, 1),
        "memory_after_mib": round(after, 1), "leftovers": outcome.get("leftovers"),
    }
    problems = [f"perflab launch exited {outcome['perflab_exit']} ({outcome.get('state')})"] \
        if outcome["perflab_exit"] != 0 else []
    try:
        result = json.loads(bench.stdout)
    except ValueError:
        raise StepFailed(f"perflab bench exited {bench.returncode} with no JSON: {tail(bench.stderr)}", figures) from None
    for key in ("completed", "failed", "duration", "total_input_tokens", "total_output_tokens", "request_throughput",
                "output_throughput", "mean_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "p99_tpot_ms"):
        figures[key] = result.get(key)
    if bench.returncode != 0 or result.get("completed") != BENCH_REQUESTS:
        problems.append(f"perflab bench exited {bench.returncode}: {result.get('completed')}/{BENCH_REQUESTS} completed; "
                        f"errors {result.get('errors', [])[:2]}")
    joules = energy(sampler.samples, result.get("duration"), result.get("total_output_tokens"), requests=BENCH_REQUESTS)
    figures["telemetry_samples"] = len(sampler.samples)
    if joules is None:
        problems.append("no energy figure (no power readings)")
    else:
        figures |= joules
        tokens = float(result.get("total_output_tokens") or 0)
        figures["joules_per_output_token"] = round(joules["joules"] / tokens, 4) if tokens else None
    figures["memory_check"] = memory_problem(before, after, ctx.memory_total_mib, outcome.get("leftovers") or [])
    if figures["memory_check"]:
        problems.append(figures["memory_check"])
    if problems:
        raise StepFailed("; ".join(problems), figures)
    return figures


def memory_problem(before: float, after: float, total: float | None, leftovers: Sequence[str]) -> str | None:
    """What is wrong with the GPU's memory after teardown: perflab's own baseline check said so
    (a leftover), or NVML shows more in use than before beyond the check's tolerance
    (:data:`perflab.supervisor.MEMORY_TOLERANCE`) and perflab did not notice. None: back to baseline."""
    from perflab.supervisor import MEMORY_TOLERANCE

    said = [x for x in leftovers if "memory" in x]
    if said:
        return "; ".join(said)
    tolerance = max(MEMORY_TOLERANCE * (total or 0), 64)
    if after - before > tolerance:
        return (f"GPU memory {after:.0f} MiB after teardown, {before:.0f} MiB before launch "
                f"(tolerance {tolerance:.0f} MiB), and perflab's baseline check did not say so")
    return None


def step_fault(ctx: Context, budget: Budget) -> dict[str, Any]:
    before = memory_used_mib(ctx.nvml)
    launch = Launch(ctx, "fault", budget)
    bench: subprocess.Popen[str] | None = None
    try:
        record = launch.wait_ready(budget)
        bench = subprocess.Popen(bench_argv(record, ctx, FAULT_REQUESTS), stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, env=child_env())
        time.sleep(FAULT_KILL_AFTER_S)
        if bench.poll() is not None:
            raise StepFailed(f"the benchmark ended (exit {bench.returncode}) before the engine was killed")
        os.kill(int(record["pid"]), signal.SIGKILL)
        killed_at = time.monotonic()
        launch.proc.wait(timeout=budget.left())  # perflab sees the death, tears down, exits
        noticed_s = time.monotonic() - killed_at
        out, err = bench.communicate(timeout=budget.left())
    except BaseException as exc:
        if bench is not None and bench.poll() is None:
            bench.kill()
            bench.communicate()
        launch.abort()
        if isinstance(exc, subprocess.TimeoutExpired):
            raise StepFailed("perflab did not notice the engine's death within the step's budget") from None
        raise
    outcome = launch.stop(timeout=max(5.0, budget.end - time.monotonic()))
    after = memory_used_mib(ctx.nvml)
    figures: dict[str, Any] = {
        "state": outcome.get("state"), "cause": outcome.get("cause"), "reason": outcome.get("reason"),
        "perflab_exit": outcome["perflab_exit"], "noticed_s": round(noticed_s, 2), "bench_exit": bench.returncode,
        "memory_before_mib": round(before, 1), "memory_after_mib": round(after, 1),
        "leftovers": outcome.get("leftovers"),
    }
    try:
        result = json.loads(out)
        figures["bench_completed"], figures["bench_failed"] = result.get("completed"), result.get("failed")
    except ValueError:
        figures["bench_said"] = tail(err, 3)
    problems = []
    if outcome.get("state") != "crashed" or outcome.get("cause") != "killed-by-signal":
        problems.append(f"perflab called it {outcome.get('state')}/{outcome.get('cause')}, not crashed/killed-by-signal")
    if "SIGKILL" not in str(outcome.get("reason")):
        problems.append(f"the reason does not name SIGKILL: {outcome.get('reason')!r}")
    if bench.returncode == 0:
        problems.append("perflab bench exited 0 although the engine died under it")
    memory = memory_problem(before, after, ctx.memory_total_mib, outcome.get("leftovers") or [])
    if memory:
        problems.append(memory)
    if problems:
        raise StepFailed("; ".join(problems), figures)
    return figures


STEP_FUNCTIONS: Mapping[str, Callable[[Context, Budget], dict[str, Any]]] = {
    "nvml": step_nvml, "telemetry": step_telemetry, "model": step_model, "serve": step_serve, "fault": step_fault,
}


def run_step(name: str, ctx: Context) -> StepResult:
    budget_s = STEPS[name]
    t0 = time.monotonic()
    try:
        figures, error = STEP_FUNCTIONS[name](ctx, Budget(budget_s)), None
    except StepFailed as exc:
        figures, error = exc.figures, str(exc)
    except Exception as exc:  # a bug or an environment problem: the other steps still run
        figures, error = {}, f"{type(exc).__name__}: {exc}"
    return StepResult(name, error is None, round(time.monotonic() - t0, 2), budget_s, error, figures)


# ------------------------------------------------------------------------------- main

#: the distributions whose versions the JSON records: perflab's, the machine's, the wheels'
DISTRIBUTIONS: tuple[str, ...] = ("perflab", "perflab-plugin-transformers", "torch", "transformers", "nvidia-ml-py",
                                  "accelerate", "fastapi", "uvicorn")


def installed_versions() -> dict[str, str | None]:
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, str | None] = {}
    for name in DISTRIBUTIONS:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out



def main(argv: Sequence[str] | None = None, nvml: Any | None = None,
         steps: Callable[[str, Context], StepResult] = run_step) -> int:
    """``nvml``: the NVML module to use (default: pynvml, :func:`real_nvml`); ``steps`` runs one
    step (the tests pass their own, to write a check without a GPU)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=Path("gpu-check-out"),
                        help="Directory for gpu-check.json, the NVML fixture, the model and the runs (default %(default)s).")
    args = parser.parse_args(argv)
    nvml = real_nvml() if nvml is None else nvml
    why = gpu_absent(nvml)
    if why is not None:
        print(NO_GPU.format(why=why), file=sys.stderr)
        return EXIT_NO_GPU
    from perflab.cli.logs import DEFAULT_LEVEL, logging_at

    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    ctx = Context(out=args.out.resolve(), nvml=nvml)
    results = []
    with logging_at(DEFAULT_LEVEL):  # perflab's log lines (telemetry's warnings) on stderr, as its CLI's
        for name in STEPS:
            print(f"gpu_check: {name} (at most {STEPS[name]:.0f} s) ...", file=sys.stderr, flush=True)
            results.append(steps(name, ctx))
    check = GpuCheck(host=socket.gethostname(), started_utc=started, python=platform.python_version(),
                     versions=installed_versions(), steps=tuple(results), seconds=round(time.monotonic() - t0, 1))
    (args.out / "gpu-check.json").write_text(json.dumps(check.to_json(), indent=2) + "\n")
    print(check.summary())
    print(f"gpu_check: wrote {args.out / 'gpu-check.json'}")
    return EXIT_OK if check.passed else EXIT_FAILED


if __name__ == "__main__":
    raise SystemExit(main())
