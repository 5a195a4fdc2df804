"""The Ascend probe against every real ``npu-smi`` output in tests/fixtures/npu-smi/.

The fixtures are copies of the lab's shared npu-smi captures (real outputs collected from
Huawei's documentation and GPUStack). Every file has asserted values below; a new fixture
without expectations fails ``test_every_fixture_has_expectations``.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from perflab.hardware import npusmi
from perflab.hardware.npusmi_parse import (
    NpuInfo,
    die_uuid,
    parse_board,
    parse_info,
    parse_key_values,
    parse_mapping,
    parse_per_chip,
    parse_usages,
)
from perflab.plugins import PluginManager

FIXTURES = Path(__file__).parent / "fixtures" / "npu-smi"


def read(name: str) -> str:
    return (FIXTURES / name).read_text()


# --------------------------------------------------------------------------- npu-smi info

INFO_EXPECTED = {
    "910B3_info.txt": dict(
        tool_version="23.0.1",
        version="23.0.1",
        keys=[(4, 0)],
        names={"910B3"},
        health=["OK"],
        bus=["0000:01:00.0"],
        hbm=[(3161, 65536)],
        mem=[(0, 0)],
        device_ids=[None],
        processes=[],
    ),
    "910B1-with-processes_info.txt": dict(
        tool_version="23.0.rc3.3",
        version="23.0.rc3.3",
        keys=[(0, 0), (1, 0)],
        names={"910B1"},
        health=["OK", "OK"],
        bus=["0000:C1:00.0", "0000:01:00.0"],
        hbm=[(65099, 65536), (65098, 65536)],
        mem=[(0, 0), (0, 0)],
        device_ids=[None, None],
        processes=[(0, 0, 576489, "python", 60703), (1, 0, 576491, "python", 60704)],
    ),
    "atlas-800-3000_310_1.0.0_info.txt": dict(
        tool_version="20.2.0",
        version="20.2.0",
        keys=[(215, 0), (215, 1), (215, 2), (215, 3)],
        names={"310"},
        health=["OK"] * 4,
        bus=["0000:DA:00.0", "0000:DC:00.0", "0000:DD:00.0", "0000:DB:00.0"],
        hbm=[(None, None)] * 4,
        mem=[(2703, 8192)] * 4,
        device_ids=[0, 1, 2, 3],
        processes=[],
    ),
    "atlas-800-3000_310_1.0.11_info.txt": dict(
        tool_version="21.0.4",
        version="21.0.4.B030",
        keys=[(6, 0), (6, 1), (6, 2), (6, 3)],
        names={"310"},
        health=["OK"] * 4,
        bus=["0000:89:00.0", "0000:8A:00.0", "0000:8B:00.0", "0000:8C:00.0"],
        hbm=[(None, None)] * 4,
        mem=[(2703, 8192), (2867, 8192), (2867, 8192), (2867, 8192)],
        device_ids=[3, 4, 5, 6],
        processes=[],
    ),
    "atlas-800-9010_910A_24.1.RC2_info.txt": dict(
        tool_version="24.1.RC2",
        version="24.1.RC2",
        keys=[(n, 0) for n in range(8)],
        names={"xxx"},  # redacted in the source
        health=["OK", "OK", "OK", "Warning", "OK", "OK", "OK", "Warning"],
        bus=[
            "0000:C1:00.0", "0000:81:00.0", "0000:41:00.0", "0000:01:00.0",
            "0000:C2:00.0", "0000:82:00.0", "0000:42:00.0", "0000:02:00.0",
        ],
        hbm=[(0, 32768)] * 8,
        mem=[
            (4252, 15137), (4666, 15137), (4317, 15137), (3616, 15039),
            (3708, 15137), (4346, 15137), (4261, 15137), (4521, 15039),
        ],
        device_ids=[None] * 8,
        processes=32,
    ),
    "atlas-800-9010_910A_6.0.RC1_info.txt": dict(
        tool_version="22.0.3.1",
        version="22.0.3.1",
        keys=[(n, 0) for n in range(8)],
        names={"910A"},
        health=["OK"] * 8,
        bus=[
            "0000:61:00.0", "0000:DB:00.0", "0000:B2:00.0", "0000:3E:00.0",
            "0000:60:00.0", "0000:DA:00.0", "0000:B1:00.0", "0000:3D:00.0",
        ],
        hbm=[(0, 32768)] * 8,
        mem=[(1867, 15077), (1867, 15077), (1868, 15077), (1866, 15077), (1867, 15077), (1865, 15077), (1865, 15077), (1866, 15077)],
        device_ids=[None] * 8,
        processes=[],
    ),
}


@pytest.mark.parametrize("name", sorted(INFO_EXPECTED))
def test_parse_info(name: str) -> None:
    exp = INFO_EXPECTED[name]
    info = parse_info(read(name))
    assert info.tool_version == exp["tool_version"]
    assert info.version == exp["version"]
    assert [(c.npu_id, c.chip_id) for c in info.chips] == exp["keys"]
    assert {c.name for c in info.chips} == exp["names"]
    assert [c.health for c in info.chips] == exp["health"]
    assert [c.bus_id for c in info.chips] == exp["bus"]
    assert [(c.hbm_used_mb, c.hbm_total_mb) for c in info.chips] == exp["hbm"]
    assert [(c.memory_used_mb, c.memory_total_mb) for c in info.chips] == exp["mem"]
    assert [c.device_id for c in info.chips] == exp["device_ids"]
    procs = [(p.npu_id, p.chip_id, p.pid, p.name, p.memory_mb) for p in info.processes]
    if isinstance(exp["processes"], int):
        assert len(procs) == exp["processes"]
    else:
        assert procs == exp["processes"]


def test_parse_info_values_of_the_third_column() -> None:
    info = parse_info(read("910B1-with-processes_info.txt"))
    assert [(c.power_w, c.temp_c, c.aicore_pct) for c in info.chips] == [(271.1, 41.0, 55.0), (275.0, 42.0, 66.0)]
    info = parse_info(read("atlas-800-3000_310_1.0.11_info.txt"))  # Hugepages "0       / 970"
    assert [c.temp_c for c in info.chips] == [73.0, 74.0, 70.0, 65.0]


def test_parse_info_processes_of_the_910a_server() -> None:
    procs = parse_info(read("atlas-800-9010_910A_24.1.RC2_info.txt")).processes
    assert {p.npu_id for p in procs} == set(range(8))
    assert all(sum(1 for p in procs if p.npu_id == n) == 4 for n in range(8))
    assert {(p.name, p.memory_mb, p.chip_id) for p in procs} == {("hlt_host_devmm_", 686, 0)}
    assert (procs[0].npu_id, procs[0].pid) == (0, 37656)
    assert (procs[-1].npu_id, procs[-1].pid) == (7, 37663)


def test_parse_info_multi_chip_card_and_odd_spacing() -> None:
    # An NPU row followed by two chip rows (multi-chip cards), pairs spaced every which way.
    text = "\n".join(
        [
            "+----------------------------------------------------------------+",
            "| npu-smi 24.1.0          Version: 24.1.0                        |",
            "+-------------------+-----------------+--------------------------+",
            "| NPU     Name      | Health          | Power(W)     Temp(C)     Hugepages-Usage(page) |",
            "| Chip    Device    | Bus-Id          | AICore(%)    Memory-Usage(MB)   |",
            "+===================+=================+==========================+",
            "| 1       310P3     | OK              | NA           54     0/0  |",
            "| 0       0         | 0000:81:00.0    | 0            1727 /21527  |",
            "| 1       1         | 0000:81:00.0    | 3            1555/ 21527  |",
            "+===================+=================+==========================+",
        ]
    )
    info = parse_info(text)
    assert [(c.npu_id, c.chip_id, c.device_id) for c in info.chips] == [(1, 0, 0), (1, 1, 1)]
    assert [(c.memory_used_mb, c.memory_total_mb) for c in info.chips] == [(1727, 21527), (1555, 21527)]
    assert info.chips[0].power_w is None and info.chips[0].temp_c == 54.0
    assert info.chips[1].aicore_pct == 3.0


def test_parse_info_of_garbage_finds_nothing() -> None:
    assert parse_info("dcmi module initialize failed. ret is -8005\n") == NpuInfo(None, None, (), ())


# --------------------------------------------------------------------------- npu-smi info -m

MAPPING_EXPECTED = {
    "310P_info-m.txt": dict(
        rows=12,
        accel={(1, 0): 0, (1, 1): 1, (2, 0): 2, (2, 1): 3, (4, 0): 4, (4, 1): 5, (5, 0): 6, (5, 1): 7},
        mcu=[(1, 2), (2, 2), (4, 2), (5, 2)],
        names={"Ascend xxx"},
    ),
    "910B_info-m.txt": dict(
        rows=16, accel={(n, 0): n for n in range(8)}, mcu=[(n, 1) for n in range(8)], names={"Ascend xxx"}
    ),
    "atlas-800-3000_310_1.0.0_info-m.txt": dict(
        rows=4, accel={(215, c): c for c in range(4)}, mcu=[], names={"MiniD"}
    ),
    "atlas-800-3000_310_1.0.11_info-m.txt": dict(
        rows=5, accel={(6, c): c for c in range(4)}, mcu=[(6, 4)], names={"MiniD"}
    ),
    "atlas-800-9010_910A_24.1.RC2_info-m.txt": dict(
        rows=8, accel={(n, 0): n for n in range(8)}, mcu=[], names={"Ascend 910A"}
    ),
    "atlas-800-9010_910A_6.0.RC1_info-m.txt": dict(
        rows=8, accel={(n, 0): n for n in range(8)}, mcu=[], names={"Ascend 910A"}
    ),
}


@pytest.mark.parametrize("name", sorted(MAPPING_EXPECTED))
def test_parse_mapping(name: str) -> None:
    exp = MAPPING_EXPECTED[name]
    rows = parse_mapping(read(name))
    assert len(rows) == exp["rows"]
    assert {(r.npu_id, r.chip_id): r.logic_id for r in rows if r.is_accelerator} == exp["accel"]
    mcu = [r for r in rows if not r.is_accelerator]
    assert [(r.npu_id, r.chip_id) for r in mcu] == exp["mcu"]
    assert all(r.chip_name == "Mcu" for r in mcu)
    assert {r.chip_name for r in rows if r.is_accelerator} == exp["names"]


# --------------------------------------------------------------------------- npu-smi info -t ...


def test_usages_910b_reports_hbm() -> None:
    assert parse_usages(read("910B_info-t-usages.txt")) == {
        0: {"hbm_capacity_mb": 32768, "hbm_usage_pct": 0, "ddr_capacity_mb": 15171, "ddr_usage_pct": 3, "capacity_mb": 32768}
    }


def test_usages_310p_has_only_ddr_per_chip() -> None:
    # Chip ID comes *after* each chip's block here.
    u = parse_usages(read("310P_info-t-usages.txt"))
    assert sorted(u) == [0, 1]
    assert (u[0]["capacity_mb"], u[0]["hbm_capacity_mb"], u[0]["ddr_usage_pct"]) == (44280, None, 3)
    assert (u[1]["capacity_mb"], u[1]["hbm_capacity_mb"]) == (43693, None)


def test_common_chip_id_first_and_mcu_dropped() -> None:
    header, chips = parse_per_chip(read("910B_info-t-common.txt"))
    assert header == {"NPU ID": "0", "Chip Count": "1"}
    assert list(chips) == [0]
    assert chips[0]["Aicore Count"] == "32" and chips[0]["Temperature(C)"] == "46"
    header, chips = parse_per_chip(read("310P_info-t-common.txt"))
    assert header == {"NPU ID": "1", "Chip Count": "2"}
    assert {k: v["Temperature(C)"] for k, v in chips.items()} == {0: "60", 1: "59"}


def test_key_values_without_blank_lines_split_on_repeated_keys() -> None:
    text = "Chip ID : 0\nTemperature(C) : 40\nChip ID : 1\nTemperature(C) : 41\n"
    assert parse_key_values(text) == [
        {"Chip ID": "0", "Temperature(C)": "40"},
        {"Chip ID": "1", "Temperature(C)": "41"},
    ]


def test_board_910b_uuid_from_vdie_id() -> None:
    b = parse_board(read("910B_info-t-board.txt"))
    assert b.uuid == "901421D4-02103514-1711E613-6DA7040A-00102001"
    assert (b.npu_id, b.chip_id, b.bus_id, b.firmware) == (0, 0, "0000:81:00.0", "7.1.0.4.218")


def test_board_310p_uuid_from_die_id() -> None:
    b = parse_board(read("310P_info-t-board.txt"))
    assert b.uuid == "409921D4-2140A100-E54BDDD4-07CC040A-9B00301F"
    assert (b.npu_id, b.chip_id, b.bus_id, b.chip_name) == (1, 0, "0000:81:00.0", "xxx")


def test_die_uuid_normalises_spacing() -> None:
    assert die_uuid("  AA   BB CC ") == "AA-BB-CC"


def test_every_fixture_has_expectations() -> None:
    covered = set(INFO_EXPECTED) | set(MAPPING_EXPECTED) | {
        "910B_info-t-usages.txt", "310P_info-t-usages.txt", "910B_info-t-common.txt",
        "310P_info-t-common.txt", "910B_info-t-board.txt", "310P_info-t-board.txt", "README.md",
        "910B_info-t-power.txt", "310P_info-t-power.txt",  # tests/test_telemetry.py
    }
    assert {p.name for p in FIXTURES.iterdir()} == covered


# --------------------------------------------------------------------------- the probe


def fake_npu_smi(
    tmp_path: Path,
    info: str,
    mapping: str | None = None,
    board: str | None = None,
    usages: str | None = None,
    info_exit: int = 0,
) -> tuple[dict[str, str], Path]:
    """A stand-in ``npu-smi`` on PATH printing fixture files; logs every argv it gets."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    log = tmp_path / "calls.log"

    def out(text: str | None, what: str) -> str:
        if text is None:
            return f'echo "Error: {what} not supported" >&2; exit 1'
        f = tmp_path / f"{what}.txt"
        f.write_text(text)
        return f'cat "{f}"'

    script = f"""#!/bin/sh
echo "$*" >> "{log}"
case "$*" in
  "info") {out(info, "info")}; exit {info_exit} ;;
  "info -m") {out(mapping, "mapping")} ;;
  "info -t board -i "*) {out(board, "board")} ;;
  "info -t usages -i "*) {out(usages, "usages")} ;;
  *) echo "unknown command $*" >&2; exit 2 ;;
esac
"""
    exe = bindir / "npu-smi"
    exe.write_text(script)
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    env = {"PATH": f"{bindir}{os.pathsep}/usr/bin:/bin"}
    return env, log


