"""ServeConfig -> ``transformers serve`` argv (transformers 5.19.0, transformers/cli/serve.py).

``transformers serve`` is one process (Typer's ``Serve`` command, Uvicorn inside) that preloads
the forced model (the positional FORCE_MODEL) and serves only it. Choices:

* the device: ``--device cpu`` on a machine with no CUDA GPU (the flag's default, ``auto``,
  would still work there, but the command says what runs); on CUDA, ``--device cuda`` for one
  visible GPU and ``auto`` (accelerate's ``device_map="auto"``, layers spread over the GPUs)
  for several. perflab's ``devices`` selects them through CUDA_VISIBLE_DEVICES.
* continuous batching is off by default (serve.py ``continuous_batching: bool = False``), as
  in transformers; the ``continuous_batching`` engine option turns it on, and so does any
  option that configures it (``max_batched_tokens`` -> ``--cb-max-batch-tokens``,
  ``mem_fraction`` -> ``--cb-max-memory-percent``, the ``cb_*`` engine options): serve.py
  builds a ContinuousBatchingConfig from them, used only with ``--continuous-batching``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from perflab.contract.errors import UnsupportedOption
from perflab.contract.plugin_base import fraction, positive, refuse_unknown
from perflab.contract.types import HardwareSnapshot, LaunchSpec, ServeConfig

SERVE = "transformers 5.19.0: transformers/cli/serve.py"
ENGINE = "transformers"
DEFAULT_PORT = 8000  # serve.py: port: int = 8000
# model_manager.py ModelManager._validate_args: "Must be 'bnb-4bit' or 'bnb-8bit'"
QUANTIZATIONS = ("bnb-4bit", "bnb-8bit")
# model_manager.py: VALID_ATTN_IMPLEMENTATIONS (a hub kernel id "org/name" is accepted too)
ATTN_IMPLEMENTATIONS = ("eager", "sdpa", "flash_attention_2", "flash_attention_3", "flex_attention")

#: engine option -> (its flag, its kind): the serve.py options perflab passes through
#: ``ServeConfig.options`` (``--engine-option dtype=bfloat16``); "bool" flags are Typer's
#: ``--NAME/--no-NAME`` pairs, "cb" marks a continuous-batching setting
OPTIONS: Mapping[str, tuple[str, str]] = {
    "dtype": ("--dtype", "str"),  # "auto" (from the weights) or a torch dtype name: float32, bfloat16 ...
    "attn_implementation": ("--attn-implementation", "attn"),
    "continuous_batching": ("--continuous-batching", "bool"),
    "cb_block_size": ("--cb-block-size", "cb_int"),
    "cb_num_blocks": ("--cb-num-blocks", "cb_int"),
    "cb_use_cuda_graph": ("--cb-use-cuda-graph", "cb_bool"),
    "compile": ("--compile", "bool"),
    "trust_remote_code": ("--trust-remote-code", "bool"),
    "device": ("--device", "str"),  # replaces the device perflab chooses
    "default_seed": ("--default-seed", "int"),
    "log_level": ("--log-level", "str"),
}


def device(config: ServeConfig, hardware: HardwareSnapshot | None) -> str:
    """``--device``: cpu without a CUDA GPU, cuda for one visible GPU, auto for several."""
    if hardware is not None and not hardware.of_kind("cuda") and hardware.of_kind("cpu"):
        return "cpu"
    if hardware is None or not hardware.of_kind("cuda"):
        return "auto"
    count = len(config.devices) if config.devices is not None else len(hardware.of_kind("cuda"))
    return "cuda" if count == 1 else "auto"


def _flag(flag: str, kind: str, name: str, value: Any) -> list[str]:
    if kind.endswith("bool"):
        if not isinstance(value, bool):
            raise UnsupportedOption(ENGINE, f"option {name}={value}", "expects true or false")
        return [flag if value else "--no-" + flag.removeprefix("--")]
    if kind.endswith("int"):
        if not isinstance(value, int) or isinstance(value, bool):
            raise UnsupportedOption(ENGINE, f"option {name}={value}", "expects an integer")
        return [flag, positive(ENGINE, name, value) if kind == "cb_int" else str(value)]
    if kind == "attn" and value not in ATTN_IMPLEMENTATIONS and "/" not in str(value):
        raise UnsupportedOption(ENGINE, f"option {name}={value}",
                                f"--attn-implementation accepts {', '.join(ATTN_IMPLEMENTATIONS)} or a hub kernel id")
    return [flag, str(value)]


def build_argv(config: ServeConfig, hardware: HardwareSnapshot | None) -> list[str]:
    """The argv of ``transformers serve`` for ``config`` on ``hardware``."""
    refuse_unknown(ENGINE, config.options, OPTIONS, "option(s)",
                   f"the transformers plugin knows only {', '.join(sorted(OPTIONS))}")
    options = dict(config.options)
    argv = ["transformers", "serve", config.model, "--device", str(options.pop("device", None) or device(config, hardware))]
    argv += ["--host", config.host, "--port", str(config.port or DEFAULT_PORT)]
    cb = options.pop("continuous_batching", None)
    cb_args: list[str] = []
    if config.max_batched_tokens is not None:
        cb_args += ["--cb-max-batch-tokens", positive(ENGINE, "max_batched_tokens", config.max_batched_tokens)]
    if config.mem_fraction is not None:
        cb_args += ["--cb-max-memory-percent", fraction(ENGINE, "mem_fraction", config.mem_fraction)]
    other: list[str] = []
    for name in sorted(options):
        flag, kind = OPTIONS[name]
        (cb_args if kind.startswith("cb") else other).extend(_flag(flag, kind, name, options[name]))
    if cb_args and cb is False:
        raise UnsupportedOption(ENGINE, "continuous_batching=false",
                                f"{' '.join(a for a in cb_args if a.startswith('--'))} configure continuous batching, "
                                "which this launch turns off")
    if cb is not None:
        _flag("--continuous-batching", "bool", "continuous_batching", cb)
    if cb or cb_args:
        argv.append("--continuous-batching")
    argv += cb_args + other
    if config.quantization is not None:
        if config.quantization not in QUANTIZATIONS:
            raise UnsupportedOption(ENGINE, f"quantization={config.quantization}",
                                    f"--quantization accepts {' or '.join(QUANTIZATIONS)} (bitsandbytes)")
        argv += ["--quantization", config.quantization]
    argv += list(config.extra_args)
    return argv


def build(config: ServeConfig, hardware: HardwareSnapshot | None, env: Mapping[str, str]) -> LaunchSpec:
    """The launch; ``env`` is the device environment perflab_transformers.plugin made. Requests
    name the model as given: the server answers only to the forced model (utils.py
    ``_resolve_model``: HTTP 400 "Server is pinned to ..." for any other name)."""
    return LaunchSpec(engine=ENGINE, argv=tuple(build_argv(config, hardware)), host=config.host,
                      port=int(config.port or DEFAULT_PORT), served_model_name=config.model, env=env)
