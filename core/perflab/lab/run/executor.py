"""Measuring one configuration for real: launch its replicas, benchmark, tear down.

One :meth:`Executor.run` is one run directory: every replica is started under
:class:`perflab.supervisor.EngineInstance` (preflight, launch, readiness, teardown), the benchmark
client spreads each profile's requests over the replicas, and whatever happens — a refusal,
a crash at startup or mid-benchmark, a benchmark error, Ctrl-C — every engine is torn down
before it returns (or re-raises the cancellation).

The benchmark runs in a worker thread with a cancel event (:mod:`perflab.bench.cancel`):
the engine dying, the profile's time budget running out and Ctrl-C/SIGTERM (a cancellation
of the study) all set it, and the executor waits — bounded — for the client to stop before
it tears the engine down, so no benchmark outlives its configuration.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import math
import shlex
import statistics
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread
import structlog

from perflab import redact
from perflab.bench.metrics import BenchMetrics, metrics_json, name_of
from perflab.bench.result import BenchResult
from perflab.bench.serverclock import LIFECYCLE_FILE_ENV, parse_lifecycle
from perflab.contract.status import Status
from perflab.contract.types import CrashCause, HardwareSnapshot, LaunchSpec, Unsupported, to_jsonable
from perflab.lab.accuracy import ACCURACY_PROFILE, AccuracyJob, AccuracyRunner
from perflab.lab.decide import DecideBy, LoadKind, Slo
from perflab.lab.options import Configuration, replica_devices
from perflab.lab.plan import Plan, Profile
from perflab.lab.run.earlystop import EarlyStop, tokens_per_event
from perflab.lab.store import ProfileMeasurement, RunRecord, file_stem, write_json
from perflab.observe import TimedRun, Watcher, Watching
from perflab.observe import watch as observe_watch
from perflab.observe.energy import observed_extras
from perflab.observe.telemetry import ENGINE_T, Telemetry
from perflab.plugins import PluginManager

if TYPE_CHECKING:
    from perflab.supervisor_group import GroupPlacement

log = structlog.get_logger("perflab.lab")

# A benchmark with failed requests ends before the engine's process does when the engine is
# going down (streams cut, connections refused while it shuts down): before calling such a
# result a measurement, wait this long for the engine to exit.
DEATH_GRACE_S = 3.0
# How long a cancelled benchmark may take to stop (it needs well under a second) before the
# executor stops waiting for its thread; the next launch still waits for it.
BENCH_STOP_S = 10.0

Event = Callable[..., None]  # on_event(kind, **fields): the live display and the study log
Measured = Callable[[str, ProfileMeasurement], None]  # on_measured(profile name, measurement)
# on_point(profile name, point, measurement, reused): a curve's load point measured (or reused)
PointMeasured = Callable[[str, str, ProfileMeasurement, bool], None]


# What an engine never inherits from perflab's own environment (issue #14): a Ray worker's
# RAY_* variables (vLLM calls ray.init() and would join perflab's cluster instead of starting
# its own) and its *_VISIBLE_DEVICES (CUDA_VISIBLE_DEVICES, ASCEND_RT_VISIBLE_DEVICES, ... set by
# Ray for the agent): the plugin writes the devices the run was placed on. One declaration.
INHERITED_NOT_PASSED = ("RAY_*", "*_VISIBLE_DEVICES")


def engine_environment(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` without what an engine must not inherit (:data:`INHERITED_NOT_PASSED`)."""
    return {k: v for k, v in env.items() if not any(fnmatch.fnmatchcase(k, pat) for pat in INHERITED_NOT_PASSED)}


@dataclass
class LabContext:
    """Everything a run needs that does not change during a study."""

    pm: PluginManager
    plan: Plan
    hardware: HardwareSnapshot
    env: dict[str, str]
    versions: dict[str, str | None] = field(default_factory=dict)
    time_scale: float = 1.0

    @property
    def simulated(self) -> bool:
        return self.hardware.simulated


def launch_environment(ctx: LabContext) -> dict[str, str]:
    """The environment every engine process of a run starts from (each rank of a multi-node
    group too, on its own node's context): the context's, less what an engine must not
    inherit, with the time scale where the activated machine takes one (TIME_SCALE_VAR_ENV)."""
    from perflab.hardware.emulation import TIME_SCALE_VAR_ENV

    env = engine_environment(ctx.env)
    scale_var = ctx.env.get(TIME_SCALE_VAR_ENV)
    if scale_var:
        env[scale_var] = f"{ctx.time_scale:g}"
    return env


def _script_argv(spec: LaunchSpec) -> list[str]:
    """The argv without the address perflab chose (``spec.address_args``, which the plugin
    declares; the seeds' scripts omit it) and with a bare program name."""
    out = list(spec.argv)
    drop = list(spec.address_args)
    if drop:
        kept: list[str] = []
        for arg in out:
            if drop and arg == drop[0]:
                drop.pop(0)
                continue
            kept.append(arg)
        out = kept
    if out and "/" in out[0]:
        out[0] = out[0].rsplit("/", 1)[1]  # an absolute interpreter or stand-in path
    return out


def _env_lines(spec: LaunchSpec, inside: set[str], first: LaunchSpec | None = None) -> list[str]:
    """``KEY=value`` of ``spec.env`` as the script shows it: secrets as ***, no PERFLAB_*
    variables, paths inside the run directory as ``"$PWD/<name>"``; with ``first``, only the
    entries that differ from it (what a replica changes: its devices)."""
    out: list[str] = []
    for key, value in redact.redact_env(spec.env).items():
        if key.startswith("PERFLAB_") or (first is not None and first.env.get(key) == spec.env.get(key)):
            continue
        text = str(value)
        prefix = next((d for d in inside if text.startswith(d)), None)
        out.append(f'{key}="$PWD/{text[len(prefix):]}"' if prefix is not None else f"{key}={shlex.quote(text)}")
    return out


def serving_script(launches: Sequence[LaunchSpec], describe_file: Callable[[str, str], list[str] | None] | None = None,
                   workdir: Path | None = None) -> str:
    """The "Serving script" box: environment exports and the command, as the seeds print it.

    A file the plugin wrote (MindIE's config.json) is shown by what it sets —
    ``describe_file(path, content)``, the plugin's optional ``describe_file`` engine method — and
    paths inside the run directory become ``$PWD/<name>``: the script must not point into a
    study directory."""
    first = launches[0]
    lines: list[str] = []
    if len(launches) > 1:
        lines.append(f"# {len(launches)} replicas on disjoint devices; the benchmark spreads requests over all of them")
    inside = {str(workdir) + "/", str(workdir.resolve()) + "/"} if workdir is not None else set()
    lines += [f"export {line}" for line in _env_lines(first, inside)]
    lines.append(shlex.join(redact.redact_argv(_script_argv(first))))
    for f in first.files:
        described = describe_file(f.path, f.content) if describe_file is not None else None
        name = Path(f.path).name
        if described is None:
            lines.append(f"# with {name} written by perflab (see launch.json in the run directory)")
            continue
        lines.append(f"# {name}: the engine's default template with these keys set by perflab:")
        lines += [f"#   {d}" for d in described]
    for i, spec in enumerate(launches[1:], 2):
        diff = _env_lines(spec, inside, first)
        lines.append(f"# replica {i}: the same command{' with ' + ', '.join(diff) if diff else ''}")
    return "\n".join(lines)


def group_script(ranks: Sequence[LaunchSpec], describe_file: Callable[[str, str], list[str] | None] | None = None,
                 workdir: Path | None = None) -> str:
    """The serving script of a multi-node launch: each node rank's commands, rank 0 (serving) first."""
    return "\n".join(
        f"# node rank {r}{' (serves the API)' if r == 0 else ''}\n" + serving_script([spec], describe_file, workdir)
        for r, spec in enumerate(ranks))


def launches_script(instances: Sequence[Any], describe_file: Callable[[str, str], list[str] | None] | None = None,
                    workdir: Path | None = None) -> str:
    """The serving script of what ``instances`` launched: replicas, or one multi-node group."""
    if len(instances) == 1 and len(getattr(instances[0], "rank_launches", ())) > 1:
        return group_script(instances[0].rank_launches, describe_file, workdir)
    return serving_script([inst.launch for inst in instances], describe_file, workdir)


