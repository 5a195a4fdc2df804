"""benchmarks/gpu_check.py and benchmarks/gpu_wheels.py on a machine without a GPU (issue 28 item 3).

The check itself needs an NVIDIA GPU; here it is tested up to that point: its refusal (driven
by NVML, the real one on this machine and injected ones), its JSON (one dataclass, written by
the script, read back), its serve and fault steps through the same code against perflab's
simulator (its NVML stand-in and ``--hardware sim:NAME``), and the wheel builder's selection and
size check on a resolution written here (no network).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from perflab.hardware import activate, emulation
from perflab.observe import Sample
from perflab.plugins import load

ROOT = Path(__file__).resolve().parent.parent
SIM = "sim:h100-80g-x1"


def _module(name: str) -> ModuleType:
    """A benchmarks/ script as a module (benchmarks/ is not a package)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


gpu_check = _module("gpu_check")
gpu_wheels = _module("gpu_wheels")


@pytest.fixture(scope="module")
def sim_env() -> dict[str, str]:
    """The environment of a simulated one-H100 machine (its NVML stand-in named in it)."""
    return activate(load(), SIM, os.environ)


# ------------------------------------------------------------------------------- the refusal


def test_no_gpu_here_one_line_and_exit_2_before_anything_slow(tmp_path: Path) -> None:
    assert gpu_check.gpu_absent(gpu_check.real_nvml()) is not None, "this test needs a machine without an NVIDIA GPU"
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 2
    assert done.stdout == ""
    assert len(done.stderr.splitlines()) == 1
    assert done.stderr.startswith("gpu_check: no NVIDIA GPU here (")
    assert time.monotonic() - t0 < 30  # the imports, nothing more
    assert not (tmp_path / "out").exists()


class _NvmlError(Exception):
    pass


class _Nvml:
    """pynvml's function names, for NVML that does not start or sees no device."""

    NVMLError = _NvmlError

    def __init__(self, starts: bool) -> None:
        self.starts = starts

    def nvmlInit(self) -> None:  # noqa: N802 - pynvml's name
        if not self.starts:
            raise _NvmlError("Driver Not Loaded")

    def nvmlShutdown(self) -> None:  # noqa: N802
        pass

    def nvmlSystemGetDriverVersion(self) -> str:  # noqa: N802
        return "580.95.05"

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        return 0


