"""Measuring one configuration for real: launch its replicas, benchmark, tear down.

One :meth:`Executor.run` is one run directory: every replica is started under
:func:`perflab.supervisor.supervise` (preflight, launch, readiness, teardown), the benchmark
client spreads each profile's requests over the replicas, and whatever happens — a refusal,
a crash at startup or mid-benchmark, a benchmark error, Ctrl-C — every engine is torn down
before it returns (or re-raises the cancellation).
"""

from __future__ import annotations

import json
import shlex
import threading
from collections.abc import Callable, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread

from perflab.lab.options import Configuration, replica_devices
from perflab.lab.plan import Plan, Profile
from perflab.lab.store import ProfileMeasurement, RunRecord, write_json
from perflab.lab.study import CRASHED, FAILED, OK, TIMEOUT, UNSUPPORTED
from perflab.types import HardwareSnapshot, LaunchSpec, to_jsonable

SIM_TIME_SCALE_ENV = "PERFLAB_SIM_TIME_SCALE"
_VISIBLE = ("CUDA_VISIBLE_DEVICES", "ASCEND_RT_VISIBLE_DEVICES", "ASCEND_VISIBLE_DEVICES")

Event = Callable[..., None]  # on_event(kind, **fields): the live display and the study log


@dataclass
class LabContext:
    """Everything a run needs that does not change during a study."""

    pm: Any  # perflab.plugins.PluginManager
    plan: Plan
    hardware: HardwareSnapshot
    env: dict[str, str]
    versions: dict[str, str | None] = field(default_factory=dict)
    time_scale: float = 1.0

    @property
    def simulated(self) -> bool:
        return self.hardware.simulated


