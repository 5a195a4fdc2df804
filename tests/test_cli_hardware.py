"""``perflab hardware``: table, JSON, simulated label, probe errors, nothing found."""

from __future__ import annotations

import dataclasses
import json
import os
import stat
from pathlib import Path

import pytest

import perflab.plugins
from perflab import Accelerator, hookimpl
from perflab.cli.hardware_cmd import NOTHING_FOUND
from perflab.plugins import PluginManager, module_plugin

A100 = Accelerator(
    vendor="nvidia", kind="cuda", index=0, name="NVIDIA A100-SXM4-80GB", memory_total_mib=81920, memory_used_mib=3161,
    uuid="GPU-5f3c1a2b-0000-1111-2222-333344445555", compute_capability=(8, 0), driver_version="550.54.15",
    cuda_driver_version="12.4", bus_id="00000000:07:00.0", source="nvml",
)
NPU = Accelerator(
    vendor="huawei", kind="ascend", index=0, name="Ascend 910B3", memory_total_mib=65536, memory_used_mib=0,
    uuid="901421D4-02103514-1711E613-6DA7040A-00102001", chip="910B3", driver_version="23.0.1",
    bus_id="0000:01:00.0", npu_id=4, chip_id=0, source="npu-smi",
)


def invoke(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    from perflab.cli import main

    try:
        main(args)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    out = capsys.readouterr()
    return code, out.out, out.err


def use_probes(monkeypatch: pytest.MonkeyPatch, *probes: object) -> None:
    """The CLI's plugin manager holds exactly these hardware probes."""
    pm = PluginManager(entrypoints=False, builtins=False)
    for i, fn in enumerate(probes):
        pm.add_plugin(module_plugin(f"probe{i}", perflab_probe_hardware=fn), name=f"probe{i}")
    monkeypatch.setattr(perflab.plugins, "load", lambda strict=None, **kw: pm)
    monkeypatch.setenv("COLUMNS", "250")  # rich: no wrapping of long UUIDs
    monkeypatch.delenv("PERFLAB_SIM_HARDWARE", raising=False)


@hookimpl
def gpus(env):  # type: ignore[no-untyped-def]
    return [A100, dataclasses.replace(A100, index=1, uuid="GPU-second", memory_used_mib=0)]


@hookimpl
def npus(env):  # type: ignore[no-untyped-def]
    return [NPU]


@hookimpl
def nothing(env):  # type: ignore[no-untyped-def]
    return None


@hookimpl
def broken(env):  # type: ignore[no-untyped-def]
    raise RuntimeError("amd-smi returned garbage")


def test_table_shows_every_column(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    use_probes(monkeypatch, gpus, npus)
    code, out, err = invoke(["hardware"], capsys)
    assert code == 0 and err == ""
    assert "NVIDIA A100-SXM4-80GB" in out and "Ascend 910B3" in out
    assert "GPU-5f3c1a2b-0000-1111-2222-333344445555" in out and "901421D4-02103514-1711E613-6DA7040A-00102001" in out
    assert "3,161 / 81,920" in out and "0 / 65,536" in out
    assert "8.0 (SM80)" in out and "910B3" in out
    assert "550.54.15" in out and "CUDA 12.4" in out and "23.0.1" in out
    assert "bus 00000000:07:00.0" in out and "bus 0000:01:00.0" in out
    assert "read through npu-smi, nvml" in out
    assert "simulated" not in out


def test_json(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    use_probes(monkeypatch, gpus, npus)
    code, out, _ = invoke(["hardware", "--json"], capsys)
    assert code == 0
    data = json.loads(out)
    assert set(data) == {"accelerators", "simulated", "name", "host", "errors"}
    assert [(a["vendor"], a["index"]) for a in data["accelerators"]] == [("nvidia", 0), ("nvidia", 1), ("huawei", 0)]
    first = data["accelerators"][0]
    assert first["compute_capability"] == [8, 0] and first["memory_total_mib"] == 81920
    assert data["accelerators"][2]["chip"] == "910B3"
    assert data["simulated"] is False and data["errors"] == []


def test_simulated_machines_say_so(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    use_probes(monkeypatch, gpus)
    monkeypatch.setenv("PERFLAB_HARDWARE_SPEC", "sim:a100-80g-x8")  # as an activated environment says
    code, out, _ = invoke(["hardware"], capsys)
    assert code == 0 and "(simulated: a100-80g-x8)" in out
    code, out, _ = invoke(["hardware", "--json"], capsys)
    data = json.loads(out)
    assert data["simulated"] is True and data["name"] == "a100-80g-x8"


def test_probe_errors_are_warnings(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    use_probes(monkeypatch, broken, npus)
    code, out, err = invoke(["hardware"], capsys)
    assert code == 0
    assert "Ascend 910B3" in out
    assert "warning: hardware probe failed: probe0: RuntimeError: amd-smi returned garbage" in err
    code, out, _ = invoke(["hardware", "--json"], capsys)
    assert json.loads(out)["errors"] == ["probe0: RuntimeError: amd-smi returned garbage"]


def test_no_accelerator_is_a_friendly_line(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    use_probes(monkeypatch, nothing)
    code, out, err = invoke(["hardware"], capsys)
    assert (code, out.strip(), err) == (0, NOTHING_FOUND, "")
    code, out, _ = invoke(["hardware", "--json"], capsys)
    assert code == 0 and json.loads(out)["accelerators"] == []


def test_bad_hardware_spec_is_a_usage_error(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    use_probes(monkeypatch, nothing)
    code, out, err = invoke(["hardware", "--hardware", "a100"], capsys)
    assert code == 2 and out == ""
    assert err.strip().splitlines() == ["perflab: error: --hardware 'a100': expected 'auto' or 'sim:NAME' (e.g. sim:a100-80g-x8)"]


def test_builtin_probes_find_npus_through_npu_smi_on_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The real built-in plugins, with an ``npu-smi`` on PATH that prints a real output."""
    import perflab.hardware.nvml

    fixture = Path(__file__).parent / "fixtures" / "npu-smi" / "910B1-with-processes_info.txt"
    exe = tmp_path / "npu-smi"
    exe.write_text(f'#!/bin/sh\n[ "$*" = "info" ] && exec cat "{fixture}"\nexit 1\n')
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setattr(perflab.hardware.nvml, "load_nvml", lambda env: None)  # no GPU, even on a GPU host
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setenv("COLUMNS", "250")
    monkeypatch.delenv("PERFLAB_SIM_HARDWARE", raising=False)
    monkeypatch.setenv("PERFLAB_LOAD_PLUGINS", "sim")  # engine plugins are not needed here; the simulator is a plugin
    code, out, _ = invoke(["hardware", "--json"], capsys)
    assert code == 0
    accs = json.loads(out)["accelerators"]
    assert [(a["index"], a["name"], a["bus_id"], a["memory_used_mib"], a["memory_total_mib"]) for a in accs] == [
        (0, "Ascend 910B1", "0000:C1:00.0", 65099, 65536),
        (1, "Ascend 910B1", "0000:01:00.0", 65098, 65536),
    ]
    code, out, _ = invoke(["hardware"], capsys)
    assert code == 0 and out.count("Ascend 910B1") == 2


@pytest.mark.parametrize("family", ["ascend", "cuda"])
def test_simulated_catalog_machine_end_to_end(
    family: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--hardware sim:NAME`: the built-in probes read the simulator's stand-ins (an
    `npu-smi` on PATH printing the real formats, an NVML shim) like real tools."""
    from perflab_sim import catalog

    name = next(n for n in catalog.names() if catalog.get(n).kind == family and catalog.get(n).count > 1)
    machine = catalog.get(name)
    monkeypatch.setenv("PERFLAB_LOAD_PLUGINS", "sim")  # only the simulator's plugin (it owns sim:)
    monkeypatch.delenv("PERFLAB_SIM_HARDWARE", raising=False)
    code, out, err = invoke(["hardware", "--hardware", f"sim:{name}", "--json"], capsys)
    assert code == 0, err
    data = json.loads(out)
    assert (data["simulated"], data["name"], data["errors"]) == (True, name, [])
    accs = data["accelerators"]
    assert [a["index"] for a in accs] == list(range(machine.count))
    assert {a["kind"] for a in accs} == {family} and {a["source"] for a in accs} == {"sim"}
    assert len({a["uuid"] for a in accs}) == machine.count and all(a["uuid"] for a in accs)
    assert len({a["bus_id"] for a in accs}) == machine.count
    if family == "ascend":
        assert all(a["chip"] and a["name"] == f"Ascend {a['chip']}" and a["npu_id"] is not None for a in accs)
    else:
        assert all(a["compute_capability"] and a["cuda_driver_version"] for a in accs)
    code, out, _ = invoke(["hardware", "--hardware", f"sim:{name}"], capsys)
    assert code == 0 and f"(simulated: {name})" in out


CPU = Accelerator(vendor="amd", kind="cpu", index=0, name="AMD EPYC", memory_total_mib=20826, memory_used_mib=638,
                  source="procfs", cores=2, cpu_list="0-1",
                  features=("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16"))


@hookimpl
def cpu(env):  # type: ignore[no-untyped-def]
    return [CPU]


@pytest.mark.parametrize("probe", [gpus, npus, cpu])
def test_table_fits_80_columns_with_its_headers_whole(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                                      probe: object) -> None:
    use_probes(monkeypatch, probe)
    monkeypatch.setenv("COLUMNS", "80")
    code, out, _ = invoke(["hardware"], capsys)
    lines = out.splitlines()
    assert code == 0 and max(map(len, lines)) <= 80
    heads = [line.split() for line in lines if line.lstrip().startswith(("accelerator", "#"))]
    assert heads == [["accelerator", "memory", "MiB", "compute,", "chip"],
                     ["#", "uuid", "·", "bus", "id", "used", "/", "total", "or", "cores", "·", "ISA", "driver"]]
