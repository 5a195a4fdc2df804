"""The seeds' method (perflab.lab.study), driven by the seeds' own numbers."""

from __future__ import annotations

import anyio
import pytest

from perflab.contract.status import Status
from perflab.lab.options import Configuration
from perflab.lab.plan import Profile, load_plan_text
from perflab.lab.study import ConfigResult, conduct

DISPLAY = {"vllm": "vLLM", "sglang": "SGLang", "trtllm": "TensorRT-LLM"}.get


def _run(plan, measure):
    return anyio.run(lambda: conduct(plan, measure, display=lambda e: DISPLAY(e, e)))


def test_seed_002_decisions(seed_002, seed_measure):
    text, key = seed_002
    plan = load_plan_text(text)
    measure = seed_measure(key)
    o = _run(plan, measure)

    engine, quant, mbt = o.steps
    assert [e.label for e in engine.entries] == ["vLLM", "SGLang", "TensorRT-LLM"]
    assert engine.chosen.label == "TensorRT-LLM"
    assert engine.statement == "Result: TensorRT-LLM (2054.21 tok/s) > vLLM (1730.98 tok/s) > SGLang (1398.38 tok/s)"

    assert quant.title == "2. Quantization in TensorRT-LLM/vLLM"
    assert [e.label for e in quant.entries] == ["TensorRT-LLM FP8", "TensorRT-LLM AWQ", "vLLM FP8", "vLLM AWQ"]
    assert [e.result.status for e in quant.entries] == [Status.CRASHED, Status.CRASHED, Status.OK, Status.OK]
    assert quant.entries[1].result.cause["line"] == "KeyError: 'weight'"
    assert not quant.adopted and quant.chosen.label == "vLLM AWQ"

    assert [e.label for e in mbt.entries] == ["TensorRT-LLM 16k", "TensorRT-LLM 32k"]
    assert mbt.entries[0].config.options["max_batched_tokens"] == 16384
    assert not mbt.adopted

    assert o.optimized.config == plan.engine_defaults("trtllm")
    assert o.baseline.config == plan.baseline_config()
    assert o.complete
    # the summary: engine selection +18.7% over the baseline, nothing else adopted
    assert round(engine.vs_baseline_pct, 1) == 18.7
    assert quant.vs_baseline_pct is None and mbt.vs_baseline_pct is None


def test_seed_002_conclusion_percentages(seed_002, seed_measure):
    """The conclusion table's changes, recomputed from the seed's records (seed_summaries.json)."""
    from seedkit import seed_summaries

    text, key = seed_002
    o = _run(load_plan_text(text), seed_measure(key))
    rows = seed_summaries()["002_df97046e8f66ab3a.txt"]["conclusion_table"]["rows"]
    expected = {r["benchmark_case"]: r["optimized"]["change_pct_recomputed"] for r in rows}
    got = {c.profile.label: c.change_pct for c in o.cases}
    assert set(got) == set(expected)
    for label, pct in expected.items():
        assert got[label] == pytest.approx(pct, abs=0.01), label
    # the seed's table says -13.8% for Very Long Prompt; 1580.36 / 1798.45 - 1 is -12.13%
    assert round(got["Very Long Prompt"], 1) == -12.1


def test_candidate_adopted_and_applied_cumulatively(seed_measure):
    """A step's winner becomes the base of the next step (seed 001: FP8, then TP4 replicas)."""
    plan = load_plan_text("""
model: Qwen/Qwen3-235B-A22B-Instruct-2507
engines: [vllm]
serve: {tp: 8}
candidates:
  - name: Quantization
    set: {model: Qwen/Qwen3-235B-A22B-Instruct-2507-FP8, ep: 8}
  - name: Parallelism
    variants:
      - {name: TP4, set: {tp: 4, ep: null, replicas: 2}}
      - {name: TP4 EP4, set: {tp: 4, ep: 4}}
profiles: {sharegpt: {dataset: synthetic-sharegpt, num_prompts: 1000}}
""")

    def key(config: Configuration, profile: Profile) -> str | None:
        o = config.options
        fp8 = o["model"].endswith("FP8")
        return {
            (False, 8, None, 1): "001-00",
            (True, 8, 8, 1): "001-02",
            (True, 4, None, 2): "001-03",
            (True, 4, 4, 1): "001-04",
        }.get((fp8, o.get("tp"), o.get("ep"), config.replicas))

    o = _run(plan, seed_measure(key))
    quant, par = o.steps[1:]
    assert not quant.adopted  # 3740.89 < 3792.50
    # FP8 was not adopted, so TP4 is applied on the engine winner (bf16), which the seed did not
    # measure: no result, and the step keeps the current best
    assert par.entries[0].config.options["model"] == "Qwen/Qwen3-235B-A22B-Instruct-2507"
    assert par.entries[0].result.status == Status.PENDING and not o.complete


