"""Accuracy against the real vLLM (CPU build 0.32.0; issue 25 item 6).

The tiny model itself repeats one token whatever it is asked, so agreement could not tell a
lossy configuration from a lossless one: these checks serve its ``varied`` variant (weights
scaled up: context-dependent answers, a new token almost every step) and, as the lossy
candidate, its ``perturbed`` variant (noise on every weight) — perflab.realengine.variants.

One launch per configuration, each reused for every check on it; nothing left behind.
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

from perflab.accuracy.agreement import collect, compare, judge
from perflab.accuracy.tasks import SHIPPED_TASK
from perflab.accuracy.types import Agreement, AnswerSet
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


def test_eval_and_agreement_against_the_real_vllm(lab: RealLab) -> None:
    varied = ensure_variant(lab.env, "varied")
    perturbed = ensure_variant(lab.env, "perturbed")
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
    assert floor.samples == len(first.answers) > 0
    assert all(a.error is None and a.logprobs for a in first.answers + second.answers)
    # the variant answers in varied tokens (what makes agreement able to discriminate)
    assert all(len(set(a.tokens or ())) > len(a.tokens or ()) // 2 for a in first.answers)
    assert judge(floor, floor, MARGIN)

    # lossless: no prefix caching and a smaller batch change the schedule, not the answers
    with serving(lab, "lossless", varied, "--no-prefix-caching", "--max-num-seqs", "4") as url:
        lossless = compare(first, _collect(url, len(first.answers)))
    # lossy: the same model with 5 % noise on its weights
    with serving(lab, "lossy", perturbed) as url:
        lossy = compare(first, _collect(url, len(first.answers)))

    print(f"\nagreement on the real vLLM: floor {_figures(floor)}; lossless {_figures(lossless)}; "
          f"lossy {_figures(lossy)}; eval {res['score']:.1f} on {res['samples']} in {res['seconds']:.1f} s")
    assert judge(lossless, floor, MARGIN)
    assert not judge(lossy, floor, MARGIN)
    assert lossy.exact_match < floor.exact_match - MARGIN
    assert lossy.first_divergence is not None
