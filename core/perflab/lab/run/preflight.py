"""The lab's own preflight: does each workload fit the configuration's context? Does any
configuration set a flag perflab owns (:func:`refuse_owned_flags`, before anything starts)?

A profile whose prompt plus output can exceed the configuration's context limit would fail
most of its requests ("input too long" from the engine) and the study would report a
meaningless number. The lab refuses such a (configuration, profile) before launching, with
the reason, instead. The limit is the configuration's ``max_model_len`` when set, else the
model's own context (``max_position_embeddings`` of its ``config.json``: a local weight
directory, the Hugging Face cache, or the simulator's model registry on simulated hardware).
Engines whose *default* limit is not the model's context set it from the model the way
GPUStack does (the MindIE plugin: maxSeqLen/maxInputTokenLen, see perflab_mindie.config_json).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from perflab.contract.errors import UsageError
from perflab.lab.options import Configuration
from perflab.lab.plan import Plan, Profile
from perflab.plugins import PluginManager

CONTEXT_KEYS = ("max_position_embeddings", "max_sequence_length", "seq_length", "n_positions", "max_seq_len")


def _from_config_json(path: Path) -> int | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    for doc in (data, data.get("text_config") or {}, data.get("llm_config") or {}):
        for key in CONTEXT_KEYS:
            value = doc.get(key) if isinstance(doc, Mapping) else None
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return None


def _hf_cache_dirs(env: Mapping[str, str]) -> list[Path]:
    if env.get("HF_HUB_CACHE"):
        return [Path(env["HF_HUB_CACHE"])]
    home = Path(env.get("HF_HOME") or Path(env.get("HOME") or Path.home()) / ".cache" / "huggingface")
    return [home / "hub"]


def model_context(model: str, *, simulated: bool, env: Mapping[str, str] | None = None) -> int | None:
    """The model's native context length in tokens, or None when perflab cannot know it."""
    env = os.environ if env is None else env
    local = Path(model).expanduser()
    if local.is_dir():
        return _from_config_json(local / "config.json")
    if simulated:
        from perflab.models import UnknownModel, lookup

        try:
            return lookup(model).context_len
        except UnknownModel:
            return None
    if model.count("/") == 1:  # a Hugging Face id: its config.json in the local cache, if any
        for hub in _hf_cache_dirs(env):
            snapshots = hub / f"models--{model.replace('/', '--')}" / "snapshots"
            if snapshots.is_dir():
                for snap in sorted(snapshots.iterdir(), key=lambda p: p.stat().st_mtime, reverse=True):
                    found = _from_config_json(snap / "config.json")
                    if found:
                        return found
    return None


def tokens_needed(profile: Profile) -> int | None:
    """The most prompt + output tokens one request of ``profile`` can take (vLLM's random
    dataset draws lengths in [len·(1-range_ratio), len·(1+range_ratio)] after the shared
    prefix; a multi-turn prompt grows to the whole conversation); None when the workload does
    not fix them (ShareGPT-like datasets)."""
    if profile.input_len is None or profile.output_len is None:
        return None
    if profile.dataset == "multi-turn":  # the last turn: every message and answer before it, and its own
        return (profile.turns or 1) * (profile.input_len + profile.output_len)
    if profile.dataset == "prefix-repetition":
        return (profile.prefix_len or 0) + profile.input_len + profile.output_len
    if profile.dataset != "random":
        return None
    scale = 1.0 + max(0.0, profile.range_ratio)
    return (profile.prefix_len or 0) + math.ceil(profile.input_len * scale) + math.ceil(profile.output_len * scale)


def context_limit(config: Configuration, model_ctx: int | None) -> tuple[int | None, str]:
    """(limit, where it comes from) for one configuration."""
    explicit = config.options.get("max_model_len")
    if isinstance(explicit, int) and explicit > 0:
        return explicit, "max_model_len"
    return model_ctx, "the model's context (max_position_embeddings)"


def too_long(config: Configuration, profiles: list[Profile], model_ctx: int | None) -> dict[str, str]:
    """{profile name: why it cannot run on this configuration} for the profiles that do not fit."""
    limit, source = context_limit(config, model_ctx)
    out: dict[str, str] = {}
    if limit is None:
        return out
    for p in profiles:
        need = tokens_needed(p)
        if need is not None and need > limit:
            out[p.name] = (f"{p.label}: up to {need} prompt + output tokens per request, more than the "
                           f"{limit}-token context limit ({source}); raise max_model_len (if the model allows) "
                           f"or shorten the workload")
    return out


def refuse_owned_flags(pm: PluginManager, plan: Plan) -> None:
    """Refuse, before anything starts, every ``extra_args`` of the plan that sets a flag perflab
    owns on an engine it may run on (:meth:`perflab.plugins.EngineRecord.owned_flag_problems`, the check
    every launch makes): such a plan used to fail at that configuration's launch, after the
    others had run. One UsageError line naming each place."""
    from perflab.lab.plan import WINNER, engines_of

    everywhere = engines_of(plan)
    places: list[tuple[str, tuple[str, ...], Mapping[str, Any]]] = [
        ("serve", tuple(everywhere), plan.serve.plan_options()),
        *((f"engine_serve.{e}", (e,), opts) for e, opts in plan.engine_serve.items()),
        ("baseline.serve", (plan.baseline.engine,), plan.baseline.serve),
    ]
    for where, steps in (("candidates", plan.candidates), ("combinations", plan.combinations)):
        for i, c in enumerate(steps):
            for j, v in enumerate(c.variants):
                names = v.engines or c.engines
                engines = tuple(everywhere) if WINNER in names else tuple(names)
                key = f"{where}[{i}]" + (f".variants[{j}]" if len(c.variants) > 1 else "")
                for e in engines:
                    places.append((f"{key} ({c.name!r}/{v.name!r}) on {e}", (e,), v.delta_for(e)))
    problems: list[str] = []
    for where, engines, options in places:
        args = tuple(options.get("extra_args") or ())
        for e in engines:
            for line in pm.engine(e).owned_flag_problems(args):
                if f"{where}: {line}" not in problems:
                    problems.append(f"{where}: {line}")
    if problems:
        label = str(plan.path) if plan.path is not None else "plan"
        count = f"{len(problems)} problems: " if len(problems) > 1 else ""
        raise UsageError(f"{label}: {count}{'; '.join(problems)}")
