"""Named workloads from the seed studies (``--profile NAME``).

Seed 004 (GPUStack, guidellm through benchmark-runner) defines four profiles::

    ShareGPT          dataset ShareGPT,           request_rate 1000, total_requests 1000
    Throughput        random 1024 in / 128 out,   request_rate 1000, total_requests 1000, seed 42
    Long Context      random 32000 in / 100 out,  request_rate 1,    total_requests 100,  seed 42
    Generation Heavy  random 1000 in / 2000 out,  request_rate 1,    total_requests 200,  seed 42

and its results show "Maximum request concurrency: 512" for the two rate-1000 profiles, so
they are capped at 512 concurrent requests here. Seeds 000-002 run ``vllm bench serve
--backend openai-chat --endpoint /v1/chat/completions`` with its defaults (request rate
inf, no concurrency limit): ShareGPT with 1000 prompts, and random 128/4 (1000 prompts),
2000/100 (500), 4000/200 (500), 32000/100 (100) with ``--seed 42``; seed 000 also runs
ShareGPT at concurrency 4.

A profile fills the options that were not given explicitly; the ShareGPT profiles need
``--dataset-path`` (or ``--dataset synthetic-sharegpt`` when no file is at hand).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from typing import Any

from perflab.bench.request import BenchRequest
from perflab.contract.errors import UsageError

_SEED004 = {"seed": 42, "backend": "openai-chat"}
_VLLM_SEEDS = {"seed": 42, "backend": "openai-chat", "request_rate": float("inf")}

PROFILES: dict[str, dict[str, Any]] = {
    # seed 004's four profiles
    "sharegpt": {"dataset": "sharegpt", "num_prompts": 1000, "request_rate": 1000.0, "max_concurrency": 512, "backend": "openai-chat"},
    "throughput": {**_SEED004, "dataset": "random", "random_input_len": 1024, "random_output_len": 128, "num_prompts": 1000, "request_rate": 1000.0, "max_concurrency": 512},
    "long-context": {**_SEED004, "dataset": "random", "random_input_len": 32000, "random_output_len": 100, "num_prompts": 100, "request_rate": 1.0},
    "generation-heavy": {**_SEED004, "dataset": "random", "random_input_len": 1000, "random_output_len": 2000, "num_prompts": 200, "request_rate": 1.0},
    # seeds 000-002 (vllm bench serve defaults: request rate inf, no concurrency limit)
    "sharegpt-inf": {"dataset": "sharegpt", "num_prompts": 1000, "backend": "openai-chat", "request_rate": float("inf")},
    "sharegpt-c4": {"dataset": "sharegpt", "num_prompts": 1000, "backend": "openai-chat", "request_rate": float("inf"), "max_concurrency": 4},
    "random-128-4": {**_VLLM_SEEDS, "dataset": "random", "random_input_len": 128, "random_output_len": 4, "num_prompts": 1000},
    "random-2000-100": {**_VLLM_SEEDS, "dataset": "random", "random_input_len": 2000, "random_output_len": 100, "num_prompts": 500},
    "random-4000-200": {**_VLLM_SEEDS, "dataset": "random", "random_input_len": 4000, "random_output_len": 200, "num_prompts": 500},
    "random-32000-100": {**_VLLM_SEEDS, "dataset": "random", "random_input_len": 32000, "random_output_len": 100, "num_prompts": 100},
}

PROFILE_DESCRIPTIONS: dict[str, str] = {
    "sharegpt": "seed 004 ShareGPT: 1000 requests at 1000 req/s, at most 512 concurrent",
    "throughput": "seed 004 Throughput: random 1024/128, 1000 requests at 1000 req/s, at most 512 concurrent",
    "long-context": "seed 004 Long Context: random 32000/100, 100 requests at 1 req/s",
    "generation-heavy": "seed 004 Generation Heavy: random 1000/2000, 200 requests at 1 req/s",
    "sharegpt-inf": "seeds 000-002 ShareGPT: 1000 prompts, all at once",
    "sharegpt-c4": "seed 000 ShareGPT at concurrency 4",
    "random-128-4": "seeds 000-002 short prompt: random 128/4, 1000 prompts",
    "random-2000-100": "seeds 000-002 medium prompt: random 2000/100, 500 prompts",
    "random-4000-200": "seeds 000-002 long prompt: random 4000/200, 500 prompts",
    "random-32000-100": "seeds 000-002 very long prompt: random 32000/100, 100 prompts",
}


def apply_profile(req: BenchRequest, explicit: Collection[str] | None = None) -> BenchRequest:
    """Fill ``req`` from its profile.

    :param explicit: names of the fields the user gave (the CLI knows them); those keep
        their values. ``None``: every field still at its dataclass default takes the
        profile's value.
    """
    if not req.profile:
        return req
    if req.profile not in PROFILES:
        raise UsageError(f"--profile {req.profile!r}: expected one of {', '.join(PROFILES)}")
    defaults = {f.name: f.default for f in dataclasses.fields(BenchRequest)}
    changes = {}
    for key, value in PROFILES[req.profile].items():
        keep = key in explicit if explicit is not None else getattr(req, key) != defaults[key]
        if not keep:
            changes[key] = value
    return dataclasses.replace(req, **changes)
