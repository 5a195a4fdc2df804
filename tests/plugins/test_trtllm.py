"""The TensorRT-LLM plugin: seed commands reproduced, every option mapped (flags or the
--extra_llm_api_options YAML), preflight and crash causes."""

from __future__ import annotations

import re
import shlex
import stat
import subprocess
import sys

import pytest
import yaml

import perflab_trtllm
from perflab.contract.errors import UnsupportedOption
from perflab.contract.types import HardwareSnapshot, HttpProbe, ServeConfig
from perflab.installed import parse_version_output
from perflab_trtllm import VERSION_OUTPUT

from .conftest import WORKDIR, dist_info, gpus, seed_records, split_equals, without_host_port

ENGINE = "trtllm"

A100 = gpus("NVIDIA A100-SXM4-80GB", (8, 0), 8)
H100 = gpus("NVIDIA H100 80GB HBM3", (9, 0), 1)


def build(pm, config: ServeConfig, hardware: HardwareSnapshot = A100):
    return pm.engine(ENGINE).build_launch(config, hardware, WORKDIR, "1.2.0rc1")


def flags_of(spec) -> dict[str, str | None]:
    tokens = without_host_port(spec.argv, spec.host, spec.port)
    assert tokens[0] == "trtllm-serve"
    out: dict[str, str | None] = {}
    i = 2
    while i < len(tokens):
        value = tokens[i + 1] if i + 1 < len(tokens) and not tokens[i + 1].startswith("--") else None
        out[tokens[i]] = value
        i += 1 if value is None else 2
    return out


def llm_api(spec) -> dict:
    """The YAML perflab writes, checked to be the file the argv names."""
    (file,) = spec.files
    assert flags_of(spec)["--extra_llm_api_options"] == file.path == str(WORKDIR / "extra_llm_api_options.yaml")
    return yaml.safe_load(file.content)


# --------------------------------------------------------------------------- the seeds

# Every TensorRT-LLM serving command in the seeds (seed_results.json "command" fields).
SEED_COMMANDS = {
    "trtllm-serve Qwen/Qwen3-32B": ServeConfig(model="Qwen/Qwen3-32B"),
    "trtllm-serve Qwen/Qwen3-32B-FP8": ServeConfig(model="Qwen/Qwen3-32B-FP8"),
    "trtllm-serve Qwen/Qwen3-32B-AWQ": ServeConfig(model="Qwen/Qwen3-32B-AWQ"),
    "trtllm-serve Qwen/Qwen3-14B --max_num_tokens=16384": ServeConfig(model="Qwen/Qwen3-14B", max_batched_tokens=16384),
    "trtllm-serve Qwen/Qwen3-32B --max_seq_len=40960 --enable_chunked_prefill": ServeConfig(
        model="Qwen/Qwen3-32B", max_model_len=40960, chunked_prefill=True
    ),
}


@pytest.mark.parametrize("command", sorted(SEED_COMMANDS))
def test_seed_command_is_reproduced_exactly(pm, command):
    spec = build(pm, SEED_COMMANDS[command].replace(port=8000))
    assert without_host_port(spec.argv, "127.0.0.1", 8000) == split_equals(shlex.split(command))
    assert spec.files == ()


@pytest.mark.parametrize(("model", "quantization"), [("Qwen/Qwen3-32B-FP8", "fp8"), ("Qwen/Qwen3-32B-AWQ", "awq")])
def test_quantization_of_a_prequantized_checkpoint_adds_no_flag(pm, model, quantization):
    spec = build(pm, ServeConfig(model=model, quantization=quantization, port=8000))
    assert without_host_port(spec.argv, "127.0.0.1", 8000) == ["trtllm-serve", model]
    assert any(quantization in w for w in spec.warnings)


def test_table_covers_every_trtllm_command_of_the_seeds():
    assert {r["command"] for r in seed_records(ENGINE)} == set(SEED_COMMANDS)


# --------------------------------------------------------------------------- launch


def test_host_port_explicit_and_default_port(pm):
    spec = build(pm, ServeConfig(model="m", host="0.0.0.0"))
    assert (spec.host, spec.port, spec.served_model_name) == ("0.0.0.0", 8000, "m")
    assert without_host_port(spec.argv, "0.0.0.0", 8000) == ["trtllm-serve", "m"]


