"""The out-of-tree llama.cpp example plugin against the real llama-server's behaviour.

The plugin is imported from its source tree (tests/external_plugins/llamacpp); the real
server log it is checked against is in that plugin's tests/fixtures (llama-server 0.6.0-dev,
upstream sources, on CPU). The conformance suite on the *installed* plugin runs in
tests/plugin_kit.
"""

from __future__ import annotations

import re
import stat
import sys
from pathlib import Path

import pytest
from perflab import Accelerator, HardwareSnapshot, ServeConfig

PLUGIN_SRC = Path(__file__).resolve().parents[1] / "external_plugins" / "llamacpp"
FIXTURES = PLUGIN_SRC / "tests" / "fixtures"

CPU = HardwareSnapshot(accelerators=(Accelerator(vendor="amd", kind="cpu", index=0, name="AMD EPYC", memory_total_mib=24000,
                                                 cores=2, cpu_list="0-1", source="procfs"),))
GPUS = HardwareSnapshot(accelerators=tuple(Accelerator(vendor="nvidia", kind="cuda", index=i, name="NVIDIA L4",
                                                       memory_total_mib=23034, compute_capability=(8, 9)) for i in range(2)))


@pytest.fixture
def plugin(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    monkeypatch.syspath_prepend(str(PLUGIN_SRC))
    sys.modules.pop("perflab_llamacpp", None)
    import perflab_llamacpp

    yield perflab_llamacpp
    sys.modules.pop("perflab_llamacpp", None)


def build(plugin, hw: HardwareSnapshot = CPU, **kw):  # type: ignore[no-untyped-def]
    kw.setdefault("port", 8080)
    return plugin.perflab_build_launch("llama-cpp", ServeConfig(model="/models/tiny-llama.gguf", **kw), hw, Path("/tmp"))


def test_ready_pattern_matches_the_real_log_once_and_only_the_ready_line(plugin) -> None:
    lines = (FIXTURES / "server.log").read_text().splitlines()
    patterns = plugin.perflab_readiness("llama-cpp", build(plugin)).ready_log_patterns
    hits = [line for line in lines if any(re.search(p, line) for p in patterns)]
    assert hits == ["0.00.080.619 I srv  llama_server: listening on http://127.0.0.1:18080"]
    # and the wording of releases before 0.6 (tools/server/server.cpp main())
    old = "main: server is listening on http://127.0.0.1:8080"
    assert any(re.search(p, old) for p in patterns)
    sigterm = (FIXTURES / "sigterm.log").read_text().splitlines()
    assert sum(any(re.search(p, line) for p in patterns) for line in sigterm) == 1


@pytest.mark.parametrize(
    ("out", "version"),
    [
        ("version: 0.6.0-dev (build 1, commit abcdef0)\nbuilt with cc for x86_64-linux-gnu\n", "0.6.0-dev (build 1, commit abcdef0)"),
        ("version: 6123 (9a0e6ab1)\nbuilt with cc for x86_64-linux-gnu\n", "b6123 (9a0e6ab1)"),
        ("llama-server: unknown argument\n", None),
    ],
)
def test_version_formats(plugin, out: str, version: str | None) -> None:
    assert plugin.parse_version(out) == version


def test_version_from_the_executable(plugin, tmp_path: Path) -> None:
    exe = tmp_path / "llama-server"
    exe.write_text("#!/bin/sh\necho 'version: 0.6.0-dev (build 1, commit abcdef0)' >&2\necho 'built with cc for x86_64-linux-gnu' >&2\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    assert plugin.perflab_engine_version("llama-cpp", {"PATH": str(tmp_path)}) == "0.6.0-dev (build 1, commit abcdef0)"
    assert plugin.perflab_engine_version("llama-cpp", {"PATH": str(tmp_path / "none")}) is None


def test_ctx_size_is_shared_by_the_slots(plugin) -> None:
    # the real log: n_slots = 4, n_ctx_slot = 1024 -> --ctx-size 4096 --parallel 4 serves 1024 per request
    log = (FIXTURES / "server.log").read_text()
    m = re.search(r"n_slots = (\d+), n_ctx_slot = (\d+)", log)
    assert m
    slots, per_slot = int(m.group(1)), int(m.group(2))
    argv = build(plugin, max_model_len=per_slot, max_num_seqs=slots).argv
    i, j = argv.index("--ctx-size"), argv.index("--parallel")
    assert (int(argv[i + 1]), int(argv[j + 1])) == (slots * per_slot, slots)
    # max_model_len alone: llama-server's default 4 slots, passed explicitly
    argv = build(plugin, max_model_len=2048).argv
    assert argv[argv.index("--ctx-size") + 1] == "8192" and argv[argv.index("--parallel") + 1] == "4"
    argv = build(plugin, max_num_seqs=2).argv
    assert "--ctx-size" not in argv and argv[argv.index("--parallel") + 1] == "2"


def test_runs_on_cpu(plugin) -> None:
    registered = []
    plugin.perflab_register_engines(registered.append)
    (info,) = registered
    assert "cpu" in info.accelerators and info.accelerators[0] == "cuda"
    spec = build(plugin, CPU)
    assert "CUDA_VISIBLE_DEVICES" not in spec.env
    refused = plugin.perflab_check_support("llama-cpp", ServeConfig(model="m.gguf", devices=(0,)), CPU)
    assert [u.what for u in refused] == ["devices"]
    assert plugin.perflab_check_support("llama-cpp", ServeConfig(model="m.gguf", devices=(0,)), GPUS) == []
    assert build(plugin, GPUS, devices=(1,)).env["CUDA_VISIBLE_DEVICES"] == "1"
