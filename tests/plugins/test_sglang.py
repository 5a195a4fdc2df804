"""The SGLang plugin: seed commands reproduced, every option mapped, preflight and crash causes."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys

import pytest

import perflab_sglang
from perflab.contract.errors import UnsupportedOption
from perflab.contract.types import HardwareSnapshot, HttpProbe, ServeConfig

from .conftest import WORKDIR, dist_info, gpus, seed_records, split_equals, without_host_port

ENGINE = "sglang"

A100X8 = gpus("NVIDIA A100-SXM4-80GB", (8, 0), 8)
H100 = gpus("NVIDIA H100 80GB HBM3", (9, 0), 1)


def build(pm, config: ServeConfig, hardware: HardwareSnapshot = A100X8):
    return pm.engine(ENGINE).build_launch(config, hardware, WORKDIR, "0.5.5.post1")


def pairs(tokens: list[str]) -> list[tuple[str, str | None]]:
    """Flags with their value (None for a bare flag), in order."""
    out: list[tuple[str, str | None]] = []
    i = 0
    while i < len(tokens):
        flag = tokens[i]
        assert flag.startswith("--"), tokens
        value = tokens[i + 1] if i + 1 < len(tokens) and not tokens[i + 1].startswith("--") else None
        out.append((flag, value))
        i += 1 if value is None else 2
    return out


def flags_of(spec) -> dict[str, str | None]:
    tokens = without_host_port(spec.argv, spec.host, spec.port)
    assert tokens[:5] == [tokens[0], "-m", "sglang.launch_server", "--model-path", tokens[4]]
    return dict(pairs(tokens[5:]))


# --------------------------------------------------------------------------- the seeds

# Every SGLang serving command in the seeds (seed_results.json "command" fields), with the
# ServeConfig that must reproduce it. Seed 004 gives only GPUStack "backend parameters".
SEED_COMMANDS = {
    "python3 -m sglang.launch_server --model-path Qwen/Qwen3-235B-A22B-Instruct-2507 --tp-size 8": ServeConfig(
        model="Qwen/Qwen3-235B-A22B-Instruct-2507", tp=8, options={"python": "python3"}
    ),
    "python3 -m sglang.launch_server --model-path Qwen/Qwen3-32B": ServeConfig(
        model="Qwen/Qwen3-32B", options={"python": "python3"}
    ),
}
SEED_BACKEND_PARAMETERS = {
    "--reasoning-parser=qwen3 --context-length=32768": ServeConfig(
        model="Qwen/Qwen3.5-9B", reasoning_parser="qwen3", max_model_len=32768
    ),
}


@pytest.mark.parametrize("command", sorted(SEED_COMMANDS))
def test_seed_command_is_reproduced_exactly(pm, command):
    spec = build(pm, SEED_COMMANDS[command].replace(port=30000))
    assert without_host_port(spec.argv, "127.0.0.1", 30000) == split_equals(shlex.split(command))


@pytest.mark.parametrize("params", sorted(SEED_BACKEND_PARAMETERS))
def test_seed_backend_parameters_are_reproduced(pm, params):
    spec = build(pm, SEED_BACKEND_PARAMETERS[params], H100)
    assert flags_of(spec) == dict(pairs(split_equals(shlex.split(params))))


def test_table_covers_every_sglang_command_of_the_seeds():
    seen = {r["command"] for r in seed_records(ENGINE)}
    assert seen == set(SEED_COMMANDS) | set(SEED_BACKEND_PARAMETERS)


# --------------------------------------------------------------------------- launch


def test_host_port_explicit_and_default_port(pm):
    spec = build(pm, ServeConfig(model="m"))  # port None: the engine's default
    assert spec.port == 30000 and spec.host == "127.0.0.1"
    assert without_host_port(spec.argv, "127.0.0.1", 30000)[1:] == ["-m", "sglang.launch_server", "--model-path", "m"]
    assert spec.argv[0] == sys.executable  # options.python unset: perflab's own interpreter
    assert spec.served_model_name == "m"


def test_every_serve_config_field_maps_to_a_real_flag(pm):
    config = ServeConfig(
        model="Qwen/Qwen3-32B",
        served_model_name="qwen",
        tp=2,
        pp=2,
        dp=2,
        ep=4,
        max_model_len=32768,
        max_batched_tokens=16384,
        max_num_seqs=512,
        quantization="fp8",
        kv_cache_dtype="fp8",
        prefix_caching=False,
        chunked_prefill=True,
        speculative_config={"method": "eagle3", "model": "Tengyunw/qwen3_32b_eagle3", "num_speculative_tokens": 3},
        mem_fraction=0.85,
        reasoning_parser="qwen3",
        host="0.0.0.0",
        port=31000,
        devices=(4, 5, 6, 7, 0, 1, 2, 3),
        extra_args=("--enable-torch-compile", "--schedule-policy=lpm"),
        extra_env={"SGLANG_LOG_LEVEL": "info"},
    )
    spec = build(pm, config)
    assert flags_of(spec) == {
        "--served-model-name": "qwen",
        "--tp-size": "2",
        "--pp-size": "2",
        "--dp-size": "2",
        "--ep-size": "4",
        "--context-length": "32768",
        "--chunked-prefill-size": "16384",
        "--max-prefill-tokens": "16384",
        "--max-running-requests": "512",
        "--quantization": "fp8",
        "--kv-cache-dtype": "fp8_e4m3",
        "--disable-radix-cache": None,
        "--speculative-algorithm": "EAGLE3",
        "--speculative-draft-model-path": "Tengyunw/qwen3_32b_eagle3",
        "--speculative-num-steps": "3",
        "--speculative-eagle-topk": "1",
        "--speculative-num-draft-tokens": "4",
        "--mem-fraction-static": "0.85",
        "--reasoning-parser": "qwen3",
        "--enable-torch-compile": None,
        "--schedule-policy": "lpm",
    }
    assert spec.argv[-2:] == ("--enable-torch-compile", "--schedule-policy=lpm")  # verbatim, last
    # CUDA_DEVICE_ORDER: perflab numbers GPUs as NVML does, in PCI bus order (EnginePlugin.device_env)
    assert spec.env == {"SGLANG_LOG_LEVEL": "info", "CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "4,5,6,7,0,1,2,3"}
    assert (spec.host, spec.port, spec.served_model_name) == ("0.0.0.0", 31000, "qwen")


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"chunked_prefill": False}, {"--chunked-prefill-size": "-1"}),
        (
            {"chunked_prefill": False, "max_batched_tokens": 8192},
            {"--chunked-prefill-size": "-1", "--max-prefill-tokens": "8192"},
        ),
        ({"chunked_prefill": True}, {}),  # on by default
        ({"prefix_caching": True}, {}),  # the radix cache is on by default
        ({"prefix_caching": False}, {"--disable-radix-cache": None}),
        ({"kv_cache_dtype": "auto"}, {"--kv-cache-dtype": "auto"}),
        ({"reasoning_parser": "deepseek_r1"}, {"--reasoning-parser": "deepseek-r1"}),  # vLLM spelling
    ],
)
def test_defaults_and_disabling(pm, changes, expected):
    assert flags_of(build(pm, ServeConfig(model="m", **changes))) == expected


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (
            {"method": "mtp", "num_speculative_tokens": 3},
            {
                "--speculative-algorithm": "NEXTN",
                "--speculative-num-steps": "3",
                "--speculative-eagle-topk": "1",
                "--speculative-num-draft-tokens": "4",
            },
        ),
        (
            {
                "method": "eagle",
                "model": "yuhuili/EAGLE-LLaMA3-Instruct-8B",
                "num_steps": 5,
                "eagle_topk": 8,
                "num_draft_tokens": 64,
            },
            {
                "--speculative-algorithm": "EAGLE",
                "--speculative-draft-model-path": "yuhuili/EAGLE-LLaMA3-Instruct-8B",
                "--speculative-num-steps": "5",
                "--speculative-eagle-topk": "8",
                "--speculative-num-draft-tokens": "64",
            },
        ),
        (
            {"method": "ngram", "num_speculative_tokens": 8, "prompt_lookup_max": 12, "prompt_lookup_min": 2},
            {
                "--speculative-algorithm": "NGRAM",
                "--speculative-num-draft-tokens": "8",
                "--speculative-ngram-max-match-window-size": "12",
                "--speculative-ngram-min-match-window-size": "2",
            },
        ),
        (
            {"model": "Qwen/Qwen3-0.6B", "num_speculative_tokens": 4},
            {
                "--speculative-algorithm": "STANDALONE",
                "--speculative-draft-model-path": "Qwen/Qwen3-0.6B",
                "--speculative-num-steps": "4",
                "--speculative-eagle-topk": "1",
                "--speculative-num-draft-tokens": "5",
            },
        ),
    ],
)
def test_speculative_config_maps_methods(pm, spec, expected):
    assert flags_of(build(pm, ServeConfig(model="m", speculative_config=spec))) == expected


@pytest.mark.parametrize(
    ("changes", "option"),
    [
        (
            {"speculative_config": {"method": "mtp", "num_speculative_tokens": 2, "draft_tensor_parallel_size": 1}},
            "draft_tensor_parallel_size",
        ),
        ({"speculative_config": {"method": "medusa", "num_speculative_tokens": 2}}, "medusa"),
        ({"speculative_config": {"method": "eagle", "num_speculative_tokens": 2}}, "eagle"),
        ({"speculative_config": {"method": "eagle", "model": "d", "num_steps": 3}}, "speculative_config"),
        ({"speculative_config": {"method": "ngram", "model": "d"}}, "speculative_config.model"),
        ({"quantization": "ascend"}, "quantization=ascend"),
        ({"kv_cache_dtype": "int8"}, "kv_cache_dtype=int8"),
        ({"mem_fraction": 1.5}, "mem_fraction=1.5"),
        ({"tp": 0}, "tp=0"),
        ({"options": {"backend": "pytorch"}}, "backend"),
        ({"devices": (0, 1), "extra_env": {"CUDA_VISIBLE_DEVICES": "2,3"}}, "devices"),
    ],
)
def test_inexpressible_options_are_refused(pm, changes, option):
    with pytest.raises(UnsupportedOption) as exc:
        build(pm, ServeConfig(model="m", **changes))
    assert exc.value.engine == ENGINE and option in exc.value.option


# --------------------------------------------------------------------------- preflight


@pytest.mark.parametrize(
    "config",
    [
        ServeConfig(model="Qwen/Qwen3-235B-A22B-Instruct-2507-FP8", tp=8),  # seed 001's FP8 checkpoint
        ServeConfig(model="Qwen/Qwen3-32B", quantization="fp8"),
    ],
)
def test_fp8_is_refused_below_sm89(pm, config):
    reasons = pm.engine(ENGINE).check_support(config, A100X8, "0.5.5.post1")
    assert [(r.severity, "SM80" in r.why) for r in reasons] == [("error", True)]
    assert reasons[0].source.startswith("https://")
    assert pm.engine(ENGINE).check_support(config.replace(tp=1), H100, "0.5.5.post1") == []


def test_bf16_on_a100_has_no_objection(pm):
    assert pm.engine(ENGINE).check_support(ServeConfig(model="Qwen/Qwen3-32B", tp=8), A100X8, None) == []


# --------------------------------------------------------------------------- readiness


def test_readiness_uses_sglang_health_paths_and_ready_line(pm):
    spec = build(pm, ServeConfig(model="m"))
    ready = pm.engine(ENGINE).readiness(spec)
    assert ready.http == (HttpProbe("/health"), HttpProbe("/health_generate"))
    assert ready.generation_path == "/v1/completions"
    line = "[2025-11-20 10:00:00] The server is fired up and ready to roll!"
    assert any(re.search(p, line) for p in ready.ready_log_patterns)


# --------------------------------------------------------------------------- crashes

CRASHES = {
    "fp8-unsupported-gpu": """\
