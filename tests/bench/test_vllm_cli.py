"""One ``vllm bench serve`` builder: the report's equivalent command is the command the
vllm-bench backend runs, less the address and the result plumbing."""

from __future__ import annotations

import json
import math
import shlex
import sys
import textwrap
from pathlib import Path

import pytest

from perflab.bench.backends import run_vllm_bench_serve
from perflab.bench.vllm_cli import SHAREGPT_FILE, vllm_bench_argv
from perflab.contract.errors import UsageError
from perflab.lab.plan import Profile

# only the run needs these: where to send and where to write (and vLLM's defaults spelled out)
RUN_ONLY = {"--base-url", "--percentile-metrics", "--metric-percentiles", "--save-result", "--result-dir",
            "--result-filename", "--disable-tqdm", "--ignore-eos", "--random-prefix-len"}


def _options(argv: list[str]) -> dict[str, str | None]:
    """``--flag value`` pairs (a flag without a value maps to None), after ``vllm bench serve``."""
    out: dict[str, str | None] = {}
    rest = argv[3:]
    for i, arg in enumerate(rest):
        if arg.startswith("--"):
            nxt = rest[i + 1] if i + 1 < len(rest) else None
            out[arg] = None if nxt is None or nxt.startswith("--") else nxt
    return out


def _recording_vllm(tmp_path: Path) -> Path:
    """A stand-in ``vllm`` that keeps the argv it was started with and writes a result."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "vllm"
    fake.write_text(textwrap.dedent(f"""\
        #!{sys.executable}
        import json, os, sys
        a = sys.argv[1:]
        opt = lambda k: a[a.index(k) + 1]
        json.dump(a, open(os.path.join({str(tmp_path)!r}, "argv.json"), "w"))
        json.dump({{"completed": int(opt("--num-prompts")), "failed": 0, "duration": 1.0}},
                  open(os.path.join(opt("--result-dir"), opt("--result-filename")), "w"))
    """))
    fake.chmod(0o755)
    return bin_dir


PROFILES = [
    Profile(name="short", label="Short", input_len=128, output_len=4, num_prompts=50, request_rate=8.0,
            burstiness=0.5, max_concurrency=16, seed=7, range_ratio=0.25),
    Profile(name="main", label="Main", input_len=4000, output_len=200, num_prompts=500),
    Profile(name="sharegpt", label="ShareGPT", dataset="sharegpt", dataset_path="sg.json", output_len=64,
            backend="openai", num_prompts=20, request_rate=2.5),
]


@pytest.mark.parametrize("profile", PROFILES, ids=lambda p: p.name)
def test_the_report_shows_the_command_the_backend_runs(tmp_path: Path, profile: Profile) -> None:
    report = shlex.split(profile.bench_command("/models/tiny", "tiny"))
    req = profile.bench_request("/models/tiny", "tiny", base_urls=("http://127.0.0.1:8000",))
    result = run_vllm_bench_serve(req, env={"PATH": str(_recording_vllm(tmp_path))})
    ran = ["vllm", *json.loads((tmp_path / "argv.json").read_text())]
    assert ran == result.info["argv"] and result.metrics["completed"] == profile.num_prompts
    assert report[:3] == ran[:3] == ["vllm", "bench", "serve"]
    shown, run = _options(report), _options(ran)
    for flag, value in shown.items():  # every option the report shows, the backend ran with that value
        assert run[flag] == value, (flag, value, run.get(flag))
    extra = {k for k in run if k not in shown}
    # the run spells out vLLM's defaults the report leaves out; nothing else differs
    defaults = {"--request-rate": "inf", "--burstiness": "1", "--random-range-ratio": "0", "--max-concurrency": None}
    for flag in extra - RUN_ONLY:
        assert flag in defaults and run[flag] == defaults[flag], (flag, run[flag])
    if math.isinf(profile.request_rate):
        assert "--request-rate" not in shown and run["--request-rate"] == "inf"


def test_synthetic_sharegpt_is_shown_as_the_real_file_and_refused_by_the_backend(tmp_path: Path) -> None:
    p = Profile(name="syn", label="Synthetic", dataset="synthetic-sharegpt", output_len=100, num_prompts=10)
    shown = _options(shlex.split(p.bench_command("m")))
    assert shown["--dataset-name"] == "sharegpt" and shown["--dataset-path"] == SHAREGPT_FILE
    assert shown["--sharegpt-output-len"] == "100" and "--served-model-name" not in shown
    with pytest.raises(UsageError, match="no dataset 'synthetic-sharegpt'"):
        vllm_bench_argv(p.bench_request("m", base_urls=("http://127.0.0.1:1",)), str(tmp_path))


def test_the_seeds_commands_are_unchanged() -> None:
    """The report's lines for the seed studies (tests/fixtures/seeds/studies/000_*.txt)."""
    sharegpt = Profile(name="sharegpt", label="ShareGPT", dataset="sharegpt", num_prompts=1000)
    random = Profile(name="long", label="Long", input_len=4000, output_len=200, num_prompts=500)
    assert sharegpt.bench_command("Qwen/Qwen3-30B-A3B") == (
        "vllm bench serve --model Qwen/Qwen3-30B-A3B --backend openai-chat --endpoint /v1/chat/completions "
        "--dataset-name sharegpt --dataset-path ShareGPT_V3_unfiltered_cleaned_split.json --num-prompts 1000 --seed 42")
    assert random.bench_command("Qwen/Qwen3-30B-A3B") == (
        "vllm bench serve --model Qwen/Qwen3-30B-A3B --backend openai-chat --endpoint /v1/chat/completions "
        "--dataset-name random --random-input-len 4000 --random-output-len 200 --num-prompts 500 --seed 42")
