"""Simulated machines: the catalog, activation (stand-in executables, distributions, MindIE
install), the npu-smi stand-in against the real outputs, the NVML shim and the memory registry."""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import psutil
import pynvml
import pytest

import perflab_sim as sim
from perflab.contract.errors import UsageError
from perflab_sim import catalog, npusmi, state
from perflab_sim.nvml import NvmlShim

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "npu-smi"


@pytest.fixture
def sim_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Activation under a private TMPDIR, so tests never share the per-user tree."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def base_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PERFLAB_SIM_", "MIES_"))}
    env["PERFLAB_SIM_STATE_DIR"] = str(tmp_path / "state")
    return env


# catalog --------------------------------------------------------------------------------------


def test_catalog_machines_and_datasheet_figures() -> None:
    assert {"a100-80g-x1", "a100-80g-x8", "h100-80g-x1", "h100-80g-x8", "910b3-x1", "910b3-x8"} <= set(catalog.names())
    a100 = catalog.get("a100-80g-x8")
    assert (a100.count, a100.chip.name, a100.chip.compute_capability) == (8, "NVIDIA A100-SXM4-80GB", (8, 0))
    assert a100.chip.fp8_tflops is None  # Ampere has no FP8 tensor cores
    assert a100.cuda_driver_version_int == 12040 and a100.driver_version.startswith("550.")
    h100 = catalog.get("h100-80g-x1")
    assert h100.chip.compute_capability == (9, 0) and h100.chip.fp8_tflops == pytest.approx(2 * h100.chip.bf16_tflops, rel=1e-3)
    npu = catalog.get("910b3-x8")
    assert (npu.chip.memory_mib, npu.count, npu.is_ascend) == (65536, 8, True)
    assert len({npu.bus_id(i) for i in range(8)}) == 8


def test_unknown_machine_names_the_catalog() -> None:
    with pytest.raises(UsageError) as err:
        catalog.get("tpu-v5")
    assert "tpu-v5" in str(err.value) and "a100-80g-x8" in str(err.value) and "910b3-x1" in str(err.value)
    with pytest.raises(UsageError):
        sim.activate("tpu-v5", {})


# activation -----------------------------------------------------------------------------------


def test_activate_cuda_machine(sim_tmp: Path) -> None:
    env = sim.activate("a100-80g-x8", {"PATH": "/usr/bin", "KEEP": "me"})
    bin_dir = Path(env["PATH"].split(os.pathsep)[0])
    py_dir = Path(env["PYTHONPATH"].split(os.pathsep)[0])
    assert env["PATH"].endswith(os.pathsep + "/usr/bin") and env["KEEP"] == "me"
    assert env["PERFLAB_SIM_HARDWARE"] == "a100-80g-x8"
    assert Path(env["PERFLAB_SIM_STATE_DIR"]).is_dir()
    assert "MIES_INSTALL_PATH" not in env
    for exe in ("vllm", "trtllm-serve", "mindieservice_daemon"):
        script = bin_dir / exe
        assert os.access(script, os.X_OK)
        assert script.read_text().splitlines()[0] == f"#!{sys.executable}"
    assert not (bin_dir / "npu-smi").exists()
    versions = {d.metadata["Name"]: d.version for d in importlib.metadata.distributions(path=[str(py_dir)])}
    assert versions == {"vllm": "0.11.0", "sglang": "0.5.5.post1", "tensorrt_llm": "1.2.0rc1"}
    # `python -m sglang.launch_server` resolves to the stand-in
    found = subprocess.run(
        [sys.executable, "-c", "import importlib.util as u; print(u.find_spec('sglang.launch_server').origin)"],
        env=env, capture_output=True, text=True, check=True,
    )
    assert Path(found.stdout.strip()) == py_dir / "sglang" / "launch_server.py"


