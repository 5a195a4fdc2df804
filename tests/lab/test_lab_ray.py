"""The Ray backend (issue #14 items 3, 4, 6): a session-scoped local Ray cluster in a
loopback-only network namespace (perflab.testing.raycluster) — an H100 head node and two A100
nodes, fake GPUs, each labelled with the simulated machine it is. The seed-001 example
(scaled down) on the two A100 nodes decides as the sequential run; a node removed
mid-benchmark leaves its run interrupted (not crashed), re-queued on the other node, and no
engine of the study behind; a plan no node is for, and a demand no node can meet, are
refused before the study starts; Ctrl-C exits 130 with nothing left."""

from __future__ import annotations

import json
import re
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from simstudy import run_sim_study

from perflab.contract.types import Accelerator, HardwareSnapshot
from perflab.lab.plan import load_plan_text
from perflab.lab.run.backends.local import Demand
from perflab.lab.run.backends.ray import (
    RAY_RESOURCE,
    SIM_LABEL,
    ClusterRefused,
    RayCluster,
    bundles,
    check_reports,
    node_spec,
    strategy,
)
from perflab.lab.run.executor import INHERITED_NOT_PASSED, engine_environment
from perflab.lifecycle.procs import MARKER_ENV, Marker
from perflab.testing.raycluster import NetnsCluster

ROOT = Path(__file__).resolve().parents[2]
SEED_001 = ROOT / "examples" / "seed-001-qwen3-235b-a22b-a100.yaml"
# the head (index 0) is never removed; the second H100 node (index 3) is for a two-node group
# on H100s, one of whose nodes is lost (the A100s stay two for the tests above it)
NODES = ["h100-80g-x8:8", "a100-80g-x8:8", "a100-80g-x8:8", "h100-80g-x8:8"]


def scaled_seed_001() -> str:
    """The seed-001 example with fewer prompts and the three short profiles (same steps, same
    candidates, same refusals), so the test takes about a minute per run."""
    text = SEED_001.read_text(encoding="utf-8")
    # a faster model clock (the figures are on it): the same decisions in less wall time
    text = text.replace("time_scale: 30", "time_scale: 60")
    text = re.sub(r"num_prompts: \d+", "num_prompts: 40", text)
    text = text.replace("sharegpt, num_prompts: 40", "sharegpt, num_prompts: 80")
    # without the example's accuracy gate: these tests are about the runs' placement and files
    # (tests/lab/test_accuracy_gate.py measures the gate)
    return "\n".join(line for line in text.splitlines() if not line.strip().startswith(("long:", "very-long:", "accuracy:")))


