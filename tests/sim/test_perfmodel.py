"""The performance model and the continuous-batching scheduler, in simulated time."""

from __future__ import annotations

import pytest

from perflab import models
from perflab_sim import calibrate, catalog, perfmodel, tokenizer
from perflab_sim.perfmodel import Knobs, StepShape
from perflab_sim.scheduler import Scheduler, SimRequest, simulate

A100 = catalog.get("a100-80g-x1").chip
H100 = catalog.get("h100-80g-x1").chip
NPU = catalog.get("910b3-x1").chip


def cost(model: str = "Qwen/Qwen3-8B", chip: catalog.ChipSpec = A100, **kw: object) -> perfmodel.CostModel:
    return perfmodel.build_cost_model(models.lookup(model), chip, Knobs(**kw))  # type: ignore[arg-type]


def plan(model: str, chip: catalog.ChipSpec = A100, **kw: object) -> perfmodel.MemoryPlan:
    return perfmodel.memory_plan(models.lookup(model), chip, Knobs(**kw))  # type: ignore[arg-type]


# models ---------------------------------------------------------------------------------------


def test_model_lookup_by_id_name_path_and_quant_suffix() -> None:
    assert models.lookup("Qwen/Qwen3-32B").layers == 64
    assert models.lookup("qwen3-30b-a3b").is_moe
    assert models.lookup("/model/Qwen3-32B-W8A8").quant == "w8a8"
    assert models.lookup("vllm-ascend/Qwen3-8B-W8A8").name == "Qwen/Qwen3-8B"
    assert models.lookup("Qwen/Qwen3-235B-A22B-Instruct-2507-FP8").context_len == 262144
    assert models.lookup("Qwen/Qwen3-32B-AWQ").quant == "awq"
    moe = models.lookup("Qwen/Qwen3-235B-A22B")
    assert moe.active_params_b == 22.0 and moe.params_b == 235.0 and moe.context_len == 40960
    with pytest.raises(models.UnknownModel) as err:
        models.lookup("meta-llama/Llama-9-1T")
    assert "meta-llama/Llama-9-1T is not a local folder and is not a valid model identifier" in err.value.hf_message


# step costs -----------------------------------------------------------------------------------


def test_step_time_grows_with_every_kind_of_work() -> None:
    c = cost()
    base = c.step_time(StepShape(decode_seqs=8, decode_context=8 * 500))
    assert c.step_time(StepShape(decode_seqs=8, decode_context=8 * 5000)) > base  # more KV read
    assert c.step_time(StepShape(decode_seqs=400, decode_context=8 * 500)) > base  # compute bound
    assert c.step_time(StepShape(decode_seqs=8, decode_context=8 * 500, prefill_tokens=4096)) > base
    assert c.step_time(StepShape()) == 0.0
    # decode of a small batch is memory bound: reading 16 GB of weights dominates
    weights_s = models.lookup("Qwen/Qwen3-8B").params_b * 2e9 / (A100.hbm_gbps * 1e9 * A100.hbm_efficiency)
    assert base == pytest.approx(weights_s, rel=0.1)
    slow = cost(efficiency=0.5).step_time(StepShape(decode_seqs=8, decode_context=4000))
    assert slow > 1.8 * base


def test_tensor_parallelism_divides_weights_and_adds_all_reduce() -> None:
    shape = StepShape(decode_seqs=64, decode_context=64 * 1000)
    one = cost("Qwen/Qwen3-32B", tp=1)
    four = cost("Qwen/Qwen3-32B", tp=4)
    assert four.dense_read_s == pytest.approx(one.dense_read_s / 4)
    assert four.comm_s_per_step > 0 and one.comm_s_per_step == 0
    assert one.step_time(shape) / 4 < four.step_time(shape) < one.step_time(shape)


def test_moe_computes_active_params_and_reads_more_experts_with_bigger_batches() -> None:
    moe = cost("Qwen/Qwen3-30B-A3B")
    dense = cost("Qwen/Qwen3-32B")
    assert moe.prefill_s_per_token < dense.prefill_s_per_token / 5
    assert perfmodel.expert_fraction(1, 128, 8) == pytest.approx(8 / 128)
    assert perfmodel.expert_fraction(256, 128, 8) > 0.99
    small = moe.step_time(StepShape(decode_seqs=1, decode_context=100))
    large = moe.step_time(StepShape(decode_seqs=64, decode_context=6400))
    assert large > 3 * small  # a dense model's step barely changes: same weights either way
    assert dense.step_time(StepShape(decode_seqs=64, decode_context=6400)) < 1.5 * dense.step_time(
        StepShape(decode_seqs=1, decode_context=100)
    )


