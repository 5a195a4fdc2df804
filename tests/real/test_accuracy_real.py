"""Accuracy against the real vLLM (CPU build 0.32.0; issue 25 item 6).

The tiny model itself repeats one token whatever it is asked, so agreement could not tell a
lossy configuration from a lossless one: these checks serve its ``varied`` variant (weights
scaled up: context-dependent answers, a new token almost every step) and, as the lossy
candidate, its ``perturbed`` variant (noise on every weight) — perflab.realengine.variants.

One launch per configuration (four in all), each reused for every check on it; nothing left
behind. The figures printed (``-s``) are the ones in docs/real-engines.md.
"""

from __future__ import annotations

import json
import re
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import anyio
from reallab import RealLab, free_port
from test_real_vllm import _scrape

from perflab.accuracy.agreement import collect, compare
from perflab.accuracy.tasks import SHIPPED_TASK
from perflab.accuracy.types import Agreement, AnswerSet
from perflab.realengine import VLLM_CPU_SERVE_ARGS
from perflab.realengine.variants import ensure_variant

READY_RE = re.compile(r"ready in ([\d.]+) s at (http://\S+);")
# the model's own limit: lm-eval's prompt (the question) and up to EVAL_GEN_TOKS answer tokens
MAX_MODEL_LEN = "2048"
EVAL_LIMIT = 20
EVAL_GEN_TOKS = 64
#: points of exact match a candidate may fall below the floor's (judge's margin)
MARGIN = 10.0


@contextmanager
def serving(lab: RealLab, name: str, model: Path, *extra: str) -> Iterator[str]:
    """``perflab launch vllm`` on ``model`` until the block ends: yields the base URL."""
    port = free_port()
    proc = lab.popen(*lab.launch_args("--port", str(port), "--workdir", str(lab.tmp / name), *extra,
                                      model=model, max_model_len=MAX_MODEL_LEN))
    try:
        m = READY_RE.search(proc.wait_for_line("ready in", timeout=300))
        assert m, "".join(proc.err[-30:])
        yield m.group(2)
    finally:
        rc, _, err = proc.stop(signal.SIGINT, timeout=90)
    assert rc == 0, err[-3000:]
    lab.assert_nothing_left(port)


def _collect(base_url: str, concurrency: int) -> AnswerSet:
    return anyio.run(partial(collect, base_url, "tiny", concurrency=concurrency))


def _figures(a: Agreement) -> str:
    fd = "none" if a.first_divergence is None else f"{a.first_divergence:.1f}"
    lp = "n/a" if a.mean_abs_logprob_diff is None else f"{a.mean_abs_logprob_diff:.4f}"
    return f"exact {a.exact_match:.0f} % of {a.samples}, first divergence {fd}, mean |dlogprob| {lp}"


