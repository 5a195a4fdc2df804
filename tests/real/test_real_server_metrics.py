"""The real vLLM's own metrics in a study (issue #13 item 1): perflab scrapes vLLM 0.32.0's
``/metrics`` during the measured benchmark and report.json carries the summary.

One study, one engine; nothing left behind afterwards.
"""

from __future__ import annotations

import json

from reallab import RealLab
from test_real_vllm import _plan

# 96 prompts over 2 shared prefixes of 128 tokens (+64 of their own), 128 tokens out, 8 at a
# time: some ten seconds of work on the tiny model. vLLM's gauges move step by step (a scrape
# between two steps can read 0 running; an external scraper every 0.25 s read 0 in half of
# its samples during a run), so requests must live long enough for the scrapes (one a second)
# to see them: with 48 prompts of 32 tokens an idle CI machine read a KV peak of 0 once. The
# prefix hits are counters vLLM keeps itself.
PROFILE = ("{label: Shared prefixes, dataset: prefix-repetition, prefix_len: 128, num_prefixes: 2, input_len: 64, "
           "output_len: 128, num_prompts: 96, max_concurrency: 8, seed: 42}")


def test_server_metrics_of_a_real_vllm_after_a_short_bench(lab: RealLab) -> None:
    out = lab.tmp / "study"
    r = lab.run("run", str(_plan(lab, PROFILE, candidates=False)), "--hardware", "auto", "--out", str(out), timeout=900)
    assert r.rc == 0, r.stdout[-3000:] + r.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    (case,) = report["cases"]
    sm = case["baseline"]["server_metrics"]
    assert sm["source"] == "/metrics" and sm["samples"] >= 4
    assert 0 < sm["kv_cache_usage"]["peak"] <= 1 and 0 <= sm["kv_cache_usage"]["mean"] <= sm["kv_cache_usage"]["peak"]
    assert 1 <= sm["running"]["peak"] <= 8 and sm["waiting"]["peak"] >= 0
    assert sm["preemptions"] == 0  # a 1 GiB KV cache holds 8 sequences of 320 tokens many times over
    assert sm["prefix_cache_hit_rate"] > 0.3  # 128 of each prompt's 192 tokens are one of 2 prefixes
    assert "spec_decode_acceptance" not in sm  # no --speculative-config: vLLM registers no spec counters
    series = json.loads(next((out / "runs").rglob("observe-short*.json")).read_text())["server_metrics"]
    assert len(series) == sm["samples"] and {"running", "kv_cache_usage", "prefix_cache_hits"} <= set(series[-1]["values"])
    # read where the timed run began (after the warm-up) and ended: the summary is the timed run's
    marks = [(i, s["mark"]) for i, s in enumerate(series) if s.get("mark")]
    assert [m for _, m in marks] == ["start", "end"] and 0 < marks[0][0] < marks[1][0], marks
    start, end = (series[i]["values"] for i, _ in marks)
    assert end["prefix_cache_queries"] - start["prefix_cache_queries"] > 0
    print(f"\nserver_metrics of the real vLLM: {json.dumps(sm)}")
    lab.assert_nothing_left()
