"""Parallel runs (issue #14 items 1-2): the local backend's device ledger, a step's
configurations measured at once with the decisions of a sequential run, disjoint device
sets on the simulator (the launches' CUDA_VISIBLE_DEVICES), and Ctrl-C with several engines up."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from datetime import datetime
from pathlib import Path

import anyio
import psutil
import pytest
from simstudy import run_sim_study

from perflab.contract.errors import UsageError
from perflab.contract.status import Status
from perflab.lab.plan import load_plan_text
from perflab.lab.run.backends.local import Demand, DeviceLedger, auto_parallel, parse_parallel
from perflab.lab.study import ConfigResult, conduct

EIGHT = {"cuda": tuple(range(8))}


# --------------------------------------------------------------------------- the ledger


def test_ledger_first_fit_disjoint_and_in_order() -> None:
    async def main() -> list[tuple[int, ...]]:
        ledger = DeviceLedger(EIGHT, slots=8)
        tp4 = Demand("cuda", 4)
        a = await ledger.acquire(tp4)
        b = await ledger.acquire(tp4)
        assert (a, b) == ((0, 1, 2, 3), (4, 5, 6, 7))
        got: list[tuple[int, ...]] = []

        async def third() -> None:  # waits: every device is held
            got.append(await ledger.acquire(Demand("cuda", 2)))

        async with anyio.create_task_group() as tg:
            tg.start_soon(third)
            await anyio.sleep(0.05)
            assert got == [] and len(ledger._queue) == 1
            ledger.release(tp4, b)  # 4-7 free: the waiter gets the first two of them
        ledger.release(tp4, a)
        c = await ledger.acquire(Demand("cuda", 4))
        return [*got, c]

    assert anyio.run(main) == [(4, 5), (0, 1, 2, 3)]


def test_ledger_slots_pins_ports_and_impossible_demands() -> None:
    async def main() -> None:
        one = DeviceLedger(EIGHT, slots=1)  # --parallel 1: one run at a time, whatever fits
        await one.acquire(Demand("cuda", 1))
        with anyio.move_on_after(0.1) as scope:
            await one.acquire(Demand("cuda", 1))
        assert scope.cancelled_caught and one._queue == []  # a cancelled waiter leaves the queue

        ledger = DeviceLedger(EIGHT, slots=8)
        pinned = Demand("cuda", 2, devices=(2, 3))
        assert await ledger.acquire(pinned) == (2, 3)
        assert await ledger.acquire(Demand("cuda", 4)) == (4, 5, 6, 7)  # the first free block of four
        with anyio.move_on_after(0.1) as scope:
            await ledger.acquire(Demand("cuda", 1, devices=(3,)))  # pinned to a held device: waits
        assert scope.cancelled_caught
        assert await ledger.acquire(Demand("cuda", 16)) == ()  # never fits: the executor refuses it
        assert await ledger.acquire(Demand(None, 1)) == ()  # no accelerator: a slot only
        fixed = Demand("cuda", 1, port=8000)
        assert await ledger.acquire(fixed) == (0,)
        with anyio.move_on_after(0.1) as scope:
            await ledger.acquire(Demand("cuda", 1, port=8000))  # the same fixed port: not at once
        assert scope.cancelled_caught

    anyio.run(main)


def test_parallel_option() -> None:
    assert parse_parallel("auto") == "auto" and parse_parallel("3") == 3
    for bad in ("0", "-1", "two"):
        with pytest.raises(UsageError, match="--parallel"):
            parse_parallel(bad)
    assert auto_parallel(EIGHT) == 8 and auto_parallel({}) == 1


# --------------------------------------------------------------------------- the study's decisions

PLAN = """
name: par
model: Qwen/Qwen3-8B
hardware: sim:a100-80g-x8
engines: [vllm, sglang, trtllm]
candidates:
  - name: Max Num Seqs
    engines: [winner, vllm]
    variants:
      - {name: "64", set: {max_num_seqs: 64}}
      - {name: "128", set: {max_num_seqs: 128}}
  - name: Chunked
    variants:
      - {name: "on", set: {chunked_prefill: true}}