def test_quantization_bytes_and_compute() -> None:
    assert perfmodel.bytes_per_param(None) == 2.0
    assert perfmodel.bytes_per_param("fp8") == perfmodel.bytes_per_param("w8a8") == 1.0
    assert perfmodel.bytes_per_param("awq") < 0.6
    # FP8 tensor cores on H100, weight-only (no faster math) on A100 and 910B
    assert perfmodel.compute_tflops(H100, "fp8") == H100.fp8_tflops
    assert perfmodel.compute_tflops(A100, "fp8") < A100.bf16_tflops
    assert perfmodel.compute_tflops(NPU, "w8a8") > NPU.bf16_tflops
    bf16, fp8 = cost("Qwen/Qwen3-32B", H100), cost("Qwen/Qwen3-32B-FP8", H100, quant="fp8")
    assert fp8.dense_read_s == pytest.approx(bf16.dense_read_s / 2)
    assert fp8.prefill_s_per_token < bf16.prefill_s_per_token
    a100_fp8 = cost("Qwen/Qwen3-32B-FP8", A100, quant="fp8")
    assert a100_fp8.prefill_s_per_token > cost("Qwen/Qwen3-32B", A100).prefill_s_per_token


# memory ---------------------------------------------------------------------------------------


def test_kv_capacity_from_memory_budget() -> None:
    p = plan("Qwen/Qwen3-32B", max_model_len=32768)
    assert p.weights_gib == pytest.approx(32.8e9 * 2 / 2**30)
    assert p.kv_bytes_per_token == 64 * 2 * 8 * 128 * 2  # layers x K,V x kv heads x head dim x bf16
    assert p.kv_capacity_tokens == pytest.approx(p.kv_gib * 2**30 / p.kv_bytes_per_token, abs=16)
    # the seed's reason for --max-model-len 32768: the native 40960 does not fit one A100
    assert p.fits and p.max_len_fits
    assert not plan("Qwen/Qwen3-32B").max_len_fits
    assert plan("Qwen/Qwen3-32B", kv_cache_dtype="fp8").kv_capacity_tokens > 1.9 * p.kv_capacity_tokens
    assert plan("Qwen/Qwen3-32B-AWQ", quant="awq").kv_capacity_tokens > 4 * p.kv_capacity_tokens
    assert plan("Qwen/Qwen3-32B", mem_fraction=0.95).kv_capacity_tokens > p.kv_capacity_tokens
    big = plan("Qwen/Qwen3-235B-A22B")
    assert not big.fits and "more than" in big.reason()
    assert plan("Qwen/Qwen3-235B-A22B", tp=8).fits
    # hybrid attention: only 8 of Qwen3.5-9B's 32 layers keep KV
    assert plan("Qwen/Qwen3.5-9B", H100).kv_bytes_per_token == 8 * 2 * 4 * 256 * 2


# scheduler ------------------------------------------------------------------------------------


def _sched(capacity: int = 10**6, **kw: object) -> Scheduler:
    knobs = Knobs(**kw)  # type: ignore[arg-type]
    return Scheduler(perfmodel.build_cost_model(models.lookup("Qwen/Qwen3-8B"), A100, knobs), knobs, capacity)


def test_step_budgets_max_num_seqs_and_batched_tokens() -> None:
    s = _sched(max_num_seqs=4, max_batched_tokens=1000)
    for _ in range(10):
        s.add(SimRequest(300, 5))
    first = s.step()
    assert first is not None
    assert first.running == 4 and first.waiting == 6
    assert first.shape.prefill_tokens <= 1000  # 300 + 300 + 300 + 100 (chunked)
    assert first.shape.prefill_tokens == 1000
    while (r := s.step()) is not None:
        assert r.running <= 4
        assert r.shape.prefill_tokens + r.shape.decode_seqs <= 1000


def test_chunked_prefill_splits_long_prompts_and_unchunked_waits_for_a_whole_step() -> None:
    chunked = _sched(max_batched_tokens=2048)
    chunked.add(SimRequest(5000, 3))
    sizes = [chunked.step().shape.prefill_tokens for _ in range(3)]  # type: ignore[union-attr]
    assert sizes == [2048, 2048, 904]
    whole = _sched(max_batched_tokens=2048, chunked_prefill=False)
    whole.add(SimRequest(100, 50))
    whole.add(SimRequest(5000, 3))
    first = whole.step()
    assert first is not None and first.shape.prefill_tokens == 100  # the long prompt waits...
    second = whole.step()
    assert second is not None and second.shape.prefill_tokens == 0 and second.waiting == 1


