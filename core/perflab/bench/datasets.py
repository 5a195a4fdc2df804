"""Benchmark datasets, built before the timed run (tokenization never runs while timing).

Prompts are generated lazily: :func:`iter_samples` yields them one at a time, so the runner
holds only the encoded requests it will send, never a second list of prompt texts; the
number of prompts is bounded (``BenchRequest.validate``, :func:`check_memory`) before any
is made — a plan asking for ``10**12`` prompts is refused in one line, not by the OOM killer.

Follows ``vllm bench serve``'s datasets (vllm/benchmarks/datasets.py):

``random``
    ``--num-prompts`` prompts; input and output lengths drawn uniformly from
    ``[floor(L·(1−r)), ceil(L·(1+r))]`` with ``r = --random-range-ratio`` (0: exact lengths);
    an optional shared random prefix of ``--random-prefix-len`` tokens.
``sharegpt``
    A local ShareGPT JSON (``[{"conversations": [{"from": "human", "value": ...}, ...]}]``):
    entries with at least two turns, shuffled with the seed; the first turn is the prompt,
    the second's length the output length (or ``--sharegpt-output-len``); vLLM's filter keeps
    prompts of 4..1024 tokens, outputs of at least 4, and at most 2048 together; too few
    entries are oversampled.
``prefix-repetition``
    ``--prefix-repetition-num-prefixes`` shared prefixes, each followed by random suffixes,
    shuffled — for prefix caching.
``multi-turn``
    Conversations of ``--multi-turn-turns`` turns (perflab's own; vLLM's bench has none): each
    turn's prompt is the conversation so far — the earlier user messages and answers — plus a
    new user message of ``--multi-turn-input-len`` tokens, so prompts grow turn after turn and
    share their conversation's prefix. The earlier answers are random text of
    ``--multi-turn-output-len`` tokens, not what the engine generated (every request is
    encoded before the timed run); requests go out turn by turn (every conversation's first
    turn, then every second turn ...), so under a concurrency limit a turn usually follows
    the end of its predecessor. ``--num-prompts`` counts requests (turns), not conversations.
``synthetic-sharegpt``
    No file needed: ShareGPT-like lengths (log-normal, clipped with vLLM's ShareGPT filter,
    means near the seeds' 217 input and 202 output tokens per request) of random words.
    Not the real dataset: say so when reporting it.
"""

from __future__ import annotations

import json
import math
import os
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from perflab.bench.request import (
    SHAREGPT_MAX_PROMPT_LEN,
    SYNTHETIC_SHAREGPT_MEANS,
    BenchRequest,
    expected_prompt_tokens,
)
from perflab.bench.tokenizer import Tokenizer
from perflab.contract.errors import UsageError

SHAREGPT_MIN_LEN = 4
SHAREGPT_MAX_TOTAL_LEN = 2048
SYNTHETIC_SHAREGPT_SIGMAS = (0.9, 0.8)


@dataclass(frozen=True, slots=True)
class Sample:
    prompt: str
    prompt_len: int  # client-side token count of the prompt
    output_len: int  # max tokens asked for


def is_valid_sequence(
    prompt_len: int,
    output_len: int,
    min_len: int = SHAREGPT_MIN_LEN,
    max_prompt_len: int = SHAREGPT_MAX_PROMPT_LEN,
    max_total_len: int = SHAREGPT_MAX_TOTAL_LEN,
    skip_min_output_len_check: bool = False,
) -> bool:
    """vLLM's ShareGPT filter (vllm/benchmarks/datasets.py ``is_valid_sequence``)."""
    return not (
        prompt_len < min_len
        or (not skip_min_output_len_check and output_len < min_len)
        or prompt_len > max_prompt_len
        or prompt_len + output_len > max_total_len
    )


def _len_range(length: int, ratio: float, minimum: int) -> tuple[int, int]:
    low = max(math.floor(length * (1 - ratio)), minimum)
    high = max(math.ceil(length * (1 + ratio)), low)
    return low, high


