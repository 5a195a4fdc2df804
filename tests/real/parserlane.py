"""The parser lane: perflab's command lines parsed by the engines' own argument parsers.

Combinations come from perflab's own option declarations (``ServeConfig``'s fields, through
:func:`perflab.contract.types.serve_options`, and an engine's own option table): every sampled
value alone, every pair of options, and a few seed-like configurations of many. Each is built by the engine's plugin exactly as
``perflab engines command`` and ``launch`` build it (``pm.engine(name)``: preflight, then
``build_launch``) for a simulated 8-GPU machine, and all of an engine's argvs are parsed in one
subprocess under the engine's own Python (engine_parse.py). Each parsed value perflab set is
compared with what perflab meant (:data:`MEANS`), and every other value with the engine's
default (the parse of the baseline command line), so a flag that lands on the wrong field, or
a stray one, shows too.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perflab.contract.errors import PerflabError
from perflab.contract.types import HardwareSnapshot, NodeGroup, ServeConfig, serve_options
from perflab.hardware import resolve
from perflab.plugins import PluginManager
from perflab.realengine import RealEngineEnv
from perflab.supervisor_group import local_nodes

PARSE_SCRIPT = Path(__file__).with_name("engine_parse.py")
HARDWARE = "sim:h100-80g-x8"  # a machine every combination below fits (tp/pp/dp up to 8)
DRAFT = "RedHatAI/Qwen3-32B-speculator.eagle3"
PORT = 8123
RENDEZVOUS_PORT = 29123  # fixed, so the argv is the same every run (a launch picks a free one)

#: Values for each engine-neutral option, as ServeConfig fragments (ep brings the tp/dp it needs).
SAMPLES: dict[str, tuple[dict[str, Any], ...]] = {
    "served_model_name": ({"served_model_name": "chat"},),
    "tp": ({"tp": 1}, {"tp": 2}, {"tp": 4}, {"tp": 8}),
    # one command line per node (build_group_launch), each parsed; rank 0 serves
    "nodes": ({"nodes": 2, "dp": 2}, {"nodes": 2, "tp": 2, "dp": 4}),
    "pp": ({"pp": 2}, {"pp": 4}),
    "dp": ({"dp": 2}, {"dp": 8}),
    "ep": ({"tp": 2, "dp": 2, "ep": 4}, {"tp": 4, "ep": 4}),
    "max_model_len": ({"max_model_len": 512}, {"max_model_len": 32768}, {"max_model_len": 131072}),
    "max_batched_tokens": ({"max_batched_tokens": 2048}, {"max_batched_tokens": 16384}),
    "max_num_seqs": ({"max_num_seqs": 1}, {"max_num_seqs": 256}),
    "quantization": ({"quantization": "fp8"}, {"quantization": "awq"}, {"quantization": "gptq"}),
    "kv_cache_dtype": ({"kv_cache_dtype": "auto"}, {"kv_cache_dtype": "fp8"}, {"kv_cache_dtype": "fp8_e5m2"}),
    "prefix_caching": ({"prefix_caching": True}, {"prefix_caching": False}),
    "chunked_prefill": ({"chunked_prefill": True}, {"chunked_prefill": False}),
    "speculative_config": (
        {"speculative_config": {"method": "mtp", "num_speculative_tokens": 2}},
        {"speculative_config": {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 5,
                                "prompt_lookup_min": 2}},
        {"speculative_config": {"method": "eagle3", "model": DRAFT, "num_speculative_tokens": 3}},
        {"speculative_config": {"method": "ngram", "num_speculative_tokens": 3}},
    ),
    "mem_fraction": ({"mem_fraction": 0.5}, {"mem_fraction": 0.9}),
    "reasoning_parser": ({"reasoning_parser": "qwen3"}, {"reasoning_parser": "deepseek_r1"}),
}

#: Many options at once, as a seed's configuration sets them (and as ``engines command`` takes
#: them: the lane's first check, :data:`EVERYTHING_CLI`).
EVERYTHING: tuple[dict[str, Any], ...] = (
    {"served_model_name": "chat", "tp": 2, "max_model_len": 32768, "max_batched_tokens": 8192,
     "max_num_seqs": 128, "quantization": "fp8", "kv_cache_dtype": "fp8", "prefix_caching": False,
     "chunked_prefill": True, "speculative_config": {"method": "mtp", "num_speculative_tokens": 2},
     "mem_fraction": 0.85, "reasoning_parser": "qwen3"},
    {"tp": 4, "pp": 2, "max_model_len": 8192, "max_batched_tokens": 4096, "chunked_prefill": False,
     "prefix_caching": True, "kv_cache_dtype": "auto", "max_num_seqs": 64,
     "speculative_config": {"method": "ngram", "num_speculative_tokens": 3}},
    {"tp": 2, "dp": 4, "ep": 8, "quantization": "awq", "max_model_len": 131072, "mem_fraction": 0.95,
     "reasoning_parser": "deepseek_r1"},
)
#: ``perflab engines command``'s options for EVERYTHING[0]
EVERYTHING_CLI: tuple[str, ...] = (
    "--served-model-name", "chat", "--tp", "2", "--max-model-len", "32768", "--max-batched-tokens", "8192",
    "--max-num-seqs", "128", "-q", "fp8", "--kv-cache-dtype", "fp8", "--no-prefix-caching", "--chunked-prefill",
    "--speculative-config", '{"method":"mtp","num_speculative_tokens":2}', "--mem-fraction", "0.85",
    "--reasoning-parser", "qwen3",
)
#: A flag no engine has: the parser must reject it, or the lane could not fail.
CANARY = "--perflab-parser-lane-canary"

#: The declared options not sampled above, and why.
NOT_SAMPLED: dict[str, str] = {
    "model": "in every command line (checked in each)",
    "host": "in every command line (checked in each)",
    "port": "in every command line (checked in each)",
    "devices": "an environment variable (CUDA_VISIBLE_DEVICES), no argument",
    "extra_env": "the engine's environment, no argument",
    "extra_args": "passed verbatim: what the user wrote, not what perflab builds",
    "options": "engine-specific: sampled from the engine's own table (ENGINE_OPTIONS)",
}


def _vllm_options() -> tuple[dict[str, Any], ...]:
    from perflab_vllm.flags import VLLM_OPTIONS

    values: dict[str, Any] = {"trust_remote_code": True, "enforce_eager": True, "dtype": "float32",
                              "block_size": 32, "compilation_config": {"cudagraph_mode": "FULL_DECODE_ONLY"},
                              "kv_cache_memory_bytes": 2 << 30}
    missing = [o.key for o in VLLM_OPTIONS if o.key not in values]
    assert not missing, f"perflab_vllm declares engine options the lane has no value for: {missing}"
    return tuple({"options": {o.key: values[o.key]}} for o in VLLM_OPTIONS)


def _sglang_own() -> tuple[dict[str, Any], ...]:
    # SGLang's one option (``python``) is the interpreter that runs it, no flag; its own n-gram
    # trie depth is a speculative_config key only the SGLang plugin knows
    return ({"speculative_config": {"method": "ngram", "num_speculative_tokens": 4, "max_trie_depth": 12}},)


#: Engine-specific samples: the engine's own option table, or the keys only its plugin knows.
ENGINE_OPTIONS: dict[str, Callable[[], tuple[dict[str, Any], ...]]] = {
    "vllm": _vllm_options,
    "sglang": _sglang_own,
}


class Part(dict[str, Any]):
    """An expected value that is a mapping only some of whose keys perflab set."""


# --------------------------------------------------------------------------- what perflab means

def _vllm_means(c: ServeConfig) -> dict[str, Any]:
    out: dict[str, Any] = {"model": c.model, "model_tag": c.model, "host": c.host, "port": c.port}
    plain = {"tp": "tensor_parallel_size", "pp": "pipeline_parallel_size", "dp": "data_parallel_size",
             "max_model_len": "max_model_len", "max_batched_tokens": "max_num_batched_tokens",
             "max_num_seqs": "max_num_seqs", "quantization": "quantization", "kv_cache_dtype": "kv_cache_dtype",
             "prefix_caching": "enable_prefix_caching", "chunked_prefill": "enable_chunked_prefill",
             "mem_fraction": "gpu_memory_utilization", "reasoning_parser": "reasoning_parser"}
    for name, attr in plain.items():
        if getattr(c, name) is not None:
            out[attr] = getattr(c, name)
    if c.served_model_name is not None:
        out["served_model_name"] = [c.served_model_name]
    if c.ep is not None:  # vLLM's EP size is tp×dp: on, or off at 1
        out["enable_expert_parallel"] = c.ep > 1
    if c.speculative_config is not None:
        out["speculative_config"] = dict(c.speculative_config)
    for key, value in c.options.items():
        out[key] = Part(value) if isinstance(value, Mapping) else value
    return out


_SGLANG_ALGORITHMS = {"mtp": "NEXTN", "ngram": "NGRAM", "eagle": "EAGLE", "eagle3": "EAGLE3"}
_SGLANG_KV = {"fp8": "fp8_e4m3"}  # vLLM's fp8 KV cache is e4m3
_SGLANG_REASONING = {"deepseek_r1": "deepseek-r1"}


def _sglang_means(c: ServeConfig) -> dict[str, Any]:
    out: dict[str, Any] = {"model_path": c.model, "host": c.host, "port": c.port}
    plain = {"served_model_name": "served_model_name", "tp": "tp_size", "pp": "pp_size", "dp": "dp_size",
             "ep": "ep_size", "max_model_len": "context_length", "max_num_seqs": "max_running_requests",
             "quantization": "quantization", "mem_fraction": "mem_fraction_static"}
    for name, attr in plain.items():
        if getattr(c, name) is not None:
            out[attr] = getattr(c, name)
    if c.max_batched_tokens is not None:  # both of SGLang's prefill budgets bound a step
        out["max_prefill_tokens"] = c.max_batched_tokens
        out["chunked_prefill_size"] = c.max_batched_tokens
    if c.chunked_prefill is False:
        out["chunked_prefill_size"] = -1
    if c.prefix_caching is False:
        out["disable_radix_cache"] = True
    if c.kv_cache_dtype is not None:
        out["kv_cache_dtype"] = _SGLANG_KV.get(c.kv_cache_dtype, c.kv_cache_dtype)
    if c.reasoning_parser is not None:
        out["reasoning_parser"] = _SGLANG_REASONING.get(c.reasoning_parser, c.reasoning_parser)
    spec = c.speculative_config
    if spec is not None:
        out["speculative_algorithm"] = _SGLANG_ALGORITHMS[spec["method"]]
        k = spec.get("num_speculative_tokens")
        if spec.get("model") is not None:
            out["speculative_draft_model_path"] = spec["model"]
        if spec["method"] == "ngram":
            if k is not None:  # an n-gram step drafts k tokens
                out["speculative_num_draft_tokens"] = k
            # the match windows (SGLang's names up to 0.5.9; 0.5.10 removed them) and the trie
            # depth (its name from 0.5.10)
            for key, attr in (("prompt_lookup_max", "speculative_ngram_max_match_window_size"),
                              ("prompt_lookup_min", "speculative_ngram_min_match_window_size"),
                              ("max_trie_depth", "speculative_ngram_max_trie_depth")):
                if key in spec:
                    out[attr] = spec[key]
        elif k is not None:  # a chain of k drafts: k steps of top-1, k+1 tokens verified
            out.update(speculative_num_steps=k, speculative_eagle_topk=1, speculative_num_draft_tokens=k + 1)
    return out


MEANS: dict[str, Callable[[ServeConfig], dict[str, Any]]] = {"vllm": _vllm_means, "sglang": _sglang_means}


@dataclass(frozen=True)
class Rank:
    """One node's command line of a multi-node launch."""

    rank: int
    size: int
    address: str  # rank 0's, where the others join
    port: int