[2025-11-20 10:02:11 TP0] Load weight end. type=Qwen3MoeForCausalLM, dtype=torch.bfloat16
[2025-11-20 10:02:14 TP0] Scheduler hit an exception: Traceback (most recent call last):
  File "/usr/local/lib/python3.12/dist-packages/triton/language/core.py", line 35, in wrapper
ValueError("type fp8e4nv not supported in this architecture. The supported fp8 dtypes are ('fp8e4b15', 'fp8e5')")
[2025-11-20 10:02:15] Received sigquit from a child process. It usually means the child failed.
""",
    "kv-cache-no-memory": """\
[2025-11-20 10:02:14 TP0] Scheduler hit an exception: Traceback (most recent call last):
  File "/sgl-workspace/sglang/python/sglang/srt/model_executor/model_runner.py", line 1638, in init_memory_pool
RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. Current value: self.server_args.mem_fraction_static=0.88
""",
    "kv-cache-too-small": """\
  File "/sgl-workspace/sglang/python/sglang/srt/managers/tp_worker.py", line 300, in __init__
AssertionError: Memory pool size is too small
""",
    "cuda-oom": """\
[2025-11-20 10:05:01 TP3] Scheduler hit an exception: Traceback (most recent call last):
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 has a total capacity of 79.14 GiB of which 1.02 GiB is free.
[rank3]:[E1120 10:05:31 ProcessGroupNCCL.cpp:616] [Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=12, OpType=ALLREDUCE) ran for 30000 milliseconds before timing out.
""",
    "nccl-error": """\