profiles:
  main: {input_len: 64, output_len: 16, num_prompts: 10}
  other: {input_len: 256, output_len: 8, num_prompts: 10}
"""


class TableMeasure:
    """A measure answering from a table, slowly, counting how many calls overlap."""

    def __init__(self, concurrent: bool) -> None:
        self.concurrent = concurrent
        self.calls: list[tuple[str, str, float | None]] = []
        self.inflight = 0
        self.peak = 0

    @staticmethod
    def figure(cfg) -> float:
        o = cfg.options
        base = {"vllm": 1000.0, "sglang": 1200.0, "trtllm": 900.0}[cfg.engine]
        return base + {64: -50.0, 128: 80.0}.get(o.get("max_num_seqs"), 0.0) + (30.0 if o.get("chunked_prefill") else 0.0)

    async def __call__(self, config, profiles, *, step, label, to_beat=None):
        self.calls.append((step, label, to_beat))
        self.inflight += 1
        self.peak = max(self.peak, self.inflight)
        # later configurations finish first: a concurrent step must still keep the plan's order
        await anyio.sleep(0.05 / (1 + len(self.calls)))
        self.inflight -= 1
        tps = self.figure(config)
        return {p.name: ConfigResult(Status.OK, {"total_token_throughput": tps, "completed": 10}, 10) for p in profiles}


def _decisions(outcome) -> list:
    return [(s.title, [e.label for e in s.entries], s.chosen.label if s.chosen else None, s.adopted)
            for s in outcome.steps] + [outcome.optimized.label]


def test_concurrent_steps_decide_as_the_sequential_run() -> None:
    plan = load_plan_text(PLAN)
    seq, par = TableMeasure(False), TableMeasure(True)
    one = anyio.run(conduct, plan, seq)
    many = anyio.run(conduct, plan, par)
    assert _decisions(one) == _decisions(many)
    assert _decisions(one)[-1] == "sglang on" and [s.adopted for s in one.steps] == [True, True, True]
    assert seq.peak == 1 and par.peak == 4  # the four variants of step 2 at once
    # at once, every configuration of a step is compared with the best *before* the step,
    # whatever order its siblings finish in
    par_beat = {label: b for _, label, b in par.calls}
    assert par_beat["vllm"] is par_beat["sglang"] is par_beat["trtllm"] is None
    assert par_beat["sglang 64"] == par_beat["vllm 128"] == par_beat["sglang 128"] == 1200.0  # the step's base
    assert par_beat["sglang on"] == 1280.0  # SGLang 128, adopted by the step before
    # one at a time, with the best so far, the step's earlier configurations included (more
    # can stop early); the decisions above are the same
    beat = {label: b for _, label, b in seq.calls}
    assert beat["vllm"] is None and beat["sglang"] == 1000.0 and beat["trtllm"] == 1200.0
    assert beat["sglang 64"] == 1200.0 and beat["sglang 128"] == 1200.0  # 64 is worse than the base
    assert beat["vllm 64"] == 1280.0 and beat["vllm 128"] == 1280.0  # SGLang 128 measured before them
    assert beat["sglang on"] == 1280.0


# --------------------------------------------------------------------------- on the simulator

TP4_PLAN = """
name: tp4
model: {id: Qwen/Qwen3-32B, name: Qwen3-32B}
hardware: sim:a100-80g-x8
simulation: {time_scale: 40}
engines: [vllm, sglang]
serve: {tp: 4}
engine_serve:
  vllm: {max_model_len: 32768}
candidates:
  - name: Quantization
    engines: [winner, vllm]
    variants:
      - {name: AWQ, set: {model: Qwen/Qwen3-32B-AWQ}}
profiles:
  main: {label: Main, dataset: synthetic-sharegpt, num_prompts: 60}
  other: {label: Other, input_len: 128, output_len: 16, num_prompts: 40, seed: 42}
