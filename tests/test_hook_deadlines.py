"""Every hook call has a deadline (perflab.contract.hookspecs.HOOK_DEADLINES_S): a third-party plugin whose
hook never returns is named as that plugin's fault in one line, and perflab goes on (or, for a
teardown, records a leftover after its own process-tree teardown ran) with no process left."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_supervisor import Fake, marked_alive

from perflab import EngineInfo, EnginePlugin, hookimpl
from perflab.contract import hookspecs
from perflab.contract.errors import HookDeadlineExceeded, UsageError
from perflab.plugins import PluginManager, _spec_params, module_plugin

DOCS = Path(__file__).resolve().parents[1] / "docs" / "writing-plugins.md"
DEADLINE = 2.0  # short for the test, long enough for the fake engine's own (instant) hooks on a loaded host


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def release() -> Iterator[threading.Event]:
    """Set at the end of the test: an abandoned hook call ends instead of outliving the test."""
    ev = threading.Event()
    yield ev
    ev.set()


def slowpoke(release: threading.Event, **hooks: bool) -> Any:
    """A third-party plugin whose chosen hooks block until ``release`` (30 s at most)."""

    def stuck() -> None:
        release.wait(30)

    impls: dict[str, Any] = {}
    if hooks.get("version"):
        class Slow(EnginePlugin):
            info = EngineInfo(name="slow", display_name="Slow", accelerators=("cuda",), executable="slow")

            def version(self, env: Any) -> str | None:
                stuck()
                return None

        @hookimpl
        def perflab_register_engines(register: Any) -> None:
            register(Slow())
        impls["perflab_register_engines"] = perflab_register_engines
    if hooks.get("probe"):
        @hookimpl
        def perflab_probe_hardware() -> None:
            stuck()
        impls["perflab_probe_hardware"] = perflab_probe_hardware
    if hooks.get("register"):
        @hookimpl
        def perflab_register_engines(register: Any) -> None:
            stuck()
            register(EngineInfo(name="late", display_name="Late", accelerators=("cuda",), executable="late"))
        impls["perflab_register_engines"] = perflab_register_engines
    return module_plugin("perflab_slowpoke", **impls)


class BlockingCalls(list[dict[str, Any]]):
    """The fake engine's teardown record, which blocks in ``append`` until ``release``: a stuck teardown."""

    def __init__(self, release: threading.Event) -> None:
        super().__init__()
        self.release = release

    def append(self, item: dict[str, Any]) -> None:
        super().append(item)
        self.release.wait(30)


@pytest.mark.anyio
async def test_teardown_hook_past_its_deadline_is_named_and_the_launch_still_ends_clean(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, release: threading.Event) -> None:
    monkeypatch.setenv(hookspecs.DEADLINE_ENV, str(DEADLINE))
    fake = Fake(tmp_path, teardown_calls=BlockingCalls(release))
    async with fake.EngineInstance() as inst:
        assert inst.outcome.state == "ready"
    # the method blocks 30 s; its deadline is 2 s: the teardown ended long before
    assert inst.outcome.teardown_s is not None and inst.outcome.teardown_s < DEADLINE + 10, inst.outcome.teardown_s
    stuck = [x for x in inst.outcome.leftovers if "plugin fake" in x]
    assert len(stuck) == 1 and "teardown" in stuck[0] and f"{DEADLINE:g} s" in stuck[0], inst.outcome.leftovers
    assert "\n" not in stuck[0]
    assert marked_alive(inst) == []  # perflab's own process-tree teardown ran before the engine's


def test_a_stuck_firstresult_hook_raises_naming_plugin_hook_and_deadline(release: threading.Event) -> None:
    pm = PluginManager(entrypoints=False, builtins=False, hook_deadline_s=0.3)
    assert pm.add_plugin(slowpoke(release, version=True), name="slowpoke").status == "ok"
    t0 = time.monotonic()
    with pytest.raises(HookDeadlineExceeded) as err:
        pm.engine("slow").engine.version({})
    assert time.monotonic() - t0 < 5
    assert (err.value.plugin, err.value.hook, err.value.deadline_s) == ("slowpoke", "version", 0.3)
    assert re.search(r"plugin slowpoke: version did not return within its deadline of 0.3 s", str(err.value))


