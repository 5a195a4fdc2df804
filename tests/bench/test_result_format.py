"""The "Serving Benchmark Result" block against the seeds, and the JSON's vLLM field names."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from perflab.bench.metrics import compute_metrics
from perflab.bench.result import (
    BenchResult,
    format_result_block,
    parse_result_block,
    parse_result_blocks,
)
from perflab.bench.trace import RequestTrace

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "seeds" / "seed_results.json"
SEEDS = FIXTURE.parent / "studies"

BLOCK_RE = re.compile(r"=+ Serving Benchmark Result =+.*?={50}", re.S)

# The fixture's snake_case names -> vLLM --save-result names (seconds -> ms where needed).
FIXTURE_TO_VLLM = {
    "successful_requests": ("completed", 1),
    "max_concurrency": ("max_concurrency", 1),
    "duration_s": ("duration", 1),
    "total_input_tokens": ("total_input_tokens", 1),
    "total_generated_tokens": ("total_output_tokens", 1),
    "request_throughput": ("request_throughput", 1),
    "output_throughput": ("output_throughput", 1),
    "peak_output_throughput": ("max_output_tokens_per_s", 1),
    "peak_concurrent_requests": ("max_concurrent_requests", 1),
    "total_token_throughput": ("total_token_throughput", 1),
    "mean_latency_s": ("mean_e2el_ms", 1000),
    "median_latency_s": ("median_e2el_ms", 1000),
    "p95_latency_s": ("p95_e2el_ms", 1000),
    "p99_latency_s": ("p99_e2el_ms", 1000),
}


def seed_blocks(name: str) -> list[str]:
    return BLOCK_RE.findall((SEEDS / name).read_text())


@pytest.mark.parametrize("seed", ["000_66c74e108a0d1776.txt", "001_7382f1cb439cecdf.txt", "002_df97046e8f66ab3a.txt"])
def test_vllm_seed_blocks_round_trip_line_for_line(seed: str) -> None:
    blocks = seed_blocks(seed)
    assert len(blocks) >= 13
    for block in blocks:
        lines = [ln.strip() for ln in block.splitlines()]
        assert format_result_block(parse_result_block(block), percentiles=()).splitlines() == lines


def test_gpustack_seed_blocks_round_trip() -> None:
    # seed 004's text lost its line breaks; its blocks have a Latency (s) section and P95 lines,
    # some "N/A", present in some sections and not others.
    blocks = seed_blocks("004_b58ebedf0df33e6b.txt")
    assert len(blocks) == 24
    for block in blocks:
        metrics = parse_result_block(block)
        assert metrics["percentile_metrics"][0] == "latency"
        assert " ".join(format_result_block(metrics, percentiles=()).split()) == " ".join(block.split())
    first = parse_result_block(blocks[0])
    assert first["p95_ttft_ms"] is None and "p95_e2el_ms" not in first
    assert first["mean_e2el_ms"] == pytest.approx(24110.0) and first["max_concurrency"] == 512


def test_parse_matches_the_seed_fixture() -> None:
    records = [r for r in json.loads(FIXTURE.read_text()) if r.get("metrics")]
    assert len(records) == 67
    for r in records:
        text = (SEEDS / r["seed"]).read_text()
        if r.get("source_offset") is not None:
            start = r["source_offset"]
        else:
            start = sum(len(line) for line in text.splitlines(keepends=True)[: r["source_line"] - 1])
        parsed = parse_result_block(text[start:])
        for key, expected in r["metrics"].items():
            name, factor = FIXTURE_TO_VLLM.get(key, (key, 1))
            got = parsed.get(name)
            if expected is None:
                assert got is None, (r["id"], key)
            else:
                assert got == pytest.approx(expected * factor), (r["id"], key, got, expected)


def test_own_block_has_the_seed_layout() -> None:
    seed_block = seed_blocks("000_66c74e108a0d1776.txt")[-1]  # the one with a concurrency limit

    def labels(block: str) -> list[str]:
        return [ln.strip().split(":")[0] if ":" in ln else ln.strip() for ln in block.splitlines()]

    t = RequestTrace.from_itl(start=0.0, ttft=0.1, itl=[0.05, 0.05], output_tokens=3, prompt_len=8)
    metrics = {"max_concurrency": 4, "request_rate": "inf", **compute_metrics([t], 1.0)}
    # perflab's own runs print vLLM 0.33's labels: "Failed requests:" always, "Total token"
    own = labels(format_result_block(metrics))
    seed = labels(seed_block)
    assert own == seed[:2] + ["Failed requests"] + [
        "Total token throughput (tok/s)" if lab == "Total Token throughput (tok/s)" else lab for lab in seed[2:]]
    # the seed's own layout on demand
    assert labels(format_result_block({**metrics, "block_layout": "vllm-0.11"})) == seed


def test_vllm_033_block_labels_and_json_keys() -> None:
    t = RequestTrace.from_itl(start=0.0, ttft=0.1, itl=[0.05, 0.05], output_tokens=3, prompt_len=8, queue_time=0.25)
    bad = RequestTrace(success=False, start=0.2, error="HTTP 500", queue_time=0.5)
    metrics = compute_metrics([t, bad], 1.0)
    block = format_result_block(metrics)
    assert "Failed requests:                         1" in block
    assert "Total token throughput (tok/s):          11.00" in block and "Total Token" not in block
    zero = format_result_block(compute_metrics([t], 1.0))
    assert "Failed requests:                         0" in zero
    assert parse_result_block(zero)["block_layout"] == "vllm-0.33"
    assert format_result_block(parse_result_block(zero)) == zero
    j = BenchResult(metrics=metrics, requests=[t, bad]).to_json()
    # vLLM 0.33's always-present keys (kept without --save-detailed)
    assert j["latencies"] == [pytest.approx(0.2), 0.0]
    assert j["queue_times"] == [0.25, 0.5]
    assert j["rtfx"] == 0.0
    assert "ttfts" not in j and "block_layout" not in j


def test_format_exact_text() -> None:
    metrics = {
        "completed": 200, "failed": 0, "max_concurrency": 32, "request_rate": "inf", "duration": 2.774,
        "total_input_tokens": 25600, "total_output_tokens": 3200, "request_throughput": 72.1,
        "request_goodput": None, "output_throughput": 1153.5, "max_output_tokens_per_s": 1169.0,
        "max_concurrent_requests": 32, "total_token_throughput": 10381.3,
        "mean_ttft_ms": 147.104, "median_ttft_ms": 150.0, "p95_ttft_ms": 290.0, "p99_ttft_ms": 305.67,
        "mean_tpot_ms": 15.63, "median_tpot_ms": 14.73, "p95_tpot_ms": 20.0, "p99_tpot_ms": 23.4,
        "mean_itl_ms": 14.65, "median_itl_ms": 8.33, "p95_itl_ms": 50.0, "p99_itl_ms": 99.5,
        "mean_e2el_ms": 380.0, "median_e2el_ms": 370.0, "p95_e2el_ms": 420.0, "p99_e2el_ms": 500.0,
    }  # fmt: skip
    expected = """\
