"""The plugin manager with real (temporary) distributions: load errors, duplicates,
PERFLAB_LOAD_PLUGINS / PERFLAB_DISABLE_PLUGINS, incompatible plugins, and the promise that
``perflab engines list`` never imports an engine."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from perflab import Accelerator, EngineInfo, EnginePlugin, hookimpl
from perflab.plugins import PluginManager, check_compatibility, module_plugin

GOOD = """
from perflab import EngineInfo, EnginePlugin, hookimpl

class Toy(EnginePlugin):
    info = EngineInfo(name={engine!r}, display_name="Toy", accelerators=("cuda",), executable="toy-serve-absent")

    def version(self, env):
        return "9.9.9"

@hookimpl
def perflab_register_engines(register):
    register(Toy())
"""

BROKEN = 'raise RuntimeError("this plugin is broken on purpose")\n'


class Dists:
    """Writes installed-looking distributions (dist-info + module) into one sys.path entry."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.modules: list[str] = []

    def add(self, dist: str, ep_name: str, module: str, source: str, version: str = "1.0") -> None:
        (self.root / f"{module}.py").write_text(textwrap.dedent(source))
        info = self.root / f"{dist.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        (info / "entry_points.txt").write_text(f"[perflab]\n{ep_name} = {module}\n")
        self.modules.append(module)

    def env(self, **extra: str) -> dict[str, str]:
        """Environment for a perflab subprocess that sees these distributions."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("PERFLAB_")}
        env["PYTHONPATH"] = os.pathsep.join([str(self.root), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        env.update(extra)
        return env


@pytest.fixture
def dists(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Dists]:
    d = Dists(tmp_path / "site")
    d.root.mkdir()
    monkeypatch.syspath_prepend(str(d.root))
    yield d
    for m in d.modules:
        sys.modules.pop(m, None)


def only(*names: str) -> dict[str, str]:
    return {"PERFLAB_LOAD_PLUGINS": ",".join(names)}


def run_perflab(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    code = "import sys; from perflab.cli import main; main(sys.argv[1:])"
    return subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=120)


# --------------------------------------------------------------------------- load errors


def test_plugin_raising_on_import_is_recorded_and_others_still_work(dists: Dists) -> None:
    dists.add("perflab-plugin-broken", "broken", "perflab_test_broken", BROKEN)
    dists.add("perflab-plugin-toy", "toy", "perflab_test_toy", GOOD.format(engine="toy"))
    pm = PluginManager(environ=only("broken", "toy"))
    broken = next(r for r in pm.records if r.name == "broken")
    assert (broken.status, broken.distribution, broken.version) == ("load-error", "perflab-plugin-broken", "1.0")
    assert broken.error == "RuntimeError: this plugin is broken on purpose"
    assert pm.engine_names() == ["toy"]
    assert pm.engine("toy").distribution == "perflab-plugin-toy"
    assert pm.engine("toy").engine.version({}) == "9.9.9"
    from perflab.contract.errors import PluginLoadError

    with pytest.raises(PluginLoadError, match="perflab-plugin-broken: RuntimeError: this plugin is broken on purpose"):
        PluginManager(environ=only("broken", "toy"), strict=True)


def test_engines_list_shows_the_error_and_exits_zero_strict_exits_one(dists: Dists) -> None:
    dists.add("perflab-plugin-broken", "broken", "perflab_test_broken", BROKEN)
    dists.add("perflab-plugin-toy", "toy", "perflab_test_toy", GOOD.format(engine="toy"))
    env = dists.env(COLUMNS="300", **only("broken", "toy"))

    table = run_perflab(["engines", "list"], env)
    assert table.returncode == 0, table.stderr
    assert "toy" in table.stdout and "9.9.9" in table.stdout
    assert "load-error: RuntimeError: this plugin is broken on purpose" in table.stdout

    data = json.loads(run_perflab(["engines", "list", "--json"], env).stdout)
    assert [e["engine"] for e in data["engines"]] == ["toy"]
    rec = next(p for p in data["plugins"] if p["name"] == "broken")
    assert (rec["status"], rec["distribution"]) == ("load-error", "perflab-plugin-broken")

    strict = run_perflab(["--strict", "engines", "list"], env)
    assert strict.returncode == 1
    assert strict.stdout == ""
    lines = strict.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("perflab: error: plugin problems (strict mode)")
    assert "perflab-plugin-broken" in lines[0]
    via_env = run_perflab(["engines", "list"], {**env, "PERFLAB_STRICT_PLUGINS": "1"})
    assert via_env.returncode == 1


# --------------------------------------------------------------------------- duplicates


def test_duplicate_engine_name_names_both_distributions(dists: Dists) -> None:
    dists.add("perflab-plugin-dup-a", "dupa", "perflab_test_dupa", GOOD.format(engine="dup"))
    dists.add("perflab-plugin-dup-b", "dupb", "perflab_test_dupb", GOOD.format(engine="dup"))
    pm = PluginManager(environ=only("dupa", "dupb"))
    assert pm.engine_names() == ["dup"]
    (err,) = pm.errors
    assert "'dup'" in err and "perflab-plugin-dup-a" in err and "perflab-plugin-dup-b" in err

    env = dists.env(COLUMNS="300", **only("dupa", "dupb"))
    data = json.loads(run_perflab(["engines", "list", "--json"], env).stdout)
    assert data["errors"] == [err]
    shown = run_perflab(["engines", "list"], env)
    assert shown.returncode == 0 and "perflab-plugin-dup-b" in shown.stdout
    strict = run_perflab(["--strict", "engines", "list"], env)
    assert strict.returncode == 1 and "registered by both" in strict.stderr


# --------------------------------------------------------------------------- selection


@pytest.fixture
def two_toys(dists: Dists) -> Dists:
    dists.add("perflab-plugin-toy-one", "toyone", "perflab_test_toy_one", GOOD.format(engine="toy1"))
    dists.add("perflab_plugin.toy_two", "toytwo", "perflab_test_toy_two", GOOD.format(engine="toy2"))
    return dists


def loaded(pm: PluginManager) -> set[str]:
    return {r.name for r in pm.records if not r.builtin and r.status == "ok"}


def test_load_plugins_unset_loads_every_entry_point(two_toys: Dists) -> None:
    pm = PluginManager(environ={})
    assert {"toyone", "toytwo"} <= loaded(pm)
    assert {"toy1", "toy2"} <= set(pm.engine_names())


def test_load_plugins_empty_loads_none(two_toys: Dists) -> None:
    pm = PluginManager(environ={"PERFLAB_LOAD_PLUGINS": ""})
    assert loaded(pm) == set() and pm.engine_names() == []
    assert {r.name for r in pm.records} == {"perflab.hardware.nvml", "perflab.hardware.npusmi", "perflab.hardware.cpu"}  # built-ins stay


def test_load_plugins_by_entry_point_or_distribution_name(two_toys: Dists) -> None:
    assert loaded(PluginManager(environ=only("toyone"))) == {"toyone"}
    # distribution names match however they are spelled (-, _, . and case are equivalent)
    assert loaded(PluginManager(environ=only("Perflab-Plugin-Toy-Two"))) == {"toytwo"}
    assert loaded(PluginManager(environ=only(" toyone ", "perflab_plugin_toy_two"))) == {"toyone", "toytwo"}


def test_disable_plugins(two_toys: Dists) -> None:
    pm = PluginManager(environ={"PERFLAB_LOAD_PLUGINS": "toyone,toytwo", "PERFLAB_DISABLE_PLUGINS": "perflab-plugin-toy-one"})
    assert loaded(pm) == {"toytwo"}
    assert pm.engine_names() == ["toy2"]
    (one,) = (r for r in pm.records if r.name == "toyone")
    assert (one.status, one.distribution, one.version, one.module, one.engines) == (
        "disabled", "perflab-plugin-toy-one", "1.0", "perflab_test_toy_one", ())
    assert pm.broken == []  # the user's choice, not a problem: strict mode accepts it
    pm = PluginManager(environ={"PERFLAB_DISABLE_PLUGINS": "toyone,toytwo"})
    assert not {"toyone", "toytwo"} & loaded(pm)
    assert {r.name for r in pm.records if r.status == "disabled"} == {"toyone", "toytwo"}


def test_engines_list_shows_disabled_plugins_without_importing_them(dists: Dists) -> None:
    # The disabled plugin raises on import: listed as disabled (not load-error) proves it was never imported.
    dists.add("perflab-plugin-broken", "broken", "perflab_test_broken", BROKEN)
    dists.add("perflab-plugin-toy", "toy", "perflab_test_toy", GOOD.format(engine="toy"))
    env = dists.env(COLUMNS="300", PERFLAB_DISABLE_PLUGINS="perflab-plugin-broken", **only("broken", "toy"))

    data = json.loads(run_perflab(["engines", "list", "--json"], env).stdout)
    assert [e["engine"] for e in data["engines"]] == ["toy"]
    rec = next(p for p in data["plugins"] if p["name"] == "broken")
    assert (rec["status"], rec["error"], rec["distribution"], rec["version"]) == ("disabled", None, "perflab-plugin-broken", "1.0")
    assert (rec["module"], rec["engines"], rec["hooks"]) == ("perflab_test_broken", [], [])

    table = run_perflab(["engines", "list"], env)
    assert table.returncode == 0, table.stderr
    row = next(line for line in table.stdout.splitlines() if "perflab-plugin-broken" in line)
    assert "disabled (PERFLAB_DISABLE_PLUGINS)" in row
    assert "load-error" not in table.stdout and "--strict" not in table.stdout  # nothing broken

    strict = run_perflab(["--strict", "engines", "list", "--json"], env)
    assert strict.returncode == 0, strict.stderr
    assert {p["name"]: p["status"] for p in json.loads(strict.stdout)["plugins"] if not p["builtin"]} == {
        "broken": "disabled", "toy": "ok"}


# --------------------------------------------------------------------------- compatibility


def _bare_pm() -> PluginManager:
    return PluginManager(entrypoints=False, builtins=False)


def test_unknown_hook_is_incompatible() -> None:
    @hookimpl
    def perflab_frobnicate(engine):  # type: ignore[no-untyped-def]
        return None

    plugin = module_plugin("perflab_test_unknown", perflab_frobnicate=perflab_frobnicate)
    pm = _bare_pm()
    rec = pm.add_plugin(plugin, distribution="perflab-plugin-unknown")
    assert rec.status == "incompatible"
    assert rec.error is not None and "unknown hook perflab_frobnicate()" in rec.error
    assert pm.pm.get_plugins() == set()  # not registered, so never called


def test_extra_argument_is_incompatible() -> None:
    @hookimpl
    def perflab_probe_hardware(env, gpu_count):  # type: ignore[no-untyped-def]
        return None

    rec = _bare_pm().add_plugin(module_plugin("perflab_test_extra", perflab_probe_hardware=perflab_probe_hardware))
    assert rec.status == "incompatible"
    assert rec.error is not None and "gpu_count" in rec.error


def test_declared_contract_versions_are_checked() -> None:
    plugin = module_plugin("perflab_test_future", PERFLAB_HOOKSPEC_VERSIONS=(99,))
    assert "version(s) (99,)" in (check_compatibility(plugin) or "")
    assert _bare_pm().add_plugin(plugin).status == "incompatible"


def test_fewer_arguments_are_fine_and_registration_works() -> None:
    class Mini(EnginePlugin):
        info = EngineInfo(name="mini", display_name="Mini", accelerators=("cuda",))

        def version(self, env: object) -> str:
            return "1"

    @hookimpl
    def perflab_register_engines(register):  # type: ignore[no-untyped-def]
        register(Mini())

    @hookimpl
    def perflab_probe_hardware():  # type: ignore[no-untyped-def]
        return [Accelerator(vendor="toy", kind="cpu", index=0, name="toy", memory_total_mib=1)]

    pm = _bare_pm()
    rec = pm.add_plugin(module_plugin("perflab_test_mini", perflab_register_engines=perflab_register_engines, perflab_probe_hardware=perflab_probe_hardware))
    assert (rec.status, rec.engines, rec.hooks) == ("ok", ("mini",), ("perflab_probe_hardware", "perflab_register_engines"))
    assert pm.engine("mini").engine.version({}) == "1"
    assert [a.name for a in pm.hook.perflab_probe_hardware(env={})[0]] == ["toy"]


def test_registering_an_engineinfo_instead_of_an_engine_is_a_load_error() -> None:
    @hookimpl
    def perflab_register_engines(register):  # type: ignore[no-untyped-def]
        register(EngineInfo(name="old", display_name="Old", accelerators=("cuda",)))

    rec = _bare_pm().add_plugin(module_plugin("perflab_test_old", perflab_register_engines=perflab_register_engines))
    assert rec.status == "load-error" and rec.error is not None and "EnginePlugin" in rec.error


def test_incompatible_plugin_is_listed_by_the_cli(dists: Dists) -> None:
    dists.add(
        "perflab-plugin-odd",
        "odd",
        "perflab_test_odd",
        """
        from perflab import hookimpl

        @hookimpl
        def perflab_launch_faster(engine):
            return None
        """,
    )
    env = dists.env(COLUMNS="300", **only("odd"))
    out = run_perflab(["engines", "list"], env)
    assert out.returncode == 0
    assert "incompatible: implements unknown hook perflab_launch_faster()" in out.stdout
    assert run_perflab(["--strict", "engines", "list"], env).returncode == 1


# --------------------------------------------------------------------------- import weight

ENGINE_MODULES = ("torch", "vllm", "sglang", "tensorrt_llm", "mindie_llm", "vllm_ascend", "torch_npu")

PROBE = """
import json, sys
from perflab.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
sys.stderr.write("\\nMODULES=" + json.dumps(sorted(sys.modules)) + "\\n")
"""


@pytest.mark.parametrize("as_json", [False, True])
def test_engines_list_imports_no_engine(tmp_path: Path, as_json: bool) -> None:
    """Fake, importable engine packages on the path: a plugin importing one would show."""
    fake = tmp_path / "fake_engines"
    for name in ENGINE_MODULES:
        (fake / name).mkdir(parents=True)
        (fake / name / "__init__.py").write_text("")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PERFLAB_")}
    env["PYTHONPATH"] = str(fake)
    args = ["engines", "list", *(["--json"] if as_json else [])]
    out = subprocess.run([sys.executable, "-c", PROBE, *args], env=env, capture_output=True, text=True, timeout=120)
    modules = set(json.loads(out.stderr.rsplit("MODULES=", 1)[1]))
    assert "perflab.cli.engines_cmd" in modules  # the command really ran
    assert not {m.split(".")[0] for m in modules} & set(ENGINE_MODULES)
    assert "pynvml" not in modules  # listing engines probes no hardware
    if as_json:
        assert not any(m == "rich" or m.startswith("rich.") for m in modules)


# --------------------------------------------------------------------------- packaging

REPO = Path(__file__).resolve().parents[1]
_BUILD_JUNK = shutil.ignore_patterns("__pycache__", "*.egg-info", "build", "dist", "*.pyc")


def _run(argv: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV") and not k.startswith("PERFLAB_")}
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def test_mindie_wheel_in_a_fresh_venv_lists_exactly_mindie(tmp_path: Path) -> None:
    """`pip wheel ./plugins/mindie` makes a real distribution; installed beside the core in a
    clean venv (no editable installs, no other plugin), `perflab engines list` shows mindie."""
    # Build from copies so the work tree gets no build/ or egg-info churn.
    shutil.copytree(REPO / "plugins" / "mindie", tmp_path / "src-mindie", ignore=_BUILD_JUNK)
    core = tmp_path / "src-core"
    shutil.copytree(REPO / "core", core / "core", ignore=_BUILD_JUNK)
    for name in ("pyproject.toml", "README.md", "LICENSE", "MANIFEST.in"):
        shutil.copy2(REPO / name, core / name)
    wheels = tmp_path / "wheels"
    for src in (tmp_path / "src-mindie", core):
        built = _run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation", "-w", str(wheels)], tmp_path)
        assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    (mindie_whl,) = wheels.glob("perflab_plugin_mindie-*.whl")
    (core_whl,) = wheels.glob("perflab-*.whl")

    venv = tmp_path / "venv"
    made = _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp_path, timeout=120)
    assert made.returncode == 0, made.stderr
    python = venv / "bin" / "python"
    # Offline: the dependencies are this environment's installed distributions, seen through a
    # .pth of links that leaves out everything of perflab's (the core, the plugins, the editable
    # hook); the wheels themselves are installed with --no-deps, and `pip check` then proves
    # that what they declare is satisfied.
    deps = tmp_path / "deps"
    deps.mkdir()
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if not entry.name.lower().startswith(("perflab", "__editable__")) and entry.suffix != ".pth":
            (deps / entry.name).symlink_to(entry)
    site = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp_path)
    assert site.returncode == 0, site.stderr
    (Path(site.stdout.strip()) / "perflab-test-deps.pth").write_text(f"{deps}\n")
    inst = _run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", "--no-index",
                 str(core_whl), str(mindie_whl)], tmp_path, timeout=300)
    assert inst.returncode == 0, inst.stdout[-2000:] + inst.stderr[-2000:]
    check = _run([sys.executable, "-m", "pip", "--python", str(python), "check"], tmp_path, timeout=300)
    assert check.returncode == 0, check.stdout[-2000:] + check.stderr[-2000:]

    where = _run([str(python), "-c", "import perflab, perflab_mindie; print(perflab.__file__); print(perflab_mindie.__file__)"], tmp_path)
    assert where.returncode == 0, where.stderr
    assert all(line.startswith(str(venv)) for line in where.stdout.split()), where.stdout  # not the work tree
    listed = _run([str(venv / "bin" / "perflab"), "engines", "list", "--json"], tmp_path, timeout=120)
    assert listed.returncode == 0, listed.stderr
    data = json.loads(listed.stdout)
    assert [e["engine"] for e in data["engines"]] == ["mindie"]
    assert {p["distribution"] for p in data["plugins"] if not p["builtin"]} == {"perflab-plugin-mindie"}
    assert all(p["status"] == "ok" for p in data["plugins"]), data["plugins"]
