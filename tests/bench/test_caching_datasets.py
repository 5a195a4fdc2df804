"""Workloads that show caching: shared prefixes and multi-turn conversations (issue #12 item 5),
from the dataset to the plan's profile keys and the ``perflab bench`` flags."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import pytest

from perflab.bench.datasets import build_samples
from perflab.bench.request import BenchRequest
from perflab.bench.tokenizer import WhitespaceTokenizer
from perflab.contract.errors import UsageError
from perflab.lab.plan import Profile, load_plan_text


def req(**kw: Any) -> BenchRequest:
    return BenchRequest(base_urls=("http://127.0.0.1:1",), model="m", **kw)


def words(text: str) -> list[str]:
    return text.split()


def test_prefix_repetition_shares_each_prefix_among_its_prompts() -> None:
    samples = build_samples(req(dataset="prefix-repetition", num_prompts=42, prefix_repetition_prefix_len=32,
                                prefix_repetition_suffix_len=16, prefix_repetition_num_prefixes=4,
                                prefix_repetition_output_len=8), WhitespaceTokenizer())
    assert len(samples) == 42 and all(s.prompt_len == 48 == len(words(s.prompt)) and s.output_len == 8 for s in samples)
    prefixes = Counter(" ".join(words(s.prompt)[:32]) for s in samples)
    assert sorted(prefixes.values()) == [10, 10, 11, 11]  # every prompt shares one of 4 prefixes
    assert len({" ".join(words(s.prompt)[32:]) for s in samples}) == 42  # and has its own suffix
    assert 32 / 48 == pytest.approx(2 / 3)  # the shared share of each prompt


def test_random_with_a_shared_prefix() -> None:
    samples = build_samples(req(dataset="random", num_prompts=5, random_input_len=20, random_prefix_len=12, random_output_len=4),
                            WhitespaceTokenizer())
    assert len({" ".join(words(s.prompt)[:12]) for s in samples}) == 1
    assert all(s.prompt_len == 32 == len(words(s.prompt)) for s in samples)


def test_multi_turn_prompts_grow_by_the_conversation_so_far() -> None:
    samples = build_samples(req(dataset="multi-turn", num_prompts=10, multi_turn_turns=3, multi_turn_input_len=20,
                                multi_turn_output_len=6), WhitespaceTokenizer())
    assert len(samples) == 10  # 4 conversations: 4 first turns, 4 second, 2 third
    lens = [s.prompt_len for s in samples]
    assert lens == [20] * 4 + [46] * 4 + [72] * 2  # + the previous answer (6) and a new message (20) a turn
    assert all(s.prompt_len == len(words(s.prompt)) and s.output_len == 6 for s in samples)
    for c in range(4):
        turns = [samples[c + 4 * t].prompt for t in range(3) if c + 4 * t < 10]
        for before, after in zip(turns, turns[1:]):
            assert after.startswith(before + "\n")  # the conversation so far is the next prompt's prefix
    assert len({s.prompt for s in samples[:4]}) == 4  # the conversations differ
    again = build_samples(req(dataset="multi-turn", num_prompts=10, multi_turn_turns=3, multi_turn_input_len=20,
                              multi_turn_output_len=6), WhitespaceTokenizer())
    assert again == samples  # deterministic per seed


def test_multi_turn_lengths_are_validated() -> None:
    with pytest.raises(UsageError, match="--multi-turn-turns 0"):
        req(dataset="multi-turn", multi_turn_turns=0).validate()


PLAN = """
name: caching
model: {id: Qwen/Qwen3-8B}
hardware: sim:h100-80g-x1
engines: [vllm]
baseline: {engine: vllm}
profiles:
  main: {input_len: 128, output_len: 16, num_prompts: 10}
  shared: {dataset: prefix-repetition, prefix_len: 1024, num_prefixes: 4, input_len: 64, output_len: 32, num_prompts: 100}
  system: {prefix_len: 512, input_len: 64, output_len: 32, num_prompts: 50}
  chat: {dataset: multi-turn, turns: 5, input_len: 128, output_len: 64, num_prompts: 100, max_concurrency: 8}
