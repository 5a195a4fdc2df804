"""Built-in hardware probe for Huawei Ascend NPUs, through the ``npu-smi`` tool.

``npu-smi info`` gives names, health, bus ids and memory; ``npu-smi info -m`` gives each
chip's logic id (the index ``ASCEND_RT_VISIBLE_DEVICES`` and the engines use);
``npu-smi info -t board -i N -c C`` gives the die id used as UUID, and
``npu-smi info -t usages -i N`` the memory capacity when the table lacks it. The tool is found
on ``env["PATH"]``, so in simulation perflab's stand-in answers with the same formats.
Parsing (and joining the outputs) lives in :mod:`perflab.hardware.npusmi_parse`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence

from perflab.contract.hookspecs import hookimpl
from perflab.contract.types import Accelerator
from perflab.hardware import emulation
from perflab.hardware.standins import NPU_SMI_ENV, standin

INFO_TIMEOUT_S = 30.0  # npu-smi takes seconds on an 8-card server under load
DETAIL_TIMEOUT_S = 15.0


class NpuSmiError(RuntimeError):
    pass


def run_npu_smi(exe: str, args: Sequence[str], env: Mapping[str, str], timeout: float) -> str:
    """What ``exe *args`` prints; an activated machine's stand-in (:data:`NPU_SMI_ENV`) answers
    instead of a process when it names one, with the same text to parse."""
    argv = [exe, *args]
    answer = standin(env, NPU_SMI_ENV)
    if answer is not None:
        try:
            return str(answer(env, list(args)))
        except Exception as exc:  # the stand-in's failure is the tool's: one line, never the probe's crash
            lines = str(exc).strip().splitlines()
            raise NpuSmiError(f"`{' '.join(argv)}` failed: {lines[0] if lines else type(exc).__name__}") from None
    try:
        done = subprocess.run(argv, env=dict(env), capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise NpuSmiError(f"`{' '.join(argv)}` did not answer within {timeout:.0f} s") from None
    except OSError as exc:
        raise NpuSmiError(f"`{' '.join(argv)}` could not run: {exc}") from None
    if done.returncode != 0:
        detail = (done.stderr.strip() or done.stdout.strip()).splitlines()
        raise NpuSmiError(f"`{' '.join(argv)}` exited with code {done.returncode}: {detail[-1] if detail else 'no output'}")
    return done.stdout


def _optional(exe: str, args: Sequence[str], env: Mapping[str, str]) -> str | None:
    """Details (UUID, capacity) are worth a try, never worth failing the probe."""
    try:
        return run_npu_smi(exe, args, env, DETAIL_TIMEOUT_S)
    except NpuSmiError:
        return None


def _memory_from_usages(text: str, chip_id: int) -> tuple[int | None, int | None]:
    """(capacity, used) in MB from ``-t usages``, which gives a capacity and a usage rate."""
    from perflab.hardware.npusmi_parse import parse_usages

    u = parse_usages(text).get(chip_id, {})
    capacity = u.get("capacity_mb")
    if not capacity:
        return None, None
    rate = u.get("hbm_usage_pct") if u.get("hbm_capacity_mb") else u.get("ddr_usage_pct")
    return capacity, (capacity * rate // 100 if rate is not None else None)


def read_npus(exe: str, env: Mapping[str, str], source: str = "npu-smi") -> list[Accelerator]:
    from concurrent.futures import ThreadPoolExecutor

    # Parsing is imported here, not at module level: every perflab command imports this
    # module to register the hook, and only hardware probing needs the parsers.
    from perflab.hardware.npusmi_parse import merge, parse_board, parse_info, parse_mapping

    info = parse_info(run_npu_smi(exe, ["info"], env, INFO_TIMEOUT_S))
    mapping_text = _optional(exe, ["info", "-m"], env)
    chips = [c for c in merge(info, parse_mapping(mapping_text or "")) if c.logic_id is not None]
    if not chips:
        return []
    npus_without_memory = sorted({c.npu_id for c in chips if c.memory_total_mb is None})
    # One tool call per chip/NPU; run them side by side (npu-smi is slow, not busy).
    with ThreadPoolExecutor(max_workers=min(8, len(chips) + len(npus_without_memory))) as pool:
        boards = {
            (c.npu_id, c.chip_id): pool.submit(
                _optional, exe, ["info", "-t", "board", "-i", str(c.npu_id), "-c", str(c.chip_id)], env
            )
            for c in chips
        }
        usages = {n: pool.submit(_optional, exe, ["info", "-t", "usages", "-i", str(n)], env) for n in npus_without_memory}
        board_text = {k: f.result() for k, f in boards.items()}
        usage_text = {k: f.result() for k, f in usages.items()}
    out: list[Accelerator] = []
    for c in sorted(chips, key=lambda c: (c.logic_id, c.npu_id, c.chip_id)):
        text = board_text.get((c.npu_id, c.chip_id))
        board = parse_board(text) if text else None
        total, used = c.memory_total_mb, c.memory_used_mb
        if total is None and usage_text.get(c.npu_id):
            total, used = _memory_from_usages(usage_text[c.npu_id] or "", c.chip_id)
        out.append(
            Accelerator(
                vendor="huawei",
                kind="ascend",
                index=int(c.logic_id),  # type: ignore[arg-type]
                name=f"Ascend {c.chip}",
                memory_total_mib=int(total or 0),
                memory_used_mib=int(used or 0),
                uuid=board.uuid if board else None,
                chip=c.chip,
                driver_version=info.version,
                bus_id=c.bus_id or (board.bus_id if board else None),
                npu_id=c.npu_id,
                chip_id=c.chip_id,
                source=source,
            )
        )
    return out


@hookimpl
def perflab_probe_hardware(env: Mapping[str, str]) -> list[Accelerator] | None:
    exe = shutil.which("npu-smi", path=env.get("PATH", os.defpath))
    if exe is None:
        return None
    return read_npus(exe, env, source="sim" if emulation.machine(env) else "npu-smi")
