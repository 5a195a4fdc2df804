"""Accelerator telemetry, energy and cost in a whole simulated study (issue #13, item 2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simstudy import run_sim_study

PLAN = """
name: energy-sim
model: Qwen/Qwen3-8B
hardware: sim:{hardware}
simulation: {{time_scale: 40}}
engines: [{engine}]
early_stop: false
cost: {{per_accelerator_hour: 2.5, currency: USD}}
profiles:
  # long enough (about a second of wall time at x40) for several readings while the chip is
  # busy: utilization is over the last sample period (1/6 s), so a reading after the work,
  # or a slow npu-smi call spanning a short one, sees 0 % — CI once read a peak of 0
  main: {{label: Main, input_len: 256, output_len: 256, num_prompts: 192, max_concurrency: 16}}
timeouts: {{startup_s: 60, benchmark_s: 120}}
"""


def _results(report: dict) -> list[dict]:
    out = [report["baseline"]["result"]]
    out += [e["result"] for s in report["steps"] for e in s["entries"]]
    return [r for r in out if r.get("status") == "ok"]


@pytest.mark.slow
@pytest.mark.parametrize("hardware, engine, source", [("h100-80g-x1", "vllm", "nvml"), ("910b3-x1", "vllm-ascend", "npu-smi")])
def test_report_json_carries_telemetry_energy_and_cost(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       hardware: str, engine: str, source: str) -> None:
    monkeypatch.setenv("PERFLAB_SIM_STATE_DIR", str(tmp_path / "sim-state"))
    out = tmp_path / "study"
    summary = run_sim_study(PLAN.format(hardware=hardware, engine=engine), out)
    assert summary.exit_code == 0
    report = json.loads((out / "report.json").read_text())
    results = _results(report)
    assert results
    for r in results:
        t = r["telemetry"]
        assert t["source"] == source and t["samples"] >= 1 and t["devices"] == [0]
        # the simulated chip is busy while the benchmark runs: above its idle power
        assert t["power_w"]["peak"] > t["power_w"]["mean"] * 0.5 > 0
        assert t["utilization_pct"]["peak"] > 0
        assert t["memory_used_mib"]["peak"] > 1000  # the engine's weights and KV cache
        e = r["energy"]
        assert e["joules"] > 0 and e["output_tokens_per_joule"] > 0
        tokens, duration = r["metrics"]["total_output_tokens"], r["metrics"]["duration"]
        assert e["output_tokens_per_joule"] == pytest.approx(tokens / e["joules"], rel=1e-3)
        # the mean power lies between the chip's idle and maximum power
        assert 50 < e["joules"] / duration <= 700
        c = r["cost"]
        assert c["currency"] == "USD" and c["per_accelerator_hour"] == 2.5
        assert c["per_million_output_tokens"] == pytest.approx(2.5 * duration / 3600 / tokens * 1e6, rel=1e-3)
    md = (out / "report.md").read_text()
    assert "tok/J" in md and "USD/M tok" in md and "# Energy:" in md
    # the samples are stored with the run
    series = json.loads(next((out / "runs").glob("*/observe-main.json")).read_text())
    assert {"power_w.0", "utilization_pct.0", "memory_used_mib.0"} <= set(series["telemetry"][0]["values"])


TWO_PROFILES = """
name: no-telemetry
model: Qwen/Qwen3-8B
hardware: sim:h100-80g-x1
simulation: {time_scale: 40}
engines: [vllm]
early_stop: false
cost: {per_accelerator_hour: 4, currency: EUR}
profiles:
  main: {label: Main, input_len: 128, output_len: 32, num_prompts: 32, max_concurrency: 8}
  other: {label: Other, input_len: 64, output_len: 32, num_prompts: 16, max_concurrency: 4}
timeouts: {startup_s: 60, benchmark_s: 120}
"""


@pytest.mark.slow
def test_a_study_without_power_readings_completes_and_says_so_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from perflab_sim.nvml import NvmlShim

    def unsupported(self: NvmlShim, handle: object) -> int:
        raise NvmlShim.NVMLError(3)  # NVML_ERROR_NOT_SUPPORTED, as on boards without power readings

    monkeypatch.setattr(NvmlShim, "nvmlDeviceGetPowerUsage", unsupported)
    monkeypatch.setattr(NvmlShim, "nvmlDeviceGetTotalEnergyConsumption", unsupported)
    monkeypatch.setenv("PERFLAB_SIM_STATE_DIR", str(tmp_path / "sim-state"))
    out = tmp_path / "study"
    summary = run_sim_study(TWO_PROFILES, out)
    assert summary.exit_code == 0
    report = json.loads((out / "report.json").read_text())
    results = _results(report) + [c[k] for c in report["cases"] for k in ("baseline", "optimized") if c.get(k)]
    assert len(results) >= 2
    for r in results:
        # the rest of the telemetry still comes; no power, no energy
        assert r["telemetry"]["power_w"] is None and r["telemetry"]["memory_used_mib"]["peak"] > 1000
        assert r["energy"] is None
        assert r["cost"]["currency"] == "EUR" and r["cost"]["per_million_output_tokens"] > 0  # needs no telemetry
    said = [json.loads(line) for line in (out / "study.log").read_text().splitlines() if "observe.telemetry-unavailable" in line]
    assert [e["source"] for e in said] == ["nvml:power_w", "nvml:energy_mj"] and "Not Supported" in said[0]["why"]
    md = (out / "report.md").read_text()
    assert md.count("No accelerator power was recorded") == 1


@pytest.mark.slow
def test_a_study_without_any_telemetry_completes_and_says_so_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from perflab.observe.telemetry import Telemetry, TelemetryUnavailable

    def no_nvml(self: Telemetry) -> object:
        raise TelemetryUnavailable("NVML did not start (Driver Not Loaded)")  # as pynvml says on a host without a driver

    monkeypatch.setattr(Telemetry, "_open_nvml", no_nvml)
    monkeypatch.setenv("PERFLAB_SIM_STATE_DIR", str(tmp_path / "sim-state"))
    out = tmp_path / "study"
    assert run_sim_study(TWO_PROFILES, out).exit_code == 0
    report = json.loads((out / "report.json").read_text())
    results = _results(report) + [c[k] for c in report["cases"] for k in ("baseline", "optimized") if c.get(k)]
    assert len(results) >= 2 and all(r["telemetry"] is None and r["energy"] is None and r["cost"] for r in results)
    said = [line for line in (out / "study.log").read_text().splitlines() if "observe.telemetry-unavailable" in line]
    assert len(said) == 1 and "Driver Not Loaded" in said[0]
    assert (out / "report.md").read_text().count("No accelerator telemetry was recorded") == 1