def plugin_file_describer(pm: PluginManager, engine: str) -> Callable[[str, str], list[str] | None]:
    """The engine's ``describe_file`` method as ``describe(path, content)``."""

    def describe(path: str, content: str) -> list[str] | None:
        rec = pm.engines.get(engine)
        return rec.engine.describe_file(path, content) if rec is not None else None

    return describe


def stopped_early_record(decided: Mapping[str, Any], partial: Any,
                         num_prompts: int | None) -> tuple[BenchMetrics | None, dict[str, Any]]:
    """The metrics and the ``stopped_early`` record of a benchmark the early stop ended, told in
    the same counts. The decision counted the requests completed when it was made; a few more
    complete while the client stops (144 in the block against "after 142 of 1000"), so the
    record takes the partial result's final counts and duration, keeping the decision's under
    ``decided_at``. The requests cut short in flight by the stop are no failure of the
    configuration: ``failed`` keeps only those that failed on their own, the record says how many
    were cut short and never sent, and the partial throughput (over the measured part only,
    which can exceed what the full run could reach) is kept to be named as such."""
    from perflab.bench.trace import CANCELLED

    info = dict(decided)
    if partial is None:
        return None, info
    measured = BenchMetrics.of(partial.metrics)
    traces = list(getattr(partial, "requests", None) or [])
    cut = sum(1 for t in traces if not t.success and t.error == CANCELLED)
    completed, failed = int(measured.completed or 0), int(measured.failed or 0)
    sent = completed + failed
    never = partial.info.get("requests_not_recorded") if isinstance(getattr(partial, "info", None), dict) else None
    if not isinstance(never, int):
        never = max(0, (num_prompts or sent) - sent)
    metrics = measured.merged({name_of(lambda m: m.failed): failed - cut})
    info["decided_at"] = {k: info[k] for k in ("completed", "elapsed_s") if k in info}
    info.update(completed=completed, cut_short=cut, never_sent=never)
    duration = metrics.duration
    if isinstance(duration, (int, float)) and "elapsed_s" in info:
        info["elapsed_s"] = round(float(duration), 3)
    tps = metrics.total_token_throughput
    if isinstance(tps, (int, float)):
        info["partial_token_throughput"] = round(float(tps), 2)
    return metrics, info


def _has_failures(result: BenchResult | None) -> bool:
    return result is not None and bool(result.metrics.failed)


MAX_FAILURE_REASONS = 3


def failure_summary(result: BenchResult) -> str | None:
    """"N of M requests failed: K × 'first error'; ..." — the distinct error messages of the
    failed requests, most frequent first, counted (None when every request succeeded)."""
    from collections import Counter

    failed = int(result.metrics.failed or 0)
    if not failed:
        return None
    total = failed + int(result.metrics.completed or 0)
    errors = [str(getattr(t, "error", "") or "unknown error").strip() for t in getattr(result, "requests", [])
              if not getattr(t, "success", True)]
    if not errors:  # no traces: the kept "request N: error" lines
        errors = [e.split(": ", 1)[-1] for e in getattr(result, "errors", [])]
    counted = Counter(e.splitlines()[0][:200] if e else "unknown error" for e in errors)
    reasons = "; ".join(f"{c} × {e!r}" for e, c in counted.most_common(MAX_FAILURE_REASONS))
    more = len(counted) - MAX_FAILURE_REASONS
    return f"{failed} of {total} requests failed" + (f": {reasons}" if reasons else "") + (
        f"; and {more} other error(s)" if more > 0 else "")


def _completed(result: BenchResult | None) -> int | None:
    return None if result is None else int(result.metrics.completed or 0)


def _last_log_line(path: str | Path | None) -> str | None:
    """The engine log's last non-blank line (read from its last 8 KiB)."""
    if not path:
        return None
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - 8192))
            lines = [ln.strip() for ln in f.read().decode("utf-8", "replace").splitlines() if ln.strip()]
    except OSError:
        return None
    return lines[-1] if lines else None


async def _health(inst: Any) -> str:
    """The engine's health probe now, in words: "200", "503", "no answer (...)"."""
    import httpx

    probes = inst.readiness.http if inst.readiness is not None else ()
    if not probes:
        return "no health path"
    url = inst.base_url.rstrip("/") + probes[0].path
    try:
        async with httpx.AsyncClient(timeout=5.0, trust_env=False) as client:
            resp = await client.get(url)
        return f"GET {probes[0].path} {resp.status_code}"
    except httpx.HTTPError as exc:
        return f"GET {probes[0].path}: no answer ({type(exc).__name__})"


# A prefix-cache reset refused because the engine is still busy (SGLang 400, vLLM
# {"success": false} while blocks are held) is tried this many times, this far apart.
CACHE_RESET_TRIES = 3
CACHE_RESET_RETRY_S = 0.5
CACHE_RESET_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class ResetProblem:
    """Why a prefix-cache reset did not happen: ``missing`` when the engine serves no such path
    in this launch (404; ``text`` is then the plugin's hint), else the answer it gave."""

    text: str
    missing: bool = False


async def reset_prefix_cache(pm: PluginManager, engine: str, launch: LaunchSpec, base_url: str,
                             env: dict[str, str] | None = None) -> ResetProblem | None:
    """Empty the engine's prefix cache through its ``cache_reset`` engine method; None when it
    was reset or the engine declares no reset (nothing to do), else what went wrong. ``env``:
    the lab's environment (an API key there is sent as the engine's clients send it)."""
    import httpx

    # off the event loop: a plugin's hook may take up to its deadline (perflab.contract.hookspecs)
    reset = await anyio.to_thread.run_sync(lambda: pm.engines[engine].engine.cache_reset(launch) if engine in pm.engines else None)
    if reset is None:
        return None
    url = base_url.rstrip("/") + reset.path
    what = f"{reset.method} {reset.path}"
    headers = redact.auth_headers(launch.argv, {**(env or {}), **launch.env})
    problem = ResetProblem(f"{what}: not tried")
    async with httpx.AsyncClient(timeout=CACHE_RESET_TIMEOUT_S, trust_env=False) as client:
        for attempt in range(CACHE_RESET_TRIES):
            if attempt:
                await anyio.sleep(CACHE_RESET_RETRY_S)
            try:
                resp = await client.request(reset.method, url, headers=headers)
            except httpx.HTTPError as exc:
                return ResetProblem(f"{what}: no answer ({type(exc).__name__}: {exc})")
            if resp.status_code == 404:
                return ResetProblem(reset.missing_hint or f"{what}: 404 (the engine serves no such path)", missing=True)
            refused = resp.status_code >= 300
            if not refused and reset.success_field is not None:
                try:
                    body = resp.json()
                except ValueError:
                    body = None
                refused = not (isinstance(body, dict) and body.get(reset.success_field) is True)
            if not refused:
                return None
            problem = ResetProblem(f"{what}: {resp.status_code} {resp.text.strip()[:200]!r}")
    return problem


@dataclass(frozen=True)
class StallCause(CrashCause):
    """A stalled benchmark's cause: a CrashCause with the engines' health when it fired."""

    health: str = ""


async def _stall_cause(instances: Sequence[Any], stall: Any) -> StallCause:
    """The engine's last log line and its health when the watchdog fired (the engines were
    alive: a dead one is "crashed")."""
    inst = instances[0]
    health = "; ".join([await _health(i) for i in instances])
    return StallCause("benchmark-stalled", stall.message(), line=_last_log_line(inst.outcome.log),
                      hint=f"the engine is alive; health: {health}", health=health)


# ---------------------------------------------------------------------- repeats, loads, search