def test_probe_absent_tool_is_not_an_error(tmp_path: Path) -> None:
    assert npusmi.perflab_probe_hardware(env={"PATH": str(tmp_path)}) is None


def test_probe_910a_server_with_mapping_and_boards(tmp_path: Path) -> None:
    env, log = fake_npu_smi(
        tmp_path,
        read("atlas-800-9010_910A_24.1.RC2_info.txt"),
        read("atlas-800-9010_910A_24.1.RC2_info-m.txt"),
        board=read("910B_info-t-board.txt"),
    )
    accs = npusmi.perflab_probe_hardware(env=env)
    assert accs is not None and len(accs) == 8
    assert [a.index for a in accs] == list(range(8))
    a = accs[3]
    assert (a.vendor, a.kind, a.chip, a.name) == ("huawei", "ascend", "910A", "Ascend 910A")
    assert (a.memory_total_mib, a.memory_used_mib) == (32768, 0)  # HBM, not the DDR column
    assert (a.npu_id, a.chip_id, a.bus_id) == (3, 0, "0000:01:00.0")
    assert a.uuid == "901421D4-02103514-1711E613-6DA7040A-00102001"
    assert (a.driver_version, a.source, a.compute_capability) == ("24.1.RC2", "npu-smi", None)
    calls = log.read_text().splitlines()
    assert calls[:2] == ["info", "info -m"]
    assert sorted(c for c in calls if "board" in c) == sorted(f"info -t board -i {n} -c 0" for n in range(8))
    assert not any("usages" in c for c in calls)  # the table had the memory


