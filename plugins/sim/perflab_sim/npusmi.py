"""A stand-in ``npu-smi`` for simulated Ascend machines.

Prints what Huawei's tool prints for the catalog machine's chips, in exactly the formats of the
real outputs in tests/fixtures/npu-smi/ (the 910B files: column widths, the irregular
spacing, the ``Chip ID`` line at the end of ``-t usages``). HBM in use is the idle baseline plus
what running simulated engines registered (:mod:`perflab_sim.state`), and their processes are
listed in the process table like the real tool's. Power, AI Core usage and clock follow what the
engines on the chip are doing (:mod:`perflab_sim.load`).

Supported: ``info``, ``info -m``, ``info -t usages -i N``, ``info -t common -i N``,
``info -t power -i N``,
``info -t board -i N -c C``, ``-h``. Anything else is an error on stderr with a non-zero exit
status (the real tool's exact error wording is not reproduced; see docs/simulator.md).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from perflab.hardware.npusmi_parse import ProcessRow  # what the probe parses back is what this renders
from perflab_sim import catalog, load, state
from perflab_sim.env import HARDWARE_ENV

WIDTH = 96  # characters between the outer "|" of the `npu-smi info` table
_RULE = "+" + "-" * WIDTH + "+"
_HEAD_RULE = "+" + "-" * 27 + "+" + "-" * 15 + "+" + "-" * 52 + "+"
_ROW_RULE = "+" + "=" * 27 + "+" + "=" * 15 + "+" + "=" * 52 + "+"
_USAGE = (
    "Usage: npu-smi info [-h] [-m] [-t TYPE -i ID [-c CHIP_ID]]\n"
    "       TYPE: usages | common | power | board"
)


@dataclass(frozen=True)
class ChipRow:
    """One chip's line pair in ``npu-smi info``."""

    npu_id: int
    name: str
    health: str
    power_w: str
    temp_c: int
    hugepages_used: int
    hugepages_total: int
    chip_id: int
    bus_id: str
    aicore_pct: int
    memory_used_mb: int
    memory_total_mb: int
    hbm_used_mb: int
    hbm_total_mb: int


def render_info(version: str, chips: Sequence[ChipRow], processes: Sequence[ProcessRow]) -> str:
    """The ``npu-smi info`` table (Atlas A2 layout, as in 910B3_info.txt)."""
    lines = [
        _RULE,
        "| " + f"npu-smi {version}".ljust(33) + f"Version: {version}".ljust(62) + "|",
        _HEAD_RULE,
        "| NPU   Name                | Health        | Power(W)    Temp(C)           Hugepages-Usage(page)|",
        "| Chip                      | Bus-Id        | AICore(%)   Memory-Usage(MB)  HBM-Usage(MB)        |",
        _ROW_RULE,
    ]
    for c in chips:
        lines.append(
            "| "
            + f"{c.npu_id:<6}{c.name:<20}"
            + "| "
            + f"{c.health:<14}"
            + "| "
            + f"{c.power_w:<12}{c.temp_c:<18}{c.hugepages_used:<5}/ {c.hugepages_total:<14}"
            + "|"
        )
        lines.append(
            "| "
            + f"{c.chip_id:<26}"
            + "| "
            + f"{c.bus_id:<14}"
            + "| "
            + f"{c.aicore_pct:<12}{c.memory_used_mb:<5}/ {c.memory_total_mb:<11}{c.hbm_used_mb:<5}/ {c.hbm_total_mb:<14}"
            + "|"
        )
        lines.append(_ROW_RULE)
    lines += [
        _HEAD_RULE,
        "| NPU     Chip              | Process id    | Process name             | Process memory(MB)      |",
        _ROW_RULE,
    ]
    for c in chips:
        mine = [p for p in processes if p.npu_id == c.npu_id]
        if not mine:
            lines.append("| " + f"No running processes found in NPU {c.npu_id}".ljust(WIDTH - 1) + "|")
        for p in mine:
            lines.append(
                "| "
                + f"{p.npu_id:<8}{p.chip_id:<18}"
                + "| "
                + f"{p.pid:<14}"
                + "| "
                + f"{p.name[:24]:<25}"
                + "| "
                + f"{p.memory_mb:<24}"
                + "|"
            )
        lines.append(_ROW_RULE)
    return "\n".join(lines) + "\n"


def _chip_header(npu: int) -> list[tuple[str, object] | None]:
    """What ``npu-smi info -t usages|common -i N`` print first (one chip per NPU on Atlas A2)."""
    return [("NPU ID", npu), ("Chip Count", 1), None]


def _kv(pairs: Sequence[tuple[str, object] | None]) -> str:
    """``Key<padded to 31>: value`` lines; ``None`` is an empty line."""
    return "\n".join("" if p is None else f"{p[0]:<31}: {p[1]}" for p in pairs) + "\n"


