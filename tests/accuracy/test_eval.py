"""`perflab eval` and its lm-eval wrapper (perflab.accuracy.harness): the shipped task, the
score against servers whose right answers are known, the errors, the secrets."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.accuracy.conftest import FakeEvalServer

from perflab import redact
from perflab.accuracy import generate
from perflab.accuracy.harness import resolve_task, result_from_lm_eval, shipped_yaml
from perflab.accuracy.tasks import SHIPPED_TASK, load_items
from perflab.cli import main

KEY = "sk-perflab-eval-7f3a9c"


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    # what `perflab eval` sets for local tasks, restored after each test
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    yield
    redact.forget_all()


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    try:
        main(["eval", *args])
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    out = capsys.readouterr()
    return code, out.out, out.err


def one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("perflab: error: "), err
    return lines[0]


# ------------------------------------------------------------------ the shipped task


def test_shipped_data_regenerates_byte_for_byte() -> None:
    assert generate.render() == generate.DATA.read_text(encoding="utf-8")
    items = load_items()
    assert len(items) >= 100
    assert len({i.question for i in items}) == len(items) and len({i.id for i in items}) == len(items)
    for item in items:
        assert isinstance(item.target, int)
        assert item.answer.endswith(f"\n#### {item.target}")


def test_shipped_task_resolves_its_data_wherever_perflab_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # lm-eval would read a relative data_files from the working directory
    spec = resolve_task(SHIPPED_TASK)
    files = spec.spec["dataset_kwargs"]["data_files"]  # type: ignore[index]
    assert Path(files["test"]).is_absolute() and Path(files["test"]) == generate.DATA.resolve()
    assert spec.name == SHIPPED_TASK and not spec.needs_index
    assert shipped_yaml().is_file()


# ------------------------------------------------------------------ scores against known answers


def test_scores_are_lm_evals_strict_match_over_the_items_asked(eval_server: FakeEvalServer,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    url = eval_server.base_url
    code, out, err = run_cli(capsys, "--base-url", url, "--model", "Qwen/Qwen3-8B", "--served-model-name", "oracle",
                             "--limit", "60", "--json", "--max-gen-toks", "77")
    assert code == 0, err
    r = json.loads(out)
    assert (r["task"], r["metric"], r["filter"], r["mode"], r["api"]) == (SHIPPED_TASK, "exact_match", "strict-match", "gen", "chat")
    assert r["score"] == 100.0 and r["samples"] == 60 and r["harness"] == "lm-eval 0.4.13" and r["simulated"] is False
    headers, body = eval_server.requests[-1]
    # 3 solved examples as turns, then the question; greedy; the served name; stop strings
    assert body["model"] == "oracle" and body["temperature"] == 0 and body["max_tokens"] == 77
    assert [m["role"] for m in body["messages"]] == ["user", "assistant"] * 3 + ["user"]
    assert body["messages"][-1]["content"].startswith("Question: ") and "Question:" in body["stop"]
    assert "authorization" not in headers or headers["authorization"] == "Bearer "

    even = sum(1 for item in load_items()[:60] if item.target % 2 == 0)
    code, out, err = run_cli(capsys, "--base-url", url, "--model", "even", "--limit", "60", "--json", "--api", "completions")
    assert code == 0, err
    r = json.loads(out)
    assert r["score"] == pytest.approx(100.0 * even / 60) and 0 < r["score"] < 100 and r["api"] == "completions"
    assert r["stderr"] == pytest.approx(100.0 * ((even / 60) * (1 - even / 60) / 59) ** 0.5)
    _, body = eval_server.requests[-1]
    assert isinstance(body["prompt"], str) and body["prompt"].count("Question: ") == 4 and body["prompt"].endswith("Answer:")

    code, out, err = run_cli(capsys, "--base-url", url, "--model", "wrong", "--limit", "10")
    assert code == 0 and err == ""  # lm-eval's log and bars stay off the terminal (-v shows them)
    table = out.splitlines()
    assert table[0].split("|")[1:-1] == [" dataset       ", " metric                     ", " mode ", " score       ", " samples "]
    assert table[2].split("|")[1:-1] == [" perflab_arith ", " exact_match (strict-match) ", " gen  ", " 0.00 ± 0.00 ", " 10      "]


def test_a_local_jsonl_is_scored_as_the_shipped_task(eval_server: FakeEvalServer, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "my arith.jsonl"
    items = load_items()[:12]
    path.write_text("".join(json.dumps({"question": i.question, "answer": i.answer}) + "\n" for i in items))
    code, out, err = run_cli(capsys, "--base-url", eval_server.base_url, "--model", "even", "--task", str(path), "--json")
    assert code == 0, err
    r = json.loads(out)
    assert r["task"] == "my_arith" and r["samples"] == 12
    assert r["score"] == pytest.approx(100.0 * sum(i.target % 2 == 0 for i in items) / 12)

    bad = tmp_path / "bad.jsonl"
    for lines, n in (('{"prompt": "2+2?"}\n', 1), ('{"question": "2+2?", "answer": "#### 4"}\n\n{"question": "3+3?", "answer": "6"}\n', 3)):
        bad.write_text(lines)
        code, _, err = run_cli(capsys, "--base-url", eval_server.base_url, "--model", "even", "--task", str(bad))
        assert code == 2 and f"line {n} needs string fields 'question' and 'answer'" in one_error_line(err)


def test_a_task_yaml_resolves_its_data_beside_it(eval_server: FakeEvalServer, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "tasks"
    folder.mkdir()
    (folder / "few.jsonl").write_text("".join(json.dumps({"question": i.question, "answer": i.answer}) + "\n"
                                              for i in load_items()[:8]))
    text = shipped_yaml().read_text().replace("task: perflab_arith", "task: few_arith").replace(
        "test: perflab_arith.jsonl", "test: few.jsonl").replace("num_fewshot: 3", "num_fewshot: 0")
    (folder / "few.yaml").write_text(text)
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(capsys, "--base-url", eval_server.base_url, "--model", "oracle", "--task", "tasks/few.yaml", "--json")
    assert code == 0, err
    r = json.loads(out)
    assert (r["task"], r["samples"], r["score"]) == ("few_arith", 8, 100.0)
    _, body = eval_server.requests[-1]
    assert len(body["messages"]) == 1  # the file's own num_fewshot


# ------------------------------------------------------------------ errors: one line, no score


@pytest.mark.slow
def test_task_names_are_lm_evals(eval_server: FakeEvalServer, capsys: pytest.CaptureFixture[str],
                                 monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    code, out, err = run_cli(capsys, "--base-url", eval_server.base_url, "--model", "oracle", "--task", "gsm8kk")
    assert code == 2 and out == ""
    line = one_error_line(err)
    assert "unknown task 'gsm8kk' (did you mean gsm8k?)" in line

    # a known task whose data is neither here nor reachable: one line saying so
    import datasets.config
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    # and not in this machine's caches either
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "datasets")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    code, out, err = run_cli(capsys, "--base-url", eval_server.base_url, "--model", "oracle", "--task", "gsm8k")
    assert code == 1 and out == ""
    assert one_error_line(err).startswith("perflab: error: task gsm8k: its data could not be loaded (")
    assert eval_server.requests == []  # nothing was asked


def test_a_missing_task_file_is_a_usage_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run_cli(capsys, "--base-url", "http://127.0.0.1:1", "--model", "m", "--task", str(tmp_path / "nope.yaml"))
    assert code == 2 and "nope.yaml: no such file" in one_error_line(err)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_an_unreachable_endpoint_is_one_line_naming_it(capsys: pytest.CaptureFixture[str]) -> None:
    port = free_port()
    for concurrency in ("8", "1"):  # lm-eval's aiohttp path, and its requests path
        code, out, err = run_cli(capsys, "--base-url", f"http://127.0.0.1:{port}", "--model", "m", "--limit", "3",
                                 "--concurrency", concurrency, "--json")
        assert code == 1 and out == ""
        assert f"http://127.0.0.1:{port}/v1/chat/completions: cannot connect" in one_error_line(err)


def test_server_errors_timeouts_and_garbage_give_no_score(eval_server: FakeEvalServer, capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    url = eval_server.base_url
    code, out, err = run_cli(capsys, "--base-url", url, "--model", "http-500", "--limit", "3")
    line = one_error_line(err)
    assert code == 1 and out == ""
    assert "answered an evaluation request with HTTP 500: engine failed for Bearer ***" in line and KEY not in line
    assert eval_server.requests[-1][0]["authorization"] == f"Bearer {KEY}"  # sent, never shown

    code, out, err = run_cli(capsys, "--base-url", url, "--model", "hang", "--limit", "2", "--timeout", "0.5")
    assert code == 1 and out == ""
    assert "an evaluation request got no answer within 0.5 s (--timeout)" in one_error_line(err)

    code, out, err = run_cli(capsys, "--base-url", url, "--model", "garbage", "--limit", "2")
    assert code == 1 and out == ""
    assert "answered something that is not an OpenAI completion" in one_error_line(err)
    for api in ("chat", "completions"):  # not an empty answer scored as a wrong one
        code, out, err = run_cli(capsys, "--base-url", url, "--model", "no-answer", "--limit", "2", "--api", api)
        assert code == 1 and out == ""
        assert "answered something that is not an OpenAI completion" in one_error_line(err)


def test_the_api_key_reaches_the_server_and_nothing_else(eval_server: FakeEvalServer, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    code, out, err = run_cli(capsys, "--base-url", eval_server.base_url, "--model", "oracle", "--limit", "5",
                             "--save-result", "--result-dir", str(tmp_path), "--result-filename", "r.json", "--label", "k")
    assert code == 0, err
    saved = (tmp_path / "r.json").read_text()
    for text in (out, err, saved):
        assert KEY not in text
    record = json.loads(saved)
    assert record["score"] == 100.0 and record["samples"] == 5 and record["task"] == SHIPPED_TASK
    p = record["perflab"]
    assert p["version"] and p["date"] and p["base_url"] == eval_server.base_url and p["model"] == "oracle"
    assert p["endpoint"] == eval_server.base_url + "/v1/chat/completions"
    assert all(h["authorization"] == f"Bearer {KEY}" for h, _ in eval_server.requests)
    assert "OPENAI_API_KEY" not in json.dumps(record)


def test_a_password_in_the_base_url_is_masked() -> None:
    from perflab.accuracy.harness import redact_url

    assert redact_url(f"http://user:{KEY}@127.0.0.1:8000/v1") == "http://user:***@127.0.0.1:8000/v1"
    assert redact.scrub(f"failed at http://user:{KEY}@h") == "failed at http://user:***@h"
    assert redact_url("http://127.0.0.1:8000") == "http://127.0.0.1:8000"


def test_without_the_extra_one_line_says_how_to_get_it(tmp_path: Path) -> None:
    code = ("import sys; sys.modules['lm_eval'] = None\n"
            "from perflab.cli import main\n"
            "main(['eval', '--base-url', 'http://127.0.0.1:1', '--model', 'm'])\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 3 and proc.stdout == ""
    assert proc.stderr.strip() == ("perflab: error: accuracy evaluation needs lm-evaluation-harness (lm_eval not "
                                   "installed): pip install 'perflab[accuracy]'")


# ------------------------------------------------------------------ lm-eval's results dict


def _results(**over: Any) -> dict[str, Any]:
    res: dict[str, Any] = {
        "results": {"perflab_arith": {
            "alias": "perflab_arith", "sample_len": 4,
            # flexible-extract first: the primary is still the config's first filter
            "exact_match,flexible-extract": 1.0, "exact_match_stderr,flexible-extract": 0.0,
            "exact_match,strict-match": 0.25, "exact_match_stderr,strict-match": 0.25}},
        "group_subtasks": {},
        "configs": {"perflab_arith": {
            "output_type": "generate_until", "metric_list": [{"metric": "exact_match"}],
            "filter_list": [{"name": "strict-match"}, {"name": "flexible-extract"}]}},
        "n-samples": {"perflab_arith": {"original": 200, "effective": 4}},
        "samples": {"perflab_arith": [{"doc_id": d, "filter": f} for d in range(4) for f in ("strict-match", "flexible-extract")]},
    }
    res.update(over)
    return res


def test_results_map_to_the_primary_metric_in_points() -> None:
    r = result_from_lm_eval(_results(), "perflab_arith", api="chat", seconds=1.23456, harness="lm-eval 0.4.13")
    assert (r.metric, r.filter, r.mode, r.score, r.stderr, r.samples, r.seconds) == (
        "exact_match", "strict-match", "gen", 25.0, 25.0, 4, 1.235)
    # without logged samples: lm-eval's effective count; a stderr lm-eval could not compute
    res = _results(samples=None)
    res["results"]["perflab_arith"]["exact_match_stderr,strict-match"] = "N/A"
    r = result_from_lm_eval(res, "perflab_arith", api="chat", seconds=0, harness="h")
    assert r.samples == 4 and r.stderr is None


def test_a_groups_score_is_its_aggregate_over_its_tasks() -> None:
    res = {
        "results": {"mmlu": {"acc,none": 0.5, "acc_stderr,none": 0.01},
                    "mmlu_a": {"acc,none": 0.4}, "mmlu_b": {"acc,none": 0.6}},
        "groups": {"mmlu": {"acc,none": 0.5, "acc_stderr,none": 0.01}},
        "group_subtasks": {"mmlu": ["mmlu_stem"], "mmlu_stem": ["mmlu_a", "mmlu_b"]},
        "configs": {"mmlu_a": {"output_type": "multiple_choice"}, "mmlu_b": {"output_type": "multiple_choice"}},
        "n-samples": {"mmlu_a": {"effective": 10}, "mmlu_b": {"effective": 15}},
    }
    r = result_from_lm_eval(res, "mmlu", api="completions", seconds=2, harness="h")
    assert (r.task, r.metric, r.filter, r.mode, r.score, r.stderr, r.samples) == ("mmlu", "acc", "none", "loglikelihood", 50.0, 1.0, 25)


def test_a_metric_that_is_not_a_rate_is_refused() -> None:
    from perflab.contract.errors import PerflabError

    res = {"results": {"wiki": {"word_perplexity,none": 17.2}}, "configs": {"wiki": {"output_type": "loglikelihood_rolling"}},
           "n-samples": {"wiki": {"effective": 3}}}
    with pytest.raises(PerflabError, match="word_perplexity is not a rate"):
        result_from_lm_eval(res, "wiki", api="completions", seconds=0, harness="h")


# ------------------------------------------------------------------ against a simulated engine


SIM_HW = "sim:h100-80g-x1"


def test_perflab_eval_against_a_simulated_vllm(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The issue's "must show": `perflab eval --base-url URL --model M --json`, offline, the
    shipped task, a numeric score over >= 50 samples."""
    import anyio
    import anyio.to_thread

    from perflab.contract.types import ServeConfig
    from perflab.hardware import resolve
    from perflab.plugins import load
    from perflab.supervisor import EngineInstance

    out: dict[str, Any] = {}

    async def go() -> None:
        state = tmp_path / "sim-state"  # our own simulated device memory: other runs must not collide
        state.mkdir()
        pm = load()
        env = {**os.environ, "PERFLAB_SIM_TIME_SCALE": "50", "PERFLAB_SIM_STATE_DIR": str(state)}
        hw, env = resolve(pm, SIM_HW, env)
        config = ServeConfig(model="Qwen/Qwen3-8B")
        async with EngineInstance(pm, "vllm", config, hardware=hw, env=env, workdir=tmp_path / "run", grace=2.0,
                                  startup_timeout=60) as inst:
            assert inst.outcome.state == "ready", inst.outcome.to_json()
            args = ("--base-url", inst.base_url, "--model", inst.launch.served_model_name, "--limit", "60", "--json")
            # the CLI blocks its thread: the supervisor's loop keeps running meanwhile
            out["cli"] = await anyio.to_thread.run_sync(lambda: run_cli(capsys, *args))
        out["outcome"] = inst.outcome

    anyio.run(go)
    code, stdout, err = out["cli"]
    assert code == 0, err
    # the supervisor's own log lines share the captured stdout
    r, _ = json.JSONDecoder().raw_decode(stdout[stdout.index('{\n  "task"'):])
    assert r["task"] == SHIPPED_TASK and r["metric"] == "exact_match" and r["samples"] == 60 and r["simulated"] is True
    # exactly the items the simulated model answers right (its accuracy model): lm-eval's 3-shot
    # chat prompts were recognised, answered and scored item by item
    from perflab_sim.accuracy import profile
    from perflab_sim.answers import answers_correctly

    plain = profile("Qwen/Qwen3-8B", None, None, None)
    right = sum(answers_correctly(item, plain) for item in load_items()[:60])
    assert 0 < right < 60 and r["score"] == pytest.approx(100.0 * right / 60)
    assert out["outcome"].state == "done" and out["outcome"].leftovers == []


