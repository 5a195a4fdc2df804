"""perflab audit's rules, one at a time, on small results: each fires on an inconsistency and
stays quiet on consistent numbers (printed precision included)."""

from __future__ import annotations

from typing import Any

import pytest

from perflab.lab.report.audit.rules import RULE_NAMES, ResultView, check_result, check_table_row


def base() -> dict[str, Any]:
    """A consistent result: 100 requests of 50 output tokens, at most 16 at a time, in 10 s."""
    return {
        "completed": 100, "failed": 0, "duration": 10.0, "max_concurrency": 16,
        "total_input_tokens": 10000, "total_output_tokens": 5000,
        "request_throughput": 10.0, "output_throughput": 500.0, "total_token_throughput": 1500.0,
        "max_output_tokens_per_s": 700.0, "max_concurrent_requests": 16,
        "mean_ttft_ms": 100.0, "median_ttft_ms": 90.0, "p99_ttft_ms": 300.0,
        "mean_tpot_ms": 20.0, "median_tpot_ms": 19.0, "p99_tpot_ms": 40.0,
        "mean_itl_ms": 20.0, "median_itl_ms": 18.0, "p99_itl_ms": 45.0,
        "mean_e2el_ms": 1080.0, "median_e2el_ms": 1050.0, "p99_e2el_ms": 1500.0,  # 100 + 20 × 49
    }


def rules(metrics: dict[str, Any], **kw: Any) -> list[str]:
    return [i.rule for i in check_result(ResultView(metrics, **kw))]


def messages(metrics: dict[str, Any], **kw: Any) -> list[str]:
    return [i.message for i in check_result(ResultView(metrics, **kw))]


def test_consistent_result_is_clean() -> None:
    assert rules(base()) == []
    assert rules(base(), peak_counting="exact") == []
    assert rules(base(), peak_counting="buckets") == []
    assert rules(base(), printed=True) == []


@pytest.mark.parametrize("key", ["request_throughput", "output_throughput", "total_token_throughput"])
def test_throughput(key: str) -> None:
    m = base()
    m[key] *= 1.02
    assert rules(m) == ["throughput"]
    # printed with two decimals: 5000 tokens / 10.00 s may read 500.00 ± 0.005 (and ±0.005 s)
    m = {**base(), key: base()[key] + 0.004}
    assert rules(m, printed=True) == []


def test_throughput_message_quotes_the_numbers() -> None:
    (msg,) = messages({**base(), "output_throughput": 520.0})
    assert msg == "output throughput 520.00/s but 5000 output tokens in 10.00 s is 500.00/s (+4.0%)"


def test_tpot_latency_fixed_length() -> None:
    m = {**base(), "mean_tpot_ms": 10.0, "median_tpot_ms": 10.0}
    (msg,) = messages(m)
    assert "mean TPOT 10.00 ms but (mean E2EL 1080.00 − mean TTFT 100.00 ms)/(50.0 − 1) = 20.00 ms" in msg
    assert rules({**base(), "mean_tpot_ms": 20.3}) == []  # within 2 %


def test_tpot_latency_varying_length_allows_a_factor_of_two() -> None:
    varying = {**base(), "total_output_tokens": 5050, "output_throughput": 505.0, "total_token_throughput": 1505.0}
    assert rules({**varying, "mean_tpot_ms": 30.0}) == []  # expected 19.8: 1.5× is a distribution
    assert rules({**varying, "mean_tpot_ms": 42.0, "p99_tpot_ms": 60.0}) == ["tpot-latency"]
    assert rules({**varying, "mean_tpot_ms": 9.0, "median_tpot_ms": 9.0}) == ["tpot-latency"]


def test_tpot_latency_exact_from_per_request_lists() -> None:
    details = {"ttfts": [0.1, 0.1], "latencies": [1.08, 1.08], "output_lens": [50, 50], "errors": ["", ""]}
    m = {**base(), "median_ttft_ms": 100.0, "p99_ttft_ms": 100.0, "median_e2el_ms": 1080.0, "p99_e2el_ms": 1080.0}
    assert rules(m, details=details) == []
    assert rules({**m, "mean_tpot_ms": 20.5}, details=details) == ["tpot-latency"]


def test_latency_duration() -> None:
    # E2EL 1.08 s × 100 requests needs 10.8 request-seconds: 16 slots × 10 s hold it, 8 do not
    (msg,) = messages({**base(), "max_concurrency": 8, "max_concurrent_requests": 8, "max_output_tokens_per_s": 300.0})
    assert msg == ("mean E2EL 1.08 s but 100 requests, at most 8 at a time (max concurrency), in 10.00 s "
                   "allow at most 0.80 s per request")
    # without E2EL, a fixed output length gives it: TTFT + TPOT × 49
    m = {k: v for k, v in base().items() if "e2el" not in k}
    assert rules(m) == []
    m.update(mean_tpot_ms=40.0, p99_tpot_ms=60.0)
    (msg,) = messages(m)
    assert msg.startswith("mean E2EL 2.06 s (mean TTFT 100.00 ms + mean TPOT 40.00 ms × 49 tokens)")


