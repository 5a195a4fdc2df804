"""The simulated engines' front ends, parse only (no server): real flags accepted, unknown ones
rejected the way each engine rejects them, the seeds' crash decisions per hardware, MindIE's
config.json checks, and the efficiency table against the seeds' rankings."""

from __future__ import annotations

import json
import os
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from perflab_sim import calibrate, perfmodel, runtime, scheduler
from perflab_sim.frontends import common, frontend_for, mindie, sglang, trtllm, vllm
from perflab_sim.frontends.common import EngineExit

FIXTURE_CONFIG = Path(__file__).resolve().parents[1] / "fixtures" / "mindie" / "config.json"
CLEAN_ENV = {"PATH": os.environ.get("PATH", "")}


def env_for(machine: str, **extra: str) -> dict[str, str]:
    return {**CLEAN_ENV, "PERFLAB_SIM_HARDWARE": machine, **extra}


@pytest.fixture
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def usage_error(parse, argv: list[str], env: dict[str, str]) -> EngineExit:  # type: ignore[no-untyped-def]
    with pytest.raises(EngineExit) as info:
        parse(argv, env)
    return info.value


# --------------------------------------------------------------------------- vLLM

A100 = env_for("a100-80g-x1")
A100X8 = env_for("a100-80g-x8")
H100 = env_for("h100-80g-x1")
ASCEND = env_for("910b3-x8")

# Commands of the seeds (seed_results.json), minus the model when positional.
VLLM_SEED_COMMANDS = [
    ["serve", "Qwen/Qwen3-32B", "--max-model-len", "32768"],
    ["serve", "Qwen/Qwen3-32B-AWQ"],
    ["serve", "Qwen/Qwen3-235B-A22B-Instruct-2507", "-tp", "8"],
    ["serve", "Qwen/Qwen3-235B-A22B-Instruct-2507-FP8", "-tp", "4", "--max-num-batched-tokens", "4096"],
    ["serve", "Qwen/Qwen3-235B-A22B-Instruct-2507-FP8", "-tp", "4", "--enable-expert-parallel"],
    ["serve", "Qwen/Qwen3.5-9B", "--reasoning-parser=qwen3", "--max-model-len=32768", "--max-num-seqs=512"],
    ["serve", "Qwen/Qwen3.5-9B", "--reasoning-parser=qwen3", "--enable-prefix-caching", "--max-model-len=32768"],
    ["serve", "Qwen/Qwen3.5-9B", '--speculative-config={"method":"mtp","num_speculative_tokens":4}', "--max-model-len=32768"],
]


@pytest.mark.parametrize("argv", VLLM_SEED_COMMANDS, ids=lambda a: " ".join(a[1:3]))
def test_vllm_accepts_the_seed_commands(argv: list[str], free_port: int) -> None:
    cfg = vllm.parse([*argv, "--port", str(free_port)], A100X8)
    assert cfg.engine == "vllm" and cfg.engine_version == "0.11.0"
    assert cfg.port == free_port
    assert cfg.health_paths == ("/health",)
    assert any("Starting vLLM API server 0 on http://0.0.0.0:" in line for line in cfg.ready_lines)
    assert cfg.ready_lines[-1].endswith("INFO:     Application startup complete.")
    assert any("non-default args: {" in line for line in cfg.startup_lines)


def test_vllm_maps_flags_to_the_runtime(free_port: int) -> None:
    cfg = vllm.parse(
        ["serve", "Qwen/Qwen3-32B", "-tp", "2", "--max_model_len", "16k", "--max-num-batched-tokens", "4096",
         "--max-num-seqs", "128", "--no-enable-prefix-caching", "--kv-cache-dtype", "fp8", "--gpu-memory-utilization",
         "0.85", "--served-model-name", "qwen", "q32", "--host", "127.0.0.1", "--port", str(free_port),
         "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}'],
        A100X8,
    )  # fmt: skip
    assert (cfg.tp, cfg.max_model_len, cfg.max_batched_tokens, cfg.max_num_seqs) == (2, 16000, 4096, 128)
    assert cfg.prefix_caching is False and cfg.chunked_prefill is True
    assert (cfg.kv_cache_dtype, cfg.mem_fraction, cfg.host) == ("fp8", 0.85, "127.0.0.1")
    assert cfg.served_model_names == ("qwen", "q32")
    assert (cfg.spec_method, cfg.spec_tokens) == ("ngram", 3)
    assert cfg.workers == 2 and cfg.worker_title == "VLLM::Worker_TP{tp_rank}"


def test_vllm_defaults_follow_the_gpu(free_port: int) -> None:
    a100 = vllm.parse(["serve", "Qwen/Qwen3-8B", "--port", str(free_port)], A100)
    h100 = vllm.parse(["serve", "Qwen/Qwen3-8B", "--port", str(free_port)], H100)
    # EngineArgs._set_default_args: >= 70 GiB and not an A100 -> 8192 / 1024, else 2048 / 256
    assert (a100.max_batched_tokens, a100.max_num_seqs) == (2048, 256)
    assert (h100.max_batched_tokens, h100.max_num_seqs) == (8192, 1024)
    assert a100.prefix_caching and a100.chunked_prefill


def test_vllm_unknown_flag_is_rejected_like_vllm(free_port: int) -> None:
    exc = usage_error(vllm.parse, ["serve", "Qwen/Qwen3-32B", "--max-num-seq", "4", "--foo"], A100)
    assert exc.code == 2
    assert exc.stderr == (
        "usage: vllm [-h] [-v] {chat,complete,serve,bench,collect-env,run-batch} ...\n"
        "vllm: error: unrecognized arguments: --foo\n"
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["serve", "m", "--max-num-seqs", "many"], "argument --max-num-seqs: invalid int value: 'many'"),
        (["serve", "m", "--kv-cache-dtype", "fp9"], "argument --kv-cache-dtype: invalid choice: 'fp9'"),
        (["serve", "m", "--block-size", "7"], "argument --block-size: invalid choice: 7"),
        (["serve", "m", "--reasoning-parser", "nope"], "argument --reasoning-parser: invalid choice: 'nope'"),
        (["serve", "m", "--quantization", "ascend"], "argument --quantization/-q: invalid choice: 'ascend'"),
    ],
)
def test_vllm_bad_values_are_rejected_by_the_serve_parser(argv: list[str], message: str) -> None:
    exc = usage_error(vllm.parse, argv, A100)
    assert exc.code == 2
    assert exc.stderr.startswith("usage: vllm serve [model_tag] [options]\nvllm serve: error: ")
    assert message in exc.stderr


