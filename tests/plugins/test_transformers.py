"""The transformers serve plugin: its argv from serve.py 5.19.0, options mapped or refused, the
request extensions it declares, and its crash causes on the captured logs
(tests/fixtures/real/transformers-5.19.0-cpu; the real engine runs in tests/real/test_real_transformers.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from perflab.bench.client import build_payload
from perflab.bench.request import BenchRequest
from perflab.contract.errors import UnsupportedOption, UsageError
from perflab.contract.types import Accelerator, HardwareSnapshot, ServeConfig
from perflab.testing import EngineConformance

from .conftest import WORKDIR, gpus

ENGINE = "transformers"
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "real" / "transformers-5.19.0-cpu"
H100X2 = gpus("NVIDIA H100 80GB HBM3", (9, 0), 2)
CPU = HardwareSnapshot(accelerators=(Accelerator(vendor="amd", kind="cpu", index=0, name="CPU", memory_total_mib=0),))


def build(pm, hardware: HardwareSnapshot = H100X2, **changes):
    return pm.engine(ENGINE).build_launch(ServeConfig(model="/models/tiny", port=8100, **changes), hardware, WORKDIR, None)


def test_the_real_lanes_command(pm):
    spec = build(pm, CPU, options={"dtype": "float32", "continuous_batching": True})
    assert list(spec.argv) == ["transformers", "serve", "/models/tiny", "--device", "cpu", "--host", "127.0.0.1",
                               "--port", "8100", "--continuous-batching", "--dtype", "float32"]
    # the server answers only to the forced model: requests name it as given
    assert spec.served_model_name == "/models/tiny"


def test_the_device_follows_the_gpus_perflab_gives_it(pm):
    assert build(pm).argv[3:5] == ("--device", "auto")  # two GPUs: accelerate spreads the layers
    one = build(pm, devices=(1,))
    assert one.argv[3:5] == ("--device", "cuda") and one.env["CUDA_VISIBLE_DEVICES"] == "1"
    assert build(pm, options={"device": "cuda:1"}).argv[3:5] == ("--device", "cuda:1")


def test_continuous_batching_settings_turn_it_on(pm):
    argv = list(build(pm, max_batched_tokens=512, mem_fraction=0.5, options={"cb_num_blocks": 64}).argv)
    assert "--continuous-batching" in argv
    assert argv[argv.index("--cb-max-batch-tokens") + 1] == "512"
    assert argv[argv.index("--cb-max-memory-percent") + 1] == "0.5"
    assert argv[argv.index("--cb-num-blocks") + 1] == "64"
    assert "--continuous-batching" not in build(pm).argv  # serve.py's default: off
    assert "--no-compile" in build(pm, options={"compile": False}).argv
    with pytest.raises(UnsupportedOption, match="continuous_batching=false"):
        build(pm, max_batched_tokens=512, options={"continuous_batching": False})


@pytest.mark.parametrize(("changes", "what"), [
    ({"quantization": "fp8"}, "quantization=fp8"),
    ({"options": {"attn_implementation": "paged"}}, "attn_implementation=paged"),
    ({"options": {"python": "python3"}}, r"option\(s\) python"),
    ({"tp": 2}, "tp=2"),
    ({"served_model_name": "tiny"}, "served_model_name=tiny"),
    ({"max_model_len": 4096}, "max_model_len=4096"),
])
def test_what_transformers_serve_cannot_express_is_refused(pm, changes, what):
    with pytest.raises(UnsupportedOption, match=what):
        build(pm, **changes)


def test_it_declares_that_its_server_takes_no_vllm_extension(pm):
    assert pm.engine(ENGINE).bench_extensions() == ()
    assert pm.engine("vllm").bench_extensions() is None  # vLLM takes them all
    req = BenchRequest(base_urls=("http://h:1",), model="m", extensions=())
    for backend in ("openai-chat", "openai"):
        payload = build_payload(req.replace(backend=backend), "hi", 8)
        assert "ignore_eos" not in payload and "repetition_penalty" not in payload
    assert req.output_lengths == "counted" and not req.send_ignore_eos
    assert BenchRequest(base_urls=("http://h:1",), model="m").output_lengths == "forced"
    assert BenchRequest(base_urls=("http://h:1",), model="m", ignore_eos=False).output_lengths == "capped"
    with pytest.raises(UsageError, match="does not take ignore_eos"):
        req.replace(ignore_eos=True).validate()


def test_captured_faults_are_named_by_their_root_lines(pm):
    engine = pm.engine(ENGINE).engine
    missing = engine.classify_crash(1, (FIXTURES / "faults" / "missing-model.log").read_text())
    assert missing.name == "model-not-found"
    assert missing.line.startswith("huggingface_hub.errors.HFValidationError: Repo id must be in the form")
    bad = engine.classify_crash(2, (FIXTURES / "faults" / "bad-flag.log").read_text())
    assert (bad.name, bad.line) == ("bad-flag", "Error: No such option '--cb-bogus'.")


def test_its_ready_line_is_uvicorns(pm):
    import re

    ready = pm.engine(ENGINE).engine.readiness(build(pm))
    log = (FIXTURES / "serve-ready.log").read_text()
    assert all(re.search(p, log) for p in ready.ready_log_patterns)
    assert [p.path for p in ready.http] == ["/health"]


def test_entry_point_module_is_import_light():
    code = ("import sys, perflab_transformers; print(sorted(m for m in ('torch', 'transformers', 'yaml', "
            "'perflab_transformers.launch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60).stdout
    assert json.loads(out.strip().replace("'", '"')) == []


class TestTransformersConformance(EngineConformance):
    engine = ENGINE
    distribution = "perflab-plugin-transformers"
    model = "Qwen/Qwen3-0.6B"
    configs = [{"max_batched_tokens": 1024}, {"quantization": "bnb-4bit"}, {"devices": (0,)}]
    unsupported_configs = [{"tp": 2}, {"quantization": "awq"}, {"speculative_config": {"method": "ngram"}}]
    crash_samples = {
        "model-not-found": (FIXTURES / "faults" / "missing-model.log").read_text(),
        "bad-flag": (FIXTURES / "faults" / "bad-flag.log").read_text(),
    }
    serve_option_samples = {"options": {"options": {"dtype": "bfloat16"}}, "quantization": {"quantization": "bnb-8bit"}}