def test_activate_ascend_machine_with_mindie_install(sim_tmp: Path) -> None:
    env = sim.activate("910b3-x8", {"PATH": "/usr/bin"})
    bin_dir = Path(env["PATH"].split(os.pathsep)[0])
    py_dir = Path(env["PYTHONPATH"].split(os.pathsep)[0])
    assert os.access(bin_dir / "npu-smi", os.X_OK)
    versions = {d.metadata["Name"]: d.version for d in importlib.metadata.distributions(path=[str(py_dir)])}
    assert versions == {"vllm": "0.9.1", "vllm_ascend": "0.9.1"}
    mies = Path(env["MIES_INSTALL_PATH"])
    info = dict(line.split(":", 1) for line in (mies / "version.info").read_text().splitlines())
    assert info["Ascend-mindie "].strip() == "2.1.RC1"
    assert os.access(mies / "bin" / "mindieservice_daemon", os.X_OK)
    done = subprocess.run(["npu-smi", "info", "-m"], env=env, capture_output=True, text=True, check=True)
    assert "Ascend 910B3" in done.stdout


def test_npu_smi_stand_in_answers_in_process_as_the_executable_does(sim_tmp: Path) -> None:
    """The probe asks the activated machine's npu-smi in-process (PERFLAB_NPU_SMI): the same
    accelerators as through the executable on PATH, one process per call; its errors are the
    tool's (one line), never the probe's crash."""
    import shutil

    from perflab.hardware.npusmi import NpuSmiError, read_npus, run_npu_smi
    from perflab.hardware.standins import NPU_SMI_ENV

    env = sim.activate("910b3-x8", base_env(sim_tmp))
    exe = shutil.which("npu-smi", path=env["PATH"])
    assert exe is not None and env[NPU_SMI_ENV] == "perflab_sim.npusmi:answer"
    through_process = read_npus(exe, {k: v for k, v in env.items() if k != NPU_SMI_ENV}, source="sim")
    in_process = read_npus(exe, env, source="sim")
    assert len(in_process) == 8 and in_process == through_process
    with pytest.raises(NpuSmiError, match=r"^`.*npu-smi info -t bogus -i 0` failed: Error: unsupported type"):
        run_npu_smi(exe, ["info", "-t", "bogus", "-i", "0"], env, 5.0)