@pytest.fixture(scope="session")
def hidden(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory the cluster's nodes cannot see (an empty read-only tmpfs over it in their
    mount namespace): a study there is as on a cluster without a shared filesystem."""
    return tmp_path_factory.mktemp("hidden").resolve()


@pytest.fixture(scope="module")  # gone when this file is: later tests on the worker count their children
def cluster(tmp_path_factory: pytest.TempPathFactory, hidden: Path) -> Iterator[NetnsCluster]:
    log = tmp_path_factory.mktemp("ray") / "cluster.log"
    with NetnsCluster(NODES, log=log, hide=[hidden]) as c:
        yield c


def perflab_run(c: NetnsCluster, plan: Path, out: Path, *extra: str) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "perflab", "run", str(plan), "--out", str(out), "--executor", "ray",
            "--ray-address", c.address, "--no-live", *extra]
    return subprocess.Popen(c.argv(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def engines_of_study(study: Path) -> list[psutil.Process]:
    """Processes carrying a PERFLAB_INSTANCE marker of ``study`` (perflab ps's match)."""
    out = []
    for p in psutil.process_iter():
        try:
            m = Marker.parse(p.environ().get(MARKER_ENV))
        except (psutil.Error, OSError):
            continue
        if m is not None and m.study == str(study.resolve()):
            out.append(p)
    return out


def decisions(report: dict) -> dict:
    """What the study decided: each step's entries (label, status) and what it adopted (a
    step that adopts nothing decides nothing between its variants: which of two within noise
    of each other ranks first there is the simulator's noise under a loaded CPU), the optimized."""
    return {
        "steps": [(s["title"], s["chosen"] if s["adopted"] else None,
                   [(e["label"], e["result"]["status"]) for e in s["entries"]])
                  for s in report["steps"]],
        "optimized": report["optimized"]["label"] if report["optimized"] else None,
    }


# --------------------------------------------------------------------------- without a cluster


def test_engine_environment_strips_ray_and_visible_devices() -> None:
    env = {"RAY_ADDRESS": "127.0.0.1:6379", "RAY_RAYLET_PID": "1", "CUDA_VISIBLE_DEVICES": "4,5",
           "ASCEND_RT_VISIBLE_DEVICES": "0", "PATH": "/bin", "MY_RAY_THING": "kept", "HF_HOME": "/h"}
    assert engine_environment(env) == {"PATH": "/bin", "MY_RAY_THING": "kept", "HF_HOME": "/h"}
    assert INHERITED_NOT_PASSED == ("RAY_*", "*_VISIBLE_DEVICES")


def test_placement_shapes_for_one_and_several_nodes() -> None:
    assert bundles(Demand("cuda", 4), RAY_RESOURCE["cuda"]) == [{"GPU": 4.0}]
    assert strategy(Demand("cuda", 4)) == "STRICT_PACK"
    # item 5's group launch: one bundle per node, never two on one node
    assert bundles(Demand("ascend", 8, nodes=2), RAY_RESOURCE["ascend"]) == [{"NPU": 8.0}, {"NPU": 8.0}]
    assert strategy(Demand("ascend", 8, nodes=2)) == "STRICT_SPREAD"
    assert bundles(Demand(None, 1), None) == [{"CPU": 0.01}]
    assert node_spec({SIM_LABEL: "a100-80g-x8"}) == "sim:a100-80g-x8" and node_spec({}) == "auto"


def _report(node: str, cls: str = '"sim:a100-80g-x8"', perflab: str = "0.1.0", vllm: str = "0.11.0") -> dict:
    gpus = tuple(Accelerator(vendor="nvidia", kind="cuda", index=i, name="NVIDIA A100-SXM4-80GB", memory_total_mib=81920)
                 for i in range(8))
    return {"node_id": node * 7, "host": "h", "spec": "sim:a100-80g-x8", "class": cls, "perflab": perflab,
            "plugins": {"vllm": "1"}, "engines": {"vllm": vllm}, "snapshot": HardwareSnapshot(gpus, simulated=True)}


def test_nodes_are_checked_before_the_study_starts() -> None:
    plan = load_plan_text(scaled_seed_001(), path="p.yaml")
    here = {"perflab": "0.1.0", "plugins": {"vllm": "1"}}
    check_reports(plan, here, [_report("a1b2c3d4"), _report("e5f6a7b8")])  # one class, same versions
    with pytest.raises(ClusterRefused, match="2 machine classes .*never mix"):
        check_reports(plan, here, [_report("a1b2c3d4"), _report("e5f6a7b8", cls='"sim:h100-80g-x8"')])
    with pytest.raises(ClusterRefused, match="runs perflab 0.2.0 .* this driver runs perflab 0.1.0"):
        check_reports(plan, here, [_report("a1b2c3d4"), _report("e5f6a7b8", perflab="0.2.0")])
    with pytest.raises(ClusterRefused, match="engine versions differ between nodes"):
        check_reports(plan, here, [_report("a1b2c3d4"), _report("e5f6a7b8", vllm="0.12.0")])
    # Ray started without --num-gpus: a TP8 demand would wait forever, refused in one line
    reports = [_report("a1b2c3d4")]
    nodes = [{"NodeID": reports[0]["node_id"], "Resources": {"CPU": 8.0, "GPU": 4.0}}]
    cluster = RayCluster(plan, Path("."), reports, nodes, started=False)
    cluster.check([("vLLM", Demand("cuda", 4))])
    with pytest.raises(ClusterRefused, match="vLLM needs 8 GPU on 1 node.*offer at most 4 GPU"):
        cluster.check([("vLLM", Demand("cuda", 8))])
    cluster.check([("too big", Demand("cuda", 16))])  # more than the machine has: the executor refuses it


# --------------------------------------------------------------------------- on the cluster


def test_refused_before_the_study_starts(cluster: NetnsCluster, tmp_path: Path) -> None:
    plan = tmp_path / "p.yaml"
    plan.write_text(scaled_seed_001().replace("sim:a100-80g-x8", "sim:910b3-x8"))
    proc = perflab_run(cluster, plan, tmp_path / "none")
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2, err
    line = [x for x in err.splitlines() if x.startswith("perflab: ")]
    assert line and "no Ray node is the plan's machine sim:910b3-x8" in line[-1], err
    assert "sim:a100-80g-x8" in line[-1] and "sim:h100-80g-x8" in line[-1]
    assert not (tmp_path / "none" / "runs").exists()  # nothing was launched


@pytest.mark.slow
def test_seed_001_on_two_nodes_decides_as_the_sequential_run(cluster: NetnsCluster, tmp_path: Path) -> None:
    text = scaled_seed_001()
    plan = tmp_path / "seed-001.yaml"
    plan.write_text(text)
    proc = perflab_run(cluster, plan, tmp_path / "ray", "--json")
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    summary = json.loads(out)
    assert summary["complete"], summary
    on_ray = json.loads((tmp_path / "ray" / "report.json").read_text())

    run_sim_study(text, tmp_path / "seq")
    sequential = json.loads((tmp_path / "seq" / "report.json").read_text())
    assert decisions(on_ray) == decisions(sequential)

    # both A100 nodes served, the H100 head never did: A100 and H100 results do not mix
    placed = set(re.findall(r"on node (\S+) devices", err))
    assert len(placed) == 2, err
    assert cluster.node_ids[0][:8] not in {p.split("/")[-1] for p in placed}
    assert on_ray["hardware_spec"] == "sim:a100-80g-x8"
    db = sqlite3.connect(tmp_path / "ray" / "study.db")
    salt = json.loads(db.execute("select value from meta where key='salt'").fetchone()[0])
    assert salt["hardware"] == "sim:a100-80g-x8"
    assert engines_of_study(tmp_path / "ray") == []

    # a finished run's placement group went to the next run of its shape (every run here is 8
    # GPUs on one node): most runs did not wait for Ray to place a new group (about a second each)
    events = [json.loads(line) for line in (tmp_path / "ray" / "study.log").read_text().splitlines() if line]
    groups = [e["group"] for e in events if e.get("event") == "lab.ray-placement"]
    assert len(groups) >= 9, groups  # every run was placed: steps 1-4, the refused ones included, and the finals
    assert groups.count("reused") + groups.count("handed over") > len(groups) / 2, groups


FILES_PLAN = """
name: ray-files
model: Qwen/Qwen3-8B
hardware: sim:a100-80g-x8
simulation: {time_scale: 50}
engines: [vllm]
serve: {tp: 4}
candidates:
  - name: Max Num Seqs
    variants:
      - {name: "1", set: {max_num_seqs: 1}}  # clearly worse: not adopted, whatever the host's load
profiles:
  main: {label: Main, input_len: 64, output_len: 16, num_prompts: 16}
  other: {label: Other, input_len: 256, output_len: 8, num_prompts: 8, seed: 2}
early_stop: false
min_improvement_pct: 5
timeouts: {startup_s: 60, benchmark_s: 120}
"""


def _run_files(study: Path) -> list[tuple[str, list[str]]]:
    """Each run's label and the files of its directory, in label order."""
    out = []
    for d in sorted((study / "runs").iterdir()):
        label = json.loads((d / "config.json").read_text())["label"]
        out.append((label, sorted(str(p.relative_to(d)) for p in d.rglob("*") if p.is_file())))
    return sorted(out)


def _cases(report: dict) -> list:
    return [(c["profile"], c["baseline"]["status"], (c["optimized"] or {}).get("status"), c["baseline"]["num_prompts"])
            for c in report["cases"]]


@pytest.mark.slow
def test_a_study_the_nodes_cannot_see_gets_every_run_file_back(cluster: NetnsCluster, hidden: Path,
                                                                tmp_path: Path) -> None:
    """The study directory is where the nodes cannot see it (nothing shared): the agents run
    into stages on their nodes and ship the run files back; the driver's study has every file
    a local run has, the same decisions and cases, and no stage is left on the nodes."""
    from perflab.lab.run.backends.shipping import stage_root, study_tag

    assert cluster.hidden == [hidden], f"the nodes could not be kept from {hidden} (see {cluster.log})"
    plan = tmp_path / "files.yaml"
    plan.write_text(FILES_PLAN)
    study = hidden / tmp_path.name / "study"
    proc = perflab_run(cluster, plan, study)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    assert not (stage_root() / study_tag(study)).exists(), "a stage or the simulator's state was left on a node"
    # the nodes could not have written there: they see an empty read-only directory
    assert cluster.proc is not None
    probe = subprocess.run(["nsenter", f"--mount=/proc/{cluster.proc.pid}/ns/mnt", "--", "ls", "-A", str(hidden)],
                           capture_output=True, text=True)
    assert probe.returncode == 0 and probe.stdout == "", probe

    run_sim_study(FILES_PLAN, tmp_path / "local")
    on_ray = json.loads((study / "report.json").read_text())
    local = json.loads((tmp_path / "local" / "report.json").read_text())
    assert decisions(on_ray) == decisions(local)
    assert _cases(on_ray) == _cases(local)
    assert _run_files(study) == _run_files(tmp_path / "local")
    for d in (study / "runs").iterdir():
        outcome = json.loads((d / "outcome.json").read_text())
        assert outcome["log"] == str(d / "engine.log"), outcome["log"]  # where the driver has it
        assert (d / "engine.log").stat().st_size > 0
        assert outcome["instances"][0]["workdir"] == str(d)
    db = sqlite3.connect(study / "study.db")
    logs = [log for (log,) in db.execute("select log from runs")]
    assert logs and all(log is not None and (study / log).is_file() and log.startswith("runs/") for log in logs), logs
    assert engines_of_study(study) == []


ONE_RUN = """
name: ray-lost-node
model: {id: Qwen/Qwen3-235B-A22B-Instruct-2507}
hardware: sim:a100-80g-x8
simulation: {time_scale: 10}
engines: [vllm]
serve: {tp: 8}
baseline: {engine: vllm}
profiles:
  main: {label: Main, dataset: synthetic-sharegpt, num_prompts: 200}
  # as long as Main: the node removed may hold the baseline's final measurement of Other
  # ("Idle slots"), which must still be running a second after it began
  other: {label: Other, input_len: 128, output_len: 200, num_prompts: 200, seed: 2}
"""


def _wait_for(pattern: str, proc: subprocess.Popen[str], seen: list[str], timeout: float) -> re.Match[str]:
    assert proc.stderr is not None
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        line = proc.stderr.readline()
        if not line:
            break
        seen.append(line)
        m = re.search(pattern, line)
        if m:
            return m
    raise AssertionError(f"{pattern!r} not seen: {''.join(seen)[-3000:]}")


def test_ctrl_c_cancels_the_runs_and_leaves_nothing(cluster: NetnsCluster, tmp_path: Path) -> None:
    plan = tmp_path / "one.yaml"
    plan.write_text(ONE_RUN)
    study = tmp_path / "study"
    proc = perflab_run(cluster, plan, study)
    seen: list[str] = []
    try:
        _wait_for(r"benchmarking Main", proc, seen, 120)
        assert engines_of_study(study), "the engine should be up, with the study's marker"
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, "".join(seen)
    deadline = time.monotonic() + 10
    while engines_of_study(study) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert engines_of_study(study) == []
    db = sqlite3.connect(study / "study.db")
    # step 1 has one configuration and the cluster two nodes: the baseline's final
    # measurement (profile "other") runs on the free node from the start
    # (docs/user-guide.md, "Idle slots"); both runs are cancelled
    assert list(db.execute("select label, state from runs order by id")) == [
        ("vLLM", "interrupted"), ("Baseline", "interrupted")]


TWO_NODE = """
name: ray-two-node
model: Qwen/Qwen3-8B
hardware: sim:a100-80g-x8
simulation: {{time_scale: {scale}}}
engines: [{engine}]
serve: {{nodes: 2, {sizes}{env}}}
profiles:
  main: {{label: Main, input_len: 32, output_len: 8, num_prompts: {prompts}{rate}}}
timeouts: {{startup_s: 60, benchmark_s: 60}}
"""
TWO_NODE_SGLANG = TWO_NODE.replace("{engine}", "sglang").replace("{sizes}", "tp: 2")


def _raylet_of(pid: int) -> int | None:
    """The raylet (one per Ray node) ``pid`` descends from: which node's agent started it."""
    try:
        return next((p.pid for p in psutil.Process(pid).parents() if p.name() == "raylet"), None)
    except psutil.Error:
        return None


def _ranks_running(study: Path) -> dict[str, tuple[int, int | None]]:
    """Each engine process of ``study``: its marker's run -> (the perflab process that started
    it, that process's raylet)."""
    out = {}
    for p in engines_of_study(study):
        try:
            m = Marker.parse(p.environ().get(MARKER_ENV))
        except (psutil.Error, OSError):
            continue
        if m is not None:
            out[m.run] = (m.owner_pid, _raylet_of(m.owner_pid))
    return out


def _run_two_node(c: NetnsCluster, tmp_path: Path, text: str) -> tuple[int, dict, Path, dict, str]:
    """Run the plan, watching which node each rank's engine runs under meanwhile; (exit code,
    the run's outcome.json, the study, {marker run: (owner pid, raylet)}, stderr)."""
    plan = tmp_path / "two-node.yaml"
    plan.write_text(text)
    study = tmp_path / "study"
    proc = perflab_run(c, plan, study)
    seen: dict[str, tuple[int, int | None]] = {}
    try:
        end = time.monotonic() + 300
        while proc.poll() is None and time.monotonic() < end:  # the ranks' processes while they run
            seen.update(_ranks_running(study))
            time.sleep(0.1)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    runs = sorted((study / "runs").iterdir())
    assert len(runs) == 1, err[-3000:]
    return proc.returncode, json.loads((runs[0] / "outcome.json").read_text()), study, seen, err


@pytest.mark.slow
@pytest.mark.parametrize(("engine", "sizes", "address"), [("sglang", "tp: 2", "--dist-init-addr"),
                                                        ("vllm", "dp: 2", "--data-parallel-address")])
def test_a_two_node_run_starts_each_rank_on_its_own_node(cluster: NetnsCluster, tmp_path: Path, engine: str, sizes: str,
                                                         address: str) -> None:
    started = time.monotonic()
    text = TWO_NODE.replace("{engine}", engine).replace("{sizes}", sizes).format(scale=50, env="", prompts=20, rate="")
    rc, outcome, study, seen, err = _run_two_node(cluster, tmp_path, text)
    took = time.monotonic() - started
    assert rc == 0, err[-3000:]
    assert outcome["state"] == "done" and outcome["cause"] is None, outcome
    group = outcome["instances"][0]
    assert [n["state"] for n in group["nodes"]] == ["done", "done"] and group["leftovers"] == []
    measured = json.loads(next((study / "runs").iterdir()).joinpath("measurement-main.json").read_text())
    assert measured["status"] == "ok" and measured["metrics"]["output_throughput"] > 0, measured
    # rank 0 and rank 1 were started by different perflab processes (the agents), each under a
    # different node's raylet: rank k on the k-th node of the STRICT_SPREAD placement group
    run = next(r for r in seen if not r.endswith(".node1"))
    assert set(seen) == {run, f"{run}.node1"}, seen
    (owner0, raylet0), (owner1, raylet1) = seen[run], seen[f"{run}.node1"]
    assert owner0 != owner1 and None not in (raylet0, raylet1) and raylet0 != raylet1, seen
    # the placement named both nodes (the H100 head never holds an A100 study's rank)
    placed = re.findall(r"on node (\S+) devices", err)
    assert placed and len(placed[0].split("+")) == 2, err[-2000:]
    assert cluster.node_ids[0][:8] not in placed[0]
    # each rank has its node's device, as Ray reserved it in its bundle (one per node: tp 2 / 2 nodes)
    assert all(len(n["launch"]["env"]["CUDA_VISIBLE_DEVICES"].split(",")) == 1 for n in group["nodes"]), group["nodes"]
    # both ranks meet at rank 0's node address, as Ray gives it (every node is 127.0.0.1 in the netns)
    argvs = [n["launch"]["argv"] for n in group["nodes"]]
    addr = argvs[0][argvs[0].index(address) + 1]
    assert addr == argvs[1][argvs[1].index(address) + 1] and addr.split(":")[0] == "127.0.0.1"
    # rank 1's log and launch came back from its node into the run directory, named where they are
    run_dir = next((study / "runs").iterdir())
    assert (run_dir / "engine-node1.log").stat().st_size > 0 and (run_dir / "engine-node1.launch.json").is_file()
    assert group["nodes"][1]["log"] == str(run_dir / "engine-node1.log"), group["nodes"][1]["log"]
    assert engines_of_study(study) == []
    print(f"two-node {engine} on ray: {took:.1f} s end to end")


@pytest.mark.slow
def test_a_crash_on_rank_1_on_its_node_crashes_the_group_with_its_cause(cluster: NetnsCluster, tmp_path: Path) -> None:
    from perflab_sim.env import FAULT_ENV, FAULT_NODE_RANK_ENV, TIME_SCALE_ENV

    env = f', env: {{{FAULT_ENV}: "crash-after:5", {FAULT_NODE_RANK_ENV}: "1", {TIME_SCALE_ENV}: "1"}}'
    rc, outcome, study, seen, err = _run_two_node(
        cluster, tmp_path, TWO_NODE_SGLANG.format(scale=1, env=env, prompts=60, rate=", request_rate: 4"))
    assert outcome["state"] == "crashed", outcome
    cause = outcome["cause"]
    # rank 1's own cause, classified on its node from its log, named with its rank
    assert cause["name"] == "cuda-illegal-memory-access", cause
    assert cause["explanation"].startswith("node rank 1:") and "illegal memory access" in cause["line"]
    group = outcome["instances"][0]
    assert group["failed_rank"] == 1 and group["nodes"][1]["state"] == "crashed"
    assert group["nodes"][0]["state"] == "done", "rank 0 was torn down by the group, not a second crash"
    run = next(r for r in seen if not r.endswith(".node1"))
    assert seen[run][1] != seen[f"{run}.node1"][1], seen  # on two nodes
    assert engines_of_study(study) == [], "a rank outlived the crash"


@pytest.mark.slow
def test_ctrl_c_stops_every_rank_of_a_group_on_every_node(cluster: NetnsCluster, tmp_path: Path) -> None:
    from perflab_sim.env import TIME_SCALE_ENV

    plan = tmp_path / "group.yaml"
    plan.write_text(TWO_NODE_SGLANG.format(scale=1, env=f", env: {{{TIME_SCALE_ENV}: '1'}}", prompts=200,
                                           rate=", request_rate: 8"))
    study = tmp_path / "study"
    proc = perflab_run(cluster, plan, study)
    seen: list[str] = []
    try:
        _wait_for(r"benchmarking Main", proc, seen, 120)
        ranks = _ranks_running(study)
        assert len(ranks) == 2 and len({r[1] for r in ranks.values()}) == 2, ranks
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, "".join(seen)
    assert engines_of_study(study) == []  # torn down before perflab exited, on both nodes
    db = sqlite3.connect(study / "study.db")
    assert [r[0] for r in db.execute("select state from runs")] == ["interrupted"]


@pytest.mark.slow
def test_rank_1_s_agent_lost_interrupts_the_group_run(cluster: NetnsCluster, tmp_path: Path) -> None:
    """Rank 1's node's agent dies mid-benchmark (SIGKILL: as with its node, Ray reports the actor
    gone): rank 0's group sees it through its RemoteRank, the run is interrupted (not crashed),
    the failed benchmark is no result; the re-queue, without that node, is refused (one A100
    node is left for two ranks); the keeper on rank 1's node took its engine down, rank 0's
    went with its group."""
    from perflab_sim.env import TIME_SCALE_ENV

    plan = tmp_path / "group.yaml"
    plan.write_text(TWO_NODE_SGLANG.format(scale=1, env=f", env: {{{TIME_SCALE_ENV}: '1'}}", prompts=200, rate=", request_rate: 8"))
    study = tmp_path / "study"
    proc = perflab_run(cluster, plan, study)
    seen: list[str] = []
    try:
        nodes = _wait_for(r"on node (\S+) devices", proc, seen, 120).group(1).split("+")
        _wait_for(r"benchmarking Main", proc, seen, 60)
        ranks = _ranks_running(study)
        run = next(r for r in ranks if not r.endswith(".node1"))
        agent1 = ranks[f"{run}.node1"][0]
        assert agent1 != ranks[run][0]
        psutil.Process(agent1).kill()
        killed = time.monotonic()
        out, err = proc.communicate(timeout=120)
        seen.append(err)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    log = "".join(seen)
    assert proc.returncode != 0, log[-3000:]
    assert time.monotonic() - killed < 30, log[-3000:]
    db = sqlite3.connect(study / "study.db")
    runs = list(db.execute("select state, error from runs order by id"))
    rank1 = nodes[1].split("/")[-1]
    assert runs[0][0] == "interrupted" and "was lost" in runs[0][1] and "node rank 1" in runs[0][1], runs
    assert rank1 in runs[0][1], (rank1, runs)
    assert len(runs) == 2 and "2 nodes of sim:a100-80g-x8 are needed, 1 are left" in runs[1][1], runs
    assert "crashed" not in {r[0] for r in runs}
    assert list(db.execute("select status from measurements")) == [], "a lost group's benchmark is no result"
    assert engines_of_study(study) == [], "a rank outlived its lost agent's group"


@pytest.mark.slow
def test_a_node_lost_under_a_two_node_group_interrupts_the_run(cluster: NetnsCluster, tmp_path: Path) -> None:
    """The group spans the two H100 nodes (the head and index 3); index 3 is removed mid-benchmark
    (the node of rank 1 when it holds rank 1, else of rank 0). The run is interrupted, never
    crashed; its re-queue is refused in one line (one H100 node is left, the group needs two)
    instead of waiting forever; nothing of the study is left on the surviving node."""
    from perflab_sim.env import TIME_SCALE_ENV

    plan = tmp_path / "group.yaml"
    plan.write_text(TWO_NODE_SGLANG.format(scale=1, env=f", env: {{{TIME_SCALE_ENV}: '1'}}", prompts=200, rate=", request_rate: 8")
                    .replace("sim:a100-80g-x8", "sim:h100-80g-x8"))
    study = tmp_path / "study"
    proc = perflab_run(cluster, plan, study)
    seen: list[str] = []
    try:
        nodes = _wait_for(r"on node (\S+) devices", proc, seen, 120).group(1).split("+")
        _wait_for(r"benchmarking Main", proc, seen, 60)
        assert len(_ranks_running(study)) == 2
        worker = cluster.node_ids[3][:8]
        assert [n.split("/")[-1] for n in nodes].count(worker) == 1, nodes
        cluster.remove(3)
        removed = time.monotonic()
        out, err = proc.communicate(timeout=120)
        seen.append(err)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    log = "".join(seen)
    assert proc.returncode != 0, log[-3000:]
    assert time.monotonic() - removed < 30, log[-3000:]
    db = sqlite3.connect(study / "study.db")
    runs = list(db.execute("select state, error from runs order by id"))
    assert runs[0][0] == "interrupted" and "was lost" in runs[0][1] and worker in runs[0][1], runs
    # re-queued once: refused at once, the group needs two H100 nodes and one is left
    assert len(runs) == 2 and runs[1][0] == "interrupted" and "2 nodes of sim:h100-80g-x8 are needed, 1 are left" in runs[1][1], runs
    assert "crashed" not in {r[0] for r in runs}
    assert engines_of_study(study) == [], "a rank outlived its lost node's group"
    rank = [n.split("/")[-1] for n in nodes].index(worker)
    print(f"node of rank {rank} lost; interrupted {time.monotonic() - removed:.1f} s after; {runs}")


def test_a_lost_node_interrupts_its_run_and_requeues_it(cluster: NetnsCluster, tmp_path: Path) -> None:
    """Last in this file: it removes one of the two A100 nodes."""
    plan = tmp_path / "one.yaml"
    plan.write_text(ONE_RUN)
    study = tmp_path / "study"
    proc = perflab_run(cluster, plan, study)
    seen: list[str] = []
    try:
        # two runs at once, one per node: step 1's only configuration (vLLM) and the baseline's
        # final measurement, dispatched into the free node ("Idle slots"); the worker node's is lost
        placed: dict[str, str] = {}
        while len(placed) < 2:
            m = _wait_for(r"(vLLM|Baseline): on node \S+/([0-9a-f]{8}) devices", proc, seen, 120)
            placed[m.group(1)] = m.group(2)
        assert placed["vLLM"] != placed["Baseline"], placed
        on = {label: next(i for i, n in enumerate(cluster.node_ids) if n.startswith(node)) for label, node in placed.items()}
        label = next(label for label, i in on.items() if i != 0)  # the head cannot be removed
        node, index = placed[label], on[label]
        if not any(f"{label}: benchmarking" in line for line in seen):
            _wait_for(rf"{label}: benchmarking", proc, seen, 120)
        cluster.remove(index)
        removed = time.time()
        _wait_for(r"re-queued", proc, seen, 20)
        lost_after = time.time() - removed
        other = _wait_for(r"on node \S+/([0-9a-f]{8}) devices", proc, seen, 60).group(1)
        assert other != node
        out, err = proc.communicate(timeout=300)
        seen.append(err)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, "".join(seen)[-3000:]
    assert lost_after < 20
    db = sqlite3.connect(study / "study.db")
    runs = list(db.execute("select label, state, error from runs order by id"))
    lost = [r for r in runs if r[1] == "interrupted"]
    assert len(lost) == 1 and "was lost" in lost[0][2], runs
    # what the lost node shipped before it went is kept: the launch, as the benchmark began
    (lost_id,) = db.execute("select id from runs where state = 'interrupted'").fetchone()
    (lost_dir,) = (study / "runs").glob(f"{lost_id:03d}-*")
    kept_files = {p.name for p in lost_dir.iterdir()}
    assert {"config.json", "hardware.json", "launch.json", "engine.log", "outcome.json"} <= kept_files, kept_files
    assert (lost_dir / "engine.log").stat().st_size > 0
    assert json.loads((lost_dir / "outcome.json").read_text())["state"] == "interrupted"
    assert [r for r in runs if r[0] == lost[0][0]][-1][1] == "done", runs  # re-queued, measured on the other node
    states = {r[1] for r in runs}
    assert "crashed" not in states
    kept = list(db.execute("select run_id, profile from measurements order by id"))
    assert {p for _, p in kept} == {"main", "other"}
    assert engines_of_study(study) == []
