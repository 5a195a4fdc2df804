"""``perflab compare``'s logic (perflab.lab.report.compare): deltas and their direction, the noise
rule, pairing by configuration and profile key, status changes, decisions, one-sided entries."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from perflab.contract.errors import UsageError
from perflab.contract.status import Status
from perflab.lab.plan import load_plan_text
from perflab.lab.report.compare import METRICS, Change, StudyView, compare, metric_delta, same_plan
from perflab.lab.study import ConfigResult, conduct

PLAN = """
name: cmp
model: Qwen/Qwen3-8B
engines: [vllm, sglang]
candidates:
  - name: Max Num Seqs
    variants:
      - {name: "64", set: {max_num_seqs: 64}}
profiles:
  main: {input_len: 64, output_len: 64, num_prompts: 16}
  other: {input_len: 1024, output_len: 8, num_prompts: 8}
"""

BY_NAME = {m.key: m for m in METRICS}
DISPLAY = {"vllm": "vLLM", "sglang": "SGLang"}


def _metrics(tps: float, tpot: float, ttft: float = 80.0) -> dict[str, float]:
    return {"total_token_throughput": tps, "output_throughput": tps / 2, "request_throughput": tps / 128,
            "mean_ttft_ms": ttft, "p99_ttft_ms": ttft, "mean_tpot_ms": tpot, "p99_tpot_ms": tpot,
            "mean_itl_ms": tpot, "p99_itl_ms": tpot, "mean_e2el_ms": ttft + 63 * tpot, "p99_e2el_ms": ttft + 63 * tpot,
            "completed": 16}


def _ok(metrics: dict[str, float], noise: dict[str, float] | None = None) -> ConfigResult:
    return ConfigResult(status=Status.OK, metrics=metrics, num_prompts=16, noise=noise or {})


def _study(table: dict[str, ConfigResult | dict[str, float]], plan_text: str = PLAN, name: str = "a") -> StudyView:
    """A study whose engines measure what ``table`` says ("vllm", "vllm 64", ...; every
    profile alike), decided by the real method (perflab.lab.study.conduct)."""
    plan = load_plan_text(plan_text)

    async def measure(config, profiles, **_):
        key = config.engine + (f" {config.options['max_num_seqs']}" if "max_num_seqs" in config.options else "")
        value = table[key]
        return {p.name: value if isinstance(value, ConfigResult) else _ok(value) for p in profiles}

    outcome = anyio.run(lambda: conduct(plan, measure, display=DISPLAY.__getitem__))
    return StudyView.of(Path(name), plan, outcome, display=DISPLAY.__getitem__)


def test_direction_decides_which_way_is_a_regression():
    tps, ttft = BY_NAME["total_token_throughput"], BY_NAME["mean_ttft_ms"]
    a, b = _ok({"total_token_throughput": 100.0, "mean_ttft_ms": 100.0}), _ok(
        {"total_token_throughput": 92.0, "mean_ttft_ms": 92.0})
    down = metric_delta(tps, a, b, 5.0)
    assert down.change is Change.REGRESSED and down.change_pct == pytest.approx(-8.0)
    faster = metric_delta(ttft, a, b, 5.0)
    assert faster.change is Change.IMPROVED and faster.change_pct == pytest.approx(-8.0)
    # the other way round: lower throughput is better never, higher latency is worse
    assert metric_delta(tps, b, a, 5.0).change is Change.IMPROVED
    assert metric_delta(ttft, b, a, 5.0).change is Change.REGRESSED


def test_threshold_without_repeats():
    tpot = BY_NAME["mean_tpot_ms"]
    a, b = _ok({"mean_tpot_ms": 10.0}), _ok({"mean_tpot_ms": 10.3})
    d = metric_delta(tpot, a, b, 5.0)
    assert d.change is Change.WITHIN_NOISE and d.noise_pct is None and d.limit_pct == 5.0
    assert metric_delta(tpot, a, b, 2.0).change is Change.REGRESSED
    assert metric_delta(tpot, a, b, 3.0).change is Change.REGRESSED  # +3.0000...4 %
    assert metric_delta(tpot, a, b, 3.1).change is Change.WITHIN_NOISE


def test_measured_noise_raises_the_limit():
    """With repeats, a change must also exceed both spreads in quadrature (the study's rule)."""
    tps = BY_NAME["total_token_throughput"]
    a = _ok({"total_token_throughput": 100.0}, noise={"total_token_throughput": 6.0})
    b = _ok({"total_token_throughput": 92.0}, noise={"total_token_throughput": 6.0})
    d = metric_delta(tps, a, b, 5.0)
    assert d.noise_pct == pytest.approx(8.485, abs=1e-3)
    assert d.limit_pct == pytest.approx(d.noise_pct)
    assert d.change is Change.WITHIN_NOISE  # -8 % is inside ±8.5 %
    quiet = _ok({"total_token_throughput": 92.0}, noise={"total_token_throughput": 1.0})
    assert metric_delta(tps, _ok({"total_token_throughput": 100.0}, noise={"total_token_throughput": 1.0}),
                        quiet, 5.0).change is Change.REGRESSED  # noise 1.4 %: the threshold decides
    assert metric_delta(tps, a, quiet, 0.0).limit_pct == pytest.approx(6.083, abs=1e-3)  # one side's noise


def test_missing_or_zero_values():
    tps = BY_NAME["total_token_throughput"]
    assert metric_delta(tps, _ok({}), _ok({"total_token_throughput": 1.0}), 5.0) is None
    assert metric_delta(BY_NAME["capacity"], _ok({}), _ok({}), 5.0) is None
    zero = metric_delta(tps, _ok({"total_token_throughput": 0.0}), _ok({"total_token_throughput": 5.0}), 5.0)
    assert zero.change_pct is None and zero.change is Change.WITHIN_NOISE
    crashed = ConfigResult(status=Status.CRASHED)
    assert metric_delta(tps, crashed, _ok({"total_token_throughput": 1.0}), 5.0) is None
    with_capacity = ConfigResult(status=Status.OK, metrics={"completed": 1}, capacity=32.0)
    assert BY_NAME["capacity"].value(with_capacity) == 32.0


def test_metrics_are_the_bench_names():
    """Every headline metric is a key the benchmark writes (or the search's capacity)."""
    from perflab.bench.metrics import compute_metrics
    from perflab.bench.trace import RequestTrace

    traces = [RequestTrace(success=True, start=0.0, chunk_times=[0.1, 0.2, 0.3], output_tokens=3, prompt_len=4)]
    written = compute_metrics(traces, 1.0, goodput={"ttft": 500.0})
    from perflab.observe import OBSERVED_KEYS

    assert {m.key for m in METRICS if "." not in m.key} - set(written) == {"capacity"}
    assert {m.key.split(".")[0] for m in METRICS if "." in m.key} <= set(OBSERVED_KEYS)


def test_observed_summaries_compare_too():
    """Energy per token (higher is better) and cost per token (lower) from ``observed``."""
    per_joule, cost = BY_NAME["energy.output_tokens_per_joule"], BY_NAME["cost.per_million_output_tokens"]

    def res(tpj: float, usd: float) -> ConfigResult:
        r = _ok({"completed": 1})
        r.observed = {"energy": {"joules": 100.0, "output_tokens_per_joule": tpj},
                      "cost": {"per_million_output_tokens": usd, "currency": "USD", "per_accelerator_hour": 2.5}}
        return r

    assert metric_delta(per_joule, res(2.0, 1.0), res(1.8, 1.1), 5.0).change is Change.REGRESSED
    assert metric_delta(cost, res(2.0, 1.0), res(1.8, 1.1), 5.0).change is Change.REGRESSED
    assert metric_delta(cost, res(2.0, 1.1), res(1.8, 1.0), 5.0).change is Change.IMPROVED
    assert metric_delta(per_joule, _ok({"completed": 1}), res(1.8, 1.1), 5.0) is None  # no telemetry in A


def test_an_energy_figures_stated_uncertainty_widens_what_a_change_must_exceed():
    """Energy states how far off its idle estimate may put it (perflab.observe.energy.idle_error):
    a 5.5 % drop is a regression at a 5 % threshold unless the two sides' uncertainties, in
    quadrature, exceed it."""
    per_joule = BY_NAME["energy.output_tokens_per_joule"]

    def res(tpj: float, uncertainty: float | None) -> ConfigResult:
        r = _ok({"completed": 1})
        r.observed = {"energy": {"joules": 100.0, "output_tokens_per_joule": tpj,
                                 **({"uncertainty_pct": uncertainty} if uncertainty is not None else {})}}
        return r

    assert metric_delta(per_joule, res(2.0, None), res(1.89, None), 5.0).change is Change.REGRESSED
    d = metric_delta(per_joule, res(2.0, 4.0), res(1.89, 4.0), 5.0)
    assert d.change is Change.WITHIN_NOISE and d.noise_pct == pytest.approx(5.657, abs=0.01)
    assert metric_delta(per_joule, res(2.0, 1.0), res(1.89, 1.0), 5.0).change is Change.REGRESSED
    assert metric_delta(per_joule, res(2.0, 4.0), res(1.6, 4.0), 5.0).change is Change.REGRESSED  # 20 %: beyond it
    tps = BY_NAME["total_token_throughput"]  # a benchmark figure: energy's uncertainty is not its own
    assert tps.noise(res(2.0, 4.0)) is None


def test_pairs_by_configuration_and_profile_and_flags_only_the_regressed_one():
    a = _study({"vllm": _metrics(2500.0, 11.6), "sglang": _metrics(2400.0, 12.0), "vllm 64": _metrics(2500.0, 11.6)})
    b = _study({"vllm": _metrics(2290.0, 12.9), "sglang": _metrics(2400.0, 12.0), "sglang 64": _metrics(2400.0, 12.0)},
               name="b")
    c = compare(a, b, 5.0)
    assert c.same_plan and not c.warnings
    pairs = {(p.a.label, p.a.profile): p for p in c.pairs}
    # vLLM on main (its engine-step entry), SGLang on main, the baseline (vLLM) on the other profile
    assert set(pairs) == {("vLLM", "main"), ("SGLang", "main"), ("Baseline", "other")}
    vllm = pairs[("vLLM", "main")]
    assert vllm.regressed
    regressed = {d.metric.key for d in vllm.regressions}
    assert {"total_token_throughput", "output_throughput", "mean_tpot_ms", "mean_itl_ms", "mean_e2el_ms"} <= regressed
    assert "mean_ttft_ms" not in regressed and "p99_ttft_ms" not in regressed
    assert not pairs[("SGLang", "main")].regressed
    assert pairs[("Baseline", "other")].regressed  # vLLM is the baseline: same configuration, same change
    assert c.exit_code == 1 and len(c.regressions) == 2
    # decisions: vLLM won in A, SGLang in B
    decisions = {d.what: d for d in c.decisions}
    assert decisions["winner engine"].a == "vLLM" and decisions["winner engine"].b == "SGLang"
    assert decisions["winner engine"].changed and decisions["optimized configuration"].changed
    assert decisions["step: Choosing the Inference Engine"].changed
    assert decisions["step: Max Num Seqs"].a == "vLLM 64 (not adopted)"
    # what only one study measured: each winner's max_num_seqs variant, and B's optimized run (A's
    # optimized configuration is its baseline, measured once)
    assert {(m.label, m.profile) for m in c.only_a} == {("vLLM 64", "main")}
    assert {(m.label, m.profile) for m in c.only_b} == {("SGLang 64", "main"), ("Optimized", "other")}
    data = c.to_json()
    assert data["regressed"] is True and data["decisions_changed"] == 4
    assert [p["regressions"] for p in data["pairs"] if p["label"] == "vLLM"][0][:2] == [
        "total_token_throughput", "output_throughput"]


def test_identical_studies_compare_clean():
    table = {"vllm": _metrics(2500.0, 11.6), "sglang": _metrics(2400.0, 12.0), "vllm 64": _metrics(2500.0, 11.6)}
    c = compare(_study(table), _study(table, name="b"))
    assert c.exit_code == 0 and not c.only_a and not c.only_b
    assert not any(d.changed for d in c.decisions)
    assert all(d.change is Change.WITHIN_NOISE for p in c.pairs for d in p.deltas)


def test_a_measurement_that_fails_in_b_is_a_regression():
    a = _study({"vllm": _metrics(2500.0, 11.6), "sglang": _metrics(2400.0, 12.0), "vllm 64": _metrics(2500.0, 11.6)})
    b = _study({"vllm": _metrics(2500.0, 11.6), "sglang": ConfigResult(status=Status.CRASHED, error="boom"),
                "vllm 64": _metrics(2500.0, 11.6)}, name="b")
    c = compare(a, b)
    sglang = next(p for p in c.pairs if p.a.label == "SGLang")
    assert sglang.status_regressed and sglang.regressed and not sglang.deltas
    assert c.exit_code == 1
    # and the other way round it is a fix, not a regression
    assert compare(b, a).exit_code == 0


def test_different_plans_warn_and_compare_what_matches():
    more = PLAN + "  extra: {input_len: 8, output_len: 8, num_prompts: 4}\n"
    table = {"vllm": _metrics(2500.0, 11.6), "sglang": _metrics(2400.0, 12.0), "vllm 64": _metrics(2500.0, 11.6)}
    a, b = _study(table), _study(table, plan_text=more, name="b")
    c = compare(a, b)
    assert not c.same_plan and "different plans" in c.warnings[0]
    assert {(m.label, m.profile) for m in c.only_b} == {("Baseline", "extra")}  # optimized = baseline
    assert c.pairs and c.exit_code == 0


def test_the_machine_and_engine_versions_do_not_make_another_plan():
    sim = load_plan_text(PLAN.replace("engines:", 'hardware: sim:a100-80g-x8\nsimulation: {time_scale: 50, '
                                      'engine_versions: {vllm: "0.12.0"}}\nengines:'))
    assert same_plan(load_plan_text(PLAN), sim)
    assert not same_plan(load_plan_text(PLAN), load_plan_text(PLAN.replace("num_prompts: 16", "num_prompts: 32")))


def test_threshold_must_be_a_percentage():
    table = {"vllm": _metrics(2500.0, 11.6), "sglang": _metrics(2400.0, 12.0), "vllm 64": _metrics(2500.0, 11.6)}
    with pytest.raises(UsageError, match="--threshold"):
        compare(_study(table), _study(table), -1.0)


def test_an_unfinished_study_compares_what_it_measured():
    table = {"vllm": _metrics(2500.0, 11.6), "sglang": _metrics(2400.0, 12.0), "vllm 64": _metrics(2500.0, 11.6)}
    partial = dict(table, sglang=ConfigResult(status=Status.PENDING))
    c = compare(_study(table), _study(partial, name="b"))
    assert not any(p.a.label == "SGLang" for p in c.pairs)
    assert [m.label for m in c.only_a] == ["SGLang"] and not c.only_b


def test_tails_have_their_own_threshold():
    table_a = {"vllm": _metrics(2500.0, 10.0), "sglang": _metrics(2400.0, 12.0), "vllm 64": _metrics(2500.0, 10.0)}
    b_vllm = dict(_metrics(2500.0, 10.0), p99_itl_ms=10.8, mean_itl_ms=10.6)  # +8 % p99, +6 % mean
    table_b = dict(table_a, vllm=b_vllm)
    c = compare(_study(table_a), _study(table_b, name="b"))  # defaults: 5 % and 10 % for p99s
    vllm = next(p for p in c.pairs if p.a.label == "vLLM")
    assert {d.metric.key for d in vllm.regressions} == {"mean_itl_ms"}
    strict = compare(_study(table_a), _study(table_b, name="b"), 5.0, 5.0)
    vllm = next(p for p in strict.pairs if p.a.label == "vLLM")
    assert {d.metric.key for d in vllm.regressions} == {"mean_itl_ms", "p99_itl_ms"}
    assert {m.key for m in METRICS if m.tail} == {"p99_ttft_ms", "p99_tpot_ms", "p99_itl_ms", "p99_e2el_ms"}
    assert strict.to_json()["tail_threshold_pct"] == 5.0


def test_a_measurement_stopped_early_is_a_status_change_not_metrics():
    """Its figures are those of its first windows: comparing them with a full run would mislead."""
    table = {"vllm": _metrics(2500.0, 11.6), "sglang": _metrics(2400.0, 12.0), "vllm 64": _metrics(2500.0, 11.6)}
    stopped = ConfigResult(status=Status.STOPPED_EARLY, metrics=_metrics(1200.0, 30.0), num_prompts=16,
                           stopped_early={"reason": "lost"})
    c = compare(_study(table), _study(dict(table, sglang=stopped), name="b"))
    sglang = next(p for p in c.pairs if p.a.label == "SGLang")
    assert not sglang.deltas and not sglang.regressed
    assert sglang.to_json()["status"] == {"a": "ok", "b": "stopped-early"}


def test_the_table_prints_large_figures_plainly(capsys, monkeypatch):
    from perflab.cli.compare_cmd import _print, figure_text

    assert [figure_text(v) for v in (104600.0, 1_234_567.8, 12345.678, 0.4199, -250000.0)] == [
        "104,600", "1,234,568", "12,345.68", "0.42", "-250,000"]
    monkeypatch.setenv("COLUMNS", "200")
    a = _study({"vllm": _metrics(104600.0, 11.6), "sglang": _metrics(2400.0, 12.0), "vllm 64": _metrics(2500.0, 11.6)})
    b = _study({"vllm": _metrics(52300.0, 11.6), "sglang": _metrics(2400.0, 12.0), "vllm 64": _metrics(2500.0, 11.6)},
               name="b")
    _print(compare(a, b), show_all=False)
    out = capsys.readouterr().out
    assert "104,600" in out and "52,300" in out and "e+" not in out
