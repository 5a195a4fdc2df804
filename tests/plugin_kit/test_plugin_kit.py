"""Third-party plugins: the scaffold, an out-of-tree plugin, incompatible plugins, contract docs.

Plugins are installed for real (non-editable, ``pip install --target``) into a temporary
directory put on PYTHONPATH of a subprocess, so entry-point discovery is exercised exactly as
after ``pip install``, without touching the test environment.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from perflab import EnginePlugin
from perflab.contract import hookspecs
from perflab.plugins import PluginManager, check_compatibility, module_plugin

REPO = Path(__file__).resolve().parents[2]
PERFLAB = [sys.executable, "-m", "perflab"]


def pip_install_target(src: Path, target: Path) -> None:
    # --no-build-isolation: build with the environment's setuptools (no network needed)
    out = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--disable-pip-version-check", "--target", str(target), str(src)],
        capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert not (target / "__editable__").exists()


def env_with(target: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(target), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.pop("PERFLAB_LOAD_PLUGINS", None)
    env.pop("PERFLAB_DISABLE_PLUGINS", None)
    return env


def engines_json(env: dict[str, str], *extra: str) -> tuple[int, object]:
    out = subprocess.run([*PERFLAB, *extra, "engines", "list", "--json"], capture_output=True, text=True, env=env, timeout=60)
    return out.returncode, json.loads(out.stdout) if out.stdout.strip() else None


def rows(listing: object) -> list[dict]:
    """engines list --json rows, whichever top-level shape it has."""
    if isinstance(listing, dict):
        for key in ("engines", "plugins", "rows"):
            if isinstance(listing.get(key), list):
                return [r for r in listing[key] if isinstance(r, dict)] + (
                    [r for r in listing.get("plugins", []) if isinstance(r, dict)] if key == "engines" else []
                )
    return [r for r in listing if isinstance(r, dict)] if isinstance(listing, list) else []


def run_pytest(path: Path, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(path)],
                          capture_output=True, text=True, env=env, cwd=cwd, timeout=300)


def test_plugin_new_installs_lists_and_passes_its_own_tests(tmp_path: Path) -> None:
    out = subprocess.run([*PERFLAB, "plugin", "new", "demo-engine", "--dir", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    pkg = tmp_path / "perflab-plugin-demo-engine"
    assert (pkg / "pyproject.toml").is_file() and (pkg / "perflab_demo_engine" / "__init__.py").is_file()
    target = tmp_path / "site"
    pip_install_target(pkg, target)
    env = env_with(target)
    code, listing = engines_json(env)
    assert code == 0
    demo = [r for r in rows(listing) if r.get("engine") == "demo-engine"]
    assert demo, listing
    assert demo[0].get("status", "ok") == "ok"
    assert "perflab-plugin-demo-engine" in json.dumps(demo[0])
    result = run_pytest(pkg / "tests", env, cwd=pkg)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert " passed" in result.stdout and "failed" not in result.stdout


def test_plugin_new_refuses_bad_names_and_existing_dirs(tmp_path: Path) -> None:
    bad = subprocess.run([*PERFLAB, "plugin", "new", "Bad Name", "--dir", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    ok = subprocess.run([*PERFLAB, "plugin", "new", "x1", "--dir", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0
    again = subprocess.run([*PERFLAB, "plugin", "new", "x1", "--dir", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert again.returncode == 2 and "already exists" in again.stderr


def test_plugin_new_refuses_a_name_an_engine_has(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    import perflab.plugins
    from perflab import EngineInfo
    from perflab.cli import main

    class Mine(EnginePlugin):
        info = EngineInfo(name="mine", display_name="Mine", accelerators=("cuda",), executable="mine-serve")

    pm = PluginManager(entrypoints=False, builtins=False)
    pm.add_plugin(Mine(), name="mine", distribution="perflab-plugin-mine", version="1.0")
    monkeypatch.setattr(perflab.plugins, "load", lambda strict=None, **kw: pm)

    def new(name: str) -> tuple[int, str]:
        try:
            main(["plugin", "new", name, "--dir", str(tmp_path)])
            code = 0
        except SystemExit as exc:
            code = int(exc.code or 0)
        return code, capsys.readouterr().err

    for name, who in (("vllm", "perflab's own engine"), ("tensorrt-llm", "perflab's own engine 'trtllm'"),
                      ("mine", "the engine of perflab-plugin-mine")):
        code, err = new(name)
        assert code == 2 and err.splitlines() == [f"perflab: error: plugin name {name!r} is taken: it is {who}; "
                                                  f"choose another (e.g. {name}-custom)"]
    assert list(tmp_path.iterdir()) == []  # nothing written
    assert new("mine-custom")[0] == 0 and (tmp_path / "perflab-plugin-mine-custom").is_dir()


def test_out_of_tree_llamacpp_plugin_passes_the_conformance_suite(tmp_path: Path) -> None:
    src = REPO / "tests" / "external_plugins" / "llamacpp"
    target = tmp_path / "site"
    pip_install_target(src, target)
    env = env_with(target)
    code, listing = engines_json(env)
    assert code == 0
    assert any(r.get("engine") == "llama-cpp" for r in rows(listing)), listing
    result = run_pytest(src / "tests" / "conformance_llamacpp.py", env, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "failed" not in result.stdout


INCOMPATIBLE = textwrap.dedent(
    '''
    from perflab import hookimpl, EngineInfo

    @hookimpl
    def perflab_register_engines(register):
        register(EngineInfo(name="futuristic", display_name="F", accelerators=("cuda",)))

    @hookimpl
    def perflab_probe_hardware(env, quantum_flux):
        return None

    @hookimpl
    def perflab_teleport_weights(engine):
        return None
    '''
)


def _fake_dist(target: Path, dist: str, module: str, ep_name: str, code: str) -> None:
    (target / f"{module}.py").write_text(code)
    info = target / f"{dist.replace('-', '_')}-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text(f"[perflab]\n{ep_name} = {module}\n")


def test_incompatible_plugin_is_listed_and_others_keep_working(tmp_path: Path) -> None:
    _fake_dist(tmp_path, "perflab-plugin-futuristic", "perflab_futuristic", "futuristic", INCOMPATIBLE)
    env = env_with(tmp_path)
    code, listing = engines_json(env)
    assert code == 0
    text = json.dumps(listing)
    assert "incompatible" in text
    assert "quantum_flux" in text or "perflab_teleport_weights" in text
    assert not any(r.get("engine") == "futuristic" and r.get("status") == "ok" for r in rows(listing))
    code, _ = engines_json(env, "--strict")
    assert code != 0


def test_check_compatibility_names_the_problem() -> None:
    from perflab import hookimpl

    @hookimpl
    def perflab_teleport_weights(engine):  # noqa: ANN001, ANN202
        return None

    @hookimpl
    def perflab_probe_hardware(env, quantum_flux):  # noqa: ANN001, ANN202
        return None

    assert "perflab_teleport_weights" in check_compatibility(module_plugin("a", perflab_teleport_weights=perflab_teleport_weights))
    assert "quantum_flux" in check_compatibility(module_plugin("b", perflab_probe_hardware=perflab_probe_hardware))
    old = module_plugin("c", PERFLAB_HOOKSPEC_VERSIONS=(0,))
    assert "version" in check_compatibility(old)
    pm = PluginManager(entrypoints=False, builtins=False)
    rec = pm.add_plugin(module_plugin("b", perflab_probe_hardware=perflab_probe_hardware))
    assert rec.status == "incompatible" and "quantum_flux" in rec.error


def test_deprecated_hooks_warn_through_pluggy(monkeypatch: pytest.MonkeyPatch) -> None:
    """A hook marked warn_on_impl (pluggy's deprecation mechanism) is recorded on the plugin."""
    import pluggy

    from perflab import hookimpl

    @pluggy.HookspecMarker("perflab")(warn_on_impl=DeprecationWarning("perflab_old_hook is deprecated: use perflab_new_hook"))
    def perflab_old_hook(engine):  # noqa: ANN001, ANN202
        """Old."""

    # the core reads its specs from perflab.contract.hookspecs: add a deprecated one there for this test
    monkeypatch.setattr(hookspecs, "perflab_old_hook", perflab_old_hook, raising=False)

    @hookimpl
    def impl(engine):  # noqa: ANN001, ANN202
        return None

    pm = PluginManager(entrypoints=False, builtins=False)
    rec = pm.add_plugin(module_plugin("olduser", perflab_old_hook=impl))
    assert rec.status == "ok"
    assert any("deprecated" in w for w in rec.warnings)


# ---------------------------------------------------------------- contract documentation

HOOKS = sorted(n for n in vars(hookspecs) if n.startswith("perflab_") and callable(getattr(hookspecs, n)))


@pytest.mark.parametrize("hook", HOOKS)
def test_every_hook_is_documented_in_the_plugin_guide(hook: str) -> None:
    doc = (REPO / "docs" / "writing-plugins.md").read_text()
    assert f"### `{hook}`" in doc or f"### {hook}" in doc, f"docs/writing-plugins.md has no section for {hook}"


@pytest.mark.parametrize("hook", HOOKS)
def test_every_hook_has_a_docstring_with_an_example(hook: str) -> None:
    doc = getattr(hookspecs, hook).__doc__ or ""
    assert ":returns:" in doc and "Example" in doc, f"{hook} lacks a documented return or example"


@pytest.mark.parametrize("hook", HOOKS)
def test_every_hook_is_exercised_by_a_test(hook: str) -> None:
    here = Path(__file__).resolve()
    found = [p for p in (REPO / "tests").rglob("*.py") if p != here and hook in p.read_text(errors="ignore")]
    found += [p for p in (REPO / "core" / "perflab" / "testing").rglob("*.py") if hook in p.read_text()]
    assert found, f"no test mentions {hook}"


def _call(name: str, fn: Any) -> str:
    """``name(a, b)``: how the guide spells a call, with the required parameters only (those
    with a default are optional to know about)."""
    import inspect

    params = [p.name for p in inspect.signature(fn).parameters.values()
              if p.name != "self" and p.default is inspect.Parameter.empty]
    return f"{name}({', '.join(params)})"


@pytest.mark.parametrize("hook", HOOKS)
def test_every_hook_signature_is_in_the_plugin_guide(hook: str) -> None:
    """Datasette-style: the guide spells each hook's full parameter list, so a signature change
    fails here until the guide follows."""
    doc = (REPO / "docs" / "writing-plugins.md").read_text()
    call = _call(hook, getattr(hookspecs, hook))
    assert call in doc, f"docs/writing-plugins.md does not spell {call}"


ENGINE_METHODS = sorted(
    n for n, v in vars(EnginePlugin).items()
    if callable(v) and not n.startswith(("_", "perflab_")) and n != "implemented_hooks"
)


@pytest.mark.parametrize("method", ENGINE_METHODS)
def test_every_engine_method_is_in_the_plugin_guide(method: str) -> None:
    """Every method a plugin overrides or calls on the base class, spelled as it is declared."""
    doc = (REPO / "docs" / "writing-plugins.md").read_text()
    call = _call(method, getattr(EnginePlugin, method))
    assert call in doc, f"docs/writing-plugins.md does not spell {call}"


def test_the_guide_lists_every_serve_config_field_with_its_kind() -> None:
    """The guide's ServeConfig table is the declaration's (perflab.contract.types.serve_options())."""
    import re

    from perflab.contract.types import serve_options

    doc = (REPO / "docs" / "writing-plugins.md").read_text()
    section = doc.split("### The `ServeConfig` fields", 1)[1].split("\n### ", 1)[0]
    rows = re.findall(r"^\| `(\w+)` \| (\w+) \|$", section, re.M)
    assert rows == [(o.name, o.kind) for o in serve_options()]


def test_a_stand_in_that_rejects_a_flag_is_named_as_the_cause(tmp_path: Path) -> None:
    """The full-cycle failure says first that the stand-in lacks a flag the plugin passes (the
    gap met when a TGI plugin was written from the scaffold), and is silent otherwise."""
    from types import SimpleNamespace

    from perflab.testing.conformance import stand_in_hint

    log = tmp_path / "engine.log"
    log.write_text("usage: text-generation-launcher [-h]\n"
                   "text-generation-launcher: error: unrecognized arguments: --max-batch-prefill-tokens 4096\n")
    hint = stand_in_hint(SimpleNamespace(log=log))
    assert "unrecognized arguments: --max-batch-prefill-tokens 4096" in hint
    assert "stand-in's argument parser" in hint
    log.write_text("srv listening\n")
    assert stand_in_hint(SimpleNamespace(log=log)) == ""
    assert stand_in_hint(SimpleNamespace(log=None)) == ""
