"""What a study's environment and result keys are made of."""

from __future__ import annotations

from pathlib import Path

from perflab.lab.plan import load_plan_text
from perflab.lab.run.executor import key_salt, study_environment

PLAN = """
name: env-check
model: {id: Qwen/Qwen3-8B}
hardware: sim:h100-80g-x1
simulation: {engine_versions: {vllm: 0.17.1}}
engines: [vllm]
baseline: {engine: vllm}
profiles:
  short: {input_len: 16, output_len: 4, num_prompts: 4}
main_profile: short
"""


def test_plan_engine_versions_reach_the_simulator_and_user_env_wins(tmp_path: Path) -> None:
    plan = load_plan_text(PLAN, known_engines={"vllm"})
    import perflab_sim
    from perflab_sim import catalog, versions

    # what the simulator makes of the study's environment once it activates the plan's machine
    machine = catalog.get("h100-80g-x1")
    env = perflab_sim.activate(machine.name, study_environment(plan, tmp_path, {"PATH": "/usr/bin"}))
    assert versions.for_machine(machine, env)["vllm"] == "0.17.1"
    assert env["PERFLAB_SIM_STATE_DIR"] == str((tmp_path / "sim-state").resolve())
    mine = perflab_sim.activate(machine.name, study_environment(
        plan, tmp_path, {"PERFLAB_SIM_ENGINE_VERSIONS": "vllm=0.11.0", "PERFLAB_SIM_STATE_DIR": "/x"}))
    assert versions.for_machine(machine, mine)["vllm"] == "0.11.0" and mine["PERFLAB_SIM_STATE_DIR"] == "/x"


def test_real_hardware_studies_get_no_simulator_variables(tmp_path: Path) -> None:
    plan = load_plan_text(PLAN.replace("hardware: sim:h100-80g-x1", "hardware: auto"), known_engines={"vllm"})
    env = study_environment(plan, tmp_path, {"PATH": "/usr/bin"})
    assert env == {"PATH": "/usr/bin"}


def test_measurements_of_another_engine_version_are_not_reused() -> None:
    a = key_salt("sim:h100-80g-x1", 5.0, True, (), {"vllm": "0.11.0"})
    b = key_salt("sim:h100-80g-x1", 5.0, True, (), {"vllm": "0.17.1"})
    assert a != b and a["hardware"] == b["hardware"]