def _vllm_rank_means(c: ServeConfig, r: Rank) -> dict[str, Any]:
    # vLLM's data-parallel deployment: each node runs dp/nodes ranks; the others run headless
    local = (c.dp or 1) // r.size
    out: dict[str, Any] = {"data_parallel_size_local": local, "data_parallel_address": r.address,
                           "data_parallel_rpc_port": r.port}
    if r.rank:
        out.update(headless=True, data_parallel_start_rank=r.rank * local)
    return out


def _sglang_rank_means(c: ServeConfig, r: Rank) -> dict[str, Any]:
    return {"nnodes": r.size, "node_rank": r.rank, "dist_init_addr": f"{r.address}:{r.port}"}


RANK_MEANS: dict[str, Callable[[ServeConfig, Rank], dict[str, Any]]] = {
    "vllm": _vllm_rank_means, "sglang": _sglang_rank_means}


# --------------------------------------------------------------------------- combinations

def _merge(*fragments: Mapping[str, Any]) -> dict[str, Any] | None:
    """One ServeConfig's keyword arguments, or None when two fragments set the same option."""
    out: dict[str, Any] = {}
    for frag in fragments:
        for key, value in frag.items():
            if key in out:
                return None
            else:
                out[key] = value
    return out


def combinations(engine: str) -> list[dict[str, Any]]:
    """Every sampled value alone, every pair of options (their values taken in turn), then
    :data:`EVERYTHING`."""
    declared = {o.name for o in serve_options()}
    uncovered = declared - set(SAMPLES) - set(NOT_SAMPLED)
    assert not uncovered, f"serving options the parser lane has no sample for: {sorted(uncovered)}"
    axes = dict(SAMPLES)
    axes[f"{engine}'s own"] = ENGINE_OPTIONS[engine]()
    singles = [dict(f) for frags in axes.values() for f in frags]
    pairs = []
    for n, (a, b) in enumerate(itertools.combinations(axes, 2)):
        fa, fb = axes[a][n % len(axes[a])], axes[b][(n // len(axes[a])) % len(axes[b])]
        merged = _merge(fa, fb)
        if merged is not None:
            pairs.append(merged)
    return [{}, *singles, *pairs, *EVERYTHING]  # {} first: the baseline, the engine's defaults


# --------------------------------------------------------------------------- one engine's lane

@dataclass
class Outcome:
    options: dict[str, Any]
    argv: list[str] | None = None
    refused: str | None = None  # perflab's own refusal (preflight error, UnsupportedOption)
    rejected: str | None = None  # the engine's parser said no
    mismatches: list[str] = field(default_factory=list)
    checked: int = 0
    rank: Rank | None = None  # a node's command line of a multi-node launch


@dataclass
class LaneResult:
    engine: str
    version: str
    combinations: int
    outcomes: list[Outcome]  # one per command line (a multi-node combination has one per node)
    parse_s: float
    provision_s: float

    @property
    def built(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.argv is not None]

    @property
    def accepted(self) -> list[Outcome]:
        return [o for o in self.built if o.rejected is None]

    @property
    def failures(self) -> list[str]:
        out = [f"rejected {_name(o)}: {o.rejected}\n    argv: {' '.join(o.argv or [])}"
               for o in self.built if o.rejected]
        out += [f"mismatched {_name(o)}: {'; '.join(o.mismatches)}" for o in self.accepted if o.mismatches]
        return out

    def summary(self) -> dict[str, Any]:
        """What the terminal summary prints (carried through pytest's user_properties)."""
        return {
            "engine": self.engine, "version": self.version, "tried": self.combinations,
            "refused": len([o for o in self.outcomes if o.refused]), "built": len(self.built),
            "nodes": len([o for o in self.built if o.rank is not None]),
            "accepted": len(self.accepted), "values_checked": sum(o.checked for o in self.accepted),
            "mismatched": len([o for o in self.accepted if o.mismatches]),
            "parse_s": round(self.parse_s, 1), "provision_s": round(self.provision_s, 1),
            "failures": self.failures,
            "refusals": sorted({o.refused for o in self.outcomes if o.refused}),
        }


def _name(o: Outcome) -> str:
    return f"{o.options}" + (f" (node rank {o.rank.rank} of {o.rank.size})" if o.rank else "")


def build_all(pm: PluginManager, engine: str, version: str | None, model: str, hardware: HardwareSnapshot,
              workdir: Path, combos: list[dict[str, Any]]) -> list[Outcome]:
    """The plugin's command lines for ``combos`` (one per node of a multi-node one), or its refusal."""
    rec = pm.engine(engine)
    outcomes: list[Outcome] = []
    for options in combos:
        outcome = Outcome(options)
        config = ServeConfig(model=model, port=PORT, **options)
        try:
            errors = [u for u in rec.check_support(config, hardware, version) if u.severity == "error"]
            if errors:
                outcome.refused = "; ".join(f"{u.what}: {u.why}" for u in errors)
            elif config.node_count > 1:  # as perflab launch/run start a group on one machine
                group = NodeGroup(local_nodes(config, hardware, rec.info.accelerators), RENDEZVOUS_PORT)
                specs = rec.build_group_launch(config, hardware, group, workdir, version)
                outcomes += [Outcome(options, list(spec.argv),
                                     rank=Rank(node.rank, group.size, group.serving.address, RENDEZVOUS_PORT))
                             for node, spec in zip(group.nodes, specs, strict=True)]
                continue
            else:
                outcome.argv = list(rec.build_launch(config, hardware, workdir, version).argv)
        except PerflabError as exc:
            outcome.refused = str(exc)
        outcomes.append(outcome)
    return outcomes


def parse(env: RealEngineEnv, engine: str, argvs: list[list[str]]) -> list[dict[str, Any]]:
    """All ``argvs`` through the engine's own parser, in one process of the engine's Python."""
    environ = env.env()
    environ.update(HF_HUB_OFFLINE="1", VLLM_LOGGING_LEVEL="WARNING", PYTHONUNBUFFERED="1")
    proc = subprocess.run([str(env.python), str(PARSE_SCRIPT), engine], input=json.dumps(argvs), env=environ,
                          capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0, f"{engine}'s parser script failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}"
    results = json.loads(proc.stdout)
    assert len(results) == len(argvs)
    return results


def _matches(expected: Any, got: Any) -> bool:
    if isinstance(expected, Part):
        return isinstance(got, Mapping) and all(k in got and _matches(v, got[k]) for k, v in expected.items())
    if isinstance(expected, float) or isinstance(got, float):
        return isinstance(got, (int, float)) and not isinstance(got, bool) and abs(float(got) - float(expected)) < 1e-9
    return bool(expected == got) and type(expected) is type(got)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 160 else text[:157] + "..."


def check(outcome: Outcome, values: Mapping[str, Any], baseline: Mapping[str, Any], means: Mapping[str, Any]) -> None:
    for attr, expected in means.items():
        outcome.checked += 1
        if attr not in values:
            outcome.mismatches.append(f"{attr}: no such field in this version's parse")
        elif not _matches(expected, values[attr]):
            outcome.mismatches.append(f"{attr}={_short(values[attr])}, perflab meant {expected!r}")
    stray = [k for k in values if k not in means and values[k] != baseline.get(k)]
    outcome.mismatches += [f"{k}={_short(values[k])} moved from the default {_short(baseline.get(k))} though "
                           "perflab set nothing for it"
                           for k in stray]


def run_lane(pm: PluginManager, env: RealEngineEnv, workdir: Path) -> LaneResult:
    engine = env.engine
    hardware, _ = resolve(pm, HARDWARE)
    # the environment's tiny model: vLLM's validation reads the model's config, offline
    model = str(env.model)
    combos = combinations(engine)
    outcomes = build_all(pm, engine, env.version, model, hardware, workdir, combos)
    built = [o for o in outcomes if o.argv is not None]
    started = time.monotonic()
    *results, canary = parse(env, engine, [*(o.argv or [] for o in built), [*(built[0].argv or []), CANARY]])
    parse_s = time.monotonic() - started
    assert not canary["ok"] and CANARY in canary["error"], f"{engine}'s parser accepted an unknown flag: {canary}"
    assert results[0]["ok"], f"{engine} rejected perflab's baseline command line: {results[0]['error']}"
    baseline = results[0]["values"]
    means = MEANS[engine]
    for outcome, result in zip(built, results, strict=True):
        if not result["ok"]:
            outcome.rejected = result["error"].strip().splitlines()[-1]
            continue
        config = ServeConfig(model=model, port=PORT, **outcome.options)
        meant = means(config)
        if outcome.rank is not None:
            meant.update(RANK_MEANS[engine](config, outcome.rank))
        check(outcome, result["values"], baseline, meant)
    return LaneResult(engine, env.version, len(combos), outcomes, parse_s, env.install_s)
