"""The measurement machinery of issue #12, piece by piece: repeats (mean and noise), the
max-load search, the early stop's decisions, what the store keeps and the engine-hours."""

from __future__ import annotations

import json
import math
import sqlite3
import threading
from pathlib import Path

import anyio
import pytest
from perflab.bench.drive import Observation
from perflab.lab.decide import LoadKind, Slo
from perflab.lab.earlystop import WINDOW_S, Calibration, EarlyStop
from perflab.lab.executor import MAX_PROBES, at_load, mean_metrics, relative_noise, search_loads, slo_margin
from perflab.lab.plan import load_plan_text
from perflab.lab.runner import profile_key
from perflab.lab.store import ProfileMeasurement, RunRecord, Store
from perflab.status import Status

# ---------------------------------------------------------------------- repeats


def test_repeats_mean_and_relative_noise() -> None:
    runs = [{"total_token_throughput": 90.0, "completed": 10, "backend": "openai-chat"},
            {"total_token_throughput": 110.0, "completed": 10, "backend": "openai-chat"}]
    mean = mean_metrics(runs)
    assert mean["total_token_throughput"] == 100.0 and mean["backend"] == "openai-chat"
    noise = relative_noise(runs)
    assert noise["total_token_throughput"] == pytest.approx(math.sqrt(200) / 100 * 100, rel=1e-3)  # 14.14 %
    assert noise["completed"] == 0.0 and "backend" not in noise
    assert relative_noise(runs[:1]) == {}  # one repeat: no noise figure


# ---------------------------------------------------------------------- max-load search


def _probe_with(capacity: float, log: list[float]):
    """p99 TPOT grows with the load; the 40 ms limit is met up to ``capacity``."""
    slo = Slo(tpot_ms=40.0)

    async def probe(load: float) -> float | None:
        log.append(load)
        return slo_margin(slo, {"p99_tpot_ms": 40.0 * load / capacity})

    return probe


@pytest.mark.parametrize("capacity", [1, 3, 30, 500])
def test_max_concurrency_search_finds_the_highest_passing_load(capacity: int) -> None:
    probes: list[float] = []
    found = anyio.run(search_loads, _probe_with(capacity + 0.5, probes), LoadKind.MAX_CONCURRENCY, 1.0, 1000)
    assert len(probes) <= MAX_PROBES
    # a straight-line margin: bracketing by 4, then one or two interpolations pin it
    assert found == capacity


def test_request_rate_search_brackets_then_interpolates() -> None:
    probes: list[float] = []
    found = anyio.run(search_loads, _probe_with(7.3, probes), LoadKind.REQUEST_RATE, 1.0, 1000)
    assert found is not None and 7.3 / 1.1 <= found <= 7.3
    assert probes[:3] == [1.0, 4.0, 16.0]  # ×4 until it fails
    assert len(probes) <= MAX_PROBES


def test_search_halves_from_a_failing_start_and_reports_none_when_nothing_passes() -> None:
    probes: list[float] = []
    assert anyio.run(search_loads, _probe_with(3.5, probes), LoadKind.MAX_CONCURRENCY, 64.0, 1000) == 3
    assert probes[:3] == [64.0, 16.0, 4.0]
    none: list[float] = []
    assert anyio.run(search_loads, _probe_with(0.5, none), LoadKind.MAX_CONCURRENCY, 4.0, 1000) is None
    assert none == [4.0, 1.0]  # down to one request in flight, then it gives up


def test_search_stops_when_the_engine_fails() -> None:
    probes: list[float] = []

    async def probe(load: float) -> float | None:
        probes.append(load)
        return -0.5 if load < 4 else None  # dies at 4

    assert anyio.run(search_loads, probe, LoadKind.MAX_CONCURRENCY, 1.0, 100) == 1
    assert probes == [1.0, 4.0]


