"""perflab against the real vLLM (CPU build 0.32.0, tiny local model): every promise, for real.
This half serves, benchmarks and studies; test_real_vllm_faults.py stops, crashes and
misconfigures (two files, so that xdist runs the halves on both workers).

Each test starts its own engine and checks that nothing perflab started is left and the port
is free. The measured figures each test prints (``-s``) are the ones in docs/engines/vllm.md.
"""

from __future__ import annotations

import json
import re
import signal
import tempfile
import time
from pathlib import Path

import httpx
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families
from reallab import Proc, RealLab, free_port

from perflab.realengine import VLLM_CPU_SERVE_ARGS

READY_RE = re.compile(r"ready in ([\d.]+) s at (http://\S+);")


def _ready(proc: Proc) -> tuple[float, str]:
    line = proc.wait_for_line("ready in", timeout=300)
    m = READY_RE.search(line)
    assert m, line
    return float(m.group(1)), m.group(2)


def _scrape(base_url: str) -> dict[str, float]:
    """Sum every sample of each vLLM counter/histogram series by its sample name."""
    text = httpx.get(f"{base_url}/metrics", timeout=10).text
    sums: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            sums[s.name] = sums.get(s.name, 0.0) + s.value
    return sums


def _probe_prompt_tokens(base_url: str) -> int:
    """Prompt tokens of perflab bench's test request, as this engine counts them (``usage``)."""
    from perflab.bench.client import build_payload
    from perflab.bench.request import BenchRequest

    payload = build_payload(BenchRequest(base_urls=(base_url,), model="tiny"), "Hello", 1)
    payload["stream"] = False
    payload.pop("stream_options", None)
    answer = httpx.post(f"{base_url}/v1/chat/completions", json=payload, timeout=60).json()
    return int(answer["usage"]["prompt_tokens"])