def test_probe_310_cards_use_ddr_and_mapping_logic_ids(tmp_path: Path) -> None:
    env, _ = fake_npu_smi(
        tmp_path, read("atlas-800-3000_310_1.0.11_info.txt"), read("atlas-800-3000_310_1.0.11_info-m.txt")
    )
    accs = npusmi.perflab_probe_hardware(env=env)
    assert accs is not None
    # logic ids come from -m (0..3), not from the table's Device column (3..6); the Mcu is dropped
    assert [(a.index, a.npu_id, a.chip_id) for a in accs] == [(0, 6, 0), (1, 6, 1), (2, 6, 2), (3, 6, 3)]
    assert {a.chip for a in accs} == {"310"}  # -m says "MiniD"; the table's name wins
    assert [(a.memory_used_mib, a.memory_total_mib) for a in accs] == [(2703, 8192), (2867, 8192), (2867, 8192), (2867, 8192)]
    assert all(a.uuid is None for a in accs)  # board query failed: detail, not an error


def test_probe_without_mapping_numbers_chips_in_table_order(tmp_path: Path) -> None:
    env, _ = fake_npu_smi(tmp_path, read("910B3_info.txt"), mapping=None, board=read("910B_info-t-board.txt"))
    accs = npusmi.perflab_probe_hardware(env=env)
    assert accs is not None and len(accs) == 1
    a = accs[0]
    assert (a.index, a.npu_id, a.chip, a.name) == (0, 4, "910B3", "Ascend 910B3")
    assert (a.memory_used_mib, a.memory_total_mib) == (3161, 65536)
    assert a.bus_id == "0000:01:00.0"