def test_at_load_replaces_the_axis_and_drops_the_sweep() -> None:
    plan = load_plan_text(PLAN_SWEEP, path="p.yaml")
    prof = plan.profiles[1]
    assert prof.sweep is not None
    p = at_load(prof, LoadKind.MAX_CONCURRENCY, 4)
    assert p.max_concurrency == 4 and p.sweep is None and p.num_prompts == prof.num_prompts


# ---------------------------------------------------------------------- early stop


def _all_at_once(es: EarlyStop, rate: float, n: int = 1000, duration: float = 10.0, wobble: float = 0.03) -> None:
    """Feed ``es`` a run that sends every request at once: completions and events grow
    linearly, the events at ``rate`` per second (± wobble)."""
    t, events = 0.0, 0.0
    while t < duration and es.decided is None:
        t += 0.1
        events += rate * 0.1 * (1 + wobble * math.sin(t * 7))
        done = int(n * t / duration)
        es(Observation(t, n, done, 0, n - done, int(events), done * t / 2))


def _reference(rate: float = 1000.0) -> Calibration:
    cal = Calibration()
    full = EarlyStop(num_prompts=1000, cancel=threading.Event())
    _all_at_once(full, rate)
    assert full.decided is None  # nothing to beat: it runs to the end
    cal.add("k", full, whole=500.0)  # its whole-run total_token_throughput
    return cal


def test_a_configuration_that_clearly_lost_stops_early() -> None:
    cancel = threading.Event()
    es = EarlyStop(num_prompts=1000, cancel=cancel, to_beat=500.0, reference=_reference().get("k"))
    _all_at_once(es, 600.0)  # 40 % slower than the reference, which made 500 tok/s
    assert cancel.is_set() and es.decided is not None
    d = es.decided
    assert d["reason"] == "lost"
    assert d["estimated_token_throughput"] == pytest.approx(300.0, rel=0.05)
    assert d["upper_bound"] < d["limit"] < d["to_beat"]
    assert d["completed"] < 300 and d["elapsed_s"] < 3.5  # long before its end (10 s)
    assert d["estimated_full_s"] == pytest.approx(10.0, rel=0.2)


@pytest.mark.parametrize("rate", [850.0, 1000.0, 1200.0])
def test_a_close_or_better_configuration_runs_to_the_end(rate: float) -> None:
    cancel = threading.Event()
    es = EarlyStop(num_prompts=1000, cancel=cancel, to_beat=500.0, reference=_reference().get("k"))
    _all_at_once(es, rate)
    assert es.decided is None and not cancel.is_set()


def test_the_diagnostics_show_the_references_the_decision_was_made_against() -> None:
    """The study's calibration grows with the run itself once it completes: a run's
    earlystop-*.json must not list itself as a reference (its estimates would all read its
    own whole-run figure)."""
    cal = _reference()
    es = EarlyStop(num_prompts=1000, cancel=threading.Event(), to_beat=500.0, reference=cal.get("k"))
    _all_at_once(es, 1000.0)
    before = es.to_json()
    cal.add("k", es, whole=500.0)  # what the executor does after a complete run
    after = es.to_json()
    assert after["references"] == before["references"] == 1 and after["estimates"] == before["estimates"]
    w = after["windows"][-1]
    assert w["events"] > 0 and w["elapsed"] == pytest.approx(10.0, abs=0.2)  # cumulative figures per window


def test_lost_needs_a_reference_and_a_figure_to_beat() -> None:
    for kw in ({"to_beat": 500.0}, {"reference": _reference().get("k")}):
        es = EarlyStop(num_prompts=1000, cancel=threading.Event(), **kw)  # type: ignore[arg-type]
        _all_at_once(es, 100.0)
        assert es.decided is None


def test_over_saturation_stops_when_arrivals_outrun_the_engine() -> None:
    cancel = threading.Event()
    es = EarlyStop(num_prompts=1000, cancel=cancel)
    t, done, lat = 0.0, 0, 0.0
    while t < 20 and es.decided is None:  # 20 requests/s arrive, 10/s end, each waiting longer
        t += 0.1
        arrived = min(1000, int(20 * t))
        new = int(10 * t) - done
        lat += new * (0.5 + t)  # latency grows with the queue
        done += new
        es(Observation(t, arrived, done, 0, arrived - done, done * 5, lat, time_scale=40.0))
    assert cancel.is_set() and es.decided is not None and es.decided["reason"] == "over-saturated"
    q = es.decided["queue"]
    assert q == sorted(q) and q[-1] >= 2 * q[0]
    assert es.decided["window_s"] == pytest.approx(WINDOW_S * 40)


