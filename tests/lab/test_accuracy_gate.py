"""The accuracy gate in studies (issue 25, item 4): a plan's ``accuracy:``, measured after each
configuration's profiles in the same launch, stored, decided against the engine's reference
and the baseline's score, and reported. The harness and the agreement client are replaced at
their one seam (:class:`perflab.lab.accuracy.AccuracyRunner`) by a scripted model of the
endpoint: these tests are about the lab, not about lm-eval (tests/accuracy covers those)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import anyio
import pytest

from perflab.accuracy.types import Answer, AnswerSet, EvalResult
from perflab.contract.errors import UsageError
from perflab.lab.accuracy import ACCURACY_PROFILE, AccuracyRunner, AccuracySpec, is_lossless
from perflab.lab.plan import job_for, load_plan_text

PLAN = """
name: acc-gate
model: Qwen/Qwen3-8B
hardware: sim:a100-80g-x1
simulation: {time_scale: 50}
engines: [vllm]
candidates:
  - name: Quantization
    variants:
      - {name: AWQ, set: {model: Qwen/Qwen3-8B-AWQ}}
      - {name: FP8, set: {model: Qwen/Qwen3-8B-FP8}}
combinations:  # on the engine's defaults: its only change from the reference is lossless
  - {name: Caching, set: {prefix_caching: true}, base: engine-defaults}
profiles:
  main: {label: Main, input_len: 32, output_len: 8, num_prompts: 10}
timeouts: {startup_s: 60, benchmark_s: 600}
accuracy: {task: perflab_arith, limit: 50, max_drop: 1.0, agreement_margin: 10}
"""

# the scripted endpoint: its score and how many of 16 greedy answers differ from the reference's, by model
SCORES = {"Qwen/Qwen3-8B": 94.0, "Qwen/Qwen3-8B-AWQ": 90.0, "Qwen/Qwen3-8B-FP8": 93.5}
DIVERGING = {"Qwen/Qwen3-8B": 0, "Qwen/Qwen3-8B-AWQ": 1, "Qwen/Qwen3-8B-FP8": 1}


class Scripted:
    """What the fake endpoint was asked, in order: ("evaluate", model, kw) / ("collect", model, concurrency)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Any]] = []
        self.fail: set[str] = set()  # models whose evaluation fails as a dead endpoint would
        self.diverging = dict(DIVERGING)
        self.seconds = 0.0  # how long an evaluation takes (wall time)

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        scripted = self

        async def evaluate(self: AccuracyRunner, base_url: str, model: str, **kw: Any) -> EvalResult:
            assert base_url.startswith("http://127.0.0.1:")  # the launched engine's own endpoint
            scripted.calls.append(("evaluate", model, kw))
            await anyio.sleep(scripted.seconds)
            if model in scripted.fail:
                raise ConnectionError("Connection refused")
            return EvalResult(kw["task"], "exact_match", "strict-match", "gen", SCORES[model], 1.2, kw["limit"], 0.5,
                              "lm-eval 0.4.13", kw["api"])

        async def collect(self: AccuracyRunner, base_url: str, model: str, **kw: Any) -> AnswerSet:
            scripted.calls.append(("collect", model, kw["concurrency"]))
            n = scripted.diverging[model]
            return AnswerSet("stub-v1", kw["concurrency"], tuple(
                Answer(f"p{i}", f"answer {i}" + (" differs" if i < n else "")) for i in range(16)))

        monkeypatch.setattr(AccuracyRunner, "evaluate", evaluate)
        monkeypatch.setattr(AccuracyRunner, "collect", collect)
        monkeypatch.setattr("perflab.lab.accuracy.all_at_once", lambda: 16)


@pytest.fixture
def scripted(monkeypatch: pytest.MonkeyPatch) -> Scripted:
    s = Scripted()
    s.install(monkeypatch)
    return s


def _study(tmp_path: Path, text: str = PLAN, stream: Any = None) -> tuple[Any, dict[str, Any]]:
    from simstudy import run_sim_study

    out = tmp_path / "study"
    summary = run_sim_study(text, out, stream=stream)
    return summary, json.loads((out / "report.json").read_text())