def test_a_hook_keeps_its_result_and_its_exception_within_the_deadline() -> None:
    class Quick(EnginePlugin):
        info = EngineInfo(name="x", display_name="X", accelerators=("cuda",))

        def version(self, env: Any) -> str | None:
            if env.get("BOOM"):
                raise ValueError("broken on purpose")
            return "1.2.3"

    @hookimpl
    def perflab_register_engines(register: Any) -> None:
        register(Quick())

    pm = PluginManager(entrypoints=False, builtins=False, hook_deadline_s=5)
    pm.add_plugin(module_plugin("quick", perflab_register_engines=perflab_register_engines), name="quick")
    assert pm.engine("x").engine.version({}) == "1.2.3"
    with pytest.raises(ValueError, match="broken on purpose"):
        pm.engine("x").engine.version({"BOOM": "1"})


def test_every_engine_method_the_core_calls_keeps_its_deadline() -> None:
    """BoundedEngine declares each of EnginePlugin.METHODS (typed, under its deadline) with the
    base's parameters, and each has a deadline of its own: a method added to the contract
    without one would be called unbounded, or not at all."""
    import inspect

    from perflab.plugins import BoundedEngine

    for method in EnginePlugin.METHODS:
        bounded = getattr(BoundedEngine, method, None)
        assert callable(bounded), f"BoundedEngine does not declare {method}()"
        assert list(inspect.signature(bounded).parameters) == list(inspect.signature(getattr(EnginePlugin, method)).parameters)
        assert method in hookspecs.HOOK_DEADLINES_S


def test_a_stuck_hardware_probe_is_an_error_line_and_the_others_still_answer(release: threading.Event) -> None:
    from perflab.hardware import probe

    pm = PluginManager(entrypoints=False, builtins=True, hook_deadline_s=1.0)
    pm.add_plugin(slowpoke(release, probe=True), name="slowpoke")
    snap = probe(pm, {"PATH": ""})
    assert any("slowpoke" in e and "perflab_probe_hardware" in e and "1 s" in e for e in snap.errors), snap.errors
    assert snap.accelerators  # the built-in CPU probe still answered


def test_a_stuck_register_hook_is_a_load_error_and_registers_nothing_later(release: threading.Event) -> None:
    pm = PluginManager(entrypoints=False, builtins=False, hook_deadline_s=0.3)
    rec = pm.add_plugin(slowpoke(release, register=True), name="slowpoke")
    assert rec.status == "load-error" and "perflab_register_engines" in (rec.error or "")
    release.set()
    # the abandoned call now returns and tries to register
    abandoned = [t for t in threading.enumerate() if t.name == "perflab-hook:slowpoke:perflab_register_engines"]
    assert abandoned
    for t in abandoned:
        t.join(timeout=5)
        assert not t.is_alive()
    assert "late" not in pm.engines


def test_every_hook_has_a_deadline_and_the_contract_docs_state_it() -> None:
    assert set(hookspecs.HOOK_DEADLINES_S) == set(_spec_params()) | set(EnginePlugin.METHODS)
    text = DOCS.read_text()
    for hook, seconds in hookspecs.HOOK_DEADLINES_S.items():
        assert f"| `{hook}` | {seconds:g} s |" in text, f"docs/writing-plugins.md lacks the deadline row of {hook}"
    assert hookspecs.DEADLINE_ENV in text


@pytest.mark.parametrize("value", ["soon", "0", "-1", "nan"])
def test_a_bad_deadline_override_is_a_usage_error(value: str) -> None:
    with pytest.raises(UsageError, match=hookspecs.DEADLINE_ENV):
        PluginManager(entrypoints=False, builtins=False, environ={hookspecs.DEADLINE_ENV: value})