min_improvement_pct: 1
timeouts: {startup_s: 120, benchmark_s: 300}
"""


def _intervals(study: Path) -> dict[int, tuple[float, float]]:
    """run id -> (opened, finished) in seconds, from the study log."""
    out: dict[int, list[float]] = {}
    for line in (study / "study.log").read_text().splitlines():
        ev = json.loads(line)
        if ev["event"] in ("lab.run", "lab.run-finished"):
            t = datetime.fromisoformat(ev["timestamp"].replace("Z", "+00:00")).timestamp()
            out.setdefault(ev["run_id"], []).append(t)
    return {k: (v[0], v[-1]) for k, v in out.items()}


def _visible(study: Path) -> dict[int, set[int]]:
    """run id -> the devices its launch was given (CUDA_VISIBLE_DEVICES in launch.json)."""
    out = {}
    with sqlite3.connect(study / "study.db") as con:
        for run_id, run_dir in con.execute("SELECT id, dir FROM runs"):
            launch = json.loads((study / run_dir / "launch.json").read_text())
            out[run_id] = {int(d) for d in launch["env"]["CUDA_VISIBLE_DEVICES"].split(",")}
    return out


@pytest.mark.slow
def test_parallel_study_on_the_simulator(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PERFLAB_SIM_STATE_DIR", str(tmp_path / "sim-state"))
    seq = run_sim_study(TP4_PLAN, tmp_path / "seq")
    par = run_sim_study(TP4_PLAN, tmp_path / "par", parallel="auto")
    assert seq.exit_code == par.exit_code == 0
    assert _decisions(seq.outcome) == _decisions(par.outcome)
    assert par.measured == seq.measured == 6

    spans, devices = _intervals(tmp_path / "par"), _visible(tmp_path / "par")
    assert set(spans) == set(devices)
    overlapping = 0
    for a in spans:
        for b in spans:
            if a < b and spans[a][0] < spans[b][1] and spans[b][0] < spans[a][1]:
                overlapping += 1
                assert not devices[a] & devices[b], f"runs {a} and {b} ran at once on {devices[a] & devices[b]}"
    assert overlapping >= 3, "each step's two configurations ran side by side"
    assert all(len(d) == 4 for d in devices.values())


def _tagged(tag: str) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["pid"]):
        try:
            if p.pid != os.getpid() and p.environ().get("PERFLAB_PAR_TEST_TAG") == tag \
                    and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except (psutil.Error, OSError):
            continue
    return out


@pytest.mark.slow
def test_ctrl_c_cancels_every_parallel_run(tmp_path: Path) -> None:
    plan = tmp_path / "tp4.yaml"
    plan.write_text(TP4_PLAN.replace("time_scale: 40", "time_scale: 4"))
    out = tmp_path / "study"
    tag = uuid.uuid4().hex
    env = {**os.environ, "PERFLAB_PAR_TEST_TAG": tag, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-c", "from perflab.cli import main; main()", "run", str(plan),
                             "--out", str(out), "--no-live", "--parallel", "auto"],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:  # both engines of step 1 are up
            if len([p for p in _tagged(tag) if p.pid != proc.pid]) >= 2 and (out / "study.db").exists():
                with sqlite3.connect(out / "study.db") as con:
                    if len(list(con.execute("SELECT id FROM runs WHERE state = 'running'"))) == 2:
                        break
            time.sleep(0.1)
        assert proc.poll() is None, "the study ended before it could be interrupted"
        time.sleep(1.0)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err
    # an engine's keeper ends once the engine's tree is gone and its tmpdir removed: on a busy host
    # that can trail perflab's own exit by a moment (the real lane allows 5 s too: reallab.py)
    deadline = time.monotonic() + 5.0
    while _tagged(tag) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _tagged(tag) == [], "engine processes survived the interrupt"
    with sqlite3.connect(out / "study.db") as con:
        states = [r[0] for r in con.execute("SELECT state FROM runs ORDER BY id")]
    assert states.count("interrupted") == 2 and "running" not in states


def test_progress_shows_every_running_configuration() -> None:
    import io

    from rich.console import Console

    from perflab.lab.progress import StudyProgress

    stream = io.StringIO()
    ui = StudyProgress("study", live=False, stream=stream)
    with ui:
        ui.event("step", title="1. Choosing the Inference Engine")
        ui.event("measure", label="vLLM", engine="vllm")
        ui.event("measure", label="SGLang", engine="sglang")
        ui.event("placed", label="vLLM", devices=[0, 1, 2, 3])
        ui.event("placed", label="SGLang", devices=[4, 5, 6, 7])
        ui.log_listener("engine.state", {"engine": "sglang", "state": "ready", "run_label": "SGLang"})
        ui.event("benchmark", label="vLLM", profile="Main", total=10)
        ui.event("progress", label="vLLM", profile="Main", done=4, total=10)
        screen = Console(file=io.StringIO(), width=120)
        screen.print(ui._render())
        shown = screen.file.getvalue()
        ui.event("result", label="SGLang", status=Status.OK, summary="1.00 tok/s")
    text = stream.getvalue()
    assert "vLLM: on devices 0,1,2,3" in text and "SGLang: on devices 4,5,6,7" in text
    assert "SGLang: ready" in text  # the supervisor's event, told apart by the backend's run_label
    assert "vLLM (vllm) on 0,1,2,3" in shown and "SGLang (sglang) on 4,5,6,7" in shown
    assert "Main: 4/10 requests" in shown and "ready" in shown
    assert list(ui.s.runs) == ["vLLM"]  # SGLang finished


def test_a_fault_in_one_concurrent_run_is_raised_as_itself() -> None:
    """A sibling's busy machine stops the study with its own one-line error (exit 3), not an
    exception group; the siblings are cancelled."""
    from perflab.lab.store.integrity import MachineNotReady

    cancelled: list[str] = []

    class Faulty(TableMeasure):
        async def __call__(self, config, profiles, *, step, label, to_beat=None):
            if label == "sglang":
                await anyio.sleep(0.01)
                raise MachineNotReady("the machine is not ready: cuda:4 is held by pid 1")
            try:
                await anyio.sleep(5)
            except anyio.get_cancelled_exc_class():
                cancelled.append(label)
                raise
            raise AssertionError("not cancelled")

    with pytest.raises(MachineNotReady, match="cuda:4 is held"):
        anyio.run(conduct, load_plan_text(PLAN), Faulty(True))
    assert sorted(cancelled) == ["trtllm", "vllm"]


# --------------------------------------------------------------------------- idle slots (issue #14)

FILL_PLAN = """
name: fill
model: Qwen/Qwen3-8B
hardware: sim:a100-80g-x8
engines: [vllm, sglang]
baseline: {engine: vllm}
candidates:
  - name: Max Num Seqs
    variants:
      - {name: "128", set: {max_num_seqs: 128}}
  - name: Chunked
    engines: [winner, vllm]
    variants:
      - {name: "on", set: {chunked_prefill: true}}