def random_samples(req: BenchRequest, tok: Tokenizer) -> Iterator[Sample]:
    rng = random.Random(req.seed)
    in_lo, in_hi = _len_range(req.random_input_len, req.random_range_ratio, 1)
    out_lo, out_hi = _len_range(req.random_output_len, req.random_range_ratio, 1)
    prefix = ""
    prefix_len = 0
    if req.random_prefix_len:
        prefix, prefix_len = tok.random_text(rng, req.random_prefix_len)
    for _ in range(req.num_prompts):
        n_in = rng.randint(in_lo, in_hi)
        n_out = rng.randint(out_lo, out_hi)
        body, count = tok.random_text(rng, n_in)
        if prefix:
            text = prefix + " " + body
            count = prefix_len + count if tok.kind != "hf" else tok.count(text)
        else:
            text = body
        yield Sample(text, count, n_out)


def prefix_repetition_samples(req: BenchRequest, tok: Tokenizer) -> list[Sample]:
    n_prefixes = req.prefix_repetition_num_prefixes
    if req.num_prompts < n_prefixes:
        raise UsageError(
            f"--num-prompts {req.num_prompts} must be at least --prefix-repetition-num-prefixes {n_prefixes}"
        )
    rng = random.Random(req.seed)
    samples = []
    for i in range(n_prefixes):
        prefix, prefix_len = tok.random_text(rng, req.prefix_repetition_prefix_len)
        # vLLM gives num_prompts // num_prefixes to each and drops the rest; perflab spreads
        # the remainder so that exactly --num-prompts requests are sent.
        per = req.num_prompts // n_prefixes + (1 if i < req.num_prompts % n_prefixes else 0)
        for _ in range(per):
            suffix, suffix_len = tok.random_text(rng, req.prefix_repetition_suffix_len)
            text = (prefix + " " + suffix).strip()
            count = prefix_len + suffix_len if tok.kind != "hf" else tok.count(text)
            samples.append(Sample(text, count, req.prefix_repetition_output_len))
    rng.shuffle(samples)
    return samples