def _engine_core(lab: RealLab, timeout: float = 30) -> psutil.Process:
    """vLLM's engine core process (``VLLM::EngineCore``, in the engine's session)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for p in lab.engine_processes():
            try:
                if any("EngineCore" in part for part in p.cmdline()):
                    return p
            except psutil.Error:
                continue
        time.sleep(0.2)
    raise AssertionError("no VLLM::EngineCore process found")


# --------------------------------------------------------------------------- engines list


def test_engines_list_finds_the_installed_vllm(lab: RealLab) -> None:
    r = lab.run("engines", "list", "--json")
    assert r.rc == 0, r.stderr
    rows = {row["engine"]: row for row in r.json()["engines"]} if isinstance(r.json(), dict) else {
        row["engine"]: row for row in r.json()}
    vllm = rows["vllm"]
    assert "0.32.0" in json.dumps(vllm)
    print(f"\nengines list: {r.seconds:.2f} s")
    assert r.seconds < 10


# --------------------------------------------------------------------------- launch --check


def test_launch_check_serves_and_tears_down_cleanly(lab: RealLab) -> None:
    port = free_port()
    r = lab.run(*lab.launch_args("--check", "--json", "--port", str(port), "--workdir", str(lab.tmp / "w")))
    assert r.rc == 0, r.stdout[-2000:] + r.stderr[-2000:]
    out = r.json()
    assert out["state"] == "done"
    assert out["check"]["ok"] is True
    assert out["leftovers"] == []
    assert "0.32.0" in (out["version"] or "")
    log = Path(out["log"]).read_text(errors="replace")
    assert "Starting vLLM server on http://" in log  # vLLM 0.32's own ready line (entry.py)
    # one SIGTERM to the API server: vLLM stops its own engine core and workers. vLLM 0.32 may
    # still log an EngineDeadError from its output handler *after* its own shutdown completed
    # (a race inside vLLM, seen with a single SIGTERM too); never before it.
    before_shutdown = log.split("[shutdown] MPClient: complete")[0]
    assert "EngineDeadError" not in before_shutdown
    assert log.count("EngineCore: trigger received signal=SIGTERM") <= 1
    print(f"\nlaunch --check: ready {out['ready_s']} s (own line {out['ready_log_s']} s), "
          f"teardown {out['teardown_s']} s, notes {out['notes']}")
    assert not any("SIGKILL" in n for n in out["notes"]), out["notes"]
    lab.assert_nothing_left(port)


# --------------------------------------------------------------------------- serving + bench


def _vllm_litter(directory: Path) -> set[str]:
    """What vLLM leaves in a temporary directory: its ZMQ IPC sockets (named by a uuid4,
    ``get_open_zmq_ipc_path``) and FileStore rendezvous files (``vllm_dist_<hex>``)."""
    uuid_re = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
    return {p.name for p in directory.iterdir() if uuid_re.match(p.name) or p.name.startswith("vllm_dist_")}


def test_bench_totals_equal_what_vllm_counted(lab: RealLab) -> None:
    port = free_port()
    tmp_before = _vllm_litter(Path(tempfile.gettempdir()))
    proc = lab.popen(*lab.launch_args("--port", str(port), "--workdir", str(lab.tmp / "w")))
    try:
        ready_s, base_url = _ready(proc)
        # vLLM's sockets are in the engine's own TMPDIR (the keeper's), not beside everyone's
        engine_tmp = Path(json.loads((lab.tmp / "w" / "launch.json").read_text())["tmpdir"])
        assert any(p.is_socket() for p in engine_tmp.iterdir()), sorted(p.name for p in engine_tmp.iterdir())
        version = httpx.get(f"{base_url}/version", timeout=10).json()["version"]
        assert version.startswith("0.32.0")
        before = _scrape(base_url)
        r = lab.run("bench", "--base-url", base_url, "--model", "tiny", "--tokenizer", str(lab.env.model),
                    "--dataset", "random", "--random-input-len", "48", "--random-output-len", "12",
                    "--num-prompts", "24", "--max-concurrency", "4", "--seed", "7", "--warmup", "0", "--json",
                    timeout=300)
        assert r.rc == 0, r.stderr[-2000:]
        res = r.json()
        after = _scrape(base_url)
        probe_prompt = _probe_prompt_tokens(base_url)  # after the scrape: not in the delta
        _observed_run(base_url, lab.env.model)  # after the scrape: not in the delta either
    finally:
        rc, out, err = proc.stop(signal.SIGINT, timeout=90)
    assert rc == 0, err[-3000:]
    lab.assert_nothing_left(port)  # the engine's TMPDIR included
    assert not engine_tmp.exists()
    assert _vllm_litter(Path(tempfile.gettempdir())) - tmp_before == set()

    delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    assert res["completed"] == 24 and res["failed"] == 0
    # perflab bench, like `vllm bench serve`, first sends one test request (1 token, prompt
    # "Hello"); vLLM counts it too
    assert delta["vllm:request_success_total"] == res["completed"] + 1
    assert delta["vllm:prompt_tokens_total"] == res["total_input_tokens"] + probe_prompt
    assert delta["vllm:generation_tokens_total"] == res["total_output_tokens"] + 1
    # the random dataset asks for exactly its output length (ignore_eos, as vLLM's bench does)
    assert res["total_output_tokens"] == 24 * 12

    # latencies: the client's view includes the network and its own scheduling, so it is never
    # shorter than the server's own measure (compare means; small slack for clock reads)
    server_ttft = delta["vllm:time_to_first_token_seconds_sum"] / delta["vllm:time_to_first_token_seconds_count"]
    server_e2e = delta["vllm:e2e_request_latency_seconds_sum"] / delta["vllm:e2e_request_latency_seconds_count"]
    client_ttft = res["mean_ttft_ms"] / 1000
    client_e2e = res["mean_e2el_ms"] / 1000
    print(f"\nbench vs /metrics: requests {res['completed']}={delta['vllm:request_success_total']:.0f}, "
          f"input {res['total_input_tokens']}, output {res['total_output_tokens']}; mean TTFT client "
          f"{client_ttft*1000:.1f} ms vs server {server_ttft*1000:.1f} ms; mean E2EL client "
          f"{client_e2e*1000:.1f} ms vs server {server_e2e*1000:.1f} ms; ready {ready_s} s")
    assert client_ttft >= 0.9 * server_ttft
    assert client_e2e >= 0.9 * server_e2e
    assert client_e2e <= 3 * server_e2e + 0.5
    lab.assert_nothing_left(port)


def _observed_run(base_url: str, model: Path) -> list:
    """What early stop is told during a run against the real engine (perflab.bench.drive's
    Observation): every count it bounds the rest of the run with holds on vLLM's own stream."""
    from perflab.bench import BenchRequest, run_benchmark_sync
    from perflab.lab.run.earlystop import FRAMING_EVENTS

    seen: list = []
    req = BenchRequest(base_urls=(base_url,), model="tiny", tokenizer=str(model), random_input_len=48,
                       random_output_len=12, num_prompts=24, max_concurrency=4, seed=7)
    res = run_benchmark_sync(req, observe=seen.append)
    assert res.metrics["completed"] == 24 and seen
    for o in seen:
        open_ = 24 - o.completed - o.failed
        assert o.output_cap_open == 12 * open_  # each request's max_tokens, until it ends
        assert 0 <= o.events_open <= (12 + FRAMING_EVENTS) * min(open_, 4)  # at most 4 streaming at once
        assert o.prompt_tokens_total > 0 and o.prompt_tokens <= o.prompt_tokens_total
        # no answer streams more than its max_tokens and the framing
        assert o.events <= (12 + FRAMING_EVENTS) * (o.completed + o.failed + o.in_flight)
    assert seen[-1].events >= 12 * seen[-1].completed  # a token per event, at least
    # each ended answer's usage, read from its stream: vLLM's own counts, at most max_tokens
    assert all(0 < o.usage_tokens <= 12 * o.completed for o in seen if o.completed)
    assert all(o.usage_prompt_tokens > 0 and o.usage_prompt_client > 0 for o in seen if o.completed)
    assert any(o.completed for o in seen)
    return seen