def test_every_serve_config_field_maps_to_a_flag_or_llm_api_key(pm):
    config = ServeConfig(
        model="Qwen/Qwen3-30B-A3B",
        served_model_name="Qwen/Qwen3-30B-A3B",  # trtllm-serve serves the MODEL argument
        tp=4,
        pp=2,
        ep=4,
        max_model_len=40960,
        max_batched_tokens=16384,
        max_num_seqs=512,
        kv_cache_dtype="fp8",
        prefix_caching=False,
        chunked_prefill=True,
        speculative_config={"method": "eagle3", "model": "/models/eagle3-head", "num_speculative_tokens": 3},
        mem_fraction=0.85,
        reasoning_parser="deepseek_r1",
        port=8100,
        devices=(0, 1, 2, 3, 4, 5, 6, 7),
        extra_args=("--log_level=debug",),
        extra_env={"TLLM_LOG_LEVEL": "INFO"},
        options={"backend": "pytorch"},
    )
    spec = build(pm, config)
    assert flags_of(spec) == {
        "--backend": "pytorch",
        "--tp_size": "4",
        "--pp_size": "2",
        "--ep_size": "4",
        "--max_seq_len": "40960",
        "--max_num_tokens": "16384",
        "--max_batch_size": "512",
        "--enable_chunked_prefill": None,
        "--kv_cache_free_gpu_memory_fraction": "0.85",
        "--reasoning_parser": "deepseek-r1",
        "--extra_llm_api_options": str(WORKDIR / "extra_llm_api_options.yaml"),
        "--log_level": "debug",
    }
    assert spec.argv[-1] == "--log_level=debug"  # verbatim, last
    assert llm_api(spec) == {
        "kv_cache_config": {"dtype": "fp8", "enable_block_reuse": False},
        "speculative_config": {
            "decoding_type": "Eagle",
            "max_draft_len": 3,
            "speculative_model_dir": "/models/eagle3-head",
        },
    }
    # CUDA_DEVICE_ORDER: perflab numbers GPUs as NVML does, in PCI bus order (EnginePlugin.device_env)
    assert spec.env == {"TLLM_LOG_LEVEL": "INFO", "CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}
    assert spec.served_model_name == "Qwen/Qwen3-30B-A3B"


def test_data_parallel_is_attention_dp_over_the_tp_ranks(pm):
    spec = build(pm, ServeConfig(model="deepseek-ai/DeepSeek-V3", dp=8, ep=8))
    assert flags_of(spec)["--tp_size"] == "8" and flags_of(spec)["--ep_size"] == "8"
    assert llm_api(spec) == {"enable_attention_dp": True}
    with pytest.raises(UnsupportedOption, match="attention"):
        build(pm, ServeConfig(model="m", dp=2, tp=4))


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"method": "mtp", "num_speculative_tokens": 3}, {"decoding_type": "MTP", "num_nextn_predict_layers": 3}),
        (
            {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3},
            {"decoding_type": "NGram", "max_draft_len": 4, "max_matching_ngram_size": 3},
        ),
        (
            {"method": "draft_model", "model": "Qwen/Qwen3-0.6B", "num_speculative_tokens": 4},
            {"decoding_type": "DraftTarget", "max_draft_len": 4, "speculative_model_dir": "Qwen/Qwen3-0.6B"},
        ),
    ],
)
def test_speculative_config_goes_to_the_yaml(pm, spec, expected):
    assert llm_api(build(pm, ServeConfig(model="m", speculative_config=spec))) == {"speculative_config": expected}


def test_prefix_caching_and_engine_backend_quantization(pm):
    assert llm_api(build(pm, ServeConfig(model="m", prefix_caching=True))) == {
        "kv_cache_config": {"enable_block_reuse": True}
    }
    spec = build(
        pm,
        ServeConfig(model="Qwen/Qwen3-32B", quantization="fp8", kv_cache_dtype="fp8", options={"backend": "tensorrt"}),
    )
    assert flags_of(spec)["--backend"] == "tensorrt"
    assert llm_api(spec) == {"quant_config": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}}


def test_user_llm_api_options_are_merged_and_conflicts_refused(pm):
    extra = {"kv_cache_config": {"free_gpu_memory_fraction": 0.8}, "cuda_graph_config": {"max_batch_size": 256}}
    spec = build(pm, ServeConfig(model="m", prefix_caching=True, options={"extra_llm_api_options": extra}))
    assert llm_api(spec) == {
        "kv_cache_config": {"enable_block_reuse": True, "free_gpu_memory_fraction": 0.8},
        "cuda_graph_config": {"max_batch_size": 256},
    }
    with pytest.raises(UnsupportedOption, match="enable_block_reuse"):
        build(
            pm,
            ServeConfig(
                model="m",
                prefix_caching=True,
                options={"extra_llm_api_options": {"kv_cache_config": {"enable_block_reuse": False}}},
            ),
        )