============ Serving Benchmark Result ============
Successful requests:                     200
Maximum request concurrency:             32
Benchmark duration (s):                  2.77
Total input tokens:                      25600
Total generated tokens:                  3200
Request throughput (req/s):              72.10
Output token throughput (tok/s):         1153.50
Peak output token throughput (tok/s):    1169.00
Peak concurrent requests:                32.00
Total Token throughput (tok/s):          10381.30
---------------Time to First Token----------------
Mean TTFT (ms):                          147.10
Median TTFT (ms):                        150.00
P95 TTFT (ms):                           290.00
P99 TTFT (ms):                           305.67
-----Time per Output Token (excl. 1st token)------
Mean TPOT (ms):                          15.63
Median TPOT (ms):                        14.73
P95 TPOT (ms):                           20.00
P99 TPOT (ms):                           23.40
---------------Inter-token Latency----------------
Mean ITL (ms):                           14.65
Median ITL (ms):                         8.33
P95 ITL (ms):                            50.00
P99 ITL (ms):                            99.50
=================================================="""
    assert format_result_block(metrics, percentiles=(95, 99)) == expected
    # BenchResult.format_block shows only the percentiles asked, seed 004's Latency and vLLM's E2EL on request
    r = BenchResult(metrics=metrics, percentiles=(99,), percentile_metrics=("latency", "ttft", "e2el"))
    block = r.format_block()
    assert "P95" not in block and "Mean Latency(s):                         0.38" in block
    assert "----------------End-to-end Latency----------------\nMean E2EL (ms):                          380.00" in block
    assert block.index("Latency(s)") < block.index("TTFT") < block.index("E2EL") and "TPOT" not in block


def test_optional_lines() -> None:
    base = {"completed": 3, "duration": 1.0, "total_input_tokens": 1, "total_output_tokens": 1, "request_throughput": 3.0,
            "output_throughput": 1.0, "max_output_tokens_per_s": 1.0, "max_concurrent_requests": 1, "total_token_throughput": 2.0}
    plain = format_result_block({**base, "failed": 0, "max_concurrency": None, "request_rate": "inf", "request_goodput": None})
    assert "Failed" not in plain and "Maximum request concurrency" not in plain and "Request rate" not in plain and "goodput" not in plain
    full = format_result_block({**base, "failed": 2, "max_concurrency": 8, "request_rate": 4.0, "request_goodput": 1.5})
    assert "Failed requests:                         2" in full
    assert "Request rate configured (RPS):           4.00" in full
    assert "Request goodput (req/s):                 1.50" in full
    missing = format_result_block(base, percentiles=(95,))
    assert "P95 TTFT (ms):                           N/A" in missing and "Mean TTFT (ms):                          N/A" in missing
    back = parse_result_block(full)
    assert (back["failed"], back["max_concurrency"], back["request_rate"], back["request_goodput"]) == (2, 8, 4.0, 1.5)


def test_parse_several_blocks_and_newer_vllm_spelling() -> None:
    newer = "\n".join([
        "============ Serving Benchmark Result ============",
        "Successful requests:                     10",
        "Failed requests:                         0",
        "Benchmark duration (s):                  69.66",
        "Total input tokens:                      100",
        "Request throughput (req/s):              0.14",
        "Peak concurrent requests:                1.00",
        "Total token throughput (tok/s):          12.00",
        "==================================================",
    ])  # fmt: skip
    blocks = parse_result_blocks("log line\n" + newer + "\nmore\n" + newer)
    assert len(blocks) == 2 and blocks[0]["total_token_throughput"] == 12.0 and blocks[0]["failed"] == 0
    with pytest.raises(ValueError, match="no 'Serving Benchmark Result'"):
        parse_result_block("nothing here")


def test_json_uses_vllm_field_names(tmp_path: Path) -> None:
    traces = [
        RequestTrace.from_itl(start=0.0, ttft=0.1, itl=[0.1], output_tokens=2, prompt_len=5, index=0, generated_text=" a b"),
        RequestTrace(success=False, start=0.2, error="HTTP 500", index=1),
    ]
    metrics = {"date": "20260101-000000", "backend": "openai-chat", "label": None, "model_id": "Qwen/Qwen3-8B",
               "request_rate": "inf", "max_concurrency": 32, **compute_metrics(traces, 1.0, percentiles=(50, 99))}
    r = BenchResult(metrics=metrics, errors=["request 1: HTTP 500"], requests=traces, info={"tokenizer": "whitespace"})
    j = r.to_json()
    for key in ("completed", "failed", "total_input_tokens", "total_output_tokens", "request_throughput", "output_throughput",
                "total_token_throughput", "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "std_ttft_ms", "mean_tpot_ms",
                "p50_itl_ms", "mean_e2el_ms", "max_output_tokens_per_s", "max_concurrent_requests", "duration"):
        assert key in j, key
    assert j["errors"] == ["request 1: HTTP 500"] and j["perflab"] == {"tokenizer": "whitespace"}
    assert "ttfts" not in j
    d = r.to_json(detailed=True)
    assert d["ttfts"] == [0.1, 0.0] and d["output_lens"] == [2, 0] and d["errors"] == ["", "HTTP 500"]
    assert d["generated_texts"] == [" a b", ""] and d["itls"] == [pytest.approx([0.1]), []]
    path = r.save(tmp_path)
    assert path.name == "openai-chat-infqps-concurrency32-Qwen3-8B-20260101-000000.json"
    assert json.loads(path.read_text())["completed"] == 1
    assert r.success_rate == 0.5
