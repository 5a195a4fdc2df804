"""Datasets, tokenizers and arrival times: exact lengths, vLLM's filters, seeds."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest

from perflab.bench.datasets import build_samples, is_valid_sequence
from perflab.bench.profiles import PROFILES, apply_profile
from perflab.bench.request import BenchRequest
from perflab.bench.schedule import arrival_offsets
from perflab.bench.tokenizer import (
    ApproxTokenizer,
    HFTokenizer,
    WhitespaceTokenizer,
    load_tokenizer,
)
from perflab.contract.errors import UsageError

DATA = Path(__file__).parent / "data"
SHAREGPT = DATA / "sharegpt_small.json"
VALID_IDS = 8  # entries of the fixture that pass vLLM's ShareGPT filter


def req(**kw: object) -> BenchRequest:
    kw.setdefault("base_urls", ("http://127.0.0.1:1",))
    kw.setdefault("model", "m")
    return BenchRequest(**kw)  # type: ignore[arg-type]


def sim_count(prompt: str) -> int:
    """perflab's simulated engines' count (perflab_sim.tokenizer): whitespace words."""
    return max(1, len(prompt.split()))


# --------------------------------------------------------------------------- random


def test_random_prompts_are_exactly_n_simulator_tokens() -> None:
    samples = build_samples(req(num_prompts=200, random_input_len=128, random_output_len=16), WhitespaceTokenizer())
    assert len(samples) == 200
    assert all(s.prompt_len == 128 and sim_count(s.prompt) == 128 and s.output_len == 16 for s in samples)
    assert len({s.prompt for s in samples}) == 200  # distinct prompts: no accidental prefix-cache hits


def test_random_is_deterministic_per_seed() -> None:
    a = build_samples(req(num_prompts=5, random_input_len=20, seed=1), WhitespaceTokenizer())
    b = build_samples(req(num_prompts=5, random_input_len=20, seed=1), WhitespaceTokenizer())
    c = build_samples(req(num_prompts=5, random_input_len=20, seed=2), WhitespaceTokenizer())
    assert a == b and a != c


def test_range_ratio_bounds() -> None:
    samples = build_samples(req(num_prompts=300, random_input_len=100, random_output_len=10, random_range_ratio=0.5), WhitespaceTokenizer())
    ins = [s.prompt_len for s in samples]
    outs = [s.output_len for s in samples]
    assert min(ins) >= 50 and max(ins) <= 150 and len(set(ins)) > 30
    assert min(outs) >= 5 and max(outs) <= 15
    assert all(sim_count(s.prompt) == s.prompt_len for s in samples)


def test_random_prefix_is_shared() -> None:
    samples = build_samples(req(num_prompts=4, random_input_len=10, random_prefix_len=30), WhitespaceTokenizer())
    prefixes = {" ".join(s.prompt.split()[:30]) for s in samples}
    assert len(prefixes) == 1
    assert all(s.prompt_len == 40 == sim_count(s.prompt) for s in samples)


def test_approx_tokenizer_prompts_are_common_words() -> None:
    tok = ApproxTokenizer()
    (s,) = build_samples(req(num_prompts=1, random_input_len=64), tok)
    assert s.prompt_len == 64 and len(s.prompt.split()) == 64
    assert tok.count("Hello, world! It's 2024.") == 8  # Hello , world ! It 's 2024 .
    assert not tok.exact


# --------------------------------------------------------------------------- HF tokenizer


@pytest.fixture(scope="module")
def bpe_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small byte-level BPE trained here (nothing is downloaded)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<s>", "</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    corpus = ["the quick brown fox jumps over the lazy dog", "benchmarking language models is useful", "hello world"] * 30
    tok.train_from_iterator(corpus, trainer)
    model_dir = tmp_path_factory.mktemp("model")
    tok.save(str(model_dir / "tokenizer.json"))
    return model_dir


def test_hf_tokenizer_gives_exact_lengths(bpe_tokenizer: Path) -> None:
    tok = load_tokenizer(str(bpe_tokenizer / "tokenizer.json"))
    assert isinstance(tok, HFTokenizer) and tok.exact
    rng = random.Random(0)
    for n in [1, 2, 3, 5, 8, 17, 128, 1000]:
        for _ in range(5):
            text, count = tok.random_text(rng, n)
            assert count == n and tok.count(text) == n, (n, text)
    samples = build_samples(req(num_prompts=20, random_input_len=64, random_range_ratio=0.3), tok)
    assert all(tok.count(s.prompt) == s.prompt_len for s in samples)


def test_model_directory_provides_the_tokenizer(bpe_tokenizer: Path) -> None:
    assert load_tokenizer(None, model=str(bpe_tokenizer)).kind == "hf"
    assert load_tokenizer(None, model=str(bpe_tokenizer), simulated=True).kind == "whitespace"
    assert load_tokenizer(None, model="Qwen/Qwen3-8B").kind == "approx"  # a hub id: never downloaded
    assert load_tokenizer(str(bpe_tokenizer)).kind == "hf"
    with pytest.raises(UsageError, match="tokenizer.json"):
        load_tokenizer("/nonexistent/tokenizer")


# --------------------------------------------------------------------------- ShareGPT


def test_sharegpt_filter_matches_vllm() -> None:
    assert is_valid_sequence(4, 4) and not is_valid_sequence(3, 100) and not is_valid_sequence(10, 3)
    assert not is_valid_sequence(1025, 10) and not is_valid_sequence(1000, 1049) and is_valid_sequence(1024, 1024)
    assert is_valid_sequence(10, 1, skip_min_output_len_check=True)


def test_sharegpt_from_local_file() -> None:
    tok = WhitespaceTokenizer()
    samples = build_samples(req(dataset="sharegpt", dataset_path=str(SHAREGPT), num_prompts=VALID_IDS), tok)
    assert len(samples) == VALID_IDS
    assert all(is_valid_sequence(s.prompt_len, s.output_len) for s in samples)
    assert all(s.prompt_len == sim_count(s.prompt) for s in samples)
    assert "follow up ignored" not in {s.prompt for s in samples}  # only the first two turns
    # the seed shuffles like vLLM (random.seed + shuffle) and is reproducible
    again = build_samples(req(dataset="sharegpt", dataset_path=str(SHAREGPT), num_prompts=VALID_IDS), tok)
    other = build_samples(req(dataset="sharegpt", dataset_path=str(SHAREGPT), num_prompts=VALID_IDS, seed=3), tok)
    assert again == samples and [s.prompt for s in other] != [s.prompt for s in samples]


def test_sharegpt_oversamples_and_fixed_output_len() -> None:
    tok = WhitespaceTokenizer()
    samples = build_samples(req(dataset="sharegpt", dataset_path=str(SHAREGPT), num_prompts=20), tok)
    assert len(samples) == 20 and len({s.prompt for s in samples}) == VALID_IDS
    fixed = build_samples(req(dataset="sharegpt", dataset_path=str(SHAREGPT), num_prompts=50, sharegpt_output_len=7), tok)
    assert {s.output_len for s in fixed} == {7}
    # with a fixed output, "output-too-short" passes (vLLM skips that check) and so does
    # "total-too-long" (1000 + 7 <= 2048)
    assert len({s.prompt for s in fixed}) == VALID_IDS + 2


def test_sharegpt_errors_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="no such file"):
        build_samples(req(dataset="sharegpt", dataset_path=str(tmp_path / "missing.json")), WhitespaceTokenizer())
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(UsageError, match="not valid JSON"):
        build_samples(req(dataset="sharegpt", dataset_path=str(bad)), WhitespaceTokenizer())
    empty = tmp_path / "empty.json"
    empty.write_text('[{"conversations": [{"value": "a"}, {"value": "b"}]}]')
    with pytest.raises(UsageError, match="filter"):
        build_samples(req(dataset="sharegpt", dataset_path=str(empty)), WhitespaceTokenizer())
    with pytest.raises(UsageError, match="dataset-path"):
        req(dataset="sharegpt").validate()


def test_synthetic_sharegpt() -> None:
    samples = build_samples(req(dataset="synthetic-sharegpt", num_prompts=1000), WhitespaceTokenizer())
    assert len(samples) == 1000 and all(is_valid_sequence(s.prompt_len, s.output_len) for s in samples)
    mean_in = sum(s.prompt_len for s in samples) / 1000
    mean_out = sum(s.output_len for s in samples) / 1000
    assert 150 < mean_in < 260 and 150 < mean_out < 240  # near the seeds' 217 / 202
    assert all(sim_count(s.prompt) == s.prompt_len for s in samples)


# --------------------------------------------------------------------------- prefix repetition


def test_prefix_repetition() -> None:
    r = req(dataset="prefix-repetition", num_prompts=23, prefix_repetition_prefix_len=40, prefix_repetition_suffix_len=8,
            prefix_repetition_num_prefixes=5, prefix_repetition_output_len=9)
    samples = build_samples(r, WhitespaceTokenizer())
    assert len(samples) == 23  # vLLM would drop the remainder (20); perflab sends what was asked
    assert all(s.prompt_len == 48 == sim_count(s.prompt) and s.output_len == 9 for s in samples)
    prefixes = [" ".join(s.prompt.split()[:40]) for s in samples]
    counts = sorted(prefixes.count(p) for p in set(prefixes))
    assert counts == [4, 4, 5, 5, 5]
    with pytest.raises(UsageError, match="at least"):
        build_samples(r.replace(num_prompts=3), WhitespaceTokenizer())


# --------------------------------------------------------------------------- arrivals


def test_arrivals_inf_rate_all_at_once() -> None:
    assert arrival_offsets(5, math.inf) == [0.0] * 5


def test_arrivals_are_rescaled_to_n_over_rate() -> None:
    for burstiness in (0.5, 1.0, 3.0):
        offs = arrival_offsets(200, 10.0, burstiness, seed=1)
        assert offs == sorted(offs) and offs[-1] == pytest.approx(20.0)
    assert arrival_offsets(4, 2.0, math.inf) == pytest.approx([0.5, 1.0, 1.5, 2.0])
    assert arrival_offsets(50, 5.0, 1.0, seed=3) == arrival_offsets(50, 5.0, 1.0, seed=3)


def test_burstiness_changes_the_spread() -> None:
    def cv(offs: list[float]) -> float:
        gaps = [b - a for a, b in zip([0.0, *offs], offs, strict=False)]
        m = sum(gaps) / len(gaps)
        return math.sqrt(sum((g - m) ** 2 for g in gaps) / len(gaps)) / m

    bursty, poisson, regular = (cv(arrival_offsets(4000, 10.0, b, seed=0)) for b in (0.25, 1.0, 16.0))
    # gamma with shape k: coefficient of variation 1/sqrt(k)
    assert bursty == pytest.approx(2.0, rel=0.15) and poisson == pytest.approx(1.0, rel=0.1) and regular == pytest.approx(0.25, rel=0.1)


# --------------------------------------------------------------------------- profiles


def test_seed_profiles() -> None:
    assert {"sharegpt", "throughput", "long-context", "generation-heavy"} <= set(PROFILES)
    assert {"random-128-4", "random-2000-100", "random-4000-200", "random-32000-100"} <= set(PROFILES)
    r = apply_profile(req(profile="long-context"))
    assert (r.random_input_len, r.random_output_len, r.num_prompts, r.request_rate, r.seed) == (32000, 100, 100, 1.0, 42)
    r = apply_profile(req(profile="throughput", num_prompts=10))  # explicit value kept
    assert (r.random_input_len, r.num_prompts, r.max_concurrency) == (1024, 10, 512)
    r = apply_profile(req(profile="random-128-4"), explicit={"seed"})
    assert r.seed == 0 and r.num_prompts == 1000 and math.isinf(r.request_rate)
    with pytest.raises(UsageError, match="expected one of"):
        apply_profile(req(profile="nope"))
