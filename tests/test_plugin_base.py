"""perflab.EnginePlugin: engines as objects (no engine argument, no name guard), the defaults (version, devices, refusals,
crash signatures), the describe_file hook, and the serving script's address handling for
plugins that declare it and module-style (contract v1) plugins that do not."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest

from perflab import (
    EngineInfo,
    EnginePlugin,
    FileSpec,
    HardwareSnapshot,
    LaunchSpec,
    Maps,
    Refuses,
    ServeConfig,
    hookimpl,
)
from perflab.contract.errors import UnsupportedOption, UsageError
from perflab.contract.plugin_base import address_tokens
from perflab.lab.run.executor import plugin_file_describer, serving_script
from perflab.plugins import PluginManager, module_plugin
from perflab.testing import sample_hardware

H100 = sample_hardware("cuda", 4)
WORKDIR = Path("/nonexistent/perflab-run")


class Toy(EnginePlugin):
    info = EngineInfo(name="toy", display_name="Toy", accelerators=("cuda",), executable="toy-serve",
                      distributions=("toy-engine",), default_port=9000)
    visible_devices_env = "CUDA_VISIBLE_DEVICES"
    address_flags = ("--host", "--port")
    serve_options = {"model": Maps("MODEL"), "tp": Maps("--tp"), "quantization": Refuses("toy has no kernels", "toy.md")}

    def build_launch(self, config: ServeConfig, hardware: HardwareSnapshot, workdir: Path, version: str | None) -> LaunchSpec:
        self.raise_refused(config)
        argv = ["/opt/toy/bin/toy-serve", config.model, "--host", config.host, f"--port={config.port}"]
        if config.tp:
            argv += ["--tp", str(config.tp)]
        return LaunchSpec(engine="toy", argv=tuple(argv), host=config.host, port=int(config.port or 0),
                          served_model_name=config.name, env=self.device_env(config),
                          files=(FileSpec(path=str(workdir / "toy.ini"), content="[toy]\nthreads=4\n"),))

    def describe_file(self, path: str, content: str) -> list[str] | None:
        return [line for line in content.splitlines() if "=" in line] if path.endswith(".ini") else None


@pytest.fixture
def pm() -> PluginManager:
    manager = PluginManager(entrypoints=False, builtins=False)
    rec = manager.add_plugin(Toy(), name="toy")
    assert rec.status == "ok", rec.error
    assert rec.module == Toy.__module__  # an instance is recorded by its class's module
    return manager


def test_no_hook_takes_an_engine_and_no_plugin_guards_an_engine_name() -> None:
    """Contract v2: engines are objects; the core calls the registered one, so nothing asks
    "is this mine?"."""
    import inspect
    import re

    from perflab.contract import hookspecs

    specs = {n: f for n, f in vars(hookspecs).items() if n.startswith("perflab_") and callable(f)}
    assert specs and not [n for n, f in specs.items() if "engine" in inspect.signature(f).parameters]
    assert not [m for m in EnginePlugin.METHODS if "engine" in inspect.signature(getattr(EnginePlugin, m)).parameters]
    root = Path(__file__).resolve().parents[1]
    guard = re.compile(r"(?<![.\w])engine\s*[!=]=\s*(self\.info\.name|ENGINE\b|[\"'])")
    files = [*(root / "core").rglob("*.py"), *(root / "plugins").rglob("*.py"),
             *(root / "tests" / "external_plugins").rglob("*.py")]
    guarded = [f"{f.relative_to(root)}:{i}" for f in files
               for i, line in enumerate(f.read_text().splitlines(), 1) if guard.search(line)]
    assert guarded == []
    # the methods answer directly
    config = ServeConfig(model="m", port=1)
    assert Toy().build_launch(config, H100, WORKDIR, None).engine == "toy"
    assert Toy().describe_file("a.ini", "x=1") == ["x=1"]


def test_version_defaults_to_the_metadata_of_the_executables_environment(pm: PluginManager, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    site = venv / "lib" / "python3.11" / "site-packages"
    (site / "toy_engine-2.4.1.dist-info").mkdir(parents=True)
    exe = venv / "bin" / "toy-serve"
    exe.parent.mkdir()
    exe.write_text(f"#!{venv / 'bin' / 'python3'}\nraise SystemExit('never run')\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    assert pm.engine("toy").engine.version({"PATH": str(exe.parent), "PYTHONPATH": ""}) == "2.4.1"
    # metadata alone cannot be launched: without the executable on PATH, not installed
    assert pm.engine("toy").engine.version({"PATH": str(tmp_path / "nobin"), "PYTHONPATH": str(site)}) is None


def test_refused_options_are_errors_in_preflight_and_in_the_launch(pm: PluginManager) -> None:
    config = ServeConfig(model="m", quantization="fp8")
    (reason,) = pm.engine("toy").check_support(config, H100, None)
    assert (reason.what, reason.why, reason.source, reason.severity) == ("quantization=fp8", "toy has no kernels", "toy.md", "error")
    with pytest.raises(UnsupportedOption, match="quantization=fp8"):
        pm.engine("toy").build_launch(config, H100, WORKDIR, None)
    assert pm.engine("toy").check_support(ServeConfig(model="m", tp=2), H100, None) == []


def test_devices_set_the_declared_variable_in_pci_bus_order(pm: PluginManager) -> None:
    spec = pm.engine("toy").build_launch(ServeConfig(model="m", devices=(2, 3), extra_env={"A": "1"}), H100, WORKDIR, None)
    assert dict(spec.env) == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "2,3", "A": "1"}
    assert "CUDA_DEVICE_ORDER" not in pm.engine("toy").build_launch(ServeConfig(model="m"), H100, WORKDIR, None).env
    with pytest.raises(UsageError, match="CUDA_VISIBLE_DEVICES=1 contradicts --devices 2"):
        pm.engine("toy").build_launch(ServeConfig(model="m", devices=(2,), extra_env={"CUDA_VISIBLE_DEVICES": "1"}), H100, WORKDIR, None)


def test_shared_crash_signatures_follow_the_plugins_own(pm: PluginManager) -> None:
    log = "INFO starting\nhuggingface_hub.errors.RepositoryNotFoundError: 404 Client Error\n"
    assert pm.engine("toy").classify_crash(1, log).name == "model-not-found"


def test_address_tokens_are_the_flags_with_their_values() -> None:
    argv = ["srv", "m", "--host", "::1", "--port=80", "--tp", "2", "--port"]
    assert address_tokens(argv, ("--host", "--port")) == ("--host", "::1", "--port=80")


def test_describe_file_is_an_engine_method(pm: PluginManager) -> None:
    from perflab.contract.errors import UnknownEngine

    assert pm.engine("toy").engine.describe_file("/run/toy.ini", "[toy]\nthreads=4\n") == ["threads=4"]
    assert pm.engine("toy").engine.describe_file("/run/other.json", "{}") is None
    with pytest.raises(UnknownEngine):
        pm.engine("nobody")


def test_serving_script_leaves_out_the_address_a_plugin_declares(pm: PluginManager) -> None:
    spec = pm.engine("toy").build_launch(ServeConfig(model="m", tp=2, devices=(0,)), H100, WORKDIR, None)
    assert spec.address_args == ("--host", "127.0.0.1", "--port=9000")
    replica = pm.engine("toy").build_launch(ServeConfig(model="m", tp=2, devices=(1,)), H100, WORKDIR, None)
    script = serving_script([spec, replica], plugin_file_describer(pm, "toy"), WORKDIR)
    assert script.splitlines() == [
        "# 2 replicas on disjoint devices; the benchmark spreads requests over all of them",
        "export CUDA_DEVICE_ORDER=PCI_BUS_ID",
        "export CUDA_VISIBLE_DEVICES=0",
        "toy-serve m --tp 2",
        "# toy.ini: the engine's default template with these keys set by perflab:",
        "#   threads=4",
        "# replica 2: the same command with CUDA_VISIBLE_DEVICES=1",
    ]


def test_serving_script_keeps_the_argv_of_an_engine_without_address_flags() -> None:
    # A module plugin registering an engine that declares no address_flags and no describe_file.
    class V1(EnginePlugin):
        info = EngineInfo(name="v1", display_name="V1", accelerators=("cuda",))

        def build_launch(self, config: ServeConfig, hardware: HardwareSnapshot, workdir: Path,
                         version: str | None) -> LaunchSpec:
            return LaunchSpec(engine="v1", argv=(sys.executable, "-m", "srv", "--host", config.host, "--port", str(config.port)),
                              host=config.host, port=int(config.port or 0), served_model_name=config.name,
                              files=(FileSpec(path="/run/v1.cfg", content="x"),))

    @hookimpl
    def perflab_register_engines(register):  # type: ignore[no-untyped-def]
        register(V1())

    pm = PluginManager(entrypoints=False, builtins=False)
    assert pm.add_plugin(module_plugin("perflab_v1_engine", perflab_register_engines=perflab_register_engines)).status == "ok"
    spec = pm.engine("v1").build_launch(ServeConfig(model="m", port=8123), H100, WORKDIR, None)
    assert spec.address_args == ()
    script = serving_script([spec], plugin_file_describer(pm, "v1"))
    assert script.splitlines() == [
        f"{os.path.basename(sys.executable)} -m srv --host 127.0.0.1 --port 8123",
        "# with v1.cfg written by perflab (see launch.json in the run directory)",
    ]


def test_replica_lines_show_what_differs_without_study_paths(pm: PluginManager, tmp_path: Path) -> None:
    def replica(i: int) -> LaunchSpec:
        config = ServeConfig(model="m", devices=(i,), extra_env={"CFG": str(tmp_path / f"replica-{i + 1}" / "c.json"),
                                                               "HF_TOKEN": f"hf_secret{i}", "PERFLAB_X": str(i)})
        return pm.engine("toy").build_launch(config, H100, tmp_path, None)

    lines = serving_script([replica(0), replica(1)], None, tmp_path).splitlines()
    assert lines[-1] == """# replica 2: the same command with CUDA_VISIBLE_DEVICES=1, CFG="$PWD/replica-2/c.json", HF_TOKEN='***'"""
    assert 'export CFG="$PWD/replica-1/c.json"' in lines and "export HF_TOKEN='***'" in lines
    assert not any(str(tmp_path) in line or "PERFLAB_X" in line for line in lines)