def _entries(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["label"]: e for s in report["steps"] for e in s["entries"]}


# --------------------------------------------------------------------------- the plan


def _plan(accuracy: str) -> Any:
    return load_plan_text(PLAN.replace("accuracy: {task: perflab_arith, limit: 50, max_drop: 1.0, agreement_margin: 10}",
                                       accuracy))


def test_accuracy_defaults_and_absence() -> None:
    assert _plan("").accuracy is None  # no section: no accuracy runs, today's behaviour
    spec = _plan("accuracy: {}").accuracy
    assert spec == AccuracySpec() and spec.task == "perflab_arith" and spec.max_drop == 1.0 and spec.agreement
    assert spec.describe() == "perflab_arith, 200 items"
    assert _plan("accuracy: {task: null}").accuracy.task is None  # agreement only


@pytest.mark.parametrize(("section", "says"), [
    ("accuracy: {task: null, agreement: false}", "nothing to measure"),
    ("accuracy: {lossless: [prefix_cache]}", "accuracy.lossless[0]: unknown serving option 'prefix_cache' (did you mean 'prefix_caching'?)"),
    ("accuracy: {api: grpc}", "accuracy.api: expected one of: chat, completions"),
    # a quantized checkpoint declared lossless would skip the task (and, without agreement, every check)
    ("accuracy: {lossless: [prefix_caching, model], agreement: false}",
     "accuracy.lossless[1]: 'model' changes the weights or the precision the answers are computed with"),
    ("accuracy: {lossless: [kv_cache_dtype]}", "accuracy.lossless[0]: 'kv_cache_dtype' changes the weights"),
    ("accuracy: {lossless: [quantization]}", "accuracy.lossless[0]: 'quantization' changes the weights"),
    ("accuracy: {max_drop: -1}", "accuracy.max_drop: expected a number of points from 0 to 100"),
    ("accuracy: {limit: 0}", "accuracy.limit: expected a positive integer"),
    ("accuracy: {tsk: gsm8k}", "accuracy.tsk: unknown key (did you mean 'task'?)"),
    ("accuracy: {task: no-such-task-file.jsonl}", "accuracy.task: --task "),
])
def test_a_wrong_accuracy_section_is_refused_in_one_line(section: str, says: str) -> None:
    with pytest.raises(UsageError) as err:
        _plan(section)
    assert says in str(err.value) and "\n" not in str(err.value)


def test_a_task_without_lm_eval_is_refused_when_the_plan_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    from perflab.accuracy import harness

    def missing() -> None:
        raise harness.AccuracyUnavailable("perflab eval needs lm-evaluation-harness: pip install 'perflab[accuracy]'")

    monkeypatch.setattr(harness, "ensure_available", missing)
    with pytest.raises(UsageError) as err:
        _plan("accuracy: {task: gsm8k}")
    assert "accuracy.task: " in str(err.value) and "pip install 'perflab[accuracy]'" in str(err.value)
    assert _plan("accuracy: {task: null}").accuracy is not None  # agreement needs no extra
    # a finished study's stored plan is re-read without measuring anything: not refused
    assert load_plan_text(PLAN, check_files=False).accuracy is not None


def test_lossless_changes_skip_the_task_and_keep_agreement() -> None:
    plan = _plan("accuracy: {lossless: [extra_args]}")
    base = plan.baseline_config()
    spec = plan.accuracy
    assert is_lossless(spec, base, base.with_delta({"prefix_caching": True, "max_num_seqs": 64}))
    assert is_lossless(spec, base, base.with_delta({"speculative_config": {"method": "ngram"}}))
    assert is_lossless(spec, base, base.with_delta({"extra_args": ["--performance-mode=throughput"]}))  # the plan's
    assert not is_lossless(spec, base, base.with_delta({"prefix_caching": True, "kv_cache_dtype": "fp8"}))
    assert not is_lossless(spec, base, base)  # the reference itself: no change
    ref = job_for(plan, base)
    assert ref.reference and ref.task
    cached = job_for(plan, base.with_delta({"prefix_caching": True}))
    assert not cached.reference and not cached.task and cached.key() != ref.key()
    awq = job_for(plan, base.with_delta({"model": "Qwen/Qwen3-8B-AWQ"}))
    assert awq.task and not awq.reference