def test_requests_queue_when_kv_cache_is_full_and_get_preempted_when_it_runs_out() -> None:
    s = _sched(capacity=16 * 64)  # 64 blocks of 16 tokens
    for _ in range(8):
        s.add(SimRequest(200, 200))  # 13 blocks each to start, 25 at the end
    first = s.step()
    assert first is not None and first.running == 4 and first.waiting == 4
    preempted = 0
    done = 0
    while (r := s.step()) is not None:
        preempted += r.preempted
        done += sum(1 for _, _, fin in r.emitted if fin)
        assert s.free_blocks >= 0
    assert done == 8 and preempted > 0


def run_all(s: Scheduler, max_steps: int = 20000) -> list[tuple[int, int, int]]:
    """Step ``s`` until idle; (prefill tokens, decode seqs, preempted) per step."""
    steps = []
    while (r := s.step()) is not None:
        steps.append((r.shape.prefill_tokens, r.shape.decode_seqs, r.preempted))
        assert len(steps) < max_steps, "the scheduler does not get through the work (thrashing?)"
    return steps


def test_long_prompts_that_barely_fit_do_not_thrash() -> None:
    """Seed 002's 32000/100 on one A100, scaled: room for one request and a bit. The oldest
    keeps decoding; the next prefills what fits, then waits (vLLM V1), and with prefix
    caching comes back to its cached blocks instead of recomputing them."""
    prompt, out, n = 2000, 100, 4
    for prefix_caching in (True, False):
        s = _sched(capacity=2400, max_batched_tokens=512, prefix_caching=prefix_caching)
        reqs = [SimRequest(prompt, out) for _ in range(n)]
        for r in reqs:
            s.add(r)
        steps = run_all(s)
        assert all(r.generated == out and r.finished_at is not None for r in reqs)
        finished = sorted(reqs, key=lambda r: r.finished_at or 0.0)
        assert finished == reqs  # first come, first served: nobody overtakes the oldest
        assert all(r.preemptions == 0 for r in reqs[:1])  # the oldest is never pushed out
        computed = sum(p for p, _, _ in steps)
        # without a prefix cache a preempted newcomer recomputes its chunks; never whole requests
        limit = n * prompt + (0 if prefix_caching else n * 2 * 512) + n * 16 * 4
        assert computed <= limit, (prefix_caching, computed)
        decode_steps = [d for p, d, _ in steps if d]
        assert len(decode_steps) <= n * out  # every decode step advances someone


def test_no_admission_in_a_step_that_preempted() -> None:
    s = _sched(capacity=16 * 8)  # 8 blocks
    a, b, c = SimRequest(60, 200), SimRequest(60, 200), SimRequest(10, 5)
    for r in (a, b):
        s.add(r)
    s.step()  # a and b prefilled: 4 blocks each, the cache is full
    s.add(c)
    seen = False
    while (r := s.step()) is not None and not seen:
        if r.preempted:
            seen = True
            assert c in s.waiting and b in s.waiting and a in s.running  # b (newest) went, c waited
    assert seen


def test_guaranteed_no_evict_reserves_whole_requests_and_never_preempts() -> None:
    s = _sched(capacity=16 * 100, capacity_policy="guaranteed_no_evict", max_model_len=4096)
    reqs = [SimRequest(500, 300, max_output=300) for _ in range(5)]  # 50 blocks each when done
    for r in reqs:
        s.add(r)
    first = s.step()
    assert first is not None and first.running == 2 and first.waiting == 3  # 2 x 50 blocks reserved
    assert s.kv_usage == pytest.approx(1.0)
    steps = run_all(s)
    assert all(p == 0 for _, _, p in steps) and all(r.preemptions == 0 for r in reqs)
    assert all(r.generated == 300 for r in reqs)
    # early EOS: the reservation (max_tokens) is what counts, not where it stops
    s = _sched(capacity=16 * 100, capacity_policy="guaranteed_no_evict")
    for _ in range(3):
        s.add(SimRequest(500, 10, max_output=1100))  # 100 blocks reserved each
    assert s.step().running == 1  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="unknown capacity policy"):
        _sched(capacity_policy="lru")


