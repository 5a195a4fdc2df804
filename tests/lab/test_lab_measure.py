"""The measurement machinery of issue #12, piece by piece: repeats (mean and noise), the
max-load search, the early stop's decisions, what the store keeps and the engine-hours."""

from __future__ import annotations

import dataclasses
import json
import math
import sqlite3
import threading
from pathlib import Path

import anyio
import pytest

from perflab.bench.drive import Observation
from perflab.contract.status import Status
from perflab.lab.decide import LoadKind, Slo
from perflab.lab.plan import load_plan_text
from perflab.lab.report.stored import profile_key
from perflab.lab.run.earlystop import FRAMING_EVENTS, MIN_ANSWERED, WINDOW_ENGINE_S, EarlyStop, tokens_per_event
from perflab.lab.run.executor import MAX_PROBES, at_load, mean_metrics, relative_noise, search_loads, slo_margin
from perflab.lab.store import ProfileMeasurement, RunRecord, Store

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


def _all_at_once(es: EarlyStop, rate: float, n: int = 1000, prompt: int = 200, output: int = 200,
                 tail_s: float = 0.0, wobble: float = 0.05, caps: bool = False) -> float:
    """Feed ``es`` a run that sends every request at once and processes ``rate`` tokens per
    engine second (± wobble), prompts a little ahead of outputs, then a decode-only tail of
    ``tail_s`` seconds that streams the last 2 % of the outputs; returns the run's whole-run
    total token throughput (what a complete run would report). ``caps``: the requests say
    their ``max_tokens`` (``output`` each, as the bench's datasets do)."""
    total_p, total_o = n * prompt, n * output
    body_o = total_o * (0.98 if tail_s else 1.0)
    body_s = (total_p + body_o) / rate
    duration = body_s + tail_s
    t = 0.0
    while t < duration - 1e-9 and es.decided is None:
        t = min(duration, t + 0.1)
        if t <= body_s:
            frac = t / body_s
            wob = 1 + wobble * math.sin(t * 7)
            p_done = min(total_p, total_p * frac * 1.25 * wob)
            o_done = max(0.0, min(body_o, rate * t - p_done))
        else:
            p_done, o_done = total_p, body_o + (total_o - body_o) * (t - body_s) / tail_s
        answered = min(n, math.ceil(n * p_done / total_p))
        done = min(n, int(n * o_done / total_o))
        per = o_done / max(1, answered)
        es(Observation(t, n, done, 0, n - done, int(o_done), done * t / 2, prompt_tokens=int(p_done),
                       prompt_tokens_total=total_p, answered=answered, answered_events=o_done,
                       answered_events_sq=answered * per * per * 1.2,
                       output_cap_open=(n - done) * output if caps else None,
                       events_open=int(o_done) - done * output))
    return (total_p + total_o) / duration


def test_a_configuration_that_clearly_lost_stops_early() -> None:
    cancel = threading.Event()
    es = EarlyStop(num_prompts=1000, cancel=cancel, to_beat=1000.0)
    whole = _all_at_once(es, 700.0)  # its steady state is 30 % below what the best's whole run made
    assert whole == pytest.approx(700.0)
    assert cancel.is_set() and es.decided is not None
    d = es.decided
    assert d["reason"] == "lost"
    assert d["steady_token_rate"] == pytest.approx(700.0, rel=0.05)
    assert d["bound_token_throughput"] < d["limit"] == d["to_beat"] == 1000.0
    assert d["steady_token_rate_upper"] <= d["bound_token_throughput"]
    full_s = 400_000 / 700.0
    assert d["elapsed_s"] < 0.35 * full_s  # long before its end
    assert 0.8 * full_s < d["estimated_full_s"] < 1.5 * full_s  # extrapolated by the requests ended


@pytest.mark.parametrize("to_beat", [900.0, 990.0])
def test_a_close_or_better_configuration_runs_to_the_end(to_beat: float) -> None:
    cancel = threading.Event()
    es = EarlyStop(num_prompts=1000, cancel=cancel, to_beat=to_beat)
    _all_at_once(es, 1000.0)
    assert es.decided is None and not cancel.is_set()