"""


def test_plan_profiles_take_the_caching_workloads() -> None:
    plan = load_plan_text(PLAN)
    p = {x.name: x for x in plan.profiles}
    r = p["shared"].bench_request("m")
    assert (r.dataset, r.prefix_repetition_prefix_len, r.prefix_repetition_num_prefixes, r.prefix_repetition_suffix_len,
            r.prefix_repetition_output_len) == ("prefix-repetition", 1024, 4, 64, 32)
    r = p["system"].bench_request("m")
    assert (r.dataset, r.random_prefix_len, r.random_input_len) == ("random", 512, 64)
    r = p["chat"].bench_request("m")
    assert (r.dataset, r.multi_turn_turns, r.multi_turn_input_len, r.multi_turn_output_len) == ("multi-turn", 5, 128, 64)
    assert "5-turn conversations" in p["chat"].describe() and "4 shared 1024-token prefixes" in p["shared"].describe()
    assert p["chat"].bench_command("m").startswith("# vllm bench serve has no multi-turn dataset")
    assert "--dataset-name prefix_repetition" in p["shared"].bench_command("m")
    # the keys appear in a definition only when set: earlier plans' profiles keep their keys (and stored results)
    old = Profile(name="main", label="main", input_len=128, output_len=16, num_prompts=10)
    assert p["main"].definition() == old.definition() and "turns" not in old.definition()
    assert p["chat"].definition()["turns"] == 5 and p["shared"].key() != p["system"].key()


@pytest.mark.parametrize(("profile", "message"), [
    ("{dataset: multi-turn, input_len: 8, output_len: 8}", "profiles.x.turns: missing"),
    ("{dataset: prefix-repetition, input_len: 8, output_len: 8}", "profiles.x.prefix_len: missing"),
    ("{input_len: 8, output_len: 8, turns: 3}", "profiles.x.turns: only for dataset multi-turn"),
    ("{dataset: synthetic-sharegpt, num_prefixes: 3}", "profiles.x.num_prefixes: only for dataset prefix-repetition"),
    ("{dataset: multi-turn, turns: 0, input_len: 8, output_len: 8}", "profiles.x.turns"),
    ("{dataset: prefix-repetition, prefix_len: 8, input_len: 8, output_len: 8, num_prompts: 5}",
     "profiles.x.num_prompts: 5 is fewer than num_prefixes 10"),
])
def test_plan_refuses_caching_keys_that_do_not_fit(profile: str, message: str) -> None:
    text = PLAN.split("profiles:")[0] + f"profiles:\n  x: {profile}\n"
    with pytest.raises(UsageError, match=message.replace(".", r"\.")):
        load_plan_text(text)


def test_perflab_bench_flags_reach_the_request(monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    import perflab.bench as bench
    from perflab.cli.bench_cmd import bench as bench_cli

    seen: list[BenchRequest] = []

    def fake_run(r: BenchRequest, progress: Any = None, cancel: threading.Event | None = None) -> Any:
        seen.append(r)
        raise UsageError("stop here")

    monkeypatch.setattr(bench, "run_benchmark_sync", fake_run)
    out = CliRunner().invoke(bench_cli, ["--base-url", "http://127.0.0.1:1", "--model", "m", "--dataset", "multi-turn",
                                         "--multi-turn-turns", "6", "--multi-turn-input-len", "40",
                                         "--multi-turn-output-len", "30", "--num-prompts", "12"])
    assert isinstance(out.exception, UsageError), out.output
    (r,) = seen
    assert (r.dataset, r.multi_turn_turns, r.multi_turn_input_len, r.multi_turn_output_len, r.num_prompts) == (
        "multi-turn", 6, 40, 30, 12)
