"""Multi-node engines (issue #14 item 5): a serving option ``nodes``, one launch per node rank
(``perflab_build_group_launch``), the group supervised as one engine, and simulated SGLang
ranks that rendezvous at ``--dist-init-addr`` — locally, processes on this machine stand for
the nodes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import anyio
import psutil
import pytest

import perflab_sim as sim
from perflab.contract.errors import UnsupportedOption
from perflab.contract.status import Status
from perflab.contract.types import Accelerator, GroupNode, HardwareSnapshot, NodeGroup, ServeConfig
from perflab.plugins import load
from perflab.supervisor_group import EngineGroup, local_nodes
from perflab_sim.env import FAULT_ENV, FAULT_NODE_RANK_ENV, STATE_ENV, TIME_SCALE_ENV

TAG_ENV = "PERFLAB_MULTINODE_TEST_TAG"

PLAN = """
name: two-node
model: Qwen/Qwen3-8B
hardware: sim:a100-80g-x8
simulation: {{time_scale: 50}}
engines: [{engine}]
serve: {{nodes: 2, {sizes}{env}}}
profiles:
  main: {{label: Main, input_len: 32, output_len: 8, num_prompts: {prompts}{rate}}}
timeouts: {{startup_s: 60, benchmark_s: 60}}
"""


def _tagged(tag: str) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["pid"]):
        try:
            if p.pid != os.getpid() and p.environ().get(TAG_ENV) == tag and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except (psutil.Error, OSError):
            continue
    return out


def _run(tmp_path: Path, plan_text: str) -> tuple[int, dict, Path, str]:
    """``perflab run PLAN --json`` in a child; (exit code, summary, the run directory, tag)."""
    plan = tmp_path / "plan.yaml"
    plan.write_text(plan_text)
    out = tmp_path / "study"
    tag = uuid.uuid4().hex
    env = {**os.environ, TAG_ENV: tag, STATE_ENV: str(tmp_path / "sim-state"), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run([sys.executable, "-c", "from perflab.cli import main; main()", "run", str(plan), "--out", str(out),
                           "--no-live", "--json"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    runs = sorted((out / "runs").iterdir())
    assert len(runs) == 1, (runs, proc.stderr[-3000:])
    summary = json.loads(proc.stdout) if proc.stdout.strip() else {}
    return proc.returncode, summary, runs[0], tag


def _argv_after(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


@pytest.mark.slow
def test_two_node_sglang_run_on_the_simulator(tmp_path: Path) -> None:
    rc, summary, run, tag = _run(tmp_path, PLAN.format(engine="sglang", sizes="tp: 2", env="", prompts=20, rate=""))
    assert rc == 0, summary
    outcome = json.loads((run / "outcome.json").read_text())
    assert outcome["state"] == "done" and outcome["cause"] is None, outcome
    group = outcome["instances"][0]
    assert [n["state"] for n in group["nodes"]] == ["done", "done"]
    assert group["failed_rank"] is None and group["leftovers"] == []
    # one launch per rank: the same group, each its rank, all meeting at rank 0's address
    launches = [json.loads((run / name).read_text()) for name in ("launch.json", "engine-node1.launch.json")]
    argvs = [n["launch"]["argv"] for n in group["nodes"]]
    for rank, argv in enumerate(argvs):
        assert _argv_after(argv, "--nnodes") == "2" and _argv_after(argv, "--node-rank") == str(rank)
        assert _argv_after(argv, "--tp-size") == "2"
    assert _argv_after(argvs[0], "--dist-init-addr") == _argv_after(argvs[1], "--dist-init-addr")
    host, port = _argv_after(argvs[0], "--dist-init-addr").rsplit(":", 1)
    assert host == "127.0.0.1" and int(port) in group["nodes"][0]["launch"]["extra_ports"]
    # each local node gets its own devices
    envs = [n["launch"]["env"]["CUDA_VISIBLE_DEVICES"] for n in group["nodes"]]
    assert envs == ["0", "1"], envs
    assert all(launch["pid"] for launch in launches)
    # rank 0 served the benchmark; the joined rank's log is its own
    measured = json.loads((run / "measurement-main.json").read_text())
    assert measured["status"] == "ok", measured
    assert (run / "engine-node1.log").is_file() and "The server is fired up" in (run / "engine.log").read_text()
    assert "fired up" not in (run / "engine-node1.log").read_text()
    # the serving script shows every node's command
    script = json.loads((run.parent.parent / "report.json").read_text())
    text = json.dumps(script)
    assert "# node rank 0 (serves the API)" in text and "# node rank 1" in text and "--node-rank 1" in text
    assert _tagged(tag) == [], "a rank outlived the study"


@pytest.mark.slow
@pytest.mark.parametrize(("engine", "sizes"), [("sglang", "tp: 2"), ("vllm", "dp: 2")])
def test_a_crash_on_rank_1_crashes_the_group_named_with_its_cause(tmp_path: Path, engine: str, sizes: str) -> None:
    # rank 1 alone injects the fault (its scheduler dies after rank 0 finished 5 requests);
    # real time, so the benchmark is still running when it does
    env = f', env: {{{FAULT_ENV}: "crash-after:5", {FAULT_NODE_RANK_ENV}: "1", {TIME_SCALE_ENV}: "1"}}'
    rc, summary, run, tag = _run(tmp_path, PLAN.format(engine=engine, sizes=sizes, env=env, prompts=60,
                                                       rate=", request_rate: 4"))
    outcome = json.loads((run / "outcome.json").read_text())
    assert outcome["state"] == "crashed", outcome
    cause = outcome["cause"]
    # the cause is rank 1's own, from its log, named by the engine's crash classifier
    assert cause["name"] == "cuda-illegal-memory-access", cause
    assert cause["explanation"].startswith("node rank 1:") and "illegal memory access" in cause["line"]
    group = outcome["instances"][0]
    assert group["failed_rank"] == 1
    assert group["nodes"][1]["state"] == "crashed" and group["nodes"][1]["cause"] == "cuda-illegal-memory-access"
    assert group["nodes"][1]["log"].endswith("engine-node1.log")
    assert group["nodes"][0]["state"] == "done", "rank 0 was torn down by the group, not counted as a second crash"
    assert "illegal memory access" in (run / "engine-node1.log").read_text()
    report = json.loads((run.parent.parent / "report.json").read_text())
    assert "cuda-illegal-memory-access" in json.dumps(report)
    assert _tagged(tag) == [], "a rank outlived the crash"


def test_an_engine_without_the_group_hook_is_refused_for_two_nodes(tmp_path: Path) -> None:
    pm = load()
    hw = HardwareSnapshot()  # nothing probed: no device arithmetic, only the refusal
    one = pm.engine("trtllm").check_support(ServeConfig(model="Qwen/Qwen3-8B", nodes=1), hw, None)
    assert not [u for u in one if "nodes" in u.what]
    two = [u for u in pm.engine("trtllm").check_support(ServeConfig(model="Qwen/Qwen3-8B", nodes=2), hw, None) if "nodes" in u.what]
    assert len(two) == 1 and two[0].severity == "error", two
    assert two[0].what == "nodes=2" and "build_group_launch" in two[0].why and "\n" not in two[0].why
    for engine in ("sglang", "vllm"):
        assert not [u for u in pm.engine(engine).check_support(ServeConfig(model="Qwen/Qwen3-8B", nodes=2, dp=2), hw, None)
                    if "nodes" in u.what]
    with pytest.raises(UnsupportedOption, match="nodes=2"):
        pm.engine("mindie").build_group_launch(ServeConfig(model="m", nodes=2, port=1), hw,
                           NodeGroup((GroupNode(0, "a"), GroupNode(1, "b")), 2), tmp_path, None)

    # the group refuses it before anything starts
    async def main() -> EngineGroup:
        async with EngineGroup(pm, "trtllm", ServeConfig(model="Qwen/Qwen3-8B", nodes=2), hardware=hw, env={},
                               workdir=tmp_path / "run") as group:
            return group

    group = anyio.run(main)
    assert group.outcome.state == Status.UNSUPPORTED and group.ranks == []
    assert [u.what for u in group.outcome.reasons] == ["nodes=2"]


def test_vllm_data_parallel_launches_one_serve_per_node(tmp_path: Path) -> None:
    pm = load()
    hw = HardwareSnapshot()
    group = NodeGroup((GroupNode(0, "10.99.48.128", "n0", (0, 1, 2, 3)), GroupNode(1, "10.99.48.129", "n1", (0, 1, 2, 3))), 13345)
    config = ServeConfig(model="Qwen/Qwen3-8B", tp=2, dp=4, nodes=2, port=8000)
    head, other = pm.engine("vllm").build_group_launch(config, hw, group, tmp_path, None)
    common = ["--data-parallel-size", "4", "--data-parallel-size-local", "2", "--data-parallel-address", "10.99.48.128",
              "--data-parallel-rpc-port", "13345"]
    for spec in (head, other):
        argv = list(spec.argv)
        assert argv[:3] == ["vllm", "serve", "Qwen/Qwen3-8B"] and _argv_after(argv, "-tp") == "2"
        for flag, value in zip(common[::2], common[1::2], strict=True):
            assert _argv_after(argv, flag) == value, (flag, argv)
        assert spec.env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"
    assert "--headless" not in head.argv and "--data-parallel-start-rank" not in head.argv
    assert "--headless" in other.argv and _argv_after(list(other.argv), "--data-parallel-start-rank") == "2"
    # the serving script of rank 0 leaves out only the address perflab chose
    assert head.address_args == ("--host", "127.0.0.1", "--port", "8000")
    with pytest.raises(UnsupportedOption, match="dp=3 must be a multiple of the nodes"):
        pm.engine("vllm").build_group_launch(config.replace(dp=3), hw, group, tmp_path, None)


def test_local_nodes_split_the_devices_and_refuse_too_few() -> None:
    hw = HardwareSnapshot(tuple(Accelerator("nvidia", "cuda", i, "A100", 81920) for i in range(4)), simulated=True)
    nodes = local_nodes(ServeConfig(model="m", tp=2, nodes=2), hw, ("cuda",))
    assert [(n.rank, n.address, n.devices) for n in nodes] == [(0, "127.0.0.1", (0,)), (1, "127.0.0.1", (1,))]
    nodes = local_nodes(ServeConfig(model="m", tp=2, dp=2, nodes=2, devices=(3, 2, 1, 0)), hw, ("cuda",))
    assert [n.devices for n in nodes] == [(3, 2), (1, 0)]
    with pytest.raises(UnsupportedOption, match="need 8 devices, 4 available"):
        local_nodes(ServeConfig(model="m", tp=8, nodes=2), hw, ("cuda",))


def _sglang(env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "sglang.launch_server", "--model-path", "Qwen/Qwen3-8B", "--tp-size", "2",
                             "--host", "127.0.0.1", *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_simulated_rank_0_times_out_with_torch_text_when_a_rank_never_joins(tmp_path: Path) -> None:
    from perflab.lifecycle.ports import pick_free_port

    env = sim.activate("a100-80g-x8", {**os.environ, STATE_ENV: str(tmp_path / "state"), "PERFLAB_SIM_TIME_SCALE": "50"})
    rdv = pick_free_port("127.0.0.1")
    head = _sglang({**env, "CUDA_VISIBLE_DEVICES": "0"}, "--port", str(pick_free_port("127.0.0.1")), "--nnodes", "2",
                   "--node-rank", "0", "--dist-init-addr", f"127.0.0.1:{rdv}", "--dist-timeout", "2")
    try:
        out, _ = head.communicate(timeout=30)
    finally:
        if head.poll() is None:
            head.kill()
            head.wait()
    # torch/csrc/distributed/c10d/TCPStore.cpp's words; SGLang dies by kill_process_tree (SIGKILL)
    assert "DistStoreError: Timed out after 2 seconds waiting for clients. 1/2 clients joined." in out, out
    assert head.returncode == -9
    pm = load()

    assert pm.engine("sglang").classify_crash(head.returncode, out).name == "rendezvous-timeout"


def test_simulated_joining_rank_times_out_when_rank_0_is_absent(tmp_path: Path) -> None:
    from perflab.lifecycle.ports import pick_free_port

    env = sim.activate("a100-80g-x8", {**os.environ, STATE_ENV: str(tmp_path / "state")})
    rdv = pick_free_port("127.0.0.1")
    joiner = _sglang({**env, "CUDA_VISIBLE_DEVICES": "1"}, "--port", "30000", "--nnodes", "2", "--node-rank", "1",
                     "--dist-init-addr", f"127.0.0.1:{rdv}", "--dist-timeout", "1")
    try:
        out, _ = joiner.communicate(timeout=30)
    finally:
        if joiner.poll() is None:
            joiner.kill()
            joiner.wait()
    assert f"The client socket has timed out after 1000ms while trying to connect to (127.0.0.1, {rdv})." in out, out
    assert "Uvicorn running" not in out


@pytest.mark.slow
def test_perflab_launch_nodes_2_checks_a_two_node_sglang_and_refuses_trtllm(tmp_path: Path) -> None:
    tag = uuid.uuid4().hex
    env = {**os.environ, TAG_ENV: tag, STATE_ENV: str(tmp_path / "sim-state")}

    def launch(engine: str, *extra: str) -> tuple[int, dict]:
        proc = subprocess.run([sys.executable, "-c", "from perflab.cli import main; main()", "launch", engine,
                               "--hardware", "sim:a100-80g-x8", "-m", "Qwen/Qwen3-8B", "--nodes", "2", *extra,
                               "--workdir", str(tmp_path / engine), "--json"],
                              env=env, capture_output=True, text=True, timeout=120)
        return proc.returncode, json.loads(proc.stdout)

    rc, out = launch("sglang", "--tp", "2", "--check")
    assert rc == 0 and out["state"] == "done" and out["check"]["ok"], out
    assert [n["state"] for n in out["nodes"]] == ["done", "done"]
    assert (tmp_path / "sglang" / "engine-node1.log").is_file()
    # a rank that loads too slowly never joins within --dist-timeout: rank 0 gives up in torch's words
    rc, out = launch("sglang", "--tp", "2", "--env", f"{FAULT_ENV}=slow-start:30", "--env", f"{FAULT_NODE_RANK_ENV}=1",
                     "--extra-arg=--dist-timeout", "--extra-arg=2")
    assert rc != 0 and out["state"] == "crashed" and out["cause"] == "rendezvous-timeout" and out["failed_rank"] == 0, out
    assert "1/2 clients joined" in out["crash"]["line"]
    rc, out = launch("trtllm")
    assert rc != 0 and out["state"] == "unsupported" and [r["what"] for r in out["reasons"]] == ["nodes=2"], out
    assert _tagged(tag) == []


def test_engines_command_prints_every_node_ranks_launch() -> None:
    def command(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-c", "from perflab.cli import main; main()", "engines", "command", *args,
                               "--hardware", "sim:a100-80g-x8", "-m", "Qwen/Qwen3-8B", "--nodes", "2"],
                              capture_output=True, text=True, timeout=60)

    out = command("vllm", "--dp", "4", "--json")
    assert out.returncode == 0, out.stderr
    nodes = json.loads(out.stdout)["nodes"]
    assert len(nodes) == 2 and "--headless" not in nodes[0]["argv"] and "--headless" in nodes[1]["argv"]
    assert [n["env"]["CUDA_VISIBLE_DEVICES"] for n in nodes] == ["0,1", "2,3"]
    # only rank 0 serves; rank 1 joins its rendezvous (vLLM's --data-parallel-rpc-port)
    assert [(n["rank"], n["serves"]) for n in nodes] == [(0, True), (1, False)]
    rendezvous = json.loads(out.stdout)["rendezvous"]
    assert rendezvous == f"127.0.0.1:{_argv_after(nodes[1]['argv'], '--data-parallel-rpc-port')}"
    text = command("sglang", "--tp", "2").stdout
    assert "# ===== node rank 0 of 2 (serves the API)" in text and "--node-rank 1" in text
    rank0, rank1 = text.split("# ===== node rank 1 of 2\n")
    assert rank0.count("# serves 'Qwen/Qwen3-8B' on http://127.0.0.1:30000") == 1
    assert "# serves 'Qwen" not in rank1  # rank 1 serves no HTTP
    joined = _argv_after(rank1.split("# command:\n")[1].splitlines()[0].split(), "--dist-init-addr")
    assert f"# serves no API: joins node rank 0's rendezvous at {joined}\n" in rank1
    refused = command("trtllm")
    assert refused.returncode == 2 and refused.stderr.strip().count("\n") == 0 and "nodes=2" in refused.stderr


@pytest.mark.slow
def test_ctrl_c_on_a_serving_two_node_launch_stops_every_rank(tmp_path: Path) -> None:
    import signal
    import time

    tag = uuid.uuid4().hex
    env = {**os.environ, TAG_ENV: tag, STATE_ENV: str(tmp_path / "sim-state"), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-c", "from perflab.cli import main; main()", "launch", "sglang",
                             "--hardware", "sim:a100-80g-x8", "-m", "Qwen/Qwen3-8B", "--tp", "2", "--nodes", "2",
                             "--workdir", str(tmp_path / "run")],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        assert proc.stderr is not None
        for line in proc.stderr:
            if "ready in" in line or time.monotonic() > deadline:
                break
        assert len(_tagged(tag)) >= 3, "perflab and both ranks should be running"
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert rc == 0  # as for one node: Ctrl-C is how a served launch ends (perflab launch exits 130 before ready)
    assert proc.stdout is not None
    summary = proc.stdout.read()
    assert "(interrupted)" in summary and "clean" in summary, summary
    assert _tagged(tag) == [], "a rank outlived Ctrl-C"