def test_a_slow_finish_is_never_held_against_a_run_that_could_still_win() -> None:
    """The study ranks by the whole run, tail included. A run whose steady state is above the
    figure to beat could still end above it (its tail may be shorter than this one's), so it
    is never stopped as lost — even if its own tail then makes it end below."""
    es = EarlyStop(num_prompts=1000, cancel=threading.Event(), to_beat=1000.0)
    whole = _all_at_once(es, 1100.0, tail_s=120.0)
    assert whole < 1000.0 and es.decided is None
    assert es.windows[-1].bound is not None and es.windows[-1].bound >= 1000.0


def test_once_its_tail_has_lost_it_a_run_is_stopped_there() -> None:
    """With every request's ``max_tokens`` known, what may still come is bounded from above
    too: in the tail, the run's own figure so far pulls its best case down to where it will
    end, and it is stopped once that is below the figure to beat — not before."""
    cancel = threading.Event()
    es = EarlyStop(num_prompts=1000, cancel=cancel, to_beat=1000.0)
    body_s = 400_000 * (1 - 0.01) / 1100.0
    whole = _all_at_once(es, 1100.0, tail_s=120.0, caps=True)
    assert whole > 0 and cancel.is_set() and es.decided is not None and es.decided["reason"] == "lost"
    assert body_s < es.decided["elapsed_s"] < body_s + 120.0  # in the tail, before its end
    assert es.decided["bound_token_throughput"] < 1000.0
    assert all(w.bound is None or w.bound >= 1000.0 for w in es.windows[:-1])
    # what the whole run would have taken: what is left at the tail's own pace, not by requests ended
    assert es.decided["estimated_full_s"] == pytest.approx(body_s + 120.0, rel=0.1)
    # the same run against a figure its whole run beats: never stopped
    es = EarlyStop(num_prompts=1000, cancel=threading.Event(), to_beat=0.98 * _all_at_once(
        EarlyStop(num_prompts=1000, cancel=threading.Event()), 1100.0, tail_s=120.0, caps=True))
    _all_at_once(es, 1100.0, tail_s=120.0, caps=True)
    assert es.decided is None


def test_the_outputs_still_to_come_are_bounded_from_above_by_max_tokens() -> None:
    es = EarlyStop(num_prompts=10, cancel=threading.Event())
    obs = Observation(1.0, 10, 4, 0, 6, 500, 0.0, output_cap_open=6 * 100, events_open=150)
    assert es.outputs_at_most(obs) == 6 * 100 + 6 * FRAMING_EVENTS - 150  # the framing counted as events
    assert es.outputs_at_most(dataclasses.replace(obs, output_cap_open=None)) is None  # an uncapped request


def test_framing_covers_what_real_engines_stream_around_the_tokens() -> None:
    """Early stop's bound counts streamed events: every answer the real engines streamed
    (captured in tests/fixtures/real) carries at most FRAMING_EVENTS events besides its tokens."""
    import json as _json

    streams = sorted((Path(__file__).parent.parent / "fixtures" / "real").glob("*/*_stream.txt"))
    assert len(streams) >= 4
    for path in streams:
        events = [line for line in path.read_text().splitlines() if line.startswith("data:")]
        usage = [_json.loads(e[5:])["usage"] for e in events if '"usage"' in e and e[5:].strip() != "[DONE]"]
        tokens = [u["completion_tokens"] for u in usage if u]
        assert tokens, path
        assert 0 <= len(events) - tokens[-1] <= FRAMING_EVENTS, (path.parent.name, path.name, len(events), tokens[-1])


def test_the_margin_is_the_plans_minimum_improvement() -> None:
    """A run that cannot beat the best by ``min_improvement_pct`` cannot be adopted either."""
    es = EarlyStop(num_prompts=1000, cancel=threading.Event(), to_beat=1000.0, margin_pct=20.0)
    _all_at_once(es, 1050.0)  # above the best, not 20 % above
    assert es.decided is not None and es.decided["limit"] == 1200.0


