"""What perflab hands to vLLM's own tooling, and what the lab hands to the client."""

from __future__ import annotations

import json
import shlex
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import anyio
import pytest

from perflab.bench import BenchRequest
from perflab.bench.backends import vllm_bench_argv, vllm_tokenizer_dir
from perflab.bench.client import build_payload
from perflab.lab.plan import Profile


def _tokenizer_dir(tmp_path: Path) -> Path:
    """A model directory with a real (tiny, trained here) tokenizer.json."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(["the quick brown fox jumps over the lazy dog"] * 5, trainers.BpeTrainer(vocab_size=300))
    d = tmp_path / "tiny-model"
    d.mkdir()
    tok.save(str(d / "tokenizer.json"))
    return d


def test_vllm_bench_gets_a_tokenizer_directory(tmp_path: Path) -> None:
    d = _tokenizer_dir(tmp_path)
    base = BenchRequest(base_urls=("http://127.0.0.1:8000",), model="tiny")
    for spec, expected in ((str(d / "tokenizer.json"), str(d.resolve())), (str(d), str(d))):
        argv = vllm_bench_argv(base.replace(tokenizer=spec), str(tmp_path))
        assert argv[argv.index("--tokenizer") + 1] == expected
    for spec in (None, "whitespace", "approx"):
        assert "--tokenizer" not in vllm_bench_argv(base.replace(tokenizer=spec), str(tmp_path))
    assert vllm_tokenizer_dir("Qwen/Qwen3-8B") == "Qwen/Qwen3-8B"  # a hub id goes as is


def test_vllm_bench_argv_defaults_follow_vllm_033(tmp_path: Path) -> None:
    req = BenchRequest(base_urls=("http://127.0.0.1:8000",), model="/models/tiny", served_model_name="tiny")
    argv = vllm_bench_argv(req, str(tmp_path))
    assert argv[argv.index("--served-model-name") + 1] == "tiny"
    assert "--ignore-eos" in argv and "--temperature" not in argv
    sharegpt = vllm_bench_argv(req.replace(dataset="sharegpt", dataset_path="x.json"), str(tmp_path))
    assert "--ignore-eos" not in sharegpt


@pytest.mark.parametrize("dataset,ignore", [("random", True), ("synthetic-sharegpt", False), ("prefix-repetition", False)])
def test_random_dataset_requests_carry_ignore_eos(dataset: str, ignore: bool) -> None:
    req = BenchRequest(base_urls=("http://h:1",), model="m", dataset=dataset)
    for backend in ("openai-chat", "openai"):
        body = build_payload(req.replace(backend=backend), "hello", 8)
        assert body.get("ignore_eos", False) is ignore
        assert "temperature" not in body  # the server's default, as vLLM 0.33
    assert build_payload(req.replace(ignore_eos=False), "hi", 2).get("ignore_eos") is None
    assert build_payload(req.replace(ignore_eos=True, temperature=0.0), "hi", 2)["temperature"] == 0.0


def test_report_bench_command_names_the_served_model() -> None:
    p = Profile(name="main", label="Main", input_len=3000, output_len=100, num_prompts=10)
    argv = shlex.split(p.bench_command("/models/tiny", "tiny"))
    assert argv[:7] == ["vllm", "bench", "serve", "--model", "/models/tiny", "--served-model-name", "tiny"]
    assert "--served-model-name" not in p.bench_command("Qwen/Qwen3-8B")


def test_the_lab_benchmarks_a_local_model_with_its_own_tokenizer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The executor names the model (a local directory: the client loads its tokenizer.json)
    and the served name (sent in requests) separately; before, it passed only the served
    name and real runs fell back to the approximate tokenizer (5206 input tokens for 3000)."""
    import perflab.bench as bench
    from perflab.lab.options import Configuration
    from perflab.lab.plan import Timeouts
    from perflab.lab.run.executor import Executor, LabContext

    d = _tokenizer_dir(tmp_path)
    seen: list[BenchRequest] = []

    def fake_run(req: BenchRequest, progress: Any = None, cancel: threading.Event | None = None, observe: Any = None,
                 marks: Any = None) -> Any:
        seen.append(req)
        raise bench.BenchCancelled(None, "test")

    monkeypatch.setattr(bench, "run_benchmark_sync", fake_run)
    from perflab.lab.decide import Decision

    # an engine that cannot reset its prefix cache and serves no metrics endpoint
    no_reset = SimpleNamespace(engines={},  # no registered engine: no cache reset, no metrics endpoint
                               engine=lambda name: SimpleNamespace(info=SimpleNamespace(accelerators=())))
    ctx = LabContext(pm=no_reset, plan=SimpleNamespace(timeouts=Timeouts(benchmark_s=30.0), decision=Decision(),
                                                           min_improvement_pct=0.0, cost=None),  # type: ignore[arg-type]
                     hardware=SimpleNamespace(simulated=False, accelerators=()), env={})  # type: ignore[arg-type]
    inst = SimpleNamespace(base_url="http://127.0.0.1:9", launch=SimpleNamespace(served_model_name="tiny", argv=("vllm",), env={}),
                           died=anyio.Event(), outcome=SimpleNamespace(cause=None, log=None))
    config = Configuration("vllm", {"model": str(d), "served_model_name": "tiny"})
    profile = Profile(name="main", label="Main", input_len=3000, output_len=10, num_prompts=5)

    async def go() -> None:
        await Executor(ctx)._benchmark([inst], config, profile, tmp_path, "x")

    anyio.run(go)
    (req,) = seen
    assert req.model == str(d) and req.request_model == "tiny"
    from perflab.bench.tokenizer import load_tokenizer

    assert load_tokenizer(req.tokenizer, model=req.model).kind == "hf"  # what the runner does in auto mode
    assert json.loads(json.dumps(build_payload(req, "x", 1)))["model"] == "tiny"


def _vllm_033_peak_concurrency(traces: list) -> int:
    """vLLM 0.33's count (vllm/benchmarks/serve.py calculate_metrics): every one-second bucket
    from int(start) to int(end) of each successful request, the fullest bucket wins."""
    ok = [t for t in traces if t.success]
    origin = min(t.start for t in ok)
    buckets: dict[int, int] = {}
    for t in ok:
        for s in range(int(t.start - origin), int(t.start + t.latency - origin) + 1):
            buckets[s] = buckets.get(s, 0) + 1
    return max(buckets.values())


def test_peak_concurrency_is_exact_where_vllm_buckets_double_it() -> None:
    """32 slots, two waves of 0.4 s requests inside one second: vLLM 0.33 reads 64."""
    from perflab.bench.metrics import compute_metrics
    from perflab.bench.trace import RequestTrace

    traces = [RequestTrace.from_itl(start=0.1 + 0.4 * wave, ttft=0.1, itl=[0.1, 0.1, 0.1], output_tokens=4)
              for wave in range(2) for _ in range(32)]
    assert _vllm_033_peak_concurrency(traces) == 64
    assert compute_metrics(traces, 1.0)["max_concurrent_requests"] == 32