def test_a_log_likelihood_task_needs_the_completions_api_and_a_tokenizer(eval_server: FakeEvalServer, tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    import importlib.util

    # perflab[accuracy] (lm-eval[api]) brings no transformers: the tokenizer cannot be loaded locally
    assert importlib.util.find_spec("transformers") is None
    (tmp_path / "yn.jsonl").write_text('{"q": "Is 2 even?", "label": 0}\n{"q": "Is 3 even?", "label": 1}\n')
    (tmp_path / "yn.yaml").write_text(
        "task: yes_no\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: yn.jsonl\n"
        "output_type: multiple_choice\ntest_split: test\ndoc_to_text: '{{q}}'\ndoc_to_choice: ['yes', 'no']\n"
        "doc_to_target: label\nmetric_list:\n  - metric: acc\n")
    task = str(tmp_path / "yn.yaml")
    code, _, err = run_cli(capsys, "--base-url", eval_server.base_url, "--model", "m", "--task", task)
    assert code == 2, err
    assert "task yes_no scores log-likelihoods (multiple_choice), which chat completions cannot return: " \
                         "use --api completions" in one_error_line(err)
    # the fake server has no /tokenize either: said in one line, not a traceback
    code, _, err = run_cli(capsys, "--base-url", eval_server.base_url, "--model", "m", "--task", task, "--api", "completions")
    assert code == 2 and "a log-likelihood task needs m's tokenizer: the server has no /tokenize" in one_error_line(err)
    assert eval_server.requests == []


def test_a_caller_that_gives_up_is_not_kept_waiting(eval_server: FakeEvalServer) -> None:
    """The lab bounds an evaluation with its own deadline: cancelling returns at once (the
    worker thread is abandoned, and sends nothing more), whatever the per-request timeout."""
    import time

    import anyio

    from perflab.accuracy.harness import evaluate

    async def go() -> float:
        async with anyio.create_task_group() as tg:
            async def run() -> None:
                await evaluate(eval_server.base_url, "hang", limit=4, concurrency=2, timeout_s=300)
                raise AssertionError("a hung server gave a score")

            tg.start_soon(run)
            with anyio.fail_after(60):
                while len(eval_server.requests) < 2:  # both in flight, hung
                    await anyio.sleep(0.05)
            t0 = time.monotonic()
            tg.cancel_scope.cancel()
        return time.monotonic() - t0

    assert anyio.run(go) < 1.0
    eval_server.released.set()  # the two in flight are answered: lm-eval would now send the other two
    time.sleep(1.5)
    assert len(eval_server.requests) == 2


def test_a_result_folder_that_cannot_be_written_is_refused_before_the_evaluation(
        eval_server: FakeEvalServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    afile = tmp_path / "afile"
    afile.write_text("")
    for option in (["--result-dir", str(afile / "sub")], ["--result-filename", str(afile / "r.json")]):
        code, out, err = run_cli(capsys, "--base-url", eval_server.base_url, "--model", "oracle", "--limit", "2",
                                 "--save-result", *option)
        assert code == 2 and out == ""
        assert f"--save-result: cannot create the folder {afile}" in one_error_line(err)
    assert eval_server.requests == []  # refused before a single request, not after the score
    code, out, err = run_cli(capsys, "--base-url", eval_server.base_url, "--model", "oracle", "--limit", "2",
                             "--save-result", "--result-dir", str(tmp_path / "new"), "--result-filename", "deep/r.json")
    assert code == 0, err
    assert json.loads((tmp_path / "new" / "deep" / "r.json").read_text())["score"] == 100.0


def test_nothing_reaches_the_terminal_outside_a_git_checkout(eval_server: FakeEvalServer, tmp_path: Path,
                                                              capfd: pytest.CaptureFixture[str],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    # lm-eval would run `git describe` in the working directory: git's own stderr, not Python's
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    try:
        main(["eval", "--base-url", eval_server.base_url, "--model", "oracle", "--limit", "2", "--json"])
    except SystemExit as exc:
        assert not exc.code
    out, err = capfd.readouterr()
    assert json.loads(out)["score"] == 100.0 and err == ""


def test_a_base_url_ending_in_v1_is_the_same_endpoint(eval_server: FakeEvalServer,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    # as OpenAI clients are configured, and as perflab bench and the agreement client take it
    for base in (eval_server.base_url + "/v1", eval_server.base_url + "/v1/"):
        code, out, err = run_cli(capsys, "--base-url", base, "--model", "oracle", "--limit", "2", "--json")
        assert code == 0, err
        assert json.loads(out)["score"] == 100.0


def test_ctrl_c_during_a_hung_request_exits_130_at_once(eval_server: FakeEvalServer, tmp_path: Path) -> None:
    """The abandoned evaluation's thread must not keep the process alive until its request
    times out (the interpreter joins non-daemon threads at exit)."""
    import signal
    import time

    proc = subprocess.Popen(
        [sys.executable, "-m", "perflab", "eval", "--base-url", eval_server.base_url, "--model", "hang",
         "--limit", "2", "--timeout", "120"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
        env={**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"},
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 90
        while not eval_server.requests and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert eval_server.requests, "no request reached the server"
        proc.send_signal(signal.SIGINT)
        t0 = time.monotonic()
        _, err = proc.communicate(timeout=20)
        assert proc.returncode == 130 and time.monotonic() - t0 < 10, err
        assert err.strip().splitlines()[-1] == "perflab: aborted"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_the_callers_random_sequences_are_left_alone(eval_server: FakeEvalServer) -> None:
    """lm-eval seeds the global generators; the lab calling evaluate() must not notice."""
    import random

    import anyio
    import numpy as np

    from perflab.accuracy.harness import evaluate

    random.seed(7)
    np.random.seed(7)
    expected = [random.random() for _ in range(3)], list(np.random.random(3))
    random.seed(7)
    np.random.seed(7)
    r = anyio.run(lambda: evaluate(eval_server.base_url, "oracle", limit=3))
    assert r.score == 100.0 and r.samples == 3
    assert ([random.random() for _ in range(3)], list(np.random.random(3))) == expected


def test_eval_outside_a_git_checkout_prints_nothing_on_stderr(eval_server: FakeEvalServer, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch,
                                                               capfd: pytest.CaptureFixture[str]) -> None:
    # lm-eval runs `git describe` in the working directory; its "fatal: not a git repository"
    # is written by the child process straight to fd 2 (capfd, not capsys, sees it)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    try:
        main(["eval", "--base-url", eval_server.base_url, "--model", "oracle", "--limit", "5", "--json"])
    except SystemExit as exc:
        assert not exc.code
    out, err = capfd.readouterr()
    assert json.loads(out)["samples"] == 5 and err == ""
