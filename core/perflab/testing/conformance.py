"""The conformance suite for engine plugins.

A plugin author subclasses :class:`EngineConformance` in their own tests; pytest then runs
every check below against the plugin *as installed* (through its entry point), the way
perflab will load it::

    from perflab.testing import EngineConformance

    class TestLlamaCpp(EngineConformance):
        engine = "llama-cpp"
        distribution = "perflab-plugin-llamacpp"
        model = "/models/qwen3-8b-q4_k_m.gguf"
        crash_samples = {
            "model-load-failed": "llama_model_load: error loading model: ...",
        }
        # optional: a full launch / ready / teardown cycle against a stand-in executable
        stand_in = Path(__file__).parent / "fake_llama_server.py"

Every check is a plain pytest test method, so ``-k`` selects and ``--tb`` explains them.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import stat
import sys
from pathlib import Path
from typing import Any, ClassVar

import pytest

from perflab.contract import hookspecs
from perflab.contract.errors import UnsupportedOption
from perflab.contract.plugin_base import EnginePlugin, Maps, Refuses
from perflab.contract.types import (
    Accelerator,
    CrashCause,
    EngineInfo,
    HardwareSnapshot,
    LaunchSpec,
    Readiness,
    ServeConfig,
    Unsupported,
    serve_options,
)
from perflab.plugins import PluginManager, check_compatibility

#: A sample value of each ServeConfig field, for the ``serve_options`` checks: the changes made
#: to the baseline configuration (the field, plus companions it needs). ``options`` has no
#: engine-neutral sample that an engine could express (this one must be refused): a plugin that
#: Maps it gives one of its own in ``serve_option_samples``.
SERVE_OPTION_SAMPLES: dict[str, dict[str, Any]] = {
    "model": {"model": "conformance-org/other-model"},
    "served_model_name": {"served_model_name": "conformance-name"},
    "tp": {"tp": 2},
    "pp": {"pp": 2},
    "dp": {"dp": 2},
    "nodes": {"nodes": 2, "dp": 2},  # with dp: vLLM spans nodes by data parallelism
    "ep": {"ep": 2},
    "max_model_len": {"max_model_len": 4096},
    "max_batched_tokens": {"max_batched_tokens": 4096},
    "max_num_seqs": {"max_num_seqs": 64},
    "quantization": {"quantization": "fp8"},
    "kv_cache_dtype": {"kv_cache_dtype": "fp8"},
    "prefix_caching": {"prefix_caching": False},
    "chunked_prefill": {"chunked_prefill": False},
    "speculative_config": {"speculative_config": {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}},
    "mem_fraction": {"mem_fraction": 0.8},
    "reasoning_parser": {"reasoning_parser": "deepseek_r1"},
    "host": {"host": "0.0.0.0"},
    "port": {"port": 18124},
    "devices": {"devices": (1,)},
    "extra_args": {"extra_args": ("--conformance-flag",)},
    "extra_env": {"extra_env": {"PERFLAB_CONFORMANCE": "1"}},
    "options": {"options": {"perflab_conformance_no_such_option": 1}},
}
#: The sample of an option the table above does not know yet (a newly declared field), by its
#: kind (perflab.contract.types.OPTION_KINDS); a json option has no neutral sample.
KIND_SAMPLES: dict[str, Any] = {
    "str": "conformance", "pos_int": 2, "bool": True, "fraction": 0.5, "port": 18124, "devices": (1,),
    "args": ("--conformance-flag",), "env": {"PERFLAB_CONFORMANCE": "1"}, "options": {"perflab_conformance_no_such_option": 1},
}


def sample_hardware(kind: str = "cuda", count: int = 8) -> HardwareSnapshot:
    """A plausible machine of ``kind`` for preflight and launch checks (no probing)."""
    if kind == "ascend":
        accs = tuple(
            Accelerator(vendor="huawei", kind="ascend", index=i, name="Ascend 910B3", chip="910B3",
                        memory_total_mib=65536, source="conformance")
            for i in range(count)
        )
    else:
        accs = tuple(
            Accelerator(vendor="nvidia", kind=kind, index=i, name="NVIDIA H100 80GB HBM3",
                        memory_total_mib=81559, compute_capability=(9, 0), source="conformance")
            for i in range(count)
        )
    return HardwareSnapshot(accelerators=accs, simulated=True, name=f"conformance-{kind}")


class EngineConformance:
    """Subclass in your tests and set the class attributes; every ``test_*`` runs."""

    #: the engine name your plugin registers
    engine: ClassVar[str] = ""
    #: the distribution that provides it (as in ``pip install``); checked through entry points
    distribution: ClassVar[str | None] = None
    #: a model id or path to build launches with
    model: ClassVar[str] = "Qwen/Qwen3-8B"
    #: {expected CrashCause.name: a log tail that must be classified as it}
    crash_samples: ClassVar[dict[str, str]] = {}
    #: serving options your engine cannot express: each must raise UnsupportedOption or be refused by preflight
    unsupported_configs: ClassVar[list[dict[str, Any]]] = []
    #: extra configurations that must build (besides the baseline)
    configs: ClassVar[list[dict[str, Any]]] = [{"max_model_len": 4096}, {"tp": 2}]
    #: a stand-in executable (script) for a full launch/ready/teardown cycle, or None
    stand_in: ClassVar[Path | str | None] = None
    #: the basename your launch's argv[0] has (replaced by the stand-in in the full cycle)
    executable_name: ClassVar[str | None] = None
    #: or: a perflab simulator machine (e.g. "h100-80g-x1") whose stand-in engine runs the cycle
    sim_hardware: ClassVar[str | None] = None
    #: {ServeConfig field: changes} replacing SERVE_OPTION_SAMPLES for your engine (a value it
    #: can express, e.g. {"chunked_prefill": {"chunked_prefill": True}} when False is the default)
    serve_option_samples: ClassVar[dict[str, dict[str, Any]]] = {}

    # ------------------------------------------------------------------ fixtures

    @pytest.fixture(scope="class")
    @classmethod
    def pm(cls) -> PluginManager:
        return PluginManager()

    @pytest.fixture(scope="class")
    @classmethod
    def info(cls, pm: PluginManager) -> EngineInfo:
        assert cls.engine, "set `engine` on your EngineConformance subclass"
        rec = pm.engines.get(cls.engine)
        broken = [f"{r.distribution or r.name}: {r.error}" for r in pm.broken]
        assert rec is not None, f"engine {cls.engine!r} is not registered; plugin problems: {broken or 'none'}"
        return rec.info

    @pytest.fixture(scope="class")
    @classmethod
    def hardware(cls, info: EngineInfo) -> HardwareSnapshot:
        return sample_hardware(info.accelerators[0] if info.accelerators else "cuda")

    def _build(self, pm: PluginManager, hardware: HardwareSnapshot, tmp: Path, **changes: Any) -> LaunchSpec:
        config = ServeConfig(**{"model": self.model, "port": 18123, **changes})
        if config.node_count > 1:  # the serving rank of a group (build_group_launch)
            return self._build_group(pm, hardware, tmp, config)[0]
        return pm.engine(self.engine).build_launch(config, hardware, tmp, None)

    def _build_group(self, pm: PluginManager, hardware: HardwareSnapshot, tmp: Path, config: ServeConfig) -> list[LaunchSpec]:
        from perflab.contract.types import GroupNode, NodeGroup

        per = config.devices_per_node
        group = NodeGroup(tuple(GroupNode(r, f"10.0.0.{r + 1}", f"node{r}", tuple(range(per))) for r in range(config.node_count)),
                          29500)
        return pm.engine(self.engine).build_group_launch(config, hardware, group, tmp, None)

    def _serve_options(self, pm: PluginManager) -> Any:
        options = pm.engines[self.engine].engine.serve_options
        if not options:
            pytest.skip("the engine declares no serve_options")
        return options

    def _sample(self, name: str) -> dict[str, Any] | None:
        if name in self.serve_option_samples or name in SERVE_OPTION_SAMPLES:
            return self.serve_option_samples.get(name, SERVE_OPTION_SAMPLES.get(name))
        kind = next(o.kind for o in serve_options() if o.name == name)
        return {name: KIND_SAMPLES[kind]} if kind in KIND_SAMPLES else None

    # ------------------------------------------------------------------ loading

    def test_loads_through_entry_point(self, pm: PluginManager, info: EngineInfo) -> None:
        rec = pm.engines[self.engine]
        if self.distribution is not None:
            assert rec.distribution is not None, "the engine was not registered through an entry point"
            norm = lambda s: re.sub(r"[-_.]+", "-", s).lower()  # noqa: E731
            assert norm(rec.distribution) == norm(self.distribution)
            eps = [ep for ep in importlib.metadata.entry_points(group=hookspecs.PROJECT)
                   if ep.dist is not None and norm(ep.dist.metadata["Name"]) == norm(self.distribution)]
            assert eps, f"{self.distribution} declares no entry point in group 'perflab'"

    def test_hook_signatures_match_specs(self, pm: PluginManager, info: EngineInfo) -> None:
        plugin = pm.pm.get_plugin(pm.engines[self.engine].plugin)
        assert plugin is not None
        assert check_compatibility(plugin) is None
        record = next(r for r in pm.records if r.name == pm.engines[self.engine].plugin)
        assert record.status == "ok", record.error
        assert type(pm.engines[self.engine].engine.wrapped).build_launch is not EnginePlugin.build_launch, \
            "an engine must implement build_launch"

    def test_engine_info_is_well_formed(self, info: EngineInfo) -> None:
        assert re.fullmatch(r"[a-z0-9][a-z0-9._-]*", info.name), "engine names are lowercase, no spaces"
        assert info.display_name
        assert info.accelerators and all(isinstance(a, str) for a in info.accelerators)
        assert 0 < info.default_port < 65536

    def test_version_hook_answers_without_importing_the_engine(self, pm: PluginManager, info: EngineInfo) -> None:
        before = set(sys.modules)
        version = pm.engines[self.engine].engine.version(dict(os.environ))
        assert version is None or isinstance(version, str)
        heavy = {"torch", "vllm", "sglang", "tensorrt_llm"} & (set(sys.modules) - before)
        assert not heavy, f"version() imported {sorted(heavy)}"

    # ------------------------------------------------------------------ launch

    def test_launch_spec_is_an_argv_with_explicit_host_and_port(
        self, pm: PluginManager, hardware: HardwareSnapshot, tmp_path: Path
    ) -> None:
        spec = self._build(pm, hardware, tmp_path)
        assert isinstance(spec, LaunchSpec)
        assert spec.engine == self.engine
        assert isinstance(spec.argv, tuple) and spec.argv and all(isinstance(a, str) for a in spec.argv)
        assert spec.port == 18123 and spec.host == "127.0.0.1"
        text = "\n".join([*spec.argv, *(f.content for f in spec.files)])
        assert "18123" in text, "the port must appear in the argv or a config file"
        assert "127.0.0.1" in text, "the host must appear in the argv or a config file"
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in spec.env.items())

    def test_other_configs_build(self, pm: PluginManager, hardware: HardwareSnapshot, tmp_path: Path) -> None:
        for changes in self.configs:
            spec = self._build(pm, hardware, tmp_path, **changes)
            assert spec.argv, changes

    def test_extra_args_and_env_are_passed_through(
        self, pm: PluginManager, hardware: HardwareSnapshot, tmp_path: Path
    ) -> None:
        try:
            spec = self._build(pm, hardware, tmp_path, extra_args=("--conformance-flag",), extra_env={"PERFLAB_CONFORMANCE": "1"})
        except UnsupportedOption as exc:  # an engine without an argv for extras must say so
            assert exc.option
            return
        assert "--conformance-flag" in spec.argv
        assert spec.env.get("PERFLAB_CONFORMANCE") == "1"

    def test_unknown_engine_option_is_refused_not_dropped(
        self, pm: PluginManager, hardware: HardwareSnapshot, tmp_path: Path
    ) -> None:
        with pytest.raises(UnsupportedOption):
            self._build(pm, hardware, tmp_path, options={"perflab_conformance_no_such_option": 1})

    def test_unsupported_configs_are_refused(self, pm: PluginManager, hardware: HardwareSnapshot, tmp_path: Path) -> None:
        for changes in self.unsupported_configs:
            config = ServeConfig(model=self.model, port=18123, **changes)
            reasons = [u for u in pm.engine(self.engine).check_support(config, hardware, None) if u.severity == "error"]
            if reasons:
                continue
            with pytest.raises(UnsupportedOption):
                self._build(pm, hardware, tmp_path, **changes)

    # ------------------------------------------------------------------ serving options

    def test_every_serve_option_is_mapped_or_refused(self, pm: PluginManager, info: EngineInfo) -> None:
        options = self._serve_options(pm)
        fields = [o.name for o in serve_options()]
        missing = [f for f in fields if f not in options]
        assert not missing, f"serve_options says nothing about {', '.join(missing)}: Maps(how, source) or Refuses(why, source)"
        unknown = sorted(set(options) - set(fields))
        assert not unknown, f"serve_options names no ServeConfig field: {', '.join(unknown)}"
        for name, how in options.items():
            assert isinstance(how, (Maps, Refuses)), f"{name}: {how!r} is neither Maps nor Refuses"
            assert (how.how if isinstance(how, Maps) else how.why), f"{name}: say how (Maps) or why (Refuses)"

    def _samples(self, pm: PluginManager, kind: type, problems: list[str]) -> list[tuple[str, Any, dict[str, Any]]]:
        """(field, declaration, sample changes) of each field declared as ``kind``; a field
        without a sample is a problem."""
        out = []
        for name, how in self._serve_options(pm).items():
            changes = self._sample(name) if isinstance(how, kind) else {}
            if changes is None:
                problems.append(f"{name}: no sample value (set serve_option_samples[{name!r}])")
            elif changes:
                out.append((name, how, changes))
        return out

    def test_mapped_serve_options_change_the_launch(
        self, pm: PluginManager, hardware: HardwareSnapshot, tmp_path: Path
    ) -> None:
        problems: list[str] = []
        for name, how, changes in self._samples(pm, Maps, problems):
            baseline = self._build(pm, hardware, tmp_path, **{k: v for k, v in changes.items() if k != name})
            try:
                spec = self._build(pm, hardware, tmp_path, **changes)
            except UnsupportedOption as exc:
                problems.append(f"{name}: Maps({how.how!r}) but the sample {changes} is refused: {exc}")
                continue
            seen = lambda s: (s.argv, dict(s.env), s.files)  # noqa: E731
            if seen(spec) == seen(baseline):
                problems.append(f"{name}: Maps({how.how!r}) but the sample {changes} leaves argv, env and files as they are")
        assert not problems, "\n".join(problems)

    def test_refused_serve_options_are_refused(
        self, pm: PluginManager, hardware: HardwareSnapshot, tmp_path: Path
    ) -> None:
        problems: list[str] = []
        for name, how, changes in self._samples(pm, Refuses, problems):
            config = ServeConfig(**{"model": self.model, "port": 18123, **changes})
            if any(u.severity == "error" and name in u.what for u in pm.engine(self.engine).check_support(config, hardware, None)):
                continue
            try:
                self._build(pm, hardware, tmp_path, **changes)
            except UnsupportedOption as exc:
                if name not in exc.option:
                    problems.append(f"{name}: refused as {exc.option!r}, which does not name it")
                continue
            problems.append(f"{name}: Refuses({how.why!r}) but {changes} passes preflight and builds")
        assert not problems, "\n".join(problems)

    # ------------------------------------------------------------------ readiness, preflight, crashes

    def test_readiness_probes_exist(self, pm: PluginManager, hardware: HardwareSnapshot, tmp_path: Path) -> None:
        spec = self._build(pm, hardware, tmp_path)
        ready = pm.engine(self.engine).readiness(spec)
        assert isinstance(ready, Readiness)
        assert ready.http or ready.generation_path, "give at least one HTTP probe or a generation path"
        for probe in ready.http:
            assert probe.path.startswith("/")
        for pattern in ready.ready_log_patterns:
            re.compile(pattern)
        assert ready.startup_timeout_s > 0

    def test_cache_reset_is_well_formed(self, pm: PluginManager, hardware: HardwareSnapshot, tmp_path: Path) -> None:
        """The optional prefix-cache reset: None (the engine has none; the lab notes it once), or
        an HTTP method and path on the serving port, cited."""
        from perflab.contract.types import CacheReset

        reset = pm.engines[self.engine].engine.cache_reset(self._build(pm, hardware, tmp_path))
        assert reset is None or isinstance(reset, CacheReset), f"expected a CacheReset or None, got {reset!r}"
        if reset is None:
            return
        assert reset.method in ("GET", "POST", "PUT", "DELETE") and reset.path.startswith("/")
        assert reset.source, "say where the engine defines the path"

    def test_metrics_endpoint_is_well_formed(self, pm: PluginManager, hardware: HardwareSnapshot, tmp_path: Path) -> None:
        """The optional Prometheus endpoint: None (nothing is scraped), or a path (and a port
        when not the serving one), at least one metric name, and where the names come from."""
        from perflab.contract.types import MetricsEndpoint

        launch = self._build(pm, hardware, tmp_path)
        endpoint = pm.engines[self.engine].engine.metrics(launch)
        assert endpoint is None or isinstance(endpoint, MetricsEndpoint), f"expected a MetricsEndpoint or None, got {endpoint!r}"
        if endpoint is None:
            return
        assert endpoint.path.startswith("/")
        assert endpoint.port is None or 0 < endpoint.port < 65536
        assert endpoint.names(), "name at least one metric (kv_cache_usage, running, ...)"
        assert endpoint.source, "say where the engine defines the names"

    def test_preflight_answers_are_well_formed(self, pm: PluginManager, hardware: HardwareSnapshot) -> None:
        for changes in [{}, *self.configs, {"quantization": "fp8"}]:
            config = ServeConfig(model=self.model, **changes)
            for answer in pm.engine(self.engine).check_support(config, hardware, None):
                assert isinstance(answer, Unsupported)
                assert answer.what and answer.why
                assert answer.severity in ("error", "warning")

    def test_crash_samples_map_to_named_causes(self, pm: PluginManager, info: EngineInfo) -> None:
        if not self.crash_samples:
            pytest.skip("no crash_samples given")
        for expected, tail in self.crash_samples.items():
            cause = pm.engines[self.engine].engine.classify_crash(1, tail)
            assert isinstance(cause, CrashCause), f"sample {expected!r} was not classified"
            assert cause.name == expected
            assert cause.explanation
            assert cause.line is None or cause.line in tail

    def test_unknown_logs_are_not_misclassified(self, pm: PluginManager, info: EngineInfo) -> None:
        cause = pm.engines[self.engine].engine.classify_crash(0, "INFO all good\n")
        assert cause is None

    def test_engine_is_an_object_the_core_calls(self, pm: PluginManager) -> None:
        """Contract v2: the registered engine is an EnginePlugin whose methods take no engine name."""
        import inspect

        from perflab.contract.plugin_base import EnginePlugin

        engine = pm.engines[self.engine].engine.wrapped
        assert isinstance(engine, EnginePlugin)
        for method in EnginePlugin.METHODS:
            assert "engine" not in inspect.signature(getattr(engine, method)).parameters, f"{method} takes an engine"

    # ------------------------------------------------------------------ the full cycle

    def test_full_cycle_against_stand_in(self, pm: PluginManager, hardware: HardwareSnapshot, tmp_path: Path) -> None:
        if self.stand_in is None and self.sim_hardware is None:
            pytest.skip("no stand_in executable or sim_hardware given")
        import anyio

        from perflab.supervisor import EngineInstance

        env = dict(os.environ)
        cycle_hardware = HardwareSnapshot()
        config = ServeConfig(model=self.model)
        if self.sim_hardware is not None:
            from perflab.hardware import resolve
            from perflab.hardware.emulation import MACHINE_STATE_ENV

            # a private memory registry, so parallel simulations cannot disturb this one
            env[MACHINE_STATE_ENV] = str(tmp_path / "sim-state")
            cycle_hardware, env = resolve(pm, f"sim:{self.sim_hardware}", env)
            config = config.replace(max_model_len=4096)
        else:
            spec = self._build(pm, hardware, tmp_path)
            exe_name = self.executable_name or Path(spec.argv[0]).name
            bindir = tmp_path / "bin"
            bindir.mkdir()
            target = bindir / exe_name
            target.write_text(f"#!{sys.executable}\n" + Path(self.stand_in).read_text())  # type: ignore[arg-type]
            target.chmod(target.stat().st_mode | stat.S_IEXEC)
            env["PATH"] = f"{bindir}{os.pathsep}{env.get('PATH', '')}"
            assert shutil.which(exe_name, path=env["PATH"]) == str(target)

        async def cycle() -> dict[str, Any]:
            inst = EngineInstance(pm, self.engine, config, hardware=cycle_hardware, env=env,
                             workdir=tmp_path / "run", startup_timeout=60)
            async with inst:
                state = inst.outcome.state
            return {"ready": state, "final": inst.outcome}

        result = anyio.run(cycle)
        assert result["ready"] == "ready", stand_in_hint(result["final"]) + str(result["final"].to_json())
        outcome = result["final"]
        assert not outcome.leftovers, outcome.leftovers



def stand_in_hint(outcome: Any) -> str:
    """The usual cause of a stand-in that never got ready, named first: an argparse stand-in
    (the scaffold's) exits on a flag your ``build_launch`` passes that its parser lacks."""
    log = outcome.log
    text = log.read_text(errors="replace") if log is not None and Path(log).is_file() else ""
    lines = [ln.strip() for ln in text.splitlines() if "unrecognized arguments" in ln]
    if not lines:
        return ""
    return (f"the stand-in rejected the launch's argv ({lines[-1]}): add the flags your "
            f"build_launch passes to the stand-in's argument parser\n")
