"""A small study written through the real store by the runner's measure and a fake executor
(no engine runs: it takes a second), holding what readers of a study must handle: a measurement
with repeats, a refusal, a crash, one stopped early, and a load curve (tests/lab/test_export.py,
tests/lab/test_report_schema.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio

from perflab.contract.status import Status
from perflab.contract.types import CrashCause, Unsupported
from perflab.lab.plan import load_plan_text
from perflab.lab.run.runner import LiveMeasure
from perflab.lab.store import ProfileMeasurement, RunRecord, Store
from perflab.lab.study import conduct

PLAN = """
name: export-test
model: m
engines: [vllm, sglang, trtllm]
candidates:
  - name: Max Num Seqs
    variants: [{name: "256", set: {max_num_seqs: 256}}, {name: "512", set: {max_num_seqs: 512}}]
profiles:
  main: {input_len: 10, output_len: 10, num_prompts: 10}
  curve: {input_len: 100, output_len: 10, num_prompts: 10, sweep: {max_concurrency: [1, 4]}}
"""
SALT = {"hw": "x"}
VERSIONS = {"vllm": "0.11.0", "sglang": "0.5.5.post1", "trtllm": "1.2.0rc1"}


def _metrics(tps: float, ttft: float = 50.0, **more: Any) -> dict[str, Any]:
    return {"num_prompts": 10, "request_rate": "inf", "max_concurrency": None, "completed": 10, "failed": 0,
            "total_token_throughput": tps, "output_throughput": tps / 2, "mean_ttft_ms": ttft,
            "median_ttft_ms": ttft, "p99_ttft_ms": 2 * ttft, "p90_ttft_ms": 1.5 * ttft, **more}


class Executor:
    """Stands in for perflab.lab.run.executor.Executor: vllm serves (two repeats), sglang is
    refused, trtllm crashes, vllm at 512 seqs stops early; the curve profile is two load points."""

    async def run(self, config, profiles, run_dir, *, label="", to_beat=None, **_):
        engine, seqs = config.engine, config.options.get("max_num_seqs", 0)
        if engine == "sglang":
            return RunRecord(Status.UNSUPPORTED, version=VERSIONS[engine],
                             reasons=(Unsupported("model=m", "m has no SGLang support"),))
        if engine == "trtllm":
            return RunRecord(Status.CRASHED, version=VERSIONS[engine], error="exit 1",
                             cause=CrashCause("weights", "KeyError: 'weight'", line="KeyError: 'weight'"))
        tps = 100.0 + seqs / 100
        out = {}
        for p in profiles:
            if p.sweep is not None:
                points = [{"load": {"max_concurrency": c}, "metrics": _metrics(tps * c, max_concurrency=c), "repeats": [],
                           "noise": {}, "slo_met": None, "status": "ok", "stopped_early": None, "error": None}
                          for c in (1, 4)]
                out[p.name] = ProfileMeasurement(Status.OK, metrics=points[-1]["metrics"], num_prompts=10, points=points)
            elif seqs == 512:
                out[p.name] = ProfileMeasurement(Status.STOPPED_EARLY, metrics=_metrics(tps / 2), num_prompts=10,
                                                 stopped_early={"reason": "lost"})
            else:
                reps = [_metrics(tps - 1), _metrics(tps + 1)]
                out[p.name] = ProfileMeasurement(Status.OK, metrics=_metrics(tps), num_prompts=10, repeats=reps,
                                                 noise={"total_token_throughput": 1.0})
        return RunRecord(Status.DONE, measurements=out, version=VERSIONS[engine])


class _Log:
    def info(self, *a, **k): ...
    def warning(self, *a, **k): ...
    def exception(self, *a, **k): ...


def write_study(out: Path) -> Path:
    """The study, in ``out``: its store and meta as `perflab run` leaves them (no report files)."""
    plan = load_plan_text(PLAN, path="export-test.yaml")
    store = Store(out)
    store.begin_session()
    for key, value in (("plan_text", PLAN), ("plan_path", "export-test.yaml"), ("salt", SALT),
                       ("versions", VERSIONS), ("display", {"vllm": "vLLM", "sglang": "SGLang", "trtllm": "TensorRT-LLM"}),
                       ("hardware_spec", "sim:a100-80g-x8"), ("simulated", True)):
        store.set_meta(key, value)
    measure = LiveMeasure(store, SALT, Executor(), retry_failed=False, on_event=lambda *a, **k: None, log=_Log())
    try:
        anyio.run(lambda: conduct(plan, measure))
    finally:
        store.close()
    return out