@pytest.mark.parametrize(
    ("changes", "option"),
    [
        ({"served_model_name": "qwen"}, "served_model_name=qwen"),
        ({"quantization": "fp8"}, "quantization=fp8"),  # a BF16 checkpoint on the PyTorch backend
        ({"quantization": "marlin", "options": {"backend": "tensorrt"}}, "quantization=marlin"),
        ({"kv_cache_dtype": "fp8_e5m2"}, "kv_cache_dtype=fp8_e5m2"),
        ({"speculative_config": {"method": "eagle", "num_speculative_tokens": 3}}, "speculative_config"),
        ({"speculative_config": {"method": "medusa", "num_speculative_tokens": 3}}, "medusa"),
        (
            {"speculative_config": {"method": "mtp", "num_speculative_tokens": 3, "acceptance_rate": 0.5}},
            "acceptance_rate",
        ),
        ({"options": {"backend": "onnx"}}, "backend=onnx"),
        ({"options": {"python": "python3"}}, "python"),
        ({"mem_fraction": 0.0}, "mem_fraction"),
        ({"devices": (0,), "extra_env": {"CUDA_VISIBLE_DEVICES": "1"}}, "devices"),
    ],
)
def test_inexpressible_options_are_refused(pm, changes, option):
    with pytest.raises(UnsupportedOption) as exc:
        build(pm, ServeConfig(model="Qwen/Qwen3-32B", **changes))
    assert exc.value.engine == ENGINE and option in exc.value.option


# --------------------------------------------------------------------------- preflight


@pytest.mark.parametrize(
    "config",
    [
        ServeConfig(model="Qwen/Qwen3-32B-FP8"),
        ServeConfig(model="Qwen/Qwen3-32B", quantization="fp8", options={"backend": "tensorrt"}),
    ],
)
def test_fp8_block_scaling_is_refused_below_sm89(pm, config):
    (reason,) = pm.engine(ENGINE).check_support(config, A100, "1.2.0rc1")
    assert reason.severity == "error" and "Unsupported SM version for FP8 block scaling GEMM" in reason.why
    assert "fp8BlockScalingGemm.cpp" in reason.source
    assert pm.engine(ENGINE).check_support(config, H100, "1.2.0rc1") == []


def test_awq_checkpoint_is_a_warning_naming_the_seed_crash(pm):
    (reason,) = pm.engine(ENGINE).check_support(ServeConfig(model="Qwen/Qwen3-32B-AWQ"), A100, "1.2.0rc1")
    assert reason.severity == "warning" and "KeyError: 'weight'" in reason.why
    assert pm.engine(ENGINE).check_support(ServeConfig(model="Qwen/Qwen3-32B"), A100, None) == []


# --------------------------------------------------------------------------- readiness


def test_readiness_health_and_uvicorn_lines(pm):
    ready = pm.engine(ENGINE).readiness(build(pm, ServeConfig(model="m")))
    assert ready.http == (HttpProbe("/health"),) and ready.generation_path == "/v1/completions"
    lines = [
        "INFO:     Uvicorn running on http://localhost:8000 (Press CTRL+C to quit)",
        "INFO:     Application startup complete.",
    ]
    assert all(any(re.search(p, line) for line in lines) for p in ready.ready_log_patterns)


# --------------------------------------------------------------------------- crashes

CRASHES = {
    "fp8-block-scaling-unsupported-sm": """\
[TensorRT-LLM] TensorRT LLM version: 1.2.0rc1
[11/20/2025-10:04:12] [TRT-LLM] [I] Using LLM with PyTorch backend
[11/20/2025-10:06:40] [TRT-LLM] [E] Failed to initialize executor on rank 0: Unsupported SM version for FP8 block scaling GEMM
RuntimeError: Unsupported SM version for FP8 block scaling GEMM
[11/20/2025-10:06:41] [TRT-LLM] [E] Executor worker returned error
MPI_ABORT was invoked on rank 0 in communicator MPI_COMM_WORLD with errorcode 1.
""",
    "checkpoint-key-missing": """\
  File "/usr/local/lib/python3.12/dist-packages/tensorrt_llm/_torch/modules/linear.py", line 212, in load_weights_vanilla_helper
    weight = load_weight_shard(weights[0]['weight'], module.tp_size,
                               ~~~~~~~~~~^^^^^^^^^^
KeyError: 'weight'
""",
    "cuda-oom": """\
[11/20/2025-10:07:00] [TRT-LLM] [E] Failed to initialize executor on rank 0: CUDA out of memory. Tried to allocate 1.25 GiB. GPU 0 has a total capacity of 79.14 GiB of which 612.00 MiB is free.
""",
    "nccl-error": """\
RuntimeError: [TensorRT-LLM][ERROR] Assertion failed: Failed, NCCL error /src/tensorrt_llm/cpp/tensorrt_llm/common/opUtils.cpp:297 'unhandled cuda error (run with NCCL_DEBUG=INFO for details)'
""",
    "address-in-use": """\
RuntimeError: Failed to bind socket to localhost:8000: [Errno 98] Address already in use
""",
    "model-not-found": """\
OSError: Qwen/Qwen3-999B is not a local folder and is not a valid model identifier listed on 'https://huggingface.co/models'
""",
}