def test_prefix_cache_hits_skip_prefill() -> None:
    text = " ".join(f"w{i}" for i in range(320))
    hashes = tokenizer.block_hashes(text, 16)
    assert len(hashes) == 20
    s = _sched(prefix_caching=True)
    s.add(SimRequest(320, 2, block_hashes=hashes))
    computed = []
    while (r := s.step()) is not None:
        computed.append(r.shape.prefill_tokens)
    s.add(SimRequest(320, 2, block_hashes=hashes))
    again = s.step()
    assert again is not None and again.shape.prefill_tokens == 320 - 19 * 16  # all but the last block
    assert s.prefix_hit_rate == pytest.approx(19 * 16 / 640)
    off = _sched(prefix_caching=False)
    off.add(SimRequest(320, 2, block_hashes=hashes))
    assert off.step().shape.prefill_tokens == 320  # type: ignore[union-attr]


def test_speculative_decoding_emits_several_tokens_per_step() -> None:
    assert perfmodel.expected_tokens_per_step(0, 0.8) == 1.0
    assert perfmodel.expected_tokens_per_step(4, 1.0) == 5.0
    assert perfmodel.expected_tokens_per_step(4, 0.5) == pytest.approx(1 + 0.5 + 0.25 + 0.125 + 0.0625)
    s = _sched(spec_method="mtp", spec_tokens=3, spec_acceptance=1.0)
    s.add(SimRequest(10, 13))
    emitted = []
    while (r := s.step()) is not None:
        emitted += [n for _, n, _ in r.emitted]
    assert emitted == [1, 4, 4, 4]
    # at low concurrency (memory bound) speculation shortens the run
    load = [(0.0, 200, 300)] * 4
    plain = simulate(load, cost(), Knobs(), 10**6)
    spec_knobs = Knobs(spec_method="mtp", spec_tokens=3)
    spec = simulate(load, cost(spec_method="mtp", spec_tokens=3), spec_knobs, 10**6)
    assert spec.output_tokens == plain.output_tokens == 1200
    assert spec.duration < 0.6 * plain.duration


def test_simulation_is_deterministic_and_accounts_every_token() -> None:
    load = calibrate.sharegpt_like(200, seed=3)
    a = calibrate.run_case(calibrate.CASES[0], load)
    b = calibrate.run_case(calibrate.CASES[0], load)
    assert a == b
    assert a.requests == 200
    assert a.input_tokens == sum(p for _, p, _ in load) and a.output_tokens == sum(o for _, _, o in load)
    limited = calibrate.run_case(calibrate.CASES[0], load, max_concurrency=4)
    assert limited.mean_ttft < a.mean_ttft and limited.duration > a.duration


# calibration against the seeds ----------------------------------------------------------------


@pytest.fixture(scope="module")
def seeds_sim() -> dict[str, float]:
    """Total token throughput of every calibration case on the seeds' 1000-request ShareGPT load."""
    load = calibrate.sharegpt_like()
    return {c.label: calibrate.run_case(c, load).total_token_throughput for c in calibrate.CASES}


def test_engine_rankings_follow_the_seeds(seeds_sim: dict[str, float]) -> None:
    tps = seeds_sim
    # seed 002 (A100, Qwen3-32B): TensorRT-LLM > vLLM > SGLang; AWQ > BF16 > FP8 on vLLM
    assert tps["A100 Qwen3-32B TensorRT-LLM"] > tps["A100 Qwen3-32B vLLM"] > tps["A100 Qwen3-32B SGLang"]
    assert tps["A100 Qwen3-32B-AWQ vLLM"] > tps["A100 Qwen3-32B vLLM"] > tps["A100 Qwen3-32B-FP8 vLLM"]
    # seed 001 (8 x A100, Qwen3-235B-A22B): TP8 BF16 ahead of one TP4 FP8 instance
    assert tps["8xA100 Qwen3-235B-A22B-2507 vLLM tp8"] > tps["8xA100 Qwen3-235B-A22B-2507-FP8 vLLM tp4"]
    # seed 000 (910B, Qwen3-30B-A3B): MindIE well ahead of vLLM-Ascend
    assert tps["910B Qwen3-30B-A3B MindIE tp2"] > 2.5 * tps["910B Qwen3-30B-A3B vLLM-Ascend tp2"]


@pytest.mark.parametrize("case", calibrate.CASES, ids=lambda c: c.label)
def test_magnitudes_match_the_seeds(case: calibrate.Case, seeds_sim: dict[str, float]) -> None:
    assert case.seed_total_tps is not None
    assert 0.5 < seeds_sim[case.label] / case.seed_total_tps < 2.0