def test_the_serving_options_table_names_the_lossless_options() -> None:
    from perflab.lab.options import LOSSLESS_OPTIONS, options_table

    assert {"prefix_caching", "chunked_prefill", "max_batched_tokens", "max_num_seqs", "speculative_config"} \
        <= LOSSLESS_OPTIONS
    assert not LOSSLESS_OPTIONS & {"model", "quantization", "kv_cache_dtype", "tp", "extra_args"}
    rows = [r for r in options_table().splitlines() if "Lossless" in r]
    assert len(rows) == len(LOSSLESS_OPTIONS)
    text = (Path(__file__).resolve().parents[2] / "docs" / "plan-reference.md").read_text()
    assert options_table() in text  # regenerated: python -m perflab.lab.options --write docs/plan-reference.md


# --------------------------------------------------------------------------- a study with the gate


def test_the_gate_rejects_a_lossy_candidate_and_skips_the_task_of_a_lossless_one(tmp_path: Path,
                                                                                   scripted: Scripted) -> None:
    progress = io.StringIO()
    summary, report = _study(tmp_path, stream=progress)
    entries = _entries(report)
    base, awq, fp8, cached = (entries[k] for k in ("vLLM", "vLLM AWQ", "vLLM FP8", "vLLM Caching"))
    # the progress says so as soon as it is judged, once, not a bare ✓
    assert progress.getvalue().count("✗ vLLM AWQ: rejected: accuracy -4.0 points (perflab_arith)\n") == 1
    assert "✗ vLLM FP8" not in progress.getvalue()
    # the reference (the baseline) collects twice, one prompt then all at once: its noise floor
    assert [c for c in scripted.calls if c[1] == "Qwen/Qwen3-8B" and c[0] == "collect"][:2] == [
        ("collect", "Qwen/Qwen3-8B", 1), ("collect", "Qwen/Qwen3-8B", 16)]
    assert [c[2] for c in scripted.calls if c[1] == "Qwen/Qwen3-8B-AWQ" and c[0] == "collect"] == [16]
    asked = next(c[2] for c in scripted.calls if c[0] == "evaluate")
    assert asked["task"] == "perflab_arith" and asked["limit"] == 50 and asked["api"] == "chat"

    assert base["accuracy"]["gate"] == "pass" and base["accuracy"]["drop"] == 0.0
    assert base["accuracy"]["agreement"]["floor"] == 100.0 and base["accuracy"]["simulated"] is True
    # AWQ: 4 points below the baseline's 94 with max_drop 1: rejected, named as the issue writes it
    assert awq["accuracy"]["gate"] == "rejected" and awq["accuracy"]["drop"] == pytest.approx(4.0)
    assert awq["eligible"] is False and awq["note"] == "rejected: accuracy -4.0 points (perflab_arith)"
    # FP8: 0.5 points, 15 of 16 answers agree (93.75 % against a floor of 100 %, margin 10): passes
    assert fp8["accuracy"]["gate"] == "pass" and fp8["eligible"] is True
    assert fp8["accuracy"]["agreement"]["exact_match"] == pytest.approx(93.75)
    assert cached["accuracy"]["gate"] == "skipped (lossless)" and cached["accuracy"]["score"] is None
    quant = report["steps"][1]
    assert "rejected by the accuracy gate: vLLM AWQ (accuracy -4.0 points (perflab_arith))" in quant["statement"]
    # every measured configuration carries its verdict
    assert {r["label"] for r in report["accuracy"]["rows"]} == {"vLLM", "vLLM AWQ", "vLLM FP8", "vLLM Caching"}
    assert report["baseline"]["accuracy"]["gate"] == "pass"
    md = (tmp_path / "study" / "report.md").read_text()
    assert "## Accuracy" in md
    assert "| vLLM AWQ | perflab_arith | 90.00 (simulated) | -4.00 points | 93.8% vs floor 100.0% (margin 10) | " \
           "rejected: accuracy -4.0 points (perflab_arith) |" in md
    assert "Its accuracy price: perflab_arith" in md
    html = (tmp_path / "study" / "report.html").read_text()
    assert "rejected: accuracy -4.0 points (perflab_arith)" in html and "90.00 (simulated)" in html