def test_windows_use_the_engine_clock_when_the_stream_carries_one() -> None:
    """Host load slows the client's clock, not the engine's: with stamps, a window's rate is
    events per engine second, whatever the wall clock did."""
    es = EarlyStop(num_prompts=1000, cancel=threading.Event())
    for i in range(1, 11):  # 0.3 s of wall clock per window, 2 engine seconds, 100 events
        es(Observation(0.3 * i, 1000, 10 * i, 0, 1000 - 10 * i, 100 * i, 0.0, time_scale=40.0, model_t=2.0 * i))
    assert [w.rate for w in es.windows[1:]] == [50.0] * 9  # not 100 / (0.3 × 40)


def test_sending_everything_at_once_is_never_over_saturation() -> None:
    es = EarlyStop(num_prompts=1000, cancel=threading.Event())
    _all_at_once(es, 1000.0)  # latency grows for later requests, but the queue only drains
    assert es.decided is None


# ---------------------------------------------------------------------- the store


PLAN_SWEEP = """
name: s
model: Qwen/Qwen3-8B
hardware: sim:a100-80g-x1
engines: [vllm]
profiles:
  main: {label: Main, input_len: 32, output_len: 8, num_prompts: 10}
  curve: {label: Curve, input_len: 32, output_len: 8, num_prompts: 10, sweep: {max_concurrency: [1, 4]}}
"""


def test_profile_keys_change_only_with_a_non_default_method() -> None:
    plan = load_plan_text(PLAN_SWEEP, path="p.yaml")
    assert profile_key(plan, plan.main) == plan.main.key()  # the seeds' studies keep their keys
    rep = load_plan_text(PLAN_SWEEP + "repeats: 3\n", path="p.yaml")
    assert profile_key(rep, rep.main) != plan.main.key()
    slo = load_plan_text(PLAN_SWEEP + "decide_by: max-load\nslo: {tpot_ms: 50}\nsearch: max_concurrency\n", path="p.yaml")
    assert profile_key(slo, slo.main) != profile_key(slo, slo.profiles[1]) != plan.profiles[1].key()