def test_activate_is_idempotent_and_race_safe(sim_tmp: Path) -> None:
    results: list[dict[str, str]] = []
    threads = [threading.Thread(target=lambda: results.append(sim.activate("h100-80g-x1", {}))) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(results) == 6 and len({r["PATH"] for r in results}) == 1
    again = sim.activate("h100-80g-x1", results[0])  # re-activation does not stack entries
    assert again["PATH"] == results[0]["PATH"] and again["PYTHONPATH"] == results[0]["PYTHONPATH"]
    trees = list((sim_tmp / f"perflab-sim-{os.getuid()}" / "h100-80g-x1").iterdir())
    assert sorted(p.name for p in trees if p.name.startswith("env-")) == [Path(results[0]["PATH"].split(os.pathsep)[0]).parent.name]
    assert not [p for p in trees if p.name.startswith(".building")]


def dist_versions(env: dict[str, str]) -> dict[str, str]:
    py_dir = Path(env["PYTHONPATH"].split(os.pathsep)[0])
    return {d.metadata["Name"]: d.version for d in importlib.metadata.distributions(path=[str(py_dir)])}


def test_activate_writes_the_machines_seed_versions_or_those_of_the_environment(sim_tmp: Path) -> None:
    # seed 004: vLLM 0.17.1 and SGLang 0.5.9 on H100
    h100 = sim.activate("h100-80g-x1", {"PATH": "/usr/bin"})
    assert dist_versions(h100) == {"vllm": "0.17.1", "sglang": "0.5.9", "tensorrt_llm": "1.2.0rc1"}
    chosen = sim.activate("a100-80g-x1", {"PATH": "/usr/bin", "PERFLAB_SIM_ENGINE_VERSIONS": " vllm=0.17.1, tensorrt_llm=1.3.0 ,mindie=2.2.RC1"})
    assert dist_versions(chosen) == {"vllm": "0.17.1", "sglang": "0.5.5.post1", "tensorrt_llm": "1.3.0"}  # MindIE: not on A100
    plain = sim.activate("a100-80g-x1", {"PATH": "/usr/bin"})
    assert plain["PYTHONPATH"] != chosen["PYTHONPATH"] and dist_versions(plain)["vllm"] == "0.11.0"
    ascend = sim.activate("910b3-x1", {"PATH": "/usr/bin", "PERFLAB_SIM_ENGINE_VERSIONS": "vllm-ascend=0.11.0rc2,mindie=2.2.RC1"})
    assert dist_versions(ascend) == {"vllm": "0.9.1", "vllm_ascend": "0.11.0rc2"}
    info = (Path(ascend["MIES_INSTALL_PATH"]) / "version.info").read_text()
    assert info.splitlines()[0] == "Ascend-mindie : 2.2.RC1"
    done = subprocess.run(["vllm", "--version"], env=chosen, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "0.17.1"


def test_a_plans_engine_versions_reach_the_activated_machine(sim_tmp: Path) -> None:
    from perflab.lab.plan import load_plan_text

    text = (
        "model: {id: Qwen/Qwen3.5-9B}\nhardware: sim:h100-80g-x1\nengines: [vllm]\n"
        "simulation: {time_scale: 20, engine_versions: {vllm: '0.16.0', tensorrt_llm: '1.3.0'}}\n"
        "candidates: [{name: Seqs, set: {max_num_seqs: 512}}]\n"
        "profiles: {short: {input_len: 128, output_len: 4, num_prompts: 10}}\n"
    )
    plan = load_plan_text(text, path=Path("plan.yaml"), known_engines=["vllm"])
    from perflab.hardware.emulation import ENGINE_VERSIONS_ENV  # the lab's variable: the simulator reads it

    assert plan.sim_environment() == {ENGINE_VERSIONS_ENV: "trtllm=1.3.0,vllm=0.16.0"}
    env = sim.activate("h100-80g-x1", {"PATH": "/usr/bin", **plan.sim_environment()})
    assert dist_versions(env) == {"vllm": "0.16.0", "sglang": "0.5.9", "tensorrt_llm": "1.3.0"}
    bad = text.replace("'0.16.0'", "0.16")
    with pytest.raises(UsageError, match=r"simulation.engine_versions.vllm: expected a version string such as '0.17.1' \(quote it\), got 0.16"):
        load_plan_text(bad, path=Path("plan.yaml"), known_engines=["vllm"])


@pytest.mark.parametrize(
    "value, message",
    [
        ("vllm", "expected ENGINE=VERSION, got 'vllm'"),
        ("vlm=0.17.1", "unknown engine 'vlm' (expected one of: vllm, sglang, trtllm, vllm-ascend, mindie)"),
        ("vllm=latest", "vllm='latest' is not a version (expected e.g. 0.17.1)"),
    ],
)
def test_activate_refuses_bad_engine_versions_in_one_line(sim_tmp: Path, value: str, message: str) -> None:
    with pytest.raises(UsageError) as err:
        sim.activate("h100-80g-x1", {"PERFLAB_SIM_ENGINE_VERSIONS": value})
    assert str(err.value) == f"PERFLAB_SIM_ENGINE_VERSIONS: {message}"


def test_activate_keeps_a_state_dir_chosen_for_the_machine(sim_tmp: Path) -> None:
    mine = str(sim_tmp / "mine")
    assert sim.activate("a100-80g-x1", {"PERFLAB_SIM_STATE_DIR": mine})["PERFLAB_SIM_STATE_DIR"] == mine
    other = sim.activate("910b3-x1", {"PERFLAB_SIM_STATE_DIR": mine, "PERFLAB_SIM_HARDWARE": "a100-80g-x1"})
    assert other["PERFLAB_SIM_STATE_DIR"] != mine


# npu-smi stand-in vs the real tool ------------------------------------------------------------


def _separators(line: str) -> list[int]:
    return [m.start() for m in re.finditer(r"[|+]", line)]


def test_npu_smi_info_table_is_byte_exact_for_the_fixture_values() -> None:
    rows = [npusmi.ChipRow(4, "910B3", "OK", "93.6", 40, 0, 0, 0, "0000:01:00.0", 0, 0, 0, 3161, 65536)]
    assert npusmi.render_info("23.0.1", rows, []) == (FIXTURES / "910B3_info.txt").read_text()
    real = (FIXTURES / "910B1-with-processes_info.txt").read_text().splitlines()
    rows = [
        npusmi.ChipRow(0, "910B1", "OK", "271.1", 41, 0, 0, 0, "0000:C1:00.0", 55, 0, 0, 65099, 65536),
        npusmi.ChipRow(1, "910B1", "OK", "275.0", 42, 0, 0, 0, "0000:01:00.0", 66, 0, 0, 65098, 65536),
    ]
    procs = [npusmi.ProcessRow(0, 0, 576489, "python", 60703), npusmi.ProcessRow(1, 0, 576491, "python", 60704)]
    ours = npusmi.render_info("23.0.rc3.3", rows, procs).splitlines()
    # identical except the version line, where the real 23.0.rc3.3 tool is one column short
    assert [i for i, (a, b) in enumerate(zip(real, ours, strict=True)) if a != b] == [1]


def _run_npu_smi(args: list[str], env: dict[str, str]) -> str:
    return npusmi.run(args, env)


def test_npu_smi_stand_in_matches_real_line_structure(tmp_path: Path) -> None:
    env = {"PERFLAB_SIM_HARDWARE": "910b3-x8", "PERFLAB_SIM_STATE_DIR": str(tmp_path)}
    table = _run_npu_smi(["info"], env).splitlines()
    real = (FIXTURES / "910B3_info.txt").read_text().splitlines()
    chip_lines = table[6:6 + 3 * 8]
    for i in range(8):
        for j in range(3):
            assert _separators(chip_lines[3 * i + j]) == _separators(real[6 + j])
    assert table[:6] == real[:6]
    assert table[-2 * 8 - 3:-2 * 8] == real[-5:-2]  # process table header
    assert table[-2] == "| No running processes found in NPU 7".ljust(97) + "|"
    mapping = _run_npu_smi(["info", "-m"], env)
    assert mapping == (FIXTURES / "910B_info-m.txt").read_text().replace("Ascend xxx", "Ascend 910B3")
    for kind, fixture, extra in (
        ("usages", "910B_info-t-usages.txt", []),
        ("common", "910B_info-t-common.txt", []),
        ("board", "910B_info-t-board.txt", ["-c", "0"]),
    ):
        ours = _run_npu_smi(["info", "-t", kind, "-i", "0", *extra], env).splitlines()
        theirs = (FIXTURES / fixture).read_text().splitlines()
        assert [line.split(":")[0] for line in ours] == [line.split(":")[0] for line in theirs], kind
        assert all(line.index(":") == 31 for line in ours if line), kind
    usages = _run_npu_smi(["info", "-t", "usages", "-i", "3"], env)
    assert "HBM Capacity(MB)               : 65536" in usages and "NPU ID                         : 3" in usages


def test_npu_smi_shows_registered_memory_and_processes(tmp_path: Path) -> None:
    env = {"PERFLAB_SIM_HARDWARE": "910b3-x1", "PERFLAB_SIM_STATE_DIR": str(tmp_path)}
    state.register(tmp_path, "mindie", "mindieservice_d", [0], [50000])
    try:
        table = _run_npu_smi(["info"], env)
        assert "53161/ 65536" in table
        row = next(line for line in table.splitlines() if f"| {os.getpid():<14}|" in line)
        assert "mindieservice_d" in row and "| 50000 " in row
        assert "HBM Usage Rate(%)              : 81" in _run_npu_smi(["info", "-t", "usages", "-i", "0"], env)
    finally:
        state.unregister(tmp_path)
    assert "3161 / 65536" in _run_npu_smi(["info"], env)


def test_npu_smi_errors_exit_non_zero(sim_tmp: Path) -> None:
    env = sim.activate("910b3-x1", base_env(sim_tmp))
    for args in (["info", "-t", "usages", "-i", "5"], ["info", "-t", "nope", "-i", "0"], ["info", "--bogus"], ["reset"]):
        done = subprocess.run(["npu-smi", *args], env=env, capture_output=True, text=True)
        assert done.returncode != 0 and done.stderr.strip() and not done.stdout, args
    ok = subprocess.run(["npu-smi", "info", "-t", "board", "-i", "0", "-c", "0"], env=env, capture_output=True, text=True)
    assert ok.returncode == 0 and "VDie ID" in ok.stdout
    cuda = subprocess.run([sys.executable, "-m", "perflab_sim.npusmi", "info"],
                          env={**env, "PERFLAB_SIM_HARDWARE": "a100-80g-x1"}, capture_output=True, text=True)
    assert cuda.returncode != 0


# NVML shim ------------------------------------------------------------------------------------


def test_nvml_shim_answers_like_pynvml(tmp_path: Path) -> None:
    nvml = NvmlShim({"PERFLAB_SIM_HARDWARE": "a100-80g-x8", "PERFLAB_SIM_STATE_DIR": str(tmp_path)})
    with pytest.raises(pynvml.NVMLError):
        nvml.nvmlDeviceGetCount()  # not initialised
    nvml.nvmlInit()
    assert nvml.nvmlDeviceGetCount() == 8
    assert nvml.nvmlSystemGetDriverVersion() == "550.127.05"
    assert nvml.nvmlSystemGetCudaDriverVersion() == 12040
    h = nvml.nvmlDeviceGetHandleByIndex(2)
    assert nvml.nvmlDeviceGetName(h) == "NVIDIA A100-SXM4-80GB"
    assert nvml.nvmlDeviceGetCudaComputeCapability(h) == (8, 0)
    assert re.fullmatch(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", nvml.nvmlDeviceGetUUID(h))
    assert nvml.nvmlDeviceGetUUID(h) != nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(3))
    assert nvml.nvmlDeviceGetPciInfo(h).busId in ("00000000:47:00.0", b"00000000:47:00.0")  # pynvml decodes
    mem = nvml.nvmlDeviceGetMemoryInfo(h)
    assert (mem.total, mem.used, mem.free) == (81920 * 2**20, 4 * 2**20, (81920 - 4) * 2**20)
    state.register(tmp_path, "vllm", "python", [2, 3], [70000, 70000])
    try:
        assert nvml.nvmlDeviceGetMemoryInfo(h).used == 70004 * 2**20
        assert nvml.nvmlDeviceGetMemoryInfo(nvml.nvmlDeviceGetHandleByIndex(0)).used == 4 * 2**20
    finally:
        state.unregister(tmp_path)
    with pytest.raises(pynvml.NVMLError) as err:
        nvml.nvmlDeviceGetHandleByIndex(8)
    assert err.value.value == pynvml.NVML_ERROR_INVALID_ARGUMENT
    nvml.nvmlShutdown()
    ascend = NvmlShim({"PERFLAB_SIM_HARDWARE": "910b3-x8"})
    ascend.nvmlInit()
    assert ascend.nvmlDeviceGetCount() == 0


# memory registry ------------------------------------------------------------------------------


def test_registry_ignores_and_removes_dead_and_recycled_pids(tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    state.register(tmp_path, "vllm", "gone", [0], [1000], pid=child.pid)  # exited
    path = state.register(tmp_path, "vllm", "me", [0], [2000])
    recycled = tmp_path / "1.json"  # pid 1 lives, but was not created when this entry was
    recycled.write_text(path.read_text().replace(f'"pid": {os.getpid()}', '"pid": 1').replace(
        f'"create_time": {psutil.Process().create_time()}', '"create_time": 12.5'))
    assert state.used_mib(tmp_path, [0, 1]) == {0: 2000, 1: 0}
    assert sorted(p.name for p in tmp_path.glob("*.json")) == [f"{os.getpid()}.json"]
    state.unregister(tmp_path)
    assert state.used_mib(tmp_path, [0]) == {0: 0}