def test_agreement_below_the_noise_floor_rejects(tmp_path: Path, scripted: Scripted) -> None:
    scripted.diverging["Qwen/Qwen3-8B-FP8"] = 4  # 75 % of answers agree: below 100 % − 10
    _, report = _study(tmp_path)
    fp8 = _entries(report)["vLLM FP8"]
    assert fp8["eligible"] is False and fp8["accuracy"]["gate"] == "rejected"
    assert fp8["accuracy"]["agreement"]["ok"] is False
    assert fp8["note"].startswith("rejected: accuracy: agreement 75.0% with vLLM")


def test_an_endpoint_failing_during_accuracy_is_that_runs_failure(tmp_path: Path, scripted: Scripted) -> None:
    scripted.fail.add("Qwen/Qwen3-8B-FP8")
    _, report = _study(tmp_path)
    fp8 = _entries(report)["vLLM FP8"]
    assert fp8["result"]["status"] == "ok"  # its benchmark stands
    assert fp8["eligible"] is False and fp8["accuracy"]["gate"] == "not measured"
    assert "ConnectionError: Connection refused" in fp8["note"]


def test_the_baseline_failing_its_accuracy_run_passes_nothing_and_says_why(tmp_path: Path, scripted: Scripted) -> None:
    import io

    from perflab.lab.run.runner import print_summary

    scripted.fail.add("Qwen/Qwen3-8B")  # the baseline's evaluation fails: no score to judge any drop against
    summary, report = _study(tmp_path)
    base = _entries(report)["vLLM"]
    assert base["result"]["status"] == "ok" and base["eligible"] is False
    assert base["accuracy"]["gate"] == "not measured" and report["optimized"] is None
    md = (tmp_path / "study" / "report.md").read_text()
    # it served the main profile: the conclusion names the gate, never "no configuration served"
    assert "No configuration served the main profile" not in md
    assert "No measured configuration is eligible, so there is nothing to recommend: vLLM (accuracy not measured (" in md
    err = io.StringIO()
    import contextlib

    with contextlib.redirect_stderr(err):
        print_summary(summary, io.StringIO())
    line = err.getvalue()
    assert "(exit 6): no measured configuration is eligible: vLLM (accuracy not measured (" in line
    assert "ConnectionError: Connection refused" in line and line.count("\n") == 1
    assert "--retry-failed measures the failed accuracy runs again" in line


def test_an_engine_reference_measured_outside_the_steps_is_in_the_accuracy_table(tmp_path: Path,
                                                                                  scripted: Scripted) -> None:
    # SGLang is not in the engine step: its reference (its defaults) is measured for its
    # candidate alone, and the floor that judged the candidate must be shown
    text = PLAN.replace("    variants:\n      - {name: AWQ", "    engines: [sglang]\n    variants:\n      - {name: AWQ", 1)
    _, report = _study(tmp_path, text)
    rows = {r["label"]: r for r in report["accuracy"]["rows"]}
    ref = rows["SGLang (accuracy reference)"]
    assert ref["engine"] == "sglang" and ref["gate"] == "pass" and ref["score"] == 94.0
    assert ref["agreement"]["floor"] == 100.0
    assert rows["SGLang AWQ"]["reference"] == "SGLang (accuracy reference)"
    md = (tmp_path / "study" / "report.md").read_text()
    table = md.split("## Accuracy", 1)[1].split("\n## ", 1)[0]
    assert "| SGLang (accuracy reference) | perflab_arith | 94.00 (simulated) | +0.00 points | " \
           "reference: floor 100.0% | pass |" in table


