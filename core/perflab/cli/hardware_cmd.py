"""``perflab hardware``: the accelerators every hardware probe (NVML, npu-smi, plugins) found,
or the host CPU (one row per NUMA node) when there is none."""

from __future__ import annotations

import json

import click

from perflab.cli.options import hardware_option, json_option
from perflab.contract.types import Accelerator, HardwareSnapshot, to_jsonable

NOTHING_FOUND = "No NVIDIA GPU (NVML), Ascend NPU (npu-smi) or readable CPU (/proc/cpuinfo) found on this machine."


def _memory(a: Accelerator) -> str:
    if not a.memory_total_mib:
        return "-"
    return f"{a.memory_used_mib:,} / {a.memory_total_mib:,}"


def _compute(a: Accelerator) -> str:
    if a.cores is not None:  # the host CPU: its cores and the instruction sets engines care about
        return f"{a.cores} cores ({a.cpu_list or '-'})\n{' '.join(a.features) or 'no AVX-512/AMX'}"
    if a.compute_capability is not None:
        return f"{a.compute_capability[0]}.{a.compute_capability[1]} (SM{a.sm})"
    return a.chip or "-"


def _driver(a: Accelerator) -> str:
    parts = [a.driver_version or "-"]
    if a.cuda_driver_version:
        parts.append(f"CUDA {a.cuda_driver_version}")
    return "\n".join(parts)


def describe(snapshot: HardwareSnapshot) -> str:
    where = snapshot.host or "this machine"
    return f"{where} (simulated: {snapshot.name})" if snapshot.simulated else where


def render_table(snapshot: HardwareSnapshot) -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    sources = ", ".join(sorted({a.source for a in snapshot.accelerators if a.source})) or "-"
    table = Table(
        title=f"Accelerators on {describe(snapshot)} — read through {sources}", title_justify="left", box=box.SIMPLE_HEAD
    )
    table.add_column("#", justify="right", no_wrap=True)
    table.add_column("accelerator\nuuid · bus id", overflow="fold", min_width=22)
    table.add_column("memory MiB\nused / total", no_wrap=True)
    table.add_column("compute, chip\nor cores · ISA", overflow="fold")
    table.add_column("driver", no_wrap=True)  # short, and a one-word header rich would crop at 80 columns
    for a in snapshot.accelerators:
        label = a.name if a.vendor.lower() in a.name.lower() else f"{a.name} ({a.vendor})"
        who = Text(label)
        if a.cores is not None:
            who.append(f"\nNUMA node {a.index}", style="dim")
        else:
            who.append(f"\n{a.uuid or 'no uuid'}\nbus {a.bus_id or '-'}", style="dim")
        table.add_row(str(a.index), who, _memory(a), _compute(a), _driver(a))
    Console().print(table)


@click.command("hardware")
@hardware_option
@json_option
@click.pass_context
def hardware(ctx: click.Context, hardware: str, as_json: bool) -> None:
    """Show the accelerators on this machine (NVIDIA through NVML, Ascend through npu-smi),
    or, when there is none, the CPU (one row per NUMA node: cores, memory, AVX-512/AMX).

    With --hardware sim:NAME the same probes run against the simulator's stand-ins for the
    catalog machine NAME; the output says so.
    """
    from perflab.cli import get_pm
    from perflab.hardware import resolve

    snapshot, _ = resolve(get_pm(ctx), hardware)
    if as_json:
        click.echo(json.dumps(to_jsonable(snapshot), indent=2))
        return
    for err in snapshot.errors:
        click.secho(f"warning: hardware probe failed: {err}", fg="yellow", err=True)
    if not snapshot.accelerators:
        suffix = f" (simulated: {snapshot.name})" if snapshot.simulated else ""
        click.echo(NOTHING_FOUND + suffix)
        return
    render_table(snapshot)
