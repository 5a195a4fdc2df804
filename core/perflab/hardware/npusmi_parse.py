"""Parsers for Huawei ``npu-smi`` text output (pure functions, no subprocess).

The formats, including their irregular spacing (``0    / 0``, ``65099/ 65536``), are those
of the real outputs kept in ``tests/fixtures/npu-smi/``:

* ``npu-smi info`` — a box table: per NPU one "NPU Name | Health | Power Temp Hugepages" row
  followed by one "Chip [Device] | Bus-Id | AICore Memory-Usage [HBM-Usage]" row per chip;
  then a process table. Column sets differ between tool versions (310 cards have no
  HBM column; old tools have no Hugepages column), so values are mapped by the header.
* ``npu-smi info -m`` — the chip mapping; ``Chip Logic ID`` is the index that
  ``ASCEND_RT_VISIBLE_DEVICES`` uses; rows whose logic id is ``-`` are the board's Mcu.
* ``npu-smi info -t usages|board|common -i N [-c C]`` — ``Key : Value`` lines.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

_SLASH = re.compile(r"\s*/\s*")
_BUS_ID = re.compile(r"^[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]$")
_VERSION = re.compile(r"Version:\s*(\S+)")
_TOOL_VERSION = re.compile(r"npu-smi\s+(\S+)")


@dataclass(frozen=True)
class ChipRow:
    """One chip of ``npu-smi info``'s device table."""

    npu_id: int
    chip_id: int
    name: str  # the Name column of the NPU row: "910B3", "310", "910A"
    health: str  # "OK", "Warning", "Alarm", "Critical", ...
    bus_id: str | None
    device_id: int | None = None  # the "Device" column some 310 tool versions print
    power_w: float | None = None
    temp_c: float | None = None
    aicore_pct: float | None = None
    memory_used_mb: int | None = None  # Memory-Usage (DDR on 910, the only memory of 310)
    memory_total_mb: int | None = None
    hbm_used_mb: int | None = None
    hbm_total_mb: int | None = None


@dataclass(frozen=True)
class ProcessRow:
    npu_id: int
    chip_id: int
    pid: int
    name: str
    memory_mb: int | None


@dataclass(frozen=True)
class NpuInfo:
    """``npu-smi info`` as a whole."""

    tool_version: str | None  # "23.0.rc3.3" (the npu-smi version)
    version: str | None  # the "Version:" field: the driver version
    chips: tuple[ChipRow, ...]
    processes: tuple[ProcessRow, ...]


@dataclass(frozen=True)
class ChipMapping:
    """One row of ``npu-smi info -m``."""

    npu_id: int
    chip_id: int
    logic_id: int | None  # None for the Mcu
    chip_name: str  # "Ascend 910B3", "Ascend xxx", "MiniD", "Mcu"

    @property
    def is_accelerator(self) -> bool:
        return self.logic_id is not None