def test_lost_needs_a_figure_to_beat_and_a_known_token_count_per_event() -> None:
    for kw in ({}, {"to_beat": 1000.0, "tokens_per_event": None}):
        es = EarlyStop(num_prompts=1000, cancel=threading.Event(), **kw)  # type: ignore[arg-type]
        _all_at_once(es, 300.0)
        assert es.decided is None


def test_tokens_per_event_follows_speculative_decoding() -> None:
    from perflab.contract.types import ServeConfig

    assert tokens_per_event(ServeConfig(model="m")) == 1.0
    assert tokens_per_event(ServeConfig(model="m", speculative_config={"method": "mtp", "num_speculative_tokens": 4})) == 5.0
    assert tokens_per_event(ServeConfig(model="m", speculative_config={"method": "ngram"})) is None


def test_the_outputs_still_to_come_are_bounded_from_below() -> None:
    """Requests not yet answering will stream at least about what those answering did, less
    the framing events and a 99.9 % margin; nothing before enough answers."""
    es = EarlyStop(num_prompts=1000, cancel=threading.Event())
    few = Observation(1.0, 1000, 0, 0, 1000, 100, 0.0, answered=MIN_ANSWERED - 1, answered_events=5000.0,
                      answered_events_sq=1e6)
    assert es.outputs_to_come(few) == 0.0
    k, mean, sd = 400, 103.0, 20.0
    obs = Observation(1.0, 1000, 100, 0, 900, int(k * mean), 0.0, answered=k, answered_events=k * mean,
                      answered_events_sq=k * (sd * sd * (k - 1) / k + mean * mean))
    low = es.outputs_to_come(obs)
    assert low == pytest.approx(600 * (mean - FRAMING_EVENTS - 3.0 * sd / math.sqrt(k)), rel=1e-6)
    assert 0 < low < 600 * 100


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
    assert es.decided["window_s"] == pytest.approx(WINDOW_ENGINE_S)


def test_windows_use_the_engine_clock_when_the_stream_carries_one() -> None:
    """Host load slows the client's clock, not the engine's: with stamps, a window's rate is
    events per engine second, whatever the wall clock did."""
    es = EarlyStop(num_prompts=1000, cancel=threading.Event())
    for i in range(1, 12):  # 0.3 s of wall clock per observation, 2 engine seconds, 100 events
        es(Observation(0.3 * i, 1000, 10 * i, 0, 1000 - 10 * i, 100 * i, 0.0, time_scale=40.0, model_t=2.0 * i))
    # the first stamp opens the engine clock; then a window closes every 4 engine seconds
    assert [w.rate for w in es.windows[1:]] == [50.0] * 5  # not 200 / (0.6 × 40)
    assert [round(b.elapsed - a.elapsed, 6) for a, b in zip(es.windows[1:], es.windows[2:])] == [WINDOW_ENGINE_S] * 4


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
    import perflab.lab.run.runner as runner
    from perflab.cli import main as perflab_main
    from perflab.lab.run.runner import RunSummary

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


def test_a_stop_reads_as_one_line_with_its_figures() -> None:
    from perflab.lab.study import stopped_early_text

    cancel = threading.Event()
    es = EarlyStop(num_prompts=1000, cancel=cancel, to_beat=1000.0)
    _all_at_once(es, 700.0)
    assert es.decided is not None
    text = stopped_early_text(es.decided)
    assert text.startswith(f"lost after {es.decided['completed']} of 1000 requests completed")
    assert ": at its measured rate it could reach at most " in text and "below the 1000 it needed to be adopted" in text
    sat = stopped_early_text({"reason": "over-saturated", "queue": [10, 40], "latency_ms": [100.0, 480.0],
                              "completed": 50, "num_prompts": 1000, "elapsed_s": 12.0, "estimated_full_s": 240.0})
    assert sat == ("over-saturated after 50 of 1000 requests completed (12 of ~240 s): the queue grew from 10 to 40 "
                   "requests and latency from 100 to 480 ms")