def test_vllm_version_and_model_option() -> None:
    exc = usage_error(vllm.parse, ["--version"], A100)
    assert (exc.code, exc.stdout) == (0, "0.11.0\n")
    assert usage_error(vllm.parse, ["--version"], ASCEND).stdout == "0.9.1\n"
    exc = usage_error(vllm.parse, ["serve", "--model", "Qwen/Qwen3-32B"], A100)
    assert exc.code == 1 and "ValueError: With `vllm serve`, you should provide the model as a positional argument" in exc.stderr


def test_vllm_config_file_and_dotted_json(tmp_path: Path, free_port: int) -> None:
    path = tmp_path / "serve.yaml"
    path.write_text(f"tensor-parallel-size: 2\nport: {free_port}\nenable-expert-parallel: true\n")
    cfg = vllm.parse(["serve", "Qwen/Qwen3-30B-A3B", "--config", str(path), "-O3"], A100X8)
    assert (cfg.tp, cfg.ep, cfg.port) == (2, 2, free_port)
    assert cfg.behaviour.settings["compilation_config"] == {"level": 3}
    dotted = ["--compilation-config.cudagraph_mode", "FULL", "--compilation_config.cudagraph_capture_sizes+", "1,8"]
    cfg = vllm.parse(["serve", "Qwen/Qwen3-8B", "--port", str(free_port), *dotted], A100)
    assert cfg.behaviour.settings["compilation_config"] == {"cudagraph_mode": "FULL", "cudagraph_capture_sizes": ["1", "8"]}


def test_vllm_version_tables_differ(free_port: int) -> None:
    # --async-scheduling came after 0.9.1; --performance-mode after 0.11.
    exc = usage_error(vllm.parse, ["serve", "Qwen/Qwen3-8B", "--async-scheduling"], ASCEND)
    assert exc.code == 2 and "unrecognized arguments: --async-scheduling" in exc.stderr
    assert "unrecognized arguments: --performance-mode" in usage_error(vllm.parse, ["serve", "m", "--performance-mode", "throughput"], A100).stderr
    # seed 004: H100 machines run vLLM 0.17.1 by default
    cfg = vllm.parse(["serve", "Qwen/Qwen3.5-9B", "--performance-mode", "throughput", "--max-model-len", "32768", "--port", str(free_port)], H100)
    assert cfg.engine_version == "0.17.1"
    assert (cfg.max_batched_tokens, cfg.max_num_seqs) == (16384, 2048)  # throughput mode doubles both


def test_vllm_versions_from_the_environment_pick_the_nearest_table_below(free_port: int) -> None:
    argv = ["serve", "Qwen/Qwen3.5-9B", "--performance-mode", "throughput", "--max-model-len", "32768", "--port", str(free_port)]
    older = env_for("h100-80g-x1", PERFLAB_SIM_ENGINE_VERSIONS="vllm=0.11.0")
    exc = usage_error(vllm.parse, argv, older)
    assert exc.code == 2 and "unrecognized arguments: --performance-mode" in exc.stderr
    assert "is simulated with" not in exc.stderr  # a known release: no note
    between = env_for("h100-80g-x1", PERFLAB_SIM_ENGINE_VERSIONS="sglang=0.5.9,vllm=0.16.0")
    exc = usage_error(vllm.parse, argv, between)
    assert "vLLM 0.16.0 is simulated with the command-line options of vLLM 0.11.0" in exc.stderr
    assert "unrecognized arguments: --performance-mode" in exc.stderr
    newer = env_for("a100-80g-x1", PERFLAB_SIM_ENGINE_VERSIONS="vllm=0.18.0")
    cfg = vllm.parse(argv, newer)
    assert cfg.engine_version == "0.18.0"
    assert any("vLLM 0.18.0 is simulated with the command-line options of vLLM 0.17.1" in line for line in cfg.startup_lines)
    assert vllm.table_version("0.8.5") == "0.9.1" and vllm.table_version("0.17.0") == "0.11.0"