def _strip_host_port(argv: Sequence[str]) -> list[str]:
    """The argv without the address perflab chose (the seeds' scripts omit it)."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg in ("--host", "--port"):
            skip = True
            continue
        if arg.startswith(("--host=", "--port=")):
            continue
        out.append(arg)
    if out and "/" in out[0]:
        out[0] = out[0].rsplit("/", 1)[1]  # an absolute interpreter or stand-in path
    return out


def serving_script(launches: Sequence[LaunchSpec]) -> str:
    """The "Serving script" box: environment exports and the command, as the seeds print it."""
    first = launches[0]
    lines: list[str] = []
    if len(launches) > 1:
        lines.append(f"# {len(launches)} replicas on disjoint devices; the benchmark spreads requests over all of them")
    for key, value in first.env.items():
        if key.startswith("PERFLAB_"):
            continue
        lines.append(f"export {key}={shlex.quote(str(value))}")
    lines.append(shlex.join(_strip_host_port(first.argv)))
    for f in first.files:
        lines.append(f"# with {Path(f.path).name} written by perflab (see launch.json in the run directory)")
    for i, spec in enumerate(launches[1:], 2):
        vis = [f"{k}={spec.env[k]}" for k in _VISIBLE if k in spec.env]
        lines.append(f"# replica {i}: the same command{' with ' + ', '.join(vis) if vis else ''}")
    return "\n".join(lines)


def _unsupported_dicts(items: Sequence[Any]) -> list[dict[str, Any]]:
    return [to_jsonable(u) for u in items]


class Executor:
    """Runs configurations; ``on_event(kind, **fields)`` hears about each stage."""

    def __init__(self, ctx: LabContext, on_event: Event | None = None) -> None:
        self.ctx = ctx
        self.on_event = on_event or (lambda kind, **kw: None)
        # benchmark threads left running when their engine died or their time ran out; the
        # next launch waits for them, so they cannot send requests to its (maybe same) port
        self._stale: list[threading.Event] = []

    async def _settle(self) -> None:
        for done in self._stale:
            await anyio.to_thread.run_sync(done.wait, abandon_on_cancel=True)
        self._stale.clear()

    def _env(self) -> dict[str, str]:
        env = dict(self.ctx.env)
        if self.ctx.simulated:
            env[SIM_TIME_SCALE_ENV] = f"{self.ctx.time_scale:g}"
        return env

    def _device_sets(self, config: Configuration) -> list[tuple[int, ...]] | None:
        kinds = self.ctx.pm.engine(config.engine).info.accelerators
        pool = tuple(a.index for a in self.ctx.hardware.accelerators if a.kind in kinds)
        sc = config.serve_config()
        return replica_devices(config.replicas, sc.world_size, pool, sc.devices)

    def _script_without_launch(self, config: Configuration, device_sets: list[tuple[int, ...]] | None, run_dir: Path) -> str | None:
        """A refused configuration still shows what it would have run, when the plugin can build it."""
        from perflab.engines import build_launch

        try:
            spec = build_launch(self.ctx.pm, config.engine, config.serve_config(devices=(device_sets or [None])[0]),
                                self.ctx.hardware, run_dir, self.ctx.versions.get(config.engine))
        except Exception:  # a plugin that cannot express it (UnsupportedOption): no script to show
            return None
        return serving_script([spec])

    async def run(self, config: Configuration, profiles: Sequence[Profile], run_dir: Path, *, label: str = "") -> RunRecord:
        from perflab.supervisor import supervise

        plan = self.ctx.plan
        engine = config.engine
        version = self.ctx.versions.get(engine)
        await self._settle()
        write_json(run_dir / "config.json", {"label": label, **config.canonical(),
                                            "profiles": [p.name for p in profiles]})
        write_json(run_dir / "hardware.json", to_jsonable(self.ctx.hardware))
        try:
            device_sets = self._device_sets(config)
        except ValueError as exc:
            rec = RunRecord(UNSUPPORTED, version=version,
                            reasons=[{"what": f"replicas={config.replicas}", "why": str(exc), "source": "perflab", "severity": "error"}])
            rec.script = self._script_without_launch(config, None, run_dir)
            self._write_outcome(run_dir, rec, [])
            return rec

        rec = RunRecord("done", version=version)
        instances: list[Any] = []
        async with AsyncExitStack() as stack:
            for i, devices in enumerate(device_sets or [None]):
                workdir = run_dir if not device_sets or len(device_sets) == 1 else run_dir / f"replica-{i + 1}"
                self.on_event("launch", label=label, engine=engine, replica=i + 1, replicas=config.replicas)
                inst = supervise(
                    self.ctx.pm, engine, config.serve_config(devices=devices), hardware=self.ctx.hardware,
                    env=self._env(), workdir=workdir, startup_timeout=plan.timeouts.startup_s, version=version,
                    **({"grace": plan.timeouts.teardown_s} if plan.timeouts.teardown_s is not None else {}),
                )
                await stack.enter_async_context(inst)
                instances.append(inst)
                o = inst.outcome
                rec.version = o.version or rec.version
                if o.log is not None and rec.log is None:
                    rec.log = str(o.log)
                if o.state != "ready":
                    self._record_startup_failure(rec, o, config, device_sets, run_dir)
                    break
            else:
                rec.script = serving_script([inst.launch for inst in instances])
                await self._benchmark_all(rec, instances, config, profiles, run_dir, label)
            self.on_event("teardown", label=label, engine=engine)
        self._write_outcome(run_dir, rec, instances)
        return rec

    def _record_startup_failure(self, rec: RunRecord, o: Any, config: Configuration,
                                device_sets: list[tuple[int, ...]] | None, run_dir: Path) -> None:
        state = o.state if o.state in (UNSUPPORTED, CRASHED, TIMEOUT) else CRASHED
        rec.state = state
        rec.reasons = _unsupported_dicts(o.reasons)
        rec.cause = to_jsonable(o.cause) if o.cause is not None else None
        if o.launch is not None:
            rec.script = serving_script([o.launch])
        else:
            rec.script = self._script_without_launch(config, device_sets, run_dir)
        if state == CRASHED and rec.cause is None:
            rec.error = "the engine stopped before it served"

    async def _benchmark_all(self, rec: RunRecord, instances: list[Any], config: Configuration,
                             profiles: Sequence[Profile], run_dir: Path, label: str) -> None:
        for profile in profiles:
            m = await self._benchmark(instances, config, profile, run_dir, label)
            rec.measurements[profile.name] = m
            if m.status == CRASHED:
                rec.state = CRASHED
                rec.cause = m.cause
                break  # the rest of the profiles need a fresh launch

    async def _benchmark(self, instances: list[Any], config: Configuration, profile: Profile, run_dir: Path,
                         label: str) -> ProfileMeasurement:
        from perflab.bench import BenchRequest, run_benchmark_sync

        plan = self.ctx.plan
        workload: dict[str, Any] = {}
        if profile.dataset == "random":
            workload = {"random_input_len": profile.input_len, "random_output_len": profile.output_len,
                        "random_range_ratio": profile.range_ratio}
        elif profile.output_len:
            workload = {"sharegpt_output_len": profile.output_len}
        if profile.dataset_path:
            workload["dataset_path"] = profile.dataset_path
        if profile.endpoint:
            workload["endpoint"] = profile.endpoint
        req = BenchRequest(
            base_urls=tuple(inst.base_url for inst in instances),
            model=instances[0].launch.served_model_name,
            backend=profile.backend,
            dataset=profile.dataset,
            num_prompts=profile.num_prompts,
            request_rate=profile.request_rate,
            burstiness=profile.burstiness,
            max_concurrency=profile.max_concurrency,
            seed=profile.seed,
            time_scale=self.ctx.time_scale if self.ctx.simulated else 1.0,
            label=label,
            **workload,
        )
        self.on_event("benchmark", label=label, profile=profile.label, done=0, total=profile.num_prompts)

        def progress(done: int, total: int) -> None:
            self.on_event("progress", label=label, profile=profile.label, done=done, total=total)

        result: Any = None
        error: str | None = None
        dead: list[Any] = []
        finished = threading.Event()

        def work() -> Any:
            try:
                return run_benchmark_sync(req, progress)
            finally:
                finished.set()

        async with anyio.create_task_group() as tg:

            async def bench() -> None:
                nonlocal result, error
                try:
                    with anyio.fail_after(plan.timeouts.benchmark_s):
                        # abandoned on cancel (Ctrl-C, engine death, timeout): teardown must not
                        # wait for the client, whose requests fail fast once the engine is gone
                        result = await anyio.to_thread.run_sync(work, abandon_on_cancel=True)
                except TimeoutError:
                    error = f"the benchmark did not finish within {plan.timeouts.benchmark_s:g} s"
                except Exception as exc:  # a client failure is a result, not a study abort
                    error = f"{type(exc).__name__}: {exc}"
                tg.cancel_scope.cancel()

            async def watch(inst: Any) -> None:
                await inst.died.wait()
                dead.append(inst)
                tg.cancel_scope.cancel()

            for inst in instances:
                tg.start_soon(watch, inst)
            tg.start_soon(bench)
        if not finished.is_set():
            self._stale.append(finished)

        if dead:
            o = dead[0].outcome
            return ProfileMeasurement(CRASHED, num_prompts=profile.num_prompts, cause=to_jsonable(o.cause),
                                      error=f"the engine died during the {profile.label} benchmark")
        if error is not None or result is None:
            return ProfileMeasurement(FAILED, num_prompts=profile.num_prompts, error=error or "no benchmark result")
        metrics = dict(result.metrics)
        write_json(run_dir / f"bench-{profile.name}.json", {"profile": profile.name, "label": profile.label,
                                                             "definition": profile.definition(), "metrics": metrics})
        return ProfileMeasurement(OK, metrics=metrics, num_prompts=profile.num_prompts)

    def _write_outcome(self, run_dir: Path, rec: RunRecord, instances: list[Any]) -> None:
        outcome = {
            "state": rec.state,
            "version": rec.version,
            "script": rec.script,
            "reasons": rec.reasons,
            "cause": rec.cause,
            "error": rec.error,
            "log": rec.log,
            "measurements": {k: {"status": m.status, "error": m.error, "cause": m.cause} for k, m in rec.measurements.items()},
            "instances": [inst.outcome.to_json() for inst in instances],
        }
        write_json(run_dir / "outcome.json", json.loads(json.dumps(outcome, default=str)))