@pytest.mark.parametrize(("nvml", "why"), [
    (None, "nvidia-ml-py is not installed"),
    (_Nvml(starts=False), "NVML did not start: no NVIDIA driver"),
    (_Nvml(starts=True), "NVML sees no GPU"),
])
def test_the_refusal_is_nvmls_answer(nvml: Any, why: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if nvml is None:
        assert gpu_check.gpu_absent(None) == why
        return
    assert gpu_check.main(["--out", str(tmp_path / "out")], nvml=nvml) == 2
    err = capsys.readouterr().err
    assert err == gpu_check.NO_GPU.format(why=why) + "\n"
    assert not (tmp_path / "out").exists()


def test_a_gpu_nvml_sees_passes_the_gate(sim_env: dict[str, str]) -> None:
    assert gpu_check.gpu_absent(emulation.nvml(sim_env)) is None


def test_a_simulated_machine_in_the_environment_is_no_gpu(sim_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in sim_env.items():
        monkeypatch.setenv(key, value)
    assert gpu_check.gpu_absent(gpu_check.real_nvml()) is not None


# ------------------------------------------------------------------------------- the JSON


def _sim_steps(sim_env: dict[str, str]) -> Any:
    """Run each step through gpu_check.run_step; serve and fault against the simulator."""

    def steps(name: str, ctx: Any) -> Any:
        if name in ("serve", "fault"):
            ctx.nvml, ctx.env, ctx.engine = emulation.nvml(sim_env), sim_env, "vllm"
            ctx.serve_args, ctx.model, ctx.tokenizer = ("--hardware", SIM), "Qwen/Qwen3-8B", "whitespace"
        return gpu_check.run_step(name, ctx)

    return steps


def test_the_check_writes_one_json_of_every_step(sim_env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    # a shorter workload than on the GPU: the steps' code is the same
    monkeypatch.setattr(gpu_check, "BENCH_REQUESTS", 40)
    monkeypatch.setattr(gpu_check, "FAULT_KILL_AFTER_S", 1.0)
    monkeypatch.setattr(gpu_check, "IDLE_S", 0.5)
    monkeypatch.setattr(gpu_check, "LOAD_S", 0.5)
    monkeypatch.chdir(tmp_path)
    code = gpu_check.main(["--out", "out"], nvml=emulation.nvml(sim_env), steps=_sim_steps(sim_env))
    data = json.loads((tmp_path / "out" / "gpu-check.json").read_text())
    check = gpu_check.GpuCheck.from_json(data)
    assert check.to_json() == data
    steps = {s.name: s for s in check.steps}
    assert list(steps) == list(gpu_check.STEPS)
    assert check.versions["perflab"] and list(check.versions) == list(gpu_check.DISTRIBUTIONS)
    # no NVIDIA GPU here: perflab hardware finds none, so the check fails (exit 1) and says why
    assert not steps["nvml"].ok and "no NVIDIA GPU in perflab hardware --json" in str(steps["nvml"].error)
    assert code == 1 and data["passed"] is False
    serve, fault = steps["serve"], steps["fault"]
    assert serve.ok, serve.error
    assert serve.figures["completed"] == 40 and serve.figures["failed"] == 0
    assert serve.figures["joules"] > 0 and serve.figures["joules_per_output_token"] > 0
    assert serve.figures["memory_serving_mib"] > serve.figures["memory_before_mib"]
    assert serve.figures["memory_check"] is None and serve.figures["leftovers"] == []
    assert fault.ok, fault.error
    assert (fault.figures["state"], fault.figures["cause"]) == ("crashed", "killed-by-signal")
    assert "SIGKILL" in fault.figures["reason"] and fault.figures["bench_exit"] != 0
    for s in check.steps:
        assert s.seconds <= s.budget_s + 5
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("gpu_check on ") and "FAILED" in out.splitlines()[0]
    assert "FAIL nvml" in out and "ok   serve" in out


def test_a_json_of_another_shape_is_refused() -> None:
    step = gpu_check.StepResult("nvml", True, 1.0, 30.0)
    good = gpu_check.GpuCheck("h", "2026-01-01T00:00:00Z", "3.12.3", {"perflab": "0.1.0", "torch": None},
                              tuple(gpu_check.StepResult(n, True, 1.0, b) for n, b in gpu_check.STEPS.items()), 5.0)
    assert gpu_check.GpuCheck.from_json(good.to_json()).passed
    for broken, says in (({"schema_version": 0}, "schema_version"), ({"steps": [step.__dict__]}, "steps"),
                         ({"passed": False}, "passed")):
        with pytest.raises(ValueError, match=says):
            gpu_check.GpuCheck.from_json({**good.to_json(), **broken})


def test_the_step_budgets_fit_eight_minutes_with_start_up() -> None:
    assert sum(gpu_check.STEPS.values()) <= 7 * 60


# ------------------------------------------------------------------------------- the figures


def test_hardware_figures_from_perflab_hardware_json(sim_env: dict[str, str]) -> None:
    done = subprocess.run([sys.executable, "-m", "perflab", "hardware", "--json", "--hardware", SIM],
                          capture_output=True, text=True, timeout=60, check=True)
    snapshot = json.loads(done.stdout)
    with pytest.raises(gpu_check.StepFailed, match="simulated"):
        gpu_check.hardware_figures(snapshot)
    # the same document as a real machine writes it (through NVML, not simulated)
    real = {**snapshot, "simulated": False,
            "accelerators": [{**a, "source": "nvml"} for a in snapshot["accelerators"]]}
    figures = gpu_check.hardware_figures(real)
    assert figures["gpus"] == 1 and "H100" in figures["name"]
    assert figures["memory_total_mib"] > 80_000 and figures["compute_capability"] == "9.0"
    with pytest.raises(gpu_check.StepFailed, match="uuid"):
        gpu_check.hardware_figures({**real, "accelerators": [{**real["accelerators"][0], "uuid": None}]})


def _sample(t: float, watts: float, util: float, mib: float) -> Sample:
    return Sample(t, {"power_w.0": watts, "utilization_pct.0": util, "memory_used_mib.0": mib})


def test_telemetry_must_move_under_load() -> None:
    idle = [_sample(t, 75.0, 0.0, 500.0) for t in (0.0, 0.2, 0.4)]
    loaded = [_sample(t, 640.0, 100.0, 1600.0) for t in (1.0, 1.2, 1.4)]
    figures = gpu_check.telemetry_figures(idle, loaded, None)
    assert (figures["power_w_idle"], figures["power_w_peak"]) == (75.0, 640.0)
    assert figures["utilization_pct_peak"] == 100.0 and figures["memory_used_mib_peak"] == 1600.0
    with pytest.raises(gpu_check.StepFailed) as flat:
        gpu_check.telemetry_figures(idle, [_sample(t, 80.0, 10.0, 520.0) for t in (1.0, 1.2)], None)
    assert all(name in str(flat.value) for name in ("power_w rose", "utilization_pct rose", "memory_used_mib rose"))


def test_memory_back_to_baseline_by_perflabs_check_and_nvmls_figures() -> None:
    assert gpu_check.memory_problem(1000, 1050, 81559, []) is None
    said = "accelerator memory not released: cuda:0 uses 9000 MiB after teardown, 1000 MiB before launch"
    assert gpu_check.memory_problem(1000, 9000, 81559, [said, "port 8000 ..."]) == said
    missed = gpu_check.memory_problem(1000, 9000, 81559, [])
    assert missed is not None and "perflab's baseline check did not say so" in missed


# ------------------------------------------------------------------------------- the wheels


def _item(name: str, version: str, *requires: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "version": version, "requires_dist": list(requires)}}


REPORT = [
    _item("perflab", "0.1.0", "httpx>=0.27", "psutil>=5.9", "pydantic>=2.7"),
    _item("perflab-plugin-transformers", "0.1.0", "perflab"),
    _item("transformers", "5.17.0", "huggingface-hub>=1.5", "numpy>=1.17", "fastapi; extra == \"serving\""),
    _item("huggingface-hub", "1.9.0", "httpx>=0.23", "typer"),
    _item("httpx", "0.28.1", "anyio"), _item("anyio", "4.9.0"), _item("typer", "0.15.0"), _item("numpy", "2.3.0"),
    _item("torch", "2.11.0", "filelock", "nvidia-cudnn-cu13; platform_system == \"Linux\"", "opt-einsum; extra == \"opt\""),
    _item("nvidia-ml-py", "13.580.0"),
    _item("accelerate", "1.15.0", "torch>=2.0", "psutil", "numpy"),
    _item("fastapi", "0.165.0", "starlette>=0.40", "pydantic>=2"), _item("starlette", "1.10.0", "anyio"),
    _item("Uvicorn", "0.54.0", "h11>=0.8", "click>=7"), _item("h11", "0.16.0"), _item("click", "8.2.0"),
    _item("psutil", "7.2.2"), _item("pydantic", "2.12.0", "pydantic-core==2.41"), _item("pydantic_core", "2.41.0"),
]


def test_the_machines_packages_and_theirs_are_not_carried() -> None:
    pre = gpu_wheels.closure(REPORT, gpu_wheels.PREINSTALLED)
    assert {"torch", "transformers", "nvidia-ml-py", "huggingface-hub", "httpx", "anyio", "typer", "numpy",
            "filelock", "nvidia-cudnn-cu13"} <= pre
    assert "opt-einsum" not in pre and "fastapi" not in pre  # extras are not installed with them
    pins = gpu_wheels.select(REPORT, gpu_wheels.PREINSTALLED, ["perflab", "perflab_plugin_transformers"])
    assert [p.spec() for p in pins] == [
        "accelerate==1.15.0", "click==8.2.0", "fastapi==0.165.0", "h11==0.16.0", "psutil==7.2.2",
        "pydantic==2.12.0", "pydantic-core==2.41.0", "starlette==1.10.0", "uvicorn==0.54.0",
    ]


def test_an_extra_only_requirement_loses_its_marker_for_pip() -> None:
    transformers = REPORT[2]
    reqs = gpu_wheels.requirements_of(transformers, ("serving",))
    assert [gpu_wheels.bare(r) for r in reqs] == ["huggingface-hub>=1.5", "numpy>=1.17", "fastapi"]
    assert [r.name for r in gpu_wheels.requirements_of(transformers)] == ["huggingface-hub", "numpy"]


def test_the_size_limit(tmp_path: Path) -> None:
    wheels = []
    for name, size in (("a-1-py3-none-any.whl", 40), ("b-1-py3-none-any.whl", 30)):
        (tmp_path / name).write_bytes(b"\0" * size)
        wheels.append(tmp_path / name)
    total = gpu_wheels.total_size(wheels)
    assert total == 70
    assert gpu_wheels.size_problem(total, limit=70) is None
    problem = gpu_wheels.size_problem(total, limit=69)
    assert problem is not None and "over the" in problem
    assert gpu_wheels.size_problem(64 * 1024 * 1024) is None
    assert gpu_wheels.size_problem(64 * 1024 * 1024 + 1) is not None


def test_the_install_line_needs_no_index() -> None:
    assert gpu_wheels.install_command("gpu-wheels") == \
        "python -m pip install --no-index --find-links gpu-wheels gpu-wheels/*.whl"
    args = gpu_wheels.target_args()
    assert "--only-binary=:all:" in args and args[args.index("--python-version") + 1] == "3.12"
    assert "manylinux2014_x86_64" in args and args[args.index("--abi") + 1] == "cp312"


def test_a_missing_perflab_distribution_is_named(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="plugins/nothing-here"):
        gpu_wheels.build_own(tmp_path, (".", "plugins/nothing-here"))


def test_wheel_folders_are_ignored() -> None:
    ignored = (ROOT / ".gitignore").read_text().splitlines()
    assert "gpu-wheels/" in ignored and "gpu-check-out/" in ignored



def test_the_tiny_models_answers_are_sampled_with_no_eos_to_stop_at(tmp_path: Path) -> None:
    (tmp_path / "generation_config.json").write_text(json.dumps({"bos_token_id": 2, "eos_token_id": [2], "pad_token_id": 0}))
    args = gpu_check.sampling_args(tmp_path)
    assert args[0] == "--extra-body"
    generation = json.loads(json.loads(args[1])["generation_config"])  # a JSON string in the body, as serve reads it
    assert generation["do_sample"] is True and "eos_token_id" not in generation and generation["pad_token_id"] == 0