def test_sglang_trtllm_and_mindie_versions_say_which_options_they_use(tmp_path: Path) -> None:
    cfg = sglang.parse(["--model-path", "Qwen/Qwen3.5-9B"], H100)
    assert cfg.engine_version == "0.5.9"
    assert "SGLang 0.5.9 is simulated with the server options of SGLang 0.5.5" in cfg.startup_lines[0]
    assert not any("is simulated with" in line for line in sglang.parse(["--model-path", "Qwen/Qwen3-32B"], A100).startup_lines)
    cfg = trtllm.parse(["Qwen/Qwen3-32B"], env_for("a100-80g-x1", PERFLAB_SIM_ENGINE_VERSIONS="trtllm=1.3.0"))
    assert cfg.engine_version == "1.3.0" and "TensorRT-LLM 1.3.0 is simulated with the options of TensorRT-LLM 1.2.0rc1" in cfg.startup_lines[0]
    env = {**mindie_env(write_config(tmp_path)), "PERFLAB_SIM_ENGINE_VERSIONS": "mindie=2.2.RC1"}
    cfg = mindie.parse([], env)
    assert cfg.engine_version == "2.2.RC1" and "MindIE 2.2.RC1 is simulated as MindIE 2.1.RC1" in cfg.startup_lines[0]


def test_vllm_ascend_seed_003_command(monkeypatch: pytest.MonkeyPatch, free_port: int) -> None:
    monkeypatch.setattr(vllm, "_engine_version", lambda machine, env: "0.11.0")  # the tutorial's v0.11.0rc2
    argv = ["serve", "/model/Qwen3-32B-W8A8", "--served-model-name", "qwen3", "--trust-remote-code", "--async-scheduling",
            "--quantization", "ascend", "--distributed-executor-backend", "mp", "--tensor-parallel-size", "4",
            "--max-model-len", "5500", "--max-num-batched-tokens", "40960",
            "--compilation-config", '{"cudagraph_mode": "FULL_DECODE_ONLY"}',
            "--additional-config", '{"pa_shape_list":[48,64,72,80], "weight_prefetch_config":{"enabled":true}}',
            "--port", str(free_port), "--block-size", "128", "--gpu-memory-utilization", "0.9"]  # fmt: skip
    cfg = vllm.parse(argv, ASCEND)
    assert cfg.engine == "vllm-ascend" and cfg.quantization == "w8a8" and cfg.block_size == 128
    assert cfg.behaviour.settings["additional_config"] == {"pa_shape_list": [48, 64, 72, 80], "weight_prefetch_config": {"enabled": True}}
    assert cfg.behaviour.settings["async_scheduling"] is True


def test_vllm_ascend_refuses_cuda_quantization() -> None:
    exc = usage_error(vllm.parse, ["serve", "Qwen/Qwen3-8B", "--quantization", "fp8"], ASCEND)
    assert exc.code == 1 and exc.stderr.rstrip().endswith("ValueError: fp8 quantization is currently not supported in npu.")


def test_vllm_seed_001_fp8_tp8_needs_expert_parallel(free_port: int) -> None:
    model = "Qwen/Qwen3-235B-A22B-Instruct-2507-FP8"
    bad = vllm.parse(["serve", model, "-tp", "8", "--port", str(free_port)], env_for("a100-80g-x8"))
    assert bad.fail_exit_code == 1
    assert any(
        "ValueError: The output_size of gate's and up's weight = 192 is not divisible by weight quantization block_n = 128." in line
        for line in bad.fail_lines
    )
    assert bad.fail_lines[-1].endswith("RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}")
    good = vllm.parse(["serve", model, "-tp", "8", "--enable-expert-parallel", "--port", str(free_port)], env_for("a100-80g-x8"))
    assert good.fail_lines == () and good.ep == 8
    # FP8 on A100 runs weight-only through Marlin, with vLLM's warning
    assert any("Weight-only FP8 compression will be used leveraging the Marlin kernel" in line for line in good.startup_lines)
    on_h100 = vllm.parse(["serve", model, "-tp", "4", "--port", str(free_port)], env_for("h100-80g-x8"))
    assert not any("Marlin" in line for line in on_h100.startup_lines)