# --------------------------------------------------------------------------- a study


def _plan(lab: RealLab, profile: str = "{label: Short Prompt, input_len: 48, output_len: 12, num_prompts: 24, seed: 42}",
          candidates: bool = True) -> Path:
    steps = """
candidates:
  - name: Max Num Seqs
    variants:
      - {name: "4", set: {max_num_seqs: 4}}
""" if candidates else ""
    plan = lab.tmp / "plan.yaml"
    plan.write_text(f"""
name: real-vllm-tiny
title: The real vLLM CPU build on a tiny model
model: {{path: {lab.env.model}, name: tiny}}
hardware: auto
engines: [vllm]
serve:
  served_model_name: tiny
  max_model_len: 512
  extra_args: {json.dumps(list(VLLM_CPU_SERVE_ARGS))}
  env: {{VLLM_CPU_KVCACHE_SPACE: "1"}}
{steps}
profiles:
  short: {profile}
timeouts: {{startup_s: 300, benchmark_s: 300, teardown_s: 10}}
""")
    return plan


def test_run_a_study_on_the_real_engine(lab: RealLab) -> None:
    out = lab.tmp / "study"
    r = lab.run("run", str(_plan(lab)), "--hardware", "auto", "--out", str(out), timeout=900)
    assert r.rc == 0, r.stdout[-3000:] + r.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    text = (out / "report.md").read_text()
    assert "vllm serve" in text and "--served-model-name tiny" in text
    assert (out / "chart.png").stat().st_size > 1000
    assert "vllm serve" in (report["recommended_command"] or "")
    assert report["engines"]["vllm"]["version"].startswith("0.32.0")
    assert report["simulated"] is False
    (case,) = report["conclusion"]
    assert case["baseline_total_token_throughput"] > 0 and case["baseline_success_rate"] == 1.0
    assert "cpu" in json.dumps(report["hardware"]).lower()
    # issue #13: the report's own audit finds nothing to flag in a real vLLM's numbers
    assert report["audit"]["clean"] is True, report["audit"]["findings"]
    print(f"\nstudy: {r.seconds:.0f} s, baseline {case['baseline_total_token_throughput']:.0f} tok/s, "
          f"optimized {case['optimized_total_token_throughput']}")
    lab.assert_nothing_left()


#: vLLM's own rate may vary this much (max / min) for the host to count as steady: 1.22 in a run
#: on a quiet host, 1.9-2.3 while a shared VM's neighbours came and went (a CI run)
HOST_STEADY_RATIO = 1.35
# vllm/v1/metrics/loggers.py (LoggingStatLogger.log), vLLM 0.32.0
_VLLM_RATES = re.compile(r"Avg prompt throughput: ([\d.]+) tokens/s, Avg generation throughput: ([\d.]+) tokens/s, "
                         r"Running: (\d+) reqs, Waiting: (\d+) reqs")


def _vllm_logged_rates(log: str) -> list[float]:
    """vLLM's own tokens/s (prompt + generation) over each 10 s while requests waited, the
    first (start-up and warm-up in it) left out."""
    seen = [(float(m[1]) + float(m[2]), int(m[4])) for m in _VLLM_RATES.finditer(log)]
    return [r for r, waiting in seen[1:] if waiting > 0]