def render_mapping(npus: Sequence[tuple[int, int, str]]) -> str:
    """``npu-smi info -m``: (npu id, logic id, chip name) per NPU; each NPU also has its Mcu."""
    rows = [("NPU ID", "Chip ID", "Chip Logic ID", "Chip Name")]
    for npu_id, logic_id, name in npus:
        rows.append((str(npu_id), "0", str(logic_id), f"Ascend {name}"))
        rows.append((str(npu_id), "1", "-", "Mcu"))
    return "\n".join(f"{a:<31}{b:<31}{c:<31}{d}" for a, b, c, d in rows) + "\n"


class _Machine:
    """The catalog machine plus live memory, as the tool sees it."""

    def __init__(self, env: Mapping[str, str]) -> None:
        name = env.get(HARDWARE_ENV)
        if not name:
            raise _Fail("npu-smi: no Ascend device driver is loaded (PERFLAB_SIM_HARDWARE is not set)")
        self.machine = catalog.get(name)
        if not self.machine.is_ascend:
            raise _Fail("dcmi module initialize failed. ret is -8005")
        self.chip = self.machine.chip
        self.holders = state.holders(state.state_dir(env))
        self.loads = load.device_loads(state.state_dir(env), list(range(self.machine.count)))

    @property
    def ids(self) -> range:
        return range(self.machine.count)

    def hbm_used(self, npu: int) -> int:
        return min(self.chip.memory_mib, self.chip.baseline_used_mib + sum(h.on(npu) for h in self.holders))

    def hbm_rate(self, npu: int) -> int:
        return round(self.hbm_used(npu) * 100 / self.chip.memory_mib)

    def power(self, npu: int) -> float:
        """Watts: the load model's (:mod:`perflab_sim.load`) plus a small per-chip offset, as
        real chips of one board never read exactly alike."""
        return round(self.loads[npu].power_w(self.chip) + (npu * 1.7) % 6, 1)

    def aicore_pct(self, npu: int) -> int:
        return round(100 * self.loads[npu].busy)

    def chip_rows(self) -> list[ChipRow]:
        return [
            ChipRow(
                npu_id=i,
                name=self.chip.name,
                health="OK",
                power_w=f"{self.power(i):.1f}",
                temp_c=self.chip.temperature_c + i % 3,
                hugepages_used=0,
                hugepages_total=0,
                chip_id=0,
                bus_id=self.machine.bus_id(i),
                aicore_pct=self.aicore_pct(i),
                memory_used_mb=0,
                memory_total_mb=0,
                hbm_used_mb=self.hbm_used(i),
                hbm_total_mb=self.chip.memory_mib,
            )
            for i in self.ids
        ]

    def process_rows(self) -> list[ProcessRow]:
        return [
            ProcessRow(npu_id=d, chip_id=0, pid=h.pid, name=h.name, memory_mb=h.on(d))
            for d in self.ids
            for h in self.holders
            if h.on(d)
        ]

    def usages(self, npu: int) -> str:
        return _kv(
            [
                *_chip_header(npu),
                ("DDR Capacity(MB)", 15171),
                ("DDR Usage Rate(%)", 3),
                ("DDR Hugepages Total(page)", 0),
                ("DDR Hugepages Usage Rate(%)", 0),
                ("HBM Capacity(MB)", self.chip.memory_mib),
                ("HBM Usage Rate(%)", self.hbm_rate(npu)),
                ("Aicore Usage Rate(%)", self.aicore_pct(npu)),
                ("Aicpu Usage Rate(%)", 0),
                ("Ctrlcpu Usage Rate(%)", 9),
                ("DDR Bandwidth Usage Rate(%)", 0),
                ("HBM Bandwidth Usage Rate(%)", round(100 * self.loads[npu].memory)),
                ("Chip ID", 0),
            ]
        )

    def common(self, npu: int) -> str:
        return _kv(
            [
                *_chip_header(npu),
                ("Chip ID", 0),
                ("Memory Usage Rate(%)", 6),
                ("HBM Usage Rate(%)", self.hbm_rate(npu)),
                ("Aicore Usage Rate(%)", self.aicore_pct(npu)),
                ("Aicore Freq(MHZ)", self.chip.sm_clock_mhz),
                ("Aicore curFreq(MHZ)", self.loads[npu].sm_clock_mhz(self.chip)),
                ("Aicore Count", self.chip.aicore_count),
                ("Temperature(C)", self.chip.temperature_c + 6 + npu % 3),
                ("NPU Real-time Power(W)", f"{self.power(npu):.1f}"),
                None,
                ("Chip Name", "mcu"),
                ("Temperature(C)", self.chip.temperature_c + 8),
                ("NPU Real-time Power(W)", f"{45.2 + npu * 0.3:.1f}"),
            ]
        )

    def power_info(self, npu: int) -> str:
        """``npu-smi info -t power -i N``: the NPU header, then each AI chip's real-time power
        followed by its chip id (npu-smi's show_ascend_card_info / show_ascend_chip_power_info:
        ``NPU Real-time Power(W)`` for an NPU chip of any type but the 310, whose line is
        ``Rated Power Dissipation(W)``), then the Mcu's ``Power Dissipation(W)`` and ``Chip Name``
        (show_ascend_card_mcu_info; the Mcu's figure as ``-t common`` prints it)."""
        return _kv([*_chip_header(npu), ("NPU Real-time Power(W)", f"{self.power(npu):.1f}"), ("Chip ID", 0), None,
                    ("Power Dissipation(W)", f"{45.2 + npu * 0.3:.1f}"), ("Chip Name", "MCU"), None])

    def board(self, npu: int) -> str:
        vdie = self.machine.uuid(npu)
        ndie = self.machine.uuid(npu + 1000)
        return _kv(
            [
                ("NPU ID", npu),
                ("Chip ID", 0),
                ("Chip Type", "Ascend"),
                ("Chip Name", self.chip.name),
                ("Chip Version", "V1"),
                ("Board ID", "0x02"),
                ("PCB ID", "NA"),
                ("BOM ID", 1),
                ("VDie ID", vdie),
                ("NDie ID", ndie),
                ("Chip Position ID", npu % 4),
                ("PCIe Bus Info", self.machine.bus_id(npu)),
                ("Firmware Version", "7.1.0.4.218"),
            ]
        )


