"""perflab against the real Hugging Face ``transformers serve`` (transformers 5.19.0 of the vLLM CPU
environment, accelerate as a cached layer: perflab.realengine.transformers_serve), on the lane's
tiny model: ready, a benchmark checked against the server's own counts, Ctrl-C and SIGKILL of
perflab with nothing left, a missing model path and a bad flag named by their root-cause lines,
and a two-engine study (the real vLLM CPU build against transformers serve).

Cheap on purpose: one launch serves the readiness, benchmark and Ctrl-C checks; the SIGKILL
check kills perflab while the engine loads; the faults die in seconds. transformers serve has
no /metrics: the server's own counts are its Uvicorn access log (one line per request, with its
status) and each answer's ``usage``.
"""

from __future__ import annotations

import json
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from reallab import Proc, RealLab, free_port

from perflab.realengine import VLLM_CPU_SERVE_ARGS, RealEngineEnv, ensure_transformers_serve
from perflab.realengine.transformers_serve import engine_env

READY_RE = re.compile(r"ready in ([\d.]+) s at (http://\S+);")
# Uvicorn's access log line (uvicorn/logging.py AccessFormatter): client - "METHOD PATH HTTP/1.1" STATUS
ACCESS_RE = re.compile(r'"POST /v1/chat/completions HTTP/1\.1" (\d{3})')
NUM_PROMPTS = 16
OUTPUT_LEN = 12


@pytest.fixture(scope="module")
def tf_env(vllm_env: RealEngineEnv) -> RealEngineEnv:
    env = ensure_transformers_serve(base=vllm_env)
    if env.install_s:
        print(f"\nprovisioned the accelerate layer for transformers serve in {env.install_s:.0f} s at {env.root}")
    return env


@pytest.fixture
def tlab(tf_env: RealEngineEnv, tmp_path: Path) -> Iterator[RealLab]:
    lab = RealLab(tf_env, tmp_path)
    yield lab
    lab.assert_nothing_left()


def launch_args(lab: RealLab, *extra: str, model: Path | str | None = None) -> list[str]:
    """``perflab launch transformers`` on the tiny model: continuous batching, float32 (the
    tiny model's weights), accelerate given to the engine only."""
    pythonpath = engine_env(lab.env)["PYTHONPATH"]
    return ["launch", "transformers", "--model", str(model or lab.env.model), "--env", f"PYTHONPATH={pythonpath}",
            "--engine-option", "dtype=float32", "--engine-option", "continuous_batching=true",
            "--hardware", "auto", "--startup-timeout", "300", *extra]


def _ready(proc: Proc) -> tuple[float, str]:
    line = proc.wait_for_line("ready in", timeout=300)
    m = READY_RE.search(line)
    assert m, line
    return float(m.group(1)), m.group(2)


def test_serves_benchmarks_against_its_own_counts_and_stops_on_ctrl_c(tlab: RealLab) -> None:
    lab = tlab
    port = free_port()
    workdir = lab.tmp / "w"
    proc = lab.popen(*launch_args(lab, "--port", str(port), "--workdir", str(workdir)))
    try:
        ready_s, base_url = _ready(proc)
        assert httpx.get(f"{base_url}/health", timeout=10).json() == {"status": "ok"}
        bench = ["bench", "--base-url", base_url, "--model", str(lab.env.model), "--tokenizer", str(lab.env.model),
                 "--dataset", "random", "--random-input-len", "48", "--random-output-len", str(OUTPUT_LEN),
                 "--num-prompts", str(NUM_PROMPTS), "--max-concurrency", "4", "--seed", "7", "--json"]
        # without the engine's declaration the bench sends vLLM's ignore_eos: the server refuses it
        refused = lab.run(*bench, timeout=120)
        assert refused.rc == 1 and "Unexpected fields in the request" in refused.stderr, refused.stderr[-2000:]
        r = lab.run(*bench, "--engine", "transformers", timeout=400)
        assert r.rc == 0, r.stderr[-3000:]
        res = r.json()
    finally:
        rc, out, err = proc.stop(signal.SIGINT, timeout=90)
    assert rc == 0, err[-3000:]
    lab.assert_nothing_left(port)

    log = (workdir / "engine.log").read_text()
    statuses = ACCESS_RE.findall(log)
    info = res["perflab"]
    assert res["completed"] == NUM_PROMPTS and res["failed"] == 0
    # the server's access log: the readiness probe's generation, the refused run's test request
    # (422), then the bench's test request and its NUM_PROMPTS requests, all 200
    assert statuses.count("422") == 1 and statuses.count("200") == 1 + 1 + NUM_PROMPTS, statuses
    # lengths cannot be forced: perflab counts what the server generated, from each answer's usage
    assert info["output_lengths"] == "counted"
    assert info["output_tokens_source"] == {"usage": NUM_PROMPTS}, info["output_tokens_source"]
    # the input totals are the server's (usage.prompt_tokens of every answer); its chat template
    # wraps each prompt in its own tokens, so they differ from the client's count of the text
    assert info["input_tokens_source"] == "server"
    assert res["total_input_tokens"] > info["total_input_tokens_client"] > 0
    assert 0 < res["total_output_tokens"] <= NUM_PROMPTS * OUTPUT_LEN
    assert "output lengths were not forced" in r.stderr
    print(f"\ntransformers serve: ready {ready_s} s; {res['completed']} requests, input {res['total_input_tokens']}, "
          f"(client count {info['total_input_tokens_client']}), output {res['total_output_tokens']} (of at most {NUM_PROMPTS * OUTPUT_LEN}), "
          f"{res['output_throughput']:.1f} output tok/s, mean TTFT {res['mean_ttft_ms']:.0f} ms")