def test_store_keeps_repeats_points_and_stopped_early_and_counts_engine_hours(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.begin_session()
    point = {"load": {"max_concurrency": 4}, "metrics": {"total_token_throughput": 9.0}, "repeats": [], "noise": {},
             "slo_met": True}
    run_id, _ = store.begin_run("c1", "vllm", {"engine": "vllm"}, "1", "a", ["main"])
    store.add_measurement(run_id, "c1", "p", "main", ProfileMeasurement(
        Status.OK, metrics={"total_token_throughput": 10.0}, num_prompts=10,
        repeats=[{"total_token_throughput": 9.0}, {"total_token_throughput": 11.0}],
        noise={"total_token_throughput": 14.1}, points=[point], capacity=4))
    store.finish_run(run_id, RunRecord(Status.DONE, engine_seconds=1800.0, accelerators=2))
    run2, _ = store.begin_run("c2", "vllm", {"engine": "vllm"}, "1", "b", ["main"])
    stopped = {"reason": "lost", "elapsed_s": 100.0, "estimated_full_s": 1000.0}
    store.add_measurement(run2, "c2", "p", "main", ProfileMeasurement(
        Status.STOPPED_EARLY, metrics={"total_token_throughput": 3.0}, num_prompts=10, stopped_early=stopped))
    store.finish_run(run2, RunRecord(Status.DONE, engine_seconds=1800.0, accelerators=2))

    res = store.lookup("c1", "p")
    assert res is not None and res.status is Status.OK
    assert res.repeats[1] == {"total_token_throughput": 11.0} and res.noise == {"total_token_throughput": 14.1}
    assert res.points == [point] and res.capacity == 4 and res.stopped_early is None
    res2 = store.lookup("c2", "p")
    assert res2 is not None and res2.status is Status.STOPPED_EARLY and res2.stopped_early == stopped
    hours = store.engine_hours()
    # spent 3600 s = 1 h; the stopped one would have run 900 s more on 2 accelerators = 0.5 h
    assert hours == {"spent": 1.0, "full_method_estimate": 1.5, "saved_pct": pytest.approx(33.3)}
    m_file = json.loads(next((tmp_path / "runs").glob("002-*/measurement-main.json")).read_text())
    assert m_file["stopped_early"] == stopped  # the run directory is the source of truth
    store.close()

    from perflab.lab.store import rebuild

    (tmp_path / "study.db").unlink()
    rebuild(tmp_path)
    again = Store(tmp_path)
    assert again.engine_hours() == hours
    assert again.lookup("c1", "p").points == [point]  # type: ignore[union-attr]
    again.close()


def test_an_older_study_db_gains_the_new_columns(tmp_path: Path) -> None:
    db = sqlite3.connect(tmp_path / "study.db")
    db.executescript("""
        CREATE TABLE runs (id INTEGER PRIMARY KEY AUTOINCREMENT, session_id INTEGER NOT NULL, config_key TEXT NOT NULL,
            engine TEXT NOT NULL, config TEXT NOT NULL, step TEXT, label TEXT, profiles TEXT NOT NULL, state TEXT NOT NULL,
            dir TEXT NOT NULL, started REAL NOT NULL, finished REAL, version TEXT, script TEXT, reasons TEXT, cause TEXT,
            error TEXT, log TEXT);
        CREATE TABLE measurements (id INTEGER PRIMARY KEY AUTOINCREMENT, run_id INTEGER NOT NULL, config_key TEXT NOT NULL,
            profile_key TEXT NOT NULL, profile TEXT NOT NULL, status TEXT NOT NULL, metrics TEXT, num_prompts INTEGER,
            error TEXT, cause TEXT, created REAL NOT NULL);
    """)
    db.close()
    ro = Store(tmp_path, readonly=True)  # `perflab report` on an old study: no new column needed
    assert ro.engine_hours()["spent"] == 0.0
    ro.close()
    store = Store(tmp_path)
    cols = {r[1] for r in store.db.execute("PRAGMA table_info(runs)")}
    assert {"engine_seconds", "accelerators"} <= cols
    assert "extra" in {r[1] for r in store.db.execute("PRAGMA table_info(measurements)")}
    store.close()


# ---------------------------------------------------------------------- the CLI


@pytest.mark.parametrize(("argv", "plan_key", "expected"), [
    ([], "", True), (["--no-early-stop"], "", False), ([], "early_stop: false\n", False),
    (["--early-stop"], "early_stop: false\n", False),  # the plan's "off" is not overridden on
])
def test_no_early_stop_reaches_the_study(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                         argv: list[str], plan_key: str, expected: bool) -> None:
    import perflab.lab.runner as runner
    from perflab.cli import main as perflab_main
    from perflab.lab.runner import RunSummary

    seen = []

    async def fake_run_study(pm, plan, out, **kw):  # type: ignore[no-untyped-def]
        seen.append(plan.decision.early_stop)
        return RunSummary(None, out, {}, False, 0, 0, 0, {"spent": 0.5, "full_method_estimate": 1.0, "saved_pct": 50.0})

    monkeypatch.setattr(runner, "run_study", fake_run_study)
    plan = tmp_path / "p.yaml"
    plan.write_text(PLAN_SWEEP + plan_key)
    try:
        perflab_main(["run", str(plan), "--out", str(tmp_path / "s"), "--json", *argv])
    except SystemExit as exc:
        assert not exc.code
    assert seen == [expected]
    assert json.loads(capsys.readouterr().out)["engine_hours"]["saved_pct"] == 50.0
