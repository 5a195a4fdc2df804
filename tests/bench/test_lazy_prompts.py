"""Prompts are generated lazily and absurd prompt counts are refused in one line."""

from __future__ import annotations

import itertools
import tracemalloc
import types

import pytest

from perflab.bench import BenchRequest, run_benchmark_sync
from perflab.bench.datasets import check_memory, iter_samples
from perflab.bench.request import MAX_NUM_PROMPTS
from perflab.bench.tokenizer import WhitespaceTokenizer
from perflab.contract.errors import UsageError


def _req(**kw: object) -> BenchRequest:
    return BenchRequest(base_urls=("http://127.0.0.1:9",), model="m", **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("dataset", ["random", "synthetic-sharegpt"])
def test_prompts_are_generated_one_at_a_time(dataset: str) -> None:
    req = _req(dataset=dataset, num_prompts=MAX_NUM_PROMPTS, random_input_len=64)
    tracemalloc.start()
    try:
        it = iter_samples(req, WhitespaceTokenizer())
        first = list(itertools.islice(it, 3))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert isinstance(it, types.GeneratorType)
    assert len(first) == 3
    assert peak < 1 << 20  # ten million prompts asked, three made: well under a MiB


def test_absurd_prompt_counts_are_refused_in_one_line() -> None:
    with pytest.raises(UsageError) as exc:
        _req(num_prompts=10**12).validate()
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith("--num-prompts 1000000000000: more than perflab runs in one benchmark")


def test_the_runner_refuses_before_contacting_the_server() -> None:
    # port 9 (discard) on loopback: a refused connection would be a PerflabError, not a UsageError
    with pytest.raises(UsageError, match="--num-prompts 1000000000000"):
        run_benchmark_sync(_req(num_prompts=10**12))


def test_memory_estimate_refuses_what_would_not_fit() -> None:
    req = _req(num_prompts=1_000_000, random_input_len=32000)  # ~256 GB of encoded prompts
    with pytest.raises(UsageError) as exc:
        check_memory(req, available=16 << 30)
    assert "\n" not in str(exc.value) and "GiB" in str(exc.value) and "16.0 GiB of memory available" in str(exc.value)
    check_memory(req.replace(num_prompts=1000), available=16 << 30)  # 256 MB: fine


def test_a_local_model_without_a_tokenizer_is_counted_approximately_out_loud(tmp_path, capsys) -> None:
    from perflab.bench.tokenizer import ApproxTokenizer, load_tokenizer

    gguf = tmp_path / "tiny.gguf"
    gguf.write_bytes(b"GGUF")
    tok = load_tokenizer(None, model=str(gguf))
    assert isinstance(tok, ApproxTokenizer)
    err = capsys.readouterr().err
    assert "approximate" in err and str(gguf) in err
    # a hub id (nothing local) stays quiet: nothing is downloaded, and nothing to warn about
    load_tokenizer(None, model="Qwen/Qwen3-8B")
    assert capsys.readouterr().err == ""