def test_eval_and_the_noise_floor_on_the_real_vllm(lab: RealLab) -> None:
    """``perflab eval`` end to end through lm-eval, and the baseline's agreement with itself
    under load, on one launch (lossless and lossy candidates: the study below)."""
    varied = ensure_variant(lab.env, "varied")
    result_dir = lab.tmp / "eval"

    with serving(lab, "baseline", varied) as base_url:
        # perflab eval: the shipped task through lm-eval's local-chat-completions model, end to end
        before = _scrape(base_url)
        r = lab.run("eval", "--base-url", base_url, "--model", "tiny", "--limit", str(EVAL_LIMIT),
                    "--max-gen-toks", str(EVAL_GEN_TOKS), "--save-result", "--result-dir", str(result_dir),
                    "--result-filename", "eval.json", "--json", timeout=600)
        assert r.rc == 0, r.stdout[-2000:] + r.stderr[-3000:]
        res = r.json()
        # the tiny model's score is meaningless (random weights): the plumbing is what is checked
        assert res["task"] == SHIPPED_TASK and res["samples"] == EVAL_LIMIT
        assert isinstance(res["score"], float) and 0.0 <= res["score"] <= 100.0
        assert res["metric"] == "exact_match" and res["harness"].startswith("lm-eval ")
        assert res["simulated"] is False  # the real engine: no simulator's time-scale header
        # every item was a request vLLM answered, each at most --max-gen-toks long
        served = {k: _scrape(base_url)[k] - before[k]
                  for k in ("vllm:request_success_total", "vllm:generation_tokens_total")}
        assert served["vllm:request_success_total"] == EVAL_LIMIT, served
        assert 0 < served["vllm:generation_tokens_total"] <= EVAL_LIMIT * EVAL_GEN_TOKS, served
        stored = json.loads((result_dir / "eval.json").read_text())
        assert {k: stored[k] for k in ("task", "score", "samples")} == {k: res[k] for k in ("task", "score", "samples")}
        assert stored["perflab"]["served_model_name"] == "tiny" and stored["perflab"]["limit"] == EVAL_LIMIT

        # the noise floor: the baseline's answers one at a time, then all at once
        first = _collect(base_url, 1)
        second = _collect(base_url, len(first.answers))
    floor = compare(first, second)
    print(f"\nperflab eval on the real vLLM: {res['score']:.1f} on {res['samples']} items in {res['seconds']:.1f} s; "
          f"agreement of the baseline with itself under load (the noise floor): {_figures(floor)}")
    assert floor.samples == len(first.answers) > 0
    assert all(a.error is None and a.logprobs for a in first.answers + second.answers)
    # the variant answers in varied tokens (what makes agreement able to discriminate)
    assert all(len(set(a.tokens or ())) > len(a.tokens or ()) // 2 for a in first.answers)
    # measured 100 % (bitwise equal logprobs) on this build in float32 (docs/real-engines.md): a
    # lower floor means the build is not batch-invariant on this CPU, and the docs must say so
    assert floor.exact_match >= 100 - MARGIN, _figures(floor)


# --------------------------------------------------------------------------- the gate in a study


def test_the_accuracy_gate_in_a_real_study(lab: RealLab) -> None:
    """A plan with ``accuracy:`` on the real vLLM: the baseline scored and its noise floor
    measured, a lossless candidate (a smaller batch) kept without the task, a lossy one (the
    perturbed weights) rejected by agreement. The tiny model scores 0 on the task whatever its
    weights (random text), so here the task's drop cannot reject anything: agreement does."""
    varied = ensure_variant(lab.env, "varied")
    perturbed = ensure_variant(lab.env, "perturbed")
    plan = lab.tmp / "plan.yaml"
    plan.write_text(f"""
name: real-vllm-accuracy
model: {{path: {varied}, name: tiny}}
hardware: auto
engines: [vllm]
serve:
  served_model_name: tiny
  max_model_len: {MAX_MODEL_LEN}
  extra_args: {json.dumps(list(VLLM_CPU_SERVE_ARGS))}
  env: {{VLLM_CPU_KVCACHE_SPACE: "1"}}
candidates:
  - name: Max Num Seqs
    variants:
      - {{name: "4", set: {{max_num_seqs: 4}}}}
  - name: Weights
    variants:
      - {{name: Perturbed, set: {{model: {perturbed}}}}}
profiles:
  short: {{label: Short Prompt, input_len: 48, output_len: 12, num_prompts: 24, seed: 42}}
accuracy: {{task: {SHIPPED_TASK}, limit: {EVAL_LIMIT}, max_drop: 1.0, agreement: true, agreement_margin: {MARGIN:g}}}
timeouts: {{startup_s: 300, benchmark_s: 300, teardown_s: 10}}
""")
    out = lab.tmp / "study"
    r = lab.run("run", str(plan), "--hardware", "auto", "--out", str(out), timeout=900)
    assert r.rc == 0, r.stdout[-3000:] + r.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    entries = {e["label"]: e for s in report["steps"] for e in s["entries"]}
    print(f"\nreal study with the accuracy gate: {r.seconds:.0f} s; "
          + "; ".join(f"{k}: {e['accuracy']}" for k, e in entries.items()))
    base = report["baseline"]["accuracy"]
    assert base["gate"] == "pass" and base["simulated"] is False
    assert base["task"] == SHIPPED_TASK and base["samples"] == EVAL_LIMIT and base["drop"] == 0.0
    assert base["agreement"]["floor"] == base["agreement"]["exact_match"]  # the reference against itself
    (batch,) = [e for k, e in entries.items() if k.endswith(" 4")]
    (lossy,) = [e for k, e in entries.items() if k.endswith("Perturbed")]
    assert batch["accuracy"]["gate"] == "skipped (lossless)" and batch["accuracy"]["score"] is None
    assert batch["accuracy"]["agreement"]["ok"] is True
    assert lossy["accuracy"]["gate"] == "rejected" and lossy["eligible"] is False
    assert lossy["accuracy"]["drop"] <= 1.0  # scored, and not rejected by the task: by agreement
    assert lossy["accuracy"]["agreement"]["ok"] is False
    assert lossy["accuracy"]["agreement"]["exact_match"] < base["agreement"]["floor"] - MARGIN
    assert lossy["note"] == lossy["accuracy"]["reason"]
    assert lossy["note"].startswith("rejected: accuracy: agreement 0.0% with vLLM, below its noise floor")
    # the reports show the verdicts: the accuracy table, real scores (not marked simulated), the rejection
    md = (out / "report.md").read_text()
    html = (out / "report.html").read_text()
    assert "## Accuracy" in md and "(simulated)" not in md
    for text in (md, html):
        assert lossy["note"] in text and "skipped (lossless)" in text
    assert {row["gate"] for row in report["accuracy"]["rows"]} >= {"pass", "skipped (lossless)", "rejected"}
    lab.assert_nothing_left()