def test_early_stop_bound_and_forecast_hold_on_the_real_engine(lab: RealLab) -> None:
    """Early stop judged by the real vLLM on one complete run at its defaults: 2000 requests at
    once of varied lengths (128 output tokens ± 90 %). At every window a stop could come from
    (the client observed at least once a second, LAG_MAX_S: on two cores the CPU build can
    starve the client for seconds, and at such windows its counts lag what the engine sent —
    in a CI run the bound read 3681 there against a figure of 3828):

    - the bound (the most the whole run could still reach) must never be below the run's own
      ``total_token_throughput``, counted as it counts them. Counting streamed events and the
      client's prompt tokens, it was 10 % below: vLLM's API server merges a request's deltas
      while it is behind (110 events for 128 tokens with 3000 requests at once) and counted
      47 prompt tokens for the client's 32;
    - the forecast (the most the whole run can reach if its open requests run first come,
      first served at the steady state's pace, then no faster than a roofline decode step
      allows), made where its premises hold on vLLM's own stream — first come first served,
      answers to their max_tokens, a token per event — must never be below the run's figure
      by more than FORECAST_MARGIN (two local runs: figures 5281 and 5308 tok/s, forecasts
      5319–5458 and 5361–5615, bounds 5380–5470 and 5389–5741). On a slower host (a CI run)
      vLLM's API server fell behind and merged deltas, and the forecast declined, as it must.

    Both are judged only where the host's speed held during the run, by vLLM's own rate
    lines (HOST_STEADY_RATIO): on a shared VM whose neighbours came and went, vLLM's rate at
    a constant batch doubled mid-run, and the bound fell 11 % below the figure — a limit of
    any steady-state rule, listed in docs/reliability.md; the counting is judged always.

    (A ``--max-num-seqs 4`` variant to be stopped as lost is left out: in one CI run the
    starved client's observations came 228 s apart, so it ran to its end.)
    """
    from perflab.lab.run.earlystop import FORECAST_MARGIN, LAG_MAX_S

    out = lab.tmp / "study"
    plan = _plan(lab, "{label: Varied, input_len: 32, output_len: 128, range_ratio: 0.9, num_prompts: 2000, seed: 3}",
                 candidates=False)
    r = lab.run("run", str(plan), "--hardware", "auto", "--out", str(out), timeout=900)
    assert r.rc == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (base,) = [p for p in (out / "runs").iterdir() if p.name.endswith("-vllm")]
    measured = json.loads((base / "measurement-short.json").read_text())
    assert measured["status"] == "ok", measured
    m = measured["metrics"]
    figure = m["total_token_throughput"]
    seen = json.loads((base / "earlystop-short.json").read_text())
    kept_up = [w for w in seen["windows"] if w["lag_s"] <= LAG_MAX_S]
    print(f"\n{figure:.0f} tok/s; (bound, forecast, lag s): "
          f"{[(w['bound'] and round(w['bound']), w['forecast'] and round(w['forecast']), w['lag_s']) for w in seen['windows']]}; "
          f"premise unmet at the end: {seen['forecast_unmet']}")
    # every token counted as the figure counts them, once the run has ended
    assert seen["bound"]["tokens_done"] == pytest.approx(m["total_input_tokens"] + m["total_output_tokens"], rel=1e-3)
    bounds = [w["bound"] for w in kept_up if w["bound"] is not None]
    assert bounds, "the client never kept up while the bound was computed"
    # both are sound only on a host whose speed held during the run: vLLM's own throughput
    # lines (every 10 s) while requests waited, at a constant batch, judge that independently
    rates = _vllm_logged_rates((base / "engine.log").read_text(errors="replace"))
    steady = len(rates) >= 3 and max(rates) <= HOST_STEADY_RATIO * min(rates)
    print(f"vLLM's own rates while requests waited: {[round(r) for r in rates]} ({'steady' if steady else 'NOT steady'})")
    # not steady: a CI run on a shared VM, vLLM's own rate at 128 running requests went 2251 ->
    # 5079 tok/s with nothing changed in the engine; a steady-state rule cannot hold there
    # (a known limit of early stop: docs/reliability.md)
    if steady:
        assert min(bounds) >= 0.995 * figure, (min(bounds), figure)  # 0.5 %: an observation lands a tick late
    if not any(w["forecast"] is not None for w in seen["windows"]):
        # on a slower host vLLM's API server falls behind and merges a request's deltas (a CI
        # run): a step per event no longer holds, and the forecast rightly declines — the
        # only premise that may fail here (every request has a max_tokens and answers to it)
        assert seen["forecast_unmet"] == "the engine streamed several tokens in one event", seen["forecast_unmet"]
    elif steady:
        forecasts = [w["forecast"] for w in kept_up if w["forecast"] is not None]
        assert forecasts, "the client never kept up while the forecast was made"
        assert min(forecasts) >= (1 - FORECAST_MARGIN) * figure, (min(forecasts), figure)
    lab.assert_nothing_left()


