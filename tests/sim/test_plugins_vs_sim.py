"""The real plugins' launches, parsed by the simulator's front ends: every flag a plugin writes
must be one the engine accepts, and must mean what the plugin meant.

For each engine the installed plugins register, a few serving configurations are built with
``pm.engine(name).build_launch`` on a simulated machine, the launch's files are written, and
its argv (``python -m sglang.launch_server ARGS`` for SGLang) or MindIE's config.json is parsed
by the front end the argv names. A case an engine cannot run is declared in the case
(``refused_by``): the plugin must refuse it, by a preflight error or by ``UnsupportedOption``,
with a reason naming why; every other case must build and parse. Nothing is skipped.
"""

from __future__ import annotations

import importlib
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from perflab import plugins
from perflab.contract.errors import UnsupportedOption
from perflab.contract.types import ServeConfig
from perflab.hardware import resolve
from perflab_sim.config import SimEngineConfig
from perflab_sim.frontends import frontend_for
from perflab_sim.frontends.common import EngineExit

MACHINE = {"cuda": "sim:a100-80g-x8", "ascend": "sim:910b3-x8"}
DENSE = "Qwen/Qwen3-8B"


@dataclass(frozen=True)
class Case:
    name: str
    options: dict[str, Any]
    expect: dict[str, Any] = field(default_factory=dict)  # SimEngineConfig field -> value
    model: str = DENSE
    # engine -> a fragment of the reason its plugin gives for refusing this case
    refused_by: dict[str, str] = field(default_factory=dict)


CASES = [
    Case("baseline", {}, {"tp": 1}),
    Case("tp", {"tp": 2}, {"tp": 2}),
    Case("max-model-len", {"max_model_len": 8192}, {"max_model_len": 8192}),
    Case("max-batched-tokens", {"max_batched_tokens": 4096}, {"max_batched_tokens": 4096}),
    Case("max-num-seqs", {"max_num_seqs": 128}, {"max_num_seqs": 128}),
    Case("prefix-caching-on", {"prefix_caching": True}, {"prefix_caching": True}),
    Case("prefix-caching-off", {"prefix_caching": False}, {"prefix_caching": False}),
    Case("speculative-ngram", {"speculative_config": {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}}, {"spec_method": "ngram"},
         refused_by={"mindie": "speculative_config.method='ngram'"}),
    Case("quantization-fp8", {"quantization": "fp8"}, {"quantization": "fp8"}, model="Qwen/Qwen3-8B-FP8",
         refused_by={"sglang": "SM89+", "trtllm": "SM89+", "vllm-ascend": "does not support fp8"}),  # A100: SM80
    Case("quantization-w8a8", {"quantization": "w8a8"}, {"quantization": "w8a8"}, model="Qwen/Qwen3-8B-W8A8",
         refused_by={"sglang": "quantization=w8a8", "vllm": "Unknown quantization method",
                     "vllm-ascend": "not supported in npu"}),
    Case("mem-fraction", {"mem_fraction": 0.85}, {}),
    Case("served-name", {"served_model_name": "qwen"}, {}, refused_by={"trtllm": "no served-model-name option"}),
]


@pytest.fixture(scope="module")
def pm() -> plugins.PluginManager:
    return plugins.load()


@pytest.fixture(scope="module")
def machines(pm: plugins.PluginManager) -> dict[str, tuple[Any, dict[str, str]]]:
    """Each simulated machine probed once (the probes run the stand-in npu-smi / NVML)."""
    cache: dict[str, tuple[Any, dict[str, str]]] = {}

    class Lazy(dict):  # type: ignore[type-arg]
        def __missing__(self, kind: str) -> tuple[Any, dict[str, str]]:
            cache[kind] = resolve(pm, MACHINE[kind], base_env={"PATH": os.environ.get("PATH", "")})
            self[kind] = cache[kind]
            return cache[kind]

    return Lazy()


def free_ports(n: int) -> list[int]:
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


def engine_names() -> list[str]:
    """The installed engines the simulator runs (transformers serve, say, it does not: a launch
    of it on a simulated machine is refused in one line, tests/plugins/test_transformers.py)."""
    from perflab_sim.catalog import ENGINES_BY_KIND

    simulated = {e for names in ENGINES_BY_KIND.values() for e in names}
    return [e for e in plugins.load().engine_names() if e in simulated]


def parse_launch(spec: Any, env: dict[str, str]) -> SimEngineConfig:
    module, args = frontend_for(spec.argv)
    front = importlib.import_module(module)
    return front.parse(args, {**env, **dict(spec.env)})


@pytest.mark.parametrize("engine", engine_names())
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_plugin_launch_parses_in_the_simulator(
    pm: plugins.PluginManager, machines: dict[str, tuple[Any, dict[str, str]]], engine: str, case: Case, tmp_path: Path
) -> None:
    info = pm.engine(engine).info
    kind = "ascend" if "ascend" in info.accelerators else "cuda"
    snapshot, env = machines[kind]
    version = pm.engine(engine).engine.version(env)
    port = free_ports(1)[0]
    config = ServeConfig(model=case.model, host="127.0.0.1", port=port, **case.options)
    if engine == "mindie" and case.model == DENSE and case.name == "tp":
        config = config.replace(model="Qwen/Qwen3-14B")
    problems = [u for u in pm.engine(engine).check_support(config, snapshot, version) if u.severity == "error"]
    refused = f"{problems[0].what}: {problems[0].why}" if problems else None
    if refused is None:
        try:
            spec = pm.engine(engine).build_launch(config, snapshot, tmp_path, version)
        except UnsupportedOption as exc:
            refused = str(exc)
    if engine in case.refused_by:
        assert refused is not None, f"{engine} accepts {case.name}; expected a refusal naming {case.refused_by[engine]!r}"
        assert case.refused_by[engine] in refused, f"{engine} refuses {case.name} for another reason: {refused}"
        return
    assert refused is None, f"{engine} refuses {case.name}: {refused}"
    for f in spec.files:
        path = Path(f.path) if os.path.isabs(f.path) else tmp_path / f.path
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f.content)
        path.chmod(f.mode)
    try:
        cfg = parse_launch(spec, env)
    except EngineExit as exc:
        pytest.fail(f"the simulated {engine} refuses the plugin's launch {list(spec.argv)} (exit {exc.code}):\n{exc.stdout}{exc.stderr}")
    assert cfg.fail_lines == (), f"{engine} would crash: {cfg.fail_lines[-1:]}"
    assert cfg.port == spec.port
    assert spec.served_model_name in cfg.served_model_names
    for key, value in case.expect.items():
        assert getattr(cfg, key) == value, f"{engine} {case.name}: {key} is {getattr(cfg, key)!r}, expected {value!r}"
    if "mem_fraction" in case.options and engine in ("vllm", "vllm-ascend", "sglang"):
        assert cfg.mem_fraction == case.options["mem_fraction"]
    if "speculative_config" in case.options:
        assert cfg.spec_tokens == 4


def test_every_engine_plugin_is_covered(pm: plugins.PluginManager) -> None:
    """The five engines the design names are all registered, so the matrix above is complete."""
    assert {"vllm", "vllm-ascend", "sglang", "trtllm", "mindie"} <= set(pm.engine_names())
