"""Benchmark backends: perflab's own client, or an external driver (a plugin).

A backend is a callable ``driver(request: BenchRequest) -> BenchResult``, run in a worker
thread; it may start subprocesses (argv lists, never a shell). Built in:

``perflab``
    The built-in client (:func:`perflab.bench.runner.run_benchmark_sync`).
``vllm-bench``
    Runs ``vllm bench serve ... --save-result`` and reads the JSON it writes, for users who
    want vLLM's own numbers. The executable is ``vllm`` on ``PATH``, or the argv prefix in
    ``PERFLAB_VLLM_BENCH`` (e.g. ``python -m vllm.entrypoints.cli.main``).

Plugins add more through the hook ``perflab_register_bench_backends(register)``::

    @hookimpl
    def perflab_register_bench_backends(register):
        register("guidellm", run_guidellm)
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from perflab.bench.metrics import BenchMetrics, name_of
from perflab.bench.profiles import apply_profile
from perflab.bench.request import BenchRequest
from perflab.bench.result import BenchResult
from perflab.bench.vllm_cli import RESULT_FILENAME, vllm_bench_argv, vllm_tokenizer_dir
from perflab.contract.errors import PerflabError, UsageError
from perflab.plugins import PluginManager

__all__ = ["BUILTIN_BACKENDS", "available_backends", "get_backend", "run_vllm_bench_serve", "vllm_bench_argv",
           "vllm_tokenizer_dir"]

Driver = Callable[[BenchRequest], BenchResult]

VLLM_BENCH_ENV = "PERFLAB_VLLM_BENCH"
# vLLM's --save-detailed per-request lists: not metrics.
_DETAILED_FIELDS = ("input_lens", "output_lens", "ttfts", "itls", "generated_texts", "errors", "start_times")


def _perflab(req: BenchRequest) -> BenchResult:
    from perflab.bench.runner import run_benchmark_sync

    return run_benchmark_sync(req)


# --------------------------------------------------------------------------- vllm bench serve

_DURATION = name_of(lambda m: m.duration)
_RATES = (name_of(lambda m: m.request_goodput), name_of(lambda m: m.max_output_tokens_per_s))


def _scale_metrics(data: Mapping[str, Any], factor: float) -> BenchMetrics:
    """Durations × factor, rates ÷ factor: a run against a simulator ``factor`` times fast."""
    out = dict(data)
    if factor != 1.0:
        for key, value in data.items():
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                continue
            if key.endswith("_ms") or key == _DURATION:
                out[key] = value * factor
            elif key.endswith("_throughput") or key in _RATES:
                out[key] = value / factor
    return BenchMetrics.from_json(out)


def run_vllm_bench_serve(req: BenchRequest, *, executable: list[str] | None = None, env: Mapping[str, str] | None = None) -> BenchResult:
    """Drive ``vllm bench serve`` and read back its ``--save-result`` JSON."""
    req = apply_profile(req).validate()
    # vllm bench serve sends ignore_eos for the random dataset whatever it is told (vLLM 0.33,
    # vllm/benchmarks/serve.py) and repetition_penalty to /v1/completions: an engine that
    # refuses them (transformers serve: HTTP 422) can only be measured by perflab's own client
    refused = [x for x, sent in (("ignore_eos", req.dataset == "random"), ("repetition_penalty", req.backend == "openai"))
               if sent and not req.takes(x)]
    if refused:
        raise UsageError(f"--bench-backend vllm-bench: vllm bench serve would send {', '.join(refused)}, which this "
                         "engine's server refuses; use the built-in client (--bench-backend perflab)")
    environ = dict(os.environ if env is None else env)
    exe = executable or shlex.split(environ.get(VLLM_BENCH_ENV, "")) or ["vllm"]
    if shutil.which(exe[0], path=environ.get("PATH")) is None:
        raise PerflabError(f"--bench-backend vllm-bench: {exe[0]!r} not found on PATH (install vllm, set {VLLM_BENCH_ENV}, or use the built-in client)")
    with tempfile.TemporaryDirectory(prefix="perflab-vllm-bench-") as tmp:
        argv = vllm_bench_argv(req, tmp, exe)
        proc = subprocess.run(argv, capture_output=True, text=True, env=environ, check=False)
        out_path = Path(tmp) / RESULT_FILENAME
        if proc.returncode != 0 or not out_path.is_file():
            lines = [ln for ln in (proc.stderr or proc.stdout or "").splitlines() if ln.strip()]
            tail = lines[-1] if lines else "no output"
            raise PerflabError(f"vllm bench serve exited with code {proc.returncode}: {tail}")
        try:
            data = json.loads(out_path.read_text(encoding="utf-8"))
        except ValueError as exc:
            raise PerflabError(f"vllm bench serve wrote invalid JSON: {exc}") from None
    errors = [str(e) for e in data.get("errors") or [] if e][:10]
    metrics = _scale_metrics({k: v for k, v in data.items() if k not in _DETAILED_FIELDS}, req.time_scale)
    result = BenchResult(
        metrics=metrics,
        errors=errors,
        info={
            "client": "vllm-bench",
            "argv": argv,
            "time_scale": req.time_scale,
            "stdout_tail": (proc.stdout or "")[-4000:],
        },
        percentiles=tuple(req.percentiles),
        percentile_metrics=tuple(req.percentile_metrics),
    )
    if req.save_result:
        result.info["result_path"] = str(result.save(req.result_dir, req.result_filename))
    return result


# --------------------------------------------------------------------------- registry

BUILTIN_BACKENDS: dict[str, Driver] = {"perflab": _perflab, "vllm-bench": run_vllm_bench_serve}


def available_backends(pm: PluginManager | None = None) -> dict[str, Driver]:
    """Built-in backends plus those registered by plugins (``pm``: a loaded PluginManager).

    A plugin registering a name that is already taken is ignored with a warning in
    ``pm.errors`` (when the manager has that list).
    """
    backends = dict(BUILTIN_BACKENDS)
    if pm is None:
        return backends

    def register(name: str, driver: Driver) -> None:
        if not callable(driver):
            raise TypeError(f"bench backend {name!r}: the driver must be callable")
        if name in backends:
            errs = getattr(pm, "errors", None)
            if isinstance(errs, list):
                errs.append(f"bench backend {name!r} registered twice; the second registration is ignored")
            return
        backends[name] = driver

    pm.hook.perflab_register_bench_backends(register=register)
    return backends


def get_backend(name: str, pm: PluginManager | None = None) -> Driver:
    """The driver called ``name``; plugins are loaded only for a name not built in."""
    if name in BUILTIN_BACKENDS:
        return BUILTIN_BACKENDS[name]
    backends = available_backends(pm if pm is not None else _load_pm())
    if name not in backends:
        raise UsageError(f"--bench-backend {name!r}: unknown (available: {', '.join(sorted(backends))})")
    return backends[name]


def _load_pm() -> Any:
    from perflab.plugins import load

    return load()
