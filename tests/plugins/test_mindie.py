"""The MindIE plugin: the seeds' "mindie serve" commands as config.json, every option mapped,
the template kept whole, preflight, version file and crash causes."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from typing import Any

import pytest

import perflab_mindie
from perflab.contract.errors import UnsupportedOption
from perflab.contract.types import HardwareSnapshot, HttpProbe, ServeConfig
from perflab_mindie.config_json import load_template
from perflab_mindie.version import parse_version_info

from .conftest import WORKDIR, gpus, npus, seed_records

ENGINE = "mindie"

NPU1 = npus(1)
NPU8 = npus(8)
A100 = gpus("A100", (8, 0), n=1)


def build(pm, config: ServeConfig, hardware: HardwareSnapshot = NPU1, version: str | None = "2.1.RC1"):
    return pm.engine(ENGINE).build_launch(config, hardware, WORKDIR, version)


def document(spec) -> dict[str, Any]:
    (file,) = spec.files
    assert file.path == spec.env["MIES_CONFIG_JSON_PATH"] == str(WORKDIR / "config.json")
    assert file.mode == 0o640
    return json.loads(file.content)


def model_config(doc: dict[str, Any]) -> dict[str, Any]:
    (mc,) = doc["BackendConfig"]["ModelDeployConfig"]["ModelConfig"]
    return mc


def key_paths(node: Any, prefix: str = "") -> set[str]:
    if isinstance(node, dict):
        out = set()
        for key, value in node.items():
            out |= {f"{prefix}{key}"} | key_paths(value, f"{prefix}{key}.")
        return out
    if isinstance(node, list) and node and isinstance(node[0], dict):
        return key_paths(node[0], f"{prefix}0.")
    return set()


# --------------------------------------------------------------------------- the seeds

# Every MindIE command of the seeds (seed_results.json "command" fields, plus seed 000's
# recommended command): GPUStack's "simplified vLLM-like command", which it maps to MindIE's
# config.json and runs with mindieservice_daemon. The study ran on one Ascend 910B.
SEED_COMMANDS = {
    "mindie serve Qwen3-30B-A3B": ServeConfig(model="Qwen3-30B-A3B"),
    "mindie serve Qwen/Qwen3-30B-A3B": ServeConfig(model="Qwen/Qwen3-30B-A3B"),
    "mindie serve Qwen3-30B-A3B --enable-prefix-caching": ServeConfig(model="Qwen3-30B-A3B", prefix_caching=True),
    "mindie serve vllm-ascend/Qwen3-8B-W8A8": ServeConfig(model="vllm-ascend/Qwen3-8B-W8A8", quantization="w8a8"),
}


@pytest.mark.parametrize("command", sorted(SEED_COMMANDS))
def test_seed_command_becomes_daemon_plus_config_json(pm, command):
    config = SEED_COMMANDS[command]
    spec = build(pm, config.replace(port=1025))
    assert spec.argv == ("mindieservice_daemon",)
    assert (spec.port, spec.extra_ports) == (1025, (1026, 1027))
    doc = document(spec)
    server = doc["ServerConfig"]
    assert (server["ipAddress"], server["managementIpAddress"]) == ("127.0.0.1", "127.0.0.1")
    assert (server["port"], server["managementPort"], server["metricsPort"]) == (1025, 1026, 1027)
    assert (server["httpsEnabled"], server["interCommTLSEnabled"], doc["BackendConfig"]["interNodeTLSEnabled"]) == (
        False,
    ) * 3
    assert doc["BackendConfig"]["npuDeviceIds"] == [[0]]
    mc = model_config(doc)
    served = config.model.split("/")[-1]
    assert (mc["modelName"], mc["modelWeightPath"], mc["worldSize"]) == (served, config.model, 1)
    assert spec.served_model_name == served
    schedule = doc["BackendConfig"]["ScheduleConfig"]
    if config.prefix_caching:
        assert mc["plugin_params"] == '{"plugin_type":"prefix_cache"}'
        assert schedule["enablePrefixCache"] is True
    else:
        assert "plugin_params" not in mc and "enablePrefixCache" not in schedule
    assert not any(k in mc for k in ("tp", "dp", "pp", "moe_ep", "moe_tp"))  # one NPU: MindIE's defaults
    assert any("max_model_len not set" in w for w in spec.warnings)  # template limits are said out loud


def test_quantized_seed_checkpoint_is_served_as_is(pm):
    spec = build(pm, SEED_COMMANDS["mindie serve vllm-ascend/Qwen3-8B-W8A8"].replace(port=1025))
    assert any("w8a8" in w for w in spec.warnings)
    assert (
        pm.engine(ENGINE).check_support(SEED_COMMANDS["mindie serve vllm-ascend/Qwen3-8B-W8A8"], NPU1, "2.1.RC1")
        == []
    )


def test_table_covers_every_mindie_command_of_the_seeds():
    seen = {r["command"] for r in seed_records(ENGINE)}
    assert seen and seen <= set(SEED_COMMANDS)


def test_config_json_keeps_every_template_section_and_key(pm):
    template = load_template()
    full = ServeConfig(
        model="/data/Qwen3-30B-A3B",
        tp=2,
        dp=2,
        ep=4,
        max_model_len=32768,
        max_num_seqs=256,
        prefix_caching=True,
        reasoning_parser="qwen3",
        port=2025,
    )
    for config in (ServeConfig(model="m", port=2025), full):
        doc = document(build(pm, config, NPU8))
        assert set(doc) == set(template)
        assert key_paths(template) <= key_paths(doc)
        assert doc["Version"] == template["Version"] and doc["LogConfig"] == template["LogConfig"]


# --------------------------------------------------------------------------- launch


def test_every_serve_config_field_is_expressed(pm):
    config = ServeConfig(
        model="/data/weights/Qwen3-30B-A3B",
        served_model_name="qwen3-moe",
        tp=2,
        dp=2,
        ep=4,
        max_model_len=32768,
        max_batched_tokens=40960,
        max_num_seqs=256,
        quantization="w8a8",
        kv_cache_dtype="auto",
        prefix_caching=True,
        chunked_prefill=True,
        speculative_config={"method": "mtp", "num_speculative_tokens": 1},
        mem_fraction=0.92,
        reasoning_parser="qwen3",
        host="0.0.0.0",
        port=3025,
        devices=(4, 5, 6, 7),
        extra_args=("BackendConfig.ScheduleConfig.maxQueueDelayMicroseconds=2000", "ServerConfig.maxLinkNum=300"),
        extra_env={"HCCL_BUFFSIZE": "120"},
        options={"management_port": 4026, "metrics_port": 4027, "prequantized": True},
    )
    spec = build(pm, config, NPU8)
    doc = document(spec)
    server, backend = doc["ServerConfig"], doc["BackendConfig"]
    deploy, schedule = backend["ModelDeployConfig"], backend["ScheduleConfig"]
    mc = model_config(doc)
    assert (server["ipAddress"], server["allowAllZeroIpListening"], server["maxLinkNum"]) == ("0.0.0.0", True, 300)
    assert (server["port"], server["managementPort"], server["metricsPort"]) == (3025, 4026, 4027)
    assert spec.extra_ports == (4026, 4027)
    assert backend["npuDeviceIds"] == [[4, 5, 6, 7]]
    assert (mc["modelName"], mc["modelWeightPath"], mc["worldSize"]) == ("qwen3-moe", "/data/weights/Qwen3-30B-A3B", 4)
    assert (mc["tp"], mc["dp"], mc["moe_ep"], mc["moe_tp"]) == (2, 2, 4, 1)
    assert (deploy["maxSeqLen"], deploy["maxInputTokenLen"], schedule["maxIterTimes"]) == (32768, 32768, 32768)
    assert schedule["maxPrefillTokens"] == 40960
    assert (schedule["maxBatchSize"], schedule["maxPrefillBatchSize"]) == (256, 256)
    assert json.loads(mc["plugin_params"]) == {"plugin_type": "mtp,prefix_cache,splitfuse", "num_speculative_tokens": 1}
    assert schedule["templateType"] == "Mix" and schedule["enablePrefixCache"] is True
    assert mc["models"]["qwen3_moe"] == {"enable_reasoning": True}
    assert mc["models"]["layerwiseDisaggregatedMasterDeviceNum"] == 2  # template content kept
    assert schedule["maxQueueDelayMicroseconds"] == 2000
    assert spec.env == {
        "HCCL_BUFFSIZE": "120",
        "MIES_CONFIG_JSON_PATH": str(WORKDIR / "config.json"),
        "MINDIE_LOG_TO_STDOUT": "1",
        "MIES_SERVICE_MONITOR_MODE": "1",  # the Prometheus /metrics perflab scrapes
        "NPU_MEMORY_FRACTION": "0.92",
    }
    assert spec.served_model_name == "qwen3-moe"


def test_devices_default_to_the_probed_npus_and_world_size(pm):
    doc = document(build(pm, ServeConfig(model="m", tp=4), NPU8))
    assert doc["BackendConfig"]["npuDeviceIds"] == [[0, 1, 2, 3]]
    assert (model_config(doc)["worldSize"], model_config(doc)["tp"]) == (4, 4)
    doc = document(build(pm, ServeConfig(model="m", tp=2), HardwareSnapshot()))  # nothing probed
    assert doc["BackendConfig"]["npuDeviceIds"] == [[0, 1]]


def test_max_model_len_raises_max_prefill_tokens_to_the_input_length(pm):
    schedule = document(build(pm, ServeConfig(model="m", max_model_len=40960)))["BackendConfig"]["ScheduleConfig"]
    assert schedule["maxPrefillTokens"] == 40960  # MindIE: maxPrefillTokens >= maxInputTokenLen


def test_readiness_probes_management_health_and_business_models(pm):
    spec = build(pm, ServeConfig(model="m", port=5025))
    ready = pm.engine(ENGINE).readiness(spec)
    assert ready.http == (HttpProbe("/health", port=5026), HttpProbe("/v1/models"))
    assert ready.generation_path == "/v1/completions"
    assert any(re.search(p, "Daemon start success!") for p in ready.ready_log_patterns)


@pytest.mark.parametrize(
    ("changes", "option"),
    [
        ({"served_model_name": "Qwen/Qwen3-8B"}, "served_model_name"),
        ({"quantization": "awq"}, "quantization=awq"),
        ({"kv_cache_dtype": "fp8"}, "kv_cache_dtype=fp8"),
        ({"speculative_config": {"method": "eagle", "model": "d", "num_speculative_tokens": 2}}, "method"),
        ({"speculative_config": {"method": "mtp", "num_speculative_tokens": 1, "model": "d"}}, "model"),
        ({"reasoning_parser": "granite"}, "reasoning_parser"),
        ({"pp": 2, "dp": 2}, "pp=2"),
        ({"ep": 3, "tp": 4}, "ep=3"),
        ({"max_batched_tokens": 1024}, "max_batched_tokens=1024"),  # < maxInputTokenLen 2048
        ({"host": "example.com"}, "host"),
        ({"extra_args": ("--max-seq-len=4096",)}, "extra_args"),
        ({"extra_args": ("BackendConfig.NoSuchSection.key=1",)}, "extra_args"),
        ({"options": {"management_port": 80}}, "management_port"),
        ({"options": {"metrics_port": 1025}, "port": 1025}, "ports"),
        ({"options": {"python": "python3"}}, "python"),
        ({"devices": (0,), "extra_env": {"ASCEND_RT_VISIBLE_DEVICES": "3"}}, "devices"),
        ({"mem_fraction": 1.2}, "mem_fraction"),
    ],
)
def test_inexpressible_options_are_refused(pm, changes, option):
    with pytest.raises(UnsupportedOption) as exc:
        build(pm, ServeConfig(model="Qwen3-8B", **changes), NPU8)
    assert exc.value.engine == ENGINE and option in exc.value.option


def test_chunked_prefill_lifts_the_prefill_token_floor(pm):
    schedule = document(build(pm, ServeConfig(model="m", max_batched_tokens=1024, chunked_prefill=True)))[
        "BackendConfig"
    ]["ScheduleConfig"]
    assert (schedule["maxPrefillTokens"], schedule["templateType"]) == (1024, "Mix")


# --------------------------------------------------------------------------- preflight


@pytest.mark.parametrize("version", ["2.1.RC1", None])
def test_prefix_caching_on_moe_is_refused_like_seed_000(pm, version):
    config = SEED_COMMANDS["mindie serve Qwen3-30B-A3B --enable-prefix-caching"]
    reasons = pm.engine(ENGINE).check_support(config, NPU1, version)
    assert [(r.what, r.severity) for r in reasons] == [("prefix_caching", "error")]
    assert "MoE" in reasons[0].why and reasons[0].source.startswith("https://")


def test_prefix_caching_checks(pm):
    moe_newer = pm.engine(ENGINE).check_support(
        ServeConfig(model="Qwen/Qwen3-235B-A22B", prefix_caching=True), NPU8, "2.3.0"
    )
    assert [r.severity for r in moe_newer] == ["warning"]
    assert (
        pm.engine(ENGINE).check_support(ServeConfig(model="Qwen/Qwen3-32B", prefix_caching=True), NPU8, "2.1.RC1")
        == []
    )
    dp = pm.engine(ENGINE).check_support(ServeConfig(model="Qwen/Qwen3-32B", prefix_caching=True, dp=2), NPU8, None)
    assert [(r.what, r.severity) for r in dp] == [("prefix_caching", "error")] and "dp=2" in dp[0].why


def test_chunked_prefill_checks(pm):
    reasons = pm.engine(ENGINE).check_support(
        ServeConfig(model="m", chunked_prefill=True, dp=2, speculative_config={"method": "mtp"}), NPU8, None
    )
    assert [(r.what, r.severity) for r in reasons] == [("chunked_prefill", "error")] * 2


def test_non_ascend_hardware_is_refused_by_the_core(pm):
    reasons = pm.engine(ENGINE).check_support(ServeConfig(model="m"), A100, None)
    assert [r.what for r in reasons] == ["hardware"]


# --------------------------------------------------------------------------- version

VERSION_INFO = """\
Ascend-mindie : MindIE 2.1.RC1
mindie-rt: 2.1.RC1
mindie-torch: 2.1.RC1
mindie-service: 2.1.RC1
mindie-llm: 2.1.RC1
mindie-sd:2.1.RC1
Platform : aarch64
"""


def test_version_info_beside_mindie_service(pm, tmp_path):
    service = tmp_path / "mindie" / "latest" / "mindie-service"
    service.mkdir(parents=True)
    env = {"MIES_INSTALL_PATH": str(service)}
    assert pm.engine(ENGINE).engine.version(env) is None
    (service.parent / "version.info").write_text(VERSION_INFO)  # the real layout
    assert pm.engine(ENGINE).engine.version(env) == "2.1.RC1"
    (service / "version.info").write_text(VERSION_INFO.replace("2.1.RC1", "2.2.T1"))
    assert pm.engine(ENGINE).engine.version(env) == "2.2.T1"


@pytest.mark.parametrize(
    ("text", "version"),
    [
        (VERSION_INFO, "2.1.RC1"),
        ("mindie-service: 2.0.T3.B010\nPlatform : aarch64\n", "2.0.T3.B010"),
        ("Platform : aarch64\n", None),
    ],
)
def test_version_info_parsing(text, version):
    assert parse_version_info(text) == version


# --------------------------------------------------------------------------- crashes

CRASHES = {
    "prefix-cache-unsupported": """\