def test_a_refusal_of_some_values_is_left_to_the_launch() -> None:
    class Picky(Toy):
        serve_options = {**Toy.serve_options, "kv_cache_dtype": Refuses("only auto", always=False)}

    assert Picky().refused(ServeConfig(model="m", kv_cache_dtype="fp8", quantization="fp8")) == [
        Toy().refused(ServeConfig(model="m", quantization="fp8"))[0]
    ]


def test_engines_list_shows_only_the_hooks_a_plugin_really_answers(pm: PluginManager) -> None:
    """The base implements every hook; a no-op default (readiness, teardown) is not shown as the
    plugin's, an overridden one (describe_file) is."""
    methods = pm.engine("toy").engine.implemented()
    assert "describe_file" in methods and "build_launch" in methods
    assert "readiness" not in methods and "teardown" not in methods

    class Ready(Toy):
        def readiness(self, launch: LaunchSpec) -> None:
            return None

    assert "readiness" in Ready().implemented()


def test_engines_list_shows_the_cache_reset_only_where_one_is_declared(pm: PluginManager) -> None:
    """perflab_cache_reset is the base's no-op unless the class declares prefix_cache_reset (one
    line) or overrides cache_reset."""
    from perflab.contract.types import CacheReset

    assert "cache_reset" not in pm.engine("toy").engine.implemented()

    class Resets(Toy):
        prefix_cache_reset = CacheReset("/flush_cache", source="test")

    assert "cache_reset" in Resets().implemented()
    launch = LaunchSpec(engine="toy", argv=("toy",), host="127.0.0.1", port=1, served_model_name="m")
    assert Resets().cache_reset(launch) == CacheReset("/flush_cache", source="test")