def mean_metrics(runs: Sequence[Mapping[str, Any]]) -> BenchMetrics:
    """The repeats' metrics: numeric keys averaged, the others from the first repeat."""
    out = dict(runs[0])
    for key, value in runs[0].items():
        values: list[Any] = [r.get(key) for r in runs]
        if isinstance(value, (int, float)) and not isinstance(value, bool) and all(
                isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            out[key] = statistics.fmean(float(v) for v in values)
    return BenchMetrics.from_json(out)


def relative_noise(runs: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Relative sample standard deviation in % per numeric metric across repeats (empty
    with fewer than two; a metric whose mean is 0 or not finite is left out)."""
    if len(runs) < 2:
        return {}
    out: dict[str, float] = {}
    for key in runs[0]:
        values: list[Any] = [r.get(key) for r in runs]
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            continue
        floats = [float(v) for v in values]
        mean = statistics.fmean(floats)
        if mean == 0 or not math.isfinite(mean) or not all(math.isfinite(v) for v in floats):
            continue
        out[key] = round(statistics.stdev(floats) / abs(mean) * 100, 3)
    return out


def _load_value(kind: LoadKind, value: float) -> float | int:
    return int(value) if kind is LoadKind.MAX_CONCURRENCY else float(value)


def point_name(kind: LoadKind, value: float) -> str:
    """A curve's load point as the store keys it: ``max_concurrency=16``, ``request_rate=2.5``."""
    return f"{kind}={_load_value(kind, value):g}"


def at_load(profile: Profile, kind: LoadKind, value: float) -> Profile:
    """``profile`` with its ``max_concurrency`` or ``request_rate`` replaced (no sweep)."""
    if kind is LoadKind.MAX_CONCURRENCY:
        return dataclasses.replace(profile, max_concurrency=int(value), sweep=None)
    return dataclasses.replace(profile, request_rate=float(value), sweep=None)


def start_load(profile: Profile, kind: LoadKind) -> float:
    """Where the max-load search starts: the profile's own load on the axis when it sets
    one, else 1 (one concurrent request, one request per second)."""
    if kind is LoadKind.MAX_CONCURRENCY:
        return float(profile.max_concurrency or 1)
    return profile.request_rate if math.isfinite(profile.request_rate) and profile.request_rate > 0 else 1.0


def slo_margin(slo: Slo, metrics: Mapping[str, Any] | None) -> float:
    """How far the worst limit is from being met: max(measured / limit) − 1 (<= 0: every
    limit met; a missing figure counts as failing by 100 %)."""
    worst = -math.inf
    for check in slo.check(metrics):
        worst = max(worst, check.measured / check.limit - 1 if check.measured is not None else 1.0)
    return worst if worst > -math.inf else -1.0


#: the max-load search's probe budget (launch included, each probe is one benchmark run at one
#: load, times ``repeats``)
MAX_PROBES = 8
RATE_TOLERANCE = 0.1  # the request-rate search ends when the bracket is within 10 %
BRACKET_FACTOR = 4  # the bracket grows (or shrinks) by this factor per probe: 1 -> 1024 in 5 probes


async def search_loads(probe: Callable[[float], Awaitable[float | None]], kind: LoadKind, start: float,
                       num_prompts: int, budget: int = MAX_PROBES) -> float | None:
    """The highest load meeting the SLO, in at most ``budget`` probes.

    ``probe(load)`` measures one load and returns the SLO margin (<= 0: met; None: the engine
    failed — the search ends). vLLM's ``vllm bench sweep serve_sla`` (vllm/benchmarks/sweep/
    serve_sla.py, ``solve_sla``) probes the largest then the smallest value and then the root
    of a PCHIP interpolation of the margins until the passing and failing values are 1 apart;
    perflab brackets instead, because a probe at the largest value (65536 requests/s) is the
    most expensive and the least informative one:

    1. bracket: from ``start``, multiply by :data:`BRACKET_FACTOR` while the SLO is met (up
       to ``num_prompts`` concurrent requests: more cannot be in flight), or divide while it
       fails (down to 1 concurrent request, or ``start``/64 requests/s);
    2. interpolate: between the highest met load and the lowest failing one, probe where the
       straight line through their margins crosses 0 (kept off the bracket's outer tenths,
       so it always shrinks), until the bracket is 1 concurrent request wide or
       within :data:`RATE_TOLERANCE` for request rates, or the budget is spent.

    Returns the highest load that met the SLO (None when none did)."""
    integer = kind is LoadKind.MAX_CONCURRENCY
    lowest = 1.0 if integer else start / 64
    highest = float(max(1, num_prompts)) if integer else math.inf
    margins: dict[float, float] = {}
    used = 0

    async def measure(value: float) -> float | None:
        nonlocal used
        used += 1
        got = await probe(value)
        if got is not None:
            margins[value] = got
        return got

    def norm(v: float) -> float:
        return float(max(1, round(v))) if integer else float(f"{v:.3g}")  # rates to 3 significant digits

    value = norm(min(max(start, lowest), highest))
    m = await measure(value)
    if m is None:
        return None
    lo: float | None = value if m <= 0 else None
    hi: float | None = value if m > 0 else None
    while used < budget:  # bracket
        if lo is not None and hi is None:
            nxt = norm(min(lo * BRACKET_FACTOR, highest))
            if nxt <= lo:
                break
        elif hi is not None and lo is None:
            nxt = norm(max(hi / BRACKET_FACTOR, lowest))
            if nxt >= hi:
                break
        else:
            break
        m = await measure(nxt)
        if m is None:
            return max((v for v, g in margins.items() if g <= 0), default=None)
        if m <= 0:
            lo = nxt if lo is None else max(lo, nxt)
        else:
            hi = nxt if hi is None else min(hi, nxt)
    while used < budget and lo is not None and hi is not None:  # interpolate
        if (integer and hi - lo <= 1) or (not integer and hi <= lo * (1 + RATE_TOLERANCE)):
            break
        mlo, mhi = margins[lo], margins[hi]
        guess = lo + (hi - lo) * (0 - mlo) / (mhi - mlo) if math.isfinite(mhi) and mhi != mlo else (lo + hi) / 2
        guess = min(max(guess, lo + (hi - lo) / 10), hi - (hi - lo) / 10)
        nxt = norm(guess)
        if integer:
            nxt = min(max(nxt, lo + 1), hi - 1)
        m = await measure(nxt)
        if m is None:
            break
        if m <= 0:
            lo = nxt
        else:
            hi = nxt
    return lo


class Executor:
    """Runs configurations; ``on_event(kind, **fields)`` hears about each stage."""

    def __init__(self, ctx: LabContext, on_event: Event | None = None, on_measured: Measured | None = None) -> None:
        self.ctx = ctx
        self.on_event = on_event or (lambda kind, **kw: None)
        # on_measured(profile name, measurement) hears each profile's measurement as soon as it
        # exists, before the run goes on to the next profile: the runner stores it at once, so
        # an interrupt later in the same launch cannot lose it
        self.on_measured = on_measured
        # benchmark threads that did not stop within BENCH_STOP_S of their cancellation (a
        # last resort: they stop by themselves); the next launch waits for them, so they
        # cannot send requests to its (maybe same) port
        self._stale: list[threading.Event] = []
        # engines whose launches serve no prefix-cache reset, already noted in the study log
        self._reset_noted: set[str] = set()
        # the devices a backend placed this run on (perflab.lab.run.backends.local.LocalBackend's ledger),
        # used as the configuration's devices when it pins none; None: the engine's default
        self.placement: tuple[int, ...] | None = None
        # a multi-node configuration's nodes as a backend placed them (the Ray backend: one
        # node per rank, rank 0 this one, the others started by their node's agent); None: the
        # ranks are processes on this machine (perflab.supervisor_group.local_nodes)
        self.group: GroupPlacement | None = None
        # the study an engine's PERFLAB_INSTANCE marker names (perflab ps / kill); None: the run
        # directory's <study>/runs/<run> — a Ray agent runs into a staging directory on its node
        # (perflab.lab.run.backends.shipping) and names the driver's study
        self.study_dir: Path | None = None
        # the accelerators' telemetry sources, opened once a study (when first sampled); what
        # is missing is said once; a backend shares one among its runs' executors
        self._telemetry: Telemetry | None = None
        # the load points an interrupted run of this configuration finished, by profile name
        # then point (Store.points): a resumed curve measures only the others
        self.known_points: Mapping[str, Mapping[str, ProfileMeasurement]] = {}
        # hears each load point of a curve as soon as it is measured (the runner stores it: an
        # interrupt mid-curve keeps it) or reused from known_points (counted as reused)
        self.on_point: PointMeasured | None = None
        # what measures a plan's accuracy gate (the harness and the agreement client); tests replace it
        self.accuracy_runner: AccuracyRunner = AccuracyRunner()
        # the engine time of the launch in progress (run() starts one per launch)
        self._clock = LaunchClock()

    @property
    def telemetry(self) -> Telemetry:
        if self._telemetry is None:
            self._telemetry = Telemetry(self.ctx.env, self.ctx.hardware.accelerators)
        return self._telemetry

    @telemetry.setter
    def telemetry(self, value: Telemetry) -> None:
        self._telemetry = value

    def _describer(self, engine: str) -> Callable[[str, str], list[str] | None] | None:
        return plugin_file_describer(self.ctx.pm, engine)

    async def _settle(self) -> None:
        for done in list(self._stale):  # the list may be shared with concurrent runs (perflab.lab.run.backends.local)
            await anyio.to_thread.run_sync(done.wait, abandon_on_cancel=True)
            if done in self._stale:
                self._stale.remove(done)

    def _env(self) -> dict[str, str]:
        return launch_environment(self.ctx)

    def _device_sets(self, config: Configuration) -> list[tuple[int, ...]] | None:
        kinds = self.ctx.pm.engine(config.engine).info.accelerators
        pool = tuple(a.index for a in self.ctx.hardware.accelerators if a.kind in kinds)
        sc = config.serve_config()
        return replica_devices(config.replicas, sc.world_size, pool, sc.devices if sc.devices is not None else self.placement)

    def _script_without_launch(self, config: Configuration, device_sets: list[tuple[int, ...]] | None, run_dir: Path) -> str | None:
        """A refused configuration still shows what it would have run, when the plugin can build it."""
        try:
            spec = self.ctx.pm.engine(config.engine).build_launch(
                config.serve_config(devices=device_sets[0] if device_sets else None), self.ctx.hardware, run_dir,
                self.ctx.versions.get(config.engine))
        except Exception:  # a plugin that cannot express it (UnsupportedOption): no script to show
            return None
        return serving_script([spec], self._describer(config.engine), run_dir)

    async def run(self, config: Configuration, profiles: Sequence[Profile], run_dir: Path, *, label: str = "",
                  to_beat: float | None = None, accuracy: AccuracyJob | None = None) -> RunRecord:
        """Launch ``config``, benchmark ``profiles`` in order, tear down; the returned record
        holds each profile's measurement (each also goes to :attr:`on_measured` at once) and
        the engine-seconds the launch held its accelerators. ``to_beat``: the current best's
        ranking figure on the main profile, for the early stop (None: it cannot have lost).
        ``accuracy``: in the same launch, after the profiles (while the engine serves and the
        main profile was measured, stopped early included), the plan's accuracy measurement
        (stored as the measurement :data:`~perflab.lab.accuracy.ACCURACY_PROFILE`); never
        stopped early, and its time is the launch's, so engine-hours count it."""

        engine = config.engine
        version = self.ctx.versions.get(engine)
        await self._settle()
        write_json(run_dir / "config.json", {"label": label, **config.canonical(),
                                            "profiles": [p.name for p in profiles]})
        write_json(run_dir / "hardware.json", to_jsonable(self.ctx.hardware))
        try:
            device_sets = self._device_sets(config)
        except ValueError as exc:
            rec = RunRecord(Status.UNSUPPORTED, version=version,
                            reasons=(Unsupported(f"replicas={config.replicas}", str(exc), source="perflab"),))
            rec.script = self._script_without_launch(config, None, run_dir)
            self._write_outcome(run_dir, rec, [])
            return rec

        rec = RunRecord(Status.DONE, version=version)
        profiles = self._refuse_too_long(rec, config, profiles)
        if not profiles and (accuracy is None or rec.measurements):  # no workload fits the context: nothing to launch
            rec.state = Status.UNSUPPORTED
            rec.reasons = tuple(Unsupported("context", m.error or "", source="perflab") for m in rec.measurements.values())
            rec.script = self._script_without_launch(config, device_sets, run_dir)
            self._write_outcome(run_dir, rec, [])
            return rec
        await self._machine_ready(config, device_sets, label)
        instances: list[Any] = []
        rec.accelerators = max(1, sum(len(v) for v in self._devices_by_kind(config, device_sets).values()))
        if self.group is not None and config.serve_config().node_count > 1:  # every node's devices
            rec.accelerators = max(1, sum(len(n.devices or ()) for n in self.group.nodes))
        picked = config.serve_config().port is None  # perflab picks a free port for each launch
        spent = 0.0  # engine seconds of this configuration's launches
        for attempt in range(1, PORT_LOST_LAUNCHES + 1):
            launched = time.monotonic()
            self._clock = LaunchClock()
            try:
                await self._launch_and_measure(rec, instances, config, profiles, device_sets, run_dir, label, to_beat,
                                               accuracy)
            finally:
                spent += self._clock.engine_seconds(time.monotonic() - launched,
                                                    self.ctx.time_scale if self.ctx.simulated else None)
                rec.engine_seconds = spent * rec.accelerators
            rec.leftovers = [f"{engine} replica {i + 1}: {msg}" if len(instances) > 1 else msg
                             for i, inst in enumerate(instances) for msg in inst.outcome.leftovers]
            if not _lost_its_port(rec) or not picked or attempt == PORT_LOST_LAUNCHES or rec.leftovers:
                break
            # another process took the free port perflab had chosen for it between the pick and
            # the engine's bind: the machine's doing, not the configuration's — once more on a
            # fresh port (the engine log keeps both launches)
            log.warning("lab.port-lost", label=label, engine=engine, attempt=attempt, line=rec.cause.line if rec.cause else None)
            self.on_event("relaunch", label=label, engine=engine, why="the engine lost its port to another process")
            rec = RunRecord(Status.DONE, version=version, engine_seconds=rec.engine_seconds, accelerators=rec.accelerators,
                            measurements={k: m for k, m in rec.measurements.items() if m.status is Status.UNSUPPORTED})
            instances = []
        if rec.cause is not None and rec.cause.name == "port-in-use":
            # the supervisor found the port taken by someone else: the machine, not the
            # configuration, is at fault — nothing was started, nothing is a result
            rec.state, rec.error = Status.INTERRUPTED, f"the machine is not ready: {rec.cause.explanation}"
        elif _lost_its_port(rec):
            # the engine could not bind its port although it was free when chosen: a port the
            # plan fixes, or a fresh one lost again — an environment fault, never a result
            what = ("the port the plan fixes was taken by another process when the engine bound it" if not picked
                    else "the engine lost the port perflab chose for it to another process"
                    + (", again on a fresh port" if attempt > 1 else ""))
            line = f" ({rec.cause.line})" if rec.cause is not None and rec.cause.line else ""
            rec.state, rec.error = Status.INTERRUPTED, f"the machine is not ready: {what}{line}"
        self._write_outcome(run_dir, rec, instances)
        return rec

    async def _launch_and_measure(self, rec: RunRecord, instances: list[Any], config: Configuration,
                                  profiles: Sequence[Profile], device_sets: list[tuple[int, ...]] | None, run_dir: Path,
                                  label: str, to_beat: float | None, accuracy: AccuracyJob | None = None) -> None:
        """Launch every replica, benchmark, tear down (the exit stack)."""
        from perflab.supervisor import EngineInstance
        from perflab.supervisor_group import EngineGroup

        plan = self.ctx.plan
        engine = config.engine
        version = self.ctx.versions.get(engine)
        async with AsyncExitStack() as stack:
            # the accelerators' telemetry, held until every replica is torn down (the stack
            # unwinds it last, on a crash or a cancellation too): the last launch to let it go
            # shuts NVML down
            stack.enter_context(self.telemetry.held())
            for i, devices in enumerate(device_sets or [None]):
                workdir = run_dir if not device_sets or len(device_sets) == 1 else run_dir / f"replica-{i + 1}"
                self.on_event("launch", label=label, engine=engine, replica=i + 1, replicas=config.replicas)
                sc = config.serve_config(devices=devices)
                # nodes > 1: one process per node rank, supervised as one engine (perflab.supervisor_group)
                group = sc.node_count > 1
                kind = EngineGroup if group else EngineInstance
                placed: dict[str, Any] = ({"nodes": self.group.nodes, "start_rank": self.group.start_rank}
                                          if group and self.group is not None else {})
                if plan.timeouts.teardown_s is not None:
                    placed["grace"] = plan.timeouts.teardown_s
                env = self._env()
                if self.ctx.simulated:  # where a simulated engine that fails to start says what its start cost
                    env[LIFECYCLE_FILE_ENV] = str(workdir / LIFECYCLE_FILE)
                    self._clock.reported = self._clock.reported or workdir / LIFECYCLE_FILE
                inst = kind(
                    self.ctx.pm, engine, sc, hardware=self.ctx.hardware,
                    env=env, workdir=workdir, startup_timeout=plan.timeouts.startup_s, version=version,
                    # the engine's PERFLAB_INSTANCE marker names its study and run (perflab ps / kill);
                    # run_dir is <study>/runs/<NNN-label> (Store.begin_run), or its stage on a node
                    scope=(self.study_dir or run_dir.parent.parent, run_dir.name if workdir == run_dir else f"{run_dir.name}.{workdir.name}"),
                    **placed,
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
                # the engine's caveats (preflight's warnings: transformers serve's output lengths
                # are counted, not forced) travel with its result into the report
                rec.reasons = tuple(dict.fromkeys(w for inst in instances for w in inst.outcome.warnings))
                rec.script = launches_script(instances, self._describer(engine), run_dir)
                await self._benchmark_all(rec, instances, config, profiles, run_dir, label, to_beat)
                main = rec.measurements.get(plan.main_profile)
                if accuracy is not None and rec.state is Status.DONE and (main is None or main.status.measured):
                    # after the profiles, which measure a fresh engine (as a study without the gate
                    # does); a main profile stopped early is measured, so that configuration is
                    # scored too (the early stop never stops this)
                    began = time.monotonic()
                    try:
                        await self._accuracy(rec, instances, config, accuracy, run_dir, label)
                    finally:  # on no model clock: its wall time counts (x the time scale on the simulator)
                        self._clock.unclocked_s += time.monotonic() - began
            self.on_event("teardown", label=label, engine=engine)

    def _invisible_holders(self, by_kind: dict[str, list[int]]) -> list[Any]:
        """Device memory in use that no visible process holds (:func:`invisible_holders`)."""
        from perflab.hardware import probe
        from perflab.lab.store.integrity import invisible_holders

        return invisible_holders(self.ctx.hardware.accelerators, probe(self.ctx.pm, self.ctx.env).accelerators, by_kind)

    def _refuse_too_long(self, rec: RunRecord, config: Configuration, profiles: Sequence[Profile]) -> list[Profile]:
        """Refuse (as unsupported measurements, with the reason) the profiles whose prompt +
        output exceed the configuration's context limit; return the others."""
        from perflab.lab.run.preflight import model_context, too_long

        model = config.serve_config().model
        ctx_len = model_context(model, simulated=self.ctx.simulated, env=self.ctx.env)
        refused = too_long(config, list(profiles), ctx_len)
        for p in profiles:
            if p.name in refused:
                m = ProfileMeasurement(Status.UNSUPPORTED, num_prompts=p.num_prompts, error=refused[p.name])
                rec.measurements[p.name] = m
                log.warning("lab.profile-refused", profile=p.name, engine=config.engine, why=refused[p.name])
                if self.on_measured is not None:
                    self.on_measured(p.name, m)
        return [p for p in profiles if p.name not in refused]

    def _devices_by_kind(self, config: Configuration, device_sets: list[tuple[int, ...]] | None) -> dict[str, list[int]]:
        kinds = self.ctx.pm.engine(config.engine).info.accelerators
        out: dict[str, list[int]] = {}
        for kind in kinds:
            pool = [a.index for a in self.ctx.hardware.accelerators if a.kind == kind]
            if not pool:
                continue
            if device_sets:
                wanted = sorted({d for ds in device_sets for d in ds})
            else:  # the engine's default selection: the first world_size visible devices
                wanted = pool[: max(1, config.serve_config().world_size)]
            out[kind] = [d for d in wanted if d in pool]
        return out

    async def _machine_ready(self, config: Configuration, device_sets: list[tuple[int, ...]] | None, label: str) -> None:
        """Wait (timeouts.device_wait_s) until no other process holds the devices or the fixed
        port this launch needs; else raise MachineNotReady naming the holders."""
        from perflab.lab.store.integrity import device_holders, wait_until_ready

        by_kind = self._devices_by_kind(config, device_sets)
        port = config.serve_config().port
        ports = [port] if port else []
        host = config.serve_config().host or "127.0.0.1"

        def check() -> list[Any]:
            found = device_holders(self.ctx.env, by_kind, ports, host)
            if not found and not self.ctx.simulated:
                found = self._invisible_holders(by_kind)
            return found

        def waiting(holders: list[Any]) -> None:
            self.on_event("waiting", label=label, holders=[h.describe() for h in holders])
            log.warning("lab.machine-busy", label=label, holders=[h.describe() for h in holders],
                        wait_s=self.ctx.plan.timeouts.device_wait_s)

        await wait_until_ready(check, self.ctx.plan.timeouts.device_wait_s, waiting)

    @staticmethod
    def _stopped_deliberately(rec: RunRecord, run_dir: Path) -> bool:
        """Whether the engine that just died was stopped by ``perflab kill`` (it writes
        :data:`perflab.lifecycle.procs.STOP_REQUEST` into the run directory before any signal):
        then the run is ``interrupted`` with that reason — a stop perflab was told about, never
        the configuration's crash, never reused."""
        from perflab.lifecycle.procs import stop_requested

        why = stop_requested(run_dir)
        if why is None:
            return False
        log.warning("lab.stopped-deliberately", run_dir=str(run_dir), why=why)
        rec.state, rec.error, rec.cause = Status.INTERRUPTED, why, None
        return True

    def _record_startup_failure(self, rec: RunRecord, o: Any, config: Configuration,
                                device_sets: list[tuple[int, ...]] | None, run_dir: Path) -> None:
        if self._stopped_deliberately(rec, run_dir):
            rec.script = serving_script([o.launch], self._describer(config.engine), run_dir) if o.launch else None
            return
        state = Status(o.state) if Status(o.state).is_failure else Status.CRASHED
        rec.state = state
        rec.reasons = tuple(o.reasons)
        rec.cause = o.cause
        if o.launch is not None:
            rec.script = serving_script([o.launch], self._describer(config.engine), run_dir)
        else:
            rec.script = self._script_without_launch(config, device_sets, run_dir)
        if state is Status.CRASHED and rec.cause is None:
            rec.error = "the engine stopped before it served"

    async def _benchmark_all(self, rec: RunRecord, instances: list[Any], config: Configuration,
                             profiles: Sequence[Profile], run_dir: Path, label: str, to_beat: float | None) -> None:
        for profile in profiles:
            m = await self._measure(instances, config, profile, run_dir, label,
                                    to_beat if profile.name == self.ctx.plan.main_profile else None)
            if m.status is Status.CRASHED and self._stopped_deliberately(rec, run_dir):
                break  # not this profile's result: nothing is recorded for it
            rec.measurements[profile.name] = m
            if self.on_measured is not None:
                self.on_measured(profile.name, m)
            if m.status in (Status.CRASHED, Status.STALLED):  # the engine is dead or stuck
                rec.state = m.status
                rec.cause = m.cause
                break  # the rest of the profiles need a fresh launch

    async def _accuracy(self, rec: RunRecord, instances: list[Any], config: Configuration, job: AccuracyJob,
                        run_dir: Path, label: str) -> None:
        """The plan's accuracy measurement on the first replica (:func:`perflab.lab.accuracy.measure`),
        stored as the measurement :data:`ACCURACY_PROFILE`. The endpoint failing is this run's
        failure, as a benchmark's would be; the engine dying ends the run crashed."""
        from perflab.accuracy.harness import AccuracyUnavailable
        from perflab.contract.errors import UsageError
        from perflab.lab import accuracy as acc

        inst = instances[0]
        launch = inst.launch
        api_key = redact.api_key(launch.argv, {**self._env(), **launch.env}) or None
        model = launch.served_model_name or config.serve_config().model
        dead: list[Any] = []
        record: dict[str, Any] | None = None
        error: str | None = None

        def stage(text: str) -> None:
            self.on_event("accuracy", label=label, what=text)
            log.info("lab.accuracy", label=label, stage=text)

        async with anyio.create_task_group() as tg:

            async def watch(i: Any) -> None:
                await i.died.wait()
                dead.append(i)
                tg.cancel_scope.cancel()  # nothing answers a dead engine's port

            for i in instances:
                tg.start_soon(watch, i)
            try:
                with anyio.fail_after(job.spec.timeout_s):
                    record = await acc.measure(job, self.accuracy_runner, inst.base_url, model, api_key=api_key,
                                               simulated=self.ctx.simulated, on_stage=stage)
            except (AccuracyUnavailable, UsageError):
                raise  # perflab's environment or the plan, never the configuration's result
            except TimeoutError:
                error = f"the accuracy measurement did not finish within {job.spec.timeout_s:g} s"
            except Exception as exc:  # the endpoint failed it: this run's failure
                error = redact.scrub(f"the accuracy measurement failed: {type(exc).__name__}: {exc}")
            tg.cancel_scope.cancel()
        if dead:
            m = ProfileMeasurement(Status.CRASHED, cause=dead[0].outcome.cause,
                                   error="the engine died during the accuracy measurement")
            rec.state, rec.cause = Status.CRASHED, m.cause
        elif record is None:
            m = ProfileMeasurement(Status.FAILED, error=error or "the accuracy measurement was cancelled")
            log.warning("lab.accuracy-failed", label=label, error=m.error)
        else:
            m = ProfileMeasurement(Status.OK, metrics=BenchMetrics.from_json(record), num_prompts=(record.get("eval") or {}).get("samples"))
        rec.measurements[ACCURACY_PROFILE] = m
        if self.on_measured is not None:
            self.on_measured(ACCURACY_PROFILE, m)

    # ------------------------------------------------------------------ what one profile measures

    async def _measure(self, instances: list[Any], config: Configuration, profile: Profile, run_dir: Path, label: str,
                       to_beat: float | None) -> ProfileMeasurement:
        """One profile's measurement: the max-load search (the main profile, ``decide_by:
        max-load``), a sweep (``profile.sweep``), or one load point — each with its repeats."""
        decision = self.ctx.plan.decision
        if decision.decide_by is DecideBy.MAX_LOAD and profile.name == self.ctx.plan.main_profile:
            return await self._search(instances, config, profile, run_dir, label)
        if profile.sweep is not None:
            return await self._sweep(instances, config, profile, run_dir, label)
        # only a throughput ranking gives a figure the steady-state token rate can lose to
        beat = to_beat if decision.decide_by is DecideBy.THROUGHPUT else None
        return await self._repeated(instances, config, profile, run_dir, label, to_beat=beat)

    async def _repeated(self, instances: list[Any], config: Configuration, profile: Profile, run_dir: Path, label: str,
                        *, to_beat: float | None = None, tag: str = "") -> ProfileMeasurement:
        """``plan.decision.repeats`` runs of one load point in this launch: the mean as
        ``metrics``, each repeat's metrics and the relative noise; a repeat that fails or
        stops early ends it (with what the repeats before it measured)."""
        n = self.ctx.plan.decision.repeats
        runs: list[dict[str, Any]] = []
        for i in range(n):
            suffix = tag + (f"-r{i + 1}" if n > 1 else "")
            m = await self._benchmark(instances, config, profile, run_dir, label, to_beat=to_beat, suffix=suffix)
            if m.status is not Status.OK:
                m.repeats = [*runs, m.metrics.to_json()] if m.metrics is not None and n > 1 else runs
                return m
            runs.append(metrics_json(m.metrics) or {})
        if n == 1:
            return m
        return ProfileMeasurement(Status.OK, metrics=mean_metrics(runs), num_prompts=profile.num_prompts,
                                  error=m.error, repeats=runs, noise=relative_noise(runs), observed=m.observed)

    async def _load_point(self, instances: list[Any], config: Configuration, profile: Profile, kind: LoadKind,
                          value: float, run_dir: Path, label: str) -> ProfileMeasurement:
        """One load point of ``profile``'s curve with its repeats: the one an interrupted run
        finished (:attr:`known_points`), else measured now; either way :attr:`on_point` hears it."""
        import copy

        name = point_name(kind, value)
        known = self.known_points.get(profile.name, {}).get(name)
        if known is not None:
            log.info("lab.point-reused", label=label, profile=profile.name, point=name)
            self.on_event("point-reused", label=label, profile=profile.label, point=name)
            m = copy.deepcopy(known)  # the curve's own copy: a failure's points are set on it
        else:
            m = await self._repeated(instances, config, at_load(profile, kind, value), run_dir, label,
                                     tag=f"-{kind}-{value:g}")
        if m.status.measured and self.on_point is not None:
            self.on_point(profile.name, name, m, known is not None)
        return m

    def _point(self, kind: LoadKind, value: float, m: ProfileMeasurement) -> dict[str, Any]:
        slo = self.ctx.plan.decision.slo
        met = None
        if slo:
            met = m.status is Status.OK and slo.met(m.metrics)
        return {"load": {str(kind): _load_value(kind, value)}, "metrics": metrics_json(m.metrics), "repeats": m.repeats,
                "noise": m.noise, "slo_met": met, "status": str(m.status), "stopped_early": m.stopped_early,
                "error": m.error}

    async def _sweep(self, instances: list[Any], config: Configuration, profile: Profile, run_dir: Path,
                     label: str) -> ProfileMeasurement:
        """The profile at each load of its sweep, lowest first, in this launch. A point that
        is over-saturated (early stop) ends the curve: higher loads only saturate more."""
        assert profile.sweep is not None
        kind = profile.sweep.kind
        points: list[dict[str, Any]] = []
        best: ProfileMeasurement | None = None
        stopped: dict[str, Any] | None = None
        for value in sorted(profile.sweep.values):
            m = await self._load_point(instances, config, profile, kind, value, run_dir, label)
            points.append(self._point(kind, value, m))
            if m.status is Status.OK:
                best = m
            elif m.status is Status.STOPPED_EARLY:
                stopped = {**(m.stopped_early or {}), "load": {str(kind): _load_value(kind, value)}}
                break
            else:  # the engine died or the benchmark failed: the curve ends with it
                m.points = points
                return m
        top = best or m
        return ProfileMeasurement(top.status, metrics=top.metrics, num_prompts=profile.num_prompts, error=top.error,
                                  repeats=top.repeats, noise=top.noise, points=points, stopped_early=stopped,
                                  observed=top.observed)

    async def _search(self, instances: list[Any], config: Configuration, profile: Profile, run_dir: Path,
                      label: str) -> ProfileMeasurement:
        """The max-load search (see :func:`search_loads`): the highest load of
        ``plan.decision.search`` whose percentile meets the SLO, in this launch."""
        decision = self.ctx.plan.decision
        kind, slo = decision.search, decision.slo
        done: dict[float, ProfileMeasurement] = {}
        failure: list[ProfileMeasurement] = []

        async def probe(value: float) -> float | None:
            """The SLO margin at ``value`` (<= 0: met); None: the engine failed, stop."""
            m = await self._load_point(instances, config, profile, kind, value, run_dir, label)
            done[value] = m
            if not m.status.measured:
                failure.append(m)
                return None
            return slo_margin(slo, m.metrics) if m.status is Status.OK else math.inf

        capacity = await search_loads(probe, kind, start_load(profile, kind), profile.num_prompts)
        points = [self._point(kind, v, done[v]) for v in sorted(done)]
        if failure:
            m = failure[0]
            m.points = points
            return m
        chosen = done[capacity] if capacity is not None else done[min(done)]
        status = Status.OK if chosen.status is Status.OK else chosen.status
        return ProfileMeasurement(status, metrics=chosen.metrics, num_prompts=profile.num_prompts, error=chosen.error,
                                  repeats=chosen.repeats, noise=chosen.noise, points=points,
                                  capacity=_load_value(kind, capacity) if capacity is not None else None,
                                  stopped_early=chosen.stopped_early, observed=chosen.observed)

    def _bench_request(self, instances: list[Any], config: Configuration, profile: Profile, label: str) -> Any:
        plan = self.ctx.plan
        launch = instances[0].launch
        req = profile.bench_request(
            # the model itself (a local directory gives the client its exact tokenizer) and
            # the name it is served under (sent in every request)
            config.serve_config().model, launch.served_model_name,
            base_urls=tuple(inst.base_url for inst in instances),
            headers=tuple(redact.auth_headers(launch.argv, {**self._env(), **launch.env}).items()),
            time_scale=self.ctx.time_scale if self.ctx.simulated else 1.0,
            server_clock=self.ctx.simulated,  # model-clock stamps: reproducible simulated numbers
            label=label,
            # only the request extensions the engine's server takes (transformers serve: none)
            extensions=self.ctx.pm.engine(config.engine).bench_extensions() if config.engine in self.ctx.pm.engines else None,
        )
        if plan.timeouts.stall_s is not None:  # engine seconds; default: the bench's (60)
            req = req.replace(stall_s=plan.timeouts.stall_s)
        slo = plan.decision.slo
        if slo:  # the SLO's percentile in the metrics (p99_tpot_ms ...) and vLLM's goodput
            metrics = tuple(dict.fromkeys((*req.percentile_metrics, *(k.removesuffix("_ms").split("_")[0]
                                                                       for k in slo.limits()))))
            req = req.replace(percentiles=tuple(sorted({*req.percentiles, float(slo.percentile)})),
                              percentile_metrics=metrics, goodput=slo.goodput())
        guards = plan.decision.guards
        if guards:  # the percentiles and latency kinds the plan's guards read
            req = req.replace(percentiles=tuple(sorted({*req.percentiles, *guards.percentiles()})),
                              percentile_metrics=tuple(dict.fromkeys((*req.percentile_metrics, *guards.metrics()))))
        return req

    async def _benchmark(self, instances: list[Any], config: Configuration, profile: Profile, run_dir: Path,
                         label: str, *, to_beat: float | None = None, suffix: str = "") -> ProfileMeasurement:
        from perflab.bench import BenchCancelled, run_benchmark_sync
        from perflab.bench.cancel import signalling_end, wait_set

        plan = self.ctx.plan
        req = self._bench_request(instances, config, profile, label)
        req = await self._prepare_measurement(instances, config.engine, profile, req, label)
        shown = profile.label + (f" ({suffix.strip('-').replace('-', ' ')})" if suffix else "")
        self.on_event("benchmark", label=label, profile=shown, done=0, total=profile.num_prompts)

        def progress(done: int, total: int) -> None:
            self.on_event("progress", label=label, profile=shown, done=done, total=total)

        result: Any = None
        partial: Any = None  # a cancelled run's BenchResult (what it had measured)
        error: str | None = None
        dead: list[Any] = []
        timed_out = False
        cancel = threading.Event()
        finished = threading.Event()
        any_died = anyio.Event()
        budget = plan.timeouts.benchmark_s
        stopper = self._early_stop(profile, config, cancel, to_beat)
        bench_began = time.monotonic()
        watchers = self._watchers(instances, config)
        watching = Watching()
        # readings right where the timed run begins and ends: its energy from the devices'
        # counters, the engine's metrics over it (perflab.observe.timed_run)
        timed = TimedRun() if watchers else None
        work = signalling_end(finished, lambda: run_benchmark_sync(req, progress, cancel, stopper, timed))
        try:
            async with anyio.create_task_group() as tg:

                async def watch(inst: Any) -> None:
                    await inst.died.wait()
                    dead.append(inst)
                    cancel.set()  # no request reaches a dead engine's port any more
                    any_died.set()

                async def deadline() -> None:
                    nonlocal timed_out
                    await anyio.sleep(budget)
                    timed_out = True
                    cancel.set()

                for inst in instances:
                    tg.start_soon(watch, inst)
                if budget is not None:
                    tg.start_soon(deadline)
                # the engine's metrics and the accelerators' telemetry while it runs (issue #13)
                tg.start_soon(lambda: observe_watch(watchers, watching, time_scale=req.time_scale, timed=timed))
                try:
                    # abandon_on_cancel: a cancellation from outside (Ctrl-C) is not held up
                    # here; the `finally` below stops the client and waits for its thread
                    result = await anyio.to_thread.run_sync(work, abandon_on_cancel=True)
                except BenchCancelled as exc:
                    partial = exc.result
                except Exception as exc:  # a client failure is a result, not a study abort
                    error = f"{type(exc).__name__}: {exc}"
                if not dead and not timed_out and (error is not None or _has_failures(result)):
                    # failed requests may be the engine going down: let its exit be seen
                    with anyio.move_on_after(DEATH_GRACE_S):
                        await any_died.wait()
                tg.cancel_scope.cancel()
        finally:
            if not finished.is_set():  # cancelled from outside: stop the client, wait for it
                cancel.set()
                with anyio.CancelScope(shield=True):
                    if not await wait_set(finished, BENCH_STOP_S):
                        log.warning("lab.bench-still-running", label=label, profile=profile.name, waited_s=BENCH_STOP_S)
                        self._stale.append(finished)

        measured = result if result is not None else partial
        self._clock.benchmark(measured, time.monotonic() - bench_began)
        if stopper is not None and stopper.decided is not None and result is None and not dead and not timed_out:
            # stopped by the early stop: a measurement (what it had measured), never a failure
            metrics, info = stopped_early_record(stopper.decided, partial, profile.num_prompts)
            m = ProfileMeasurement(Status.STOPPED_EARLY, metrics=metrics, num_prompts=profile.num_prompts,
                                   stopped_early=info)
            log.info("lab.stopped-early", label=label, profile=profile.name, **stopper.decided)
        else:
            m = self._judge(profile, result, partial, error, dead, timed_out, budget)
        if m.status is Status.STALLED:
            m.cause = await _stall_cause(instances, result.stall)
        m.observed = self._observed(watchers, watching, m, config)
        if watching.samples:  # on the benchmark's own time axis: from its timed run's start, on the engines' clock
            write_json(run_dir / f"observe-{file_stem(profile.name)}{suffix}.json", watching.series_json(ENGINE_T))
        if stopper is not None and stopper.windows:  # what the early stop saw, for diagnosis
            write_json(run_dir / f"earlystop-{file_stem(profile.name)}{suffix}.json", stopper.to_json())
        if measured is not None:
            data: dict[str, Any] = {"profile": profile.name, "label": profile.label, "definition": profile.definition()}
            if m.status is not Status.OK:  # what a failed or stopped benchmark had measured, for diagnosis only
                data.update(status=m.status, cancelled=measured is partial, error=m.error)
            if m.stopped_early is not None:
                data["stopped_early"] = m.stopped_early
            data["metrics"] = measured.metrics.to_json()
            write_json(run_dir / f"bench-{file_stem(profile.name)}{suffix}.json", data)
        return m

    async def _prepare_measurement(self, instances: list[Any], engine: str, profile: Profile, req: Any,
                                   label: str) -> Any:
        """Before a measured benchmark: empty every replica's prefix cache, so that one measurement
        cannot warm the next (:func:`reset_prefix_cache`), and have the bench send the plan's
        ``warmup`` requests first, excluded from the results (the bench does it as
        ``vllm bench serve --num-warmups``: the workload's first prompt, that many times)."""
        for inst in instances:
            problem = await reset_prefix_cache(self.ctx.pm, engine, inst.launch, inst.base_url, self._env())
            if problem is None:
                continue
            if problem.missing:  # the engine serves no reset in this launch: said once a study
                if engine not in self._reset_noted:
                    self._reset_noted.add(engine)
                    log.warning("lab.cache-reset-unavailable", engine=engine, why=problem.text)
                continue
            log.warning("lab.cache-reset-failed", label=label, engine=engine, profile=profile.name, why=problem.text)
        return req.replace(warmup=self.ctx.plan.decision.warmup)

    def _watchers(self, instances: list[Any], config: Configuration) -> list[Watcher]:
        """What is sampled while a benchmark runs (:mod:`perflab.observe`)."""
        from perflab.observe.metrics import metrics_watchers

        watchers: list[Watcher] = []
        watchers += metrics_watchers(self.ctx.pm, config.engine, instances, self._env())  # server_metrics
        telemetry = self.telemetry.watcher(self._devices_by_kind(config, self._device_sets(config)))
        if telemetry is not None:  # the launch's accelerators: power, utilization, memory, clock
            watchers.append(telemetry)
        return watchers

    def _observed(self, watchers: Sequence[Watcher], watching: Watching, m: ProfileMeasurement,
                  config: Configuration) -> dict[str, Any]:
        """The measurement's ``observed``: each watcher's summary of its samples, and the energy
        and cost they and the benchmark's figures give (:mod:`perflab.observe.energy`)."""
        accelerators = max(1, sum(len(v) for v in self._devices_by_kind(config, self._device_sets(config)).values()))
        return {**watching.summaries(watchers),
                **observed_extras(watching.samples, m.metrics, self.ctx.plan.cost, accelerators,
                                  self.ctx.plan.decision.warmup)}

    def _early_stop(self, profile: Profile, config: Configuration, cancel: threading.Event,
                    to_beat: float | None) -> EarlyStop | None:
        """The benchmark's observer when early stop is on (``plan.decision.early_stop``)."""
        plan = self.ctx.plan
        if not plan.decision.early_stop:
            return None
        return EarlyStop(num_prompts=profile.num_prompts, cancel=cancel, to_beat=to_beat,
                         margin_pct=plan.min_improvement_pct, tokens_per_event=tokens_per_event(config.serve_config()))

    @staticmethod
    def _judge(profile: Profile, result: Any, partial: Any, error: str | None, dead: list[Any], timed_out: bool,
               budget: float) -> ProfileMeasurement:
        """One profile's measurement from how its benchmark ended."""
        n = profile.num_prompts
        done = _completed(result if result is not None else partial)
        of = f" ({done} of {n} requests completed)" if done is not None else ""
        if result is not None and not _has_failures(result):
            dead = []  # complete before the engine went down: a measurement; the next profile sees the death
        if dead:
            return ProfileMeasurement(Status.CRASHED, num_prompts=n, cause=dead[0].outcome.cause,
                                      error=f"the engine died during the {profile.label} benchmark{of}")
        if result is not None and result.stall is not None:  # the engine alive, its streams silent
            return ProfileMeasurement(Status.STALLED, metrics=result.metrics, num_prompts=n,
                                      error=f"{result.stall.message()} (the {profile.label} benchmark)")
        if result is None and timed_out:
            return ProfileMeasurement(Status.FAILED, num_prompts=n, error=f"the benchmark did not finish within {budget:g} s{of}")
        if result is None:
            return ProfileMeasurement(Status.FAILED, num_prompts=n, error=error or f"the benchmark was cancelled{of}")
        if result.metrics.usage_mismatches:  # the server's own figures cannot be trusted: no ranking figure
            return ProfileMeasurement(Status.FAILED, metrics=result.metrics, num_prompts=n,
                                      error=f"the server reported impossible token counts ({failure_summary(result)})")
        return ProfileMeasurement(Status.OK, metrics=result.metrics, num_prompts=n, error=failure_summary(result))

    def _write_outcome(self, run_dir: Path, rec: RunRecord, instances: list[Any]) -> None:
        outcome = {
            "state": rec.state,
            "version": rec.version,
            "script": rec.script,
            "reasons": to_jsonable(rec.reasons),
            "cause": to_jsonable(rec.cause),
            "error": rec.error,
            "log": rec.log,
            "leftovers": rec.leftovers,
            "measurements": {k: {"status": m.status, "error": m.error, "cause": to_jsonable(m.cause)}
                             for k, m in rec.measurements.items()},
            "instances": [inst.outcome.to_json() for inst in instances],
        }
        write_json(run_dir / "outcome.json", json.loads(json.dumps(outcome, default=str)))


# An engine that could not bind the port perflab picked for it (another process took it in
# between) is launched this many times in all, each on a fresh port, before it is an
# environment fault (docs/reliability.md).
PORT_LOST_LAUNCHES = 2


def _lost_its_port(rec: RunRecord) -> bool:
    """Whether the launch ended with the engine unable to bind its port, before it measured anything."""
    from perflab.supervisor import ADDRESS_IN_USE

    return (rec.state is Status.CRASHED and rec.cause is not None and rec.cause.name == ADDRESS_IN_USE
            and not any(m.status.measured for m in rec.measurements.values()))


#: the file in a launch's directory where a simulated engine that fails to start writes its
#: start-up and teardown (LIFECYCLE_FILE_ENV)
LIFECYCLE_FILE = "engine-lifecycle.txt"


@dataclass
class LaunchClock:
    """The engine time one launch held its accelerators (per accelerator), as it goes.

    A real engine: the wall time from launch to teardown. A simulated one counts its model
    clock, so that a plan gives the same engine-hours on any host however loaded: its start-up
    and teardown as the engine reports them (:data:`perflab.bench.serverclock.LIFECYCLE_HEADER`),
    each benchmark for its warm-up and run on the model clock, and what runs on no model clock
    (the accuracy gate, a benchmark timed by the host) for its wall time x the time scale. A
    simulated engine that never answered (it failed to start) reported nothing: the wall time
    x the time scale, less the benchmarks' host time, unless it wrote what its failed start
    cost (:data:`perflab.bench.serverclock.LIFECYCLE_FILE_ENV`)."""

    host_s: float = 0.0  # wall seconds of benchmarks not spent on the engine's model clock
    clocked_s: float = 0.0  # engine seconds of benchmarks on the model clock (warm-ups included)
    unclocked_s: float = 0.0  # wall seconds of measurements on no model clock
    lifecycle: tuple[float, float] | None = None  # (start-up, teardown) engine seconds the engine reported
    reported: Path | None = None  # where a simulated engine that failed to start wrote its (start-up, teardown)

    def benchmark(self, result: Any, wall_s: float) -> None:
        """A benchmark of ``wall_s`` real seconds ended with ``result`` (None: none came back)."""
        host = _host_seconds(result, wall_s)
        self.host_s += host
        said = result.info.get("lifecycle_s") if result is not None else None
        if self.lifecycle is None and isinstance(said, list) and len(said) == 2:
            self.lifecycle = (float(said[0]), float(said[1]))
        if result is not None and result.info.get("clock") == "model":
            self.clocked_s += _model_seconds(result)
        else:
            self.unclocked_s += wall_s

    def engine_seconds(self, wall_s: float, time_scale: float | None) -> float:
        """Per accelerator, of a launch that took ``wall_s`` real seconds (``time_scale``: the
        simulator's; None: a real engine)."""
        if time_scale is None:
            return wall_s
        if self.lifecycle is None and self.reported is not None and self.reported.is_file():
            self.lifecycle = parse_lifecycle(self.reported.read_text(encoding="utf-8"))
        if self.lifecycle is not None:
            return sum(self.lifecycle) + self.clocked_s + self.unclocked_s * time_scale
        return max(0.0, wall_s - self.host_s) * time_scale


def _model_seconds(result: Any) -> float:
    """Engine seconds a benchmark timed on the simulator's model clock took: its warm-up and
    its run (a run stopped early: until it stopped)."""
    duration = result.metrics.duration
    engine_s = float(duration) if isinstance(duration, (int, float)) else 0.0
    return engine_s + float(result.info.get("warmup_s") or 0.0)


def _host_seconds(result: Any, wall_s: float) -> float:
    """Of a benchmark that took ``wall_s`` real seconds, those not on the engine's model clock:
    the wall time beyond the warm-up's and the measured run's durations (engine seconds / time
    scale), when the simulator's model clock timed it (``info["clock"] == "model"``); 0
    otherwise."""
    if result is None or result.info.get("clock") != "model":
        return 0.0
    duration = result.metrics.duration
    scale = result.info.get("time_scale")
    if not isinstance(duration, (int, float)) or not scale:
        return 0.0
    return max(0.0, wall_s - _model_seconds(result) / float(scale))  # the warm-up is engine time too


def key_salt(
    spec: str,
    time_scale: float,
    simulated: bool,
    accelerators: Sequence[Any],
    versions: Mapping[str, str | None] | None = None,
) -> dict[str, Any]:
    """What besides the configuration decides a measurement: the machine (and sim speed), and
    the engine versions — a resumed study must not reuse a measurement of another version."""
    salt: dict[str, Any]
    if simulated:
        salt = {"hardware": spec, "time_scale": time_scale}
    else:
        salt = {"hardware": sorted(f"{a.kind}:{a.name}" for a in accelerators)}
    if versions:
        salt["versions"] = {k: v for k, v in sorted(versions.items())}
    return salt


def study_environment(plan: Plan, out_dir: Path, environ: Mapping[str, str]) -> dict[str, str]:
    """The environment a study resolves its hardware with (and launches engines from)."""
    from perflab.hardware.emulation import MACHINE_STATE_ENV

    env = dict(environ)
    if plan.hardware != "auto":
        # the plan's engine versions for the activated machine (simulation.engine_versions)
        for key, value in plan.sim_environment().items():
            env.setdefault(key, value)
        if MACHINE_STATE_ENV not in env:
            # The activated machine is the study's own: its state (a simulated machine's
            # device-memory registry) lives in the study directory, so machines activated
            # elsewhere on this host cannot take its memory.
            env[MACHINE_STATE_ENV] = str((out_dir / "sim-state").resolve())
    return env


def study_time_scale(plan: Plan, env: Mapping[str, str]) -> float:
    """How much faster than real time a study's engines run: the plan's ``time_scale`` where the
    activated environment ``env`` says its engines take one (TIME_SCALE_VAR_ENV), else 1."""
    from perflab.hardware.emulation import TIME_SCALE_VAR_ENV

    return plan.time_scale if env.get(TIME_SCALE_VAR_ENV) else 1.0