def test_vllm_failures_before_serving(free_port: int) -> None:
    exc = usage_error(vllm.parse, ["serve", "Nobody/NoSuchModel", "--port", str(free_port)], A100)
    assert exc.code == 1 and "ValueError: Invalid repository ID or local directory specified: 'Nobody/NoSuchModel'." in exc.stderr
    exc = usage_error(vllm.parse, ["serve", "Qwen/Qwen3-32B", "-tp", "2", "--port", str(free_port)], A100)
    assert exc.code == 1 and exc.delay_s > 0
    assert "ValueError: Cannot provide a placement group of placement_group_specs=" in exc.stderr
    exc = usage_error(vllm.parse, ["serve", "Qwen/Qwen3-32B", "--max-model-len", "100000", "--port", str(free_port)], A100)
    assert "User-specified max_model_len (100000) is greater than the derived max_model_len (max_position_embeddings=40960" in exc.stderr
    exc = usage_error(vllm.parse, ["serve", "Qwen/Qwen3-8B", "--max-num-batched-tokens", "64", "--port", str(free_port)], A100)
    assert "max_num_batched_tokens (64) must be greater than or equal to max_num_seqs (256)." in exc.stderr


def test_vllm_busy_port_fails_at_once() -> None:
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        s.listen()
        port = s.getsockname()[1]
        exc = usage_error(vllm.parse, ["serve", "Qwen/Qwen3-8B", "--port", str(port)], A100)
    assert exc.code == 1 and exc.stderr.rstrip().endswith("OSError: [Errno 98] Address already in use")


def test_vllm_kv_cache_too_small_for_max_model_len(free_port: int) -> None:
    cfg = vllm.parse(["serve", "Qwen/Qwen3-32B", "--port", str(free_port)], A100)  # 40960 tokens do not fit
    assert "To serve at least one request with the models's max seq len (40960)" in cfg.fail_lines[-1]
    ok = vllm.parse(["serve", "Qwen/Qwen3-32B", "--max-model-len", "32768", "--port", str(free_port)], A100)
    assert ok.fail_lines == ()


# --------------------------------------------------------------------------- SGLang


@pytest.mark.parametrize(
    "argv",
    [
        ["--model-path", "Qwen/Qwen3-32B"],
        ["--model-path", "Qwen/Qwen3-235B-A22B-Instruct-2507", "--tp-size", "8"],
        ["--model", "Qwen/Qwen3.5-9B", "--reasoning-parser=qwen3", "--context-length=32768"],
    ],
)
def test_sglang_accepts_the_seed_commands(argv: list[str]) -> None:
    cfg = sglang.parse(argv, A100X8)
    assert cfg.engine == "sglang" and cfg.fail_lines == ()
    assert cfg.health_paths == ("/health", "/health_generate")
    assert cfg.ready_lines[-1].endswith("] The server is fired up and ready to roll!")


def test_sglang_maps_flags_and_defaults() -> None:
    cfg = sglang.parse(["--model-path", "Qwen/Qwen3-32B"], A100)
    # _handle_gpu_memory_settings on an 80 GB GPU, tp 1: chunk 8192, graph bs 256,
    # reserved 512 + 1.5 x 8192 + 2 x 256 + 128 = 13440 MiB -> (81920 - 13440) / 81920
    assert cfg.max_batched_tokens == 8192 and cfg.mem_fraction == 0.836
    assert (cfg.host, cfg.port, cfg.prefix_caching) == ("127.0.0.1", 30000, True)
    cfg = sglang.parse(
        ["--model-path", "Qwen/Qwen3-32B", "--tp-size", "2", "--chunked-prefill-size", "4096", "--max-prefill-tokens", "4096",
         "--max-running-requests", "64", "--disable-radix-cache", "--mem-fraction-static", "0.8", "--kv-cache-dtype", "fp8_e4m3",
         "--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3", "--served-model-name", "q"],
        A100X8,
    )  # fmt: skip
    assert (cfg.tp, cfg.max_batched_tokens, cfg.max_num_seqs, cfg.mem_fraction) == (2, 4096, 64, 0.8)
    assert cfg.prefix_caching is False and cfg.kv_cache_dtype == "fp8_e4m3"
    assert (cfg.spec_method, cfg.spec_tokens, cfg.served_model_names) == ("eagle3", 3, ("q",))
    assert cfg.workers == 2 and cfg.worker_title == "sglang::scheduler_TP{tp_rank}"
    assert sglang.parse(["--model-path", "Qwen/Qwen3-32B", "--chunked-prefill-size", "-1"], A100).chunked_prefill is False


def test_sglang_from_0_5_10_parses_the_ngram_trie_flags_as_the_plugin_builds_them() -> None:
    """The plugin's n-gram spellings per version (perflab_sglang.VERSIONS) are the ones the
    simulated SGLang of that version parses: the match windows and branch length up to 0.5.9,
    the trie depth (and no windows) from 0.5.10."""
    from perflab import ServeConfig
    from perflab_sglang.launch import build_argv

    spec = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 6, "max_trie_depth": 16}
    for version in ("0.5.5.post1", "0.5.9"):
        argv = build_argv(ServeConfig(model="Qwen/Qwen3-32B", port=30000, speculative_config=spec), version)[3:]
        cfg = sglang.parse(argv, env_for("a100-80g-x1", PERFLAB_SIM_ENGINE_VERSIONS=f"sglang={version}"))
        assert cfg.spec_method == "ngram" and cfg.spec_tokens == 4
    newer = env_for("a100-80g-x1", PERFLAB_SIM_ENGINE_VERSIONS="sglang=0.5.23")
    del spec["prompt_lookup_max"]
    argv = build_argv(ServeConfig(model="Qwen/Qwen3-32B", port=30000, speculative_config=spec), "0.5.23")[3:]
    assert "--speculative-ngram-max-trie-depth" in argv
    cfg = sglang.parse(argv, newer)
    assert cfg.spec_method == "ngram" and cfg.spec_tokens == 4
    assert "its n-gram flags as 0.5.10 renamed them" in cfg.startup_lines[0]
    exc = usage_error(sglang.parse, ["--model-path", "m", "--speculative-ngram-branch-length", "8"], newer)
    assert "unrecognized arguments: --speculative-ngram-branch-length" in exc.stderr
    cfg = sglang.parse(["--model-path", "Qwen/Qwen3-32B", "--speculative-algorithm", "NGRAM"], newer)
    assert cfg.spec_tokens == 12  # 0.5.10's default draft count, without the match windows


