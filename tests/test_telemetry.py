"""Accelerator telemetry (issue #13 item 2): the simulator's power follows its load, the NVML
and npu-smi watchers read it, npu-smi's power and usage formats parse, energy and cost add up."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import anyio
import psutil
import pytest
import structlog

from perflab.observe import Sample, Watcher, Watching, watch
from perflab.observe import energy as en
from perflab.observe import telemetry as tm
from perflab_sim import catalog, load, machine_env, npusmi
from perflab_sim.env import STATE_ENV
from perflab_sim.nvml import NvmlShim

FIXTURES = Path(__file__).parent / "fixtures" / "npu-smi"


def _env(tmp_path: Path, machine: str) -> dict[str, str]:
    return {**machine_env(machine), STATE_ENV: str(tmp_path / "state"), "PATH": os.environ.get("PATH", "")}


def _busy(tmp_path: Path, devices: list[int], busy_s: float, compute_s: float, mem_s: float, span: float = 1.0) -> None:
    """This (live) process publishes a load: each device busy ``busy_s`` of ``span`` model seconds."""
    meter = load.LoadMeter(devices, 1)
    meter.publish(tmp_path / "state", 100.0)
    meter.step(0, busy_s, mem_s, compute_s)
    meter.publish(tmp_path / "state", 100.0 + span)


# ------------------------------------------------------------------ the simulator's load model


def test_sim_power_follows_load_idle_below_memory_bound_below_compute_bound(tmp_path: Path) -> None:
    env = _env(tmp_path, "h100-80g-x8")
    chip = catalog.get("h100-80g-x8").chip
    nvml = NvmlShim(env)
    nvml.nvmlInit()
    h0, h1 = nvml.nvmlDeviceGetHandleByIndex(0), nvml.nvmlDeviceGetHandleByIndex(1)
    idle = nvml.nvmlDeviceGetPowerUsage(h0)
    assert idle == round(chip.power_w * 1000)  # milliwatts, as NVML
    assert nvml.nvmlDeviceGetUtilizationRates(h0).gpu == 0
    assert nvml.nvmlDeviceGetClockInfo(h0, 1) == chip.idle_sm_clock_mhz

    _busy(tmp_path, [0], busy_s=1.0, compute_s=0.1, mem_s=0.9)  # a decode-heavy second
    decode = nvml.nvmlDeviceGetPowerUsage(h0)
    assert nvml.nvmlDeviceGetUtilizationRates(h0).gpu == 100
    assert nvml.nvmlDeviceGetUtilizationRates(h0).memory == 90
    assert nvml.nvmlDeviceGetClockInfo(h0, 1) == chip.sm_clock_mhz
    assert nvml.nvmlDeviceGetPowerUsage(h1) == idle  # device 1 holds no engine
    _busy(tmp_path, [0], busy_s=1.0, compute_s=1.0, mem_s=0.2)  # a prefill-heavy second
    prefill = nvml.nvmlDeviceGetPowerUsage(h0)
    assert idle < decode < prefill <= chip.max_power_w * 1000
    _busy(tmp_path, [0], busy_s=0.25, compute_s=0.0, mem_s=0.25)  # a quarter busy
    assert idle < nvml.nvmlDeviceGetPowerUsage(h0) < decode
    assert nvml.nvmlDeviceGetUtilizationRates(h0).gpu == 25
    with pytest.raises(NvmlShim.NVMLError):
        nvml.nvmlDeviceGetClockInfo(h0, 2)  # memory clock: not simulated
    nvml.nvmlShutdown()


def test_a_dead_engines_load_does_not_count(tmp_path: Path) -> None:
    meter = load.LoadMeter([0], 1)
    meter.publish(tmp_path, 0.0, pid=2**22 + 12345)  # no such process
    meter.step(0, 1.0, 1.0, 1.0)
    path = meter.publish(tmp_path, 1.0, pid=2**22 + 12345)
    assert load.device_loads(tmp_path, [0])[0] == load.DeviceLoad()
    assert not path.exists()  # stale entries are cleaned up


def test_npu_smi_stand_in_power_and_aicore_follow_load(tmp_path: Path) -> None:
    env = _env(tmp_path, "910b3-x8")
    idle = tm.parse_power(npusmi.run(["info", "-t", "power", "-i", "2"], env))
    assert idle.of(0) is not None and idle.card_w == pytest.approx(45.8)
    assert tm.parse_usage(npusmi.run(["info", "-t", "usages", "-i", "2"], env))[0][tm.UTILIZATION] == 0
    _busy(tmp_path, [2], busy_s=0.8, compute_s=0.5, mem_s=0.6)
    busy = tm.parse_power(npusmi.run(["info", "-t", "power", "-i", "2"], env))
    assert busy.of(0) > idle.of(0) + 100
    usage = tm.parse_usage(npusmi.run(["info", "-t", "usages", "-i", "2"], env))[0]
    assert usage[tm.UTILIZATION] == 80 and usage[tm.MEMORY] > 0
    # the other views of the same chip agree
    assert tm.parse_power(npusmi.run(["info", "-t", "power", "-i", "3"], env)).of(0) < busy.of(0)
    assert f"{busy.of(0):.1f}" in npusmi.run(["info", "-t", "common", "-i", "2"], env)


# ------------------------------------------------------------------ npu-smi formats


def test_parse_power_of_a_910b_chip_and_a_310p_card() -> None:
    b = tm.parse_power((FIXTURES / "910B_info-t-power.txt").read_text())
    assert b.chips == {0: 69.0} and b.card_w == 45.2 and b.chip_count == 1
    assert b.of(0) == 69.0
    p = tm.parse_power((FIXTURES / "310P_info-t-power.txt").read_text())
    assert p.chips == {} and p.card_w == 45.2 and p.chip_count == 2
    assert p.of(0) == p.of(1) == pytest.approx(22.6)  # only the card reports: shared by its chips
    na = tm.parse_power("NPU ID : 0\nChip Count : 1\n\nNPU Real-time Power(W) : NA\nChip ID : 0\n")
    assert na.of(0) is None


def test_parse_usage_of_captured_910b_and_310p_outputs() -> None:
    b = tm.parse_usage((FIXTURES / "910B_info-t-usages.txt").read_text())
    assert set(b[0]) == {tm.UTILIZATION, tm.MEMORY}
    p = tm.parse_usage((FIXTURES / "310P_info-t-usages.txt").read_text())
    assert sorted(p) == [0, 1]
    assert p[0][tm.MEMORY] == pytest.approx(44280 * 3 / 100)  # no HBM: the DDR is the memory


# ------------------------------------------------------------------ the watchers


def test_nvml_watcher_samples_the_launchs_devices_through_the_sim_shim(tmp_path: Path) -> None:
    env = _env(tmp_path, "a100-80g-x8")
    telemetry = tm.Telemetry(env, [])
    w = telemetry.watcher({"cuda": [2, 3]})
    assert isinstance(w, Watcher) and w.source == tm.NVML and w.devices == (2, 3)
    _busy(tmp_path, [3], busy_s=1.0, compute_s=1.0, mem_s=0.3)
    values = dict(anyio.run(w.sample))
    # in simulation a sample carries the engines' model time: the last publication's (t=101)
    assert values.pop(tm.ENGINE_T) == 101.0
    assert set(values) == {f"{k}.{d}" for k in (tm.POWER, tm.UTILIZATION, tm.MEMORY, tm.SM_CLOCK, tm.ENERGY) for d in (2, 3)}
    assert values["power_w.2"] == 55.0 and values["power_w.3"] == 400.0
    s = w.summarize([Sample(0.0, values), Sample(1.0, {**values, "power_w.3": 200.0})])
    assert s == {"source": "nvml", "samples": 2, "devices": [2, 3], "power_w": {"mean": 355.0, "peak": 455.0},
                 "utilization_pct": {"mean": 50.0, "peak": 50.0}, "memory_used_mib": {"peak": 8.0},
                 "sm_clock_mhz": {"mean": 810.0}}
    telemetry.close()


def test_watch_loop_collects_nvml_samples_in_engine_time(tmp_path: Path) -> None:
    telemetry = tm.Telemetry(_env(tmp_path, "h100-80g-x1"), [])
    w = telemetry.watcher({"cuda": [0]})
    into = Watching()

    async def main() -> None:
        with anyio.move_on_after(0.5):
            await watch([w], into, time_scale=10.0)

    anyio.run(main)
    got = into.samples[tm.KEY]
    assert len(got) >= 2 and got[1].t >= 2.0  # 0.2 s of wall time apart, x10
    assert into.summaries([w])[tm.KEY]["power_w"]["mean"] == 70.0  # nothing runs: idle


def test_the_watch_samples_at_once_where_the_timed_run_begins_and_ends(tmp_path: Path) -> None:
    """TimedRun: the bench's thread asks, the watch samples every watcher at once, marked, and
    lets the bench go on; a watch that ends lets nothing wait."""
    import threading

    from perflab.observe import TimedRun

    telemetry = tm.Telemetry(_env(tmp_path, "h100-80g-x1"), [])
    w = telemetry.watcher({"cuda": [0]})
    into, marks = Watching(), TimedRun()
    waited: list[float] = []

    def bench() -> None:  # the bench's thread: begin, (the run), end
        t0 = time.monotonic()
        marks.begin()
        waited.append(time.monotonic() - t0)
        t0 = time.monotonic()
        marks.end()
        waited.append(time.monotonic() - t0)

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: watch([w], into, time_scale=1.0, timed=marks))  # a 1 s period
            await anyio.sleep(0.1)
            await anyio.to_thread.run_sync(bench)
            tg.cancel_scope.cancel()

    anyio.run(main)
    got = into.samples[tm.KEY]
    assert [s.mark for s in got if s.mark] == ["start", "end"]
    assert max(waited) < 0.5  # sampled at once, not at the next 1 s period
    assert got[-1].mark is None  # the last reading as the benchmark ends
    # nothing to sample: whoever asks is never held up
    quiet = TimedRun()
    anyio.run(lambda: watch([], Watching(), timed=quiet))
    t0 = time.monotonic()
    quiet.begin()
    quiet.end()
    assert time.monotonic() - t0 < 0.1
    telemetry.close()


def test_the_timed_runs_energy_is_the_counters_between_its_marks() -> None:
    # the loading and the warm-up (0-10 s, 4000 J above idle) and the metrics after the run are
    # outside the marks: the run's 10 s drew the counters' 5000 J, 100 W idle or not
    s = [Sample(0.0, {"power_w.0": 100.0, "utilization_pct.0": 0.0, "energy_mj.0": 0.0}),
         Sample(10.0, {"power_w.0": 500.0, "utilization_pct.0": 100.0, "energy_mj.0": 5_000_000.0}, "start"),
         Sample(20.0, {"power_w.0": 500.0, "utilization_pct.0": 100.0, "energy_mj.0": 10_000_000.0}, "end"),
         Sample(30.0, {"power_w.0": 100.0, "utilization_pct.0": 0.0, "energy_mj.0": 11_000_000.0})]
    e = en.energy(s, 10.0, 5000, requests=10, warmup_requests=5)  # no share of a warm-up: it is outside
    assert e["joules"] == 5000.0 and e["uncertainty_pct"] == 0.0
    assert en.energy(s[:3], 10.0, 5000)["joules"] == 5000.0
    # no end mark (the run was cut short): from the start mark to the last reading
    s[2] = Sample(20.0, s[2].values)
    assert en.energy(s, 10.0, 5000)["joules"] == pytest.approx(100 * 10 + (6000 - 100 * 20))
    # the marked sample is in observe-<profile>.json
    assert s[1].to_json()["mark"] == "start" and "mark" not in s[0].to_json()


def test_npu_smi_watcher_runs_the_stand_in(tmp_path: Path) -> None:
    import perflab_sim as sim
    from perflab.contract.types import Accelerator

    env = sim.activate("910b3-x8", {"PATH": os.environ.get("PATH", ""), STATE_ENV: str(tmp_path / "state")})
    chips = [Accelerator(vendor="huawei", kind="ascend", index=i, name="Ascend 910B3", memory_total_mib=65536,
                         memory_used_mib=0, npu_id=i, chip_id=0) for i in range(8)]
    w = tm.Telemetry(env, chips).watcher({"ascend": [4, 5]})
    assert w is not None and w.source == tm.NPU_SMI
    _busy(tmp_path, [5], busy_s=1.0, compute_s=0.5, mem_s=0.5)
    values = anyio.run(w.sample)
    assert values["utilization_pct.4"] == 0 and values["utilization_pct.5"] == 100
    assert values["power_w.5"] > values["power_w.4"] > 90
    assert values["memory_used_mib.4"] == pytest.approx(65536 * 5 / 100)  # the idle baseline, as a rate
    assert anyio.run(w.sample) is None  # npu-smi is slow: not asked again within NPU_SMI_MIN_WALL_S


def test_missing_telemetry_is_said_once_and_samples_nothing(tmp_path: Path) -> None:
    env = {"PATH": str(tmp_path)}  # no npu-smi; no simulated machine
    telemetry = tm.Telemetry(env, [])
    with structlog.testing.capture_logs() as logs:
        for _ in range(3):
            w = telemetry.watcher({"ascend": [0]})
            if w is not None:
                assert anyio.run(w.sample) == {}
        assert telemetry.watcher({"ascend": [0]}) is None  # given up for the study
        assert telemetry.watcher({"cpu": [0]}) is None
        assert telemetry.watcher({"cpu": [0]}) is None
    said = [e for e in logs if e["event"] == "observe.telemetry-unavailable"]
    assert [e["source"] for e in said] == ["npu-smi", "cpu"]
    assert "npu-smi is not on PATH" in said[0]["why"]


# ------------------------------------------------------------------ energy and cost


def _samples(*points: tuple[float, float]) -> list[Sample]:
    return [Sample(t, {"power_w.0": p / 2, "power_w.1": p / 2}) for t, p in points]


def test_energy_is_what_the_watch_drew_less_idle_power_outside_the_benchmark() -> None:
    # 100 W idle (the client loading), then 300 W -> 500 W: 5500 J over 20 s watched; the
    # benchmark's 10 s: less 10 s at the idle 100 W
    s = _samples((0.0, 100.0), (5.0, 100.0), (10.0, 300.0), (20.0, 500.0))
    assert en.watched_energy(s) == (5500.0, 20.0)
    assert en.energy(s, duration_s=10.0, output_tokens=9000) == {"joules": 4500.0, "output_tokens_per_joule": 2.0}
    # a watch shorter than the benchmark (the last sample before its end): at the watch's mean power
    assert en.energy(s, 25.0, 1)["joules"] == pytest.approx(5500 + 5500 / 20 * 5)
    # one sample: its power for the whole benchmark
    assert en.energy(_samples((3.0, 250.0)), 4.0, 100)["joules"] == 1000.0
    assert en.energy([], 10.0, 1) is None and en.energy(s, None, 1) is None
    assert en.energy([Sample(0.0, {"utilization_pct.0": 5.0}), Sample(1.0, {"utilization_pct.0": 5.0})], 1.0, 1) is None


def test_the_warm_ups_share_of_the_excess_is_not_the_benchmarks() -> None:
    # idle 100 W; 4000 J above idle over the watch, drawn by 8 warm-up requests and 24 measured ones
    s = _samples((0.0, 100.0), (10.0, 500.0), (20.0, 100.0))
    assert en.watched_energy(s) == (6000.0, 20.0)
    assert en.energy(s, 5.0, 3000)["joules"] == 100 * 5 + 4000
    assert en.energy(s, 5.0, 3000, requests=24, warmup_requests=8)["joules"] == 100 * 5 + 4000 * 24 / 32
    assert en.observed_extras({tm.KEY: s}, {"duration": 5.0, "total_output_tokens": 3000, "completed": 20, "failed": 4},
                              None, 1, warmup_requests=8)["energy"]["joules"] == 3500.0


def test_energy_states_how_far_off_its_idle_estimate_may_put_it() -> None:
    # the lowest sample (100 W) ran kernels 1 % of its period: it may hold up to 2 % of the full
    # draw above idle (500 - 100 W), 8 W; the joules move by the watch less the benchmark (10 s)
    # per watt: 80 J of 4500
    s = [Sample(t, {"power_w.0": p, "utilization_pct.0": u})
         for t, p, u in ((0.0, 100.0, 1.0), (5.0, 100.0, 1.0), (10.0, 300.0, 50.0), (20.0, 500.0, 100.0))]
    assert en.idle_error(s) == pytest.approx(8.0)
    e = en.energy(s, duration_s=10.0, output_tokens=9000)
    assert e["joules"] == 4500.0 and e["uncertainty_pct"] == pytest.approx(100 * 80 / 4500, abs=0.01)
    # the longer the watch beyond the benchmark, the more the idle estimate weighs
    longer = [*s, Sample(60.0, {"power_w.0": 100.0, "utilization_pct.0": 1.0})]
    assert en.energy(longer, 10.0, 9000)["uncertainty_pct"] > e["uncertainty_pct"]
    # an idle sample at 0 %: within the rounding of a whole percent only
    s[0] = Sample(0.0, {"power_w.0": 90.0, "utilization_pct.0": 0.0})
    assert en.idle_error(s) == pytest.approx(0.01 * 410)
    assert en.idle_error(_samples((0.0, 100.0), (1.0, 200.0))) is None  # no utilization: unknown, not 0


def test_energy_counters_count_what_happened_between_samples() -> None:
    # two samples 10 s apart read 100 W, but the counters say 3000 J were drawn (a burst between them)
    s = [Sample(0.0, {"power_w.0": 100.0, "energy_mj.0": 5_000_000.0}),
         Sample(10.0, {"power_w.0": 100.0, "energy_mj.0": 8_000_000.0})]
    assert en.watched_energy(s) == (3000.0, 10.0)
    assert en.energy(s, 4.0, 2400)["joules"] == 3000.0 - 100 * 6
    # a counter missing from one sample: the power's trapezoid instead
    s[1] = Sample(10.0, {"power_w.0": 100.0})
    assert en.watched_energy(s) == (1000.0, 10.0)


def test_energy_uses_the_simulated_engines_model_time_when_samples_carry_it() -> None:
    # a host that fell behind: wall-based t stretched x3, the model time (engine_t) is not
    s = [Sample(3 * m, {"power_w.0": p, tm.ENGINE_T: m}) for m, p in ((0.0, 100.0), (5.0, 100.0), (10.0, 300.0), (20.0, 500.0))]
    assert en.energy(s, duration_s=10.0, output_tokens=8000)["joules"] == 4500.0


def test_sim_energy_counter_is_idle_power_plus_the_steps(tmp_path: Path) -> None:
    env = _env(tmp_path, "a100-80g-x1")
    nvml = NvmlShim(env)
    nvml.nvmlInit()
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    meter = load.LoadMeter([0], 1)
    meter.publish(tmp_path / "state", 1000.0)
    before = nvml.nvmlDeviceGetTotalEnergyConsumption(h)
    meter.step(0, 2.0, 1.0, 2.0)  # 2 s busy, compute-bound
    meter.publish(tmp_path / "state", 1010.0)
    after = nvml.nvmlDeviceGetTotalEnergyConsumption(h)
    # 10 s at the idle 55 W, plus 2 s at (400 - 55) x (0.6 + 0.4) above it
    assert (after - before) / 1000 == pytest.approx(10 * 55 + 2 * 345, abs=0.01)


def test_cost_per_million_output_tokens() -> None:
    price = en.Cost(2.5, "EUR")
    c = en.cost(price, accelerators=8, duration_s=1800.0, output_tokens=2_000_000)
    assert c == {"per_million_output_tokens": 5.0, "currency": "EUR", "per_accelerator_hour": 2.5}  # 2.5 x 8 x 0.5 h / 2 M
    assert en.cost(None, 8, 1800.0, 1) is None and en.cost(price, 8, 1800.0, 0) is None


def test_observed_extras_and_report_lines() -> None:
    samples = {tm.KEY: _samples((0.0, 200.0), (10.0, 200.0))}
    metrics = {"duration": 10.0, "total_output_tokens": 4000}
    extra = en.observed_extras(samples, metrics, en.Cost(3.6), accelerators=2)
    assert extra == {"energy": {"joules": 2000.0, "output_tokens_per_joule": 2.0},
                     "cost": {"per_million_output_tokens": 5.0, "currency": "USD", "per_accelerator_hour": 3.6}}
    assert en.observed_extras({}, metrics, None, 1) == {}

    from perflab.contract.status import Status
    from perflab.lab.study import ConfigResult

    res = ConfigResult(Status.OK, metrics=metrics, observed={**extra, tm.KEY: tm.summarize(samples[tm.KEY], "nvml", [0, 1])})
    bare = ConfigResult(Status.OK, metrics=metrics)

    assert en.efficiency_text(res) == "2 tok/J · 5 USD/M tok"
    lines = en.result_lines(res)
    assert lines[0].startswith("# Power (nvml, 2 devices): mean 200 W") and lines[1] == "# Energy: 2000 J, 2 output tokens/J"
    assert en.summary_lines(res, res, [res], en.Cost(3.6))[0].startswith("Energy and cost on the main profile")
    res.observed["energy"] = {**res.observed["energy"], "uncertainty_pct": 4.4}  # how far off the idle estimate may put it
    assert en.result_lines(res)[1] == "# Energy: 2000 J ±4 %, 2 output tokens/J"

    note = en.summary_lines(bare, None, [bare, bare], None)
    assert note == ["No accelerator telemetry was recorded (NVML / npu-smi did not answer on this machine), "
                    "so there are no power or energy figures."]


def test_the_summary_names_cost_only_when_a_price_is_configured() -> None:
    from perflab.contract.status import Status
    from perflab.lab.study import ConfigResult

    metrics = {"duration": 10.0, "total_output_tokens": 4000}
    samples = {tm.KEY: _samples((0.0, 200.0), (10.0, 200.0))}
    unpriced = ConfigResult(Status.OK, metrics=metrics, observed=en.observed_extras(samples, metrics, None, accelerators=2))
    first, hint = en.summary_lines(unpriced, unpriced, [unpriced], None)
    assert first == ("Energy on the main profile: baseline 2 tok/J → optimized 2 tok/J "
                     "(output tokens per joule of accelerator energy).")
    assert "cost" not in first and hint.startswith("Give the plan a `cost:")
    priced = ConfigResult(Status.OK, metrics=metrics, observed=en.observed_extras({}, metrics, en.Cost(3.6), accelerators=2))
    assert en.summary_lines(priced, priced, [priced], en.Cost(3.6))[0] == (
        "Cost on the main profile: baseline 5 USD/M tok → optimized 5 USD/M tok (cost per million output tokens).")


# ------------------------------------------------------------------ closing: NVML shut down when the launches end


def test_nvml_is_shut_down_when_the_last_holder_lets_go(tmp_path: Path) -> None:
    """Two launches hold one study's telemetry: the first to end leaves NVML open for the other
    (still reading), the last one shuts it down; a later launch opens it again."""
    telemetry = tm.Telemetry(_env(tmp_path, "a100-80g-x8"), [])
    w = telemetry.watcher({"cuda": [0]})
    assert w is not None
    with telemetry.held():
        with telemetry.held():
            assert anyio.run(w.sample)
            shim = telemetry._nvml
            assert shim._initialised == 1
        assert anyio.run(w.sample) and shim._initialised == 1  # the other launch still reads
    assert shim._initialised == 0 and telemetry.problems == {}
    with pytest.raises(RuntimeError), telemetry.held():  # a launch that fails still lets go
        assert anyio.run(w.sample)
        again = telemetry._nvml
        raise RuntimeError("the launch crashed")
    assert again._initialised == 0 and telemetry.problems == {}
    telemetry.close()  # nothing open: nothing to do


ONE_LAUNCH = """
name: telemetry-close
model: Qwen/Qwen3-8B
hardware: sim:h100-80g-x1
simulation: {time_scale: 20}
engines: [vllm]
early_stop: false
profiles:
  main: {label: Main, input_len: 64, output_len: 512, num_prompts: 16, max_concurrency: 4}