# --------------------------------------------------------------------------- issue 12 on a real engine


def test_repeats_sweep_warmup_and_prefix_cache_reset_on_the_real_engine(lab: RealLab) -> None:
    """The measurement machinery of issue 12 against the real vLLM: two repeats of a
    prefix-sharing profile and a two-point concurrency sweep in one launch, warm-up requests
    excluded from the results, and the prefix cache emptied before every measurement through
    ``POST /reset_prefix_cache`` (served only in vLLM's dev mode, which the plan turns on)."""
    plan = lab.tmp / "plan.yaml"
    plan.write_text(f"""
name: real-vllm-measure
model: {{path: {lab.env.model}, name: tiny}}
hardware: auto
engines: [vllm]
serve:
  served_model_name: tiny
  max_model_len: 512
  extra_args: {json.dumps(list(VLLM_CPU_SERVE_ARGS))}
  env: {{VLLM_CPU_KVCACHE_SPACE: "1", VLLM_SERVER_DEV_MODE: "1"}}
repeats: 2
warmup: 2
profiles:
  shared: {{label: Shared Prefix, dataset: prefix-repetition, prefix_len: 64, input_len: 16, output_len: 8,
           num_prefixes: 2, num_prompts: 12, seed: 7}}
  curve: {{label: Curve, input_len: 32, output_len: 8, num_prompts: 8, seed: 7, sweep: {{max_concurrency: [1, 4]}}}}
main_profile: shared
timeouts: {{startup_s: 300, benchmark_s: 300, teardown_s: 10}}
""")
    out = lab.tmp / "study"
    r = lab.run("run", str(plan), "--hardware", "auto", "--out", str(out), timeout=900)
    assert r.rc == 0, r.stdout[-3000:] + r.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    log_text = (out / "study.log").read_text()
    # the reset answered (no "unavailable"/"failed" note), once before every measured benchmark
    assert "cache-reset-unavailable" not in log_text and "cache-reset-failed" not in log_text
    # uvicorn's access lines: one 200 per measured benchmark (the main profile's two repeats in
    # the baseline's run; the curve's 2 points x 2 repeats in the other-workloads run)
    logs = "".join(p.read_text() for p in sorted(out.glob("runs/*/engine.log")))
    resets = len(re.findall(r'"POST /reset_prefix_cache HTTP/[\d.]+" 200', logs))
    assert resets == 2 + 2 * 2, logs[-2000:]
    shared = json.loads(next(out.glob("runs/*/measurement-shared.json")).read_text())
    assert shared["status"] == "ok" and len(shared["repeats"]) == 2
    for rep in shared["repeats"]:
        assert rep["completed"] == 12  # the warm-up requests are not counted
    assert set(shared["noise"]) >= {"total_token_throughput"}
    curve = json.loads(next(out.glob("runs/*/measurement-curve.json")).read_text())
    loads = [p["load"]["max_concurrency"] for p in curve["points"]]
    assert loads == [1, 4] and all(p["status"] == "ok" for p in curve["points"])
    assert curve["points"][1]["metrics"]["max_concurrent_requests"] <= 4
    assert report["audit"]["clean"] is True, report["audit"]["findings"]  # repeats and load points too
    print(f"\nreal vLLM: {resets} prefix-cache resets, shared-prefix throughput noise "
          f"{shared['noise']['total_token_throughput']:.1f} % over 2 repeats, "
          f"curve {[round(p['metrics']['output_throughput']) for p in curve['points']]} tok/s at {loads}; "
          f"study {r.seconds:.0f} s; report decide_by {report['decide_by']}")
    lab.assert_nothing_left()