def test_sglang_usage_errors() -> None:
    exc = usage_error(sglang.parse, ["--model-path", "Qwen/Qwen3-32B", "--max-num-seqs", "8"], A100)
    assert exc.code == 2 and exc.stderr.startswith("usage: launch_server.py [-h] --model-path MODEL_PATH")
    assert exc.stderr.endswith("launch_server.py: error: unrecognized arguments: --max-num-seqs 8\n")
    exc = usage_error(sglang.parse, ["--tp-size", "2"], A100)
    assert exc.stderr.endswith("launch_server.py: error: the following arguments are required: --model-path/--model\n")
    exc = usage_error(sglang.parse, ["--model-path", "m", "--kv-cache-dtype", "fp8"], A100)
    assert "argument --kv-cache-dtype: invalid choice: 'fp8'" in exc.stderr


def test_sglang_fp8_does_not_work_on_a100() -> None:
    cfg = sglang.parse(["--model-path", "Qwen/Qwen3-32B-FP8"], A100)
    assert any("ValueError: type fp8e4nv not supported in this architecture." in line for line in cfg.fail_lines)
    assert cfg.fail_lines[-1].endswith("Received sigquit from a child process. It usually means the child failed.")
    assert cfg.fail_exit_code == 137
    assert sglang.parse(["--model-path", "Qwen/Qwen3-32B-FP8"], H100).fail_lines == ()


def test_sglang_config_file(tmp_path: Path) -> None:
    path = tmp_path / "sglang.yaml"
    path.write_text("model-path: Qwen/Qwen3-8B\ntp-size: 2\ndisable-radix-cache: true\n")
    cfg = sglang.parse(["--config", str(path), "--port", "31000"], A100X8)
    assert (cfg.model, cfg.tp, cfg.port, cfg.prefix_caching) == ("Qwen/Qwen3-8B", 2, 31000, False)


# --------------------------------------------------------------------------- TensorRT-LLM


@pytest.mark.parametrize(
    "argv",
    [
        ["Qwen/Qwen3-32B"],
        ["Qwen/Qwen3-14B", "--max_num_tokens=16384"],
        ["Qwen/Qwen3-32B", "--max_seq_len=40960", "--enable_chunked_prefill"],
        ["serve", "Qwen/Qwen3-32B", "--tp_size", "1", "--backend", "trt", "--kv_cache_free_gpu_memory_fraction", "0.8"],
    ],
)
def test_trtllm_accepts_the_seed_commands(argv: list[str]) -> None:
    cfg = trtllm.parse(argv, A100)
    assert cfg.engine == "trtllm" and cfg.engine_version == "1.2.0rc1" and cfg.fail_lines == ()
    assert cfg.startup_lines[0] == "[TensorRT-LLM] TensorRT LLM version: 1.2.0rc1"
    assert cfg.ready_lines[-1] == "INFO:     Uvicorn running on http://localhost:8000 (Press CTRL+C to quit)"


def test_trtllm_flag_mapping() -> None:
    cfg = trtllm.parse(["Qwen/Qwen3-14B", "--max_num_tokens=16384", "--max_batch_size", "128", "--max_seq_len", "8192", "--host", "0.0.0.0"], A100)
    assert (cfg.max_batched_tokens, cfg.max_num_seqs, cfg.max_model_len, cfg.host) == (16384, 128, 8192, "0.0.0.0")
    assert cfg.chunked_prefill is False and cfg.prefix_caching is True  # enable_block_reuse defaults on
    default = trtllm.parse(["Qwen/Qwen3-14B"], A100)
    assert (default.max_batched_tokens, default.max_num_seqs) == (8192, 2048)


def test_trtllm_usage_errors_are_clicks() -> None:
    exc = usage_error(trtllm.parse, ["Qwen/Qwen3-32B", "--foo"], A100)
    assert exc.code == 2
    assert exc.stderr.startswith("Usage: trtllm-serve serve [OPTIONS] MODEL\n")
    assert "Error: No such option" in exc.stderr and "--foo" in exc.stderr
    exc = usage_error(trtllm.parse, ["--version"], A100)  # the group has no --version; the import banner tells it
    assert exc.code == 2 and exc.stdout == "[TensorRT-LLM] TensorRT LLM version: 1.2.0rc1\n"
    exc = usage_error(trtllm.parse, ["Qwen/Qwen3-32B", "--tp_size", "two"], A100)
    assert "Invalid value for '--tp_size': 'two' is not a valid integer." in exc.stderr