def test_probe_chips_only_in_mapping_get_memory_from_usages(tmp_path: Path) -> None:
    empty_table = "\n".join(read("910B3_info.txt").splitlines()[:6])  # headers, no devices
    env, log = fake_npu_smi(
        tmp_path, empty_table, read("310P_info-m.txt"), board=read("310P_info-t-board.txt"), usages=read("310P_info-t-usages.txt")
    )
    accs = npusmi.perflab_probe_hardware(env=env)
    assert accs is not None
    assert [a.index for a in accs] == list(range(8))
    assert [(a.npu_id, a.chip_id) for a in accs][:2] == [(1, 0), (1, 1)]
    assert [a.memory_total_mib for a in accs] == [44280, 43693] * 4
    assert accs[0].memory_used_mib == 44280 * 3 // 100
    assert {a.chip for a in accs} == {"xxx"}
    assert accs[0].bus_id == "0000:81:00.0"  # from the board when the table has none
    assert sorted(c for c in log.read_text().splitlines() if "usages" in c) == [f"info -t usages -i {n}" for n in (1, 2, 4, 5)]


def test_probe_failing_tool_raises_a_one_line_error(tmp_path: Path) -> None:
    env, _ = fake_npu_smi(tmp_path, "dcmi module initialize failed. ret is -8005", info_exit=3)
    with pytest.raises(npusmi.NpuSmiError, match=r"exited with code 3: dcmi module initialize failed"):
        npusmi.perflab_probe_hardware(env=env)


def test_probe_through_the_plugin_manager_reports_errors_and_sim_source(tmp_path: Path) -> None:
    from perflab.hardware import probe

    pm = PluginManager(entrypoints=False, builtins=False)
    pm.add_plugin(npusmi, name="npusmi", builtin=True)
    two_cards = "\n".join(read("910B_info-m.txt").splitlines()[:5])  # header, NPU 0 and 1 (+ Mcus)
    env, _ = fake_npu_smi(tmp_path, read("910B1-with-processes_info.txt"), two_cards)
    snap = probe(pm, {**env, "PERFLAB_HARDWARE_SPEC": "sim:ascend-910b1-x2"})
    assert snap.simulated and snap.name == "ascend-910b1-x2"
    assert [(a.index, a.source) for a in snap.accelerators] == [(0, "sim"), (1, "sim")]
    (tmp_path / "broken").mkdir()
    broken, _ = fake_npu_smi(tmp_path / "broken", "boom", info_exit=1)
    snap = probe(pm, broken)
    assert snap.accelerators == () and len(snap.errors) == 1 and "npu-smi" in snap.errors[0]