[2025-11-20 10:00:01.120] [3120] [INFO] [llm_daemon.cpp:300] Start endpoint
[2025-11-20 10:00:41.233] [3188] [ERROR] [model_runner.py:412] NotImplementedError: prefix cache is not supported for model type qwen3_moe
Failed to init endpoint! Please check the service log or console output.
Daemon is killing, please wait about 5 seconds...
""",
    "kv-cache-insufficient": """\
[2025-11-20 10:01:12.002] [3190] [ERROR] Warmup failed. This could be caused by setting both `max_prefill_tokens` and `max_input_length` to very large values, or setting insufficient `npu_mem`. Required block number: 320. Left block number: 128.
""",
    "npu-oom": """\
RuntimeError: NPU out of memory. Tried to allocate 2.50 GiB (NPU 0; 60.96 GiB total capacity; 58.12 GiB already allocated)
[ERROR] Warmup failed due to NPU out of memory when `npuMemSize` set to -1.
""",
    "hccl-error": """\
[ERROR] HCCL(3190,python):2025-11-20-10:02:03.123.456 [hccl_communicator_host.cc:212][3190]HcclCommInitRootInfo failed, get socket timeout
""",
    "address-in-use": """\
[2025-11-20 10:00:00.900] [3120] [ERROR] Management or Business or Metrics Http server listen port is occupied
Failed to init endpoint! Please check the service log or console output.
""",
    "config-invalid": """\
