"""The host CPU as an accelerator-like entry, for engines that serve on CPU (vLLM's CPU
build, llama.cpp).

One entry per NUMA node, because that is the unit a CPU engine is placed on: vLLM 0.32's
CPU worker binds each rank to one memory node and sizes its memory from that node alone
(``CPUWorker.__init__`` in vllm/v1/worker/cpu_worker.py reads
``get_memory_node_info(node)`` of vllm/utils/cpu_resource_utils.py). Memory is computed the
way vLLM computes it, so preflight can predict vLLM's own refusal:

* total: ``MemTotal`` of ``/sys/devices/system/node/nodeN/meminfo`` (``/proc/meminfo``
  when the kernel exposes no nodes), clamped to the cgroup v2 limit (``memory.max``);
* available: ``MemFree + Active(file) + Inactive(file) + SReclaimable`` of the node,
  clamped to ``limit - memory.current`` under a cgroup limit.

``memory_used_mib`` is total minus that available memory. ``cores`` counts the node's
logical CPUs this process may run on (``sched_getaffinity``), ``cpu_list`` lists them in the
kernel's cpulist syntax (what ``VLLM_CPU_OMP_THREADS_BIND`` takes), and ``features`` keeps
the instruction-set flags of /proc/cpuinfo that CPU engines dispatch on (AVX-512, AMX...).

The probe only reports the CPU when no other probe found an accelerator (see
:func:`perflab.hardware.probe`), and never in simulation.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from perflab.contract.hookspecs import hookimpl
from perflab.contract.types import Accelerator
from perflab.hardware import emulation

KIND = "cpu"
SOURCE = "procfs"
MIB = 1024 * 1024

#: /proc/cpuinfo flags CPU engines choose kernels by: vLLM's CPU build (AVX-512, its BF16
#: and VNNI extensions, AMX; csrc/cpu and vllm/platforms/cpu.py), llama.cpp's ggml-cpu
#: (AVX2, AVX-512, AMX), and the Arm equivalents (asimd, sve, bf16, i8mm) of the
#: ``Features`` line.
INTERESTING_FLAGS: tuple[str, ...] = (
    "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "avx512_fp16",
    "amx_tile", "amx_bf16", "amx_int8", "amx_fp16", "asimd", "asimddp", "sve", "sve2", "bf16", "i8mm",
)  # fmt: skip

_VENDORS = {"GenuineIntel": "intel", "AuthenticAMD": "amd", "HygonGenuine": "hygon", "CentaurHauls": "centaur"}
_ARM_IMPLEMENTERS = {"0x41": "arm", "0x48": "hisilicon", "0x61": "apple", "0xc0": "ampere", "0x4e": "nvidia"}


@dataclass(frozen=True)
class CpuInfo:
    vendor: str
    model: str
    flags: frozenset[str]


@dataclass(frozen=True)
class NodeMemory:
    total: int  # bytes
    available: int  # bytes


def parse_cpulist(text: str) -> list[int]:
    """``0-3,8,10-11`` -> [0, 1, 2, 3, 8, 10, 11] (the kernel's cpulist format)."""
    out: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def format_cpulist(cpus: Iterable[int]) -> str:
    """[0, 1, 2, 3, 8] -> ``0-3,8``."""
    ordered = sorted(set(cpus))
    ranges: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        ranges.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(ranges)


def parse_cpuinfo(text: str) -> CpuInfo:
    """Vendor, model name and flags of the first processor block of /proc/cpuinfo."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if fields.get("flags") or fields.get("Features"):
                break
            continue
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    flags = frozenset((fields.get("flags") or fields.get("Features") or "").split())
    vendor_id = fields.get("vendor_id", "")
    vendor = _VENDORS.get(vendor_id) or _ARM_IMPLEMENTERS.get(fields.get("CPU implementer", "").lower()) or "cpu"
    model = fields.get("model name") or fields.get("Model") or fields.get("cpu model") or platform.machine() or "CPU"
    return CpuInfo(vendor=vendor, model=" ".join(model.split()), flags=flags)


def parse_meminfo(text: str) -> dict[str, int]:
    """Bytes by key, for /proc/meminfo (``MemTotal: 123 kB``) and the per-node files
    (``Node 0 MemTotal: 123 kB``)."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if parts[:1] == ["Node"]:
            parts = parts[2:]
        if len(parts) >= 2 and parts[0].endswith(":"):
            try:
                value = int(parts[1])
            except ValueError:
                continue
            out[parts[0][:-1]] = value * 1024 if parts[2:3] == ["kB"] else value
    return out


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _cgroup_int(path: Path) -> int | None:
    text = _read(path)
    if text is None or text.strip() in ("", "max"):
        return None
    try:
        return int(text.strip())
    except ValueError:
        return None


def node_memory(meminfo: Mapping[str, int], cgroup_limit: int | None, cgroup_usage: int | None) -> NodeMemory:
    """vLLM 0.32's ``get_memory_node_info`` arithmetic (vllm/utils/cpu_resource_utils.py)."""
    total = meminfo.get("MemTotal", 0)
    available = (
        meminfo.get("MemFree", 0)
        + meminfo.get("Active(file)", 0)
        + meminfo.get("Inactive(file)", 0)
        + meminfo.get("SReclaimable", 0)
    )
    if cgroup_limit is not None and cgroup_limit < total:
        total = cgroup_limit
        available = max(0, min(available, cgroup_limit - (cgroup_usage or 0)))
    return NodeMemory(total=total, available=available)


def probe_cpu(root: Path = Path("/"), allowed: Iterable[int] | None = None) -> list[Accelerator]:
    """The CPU of the machine whose /proc and /sys are under ``root``, one entry per NUMA node.

    ``allowed`` are the logical CPUs this process may use (default: ``sched_getaffinity``
    when ``root`` is the real one, else all).
    """
    cpuinfo_text = _read(root / "proc" / "cpuinfo")
    if cpuinfo_text is None:
        return []
    info = parse_cpuinfo(cpuinfo_text)
    if allowed is None and root == Path("/") and hasattr(os, "sched_getaffinity"):
        allowed = os.sched_getaffinity(0)
    allowed_set = set(allowed) if allowed is not None else None
    cgroup = root / "sys" / "fs" / "cgroup"
    limit, usage = _cgroup_int(cgroup / "memory.max"), _cgroup_int(cgroup / "memory.current")
    features = tuple(f for f in INTERESTING_FLAGS if f in info.flags)

    nodes: list[tuple[int, str, str]] = []  # (node id, meminfo text, cpulist text)
    node_dir = root / "sys" / "devices" / "system" / "node"
    for d in sorted(node_dir.glob("node[0-9]*"), key=lambda p: int(p.name[4:])):
        mem, cpus = _read(d / "meminfo"), _read(d / "cpulist")
        if mem is not None and cpus is not None and cpus.strip():
            nodes.append((int(d.name[4:]), mem, cpus))
    if not nodes:  # no NUMA information: the whole machine is one node (vLLM falls back to psutil)
        mem = _read(root / "proc" / "meminfo") or ""
        count = sum(1 for line in cpuinfo_text.splitlines() if line.startswith("processor"))
        nodes.append((0, mem, f"0-{max(count, 1) - 1}"))

    out: list[Accelerator] = []
    for node, mem_text, cpus_text in nodes:
        node_cpus = parse_cpulist(cpus_text)
        if allowed_set is not None:
            node_cpus = [c for c in node_cpus if c in allowed_set]
        if not node_cpus:
            continue  # a node this process may not run on
        node_mem = node_memory(parse_meminfo(mem_text), limit, usage)
        out.append(
            Accelerator(
                vendor=info.vendor,
                kind=KIND,
                index=node,
                name=info.model,
                memory_total_mib=node_mem.total // MIB,
                memory_used_mib=(node_mem.total - node_mem.available) // MIB,
                cores=len(node_cpus),
                cpu_list=format_cpulist(node_cpus),
                features=features,
                source=SOURCE,
            )
        )
    return out


@hookimpl
def perflab_probe_hardware(env: Mapping[str, str]) -> list[Accelerator] | None:
    if emulation.machine(env):
        return None  # a simulated machine has exactly the catalog's accelerators
    return probe_cpu()