def test_the_accuracy_price_of_a_reference_does_not_read_as_agreement_with_another(tmp_path: Path,
                                                                                   scripted: Scripted) -> None:
    # every candidate rejected: the recommendation is the baseline, its engine's reference,
    # whose "agreement" is only its own noise floor
    scripted.diverging["Qwen/Qwen3-8B-FP8"] = 4
    # without the lossless Caching combination, which passes and could beat the baseline by noise
    plan = PLAN.replace("combinations:  # on the engine's defaults: its only change from the reference is lossless\n"
                        "  - {name: Caching, set: {prefix_caching: true}, base: engine-defaults}\n", "")
    assert plan != PLAN
    _, report = _study(tmp_path, plan)
    assert report["optimized"]["label"] == "vLLM"
    md = (tmp_path / "study" / "report.md").read_text()
    assert "Its accuracy price: perflab_arith 94.00 (simulated), +0.00 points vs the baseline's 94.00; greedy answers " \
           "not compared with another configuration's (it is vLLM's accuracy reference: noise floor 100.0%)." in md
    assert "| vLLM | perflab_arith | 94.00 (simulated) | +0.00 points | reference: floor 100.0% | pass |" in md
    assert "| vLLM FP8 | perflab_arith | 93.50 (simulated) | -0.50 points | 75.0% vs floor 100.0% (margin 10) |" in md


def test_resume_and_rebuild_keep_accuracy_and_do_not_measure_it_again(tmp_path: Path, scripted: Scripted) -> None:
    from perflab.lab.run.runner import write_study_report
    from perflab.lab.store import rebuild

    summary, first = _study(tmp_path)
    out = tmp_path / "study"
    files = sorted(p.name for p in (out / "runs").glob("*/measurement-accuracy-*.json"))
    assert len(files) == 4  # one per configuration, in its run directory
    before = len(scripted.calls)
    again, second = _study(tmp_path)
    assert len(scripted.calls) == before and again.measured == 0  # nothing measured again
    assert _entries(second)["vLLM AWQ"]["accuracy"] == _entries(first)["vLLM AWQ"]["accuracy"]
    (out / "study.db").unlink()
    rebuild(out)
    _, paths = write_study_report(out)
    rebuilt = json.loads(paths["json"].read_text())
    assert rebuilt["accuracy"]["rows"] == second["accuracy"]["rows"]


def test_accuracy_added_to_a_measured_study_measures_only_accuracy(tmp_path: Path, scripted: Scripted) -> None:
    no_gate = PLAN.replace("accuracy: {task: perflab_arith, limit: 50, max_drop: 1.0, agreement_margin: 10}", "")
    _study(tmp_path, no_gate)
    assert scripted.calls == []
    summary, report = _study(tmp_path)  # same frame: the benchmarks are reused, accuracy launched for
    assert summary.reused > 0 and _entries(report)["vLLM AWQ"]["accuracy"]["gate"] == "rejected"
    assert {c[1] for c in scripted.calls if c[0] == "evaluate"} == set(SCORES)


def test_the_accuracy_profile_name_is_reserved() -> None:
    with pytest.raises(UsageError, match="reserved"):
        load_plan_text(PLAN.replace("  main: {label: Main", f"  '{ACCURACY_PROFILE}': {{label: X, input_len: 1, "
                                    "output_len: 1}\n  main: {label: Main"))