def test_trtllm_seed_002_crashes_on_a100() -> None:
    fp8 = trtllm.parse(["Qwen/Qwen3-32B-FP8"], A100)
    assert fp8.fail_lines[-1].endswith("RuntimeError: Unsupported SM version for FP8 block scaling GEMM")
    awq = trtllm.parse(["Qwen/Qwen3-32B-AWQ"], A100)
    assert awq.fail_lines[-1].endswith("KeyError: 'weight'")
    assert trtllm.parse(["Qwen/Qwen3-32B-FP8"], H100).fail_lines == ()  # SM90 has the kernel


def test_trtllm_extra_llm_api_options_yaml(tmp_path: Path) -> None:
    path = tmp_path / "extra.yaml"
    path.write_text(
        "kv_cache_config:\n  enable_block_reuse: false\n  free_gpu_memory_fraction: 0.5\n  dtype: fp8\n"
        "enable_attention_dp: true\nmax_batch_size: 64\n"
        "speculative_config:\n  decoding_type: NGram\n  max_draft_len: 4\n  max_matching_ngram_size: 2\n"
        "cuda_graph_config:\n  enable_padding: true\n"
    )
    cfg = trtllm.parse(["Qwen/Qwen3-30B-A3B", "--tp_size", "2", "--extra_llm_api_options", str(path)], A100X8)
    assert cfg.prefix_caching is False and cfg.kv_cache_dtype == "fp8" and cfg.max_num_seqs == 64
    assert (cfg.tp, cfg.dp, cfg.ep) == (2, 2, 2)
    assert (cfg.spec_method, cfg.spec_tokens) == ("ngram", 4)
    assert cfg.behaviour.settings["llm_api_unmodelled_keys"] == ["cuda_graph_config"]
    missing = usage_error(trtllm.parse, ["Qwen/Qwen3-32B", "--extra_llm_api_options", str(tmp_path / "none.yaml")], A100)
    assert missing.code == 1 and "FileNotFoundError: [Errno 2] No such file or directory:" in missing.stderr
    path.write_text("speculative_config:\n  decoding_type: Lookahead\n")
    bad = usage_error(trtllm.parse, ["Qwen/Qwen3-32B", "--extra_llm_api_options", str(path)], A100)
    assert "ValidationError: 1 validation error for TorchLlmArgs" in bad.stderr


# --------------------------------------------------------------------------- MindIE


def write_config(tmp_path: Path, edit=None, mode: int = 0o640) -> Path:  # type: ignore[no-untyped-def]
    data = json.loads(FIXTURE_CONFIG.read_text())
    server = data["ServerConfig"]
    server["httpsEnabled"] = False
    backend = data["BackendConfig"]
    backend["npuDeviceIds"] = [[0, 1]]
    model = backend["ModelDeployConfig"]["ModelConfig"][0]
    model.update(modelName="Qwen3-30B-A3B", modelWeightPath="/data/weights/Qwen3-30B-A3B", worldSize=2)
    if edit is not None:
        edit(data)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    path.chmod(mode)
    return path


def mindie_env(path: Path) -> dict[str, str]:
    return env_for("910b3-x8", MIES_CONFIG_JSON_PATH=str(path))