def test_stat_order() -> None:
    (msg,) = messages({**base(), "p99_ttft_ms": 95.0})
    assert msg == ("mean TTFT 100.00 ms > P99 TTFT 95.00 ms "
                   "(the slowest 1 % of requests would have to average 595.00 ms)")
    # token gaps have a heavy tail (a preemption stalls a stream): only a gap longer than the run is impossible
    assert rules({**base(), "mean_itl_ms": 50.0}) == []
    (msg,) = messages({**base(), "mean_itl_ms": 200.0, "median_itl_ms": 0.0, "p99_itl_ms": 0.0})
    assert msg == ("mean ITL 200.00 ms > P99 ITL 0.00 ms: the slowest 1 % of gaps would have to average "
                   "20.00 s, longer than the 10.00 s run")
    assert rules({**base(), "median_itl_ms": 50.0}) == ["stat-order"]
    assert rules({**base(), "p90_ttft_ms": 350.0}) == ["stat-order"]  # P90 > P99
    assert rules({**base(), "p99_ttft_ms": 99.996}, printed=True) == []  # equal within print precision
    # inside [min, max] of the per-request latencies a --save-result JSON carries
    lat = {"latencies": [1.0, 1.1, 1.2], "errors": ["", "", ""]}
    assert rules({**base(), "median_e2el_ms": 1100.0, "p99_e2el_ms": 1198.0}, details=lat) == []
    assert rules({**base(), "median_e2el_ms": 1100.0, "p99_e2el_ms": 1500.0}, details=lat) == ["stat-order"]


def test_peak_output() -> None:
    (msg,) = messages({**base(), "max_output_tokens_per_s": 20_132_659.2})
    assert msg == "peak output 20,132,659 tok/s > the 5000 output tokens of the whole run (one second cannot hold more)"
    # vLLM counts the requests touching a second: 16 of 50 tokens generate at most 800
    assert rules({**base(), "max_output_tokens_per_s": 900.0}, peak_counting="buckets") == ["peak-output"]
    assert rules({**base(), "max_output_tokens_per_s": 800.0}, peak_counting="buckets") == []
    # perflab's exact peak concurrency does not bound the requests touching one second
    assert rules({**base(), "max_output_tokens_per_s": 900.0}, peak_counting="exact") == []
    assert rules({**base(), "max_output_tokens_per_s": 900.0}) == []  # unknown counting


def test_peak_concurrency() -> None:
    assert rules({**base(), "max_concurrent_requests": 150}) == ["peak-concurrency"]
    assert rules({**base(), "max_concurrent_requests": 20}, peak_counting="exact") == ["peak-concurrency"]
    # vLLM counts back-to-back requests in one second as concurrent: not held to the cap
    assert rules({**base(), "max_concurrent_requests": 20}, peak_counting="buckets") == []
    assert rules({**base(), "max_concurrent_requests": 120}, num_prompts=128) == []


ROW = ["**Very Long Prompt**", "Total TPS: 1798.45<br>Mean TPOT(ms): 67.87",
       'Total TPS: 1580.36 <span style="background-color:#fbcaca;">({pct})</span><br>Mean TPOT(ms): 47.37']


def test_table_change() -> None:
    checked, issues = check_table_row([ROW[0], ROW[1], ROW[2].format(pct="-13.8%")])
    assert checked == 1
    assert [(i.rule, i.message) for i in issues] == [
        ("table-change", "Total TPS 1580.36 vs 1798.45: stated −13.8%, recomputed −12.1%")]
    assert check_table_row([ROW[0], ROW[1], ROW[2].format(pct="-12.1%")]) == (1, [])
    # seed 001's "x2" (two replicas) and seed 004's column order (changed first)
    assert check_table_row(["ShareGPT", "Total TPS: 3792.50", "Total TPS: 3019.19x2 (+59.2%)"]) == (1, [])
    assert check_table_row(["Prefix Cache", "Total TPS: 11224.70 (-2.62%)\nMean TPOT(ms): 16.66",
                            "Total TPS: 11527.14\nMean TPOT(ms): 15.12"]) == (1, [])
    # a percentage that is not a change, and a row with nothing to compare: nothing checked
    assert check_table_row(["Spec", "Total TPS: 15059.89 (Success rate: 51.5%, optimization skipped)",
                            "Total TPS: 11527.14"]) == (0, [])
    assert check_table_row(["Engine Selection", "+284.0%", ""]) == (0, [])


def test_rules_are_declared_once() -> None:
    assert len(set(RULE_NAMES)) == len(RULE_NAMES) == 7