def _int(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        return None


def _float(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:  # "NA", "-"
        return None


def _pair(text: str | None) -> tuple[int | None, int | None]:
    if text is None or "/" not in text:
        return None, None
    used, _, total = text.partition("/")
    return _int(used), _int(total)


def _cells(line: str) -> list[str] | None:
    s = line.strip()
    if not (s.startswith("|") and s.endswith("|")) or len(s) < 2:
        return None
    return [c.strip() for c in s[1:-1].split("|")]


def _tokens(cell: str) -> list[str]:
    """Whitespace tokens of a cell, with ``a / b`` pairs (any spacing) kept as one ``a/b``."""
    return _SLASH.sub("/", cell).split()


def _map_columns(headers: list[str], values: list[str]) -> dict[str, str]:
    return dict(zip(headers, values, strict=False))


def parse_info(text: str) -> NpuInfo:
    """Parse ``npu-smi info``.

    Rows between two ``+---+`` separators form one group: its first row is the NPU row, the
    following rows are that NPU's chips (one on 910, several on multi-chip cards). Values
    in the third column are matched to the header's names, so a missing Hugepages or HBM
    column shifts nothing.
    """
    tool_version = version = None
    npu_headers: list[str] = []
    chip_headers: list[str] = []
    first_cell_chip_headers: list[str] = []
    chips: list[ChipRow] = []
    processes: list[ProcessRow] = []
    in_processes = False
    group: list[list[str]] = []

    def flush() -> None:
        if not group or in_processes:
            group.clear()
            return
        npu_cells, chip_rows = group[0], group[1:]
        group.clear()
        first = _tokens(npu_cells[0])
        npu_id = _int(first[0]) if first else None
        if npu_id is None or len(npu_cells) < 2:
            return
        name = " ".join(first[1:])
        health = npu_cells[1]
        npu_vals = _map_columns(npu_headers, _tokens(npu_cells[2]) if len(npu_cells) > 2 else [])
        for cells in chip_rows:
            ids = _tokens(cells[0])
            chip_id = _int(ids[0]) if ids else None
            if chip_id is None:
                continue
            ids_by_name = _map_columns(first_cell_chip_headers, ids)
            vals = _map_columns(chip_headers, _tokens(cells[2]) if len(cells) > 2 else [])
            bus = cells[1] if len(cells) > 1 and _BUS_ID.match(cells[1]) else None
            mem_used, mem_total = _pair(vals.get("Memory-Usage(MB)"))
            hbm_used, hbm_total = _pair(vals.get("HBM-Usage(MB)"))
            chips.append(
                ChipRow(
                    npu_id=npu_id,
                    chip_id=chip_id,
                    name=name,
                    health=health,
                    bus_id=bus,
                    device_id=_int(ids_by_name.get("Device")),
                    power_w=_float(npu_vals.get("Power(W)")),
                    temp_c=_float(npu_vals.get("Temp(C)")),
                    aicore_pct=_float(vals.get("AICore(%)")),
                    memory_used_mb=mem_used,
                    memory_total_mb=mem_total,
                    hbm_used_mb=hbm_used,
                    hbm_total_mb=hbm_total,
                )
            )

    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("+"):
            flush()
            continue
        cells = _cells(line)
        if cells is None:
            continue
        joined = " ".join(cells)
        if "npu-smi" in joined and tool_version is None:
            m = _TOOL_VERSION.search(joined)
            tool_version = m.group(1) if m else None
            v = _VERSION.search(joined)
            version = v.group(1) if v else tool_version
            continue
        if "Process id" in joined:
            flush()
            in_processes = True
            continue
        if len(cells) >= 2 and cells[1] == "Health":
            npu_headers = _tokens(cells[2]) if len(cells) > 2 else []
            in_processes = False
            continue
        if len(cells) >= 2 and cells[1] == "Bus-Id":
            chip_headers = _tokens(cells[2]) if len(cells) > 2 else []
            first_cell_chip_headers = _tokens(cells[0])
            continue
        if in_processes:
            if len(cells) >= 4:
                ids = _tokens(cells[0])
                pid = _int(cells[1])
                if len(ids) >= 2 and _int(ids[0]) is not None and _int(ids[1]) is not None and pid is not None:
                    processes.append(ProcessRow(int(ids[0]), int(ids[1]), pid, cells[2], _int(cells[3])))
            continue  # "No running processes found in NPU 4"
        group.append(cells)
    flush()
    return NpuInfo(tool_version, version, tuple(chips), tuple(processes))


def parse_mapping(text: str) -> list[ChipMapping]:
    """Parse ``npu-smi info -m`` (whitespace-aligned columns; the name may hold a space)."""
    rows: list[ChipMapping] = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 4:
            continue
        npu_id, chip_id = _int(parts[0]), _int(parts[1])
        if npu_id is None or chip_id is None:
            continue  # the header line
        logic = parts[2]
        if logic != "-" and _int(logic) is None:
            continue
        rows.append(ChipMapping(npu_id, chip_id, _int(logic), " ".join(parts[3:])))
    return rows


def parse_key_values(text: str) -> list[dict[str, str]]:
    """``Key : Value`` lines, split into blocks at blank lines (order kept)."""
    blocks: list[dict[str, str]] = []
    current: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if current:
                blocks.append(current)
                current = {}
            continue
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key, value = key.strip(), value.strip()
        if key in current:  # a repeated key without a blank line starts a new block
            blocks.append(current)
            current = {}
        current[key] = value
    if current:
        blocks.append(current)
    return blocks


_HEADER_KEYS = ("NPU ID", "Chip Count")


def parse_per_chip(text: str) -> tuple[dict[str, str], dict[int, dict[str, str]]]:
    """Split ``-t usages`` / ``-t common`` output into (NPU header, {chip id: fields}).

    ``-t common`` puts ``Chip ID`` first in a chip's block, ``-t usages`` puts it last; a
    block belongs to the chip id it contains either way. The Mcu block has no chip id and is
    dropped.
    """
    header: dict[str, str] = {}
    chips: dict[int, dict[str, str]] = {}
    for block in parse_key_values(text):
        fields = dict(block)
        for k in _HEADER_KEYS:
            if k in fields:
                header[k] = fields.pop(k)
        chip_id = _int(fields.pop("Chip ID", None))
        if chip_id is None:
            continue
        chips[chip_id] = fields
    return header, chips


def parse_usages(text: str) -> dict[int, dict[str, int | None]]:
    """``npu-smi info -t usages -i N``: per chip id, memory capacity in MB and usage rate.

    910 chips report ``HBM Capacity(MB)``; 310/310P chips have only DDR
    (``DDR Capacity(MB)``), which is then their device memory.
    """
    _, chips = parse_per_chip(text)
    out: dict[int, dict[str, int | None]] = {}
    for chip_id, f in chips.items():
        hbm = _int(f.get("HBM Capacity(MB)"))
        ddr = _int(f.get("DDR Capacity(MB)"))
        out[chip_id] = {
            "hbm_capacity_mb": hbm,
            "hbm_usage_pct": _int(f.get("HBM Usage Rate(%)")),
            "ddr_capacity_mb": ddr,
            "ddr_usage_pct": _int(f.get("DDR Usage Rate(%)")),
            "capacity_mb": hbm if hbm else ddr,
        }
    return out


@dataclass(frozen=True)
class BoardInfo:
    npu_id: int | None
    chip_id: int | None
    chip_name: str | None
    uuid: str | None
    bus_id: str | None
    firmware: str | None


def die_uuid(die_id: str) -> str:
    """A die id as the globally unique chip id Huawei uses: its words joined with ``-``.

    Huawei's vNPU guide names shared-memory files after the VDie ID read with
    ``npu-smi info -t board -i ${id} -c ${chip_id}``, "spliced with '-'", e.g.
    ``11111111-22222222-33333333-44444444-55555555`` (Ascend docs, "软切分" / vnpu guide).
    """
    return "-".join(die_id.split())


def parse_board(text: str) -> BoardInfo:
    """``npu-smi info -t board -i N -c C``; the UUID comes from ``VDie ID`` (910B) or
    ``Die ID`` (310P)."""
    fields: dict[str, str] = {}
    for block in parse_key_values(text):
        for k, v in block.items():
            fields.setdefault(k, v)
    die = fields.get("VDie ID") or fields.get("Die ID")
    bus = fields.get("PCIe Bus Info")
    return BoardInfo(
        npu_id=_int(fields.get("NPU ID")),
        chip_id=_int(fields.get("Chip ID")),
        chip_name=fields.get("Chip Name"),
        uuid=die_uuid(die) if die and die.upper() != "NA" else None,
        bus_id=bus if bus and _BUS_ID.match(bus) else None,
        firmware=fields.get("Firmware Version"),
    )


@dataclass(frozen=True)
class MergedChip:
    """One accelerator chip: the device table joined with the chip mapping."""

    npu_id: int
    chip_id: int
    logic_id: int | None
    chip: str
    bus_id: str | None
    memory_total_mb: int | None
    memory_used_mb: int | None


def chip_name(info_name: str | None, mapping_name: str | None) -> str:
    """The chip model: ``npu-smi info -m`` says "Ascend 910B3" on current tools, which is the
    most precise; older tools print "MiniD" there while ``npu-smi info`` says "310"."""
    if mapping_name and mapping_name.startswith("Ascend "):
        return mapping_name[len("Ascend ") :].strip()
    if info_name:
        return info_name
    return mapping_name or "unknown"


def merge(info: NpuInfo, mapping_rows: Sequence[ChipMapping]) -> list[MergedChip]:
    """Join the device table and the chip mapping on (NPU id, chip id).

    Chips in the mapping but not in the table (the table can omit chips of multi-chip cards)
    are kept with what the mapping knows. Without a mapping, logic ids follow the table's
    order, which is how the driver numbers the visible chips.
    """
    mapping = [m for m in mapping_rows if m.is_accelerator]
    by_key = {(m.npu_id, m.chip_id): m for m in mapping}
    chips: list[MergedChip] = []
    seen: set[tuple[int, int]] = set()
    for n, row in enumerate(info.chips):
        key = (row.npu_id, row.chip_id)
        seen.add(key)
        m = by_key.get(key)
        logic = m.logic_id if m is not None else (None if mapping else n)
        total: int | None
        used: int | None
        if row.hbm_total_mb:
            total, used = row.hbm_total_mb, row.hbm_used_mb
        else:  # 310 / 310P: no HBM, the DDR is the device memory
            total, used = row.memory_total_mb, row.memory_used_mb
        chips.append(
            MergedChip(row.npu_id, row.chip_id, logic, chip_name(row.name, m.chip_name if m else None), row.bus_id, total or None, used)
        )
    for m in mapping:
        if (m.npu_id, m.chip_id) not in seen:
            chips.append(MergedChip(m.npu_id, m.chip_id, m.logic_id, chip_name(None, m.chip_name), None, None, None))
    return chips