[2025-11-20 10:01:40 TP1] Init torch distributed begin.
torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:317, unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5
""",
    "address-in-use": """\
INFO:     Started server process [4711]
ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', 30000): address already in use
""",
    "model-not-found": """\
huggingface_hub.errors.RepositoryNotFoundError: 404 Client Error. (Request ID: Root=1-673d)

Repository Not Found for url: https://huggingface.co/api/models/Qwen/Qwen3-999B/revision/main.
""",
}


@pytest.mark.parametrize("name", sorted(CRASHES))
def test_crash_causes_are_named_with_the_matching_line(pm, name):
    cause = pm.engine(ENGINE).classify_crash(1, CRASHES[name])
    assert cause.name == name
    assert cause.line and cause.line in CRASHES[name] and cause.hint and cause.source


def test_oom_wins_over_the_nccl_watchdog_it_causes(pm):
    cause = pm.engine(ENGINE).classify_crash(1, CRASHES["cuda-oom"])
    assert cause.line.startswith("torch.OutOfMemoryError")


def test_unknown_crash_falls_back_to_the_core(pm):
    cause = pm.engine(ENGINE).classify_crash(3, "loading\nValueError: something new\n")
    assert cause.name == "unknown" and cause.line == "ValueError: something new"


# --------------------------------------------------------------------------- version, hooks


def test_version_is_read_from_metadata_on_pythonpath(pm, tmp_path):
    assert pm.engine(ENGINE).engine.version({"PYTHONPATH": str(tmp_path)}) is None  # no sglang installed here
    dist_info(tmp_path, "sglang", "0.5.5.post1")
    assert pm.engine(ENGINE).engine.version({"PYTHONPATH": f"/nonexistent:{tmp_path}"}) == "0.5.5.post1"


def test_registration_and_other_engines_are_not_answered(pm):
    info = pm.engine(ENGINE).info
    assert (info.accelerators, info.executable, info.distributions, info.default_port) == (
        ("cuda",),
        None,
        ("sglang",),
        30000,
    )
    assert pm.engine("sglang").engine.wrapped is perflab_sglang.plugin  # the core calls this object


def test_entry_point_module_is_import_light():
    code = "import sys, perflab_sglang; print(sorted(m for m in ('torch', 'sglang', 'yaml', 'perflab_sglang.launch') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60).stdout
    assert out.strip() == "[]"


# --------------------------------------------------------------------------- conformance kit

from perflab.testing import EngineConformance  # noqa: E402


class TestSglangConformance(EngineConformance):
    engine = ENGINE
    distribution = "perflab-plugin-sglang"
    model = "Qwen/Qwen3-8B"
    sim_hardware = "h100-80g-x1"  # full launch/ready/teardown cycle on perflab's simulator
    configs = [{"max_model_len": 4096}, {"tp": 2}, {"prefix_caching": False, "chunked_prefill": False}]
    unsupported_configs = [{"quantization": "ascend"}, {"speculative_config": {"method": "medusa"}}]
    crash_samples = CRASHES
    # the kit builds for the newest SGLang perflab maps (no version known), which has no n-gram
    # match windows (prompt_lookup_max): the n-gram sample sets the trie depth instead
    serve_option_samples = {"options": {"options": {"python": "/usr/bin/python3"}},
                            "speculative_config": {"speculative_config": {"method": "ngram", "num_speculative_tokens": 3,
                                                                          "max_trie_depth": 8}}}


# --------------------------------------------------------------------------- per engine version

NGRAM = {"method": "ngram", "num_speculative_tokens": 4}


def build_for(pm, version: str | None, **changes):
    return pm.engine(ENGINE).build_launch(ServeConfig(model="m", **changes), A100X8, WORKDIR, version)


@pytest.mark.parametrize("version", ["0.5.5.post1", "0.5.9"])
def test_ngram_windows_and_branch_length_keep_their_old_spelling_up_to_0_5_9(pm, version):
    spec = {**NGRAM, "prompt_lookup_max": 6, "prompt_lookup_min": 2, "max_trie_depth": 16}
    flags = flags_of(build_for(pm, version, speculative_config=spec))
    assert (flags["--speculative-ngram-max-match-window-size"], flags["--speculative-ngram-min-match-window-size"],
            flags["--speculative-ngram-branch-length"]) == ("6", "2", "16")
    assert "--speculative-ngram-max-trie-depth" not in flags


@pytest.mark.parametrize("version", ["0.5.10", "0.5.23", None])  # None: nothing known, the newest
def test_from_0_5_10_the_trie_depth_is_spelled_anew_and_the_match_windows_are_refused(pm, version):
    flags = flags_of(build_for(pm, version, speculative_config={**NGRAM, "max_trie_depth": 16}))
    assert flags["--speculative-ngram-max-trie-depth"] == "16"
    assert not any("match-window" in f or "branch-length" in f for f in flags)
    for key in ("prompt_lookup_max", "prompt_lookup_min"):
        with pytest.raises(UnsupportedOption, match=rf"speculative_config\.{key}: not in sglang .*gone since 0\.5\.10"):
            build_for(pm, version, speculative_config={**NGRAM, key: 3})


@pytest.mark.parametrize(
    ("changes", "last_with", "first_without", "option"),
    [
        ({"quantization": "qoq"}, "0.5.15.post1", "0.5.16", "quantization=qoq"),
        ({"quantization": "marlin"}, "0.5.19", "0.5.20", "quantization=marlin"),
        ({"kv_cache_dtype": "fp4_e2m1"}, "0.5.20", "0.5.21", "kv_cache_dtype=fp4_e2m1"),
    ],
)
def test_choices_later_releases_dropped_are_refused_from_then_on(pm, changes, last_with, first_without, option):
    flags = flags_of(build_for(pm, last_with, **changes))
    assert next(iter(changes.values())) in flags.values()
    with pytest.raises(UnsupportedOption, match=rf"{re.escape(option)}: not in sglang {re.escape(first_without)}"):
        build_for(pm, first_without, **changes)


def test_the_version_range_and_every_change_cite_the_release_read():
    versions = perflab_sglang.plugin.engine_versions
    assert (versions.oldest, versions.newest) == ("0.5.5.post1", "0.5.23")
    assert all(c.source and (c.how is not None or c.why) for c in versions.changes)
    # a spelling valid in the oldest version is declared for every option that changes
    assert {c.option for c in versions.changes if c.version == versions.oldest} == set(versions.options())