def multi_turn_samples(req: BenchRequest, tok: Tokenizer) -> list[Sample]:
    turns = req.multi_turn_turns
    conversations = -(-req.num_prompts // turns)
    rng = random.Random(req.seed)
    history: list[list[str]] = [[] for _ in range(conversations)]
    counts = [0] * conversations
    samples: list[Sample] = []
    for _ in range(turns):
        for c in range(conversations):
            if len(samples) == req.num_prompts:
                return samples
            message, n = tok.random_text(rng, req.multi_turn_input_len)
            history[c].append(message)
            counts[c] += n
            text = "\n".join(history[c])
            samples.append(Sample(text, counts[c] if tok.kind != "hf" else tok.count(text), req.multi_turn_output_len))
            answer, m = tok.random_text(rng, req.multi_turn_output_len)
            history[c].append(answer)
            counts[c] += m
    return samples


def _load_sharegpt(path: str) -> list[dict]:
    p = Path(path).expanduser()
    if not p.is_file():
        raise UsageError(f"--dataset-path {path!r}: no such file (a ShareGPT JSON list of conversations)")
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise UsageError(f"--dataset-path {path!r}: not valid JSON ({exc})") from None
    if not isinstance(data, list):
        raise UsageError(f"--dataset-path {path!r}: expected a JSON list of {{'conversations': [...]}} entries")
    return [
        e
        for e in data
        if isinstance(e, dict) and isinstance(e.get("conversations"), list) and len(e["conversations"]) >= 2
    ]


def _turn_text(turn: object) -> str:
    if isinstance(turn, dict):
        value = turn.get("value", turn.get("content", ""))
        return value if isinstance(value, str) else ""
    return ""


def sharegpt_samples(req: BenchRequest, tok: Tokenizer) -> list[Sample]:
    assert req.dataset_path is not None
    entries = _load_sharegpt(req.dataset_path)
    random.Random(req.seed).shuffle(entries)
    fixed = req.sharegpt_output_len
    samples: list[Sample] = []
    for entry in entries:
        if len(samples) >= req.num_prompts:
            break
        prompt = _turn_text(entry["conversations"][0])
        completion = _turn_text(entry["conversations"][1])
        prompt_len = tok.count(prompt)
        output_len = fixed if fixed is not None else tok.count(completion)
        if not is_valid_sequence(prompt_len, output_len, skip_min_output_len_check=fixed is not None):
            continue
        samples.append(Sample(prompt, prompt_len, output_len))
    if not samples:
        raise UsageError(
            f"--dataset-path {req.dataset_path!r}: no conversation passes vLLM's ShareGPT filter "
            f"(prompt {SHAREGPT_MIN_LEN}..{SHAREGPT_MAX_PROMPT_LEN} tokens, output >= {SHAREGPT_MIN_LEN}, "
            f"total <= {SHAREGPT_MAX_TOTAL_LEN})"
        )
    if len(samples) < req.num_prompts:  # vLLM oversamples with random.choices
        samples += random.Random(req.seed).choices(samples, k=req.num_prompts - len(samples))
    return samples


def synthetic_sharegpt_samples(req: BenchRequest, tok: Tokenizer) -> Iterator[Sample]:
    rng = random.Random(req.seed)
    (m_in, m_out), (s_in, s_out) = SYNTHETIC_SHAREGPT_MEANS, SYNTHETIC_SHAREGPT_SIGMAS
    mu_in, mu_out = math.log(m_in) - s_in**2 / 2, math.log(m_out) - s_out**2 / 2
    made = 0
    while made < req.num_prompts:
        n_in = round(rng.lognormvariate(mu_in, s_in))
        n_out = req.sharegpt_output_len or round(rng.lognormvariate(mu_out, s_out))
        if not is_valid_sequence(n_in, n_out, skip_min_output_len_check=req.sharegpt_output_len is not None):
            continue
        text, count = tok.random_text(rng, n_in)
        made += 1
        yield Sample(text, count, n_out)


def iter_samples(req: BenchRequest, tok: Tokenizer) -> Iterator[Sample]:
    """The prompts for ``req.dataset``, one at a time (deterministic for a given seed and
    tokenizer). Usage errors (a missing file, too few prompts for the prefixes) are raised
    by this call, before the first prompt is made."""
    if req.dataset == "random":
        return random_samples(req, tok)
    if req.dataset == "sharegpt":
        return iter(sharegpt_samples(req, tok))  # reads and filters the file now
    if req.dataset == "prefix-repetition":
        return iter(prefix_repetition_samples(req, tok))  # shuffled: made whole, bounded by the checks
    if req.dataset == "synthetic-sharegpt":
        return synthetic_sharegpt_samples(req, tok)
    if req.dataset == "multi-turn":
        return iter(multi_turn_samples(req, tok))  # turn-major order: made whole, bounded by the checks
    raise UsageError(f"--dataset {req.dataset!r}: unknown")


def build_samples(req: BenchRequest, tok: Tokenizer) -> list[Sample]:
    """:func:`iter_samples` as a list (for tests and small tools)."""
    return list(iter_samples(req, tok))


# Encoded request per prompt token (JSON, UTF-8 text, headers) and per request, measured on
# the random dataset with the approx and whitespace tokenizers (~5-7 bytes a token), with room.
BYTES_PER_PROMPT_TOKEN = 8
BYTES_PER_REQUEST = 2048  # the encoded head and payload around the prompt, the trace kept after


def available_memory() -> int | None:
    """Bytes of memory available now (Linux MemAvailable), or None when unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def check_memory(req: BenchRequest, available: int | None = None) -> None:
    """Refuse (one line) a run whose encoded requests would not fit in half the free memory.

    Every request is encoded before the timed run (no encoding while timing), so the prompts
    have to fit; better refused now than killed by the OOM killer with a server under load.
    """
    need = req.num_prompts * (expected_prompt_tokens(req) * BYTES_PER_PROMPT_TOKEN + BYTES_PER_REQUEST)
    free = available if available is not None else available_memory()
    if free is not None and need > free // 2:
        gib = 1 << 30
        raise UsageError(
            f"--num-prompts {req.num_prompts}: the encoded requests need about {need / gib:.1f} GiB, "
            f"more than half of the {free / gib:.1f} GiB of memory available; use fewer prompts"
        )