class _Fail(Exception):
    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def _parse_info(args: list[str]) -> dict[str, str]:
    opts: dict[str, str] = {}
    i = 0
    while i < len(args):
        a = args[i]
        if a in ("-m", "-h", "--help"):
            opts[a.lstrip("-")[0]] = ""
            i += 1
        elif a in ("-t", "-i", "-c"):
            if i + 1 >= len(args):
                raise _Fail(f'Error: option "{a}" requires a value.\n{_USAGE}')
            opts[a[1]] = args[i + 1]
            i += 2
        else:
            raise _Fail(f'Error: invalid parameter "{a}".\n{_USAGE}')
    return opts


def _npu_id(machine: _Machine, value: str | None) -> int:
    if value is None:
        raise _Fail(f'Error: option "-i" is required for this query.\n{_USAGE}')
    try:
        npu = int(value)
    except ValueError:
        raise _Fail(f'Error: invalid NPU ID "{value}".') from None
    if npu not in machine.ids:
        raise _Fail(f"Error: NPU ID {npu} does not exist. Use \"npu-smi info -l\" to list the devices.")
    return npu


def run(argv: Sequence[str], env: Mapping[str, str]) -> str:
    """What ``npu-smi *argv`` prints on stdout; raises _Fail for errors."""
    args = list(argv)
    if not args or args[0] in ("-h", "--help"):
        return _USAGE + "\n"
    if args[0] != "info":
        raise _Fail(f'Error: unknown command "{args[0]}".\n{_USAGE}')
    opts = _parse_info(args[1:])
    if "h" in opts:
        return _USAGE + "\n"
    machine = _Machine(env)
    if "m" in opts:
        if set(opts) != {"m"}:
            raise _Fail(f"Error: -m cannot be combined with other options.\n{_USAGE}")
        return render_mapping([(i, i, machine.chip.name) for i in machine.ids])
    if "t" not in opts:
        if opts:
            raise _Fail(f'Error: option "-t" is required with "-i".\n{_USAGE}')
        return render_info(machine.machine.driver_version, machine.chip_rows(), machine.process_rows())
    kind = opts["t"]
    npu = _npu_id(machine, opts.get("i"))
    if kind == "usages":
        return machine.usages(npu)
    if kind == "common":
        return machine.common(npu)
    if kind == "power":
        return machine.power_info(npu)
    if kind == "board":
        if "c" not in opts:
            raise _Fail(f'Error: option "-c" is required for "-t board" on this product.\n{_USAGE}')
        if opts["c"] != "0":
            raise _Fail(f'Error: chip ID {opts["c"]} of NPU {npu} is not an AI chip.')
        return machine.board(npu)
    raise _Fail(f'Error: unsupported type "{kind}".\n{_USAGE}')


def answer(env: Mapping[str, str], args: Sequence[str]) -> str:
    """:data:`perflab.hardware.standins.NPU_SMI_ENV`: :func:`run` in the asking process, which
    spares the probe and telemetry a Python process per call; the executable stays on PATH
    for whatever else runs ``npu-smi``."""
    return run(args, env)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        sys.stdout.write(run(sys.argv[1:] if argv is None else argv, os.environ))
    except _Fail as exc:
        print(str(exc), file=sys.stderr)
        return exc.code
    except Exception as exc:  # noqa: BLE001 - e.g. an unknown catalog name in the env
        print(f"npu-smi: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