@pytest.mark.parametrize("name", sorted(CRASHES))
def test_crash_causes_are_named_with_the_matching_line(pm, name):
    cause = pm.engine(ENGINE).classify_crash(1, CRASHES[name])
    assert cause.name == name
    assert cause.line and cause.line in CRASHES[name] and cause.hint and cause.source


def test_root_cause_line_is_the_first_one(pm):
    cause = pm.engine(ENGINE).classify_crash(1, CRASHES["fp8-block-scaling-unsupported-sm"])
    assert cause.line.startswith("[11/20/2025-10:06:40]")


# --------------------------------------------------------------------------- version, hooks


def test_version_from_metadata_then_from_the_trtllm_serve_banner(pm, tmp_path):
    env = {"PYTHONPATH": str(tmp_path / "site"), "PATH": str(tmp_path / "bin")}
    assert pm.engine(ENGINE).engine.version(env) is None
    # trtllm-serve has no --version: the import banner comes first, then click's error (exit 2)
    (tmp_path / "bin").mkdir()
    exe = tmp_path / "bin" / "trtllm-serve"
    exe.write_text(
        "#!/bin/sh\necho '[TensorRT-LLM] TensorRT LLM version: 1.2.0rc1'\n"
        'echo "Error: No such option: --version" >&2\nexit 2\n'
    )
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    assert pm.engine(ENGINE).engine.version(env) == "1.2.0rc1"
    dist_info(tmp_path / "site", "tensorrt_llm", "1.2.0rc2")
    assert pm.engine(ENGINE).engine.version(env) == "1.2.0rc2"  # metadata first


@pytest.mark.parametrize(
    ("text", "version"),
    [
        ("[TensorRT-LLM] TensorRT-LLM version: 0.17.0.post1\n", "0.17.0.post1"),
        ("trtllm-serve, version 1.1.0\n", "1.1.0"),
        ("usage\n", None),
    ],
)
def test_version_output_parsing(text, version):
    assert parse_version_output(text, VERSION_OUTPUT) == version


def test_registration_and_other_engines_are_not_answered(pm):
    info = pm.engine(ENGINE).info
    assert (info.accelerators, info.executable, info.distributions, info.default_port) == (
        ("cuda",),
        "trtllm-serve",
        ("tensorrt_llm", "tensorrt-llm"),
        8000,
    )
    assert pm.engine("trtllm").engine.wrapped is perflab_trtllm.plugin  # the core calls this object


def test_entry_point_module_is_import_light():
    code = "import sys, perflab_trtllm; print(sorted(m for m in ('torch', 'tensorrt_llm', 'yaml', 'perflab_trtllm.launch') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60).stdout
    assert out.strip() == "[]"


# --------------------------------------------------------------------------- conformance kit

from perflab.testing import EngineConformance  # noqa: E402


class TestTrtllmConformance(EngineConformance):
    engine = ENGINE
    distribution = "perflab-plugin-trtllm"
    model = "Qwen/Qwen3-8B"
    sim_hardware = "h100-80g-x1"  # full launch/ready/teardown cycle on perflab's simulator
    configs = [{"max_model_len": 4096}, {"tp": 2}, {"dp": 2}, {"prefix_caching": False, "chunked_prefill": True}]
    unsupported_configs = [{"served_model_name": "qwen"}, {"tp": 2, "dp": 2}, {"quantization": "fp8"}]
    crash_samples = CRASHES
    serve_option_samples = {
        "quantization": {"options": {"backend": "tensorrt"}, "quantization": "fp8"},  # built-in quantization: TRT engines
        "chunked_prefill": {"chunked_prefill": True},  # off by default
        "options": {"options": {"backend": "tensorrt"}},
    }


def test_the_versions_mapped_run_from_the_seeds_to_the_newest_release(pm):
    """TensorRT-LLM 1.2.0rc1 (the seeds') to 1.2.1 with no flag changed: a version outside is built
    the same, with the core's warning."""
    versions = perflab_trtllm.plugin.engine_versions
    assert (versions.oldest, versions.newest, versions.changes) == ("1.2.0rc1", "1.2.1", ())
    config = ServeConfig(model="m", port=8000, tp=2, max_model_len=4096, mem_fraction=0.8)
    argvs = {pm.engine("trtllm").build_launch(config, gpus("NVIDIA H100 80GB HBM3", (9, 0)), WORKDIR, v).argv
             for v in ("1.2.0rc1", "1.2.1", "1.4.0rc1", None)}
    assert len(argvs) == 1
    choice = pm.engine("trtllm").choose_version({}, "1.4.0rc1")
    assert "TensorRT-LLM 1.4.0rc1 is newer than the newest version perflab maps (1.2.0rc1 .. 1.2.1)" in choice.warning
