"""Plan files: parsing, composition of options, and one-line errors for malformed plans."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from perflab.contract.errors import UsageError
from perflab.lab.options import Configuration, apply_delta, merge_extra_args, replica_devices
from perflab.lab.plan import load_plan, load_plan_text

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
KNOWN = ["vllm", "vllm-ascend", "sglang", "trtllm", "mindie"]

GOOD = """
model: {id: Qwen/Qwen3-32B, name: Qwen3-32B, metadata: {params: 32B}}
engines: [vllm, sglang]
serve: {max_model_len: 32768}
engine_serve: {sglang: {mem_fraction: 0.85}}
baseline: {engine: vllm, serve: {max_num_seqs: 256}}
candidates:
  - name: Quantization
    engines: [winner, vllm]
    variants:
      - {name: FP8, set: {model: Qwen/Qwen3-32B-FP8}}
  - {name: Perf, set: {extra_args: "--performance-mode=throughput"}}
profiles:
  short: {label: Short Prompt, input_len: 128, output_len: 4, num_prompts: 100, request_rate: inf}
  capped: {input_len: 10, output_len: 10, max_concurrency: 4, request_rate: 2.5}
main_profile: capped
min_success_rate: 90%
timeouts: {startup_s: 60}
simulation: {time_scale: 20}
"""


def test_good_plan_parses():
    plan = load_plan_text(GOOD, known_engines=KNOWN)
    assert plan.model == "Qwen/Qwen3-32B" and plan.display_model == "Qwen3-32B"
    assert plan.engines == ("vllm", "sglang")
    assert plan.main.name == "capped" and plan.main.request_rate == 2.5
    assert math.isinf(plan.profile("short").request_rate)
    assert plan.min_success_rate == pytest.approx(0.9)
    assert plan.timeouts.startup_s == 60 and plan.time_scale == 20
    assert plan.engine_defaults("sglang").options == {"model": "Qwen/Qwen3-32B", "max_model_len": 32768, "mem_fraction": 0.85}
    assert plan.baseline_config().options["max_num_seqs"] == 256
    perf = plan.candidates[1].variants[0]
    assert perf.set["extra_args"] == ("--performance-mode=throughput",)
    assert plan.candidates[0].engines == ("winner", "vllm")


def test_toml_plan(tmp_path):
    path = tmp_path / "p.toml"
    path.write_text('model = "m"\nengines = ["vllm"]\n[profiles.short]\ninput_len = 8\noutput_len = 2\n')
    plan = load_plan(path, known_engines=KNOWN)
    assert plan.name == "p" and plan.main_profile == "short" and plan.baseline.engine == "vllm"


def test_configuration_keys_and_deltas():
    a = Configuration("vllm", {"model": "m", "tp": 2})
    b = Configuration("vllm", {"tp": 2, "model": "m"})
    assert a.key() == b.key() and a.key({"hw": 1}) != a.key({"hw": 2})
    c = a.with_delta({"tp": None, "extra_args": ("--x=1",)})
    assert "tp" not in c.options and c.key() != a.key()
    assert merge_extra_args(("--a=1", "--b", "2"), ("--b", "3", "--c")) == ("--a=1", "--b", "3", "--c")
    assert apply_delta({"env": {"A": "1"}}, {"env": {"B": "2"}}) == {"env": {"A": "1", "B": "2"}}
    sc = Configuration("vllm", {"model": "m", "tp": 4, "replicas": 2, "env": {"X": "1"}}).serve_config(devices=(4, 5, 6, 7))
    assert sc.tp == 4 and sc.devices == (4, 5, 6, 7) and sc.extra_env["X"] == "1"
    assert replica_devices(2, 4, tuple(range(8))) == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert replica_devices(1, 4, tuple(range(8))) is None
    with pytest.raises(ValueError, match="need 8 devices, 4 available"):
        replica_devices(2, 4, (0, 1, 2, 3))


@pytest.mark.parametrize(
    ("text", "needles"),
    [
        ("model: m\nengines: [vllm]\nprofiles: {p: {input_len: 8, output_len: many}}",
         ["profiles.p.output_len: expected a positive integer, got a string 'many'"]),
        ("model: m\nengines: [vllm]\nserve: {tp: '4', prefix_caching: yes please}\nprofiles: {p: {input_len: 1, output_len: 1}}",
         ["2 problems", "serve.tp: expected a positive integer", "serve.prefix_caching: expected true or false"]),
        ("model: m\nengines: [vllm]\nserve: {max_batch_tokens: 8192}\nprofiles: {p: {input_len: 1, output_len: 1}}",
         ["serve.max_batch_tokens: unknown key (did you mean 'max_batched_tokens'?)"]),
        ("model: m\nengine: [vllm]\nprofiles: {p: {input_len: 1, output_len: 1}}",
         ["engine: unknown key (did you mean 'engines'?)", "engines: missing"]),
        ("model: m\nengines: [vllm, foo]\nprofiles: {p: {input_len: 1, output_len: 1}}",
         ["engines[1]: unknown engine 'foo' (expected one of: mindie, sglang, trtllm, vllm, vllm-ascend)"]),
        ("model: m\nengines: [vllm]\ncandidates: [{name: X, engines: [vlm], set: {tp: 2}}]\nprofiles: {p: {input_len: 1, output_len: 1}}",
         ["candidates[0].engines[0]: unknown engine 'vlm'"]),
        ("model: m\nengines: [vllm, sglng]\nprofiles: {p: {input_len: 1, output_len: 1}}",
         ["engines[1]: unknown engine 'sglng' (did you mean 'sglang'?) (expected one of: mindie, sglang,"]),
        ("model: m\nengines: [vllm]\nbaseline: vllm_ascend\nprofiles: {p: {input_len: 1, output_len: 1}}",
         ["baseline: unknown engine 'vllm_ascend' (did you mean 'vllm-ascend'?)"]),
        ("model: m\nengines: [vllm]\ncombinations: [{name: C, of: [Nope]}]\nprofiles: {p: {input_len: 1, output_len: 1}}",
         ["combinations[0].of: 'Nope' names no candidate variant"]),
        ("model: m\nengines: [vllm]\nprofiles: {p: {dataset: sharegpt, dataset_path: nowhere.json}}",
         ["profiles.p.dataset_path: file", "does not exist"]),
        ("model: m\nengines: [vllm]\nprofiles: {p: {input_len: 1, output_len: 1}}\nmain_profile: q",
         ["main_profile: 'q' is not a profile"]),
        ("model: m\nengines: [vllm]\nprofiles: {p: {input_len: 1, output_len: 1}}\nmin_success_rate: 2",
         ["min_success_rate: expected a fraction in [0, 1]"]),
        ("- just\n- a list\n", ["expected a mapping of plan keys"]),
        ("model: [unclosed\n", ["invalid YAML"]),
    ],
)
def test_malformed_plans_one_line(tmp_path, text, needles):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(UsageError) as exc:
        load_plan(path, known_engines=KNOWN)
    msg = str(exc.value)
    assert "\n" not in msg
    assert msg.startswith(f"{path}: ")
    for needle in needles:
        assert needle in msg
    assert exc.value.exit_code == 2


def test_missing_plan_file(tmp_path):
    with pytest.raises(UsageError, match=r"missing\.yaml: no such plan file"):
        load_plan(tmp_path / "missing.yaml")


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("model: m\nengines: [vllm]\nprofiles: {p: {input_len: 1, output_len: 1, num_prompts: '10'}}", "profiles.p.num_prompts"),
        ("model: m\nengines: [vllm]\nprofiles: {p: {input_len: 1, output_len: 1}}\ntimeouts: {startup: 5}", "timeouts.startup"),
        ("model: m\nengines: [nosuch]\nprofiles: {p: {input_len: 1, output_len: 1}}", "engines[0]"),
        (None, None),  # missing file
    ],
    ids=["wrong-type", "unknown-key", "unknown-engine", "missing-file"],
)
def test_cli_malformed_plan_exits_2_with_one_line(tmp_path, capsys, text, key):
    """`perflab run BAD.yaml`: exit code 2 and one line naming the file and the key."""
    from perflab.cli import main

    path = tmp_path / "bad.yaml"
    if text is not None:
        path.write_text(text)
    with pytest.raises(SystemExit) as exc:
        main(["run", str(path), "--out", str(tmp_path / "study")])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"perflab: error: {path}: ")
    if key is not None:
        assert f"{key}: " in lines[0]
    assert "Traceback" not in err
    assert not (tmp_path / "study").exists()


def test_examples_are_valid():
    paths = sorted(EXAMPLES.glob("*.yaml"))
    assert len(paths) >= 4
    for path in paths:
        plan = load_plan(path, known_engines=KNOWN)
        assert plan.hardware.startswith("sim:"), path
        # the seeds' method tries candidates; method grid or search measures the points of a space
        assert plan.profiles and (plan.candidates if plan.method == "seeds" else plan.space), path