def test_accuracy_time_counts_in_engine_hours_and_report_json_carries_it(tmp_path: Path, scripted: Scripted,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    import sqlite3

    from perflab.cli import main

    scripted.seconds = 1.0  # each evaluation holds the engine one wall second: 50 engine seconds at time_scale 50
    _study(tmp_path)
    out = tmp_path / "study"
    db = sqlite3.connect(out / "study.db")
    rows = db.execute("SELECT r.engine_seconds FROM runs r JOIN measurements m ON m.run_id = r.id"
                      " WHERE m.profile = ? AND m.status = 'ok'", (ACCURACY_PROFILE,)).fetchall()
    db.close()
    scored = sum(1 for c in scripted.calls if c[0] == "evaluate")
    assert len(rows) == 4 and scored == 3  # the lossless configuration skipped the task
    assert sorted(r[0] for r in rows)[-scored:][0] >= 50.0
    capsys.readouterr()
    main(["report", str(out), "--json"])
    data = json.loads(capsys.readouterr().out)
    assert {r["gate"] for r in data["accuracy"]["rows"]} == {"pass", "rejected", "skipped (lossless)"}


# --------------------------------------------------------------------------- the verdict alone


def _record(score: float | None, answers: list[list[str]], *, reference: bool = False, task: bool = True) -> dict[str, Any]:
    from perflab.lab.accuracy import AccuracyJob

    spec = AccuracySpec(limit=50)
    result = (EvalResult("perflab_arith", "exact_match", "strict-match", "gen", score, 1.0, 50, 1.0, "lm-eval 0.4.13",
                         "chat").to_json() if score is not None else None)
    sets = [AnswerSet("stub-v1", 1, tuple(Answer(f"p{i}", t) for i, t in enumerate(texts))).to_json()
            for texts in answers]
    return {"job": AccuracyJob(spec, reference, task).to_json(), "eval": result, "answers": sets, "simulated": False}


def test_a_drop_of_exactly_max_drop_passes_and_one_beyond_it_is_rejected() -> None:
    from perflab.lab.accuracy import decide

    same = [["a", "b", "c", "d"]]
    base = _record(90.0, same * 2, reference=True)
    spec = AccuracySpec(limit=50, max_drop=1.0)
    at = decide(spec, _record(89.0, same), reference=base, baseline=base, reference_label="vLLM")
    assert (at.block["gate"], at.rejected, at.block["drop"]) == ("pass", False, 1.0)
    beyond = decide(spec, _record(88.9, same), reference=base, baseline=base, reference_label="vLLM")
    assert beyond.rejected and beyond.note == "rejected: accuracy -1.1 points (perflab_arith)"
    assert beyond.block["simulated"] is False


def test_what_cannot_be_judged_is_not_eligible_and_says_why() -> None:
    from perflab.lab.accuracy import decide

    same = [["a", "b"]]
    spec = AccuracySpec(limit=50)
    # the baseline's score is missing: never adopted blind
    v = decide(spec, _record(90.0, same), reference=_record(None, same * 2, reference=True, task=False),
               baseline=None, reference_label="vLLM")
    assert v.rejected and v.block["gate"] == "not judged" and "baseline's score was not measured" in v.note
    # no accuracy measurement at all (the run failed it)
    v = decide(spec, None, reference=None, baseline=None, reference_label="vLLM", missing="benchmark failed: boom")
    assert v.rejected and v.block["gate"] == "not measured" and v.note == "accuracy not measured (benchmark failed: boom)"
    # agreement off: the score alone decides
    v = decide(AccuracySpec(limit=50, agreement=False), _record(90.0, []), reference=None,
               baseline=_record(90.5, [], reference=True), reference_label="vLLM")
    assert v.block["gate"] == "pass" and v.block["agreement"] is None and not v.rejected


def test_the_demo_gates_on_its_task_and_without_lm_eval_keeps_agreement_only(monkeypatch: pytest.MonkeyPatch) -> None:
    from perflab.accuracy import harness
    from perflab.lab.demo import demo_plan, harness_missing

    spec = demo_plan().accuracy
    assert spec is not None and spec.task == "perflab_arith" and spec.limit is None and spec.agreement
    assert harness_missing() is None

    def missing() -> None:
        raise harness.AccuracyUnavailable("accuracy evaluation needs lm-evaluation-harness: pip install 'perflab[accuracy]'")

    monkeypatch.setattr(harness, "ensure_available", missing)
    assert "pip install 'perflab[accuracy]'" in (harness_missing() or "")
    spec = demo_plan().accuracy
    assert spec is not None and spec.task is None and spec.agreement  # agreement needs no extra


def test_a_parallel_study_gates_as_a_sequential_one(tmp_path: Path, scripted: Scripted) -> None:
    from simstudy import run_sim_study

    text = PLAN.replace("hardware: sim:a100-80g-x1", "hardware: sim:a100-80g-x8")
    run_sim_study(text, tmp_path / "par", parallel=2)
    par = json.loads((tmp_path / "par" / "report.json").read_text())
    gates = {r["label"]: (r["gate"], r["eligible"]) for r in par["accuracy"]["rows"]}
    assert gates == {"vLLM": ("pass", True), "vLLM AWQ": ("rejected", False), "vLLM FP8": ("pass", True),
                     "vLLM Caching": ("skipped (lossless)", True)}
