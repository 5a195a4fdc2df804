"""ServeConfig -> MindIE's config.json, starting from MindIE's own default template.

The template (``config_template.json``) is Ascend/MindIE-LLM ``src/server/conf/config.json``;
every section and key of it is kept, only values are set or keys added. Key meanings:
Ascend/MindIE-LLM docs/zh/user_guide/user_manual/service_parameter_configuration.md and the
feature pages under docs/zh/user_guide/feature/ (prefix_cache.md, splitFuse.md, mtp.md,
data_parallel.md, expert_parallel.md, enable_reasoning.md). Mapping:

* host/port -> ServerConfig.ipAddress / managementIpAddress and port / managementPort /
  metricsPort (three distinct ports: business, management, metrics); plain HTTP needs
  ``httpsEnabled``, ``interCommTLSEnabled`` and BackendConfig ``interNodeTLSEnabled`` false.
* devices -> BackendConfig.npuDeviceIds ``[[...]]`` (chip logic IDs); worldSize = their count.
* tp/dp/pp -> ModelConfig[0].tp/dp/pp; ep -> moe_ep with moe_tp = worldSize / ep.
* max_model_len -> ModelDeployConfig.maxSeqLen and maxInputTokenLen, ScheduleConfig.maxIterTimes
  (max output length, range [1, maxSeqLen]); maxPrefillTokens is raised to it when unset, as
  MindIE requires maxPrefillTokens >= maxInputTokenLen (config_manager_impl.cpp).
  Without max_model_len, the template's maxSeqLen 2560 / maxInputTokenLen 2048 would fail every
  longer prompt (seed 000's 4000- and 32000-token workloads failed 100 %), so when the model's
  context is known (perflab.lab.run.preflight.model_context: the weights' config.json, the HF
  cache, or the simulator's registry) it is used, as GPUStack's MindIE backend does
  (gpustack/worker/backends/ascend_mindie.py: ``derived_max_seq_len = get_max_model_len(...)``
  for --max-seq-len; ``max_input_token_len`` defaults to ``min(max_seq_len, max_prefill_tokens)``
  when a prefill budget is set, else ``max_seq_len``; ``max_prefill_tokens`` and
  ``max_iter_times`` default to ``max_seq_len``).
* max_batched_tokens -> ScheduleConfig.maxPrefillTokens.
* max_num_seqs -> ScheduleConfig.maxBatchSize and maxPrefillBatchSize.
* prefix_caching -> plugin "prefix_cache" (+ ScheduleConfig.enablePrefixCache, needed by older
  releases, ignored by newer ones); chunked_prefill -> plugin "splitfuse" + templateType "Mix";
  speculative MTP -> plugin "mtp" with num_speculative_tokens. Several plugins are one
  comma-separated plugin_type (prefix_cache.md).
* reasoning_parser -> ModelConfig[0].models.<model type>.enable_reasoning = true.
* extra_args ``Dotted.Path=JSON`` set any key (``BackendConfig.ScheduleConfig.maxQueueDelayMicroseconds=2000``).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from importlib import resources
from typing import Any

from perflab.contract.errors import UnsupportedOption
from perflab.contract.types import ServeConfig
from perflab_mindie.models import is_moe, names_quantization

TEMPLATE = "config_template.json"
DOCS = "https://github.com/Ascend/MindIE-LLM/tree/master/docs/zh/user_guide"

MTP_METHODS = frozenset({"mtp", "deepseek_mtp", "qwen3_next_mtp", "glm4_moe_mtp", "mimo_mtp", "ernie_mtp"})
#: reasoning parser -> key under ModelConfig.models (enable_reasoning.md: "qwen3"; Qwen3-30B-A3B
#: uses "qwen3_moe"; DeepSeek-R1 "deepseekv2")
REASONING_MODEL_TYPES = {"deepseek_r1": "deepseekv2", "deepseek-r1": "deepseekv2", "deepseek_v3": "deepseekv2"}


def load_template() -> dict[str, Any]:
    text = resources.files("perflab_mindie").joinpath(TEMPLATE).read_text(encoding="utf-8")
    return json.loads(text)


def _unsupported(option: str, why: str) -> UnsupportedOption:
    return UnsupportedOption("mindie", option, why)


def _plugin_params(plugins: list[str], extra: dict[str, Any]) -> str:
    # Compact JSON string, exactly as MindIE's docs write it: {"plugin_type":"prefix_cache"}
    return json.dumps({"plugin_type": ",".join(plugins), **extra}, separators=(",", ":"))


def _parse_override(arg: str) -> tuple[list[str], Any]:
    path, sep, raw = arg.partition("=")
    keys = [k for k in path.split(".") if k]
    if not sep or not keys or path.startswith("-"):
        raise _unsupported(
            f"extra_args {arg!r}",
            "MindIE has no command line: extra arguments must be config.json overrides 'Section.Key=JSON' "
            "(e.g. BackendConfig.ScheduleConfig.maxQueueDelayMicroseconds=2000)",
        )
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw  # a bare string
    return keys, value


def apply_override(cfg: dict[str, Any], arg: str) -> None:
    keys, value = _parse_override(arg)
    node: Any = cfg
    for i, key in enumerate(keys[:-1]):
        if isinstance(node, list) and key.isdigit() and int(key) < len(node):
            node = node[int(key)]
        elif isinstance(node, dict) and key in node:
            node = node[key]
        else:
            raise _unsupported(f"extra_args {arg!r}", f"config.json has no {'.'.join(keys[: i + 1])}")
    last = keys[-1]
    if isinstance(node, list) and last.isdigit() and int(last) < len(node):
        node[int(last)] = value
    elif isinstance(node, dict):
        node[last] = value
    else:
        raise _unsupported(f"extra_args {arg!r}", f"config.json's {'.'.join(keys[:-1])} holds no keys")


def _parallel(config: ServeConfig, mc: dict[str, Any], world: int) -> None:
    if (config.pp or 1) > 1 and (config.dp or 1) > 1:
        raise _unsupported(f"pp={config.pp} with dp={config.dp}", "MindIE cannot combine pipeline and data parallelism")
    if config.dp is not None:
        # with dp set, MindIE requires tp * dp == worldSize (data_parallel.md); tp defaults to worldSize
        mc["dp"] = config.dp
        mc["tp"] = config.tp or 1
    elif config.tp is not None:
        mc["tp"] = config.tp
    if config.pp is not None:
        mc["pp"] = config.pp
        mc["tp"] = config.tp or 1
    if config.ep is not None:
        if world % config.ep:
            raise _unsupported(
                f"ep={config.ep}", f"moe_ep must divide worldSize ({world}): moe_tp = worldSize / moe_ep"
            )
        mc["moe_ep"] = config.ep
        mc["moe_tp"] = world // config.ep


def _speculative(config: ServeConfig) -> tuple[list[str], dict[str, Any]]:
    spec = config.speculative_config or {}
    method = str(spec.get("method", "")).lower()
    if method not in MTP_METHODS:
        raise _unsupported(
            f"speculative_config.method={spec.get('method')!r}",
            "perflab maps only MTP to MindIE (plugin_type mtp); MindIE's lookahead/memory_decoding have no vLLM equivalent",
        )
    unknown = sorted(set(spec) - {"method", "num_speculative_tokens"})
    if unknown:
        raise _unsupported(
            f"speculative_config key(s) {', '.join(unknown)}",
            f"MindIE's MTP plugin takes only num_speculative_tokens ({DOCS}/feature/mtp.md)",
        )
    extra: dict[str, Any] = {}
    k = spec.get("num_speculative_tokens")
    if k is not None:
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise _unsupported(f"speculative_config.num_speculative_tokens={k!r}", "expected a positive integer")
        extra["num_speculative_tokens"] = k
    return ["mtp"], extra


def _reasoning_model_type(config: ServeConfig) -> str:
    explicit = config.options.get("model_type")
    if explicit:
        return str(explicit)
    parser = (config.reasoning_parser or "").lower()
    if parser == "qwen3":
        return "qwen3_moe" if is_moe(config.model) else "qwen3"
    if parser in REASONING_MODEL_TYPES:
        return REASONING_MODEL_TYPES[parser]
    raise _unsupported(
        f"reasoning_parser={config.reasoning_parser}",
        "MindIE enables reasoning per model type (models.<type>.enable_reasoning); perflab knows qwen3, "
        "deepseek_r1 — or set options.model_type",
    )


def build_config(
    config: ServeConfig,
    *,
    ip: str,
    port: int,
    management_port: int,
    metrics_port: int,
    devices: Sequence[int],
    model_name: str,
    model_context: int | None = None,
) -> tuple[dict[str, Any], list[str]]:
    """The config.json document and any warnings about how options were expressed."""
    cfg = copy.deepcopy(load_template())
    warnings: list[str] = []
    server = cfg["ServerConfig"]
    backend = cfg["BackendConfig"]
    deploy = backend["ModelDeployConfig"]
    mc = deploy["ModelConfig"][0]
    schedule = backend["ScheduleConfig"]

    server.update(
        ipAddress=ip,
        managementIpAddress=ip,
        port=port,
        managementPort=management_port,
        metricsPort=metrics_port,
        httpsEnabled=False,
        interCommTLSEnabled=False,
    )
    if ip in ("0.0.0.0", "::"):
        server["allowAllZeroIpListening"] = True  # MindIE refuses all-zero listening otherwise
    backend["interNodeTLSEnabled"] = False
    backend["npuDeviceIds"] = [list(devices)]

    world = config.world_size
    mc["modelName"] = model_name
    mc["modelWeightPath"] = config.model
    mc["worldSize"] = world
    _parallel(config, mc, world)

    mix = bool(config.chunked_prefill)
    if config.max_model_len is None and model_context:
        # GPUStack's defaults (ascend_mindie.py _default): the model's context for maxSeqLen,
        # maxIterTimes and maxPrefillTokens; maxInputTokenLen = min(maxSeqLen, prefill budget)
        length = int(model_context)
        deploy["maxSeqLen"] = length
        schedule["maxIterTimes"] = length
        budget = config.max_batched_tokens
        deploy["maxInputTokenLen"] = min(length, budget) if budget is not None and not mix else length
        if budget is None:
            schedule["maxPrefillTokens"] = max(int(schedule["maxPrefillTokens"]), length)
    elif config.max_model_len is None:
        # MindIE's own defaults are small; say so rather than silently truncating benchmarks
        warnings.append(
            f"max_model_len not set: MindIE's template limits apply (maxSeqLen {deploy['maxSeqLen']}, "
            f"maxInputTokenLen {deploy['maxInputTokenLen']}, maxIterTimes {schedule['maxIterTimes']} output tokens)"
        )
    else:
        length = config.max_model_len
        deploy["maxSeqLen"] = length
        deploy["maxInputTokenLen"] = length
        schedule["maxIterTimes"] = length
        if config.max_batched_tokens is None:
            schedule["maxPrefillTokens"] = max(int(schedule["maxPrefillTokens"]), length)
    if config.max_batched_tokens is not None:
        budget = config.max_batched_tokens
        input_len = int(deploy["maxInputTokenLen"])  # MindIE compares the configured value
        if budget < input_len and not mix:
            raise _unsupported(
                f"max_batched_tokens={budget}",
                f"MindIE requires maxPrefillTokens >= maxInputTokenLen ({input_len}) unless chunked prefill "
                "(SplitFuse) is on; lower max_model_len or enable chunked_prefill",
            )
        schedule["maxPrefillTokens"] = budget
    if config.max_num_seqs is not None:
        schedule["maxBatchSize"] = config.max_num_seqs
        schedule["maxPrefillBatchSize"] = config.max_num_seqs

    plugins: list[str] = []
    plugin_extra: dict[str, Any] = {}
    if config.speculative_config is not None:
        plugins, plugin_extra = _speculative(config)
    if config.prefix_caching:
        plugins.append("prefix_cache")
        schedule["enablePrefixCache"] = True
    if mix:
        plugins.append("splitfuse")
        schedule["templateType"] = "Mix"
    if plugins:
        mc["plugin_params"] = _plugin_params(plugins, plugin_extra)

    if config.quantization is not None:
        if not (config.options.get("prequantized") or names_quantization(config.model, config.quantization)):
            raise _unsupported(
                f"quantization={config.quantization}",
                "MindIE serves weights quantized beforehand (msModelSlim, e.g. a ...-W8A8 checkpoint) and has no "
                "quantization key; pass the quantized checkpoint (or options.prequantized for a local path)",
            )
        warnings.append(
            f"quantization={config.quantization}: MindIE reads it from the quantized weights; config.json has no key for it"
        )
    if config.kv_cache_dtype not in (None, "auto"):
        raise _unsupported(
            f"kv_cache_dtype={config.kv_cache_dtype}",
            "MindIE's KV-cache int8 comes with msModelSlim-quantized weights (kv_cache_int8.md); config.json has no key",
        )
    if config.reasoning_parser is not None:
        models = mc.setdefault("models", {})
        models.setdefault(_reasoning_model_type(config), {})["enable_reasoning"] = True

    for arg in config.extra_args:
        apply_override(cfg, arg)
    return cfg, warnings


def changed_keys(document: dict[str, Any]) -> dict[str, Any]:
    """{dotted key: value} of every config.json value that differs from MindIE's template (what
    a user must set in their own config.json to serve the same configuration)."""
    out: dict[str, Any] = {}

    def walk(node: Any, base: Any, prefix: str) -> None:
        if isinstance(node, dict) and isinstance(base, dict):
            for key, value in node.items():
                walk(value, base.get(key, _MISSING), f"{prefix}{key}.")
        elif isinstance(node, list) and isinstance(base, list) and len(node) == len(base) and node and all(
                isinstance(x, dict) for x in node):
            for i, (a, b) in enumerate(zip(node, base, strict=True)):
                walk(a, b, f"{prefix}{i}.")
        elif node != base:
            out[prefix.rstrip(".")] = node

    walk(document, load_template(), "")
    return out


_MISSING = object()
