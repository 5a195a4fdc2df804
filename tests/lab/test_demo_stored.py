"""The demo's decisions and figures equal a stored run (tests/fixtures/demo/decisions.json).

A redesign must not move what `perflab demo` concludes. The digest keeps what a reader of the
report acts on: each step's chosen configuration, every entry's status,
eligibility and accuracy verdict, and the figures of every measurement that ran to the end
(vLLM bench serve's metrics, the conclusion's changes, the accuracy scores). Two figures are
left out because they are wall-clock facts, not the simulated engines': the partial figures
of a measurement stopped early (where early stop cuts depends on when the host's windows
close) and the telemetry/server-metric samples (taken on the host's clock). Completed runs
are measured on the engines' model clock; they agree between runs within FIGURE_RTOL
(a busy host's client sends late, which moves them a little).

Regenerate after a deliberate change of the simulator or the demo plan:
``python tests/lab/test_demo_stored.py --update STUDY_DIR`` (a study written by `perflab demo -o STUDY_DIR`).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from perflab.lab.report.schema import json_schema

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "demo" / "decisions.json"
# model-clock figures of a completed run differ between two runs on a quiet host by < 0.05 %
# (measured: the TensorRT-LLM stand-in 1872.33 vs 1871.51 tok/s; vLLM's agree to 1e-8), on a
# host loaded to ~3x its cores by up to ~1.3 % (the baseline's mean TTFT, 79.1 vs 80.1 s: its
# client sends late). A changed model or decision moves figures by far more; decisions are exact.
FIGURE_RTOL = 3e-2
METRICS = ("completed", "total_input_tokens", "total_output_tokens", "request_throughput", "output_throughput",
           "total_token_throughput", "mean_ttft_ms", "median_ttft_ms", "mean_tpot_ms", "mean_itl_ms", "mean_e2el_ms")


def _entry(e: dict[str, Any]) -> dict[str, Any]:
    r = e["result"]
    acc = e.get("accuracy") or {}
    out: dict[str, Any] = {"label": e["label"], "engine": e["engine"], "eligible": e["eligible"], "status": r["status"],
                           "gate": acc.get("gate"), "score": acc.get("score")}
    if r["status"] == "ok":
        out["metrics"] = {k: r["metrics"][k] for k in METRICS if k in r["metrics"]}
    return out


def digest(report: dict[str, Any]) -> dict[str, Any]:
    """What the demo decided and measured, without the wall-clock facts (module docstring)."""
    steps = [{"name": s["name"], "chosen": s["chosen"], "adopted": s["adopted"], "skipped": s["skipped"],
              "entries": [_entry(e) for e in s["entries"]]} for s in report["steps"]]
    cases = [{"profile": c["profile"], "baseline": _entry({**c["baseline"], "label": "baseline", "engine": None,
                                                          "eligible": None, "result": c["baseline"]}),
              "optimized": _entry({**c["optimized"], "label": "optimized", "engine": None, "eligible": None,
                                   "result": c["optimized"]})} for c in report["cases"]]
    conclusion = [{k: c[k] for k in ("profile", "baseline_total_token_throughput", "optimized_total_token_throughput",
                                      "baseline_mean_tpot_ms", "optimized_mean_tpot_ms", "change_pct")}
                  for c in report["conclusion"]]
    accuracy = [{k: r[k] for k in ("label", "engine", "eligible", "score", "baseline_score", "drop", "gate")}
                | {"agreement": (r["agreement"] or {}).get("exact_match")} for r in report["accuracy"]["rows"]]
    return {"recommended_command": report["recommended_command"], "complete": report["complete"],
            "baseline": {"label": report["baseline"]["label"], "engine": report["baseline"]["engine"]},
            "optimized": {"label": report["optimized"]["label"], "engine": report["optimized"]["engine"],
                          "config": report["optimized"]["config"]},
            "steps": steps, "cases": cases, "conclusion": conclusion, "accuracy": accuracy}


def _pct_tolerance(stored: float) -> float:
    """A change in percent, ``(o / b - 1) * 100``, moves by up to ``(1 + c) * 2 * FIGURE_RTOL``
    points when each of ``o`` and ``b`` moves by FIGURE_RTOL: a relative tolerance on the change
    itself would be far tighter than on the figures it comes from (12.76 % vs 12.21 % is a 0.5 %
    move of one throughput)."""
    return (1 + abs(stored) / 100) * 2 * FIGURE_RTOL * 100


def differences(stored: Any, now: Any, path: str = "") -> list[str]:
    """Each place where ``now`` differs from ``stored`` (floats: beyond FIGURE_RTOL; a change in
    percent, ``*_pct``, beyond what FIGURE_RTOL on its two figures allows), one line each."""
    if isinstance(stored, float) or isinstance(now, float):
        if isinstance(stored, (int, float)) and isinstance(now, (int, float)):
            if path.endswith("_pct"):
                if abs(stored - now) <= _pct_tolerance(stored):
                    return []
            elif math.isclose(stored, now, rel_tol=FIGURE_RTOL, abs_tol=1e-9):
                return []
        return [f"{path}: stored {stored!r}, now {now!r}"]
    if isinstance(stored, dict) and isinstance(now, dict):
        out = [f"{path}/{k}: {'only stored' if k in stored else 'only now'}" for k in sorted(set(stored) ^ set(now))]
        for k in sorted(set(stored) & set(now)):
            out += differences(stored[k], now[k], f"{path}/{k}")
        return out
    if isinstance(stored, list) and isinstance(now, list):
        if len(stored) != len(now):
            return [f"{path}: {len(stored)} items stored, {len(now)} now"]
        return [d for i, (a, b) in enumerate(zip(stored, now, strict=True)) for d in differences(a, b, f"{path}[{i}]")]
    return [] if stored == now else [f"{path}: stored {stored!r}, now {now!r}"]


def test_differences_sees_a_changed_decision_and_a_moved_figure() -> None:
    stored = {"chosen": "TensorRT-LLM", "metrics": {"total_token_throughput": 1872.33, "completed": 1000}}
    assert differences(stored, json.loads(json.dumps(stored))) == []
    assert differences(stored, {**stored, "chosen": "vLLM"}) == ["/chosen: stored 'TensorRT-LLM', now 'vLLM'"]
    assert differences(stored, {**stored, "metrics": {"total_token_throughput": 1872.33 * (1 + FIGURE_RTOL / 3), "completed": 1000}}) == []
    moved = differences(stored, {**stored, "metrics": {"total_token_throughput": 1872.33 * (1 + 2 * FIGURE_RTOL), "completed": 1000}})
    assert moved and moved[0].startswith("/metrics/total_token_throughput")
    assert differences(stored, {**stored, "metrics": {"total_token_throughput": 1872.33, "completed": 999}})
    # a change in percent: its two figures each moving within FIGURE_RTOL is no difference; a
    # change that shrinks by four fifths is
    change = {"change_pct": 12.756763619793507}
    assert differences(change, {"change_pct": 12.209493663438938}) == []
    assert differences(change, {"change_pct": 2.5})


@pytest.mark.slow
def test_the_demo_decides_and_measures_what_the_stored_run_did(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    proc = subprocess.run([sys.executable, "-m", "perflab", "demo", "-o", str(out), "--no-live", "--json"],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((out / "report.json").read_text(encoding="utf-8"))
    # the demo's report.json is what docs/report.schema.json says (tests/lab/test_report_schema.py)
    jsonschema.validate(report, json_schema(), cls=jsonschema.Draft202012Validator)
    now = digest(report)
    stored = json.loads(FIXTURE.read_text(encoding="utf-8"))
    diffs = differences(stored, now)
    assert not diffs, "the demo changed against tests/fixtures/demo/decisions.json:\n" + "\n".join(diffs[:40])
    seed_002_decisions(report, out)


def seed_002_decisions(report: dict[str, Any], out: Path) -> None:
    """The demo makes seed 002's decisions and its reports say so: TensorRT-LLM wins engine
    selection, its AWQ checkpoint crashes with KeyError: 'weight', SGLang's FP8 is refused
    before launch, and the accuracy gate rejects vLLM's AWQ checkpoint (its simulated score
    drops); every measured profile carries its telemetry, energy and cost (the plan has a price)."""
    assert report["steps"][0]["chosen"] == "TensorRT-LLM"
    quant = {e["label"]: e for e in report["steps"][1]["entries"]}
    assert quant["SGLang FP8"]["result"]["status"] == "unsupported"
    assert quant["TensorRT-LLM AWQ"]["result"]["status"] == "crashed"
    assert "KeyError: 'weight'" in (quant["TensorRT-LLM AWQ"]["result"].get("cause") or {}).get("line", "")
    md = (out / "report.md").read_text(encoding="utf-8")
    html = (out / "report.html").read_text(encoding="utf-8")
    assert md.startswith("# Optimizing Qwen3-32B") and "> [!WARNING]\n> **Simulated study**" in md
    assert "# KeyError: 'weight'" in md and "SGLang's FP8" in md
    assert "trtllm-serve Qwen/Qwen3-32B" in md
    assert (out / "chart.png").read_bytes().startswith(b"\x89PNG")
    measured = [e["result"] for s in report["steps"] for e in s["entries"] if e["result"]["status"] == "ok"]
    assert measured
    for r in measured:
        assert r["telemetry"]["source"] == "nvml" and r["telemetry"]["power_w"]["peak"] > 0
        assert r["energy"]["joules"] > 0 and r["energy"]["output_tokens_per_joule"] > 0
        assert r["cost"]["per_million_output_tokens"] > 0 and r["cost"]["currency"] == "USD"
    # every measured configuration carries its accuracy (simulated), and the AWQ checkpoint's
    # drop is rejected by the gate — in report.json, report.md and report.html
    gated = [e for s in report["steps"] for e in s["entries"] if e["result"]["status"] in ("ok", "stopped-early")]
    assert gated and all(e["accuracy"]["simulated"] is True for e in gated)
    assert all(e["accuracy"]["agreement"] for e in gated)
    # a lossless change (the batch limits of the last step) is not scored: the task is skipped
    assert all(e["accuracy"]["score"] is not None for e in gated if e["accuracy"]["gate"] != "skipped (lossless)")
    assert any(e["accuracy"]["score"] is not None for e in gated)
    rejected = {e["label"]: e for e in gated if e["accuracy"]["gate"] == "rejected"}
    assert "vLLM AWQ" in rejected and rejected["vLLM AWQ"]["eligible"] is False
    reason = rejected["vLLM AWQ"]["accuracy"]["reason"]  # its note also says it stopped early, when it did
    assert reason.startswith("rejected: accuracy -") and " points (perflab_arith)" in reason
    assert reason.count("rejected") == 1  # one verdict, however many measures reject it
    assert reason in rejected["vLLM AWQ"]["note"]
    assert {r["label"] for r in report["accuracy"]["rows"]} >= set(rejected)
    assert "## Accuracy" in md and reason in md and reason in html


if __name__ == "__main__":  # python tests/lab/test_demo_stored.py --update STUDY_DIR
    if len(sys.argv) != 3 or sys.argv[1] != "--update":
        sys.exit("usage: python tests/lab/test_demo_stored.py --update STUDY_DIR")
    report = json.loads((Path(sys.argv[2]) / "report.json").read_text(encoding="utf-8"))
    FIXTURE.write_text(json.dumps(digest(report), indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(f"wrote {FIXTURE}")