def test_low_success_rate_is_recorded_not_chosen(seed_measure):
    """Seed 004: speculative decoding has the best throughput but a 51.4% success rate."""
    plan = load_plan_text("""
model: Qwen/Qwen3.5-9B
engines: [vllm, sglang]
serve: {reasoning_parser: qwen3, max_model_len: 32768}
candidates:
  - {name: Prefix Cache, set: {prefix_caching: true}}
  - name: Speculative Decoding
    set: {speculative_config: {method: mtp, num_speculative_tokens: 4}}
  - {name: Performance Mode, set: {extra_args: ["--performance-mode=throughput"]}}
  - name: Max Num Seqs
    variants:
      - {name: Seqs 512, set: {max_num_seqs: 512}}
      - {name: Seqs 1024, set: {max_num_seqs: 1024}}
      - {name: Seqs 2048, set: {max_num_seqs: 2048}}
profiles: {sharegpt: {label: ShareGPT, dataset: synthetic-sharegpt, num_prompts: 1000, max_concurrency: 512}}
min_success_rate: 0.9
""")

    def key(config: Configuration, profile: Profile) -> str | None:
        o = dict(config.options)
        o.pop("model"), o.pop("reasoning_parser"), o.pop("max_model_len")
        if config.engine == "sglang":
            return "004-01" if not o else None
        table = {(): "004-00", ("prefix_caching",): "004-02", ("speculative_config",): "004-03",
                 ("extra_args",): "004-04"}
        if list(o) == ["max_num_seqs"]:
            return {512: "004-05", 1024: "004-06", 2048: "004-07"}[o["max_num_seqs"]]
        return table.get(tuple(sorted(o)))

    o = _run(plan, seed_measure(key))
    engine, prefix, spec, perf, seqs = o.steps
    assert engine.chosen.label == "vLLM"
    assert round(engine.vs_baseline_pct, 2) == 0.0
    assert not prefix.adopted
    entry = spec.entries[0]
    assert entry.result.status == Status.OK and entry.result.tps == pytest.approx(15059.89)
    assert not entry.eligible and entry.note == "Success rate: 51.4%, optimization skipped"
    assert not spec.adopted and spec.chosen is None
    assert not perf.adopted
    assert seqs.adopted and seqs.chosen.label == "vLLM Seqs 1024"
    assert round(seqs.vs_baseline_pct, 2) == 0.05
    assert o.optimized.config.options["max_num_seqs"] == 1024


def test_combinations_use_candidate_deltas(seed_measure):
    plan = load_plan_text("""
model: m
engines: [vllm]
candidates:
  - {name: Performance Mode, set: {extra_args: ["--performance-mode=throughput"]}}
  - name: Max Num Seqs
    variants: [{name: "512", set: {max_num_seqs: 512}}, {name: "256", set: {max_num_seqs: 256}}]
combinations:
  - name: Max Num Seqs && Performance Mode
    base: engine-defaults
    variants:
      - {name: A, of: [Performance Mode, Max Num Seqs/512]}
      - {name: B, of: [Performance Mode, "256"], set: {max_batched_tokens: 8192}}
profiles: {p: {input_len: 10, output_len: 10, num_prompts: 10}}
""")
    calls = []

    async def measure(config, profiles, *, step, label, to_beat=None):
        calls.append((step, label, dict(config.options)))
        # either option alone loses, together they win (and 512 beats 256)
        o = config.options
        both = "extra_args" in o and "max_num_seqs" in o
        tps = 100.0 + o["max_num_seqs"] / 100 if both else (99.0 if "extra_args" in o or "max_num_seqs" in o else 100.0)
        return {p.name: ConfigResult(Status.OK, metrics={"total_token_throughput": tps, "completed": 10}, num_prompts=10) for p in profiles}

    o = _run(plan, measure)
    comb = o.steps[-1]
    assert comb.kind == "combination"
    a, b = (e.config.options for e in comb.entries)
    assert a["extra_args"] == ("--performance-mode=throughput",) and a["max_num_seqs"] == 512
    assert b["max_num_seqs"] == 256 and b["max_batched_tokens"] == 8192
    assert not any(s.adopted for s in o.steps[1:3])
    assert comb.adopted and comb.chosen.variant == "A"  # 105.12 > 102.56 > 100
    assert [c[1] for c in calls][-2:] == ["Baseline", "Optimized"]


def test_no_engine_serves(seed_measure):
    plan = load_plan_text("""
model: m
engines: [vllm, sglang]
candidates: [{name: Q, set: {quantization: fp8}}]
profiles: {p: {input_len: 10, output_len: 10, num_prompts: 10}}
""")

    async def measure(config, profiles, *, step, label, to_beat=None):
        return {p.name: ConfigResult(Status.CRASHED, cause={"name": "x", "explanation": "boom"}) for p in profiles}

    o = _run(plan, measure)
    assert o.optimized is None
    assert o.steps[0].statement.startswith("Result: no engine served")
    assert o.steps[1].skipped
    assert [c.optimized for c in o.cases] == [None]
