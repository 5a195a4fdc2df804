"""The engine's own metrics during every measured benchmark (issue #13 item 1).

The plugins name their Prometheus endpoint and metric names (the optional
``perflab_metrics_endpoint`` hook); the ``server_metrics`` watcher parses them with
prometheus_client's parser — on a real vLLM 0.32.0's /metrics, on a running simulated engine
and through the executor into report.json — and the report explains a step with them.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import anyio
import pytest
import structlog.testing

from perflab.contract.types import METRIC_ROLES, LaunchSpec, MetricsEndpoint
from perflab.observe import END, START, Sample
from perflab.observe.metrics import MetricsWatcher, Target, metrics_url, metrics_watchers, parse, summarize

REAL = Path(__file__).resolve().parents[1] / "fixtures" / "real" / "vllm-0.32.0-cpu" / "metrics-idle.txt"
ENGINES = ("vllm", "vllm-ascend", "sglang", "trtllm", "mindie")


def _launch(engine: str = "x", argv: tuple[str, ...] = ("x",), extra_ports: tuple[int, ...] = ()) -> LaunchSpec:
    return LaunchSpec(engine=engine, argv=argv, host="127.0.0.1", port=8000, served_model_name="m", extra_ports=extra_ports)


# --------------------------------------------------------------------------- the hook


def test_every_plugin_names_its_engines_metrics_with_a_source() -> None:
    from perflab.plugins import load

    pm = load()
    got = {e: pm.engine(e).engine.metrics(_launch(e)) for e in ENGINES}
    assert got["vllm"] == got["vllm-ascend"]  # the same API server and loggers
    assert got["vllm"].path == "/metrics" and got["vllm"].port is None
    assert got["vllm"].names()["preemptions"] == "vllm:num_preemptions"
    assert got["trtllm"].path == "/prometheus/metrics" and "preemptions" not in got["trtllm"].names()
    sglang = got["sglang"]
    assert sglang.names()["prefix_cache_hit_rate"] == "sglang:cache_hit_rate"
    assert "--enable-metrics" in sglang.missing_hint  # its /metrics exists only with the flag
    # MindIE: on the launch's metrics port (its second extra port), the documented names
    mindie = pm.engine("mindie").engine.metrics(_launch("mindie", extra_ports=(8001, 8002)))
    assert (mindie.path, mindie.port, mindie.names()["kv_cache_usage"]) == ("/metrics", 8002, "npu_cache_usage_perc")
    for endpoint in (got["vllm"], got["trtllm"], sglang, mindie):
        assert endpoint.source and {"kv_cache_usage", "running", "waiting"} <= set(endpoint.names())
        assert set(endpoint.names()) <= set(METRIC_ROLES)
    from perflab.contract.errors import UnknownEngine

    with pytest.raises(UnknownEngine):
        pm.engine("no-such-engine")


def test_engines_list_shows_metrics_only_where_declared() -> None:
    from perflab import EngineInfo, EnginePlugin
    from perflab.cli.engines_cmd import _short_hooks
    from perflab.plugins import PluginManager, load

    class Toy(EnginePlugin):
        info = EngineInfo(name="toy-metrics", display_name="Toy", accelerators=("cpu",))

    class Scraped(Toy):
        metrics_endpoint = MetricsEndpoint(running="toy_running", source="test")

    assert "metrics" not in Toy().implemented() and "metrics" in Scraped().implemented()
    assert "metrics" in _short_hooks(list(load().engine("vllm").engine.implemented())).split(", ")


# --------------------------------------------------------------------------- parsing a real engine's /metrics


def test_parse_a_real_vllm_metrics_page() -> None:
    """vLLM 0.32.0 (CPU) at idle after one request: every name the plugin gives is there except
    the speculative-decoding counters (registered only with --speculative-config)."""
    import perflab_vllm

    endpoint = perflab_vllm.METRICS_ENDPOINT
    text = REAL.read_text()
    values = parse([text], endpoint)
    assert set(values) == set(endpoint.names()) - {"spec_decode_accepted", "spec_decode_draft"}
    assert values == {"running": 0.0, "waiting": 0.0, "kv_cache_usage": 0.0, "preemptions": 0.0,
                      "prefix_cache_queries": 3.0, "prefix_cache_hits": 0.0}
    # two replicas: counts and counters add up, the KV usage is the fullest one's
    busy = text.replace('vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.0',
                        'vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.25')
    assert busy != text
    two = parse([text, busy], endpoint)
    assert (two["prefix_cache_queries"], two["kv_cache_usage"]) == (6.0, 0.25)
    # the same page twice in a benchmark: nothing changed, no query -> no hit rate
    s = summarize([Sample(0.0, values), Sample(1.0, values)])
    assert s == {"source": "/metrics", "samples": 2, "kv_cache_usage": {"peak": 0.0, "mean": 0.0},
                 "running": {"peak": 0.0, "mean": 0.0}, "waiting": {"peak": 0.0, "mean": 0.0},
                 "preemptions": 0, "prefix_cache_hit_rate": None}


def test_summary_of_counters_and_gauges() -> None:
    samples = [
        Sample(0.0, {"kv_cache_usage": 0.1, "running": 0, "waiting": 0, "preemptions": 5, "prefix_cache_hits": 100,
                     "prefix_cache_queries": 1000, "spec_decode_accepted": 0, "spec_decode_draft": 0}),
        Sample(1.0, {"kv_cache_usage": 1.0, "running": 30, "waiting": 12, "preemptions": 40, "prefix_cache_hits": 700,
                     "prefix_cache_queries": 2000, "spec_decode_accepted": 60, "spec_decode_draft": 100}),
        Sample(2.0, {"kv_cache_usage": 0.7, "running": 20, "waiting": 0, "preemptions": 417, "prefix_cache_hits": 730,
                     "prefix_cache_queries": 2000, "spec_decode_accepted": 150, "spec_decode_draft": 200}),
    ]
    s = summarize(samples)
    assert s["kv_cache_usage"] == {"peak": 1.0, "mean": 0.6}
    assert s["running"] == {"peak": 30, "mean": 16.6667} and s["waiting"]["peak"] == 12
    assert s["preemptions"] == 412  # the change over the benchmark, not the engine's lifetime total
    assert s["prefix_cache_hit_rate"] == 0.63 and s["spec_decode_acceptance"] == 0.75
    # gauges instead of counters (SGLang, TensorRT-LLM, MindIE): their mean after the first sample
    # (which still holds the previous benchmark's batches); an acceptance gauge that never left 0
    # means no speculative decoding
    g = summarize([Sample(0, {"prefix_cache_hit_rate": 0.95, "spec_decode_acceptance": 0.0}),
                   Sample(1, {"prefix_cache_hit_rate": 0.5, "spec_decode_acceptance": 0.0}),
                   Sample(2, {"prefix_cache_hit_rate": 0.7, "spec_decode_acceptance": 0.0})], "/prometheus/metrics")
    assert g == {"source": "/prometheus/metrics", "samples": 3, "prefix_cache_hit_rate": 0.6, "spec_decode_acceptance": None}
    assert summarize([]) is None


def test_summary_of_the_timed_run_where_its_start_and_end_were_sampled() -> None:
    # the loading and the warm-up (samples 0-1), the timed run (2 marked start .. 4 marked end),
    # the metrics after it (5): counters change and gauges are averaged between the marks, the
    # start mark's gauge (still the warm-up's batches) left out; every sample is counted
    samples = [
        Sample(0.0, {"running": 0, "preemptions": 0, "prefix_cache_hit_rate": 0.9}),
        Sample(1.0, {"running": 1, "preemptions": 3, "prefix_cache_hit_rate": 0.0}),
        Sample(2.0, {"running": 1, "preemptions": 3, "prefix_cache_hit_rate": 0.0}, mark=START),
        Sample(3.0, {"running": 40, "preemptions": 10, "prefix_cache_hit_rate": 0.6}),
        Sample(4.0, {"running": 20, "preemptions": 12, "prefix_cache_hit_rate": 0.8}, mark=END),
        Sample(5.0, {"running": 0, "preemptions": 12, "prefix_cache_hit_rate": 0.8}),
    ]
    s = summarize(samples)
    assert s["samples"] == 6
    assert s["preemptions"] == 9 and s["prefix_cache_hit_rate"] == 0.7
    assert s["running"] == {"peak": 40, "mean": 20.3333}
    # without the marks: the whole watch, as before
    plain = summarize([Sample(x.t, x.values) for x in samples])
    assert plain["preemptions"] == 12 and plain["prefix_cache_hit_rate"] == 0.44


def test_metrics_url_on_the_replica_or_its_own_port() -> None:
    assert metrics_url("http://127.0.0.1:8000", MetricsEndpoint()) == "http://127.0.0.1:8000/metrics"
    assert metrics_url("http://127.0.0.1:8000/", MetricsEndpoint("/metrics", port=8002)) == "http://127.0.0.1:8002/metrics"


def test_a_failed_scrape_is_logged_once_and_never_raises() -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    watcher = MetricsWatcher(MetricsEndpoint(running="x"), [Target(f"http://127.0.0.1:{port}/metrics", {})], timeout_s=1)

    async def go() -> list[Any]:
        return [await watcher.sample() for _ in range(3)]

    with structlog.testing.capture_logs() as logs:
        assert anyio.run(go) == [None, None, None]
    assert watcher.failures == 3
    assert len([e for e in logs if e["event"] == "observe.metrics-scrape-failed"]) == 1
    assert watcher.summarize([]) is None


def test_scrapes_share_one_tls_context(monkeypatch: pytest.MonkeyPatch) -> None:
    """A scrape comes every engine second beside the benchmark's client: making a client's
    default TLS context each time loads the CA bundle (~18 ms of CPU holding the GIL)."""
    import socket
    import ssl

    from perflab.observe import metrics

    metrics._tls.cache_clear()
    made: list[int] = []
    real = ssl.create_default_context

    def counting(*a: Any, **kw: Any) -> ssl.SSLContext:
        made.append(1)
        return real(*a, **kw)

    monkeypatch.setattr(ssl, "create_default_context", counting)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    watcher = MetricsWatcher(MetricsEndpoint(running="x"), [Target(f"http://127.0.0.1:{port}/metrics", {})], timeout_s=1)

    async def go() -> None:
        for _ in range(4):
            await watcher.sample()

    anyio.run(go)
    assert len(made) == 1


# --------------------------------------------------------------------------- a running simulated engine


def test_watcher_and_executor_against_a_simulated_vllm(tmp_path: Path) -> None:
    """The watcher scrapes a running simulated vLLM (its /metrics under vLLM's names), and the
    executor's benchmark carries the summary in ``observed`` and the series in the run dir."""
    from test_cache_state import _ctx, simulated

    from perflab.lab.options import Configuration
    from perflab.lab.plan import Profile
    from perflab.lab.run.executor import Executor

    profile = Profile(name="shared", label="Shared", dataset="prefix-repetition", input_len=64, prefix_len=512,
                      num_prefixes=2, output_len=256, num_prompts=64, max_concurrency=16, seed=3)

    async def go() -> dict[str, Any]:
        async with simulated(tmp_path, "vllm") as s:
            watchers = metrics_watchers(s.pm, "vllm", [s.inst], s.env)
            idle = await watchers[0].sample()
            ex = Executor(_ctx(s, 0))
            m = await ex._benchmark([s.inst], Configuration("vllm", {"model": "Qwen/Qwen3-8B"}), profile, tmp_path, "run")
            return {"watchers": watchers, "idle": idle, "m": m}

    out = anyio.run(go)
    assert [w.key for w in out["watchers"]] == ["server_metrics"]
    assert out["idle"]["running"] == 0 and out["idle"]["kv_cache_usage"] == 0
    sm = out["m"].observed["server_metrics"]
    assert sm["source"] == "/metrics" and sm["samples"] >= 2
    assert 0 < sm["kv_cache_usage"]["peak"] <= 1 and sm["kv_cache_usage"]["mean"] <= sm["kv_cache_usage"]["peak"]
    assert 1 <= sm["running"]["peak"] <= profile.max_concurrency
    assert sm["preemptions"] >= 0
    assert sm["prefix_cache_hit_rate"] > 0.3  # 2 prefixes of 512 tokens shared by 64 prompts
    series = json.loads((tmp_path / "observe-shared.json").read_text())["server_metrics"]
    assert len(series) == sm["samples"] and {"running", "kv_cache_usage"} <= set(series[-1]["values"])
    assert [p["t"] for p in series] == sorted(p["t"] for p in series)
    # on the benchmark's own axis: 0 where its timed run began (issue #24), the warm-up before it
    marked = {p["mark"]: p["t"] for p in series if "mark" in p}
    assert marked["start"] == 0.0 and marked["end"] > 0 and series[0]["t"] <= 0  # the warm-up, when a sample fell in it


# --------------------------------------------------------------------------- the simulator does what it exports

SIM_SCALE = "50"


@asynccontextmanager
async def _engine(tmp_path: Path, engine: str, hardware: str = "sim:h100-80g-x1", scale: str = SIM_SCALE,
                  **serve: Any) -> AsyncIterator[Any]:
    """A simulated engine launched by its plugin (as the lab launches it), torn down after."""
    from perflab.contract.types import ServeConfig
    from perflab.hardware import resolve
    from perflab.plugins import load
    from perflab.supervisor import EngineInstance
    from perflab_sim.env import ENGINE_VERSIONS_ENV, STATE_ENV, TIME_SCALE_ENV

    state = tmp_path / f"sim-state-{engine}"
    state.mkdir(exist_ok=True)
    pm = load()
    env = {**os.environ, TIME_SCALE_ENV: scale, STATE_ENV: str(state), ENGINE_VERSIONS_ENV: "vllm=0.32.0"}
    hw, env = resolve(pm, hardware, env)
    config = ServeConfig(**{"model": "Qwen/Qwen3-8B", **serve})
    async with EngineInstance(pm, engine, config, hardware=hw, env=env, workdir=tmp_path / f"run-{engine}", grace=2.0,
                              startup_timeout=60) as inst:
        assert inst.outcome.state == "ready", inst.outcome.to_json()
        yield SimpleNamespace(inst=inst, pm=pm, hw=hw, env=env)
    assert inst.outcome.state == "done" and inst.outcome.leftovers == []


def _measure(tmp_path: Path, engine: str, profile: Any, hardware: str = "sim:h100-80g-x1", scale: str = SIM_SCALE,
             **serve: Any) -> dict[str, Any]:
    """One measured benchmark of ``profile`` on a simulated engine: its ``server_metrics``."""
    from perflab.lab.decide import Decision
    from perflab.lab.options import Configuration
    from perflab.lab.plan import Timeouts
    from perflab.lab.run.executor import Executor, LabContext

    async def go() -> dict[str, Any]:
        async with _engine(tmp_path, engine, hardware, scale, **serve) as s:
            plan = SimpleNamespace(timeouts=Timeouts(benchmark_s=120.0), decision=Decision(warmup=0), min_improvement_pct=0.0,
                                   cost=None)
            ex = Executor(LabContext(pm=s.pm, plan=plan, hardware=s.hw, env=s.env, time_scale=float(scale)))  # type: ignore[arg-type]
            m = await ex._benchmark([s.inst], Configuration(engine, {"model": "Qwen/Qwen3-8B"}), profile, tmp_path, "run")
            assert m.status == "ok", m.error
            return {"m": m, "watchers": metrics_watchers(s.pm, engine, [s.inst], s.env)}

    return anyio.run(go)


def test_a_full_kv_cache_preempts_and_says_so(tmp_path: Path) -> None:
    """vLLM with a KV cache a fraction of what 48 concurrent 1k-token sequences need: the KV
    usage reaches the top and the engine preempts, as its counters say."""
    from perflab.lab.plan import Profile

    profile = Profile(name="tight", label="Tight", input_len=512, output_len=512, num_prompts=48, max_concurrency=48, seed=3)
    sm = _measure(tmp_path, "vllm", profile, mem_fraction=0.23, max_model_len=2048)["m"].observed["server_metrics"]
    assert sm["kv_cache_usage"]["peak"] > 0.8 and sm["preemptions"] > 0
    assert sm["waiting"]["peak"] > 0  # preempted requests wait to be recomputed


@pytest.mark.slow
def test_speculative_decoding_acceptance_is_the_simulated_one(tmp_path: Path) -> None:
    """vLLM's spec-decode counters exist only with a speculative config; accepted / drafted is
    what the simulator draws: with k drafts each accepted with probability a given the previous
    ones, (a + a² + ... + a^k) / k."""
    from perflab.lab.plan import Profile
    from perflab_sim.perfmodel import default_acceptance

    profile = Profile(name="spec", label="Spec", input_len=256, output_len=256, num_prompts=32, max_concurrency=16, seed=3)
    got = _measure(tmp_path, "vllm", profile, speculative_config={"method": "eagle", "model": "x", "num_speculative_tokens": 3})
    a, k = default_acceptance("eagle"), 3
    assert got["m"].observed["server_metrics"]["spec_decode_acceptance"] == pytest.approx(
        sum(a**i for i in range(1, k + 1)) / k, abs=0.05)
    (tmp_path / "plain").mkdir()
    plain = _measure(tmp_path / "plain", "vllm", profile)
    assert "spec_decode_acceptance" not in plain["m"].observed["server_metrics"]  # no counters registered


@pytest.mark.slow
def test_sglang_and_mindie_gauges_under_their_own_names(tmp_path: Path) -> None:
    """SGLang (with --enable-metrics) exports a hit-rate gauge, MindIE its documented names on
    its metrics port: both summarized as the same server_metrics."""
    from perflab.lab.plan import Profile

    profile = Profile(name="shared", label="Shared", dataset="prefix-repetition", input_len=64, prefix_len=1024,
                      num_prefixes=2, output_len=256, num_prompts=48, max_concurrency=16, seed=3)
    # x20, not x50: a gauge's peak needs samples inside the timed run, taken at most every
    # observe.MIN_WALL_S of wall time; at x50 the run lasts a few of those, and a loaded host's
    # late scrape left none inside it (peak 0)
    sglang = _measure(tmp_path, "sglang", profile, scale="20", extra_args=("--enable-metrics",))
    sm = sglang["m"].observed["server_metrics"]
    assert sm["prefix_cache_hit_rate"] > 0.5 and sm["preemptions"] == 0 and sm["spec_decode_acceptance"] is None
    assert 0 < sm["kv_cache_usage"]["peak"] <= 1 and 1 <= sm["running"]["peak"] <= 16
    (tmp_path / "mindie").mkdir()
    mindie = _measure(tmp_path / "mindie", "mindie", profile, "sim:910b3-x1", "20", prefix_caching=True)
    target = mindie["watchers"][0].targets[0].url
    assert target.endswith("/metrics") and ":" + str(mindie["watchers"][0].endpoint.port) in target
    sm = mindie["m"].observed["server_metrics"]
    assert 0 < sm["kv_cache_usage"]["peak"] <= 1 and 1 <= sm["running"]["peak"] <= 16 and sm["preemptions"] == 0
    # MindIE's gauge is cumulative since start, so it climbs through the run as prefixes repeat;
    # its mean over the timed run (from the start mark to the end mark) read 0.27-0.43 here
    # (the readings after the run, where it is highest, are left out): well above 0 where
    # prompts share prefixes
    assert sm["prefix_cache_hit_rate"] > 0.2


# --------------------------------------------------------------------------- the report's words


def test_a_step_is_explained_by_the_metrics_that_moved() -> None:
    from perflab.observe.explain import changes, explain_step

    before = {"preemptions": 412, "prefix_cache_hit_rate": 0.0, "kv_cache_usage": {"peak": 1.0, "mean": 0.9},
              "waiting": {"peak": 80, "mean": 37.2}, "running": {"peak": 64, "mean": 60}}
    after = {"preemptions": 0, "prefix_cache_hit_rate": 0.63, "kv_cache_usage": {"peak": 0.71, "mean": 0.5},
             "waiting": {"peak": 80, "mean": 36.0}, "running": {"peak": 64, "mean": 62}}
    assert changes(before, after) == ["preemptions 412 → 0", "prefix hit rate 0 % → 63 %", "KV-cache peak 100 % → 71 %"]
    assert changes(before, before) == [] and changes(None, after) == []
    # small moves are not explanations: 3 preemptions more, 4 points of hit rate
    assert changes({"preemptions": 0, "prefix_cache_hit_rate": 0.5}, {"preemptions": 3, "prefix_cache_hit_rate": 0.54}) == []

    def entry(label: str, sm: dict[str, Any] | None) -> Any:
        return SimpleNamespace(label=label, result=SimpleNamespace(observed={"server_metrics": sm} if sm else {}))

    base, chosen = entry("vLLM", before), entry("max_num_seqs 128", after)
    assert explain_step(SimpleNamespace(base=base, chosen=chosen)) == (
        "Engine metrics, max_num_seqs 128 vs vLLM: preemptions 412 → 0; prefix hit rate 0 % → 63 %; KV-cache peak 100 % → 71 %.")
    assert explain_step(SimpleNamespace(base=None, chosen=chosen)) == ""
    assert explain_step(SimpleNamespace(base=base, chosen=base)) == ""
    assert explain_step(SimpleNamespace(base=entry("old", None), chosen=chosen)) == ""


# --------------------------------------------------------------------------- a whole simulated study

STUDY = """
name: engine-metrics
model: Qwen/Qwen3-8B
hardware: sim:h100-80g-x1
simulation: {time_scale: 40}
engines: [vllm]
candidates:
  - name: Prefix caching
    variants:
      - {name: "off", set: {prefix_caching: false}}
profiles:
  shared: {label: Shared prefixes, dataset: prefix-repetition, input_len: 64, prefix_len: 1024, num_prefixes: 4,
           output_len: 128, num_prompts: 96, max_concurrency: 32}
  random: {label: Random, input_len: 1024, output_len: 128, num_prompts: 96, max_concurrency: 32}
timeouts: {startup_s: 60, benchmark_s: 300}
"""


@pytest.mark.slow
def test_report_json_carries_server_metrics_and_report_md_explains_the_step(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from simstudy import run_sim_study

    monkeypatch.setenv("PERFLAB_SIM_STATE_DIR", str(tmp_path / "sim-state"))
    summary = run_sim_study(STUDY, tmp_path / "study")
    assert summary.exit_code == 0
    report = json.loads((tmp_path / "study" / "report.json").read_text())
    results = [e["result"] for step in report["steps"] for e in step["entries"]]
    results += [c[k] for c in report["cases"] for k in ("baseline", "optimized") if c.get(k)]
    for r in results:
        sm = r["server_metrics"]
        assert sm["source"] == "/metrics" and sm["samples"] >= 2
        assert 0 < sm["kv_cache_usage"]["peak"] <= 1
        assert sm["preemptions"] >= 0 and 1 <= sm["running"]["peak"] <= 32
    by_profile = {c["profile"]: c["baseline"]["server_metrics"] for c in report["cases"]}
    assert by_profile["shared"]["prefix_cache_hit_rate"] > 0.5  # 4 prefixes of 1024 tokens, 96 prompts
    assert by_profile["random"]["prefix_cache_hit_rate"] < 0.05  # only the warm-up's repeated prompt
    off = report["steps"][1]["entries"][0]["result"]["server_metrics"]
    assert off["prefix_cache_hit_rate"] == 0.0  # --no-enable-prefix-caching: no hit at all
    md = (tmp_path / "study" / "report.md").read_text()
    assert "Engine metrics, vLLM off vs vLLM: prefix hit rate" in md and "→ 0 %" in md
    # the time series, per run and profile
    assert list((tmp_path / "study").rglob("observe-shared*.json"))


def test_a_404_is_logged_once_with_the_plugins_hint(tmp_path: Path) -> None:
    """An engine that serves its metrics only under a flag (SGLang: --enable-metrics) answers
    404: the study log says what to do, once; the measurement has no server_metrics."""

    async def go() -> list[Any]:
        async with _engine(tmp_path, "vllm") as s:
            endpoint = MetricsEndpoint("/no-such-metrics", running="vllm:num_requests_running", source="test",
                                       missing_hint="serve it with --enable-metrics")
            watcher = MetricsWatcher(endpoint, [Target(metrics_url(s.inst.base_url, endpoint), {})])
            return [await watcher.sample() for _ in range(3)]

    with structlog.testing.capture_logs() as logs:
        assert anyio.run(go) == [None, None, None]
    (note,) = [e for e in logs if e["event"] == "observe.metrics-scrape-failed"]
    assert note["hint"] == "serve it with --enable-metrics" and "404" in note["error"]


def test_one_watcher_for_all_replicas_with_the_benchs_auth_header() -> None:
    """Replicas of a launch: one watcher, a target per replica (MindIE's on its metrics port),
    each sending the Authorization header the bench sends to that engine."""
    from perflab.plugins import load

    pm = load()
    replicas = [SimpleNamespace(launch=_launch("vllm", ("vllm", "serve", "m", "--api-key", "sk-test")),
                                base_url=f"http://127.0.0.1:{port}") for port in (8000, 8010)]
    (watcher,) = metrics_watchers(pm, "vllm", replicas, {})
    assert [t.url for t in watcher.targets] == ["http://127.0.0.1:8000/metrics", "http://127.0.0.1:8010/metrics"]
    assert all(t.headers == {"Authorization": "Bearer sk-test"} for t in watcher.targets)
    mindie = [SimpleNamespace(launch=_launch("mindie", extra_ports=(8001, 8002)), base_url="http://127.0.0.1:8000")]
    assert [t.url for t in metrics_watchers(pm, "mindie", mindie)[0].targets] == ["http://127.0.0.1:8002/metrics"]
    assert metrics_watchers(pm, "no-such-engine", replicas) == []