timeouts: {startup_s: 60, benchmark_s: 120}
"""


def _launch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cancel: bool) -> tuple[list[str], Any]:
    """One vLLM launch on the simulated H100 through the executor, to its end or cancelled at
    its first telemetry reading; the NVML calls its telemetry made, in order, and its record
    (None when cancelled)."""
    import threading

    from perflab.hardware import resolve
    from perflab.lab.options import Configuration
    from perflab.lab.plan import load_plan_text
    from perflab.lab.run.executor import Executor, LabContext
    from perflab.plugins import load as load_plugins
    from perflab_sim.env import ENGINE_VERSIONS_ENV, TIME_SCALE_ENV

    calls: list[tuple[NvmlShim, str]] = []  # the hardware probe and the machine check open their own
    init, shutdown = NvmlShim.nvmlInit, NvmlShim.nvmlShutdown
    monkeypatch.setattr(NvmlShim, "nvmlInit", lambda self: (calls.append((self, "init")), init(self))[1])
    monkeypatch.setattr(NvmlShim, "nvmlShutdown", lambda self: (calls.append((self, "shutdown")), shutdown(self))[1])
    read = threading.Event()
    real_read = tm.Telemetry.read
    monkeypatch.setattr(tm.Telemetry, "read", lambda self, *a: (real_read(self, *a), read.set())[0])

    plan = load_plan_text(ONE_LAUNCH, path="telemetry-close.yaml")
    pm = load_plugins()
    env = {**os.environ, TIME_SCALE_ENV: "20", STATE_ENV: str(tmp_path / "state"), ENGINE_VERSIONS_ENV: "vllm=0.32.0"}
    hw, env = resolve(pm, plan.hardware, env)
    ex = Executor(LabContext(pm=pm, plan=plan, hardware=hw, env=env, time_scale=20.0))
    run_dir = tmp_path / "runs" / "001-vllm"
    run_dir.mkdir(parents=True)
    config = Configuration("vllm", {"model": plan.model})
    out: list[Any] = [None]

    async def go() -> None:
        async with anyio.create_task_group() as tg:
            async def launch() -> None:
                out[0] = await ex.run(config, plan.profiles, run_dir, label="vllm")

            tg.start_soon(launch)
            if cancel:
                await anyio.to_thread.run_sync(read.wait, 60.0)
                tg.cancel_scope.cancel()

    before = {p.pid for p in psutil.Process().children(recursive=True)}
    anyio.run(go)
    assert read.is_set()  # the launch did read its H100 through NVML
    left = [p for p in psutil.Process().children(recursive=True) if p.pid not in before and p.status() != psutil.STATUS_ZOMBIE]
    assert left == [], "the launch outlived its end"
    return [call for shim, call in calls if shim is ex.telemetry._nvml], out[0]


@pytest.mark.slow
def test_the_executor_shuts_nvml_down_when_its_launch_ends(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls, rec = _launch(tmp_path, monkeypatch, cancel=False)
    assert rec.state == "done" and rec.measurements["main"].observed["telemetry"]["samples"] >= 1
    assert calls == ["init", "shutdown"]


@pytest.mark.slow
def test_a_cancelled_launch_shuts_nvml_down_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls, rec = _launch(tmp_path, monkeypatch, cancel=True)
    assert rec is None  # cancelled during its benchmark
    assert calls == ["init", "shutdown"]