The value of maxPrefillTokens should not be less than maxInputTokenLen.
Failed to init endpoint! Please check the service log or console output.
""",
    "model-not-found": """\
[2025-11-20 10:00:00.500] [3120] [ERROR] Failed to open file: /data/weights/Qwen3-30B-A3B/config.json
""",
    "endpoint-init-failed": """\
Failed to init endpoint! Please check the service log or console output.
Daemon is killing, please wait about 5 seconds...
""",
}


@pytest.mark.parametrize("name", sorted(CRASHES))
def test_crash_causes_are_named_with_the_matching_line(pm, name):
    cause = pm.engine(ENGINE).classify_crash(1, CRASHES[name])
    assert cause.name == name
    assert cause.line and cause.line in CRASHES[name] and cause.hint and cause.source


def test_prefix_cache_info_lines_are_not_crashes(pm):
    assert perflab_mindie.plugin.classify_crash(None, "[INFO] prefix cache hit rate 0.42\n") is None


# --------------------------------------------------------------------------- hooks


def test_registration_and_other_engines_are_not_answered(pm):
    info = pm.engine(ENGINE).info
    assert (info.accelerators, info.executable, info.default_port) == (("ascend",), "mindieservice_daemon", 1025)
    # contract v2: the core calls this engine's own object, so no other engine's question reaches it
    assert pm.engine(ENGINE).engine.wrapped is perflab_mindie.plugin


def test_entry_point_module_is_import_light():
    code = "import sys, perflab_mindie; print(sorted(m for m in ('torch', 'yaml', 'perflab_mindie.config_json') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60).stdout
    assert out.strip() == "[]"


# --------------------------------------------------------------------------- conformance kit

from perflab.testing import EngineConformance  # noqa: E402


class TestMindieConformance(EngineConformance):
    engine = ENGINE
    distribution = "perflab-plugin-mindie"
    model = "Qwen/Qwen3-8B"
    sim_hardware = "910b3-x1"  # full launch/ready/teardown cycle on perflab's simulator
    configs = [{"max_model_len": 4096}, {"tp": 2}, {"prefix_caching": True}, {"dp": 2}]
    unsupported_configs = [{"kv_cache_dtype": "fp8"}, {"prefix_caching": True, "dp": 2}, {"served_model_name": "a/b"}]
    crash_samples = CRASHES
    serve_option_samples = {
        "ep": {"tp": 2, "ep": 2},  # moe_ep divides worldSize
        "prefix_caching": {"prefix_caching": True},  # off in the template
        "chunked_prefill": {"chunked_prefill": True},
        "speculative_config": {"speculative_config": {"method": "mtp", "num_speculative_tokens": 1}},  # MTP only
        "extra_args": {"extra_args": ("BackendConfig.ScheduleConfig.maxQueueDelayMicroseconds=2000",)},
        "options": {"options": {"daemon": "/opt/mindie/bin/mindieservice_daemon"}},
    }


# --------------------------------------------------------------------------- context (seed 000)


def _sim_npus(n: int) -> HardwareSnapshot:
    return HardwareSnapshot(accelerators=npus(n).accelerators, simulated=True, name="910b3-x8")


def test_without_max_model_len_the_models_context_is_used_like_gpustack(pm):
    """Seed 000 failed 100 % of its 4000- and 32000-token prompts on MindIE's template
    (maxSeqLen 2560, maxInputTokenLen 2048); with the model's context known (the simulator's
    registry here, config.json of the weights on a real host), the plugin sets it as GPUStack's
    MindIE backend does (ascend_mindie.py: max_seq_len from the model, max_input_token_len,
    max_prefill_tokens and max_iter_times from max_seq_len)."""
    spec = build(pm, ServeConfig(model="Qwen/Qwen3-30B-A3B", tp=2), _sim_npus(8))
    doc = document(spec)
    deploy, schedule = doc["BackendConfig"]["ModelDeployConfig"], doc["BackendConfig"]["ScheduleConfig"]
    assert (deploy["maxSeqLen"], deploy["maxInputTokenLen"], schedule["maxIterTimes"]) == (40960, 40960, 40960)
    assert schedule["maxPrefillTokens"] >= deploy["maxInputTokenLen"]  # MindIE's own rule
    assert 32000 + 100 <= deploy["maxSeqLen"] and 32000 <= deploy["maxInputTokenLen"]
    assert not any("max_model_len not set" in w for w in spec.warnings)


def test_a_prefill_budget_caps_the_derived_input_length(pm):
    doc = document(build(pm, ServeConfig(model="Qwen/Qwen3-30B-A3B", max_batched_tokens=8192), _sim_npus(1)))
    deploy, schedule = doc["BackendConfig"]["ModelDeployConfig"], doc["BackendConfig"]["ScheduleConfig"]
    assert (deploy["maxSeqLen"], deploy["maxInputTokenLen"], schedule["maxPrefillTokens"]) == (40960, 8192, 8192)


def test_model_context_from_the_weights_config_json(pm, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 32768}))
    deploy = document(build(pm, ServeConfig(model=str(tmp_path))))["BackendConfig"]["ModelDeployConfig"]
    assert (deploy["maxSeqLen"], deploy["maxInputTokenLen"]) == (32768, 32768)


def test_serving_script_lists_the_keys_perflab_set_not_a_study_path(pm, tmp_path):
    from perflab.lab.run.executor import plugin_file_describer, serving_script

    run_dir = tmp_path / "study" / "runs" / "001-mindie"
    spec = pm.engine(ENGINE).build_launch(ServeConfig(model="Qwen/Qwen3-30B-A3B", tp=2, port=1025), _sim_npus(8),
                                run_dir, "2.1.RC1")
    script = serving_script([spec], plugin_file_describer(pm, ENGINE), run_dir)
    assert str(tmp_path) not in script
    assert 'export MIES_CONFIG_JSON_PATH="$PWD/config.json"' in script
    assert "#   BackendConfig.ModelDeployConfig.maxSeqLen = 40960" in script
    assert "#   BackendConfig.ModelDeployConfig.ModelConfig.0.tp = 2" in script
    assert "ServerConfig.port" not in script  # perflab's chosen address, left out like --port
    assert "maxBatchSize" not in script  # unchanged template keys are not listed


def test_only_the_seeds_mindie_is_mapped_and_another_release_is_said(pm):
    """No config.json reference of another MindIE release could be read: 2.1.RC1 only, and the
    version a command is built for says when it is another."""
    versions = pm.engine("mindie").engine.engine_versions
    assert (versions.oldest, versions.newest) == ("2.1.RC1", "2.1.RC1")
    assert pm.engine("mindie").choose_version({}, "2.1.RC1").warning is None
    warning = pm.engine("mindie").choose_version({}, "2.2.RC1").warning
    assert warning == ("MindIE 2.2.RC1 is newer than the newest version perflab maps (2.1.RC1 .. 2.1.RC1); "
                       "its command lines are built with MindIE 2.1.RC1's options")