def test_mindie_reads_the_fixture_config(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    shutil.copy(FIXTURE_CONFIG, path)
    path.chmod(0o640)
    # The template is valid for MindIE's config manager; its llama_65b weights are not simulated.
    exc = usage_error(mindie.parse, [], mindie_env(path))
    assert exc.code == 137 and exc.signal == 9
    assert f"ConfigManager: Load Config from {path}." in exc.stdout
    assert "Failed to load json file: /data/atb_testdata/weights/llama1-65b-safetensors/config.json" in exc.stdout
    assert exc.stdout.rstrip().endswith("[ERROR] Failed to init endpoint! Please check the service log or console output.")


def test_mindie_maps_the_config(tmp_path: Path) -> None:
    cfg = mindie.parse([], mindie_env(write_config(tmp_path)))
    assert cfg.engine == "mindie" and cfg.fail_lines == ()
    assert (cfg.model, cfg.tp, cfg.devices) == ("Qwen3-30B-A3B", 2, (0, 1))
    assert (cfg.host, cfg.port, cfg.extra_ports) == ("127.0.0.1", 1025, (1026, 1027))
    assert (cfg.max_model_len, cfg.max_batched_tokens, cfg.max_num_seqs, cfg.block_size) == (2560, 8192, 200, 128)
    assert cfg.ready_lines == ("Daemon start success!",)
    assert cfg.health_paths == ()  # /v1/models on the business port is the OpenAI route
    assert "/v2/health/ready" in cfg.behaviour.health_paths_by_port[1026]
    assert cfg.behaviour.health_paths_by_port[1027] == ("/metrics",)
    assert cfg.behaviour.port_hosts == {1026: "127.0.0.2", 1027: "127.0.0.2"}  # managementIpAddress
    assert "listen port is occupied" in cfg.behaviour.bind_error_lines[0] and cfg.behaviour.bind_error_signal == 9


def test_mindie_one_port_serves_everything(tmp_path: Path) -> None:
    def same(d: dict) -> None:
        d["ServerConfig"].update(managementIpAddress="127.0.0.1", managementPort=1025, metricsPort=1025)

    cfg = mindie.parse([], mindie_env(write_config(tmp_path, same)))
    assert cfg.extra_ports == () and "/v2/health/ready" in cfg.health_paths


def test_mindie_seed_000_prefix_cache_crashes_on_moe(tmp_path: Path) -> None:
    def prefix(d: dict) -> None:
        d["BackendConfig"]["ModelDeployConfig"]["ModelConfig"][0]["plugin_params"] = '{"plugin_type":"prefix_cache"}'
        d["BackendConfig"]["ScheduleConfig"]["enablePrefixCache"] = True

    cfg = mindie.parse([], mindie_env(write_config(tmp_path, prefix)))
    assert cfg.prefix_caching is True and cfg.fail_exit_code == 134
    assert any("prefix_cache plugin is not supported for Qwen3MoeForCausalLM" in line for line in cfg.fail_lines)

    def dense(d: dict) -> None:
        prefix(d)
        d["BackendConfig"]["ModelDeployConfig"]["ModelConfig"][0]["modelName"] = "Qwen3-8B"

    ok = mindie.parse([], mindie_env(write_config(tmp_path, dense)))
    assert ok.prefix_caching is True and ok.fail_lines == ()


@pytest.mark.parametrize(
    ("edit", "mode", "expect"),
    [
        (None, 0o644, "Check Other group permission failed"),
        (lambda d: d["ServerConfig"].pop("port"), 0o640, "[ParamChecker::CheckJsonParamType] port: missing compulsory field"),
        (lambda d: d["ServerConfig"].update(port="1025"), 0o640, "The type of param port should be int32_t, but got string"),
        (lambda d: d["BackendConfig"]["ScheduleConfig"].update(maxBatchSize=-1), 0o640, "The value of param maxBatchSize for uint32_t is invalid."),
        (lambda d: d["BackendConfig"].update(npuDeviceIds=[[0, 1, 2]]), 0o640, "The size of npuDeviceIds (subset) does not equal to worldSize"),
        (lambda d: d.pop("BackendConfig"), 0o640, "BackendConfig: [json.exception.out_of_range.403] key 'BackendConfig' not found"),
    ],
)
def test_mindie_config_errors(tmp_path: Path, edit, mode: int, expect: str) -> None:  # type: ignore[no-untyped-def]
    exc = usage_error(mindie.parse, [], mindie_env(write_config(tmp_path, edit, mode)))
    assert exc.code == 137 and expect in exc.stdout
    assert "Failed to init endpoint! Please check the service log or console output." in exc.stdout


def test_mindie_missing_or_broken_file_and_arguments(tmp_path: Path) -> None:
    exc = usage_error(mindie.parse, [], mindie_env(tmp_path / "nope.json"))
    assert f"The path {tmp_path / 'nope.json'} realpath parsing failed." in exc.stdout
    broken = tmp_path / "broken.json"
    broken.write_text("{ not json")
    broken.chmod(0o640)
    assert "Json file is invalid. Please check json format! " in usage_error(mindie.parse, [], mindie_env(broken)).stdout
    exc = usage_error(mindie.parse, ["--foo"], mindie_env(broken))
    assert exc.code == 255 and "Unrecognized command-line argument, expect [--config-file, --expert-parallel]" in exc.stderr
    # --config-file wins over the environment
    good = write_config(tmp_path)
    assert mindie.parse(["--config-file", str(good)], mindie_env(broken)).model == "Qwen3-30B-A3B"


def test_mindie_needs_an_ascend_machine(tmp_path: Path) -> None:
    exc = usage_error(mindie.parse, [], env_for("a100-80g-x8", MIES_CONFIG_JSON_PATH=str(write_config(tmp_path))))
    assert exc.code == 1 and "MindIE runs on Ascend NPUs" in exc.stderr


# --------------------------------------------------------------------------- plumbing


def test_frontend_for_argv() -> None:
    assert frontend_for(["/usr/bin/python3", "-m", "sglang.launch_server", "--model-path", "m"]) == (
        "perflab_sim.frontends.sglang",
        ["--model-path", "m"],
    )
    assert frontend_for(["/x/bin/vllm", "serve", "m"]) == ("perflab_sim.frontends.vllm", ["serve", "m"])
    assert frontend_for(["trtllm-serve", "m"])[0] == "perflab_sim.frontends.trtllm"
    with pytest.raises(ValueError):
        frontend_for(["llama-server"])


def test_outside_the_simulator_the_stand_ins_refuse() -> None:
    exc = usage_error(vllm.parse, ["serve", "Qwen/Qwen3-8B"], CLEAN_ENV)
    assert exc.code == 1 and "PERFLAB_SIM_HARDWARE is not set" in exc.stderr


def test_visible_devices_limit_parallelism(free_port: int) -> None:
    env = env_for("a100-80g-x8", CUDA_VISIBLE_DEVICES="2,3")
    cfg = vllm.parse(["serve", "Qwen/Qwen3-8B", "-tp", "2", "--port", str(free_port)], env)
    assert cfg.devices == (2, 3)
    assert usage_error(vllm.parse, ["serve", "Qwen/Qwen3-8B", "-tp", "4", "--port", str(free_port)], env).code == 1


# --------------------------------------------------------------------------- efficiency


def sharegpt_workload(n: int = 1000, seed: int = 0) -> list[tuple[float, int, int]]:
    """ShareGPT-like lengths as perflab.bench's synthetic-sharegpt draws them, all arriving at once."""
    return calibrate.synthetic_sharegpt(n, seed)


@pytest.fixture(scope="module")
def workload() -> list[tuple[float, int, int]]:
    return sharegpt_workload()


def throughput(cfg, env: dict[str, str], workload, concurrency: int | None = None) -> float:  # type: ignore[no-untyped-def]
    p = runtime.deployment(cfg, env)
    cost = perfmodel.build_cost_model(p.model, p.machine.chip, p.knobs)
    result = scheduler.simulate(workload, cost, p.knobs, p.memory.kv_capacity_tokens, max_concurrency=concurrency)
    return result.total_token_throughput


@pytest.fixture
def mindie_config(tmp_path: Path) -> Iterator[Path]:
    yield write_config(tmp_path)


def test_efficiency_table_reproduces_seed_rankings(workload, mindie_config: Path, free_port: int) -> None:  # type: ignore[no-untyped-def]
    """Each engine with the seed's own command, on the seed's hardware, ShareGPT all at once."""
    a100, a100x8, h100 = A100, A100X8, H100
    port = ["--port", str(free_port)]
    tps = {
        "trtllm": throughput(trtllm.parse(["Qwen/Qwen3-32B"], a100), a100, workload),
        "vllm": throughput(vllm.parse(["serve", "Qwen/Qwen3-32B", "--max-model-len", "32768", *port], a100), a100, workload),
        "sglang": throughput(sglang.parse(["--model-path", "Qwen/Qwen3-32B"], a100), a100, workload),
    }
    # seed 002: TensorRT-LLM (2054.21) > vLLM (1730.98) > SGLang (1398.38)
    assert tps["trtllm"] > tps["vllm"] > tps["sglang"]
    for engine, seed in (("trtllm", 2054.21), ("vllm", 1730.98), ("sglang", 1398.38)):
        assert tps[engine] == pytest.approx(seed, rel=0.05)
    # seed 001: SGLang (4635.31) > vLLM (3792.50) on 8 x A100, Qwen3-235B-A22B-Instruct-2507
    moe = "Qwen/Qwen3-235B-A22B-Instruct-2507"
    s = throughput(sglang.parse(["--model-path", moe, "--tp-size", "8"], a100x8), a100x8, workload)
    v = throughput(vllm.parse(["serve", moe, "-tp", "8", *port], a100x8), a100x8, workload)
    assert s > v
    # seed 000: MindIE (4712.47) well ahead of vLLM-Ascend (1227.19) on 910B, Qwen3-30B-A3B
    ascend = ASCEND
    m = throughput(mindie.parse([], mindie_env(mindie_config)), mindie_env(mindie_config), workload)
    va = throughput(vllm.parse(["serve", "Qwen/Qwen3-30B-A3B", "-tp", "2", *port], ascend), ascend, workload)
    assert m > 3 * va
    assert va == pytest.approx(1227.19, rel=0.05)
    # seed 004: vLLM (11527.14) > SGLang (6499.41) on H100, Qwen3.5-9B, 512 concurrent
    vh = throughput(vllm.parse(["serve", "Qwen/Qwen3.5-9B", "--max-model-len", "32768", *port], h100), h100, workload, 512)
    sh = throughput(sglang.parse(["--model-path", "Qwen/Qwen3.5-9B", "--context-length", "32768"], h100), h100, workload, 512)
    assert vh > 1.5 * sh


def test_marlin_quantization_decodes_slower_on_a100(workload, free_port: int) -> None:  # type: ignore[no-untyped-def]
    port = ["--port", str(free_port)]
    bf16 = vllm.parse(["serve", "Qwen/Qwen3-32B", "--max-model-len", "32768", *port], A100)
    fp8 = vllm.parse(["serve", "Qwen/Qwen3-32B-FP8", *port], A100)
    assert fp8.decode_efficiency < bf16.decode_efficiency
    # seed 002 §2: vLLM FP8 on A100 (1563.33) below BF16 (1730.98)
    assert throughput(fp8, A100, workload) < throughput(bf16, A100, workload)


def test_efficiency_lookup_falls_back() -> None:
    machine = common.sim_machine(A100)
    assert common.efficiency("trtllm", machine, is_moe=True).efficiency == common.EFFICIENCY[("trtllm", "a100", "any")].efficiency
    assert common.efficiency("some-engine", machine, is_moe=False) == common.Factors()