def slow_vllm(release: threading.Event, name: str, *, teardown: bool = False, build: bool = False) -> PluginManager:
    """The installed plugins with vLLM's replaced by a third-party plugin ``name`` whose vLLM
    engine blocks (until ``release``, 30 s at most) in teardown or in build_launch."""
    import os

    from perflab_vllm import plugin as vllm

    class SlowVLLM(type(vllm)):  # type: ignore[misc]
        def teardown(self, launch: Any, workdir: Path) -> None:
            if teardown:
                release.wait(30)
            super().teardown(launch, workdir)

        def build_launch(self, *args: Any) -> Any:
            if build:
                release.wait(30)
            return super().build_launch(*args)

    @hookimpl
    def perflab_register_engines(register: Any) -> None:
        register(SlowVLLM())

    pm = PluginManager(environ={**os.environ, "PERFLAB_DISABLE_PLUGINS": "vllm"})
    assert pm.add_plugin(module_plugin(name, perflab_register_engines=perflab_register_engines), name=name).status == "ok"
    return pm


STUDY = """
name: slow-teardown
model: Qwen/Qwen3-8B
hardware: sim:a100-80g-x8
simulation: {time_scale: 50}
engines: [vllm]
candidates:
  - {name: Seqs, set: {max_num_seqs: 64}}
profiles:
  main: {input_len: 32, output_len: 8, num_prompts: 8, max_concurrency: 4}
timeouts: {startup_s: 60, benchmark_s: 120}
early_stop: false
"""


@pytest.mark.slow
def test_a_study_with_a_stuck_teardown_hook_stops_cleanly_naming_the_plugin(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, release: threading.Event) -> None:
    """The issue's case: a third-party plugin's perflab_teardown that sleeps (here: until the test
    ends) held the study as long; now the study stops at the deadline, names the plugin, and
    no engine of it is left."""
    import os

    import anyio
    import psutil

    from perflab.lab.plan import load_plan_text
    from perflab.lab.progress import StudyProgress
    from perflab.lab.run.runner import run_study

    monkeypatch.setenv(hookspecs.DEADLINE_ENV, str(DEADLINE))
    pm = slow_vllm(release, "slowpoke", teardown=True)
    plan = load_plan_text(STUDY, path="slow-teardown.yaml")
    out = tmp_path / "study"
    t0 = time.monotonic()
    with open(os.devnull, "w") as sink:
        progress = StudyProgress(plan.name, live=False, stream=sink)
        try:
            summary = anyio.run(lambda: run_study(pm, plan, out, progress=progress))
            stop = None
        except Exception as exc:  # the study stops with its one-line error
            summary, stop = None, exc
    assert time.monotonic() - t0 < 60  # not the 30 s hook per launch, twice over
    text = str(stop) if stop is not None else (out / "report.md").read_text()
    assert "plugin slowpoke: teardown did not return within its deadline of 2 s" in text, (summary, text)
    for p in psutil.process_iter():  # no engine of this study is left
        try:
            assert str(out) not in p.environ().get("PERFLAB_INSTANCE", "")
        except (psutil.Error, OSError):
            continue


@pytest.mark.slow
def test_a_stuck_launch_hook_stops_the_study_naming_the_plugin_and_the_run_is_interrupted_not_crashed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, release: threading.Event) -> None:
    import json
    import os

    import anyio

    from perflab.contract.errors import PerflabError
    from perflab.lab.plan import load_plan_text
    from perflab.lab.progress import StudyProgress
    from perflab.lab.run.runner import run_study

    monkeypatch.setenv(hookspecs.DEADLINE_ENV, str(DEADLINE))
    pm = slow_vllm(release, "slowbuild", build=True)
    plan = load_plan_text(STUDY, path="slow-build.yaml")
    out = tmp_path / "study"
    t0 = time.monotonic()
    with open(os.devnull, "w") as sink, pytest.raises(PerflabError) as err:
        anyio.run(lambda: run_study(pm, plan, out, progress=StudyProgress(plan.name, live=False, stream=sink)))
    assert time.monotonic() - t0 < 30
    assert str(err.value).startswith("plugin slowbuild: build_launch did not return within its deadline of 2 s")
    assert "PERFLAB_DISABLE_PLUGINS=slowbuild" in str(err.value) and "\n" not in str(err.value)
    (run,) = (out / "runs").iterdir()
    assert json.loads((run / "outcome.json").read_text())["state"] == "interrupted"  # never the configuration's crash