profiles:
  main: {input_len: 64, output_len: 16, num_prompts: 10}
  short: {input_len: 32, output_len: 8, num_prompts: 10}
  long: {input_len: 2048, output_len: 8, num_prompts: 10}
  medium: {input_len: 512, output_len: 8, num_prompts: 10}
"""


SECONDS = {"main": 0.1, "short": 0.02, "long": 0.08, "medium": 0.04}  # what each profile takes


class SlotMeasure(TableMeasure):
    """A measure on ``slots`` slots, queueing what does not fit (as a backend, with its
    ``room``), that stores what it measured (as the driver does: ``missing`` and ``lookup``
    read it), logging when each call ran."""

    def __init__(self, slots: int, refused: tuple[str, ...] = ()) -> None:
        super().__init__(concurrent=slots > 1)
        self.slots = slots
        self.refused = refused  # labels refused before launch (held a slot for a moment, measured nothing)
        self.free = anyio.Semaphore(slots)
        self.waiting = 0
        self.stored: dict[tuple[str, str], ConfigResult] = {}
        self.log: list[tuple[str, str, tuple[str, ...], float, float, bool]] = []
        self.t0 = 0.0

    def room(self, config) -> int:
        return max(0, self.slots - self.inflight - self.waiting)

    def lookup(self, config, profile):
        return self.stored.get((repr(config.canonical()), profile.name))

    def missing(self, config, profiles):
        return [p for p in profiles if self.lookup(config, p) is None]

    async def __call__(self, config, profiles, *, step, label, to_beat=None, background=False):
        todo = self.missing(config, profiles)
        if todo:
            if background:  # dispatched only into a free slot: it never queues before a step's run
                assert self.room(config) > 0, f"{label} was dispatched with no slot free"
            self.waiting += 1
            await self.free.acquire()
            self.waiting -= 1
            self.inflight += 1
            self.peak = max(self.peak, self.inflight)
            start = anyio.current_time()
            if label in self.refused:
                await anyio.sleep(0.005)
                self.inflight -= 1
                self.free.release()
                self.log.append((step, label, (), start, anyio.current_time(), background))
                res = ConfigResult(Status.UNSUPPORTED, reasons=[{"what": "x", "why": "refused", "severity": "error"}])
                for p in todo:
                    self.stored[(repr(config.canonical()), p.name)] = res
                return {p.name: res for p in profiles}
            # vLLM's runs take twice as long: in step 1, SGLang's slot is free before the step ends
            await anyio.sleep(sum(SECONDS[p.name] for p in todo) * (2 if config.engine == "vllm" else 1))
            self.inflight -= 1
            self.free.release()
            self.log.append((step, label, tuple(p.name for p in todo), start, anyio.current_time(), background))
            tps = self.figure(config)
            for p in todo:
                self.stored[(repr(config.canonical()), p.name)] = ConfigResult(
                    Status.OK, {"total_token_throughput": tps, "completed": 10, "duration": SECONDS[p.name]}, 10)
        self.calls.append((step, label, to_beat))
        return {p.name: self.lookup(config, p) or ConfigResult(Status.PENDING) for p in profiles}


def _cases(outcome) -> list:
    return [(c.profile.name, c.baseline.status, c.baseline.tps, c.optimized.status if c.optimized else None,
             c.optimized.tps if c.optimized else None) for c in outcome.cases]


def test_idle_slots_take_the_baselines_final_measurements_early() -> None:
    """Step 2 has one configuration (the winner's variant) and two slots: the baseline's
    final measurements (its configuration is the plan's from the start) take the free slot
    during step 2 instead of waiting for the end; at the end, the optimized configuration's
    profiles are split across the two free slots. The decisions, the cases and their order
    are those of the sequential run."""
    plan = load_plan_text(FILL_PLAN)
    seq, par = SlotMeasure(1), SlotMeasure(2)
    one = anyio.run(conduct, plan, seq)
    many = anyio.run(conduct, plan, par)
    assert _decisions(one) == _decisions(many) and _cases(one) == _cases(many)
    assert [c.profile.name for c in many.cases] == ["main", "short", "long", "medium"]  # the plan's order
    assert one.complete and many.complete and seq.peak == 1 and par.peak == 2

    # one at a time: the baseline's "other benchmark cases" come last, in one launch
    assert [(label, profiles) for step, label, profiles, *_ in seq.log if step == "Other Benchmark Cases"] == [
        ("Baseline", ("short", "long", "medium")), ("Optimized", ("short", "long", "medium"))]
    # two slots: dispatched in the background when step 2 (one configuration) began
    base = next(r for r in par.log if r[1] == "Baseline")
    step2 = next(r for r in par.log if r[0].startswith("2. "))
    assert base[2] == ("short", "long", "medium") and base[5] is True
    step1_end = max(r[4] for r in par.log if r[0].startswith("1. "))
    assert step1_end <= base[3] < step2[4], "started beside step 2's only configuration, not in step 1's tail"
    # the optimized configuration's profiles across the two slots free at the end, balanced
    # by the baseline's measured durations (long alone; short and medium together)
    opt = sorted(r[2] for r in par.log if r[1] == "Optimized")
    assert opt == [("long",), ("short", "medium")]
    opt_spans = [(r[3], r[4]) for r in par.log if r[1] == "Optimized"]
    assert opt_spans[0][0] < opt_spans[1][1] and opt_spans[1][0] < opt_spans[0][1], "side by side"


def test_a_refused_configuration_frees_its_slot_for_the_baseline() -> None:
    """Step 2's two configurations take both slots; SGLang's is refused before launch (as
    SGLang FP8 on A100), so its slot is free for the rest of the step: the baseline's final
    measurements take it then — not at the end of step 1, where SGLang merely finished first."""
    plan = load_plan_text(FILL_PLAN.replace("""  - name: Max Num Seqs
    variants:
      - {name: "128", set: {max_num_seqs: 128}}
""", ""))
    seq, par = SlotMeasure(1, refused=("sglang on",)), SlotMeasure(2, refused=("sglang on",))
    one, many = anyio.run(conduct, plan, seq), anyio.run(conduct, plan, par)
    assert _decisions(one) == _decisions(many) and _cases(one) == _cases(many)
    assert [(s.title, [e.result.status for e in s.entries]) for s in many.steps][1][1] == [Status.UNSUPPORTED, Status.OK]
    base = next(r for r in par.log if r[1] == "Baseline")
    refused = next(r for r in par.log if r[1] == "sglang on")
    running = next(r for r in par.log if r[1] == "vllm on")
    step1_end = max(r[4] for r in par.log if r[0].startswith("1. "))
    assert base[5] is True and base[3] >= step1_end, "not in step 1's tail"
    assert refused[4] <= base[3] < running[4], "in the refused one's slot, while the step ran"


def test_the_split_gives_less_to_the_slot_the_baselines_early_launch_still_holds() -> None:
    """At the end, one slot is free and the other is still the baseline's early launch,
    measuring its last profile: the launch waiting for that slot starts later, so it gets
    the lighter share (by token volume: the baseline's durations are not all known yet). On
    seed 001 with two Ray nodes the slot came free 22 s after the other: a split that
    ignored it ended the study that much later."""
    from perflab.lab.study import _Study

    plan = load_plan_text(FILL_PLAN.replace(
        "  medium: {input_len: 512, output_len: 8, num_prompts: 10}",
        "  medium: {input_len: 512, output_len: 8, num_prompts: 10}\n"
        "  huge: {input_len: 3200, output_len: 8, num_prompts: 10}"))
    measure = SlotMeasure(2)
    base_cfg = plan.baseline_config()
    for name in ("short", "long", "medium"):  # the early launch measured these; "huge" is in progress
        measure.stored[(repr(base_cfg.canonical()), name)] = ConfigResult(Status.OK, {"duration": 1.0}, 10)
    cfg = dataclasses.replace(base_cfg, engine="sglang")  # the optimized configuration: main measured in step 1
    measure.stored[(repr(cfg.canonical()), "main")] = ConfigResult(Status.OK, {"duration": 1.0}, 10)
    study = _Study(plan, measure, str)
    study._early_profiles = tuple(p for p in plan.profiles if p.name != plan.main_profile)  # as _fill dispatched it
    # volumes: huge 32080, long 20560, medium 5200, short 400; the busy slot starts at half of huge
    ignoring = study._groups(cfg, 2, base_cfg)
    aware = study._groups(cfg, 2, base_cfg, busy=True)
    names = lambda groups: [tuple(p.name for p in g) for g in groups]  # noqa: E731
    assert names(ignoring) == [("huge",), ("short", "long", "medium")]
    assert names(aware) == [("medium", "huge"), ("short", "long")]  # the first group: the slot free now


def test_no_idle_slot_no_early_dispatch() -> None:
    """A backend with no slot free (every one taken, or a run queued) gets no early work: the
    baseline's final measurements wait for the end, as before, and the optimized
    configuration's are one launch."""
    plan = load_plan_text(FILL_PLAN)
    par = SlotMeasure(2)
    par.room = lambda config: 0  # a backend with every slot taken or queued
    many = anyio.run(conduct, plan, par)
    assert _decisions(many) == _decisions(anyio.run(conduct, plan, SlotMeasure(1)))
    assert sorted(r[1] for r in par.log if r[0] == "Other Benchmark Cases") == ["Baseline", "Optimized"]
    assert not any(r[5] for r in par.log)


FILL_SIM_PLAN = """
name: fill-sim
model: {id: Qwen/Qwen3-32B, name: Qwen3-32B}
hardware: sim:a100-80g-x8
simulation: {time_scale: 40}
engines: [vllm, sglang]
serve: {tp: 4}
engine_serve:
  vllm: {max_model_len: 32768}
candidates:
  - name: Max Num Seqs
    variants:
      - {name: "4", set: {max_num_seqs: 4}}  # clearly worse: not adopted, whatever the host's load
profiles:
  main: {label: Main, dataset: synthetic-sharegpt, num_prompts: 24}
  short: {label: Short, input_len: 128, output_len: 16, num_prompts: 16, seed: 42}
  long: {label: Long, input_len: 2000, output_len: 32, num_prompts: 16, seed: 42}
min_improvement_pct: 5
timeouts: {startup_s: 120, benchmark_s: 300}
"""


def _report_cases(study: Path) -> list:
    report = json.loads((study / "report.json").read_text())
    return [(c["profile"], c["baseline"]["status"], (c["optimized"] or {}).get("status"),
             c["baseline"]["num_prompts"]) for c in report["cases"]]


@pytest.mark.slow
def test_parallel_study_fills_an_idle_slot_on_the_simulator(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--parallel auto`` with the local backend: step 2 has one configuration (TP4: two fit
    on the eight GPUs), so the baseline's final measurements run beside it, not after the
    last step; the decisions and the report's cases are the sequential run's, and a second
    invocation reuses everything."""
    monkeypatch.setenv("PERFLAB_SIM_STATE_DIR", str(tmp_path / "sim-state"))
    # without early stop, so that every entry is measured in full both ways (one at a time,
    # more can stop early: a status, not a decision; the reports' cases are compared below)
    seq = run_sim_study(FILL_SIM_PLAN, tmp_path / "seq", early_stop=False)
    par = run_sim_study(FILL_SIM_PLAN, tmp_path / "par", parallel="auto", early_stop=False)
    assert seq.exit_code == par.exit_code == 0
    assert _decisions(seq.outcome) == _decisions(par.outcome)
    assert _report_cases(tmp_path / "seq") == _report_cases(tmp_path / "par")
    assert [c[0] for c in _report_cases(tmp_path / "par")] == ["main", "short", "long"]

    spans = _intervals(tmp_path / "par")
    with sqlite3.connect(tmp_path / "par" / "study.db") as con:
        runs = {label: (rid, step, json.loads(profiles)) for rid, label, step, profiles
                in con.execute("SELECT id, label, step, profiles FROM runs")}
    base_id, _, base_profiles = runs["Baseline"]
    step2_id = runs["vLLM 4"][0] if "vLLM 4" in runs else runs["SGLang 4"][0]
    assert base_profiles == ["short", "long"]  # the main profile is step 1's
    assert base_id == step2_id + 1, "opened right after step 2's only configuration"
    assert spans[base_id][0] < spans[step2_id][1], "dispatched while step 2 ran, not after the last step"

    again = run_sim_study(FILL_SIM_PLAN, tmp_path / "par", parallel="auto", early_stop=False)  # resumed: nothing left to measure
    assert again.exit_code == 0 and again.measured == 0
    assert _decisions(again.outcome) == _decisions(par.outcome)