def test_sigkill_of_perflab_leaves_nothing(tlab: RealLab) -> None:
    lab = tlab
    port = free_port()
    workdir = lab.tmp / "w"
    proc = lab.popen(*launch_args(lab, "--port", str(port), "--workdir", str(workdir)))
    try:
        deadline = time.monotonic() + 120
        while not lab.engine_processes() or not (workdir / "launch.json").exists():
            assert time.monotonic() < deadline and proc.poll() is None, "the engine never started"
            time.sleep(0.2)
        proc.popen.send_signal(signal.SIGKILL)  # perflab itself: its keeper must stop the engine
        proc.finish(timeout=30)
    finally:
        proc.kill()
    lab.assert_nothing_left(port, within=60)


def _fault(lab: RealLab, *extra: str, model: Path | str | None = None) -> dict:
    args = launch_args(lab, "--json", "--port", str(free_port()), "--workdir", str(lab.tmp / "w"), *extra, model=model)
    r = lab.run(*args)
    result = json.loads(r.stdout)
    result["_rc"] = r.rc
    return result


def test_missing_model_path_is_named(tlab: RealLab) -> None:
    result = _fault(tlab, model=tlab.tmp / "no-such-model")
    assert result["_rc"] == 4 and result["state"] == "crashed"
    crash = result["crash"]
    assert result["cause"] == "model-not-found", crash
    assert crash["line"].startswith("huggingface_hub.errors.HFValidationError: Repo id must be in the form"), crash


def test_bad_flag_is_named(tlab: RealLab) -> None:
    result = _fault(tlab, "--extra-arg=--cb-bogus=3")
    assert result["_rc"] == 4 and result["state"] == "crashed"
    crash = result["crash"]
    assert result["cause"] == "bad-flag", crash
    assert crash["line"] == "Error: No such option '--cb-bogus'.", crash


def test_a_study_of_two_real_engines(tlab: RealLab) -> None:
    """vLLM CPU against transformers serve on the same tiny model, one study, its report written."""
    lab = tlab
    pythonpath = engine_env(lab.env)["PYTHONPATH"]
    plan = lab.tmp / "plan.yaml"
    plan.write_text(f"""
name: vllm-vs-transformers-tiny
title: The real vLLM CPU build and transformers serve on a tiny model
model: {{path: {lab.env.model}}}
hardware: auto
engines: [vllm, transformers]
baseline: {{engine: vllm}}
engine_serve:
  vllm:
    max_model_len: 512
    extra_args: {json.dumps(list(VLLM_CPU_SERVE_ARGS))}
    env: {{VLLM_CPU_KVCACHE_SPACE: "1"}}
  transformers:
    env: {{PYTHONPATH: {pythonpath}}}
    engine_options: {{dtype: float32, continuous_batching: true}}
profiles:
  short: {{label: Short Prompt, input_len: 48, output_len: 12, num_prompts: 16, max_concurrency: 4, seed: 7}}
timeouts: {{startup_s: 300, benchmark_s: 300, teardown_s: 10}}
""")
    out = lab.tmp / "study"
    r = lab.run("run", str(plan), "--hardware", "auto", "--out", str(out), timeout=900)
    assert r.rc == 0, r.stdout[-3000:] + r.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    text = (out / "report.md").read_text()
    assert "vllm serve" in text and "transformers serve" in text
    assert report["engines"]["vllm"]["version"].startswith("0.32.0")
    assert report["engines"]["transformers"]["version"] == "5.19.0"
    assert report["simulated"] is False
    (step,) = [s for s in report["steps"] if s["kind"] == "engine"]
    results = {e["engine"]: e["result"] for e in step["entries"]}
    # both measured in full (greedy decoding on the tiny model: with this seed no answer ends at
    # EOS before its first token, which would leave a stream with no token: a failed request)
    assert {e: r["success_rate"] for e, r in results.items()} == {"vllm": 1.0, "transformers": 1.0}
    assert results["vllm"]["metrics"]["total_output_tokens"] == 16 * 12  # forced: ignore_eos
    assert 0 < results["transformers"]["metrics"]["total_output_tokens"] <= 16 * 12  # counted
    # the caveat is in the report, beside the engine's result
    assert "output lengths cannot be forced" in json.dumps(results["transformers"]["reasons"])
    assert "output lengths cannot be forced" in text
    print(f"\ntwo-engine study: {r.seconds:.0f} s; total token throughput " + ", ".join(
        f"{e} {r['total_token_throughput']:.0f} tok/s" for e, r in results.items()))
    lab.assert_nothing_left()
