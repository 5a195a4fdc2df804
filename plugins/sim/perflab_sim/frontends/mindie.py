"""The simulated ``mindieservice_daemon`` (MindIE 2.1.RC1 service).

MindIE takes no serving flags: it reads a JSON file. Sources (Ascend/MindIE-LLM, HEAD 8b4871ad,
the repository tests/fixtures/mindie/config.json comes from):

- src/server/daemon/llm_daemon.cpp: command-line keys ``--config-file`` and
  ``--expert-parallel`` only (anything else: ``Unrecognized command-line argument, expect
  [...]``, exit 255); prints ``g_mainPid = N`` (stderr); on success
  ``Daemon start success!`` (stdout); on failure ``Failed to init endpoint! Please check the
  service log or console output.`` then ``killpg(getpgrp(), SIGKILL)``; a dying child makes it
  kill its process group and ``abort()``.
- src/utils/common_util.cpp ``GetConfigPath``: ``--config-file``, else
  ``MIES_CONFIG_JSON_PATH``, else ``<home>/conf/config.json`` (home: ``MINDIE_LLM_HOME_PATH``
  or the binary's ``..``; MindIE 2.1 images set ``MIES_INSTALL_PATH``); the file must resolve
  (``The path X realpath parsing failed.``), belong to the current user and have permissions
  no wider than 640 (src/utils/log/file_utils.cpp ``IsFileValid``/``ConstrainPermission``).
- src/config_manager/param_checker.cpp ``ReadJsonFile`` (``Json file is invalid. Please check
  json format! ``), ``CheckJsonParamType`` (``[ParamChecker::CheckJsonParamType] X: missing
  compulsory field``, ``The type of param X should be T, but got U``) with the key tables of
  server_config.cpp, backend_config.cpp, schedule_config.cpp and model_deploy_config.cpp
  reproduced in perflab_sim/data/mindie_params.json; config_manager_impl.cpp wraps them in
  ``ConfigManager init exception: Failed to initialize ServerConfig from JSON.`` (etc.).
- src/server/endpoint/http_wrapper/http_handler.cpp: business port (``ipAddress:port``):
  ``/v1/models``, ``/v1/completions``, ``/v1/chat/completions``, ``/generate``, ...;
  management port: ``/health``, ``/v2/health/live``, ``/v2/health/ready``,
  ``/health/timed-N``, ``/info``; metrics port: ``/metrics``. One server when
  ip/port/managementPort/metricsPort coincide (http_server.cpp). Busy ports:
  ``Management or Business or Metrics Http server listen port is occupied``.
- docs/zh/user_guide/feature/prefix_cache.md: prefix caching is
  ``"plugin_params": "{\\"plugin_type\\":\\"prefix_cache\\"}"`` in ModelConfig
  (``ScheduleConfig.enablePrefixCache`` is the deprecated spelling). Seed 000: with MindIE
  2.1.RC1 on Qwen3-30B-A3B (MoE) it crashes, "Crash, not supported for the model"; MindIE's
  own message for it is not in the stored sources, so the simulator says so plainly.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from perflab_sim.config import EngineBehaviour, SimEngineConfig
from perflab_sim.frontends import common
from perflab_sim.frontends.common import EngineExit, SimMachine

DEFAULT_VERSION = "2.1.RC1"  # seed 000
COMMAND_ARGS = {"--config-file": "configFilePath", "--expert-parallel": "expertParallel"}
FILE_MODE_640 = 0o640

# { name: (type, compulsory) } — the ParamSpec tables of src/config_manager/*.cpp, as data in
# perflab_sim/data/mindie_params.json
_PARAMS: dict[str, dict[str, tuple[str, bool]]] = {
    table: {name: (kind, bool(compulsory)) for name, (kind, compulsory) in rows.items()}
    for table, rows in json.loads(resources.files("perflab_sim").joinpath("data/mindie_params.json").read_text()).items()
}
SERVER_PARAMS = _PARAMS["SERVER_PARAMS"]
BACKEND_PARAMS = _PARAMS["BACKEND_PARAMS"]
SCHEDULE_PARAMS = _PARAMS["SCHEDULE_PARAMS"]
MODEL_PARENT_PARAMS = _PARAMS["MODEL_PARENT_PARAMS"]
MODEL_PARAMS = _PARAMS["MODEL_PARAMS"]
MODEL_INSTANCE_TYPES = ("AssistantModel", "Standard", "StandardMock", "TargetModel")
PLUGIN_TYPES = ("la", "memory_decoding", "prefix_cache", "mtp", "splitfuse")  # plugin_utils.py rules


class _ConfigFailure(Exception):
    def __init__(self, lines: Sequence[str]) -> None:
        self.lines = list(lines)
        super().__init__("; ".join(lines))


def _json_type(v: Any) -> str:
    """nlohmann::json::type_name()."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, (int, float)):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "array"
    return "object"


_RANGES = {"int32_t": (-(2**31), 2**31 - 1), "uint32_t": (0, 2**32 - 1), "size_t": (0, 2**64 - 1)}


def check_params(data: Mapping[str, Any], specs: Mapping[str, tuple[str, bool]]) -> None:
    """``ParamChecker::CheckJsonParamType``: the first problem, with MindIE's wording."""
    for name, (typ, compulsory) in specs.items():
        if name not in data:
            if compulsory:
                raise _ConfigFailure([f"[ParamChecker::CheckJsonParamType] {name}: missing compulsory field"])
            continue
        value = data[name]
        if typ == "string" and not isinstance(value, str):
            raise _ConfigFailure([f"The type of param {name} should be string, but got {_json_type(value)}"])
        if typ in _RANGES:
            if isinstance(value, bool) or not isinstance(value, int):
                raise _ConfigFailure([f"The type of param {name} should be {typ}, but got {_json_type(value)}"])
            lo, hi = _RANGES[typ]
            if not lo <= value <= hi:
                raise _ConfigFailure([f"The value of param {name} for {typ} is invalid."])
        if typ == "array" and not isinstance(value, list):
            raise _ConfigFailure([f"The type of param {name} should be array, but is {_json_type(value)}"])
        if typ == "bool" and not isinstance(value, bool):
            raise _ConfigFailure([f"The type of param {name} should be bool, but got {_json_type(value)}"])
        if typ == "object" and not isinstance(value, dict):
            raise _ConfigFailure([f"The type of param {name} should be object, but got {_json_type(value)}"])


def config_path(args: Mapping[str, str], env: Mapping[str, str]) -> tuple[str, str]:
    """(path, base directory) where MindIE looks for its config.json."""
    if args.get("configFilePath"):
        return args["configFilePath"], "/"
    if env.get("MIES_CONFIG_JSON_PATH"):
        return env["MIES_CONFIG_JSON_PATH"], "/"
    home = env.get("MINDIE_LLM_HOME_PATH") or env.get("MIES_INSTALL_PATH")
    if not home:
        import sys

        home = str(Path(sys.argv[0]).resolve().parent.parent)
    return str(Path(home) / "conf" / "config.json"), home


def read_config(path: str, base: str, env: Mapping[str, str]) -> dict[str, Any]:
    """``FileUtils::RegularFilePath`` + ``IsFileValid`` + ``ParamChecker::ReadJsonFile``."""
    p = Path(path)
    try:
        real = p.resolve(strict=True)
    except (OSError, RuntimeError):
        raise _ConfigFailure([f"The path {path} realpath parsing failed.", "ConfigManager: Get config path failed."]) from None
    if base != "/" and not str(real).startswith(str(Path(base).resolve()) + "/"):
        raise _ConfigFailure([f"The file {path} is invalid, it's not in baseDir {base} directory."])
    if not real.is_file():
        raise _ConfigFailure([f"The input file: {real.name} is not a regular file or not exists"])
    st = real.stat()
    problem = None
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        problem = f"owner id diff: current process user id is {os.getuid()}, file owner id is {st.st_uid}"
    else:
        names = ["Other group permission", "Owner group permission", "Owner permission"]
        mode = stat.S_IMODE(st.st_mode)
        for i in (3, 2, 1):
            shift = (i - 1) * 3
            cur, allowed = (mode >> shift) & 7, (FILE_MODE_640 >> shift) & 7
            if (cur | allowed) != allowed:
                problem = (
                    f" Check {names[i - 1]} failed: {real} current permission is {cur}, but required no greater than "
                    f"{allowed}. Required permisssion is {FILE_MODE_640:o}, but got permission is {mode:o}"
                )
                break
    if problem is not None:
        lines = [f"Check path: {real.name} failed, by:{problem}"]
        if env.get("MINDIE_CHECK_INPUTFILES_PERMISSION") == "0":
            lines.insert(0, f"[ERROR] {lines[0]}; Please set: chmod 750 {real.name}")
        raise _ConfigFailure(lines + ["ConfigManager: Get config path failed."])
    try:
        data = json.loads(real.read_text())
    except (ValueError, UnicodeDecodeError):
        raise _ConfigFailure(
            ["Json file is invalid. Please check json format! ", "ConfigManager init exception: Failed to initialize ServerConfig from JSON."]
        ) from None
    if not isinstance(data, dict):
        raise _ConfigFailure(["ServerConfig: [json.exception.type_error.304] cannot use at() with " + _json_type(data)])
    return data


def _section(data: Mapping[str, Any], name: str) -> dict[str, Any]:
    if name not in data:
        raise _ConfigFailure([f"{name}: [json.exception.out_of_range.403] key '{name}' not found"])
    value = data[name]
    if not isinstance(value, dict):
        raise _ConfigFailure([f"{name}: [json.exception.type_error.304] cannot use at() with {_json_type(value)}"])
    return value


def validate(data: Mapping[str, Any]) -> dict[str, Any]:
    """The config manager's checks, in its order; returns the sections it reads."""

    def wrap(section: str, fn: Any) -> Any:
        try:
            return fn()
        except _ConfigFailure as exc:
            raise _ConfigFailure(exc.lines + [f"ConfigManager init exception: Failed to initialize {section} from JSON."]) from None

    server = wrap("ServerConfig", lambda: _section(data, "ServerConfig"))
    wrap("ServerConfig", lambda: check_params(server, SERVER_PARAMS))
    if server["inferMode"] not in ("standard", "dmi"):
        raise _ConfigFailure(["The inferMode should be standard or dmi", "ConfigManager init exception: Failed to initialize ServerConfig from JSON."])
    backend = wrap("BackendConfig", lambda: _section(data, "BackendConfig"))
    wrap("BackendConfig", lambda: check_params(backend, BACKEND_PARAMS))
    deploy = wrap("BackendConfig", lambda: _section(backend, "ModelDeployConfig"))
    models = deploy.get("ModelConfig")
    if not isinstance(models, list) or not models or not isinstance(models[0], dict):
        raise _ConfigFailure(["The type of ModelConfig should be array.", "ConfigManager init exception: Failed to initialize BackendConfig from JSON."])
    npu_ids = backend["npuDeviceIds"]
    for group in npu_ids:
        if not isinstance(group, list) or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in group):
            raise _ConfigFailure(["npu_ids in json is invalid. Please check it!", "ConfigManager init exception: Failed to initialize BackendConfig from JSON."])
    if len(npu_ids) != backend["modelInstanceNumber"]:
        raise _ConfigFailure(["The size of npuDeviceIds does not equal to modelInstanceNumber", "ConfigManager init exception: Failed to initialize BackendConfig from JSON."])
    for group in npu_ids:
        if len(group) != models[0].get("worldSize"):
            raise _ConfigFailure(["The size of npuDeviceIds (subset) does not equal to worldSize", "ConfigManager init exception: Failed to initialize BackendConfig from JSON."])
        if len(set(group)) != len(group):
            raise _ConfigFailure(["npuDeviceID does not allow repetitive element", "ConfigManager init exception: Failed to initialize BackendConfig from JSON."])
    schedule = wrap("ScheduleConfig", lambda: _section(backend, "ScheduleConfig"))
    wrap("ScheduleConfig", lambda: check_params(schedule, SCHEDULE_PARAMS))
    if schedule["templateType"] not in ("Standard", "Mix"):
        raise _ConfigFailure([f"The templateType must be Standard or Mix, but is {schedule['templateType']}", "ConfigManager init exception: Failed to initialize ScheduleConfig from JSON."])
    wrap("ModelDeployConfig", lambda: check_params(deploy, MODEL_PARENT_PARAMS))
    for model in models:
        wrap("ModelDeployConfig", lambda m=model: check_params(m, MODEL_PARAMS))
        if model.get("modelInstanceType", "Standard") not in MODEL_INSTANCE_TYPES:
            raise _ConfigFailure(
                [f"Model instance type is invalid. supported values: [{','.join(MODEL_INSTANCE_TYPES)}]", "ConfigManager init exception: Failed to initialize ModelDeployConfig from JSON."]
            )
        if model["backendType"] not in ("atb", "ms", "torch"):
            raise _ConfigFailure(["Backend type only supports atb, ms, torch.", "ConfigManager init exception: Failed to initialize ModelDeployConfig from JSON."])
        if model["worldSize"] == 0:
            raise _ConfigFailure(["The value of modelParam.worldSize can not be 0.", "ConfigManager init exception: Failed to initialize ModelDeployConfig from JSON."])
        npu_mem = model["npuMemSize"]
        if npu_mem == 0 or npu_mem <= -2:
            raise _ConfigFailure(
                [
                    f"The value of 'npuMemSize' in ModelDeployConfig in config.json is {npu_mem} it should be within (0, 4294967295] or -1"
                    "please set 'npuMemSize' in config.json within (0, 4294967295] or -1",
                    "ConfigManager init exception: Failed to initialize ModelDeployConfig from JSON.",
                ]
            )
    if schedule["templateType"] == "Standard" and len(models) != 1:
        raise _ConfigFailure(["There should be one modelParam for Standard templateType.", "ConfigManager init exception: Failed to initialize ModelDeployConfig from JSON."])
    if deploy["maxSeqLen"] == 0:
        raise _ConfigFailure(["The value of modelParam.maxSeqLen can not be 0.", "ConfigManager init exception: Failed to initialize ModelDeployConfig from JSON."])
    if not 1 <= deploy["maxInputTokenLen"] <= 4 * 1024 * 1024:
        raise _ConfigFailure(["The value of modelParam.maxInputTokenLen should be in [1, 4194304].", "ConfigManager init exception: Failed to initialize ModelDeployConfig from JSON."])
    return {"server": server, "backend": backend, "deploy": deploy, "model": models[0], "schedule": schedule}


def plugin_types(model: Mapping[str, Any]) -> list[str]:
    """The ``plugin_type`` list of ``plugin_params`` (a JSON string, or an object)."""
    raw = model.get("plugin_params")
    if raw in (None, ""):
        return []
    data = raw if isinstance(raw, dict) else json.loads(raw)
    value = str(data.get("plugin_type") or "")
    return [t.strip() for t in value.split(",") if t.strip()]


class MindieLog:
    def __init__(self) -> None:
        self.pid = common.pid()

    @staticmethod
    def line(message: str) -> str:
        return f"[{common.now().strftime('%Y-%m-%d %H:%M:%S.%f')}] {message}"


def _fatal(lines: Sequence[str], log: MindieLog, config_path_: str | None) -> EngineExit:
    out = []
    if config_path_:
        out.append(f"ConfigManager: Load Config from {config_path_}.")
    out += list(lines)
    out.append(log.line("[ERROR] Failed to init infer model instance"))
    out.append(log.line("[ERROR] Failed to init endpoint! Please check the service log or console output."))
    # killpg(getpgrp(), SIGKILL): the daemon dies by SIGKILL
    return EngineExit(137, stdout="\n".join(out) + "\n", stderr=f"g_mainPid = {log.pid}\n", signal=9)


def installed_version(machine: SimMachine, env: Mapping[str, str]) -> str:
    """``$MIES_INSTALL_PATH/version.info``'s ``Ascend-mindie`` (what activate wrote), else the
    machine's default version."""
    install = env.get("MIES_INSTALL_PATH")
    if install:
        for path in (Path(install) / "version.info", Path(install).parent / "version.info"):
            try:
                text = path.read_text()
            except OSError:
                continue
            for line in text.splitlines():
                key, sep, value = line.partition(":")
                if sep and key.strip().lower() == "ascend-mindie":
                    value = value.strip()
                    return value[len("MindIE "):].strip() if value.startswith("MindIE ") else value
    return common.engine_version("mindie", machine, env, DEFAULT_VERSION)


def parse(argv: Sequence[str], env: Mapping[str, str] | None = None) -> SimEngineConfig:
    """``mindieservice_daemon ARGV`` (and its config.json) on the simulated machine."""
    env = dict(env or {})
    log = MindieLog()
    args: dict[str, str] = {}
    i = 0
    argv = list(argv)
    while i < len(argv):
        key = argv[i]
        if key not in COMMAND_ARGS:
            expect = ", ".join(COMMAND_ARGS)
            raise EngineExit(
                255,
                stderr=f"g_mainPid = {log.pid}\n" + log.line(f"[ERROR] Unrecognized command-line argument, expect [{expect}]") + "\n",
            )
        if i + 1 >= len(argv):
            raise EngineExit(255, stderr=f"g_mainPid = {log.pid}\n" + log.line(f"[ERROR] Missing value for key: {key}") + "\n")
        args[COMMAND_ARGS[key]] = argv[i + 1]
        i += 2
    machine = common.sim_machine(env)
    if not machine.is_ascend:
        raise EngineExit(1, stderr=f"g_mainPid = {log.pid}\nperflab simulator: MindIE runs on Ascend NPUs; {machine.name} has none\n")
    version = installed_version(machine, env)
    path, base = config_path(args, env)
    try:
        data = read_config(path, base, env)
        sections = validate(data)
    except _ConfigFailure as exc:
        raise _fatal(exc.lines, log, None) from None
    return _configure(sections, machine, version, log, path, args)


def _configure(s: dict[str, Any], machine: SimMachine, version: str, log: MindieLog, path: str, args: Mapping[str, str]) -> SimEngineConfig:
    server, backend, deploy, model, schedule = s["server"], s["backend"], s["deploy"], s["model"], s["schedule"]
    name = model["modelName"]
    try:
        types = plugin_types(model)
    except (ValueError, AttributeError):
        raise _fatal(["The 'plugin_params' field does not conform to JSON format. Please check."], log, path) from None
    for t in types:
        if t not in PLUGIN_TYPES:
            raise _fatal(
                [f"NotImplementedError: Unsupported plugin type: {t}, Only 'la', 'memory_decoding', 'prefix_cache', 'mtp' and 'splitfuse' are supported."],
                log,
                path,
            )
    startup = [f"ConfigManager: Load Config from {path}.", "[ConfigManager::InitConfigManager] Successfully init config manager"]
    if version != DEFAULT_VERSION:
        startup.insert(0, log.line(f"[WARN] perflab simulator: MindIE {version} is simulated as MindIE {DEFAULT_VERSION}, "
                                   "the only release the simulator knows"))
    spec = None
    for candidate in (name, model["modelWeightPath"]):
        try:
            spec = common.lookup_model(candidate)
            break
        except common.unknown_model_error():
            continue
    if spec is None:
        weights = model["modelWeightPath"].rstrip("/")
        raise _fatal([f"Failed to load json file: {weights}/config.json, error: file not exists or invalid"], log, path)

    world = int(model["worldSize"])
    instances = int(backend["modelInstanceNumber"])
    groups = [list(g) for g in backend["npuDeviceIds"]]
    devices = [d for g in groups for d in g]
    prefix = "prefix_cache" in types or bool(schedule.get("enablePrefixCache", False))
    spec_method = "mtp" if "mtp" in types else None
    spec_tokens = 0
    if spec_method:
        raw = model.get("plugin_params")
        data = raw if isinstance(raw, dict) else json.loads(raw)
        spec_tokens = int(data.get("num_speculative_tokens", 1))
    chunked = "splitfuse" in types or bool(schedule.get("enableSplit") or schedule.get("enablChunkedPrefill"))

    fail: list[str] = []
    fail_after = 2.0
    fail_code, fail_signal = 137, 9
    visible = machine.visible
    bad = [d for d in devices if d >= len(visible)]
    if bad:
        lines = [
            log.line(
                "[ERROR] RuntimeError: Initialize:build/CMakeFiles/torch_npu.dir/compiler_depend.ts:217 NPU function error: "
                f"c10_npu::SetDevice(device_index), error code is 107001 (npuDeviceIds {bad}, {len(visible)} NPUs visible)"
            ),
            log.line("[WARN] Successfully handled SIGCHLD, now killing process group"),
            "Daemon is killing, please wait about 5 seconds...",
        ]
        raise EngineExit(134, stdout="\n".join(startup) + "\n", stderr="\n".join(lines) + "\n", signal=6, delay_s=1.0)
    if prefix and spec.is_moe:
        fail = [
            log.line(
                f"[ERROR] [perflab-sim] MindIE {version}: the prefix_cache plugin is not supported for "
                f"{common.architecture(spec)} (seed 000: 'Crash, not supported for the model'); the backend process exits"
            ),
            log.line("[WARN] Process exited normally with status 1"),
            log.line("[WARN] Successfully handled SIGCHLD, now killing process group"),
            "Daemon is killing, please wait about 5 seconds...",
        ]
        fail_code, fail_signal, fail_after = 134, 6, 5.0  # KillProcessGroup() ends in abort()
    host = server["ipAddress"]
    mgmt_host = server.get("managementIpAddress", host)
    port = int(server["port"])
    mgmt_port = int(server.get("managementPort", port))
    metrics_port = int(server["metricsPort"])
    https = bool(server["httpsEnabled"])
    if https and not fail:
        fail = [
            log.line("[ERROR] [perflab-sim] httpsEnabled is true: the simulator serves plain HTTP only; set httpsEnabled false"),
            log.line("[ERROR] Failed to init endpoint! Please check the service log or console output."),
        ]
        fail_after = 0.5
    management = ("/health", "/v2/health/live", "/v2/health/ready", "/health/timed", "/info", "/v1/status", "/v2/status")
    by_port: dict[int, tuple[str, ...]] = {}
    same_all = host == mgmt_host and port == mgmt_port == metrics_port
    # The business port has no health endpoint of its own (its /v1/models is the OpenAI
    # route the runtime serves); health lives on the management port.
    health: tuple[str, ...]
    if same_all:
        health = management + ("/metrics",)
    else:
        health = ()
        by_port[mgmt_port] = management + (("/metrics",) if mgmt_port == metrics_port else ())
        if metrics_port != mgmt_port:
            by_port[metrics_port] = ("/metrics",)
    extra_ports = tuple(p for p in dict.fromkeys((mgmt_port, metrics_port)) if p != port)
    factors = common.efficiency("mindie", machine, spec.is_moe)
    fields: dict[str, Any] = dict(
        engine="mindie", engine_version=version, model=name, served_model_names=(name,),
        host=host, port=port,
        extra_ports=extra_ports,
        tp=world, pp=1, dp=instances, ep=world if args.get("expertParallel") == "true" else 1,
        max_model_len=int(deploy["maxSeqLen"]), max_num_seqs=int(schedule["maxBatchSize"]), max_batched_tokens=int(schedule["maxPrefillTokens"]),
        quantization=spec.quant, kv_cache_dtype="auto",
        prefix_caching=prefix, chunked_prefill=chunked,
        spec_method=spec_method, spec_tokens=spec_tokens,
        mem_fraction=0.9 if int(model["npuMemSize"]) == -1 else min(0.95, int(model["npuMemSize"]) * 1024 / machine.memory_mib),
        devices=tuple(visible[d] for d in devices if d < len(visible)),
        health_paths=health,
        ready_lines=("Daemon start success!",),
        startup_lines=tuple(startup),
        workers=world * instances,
        worker_title="mindie_llm_backend_connector",
        fail_lines=tuple(fail), fail_exit_code=fail_code, fail_after_s=fail_after,
        block_size=int(schedule["cacheBlockSize"]),
        behaviour=EngineBehaviour(
            bind_before_load=False,
            fail_signal=fail_signal,
            health_paths_by_port=by_port,
            # management and metrics listen on managementIpAddress (the business port on ipAddress)
            port_hosts={p: mgmt_host for p in extra_ports},
            bind_error_lines=(
                log.line("[ERROR] Management or Business or Metrics Http server listen port is occupied"),
                log.line("[ERROR] Failed to init endpoint! Please check the service log or console output."),
            ),
            bind_error_signal=9,  # a failed endpoint ends in killpg(getpgrp(), SIGKILL)
            settings={"plugin_types": types, "max_input_token_len": int(deploy["maxInputTokenLen"]),
                      "max_prefill_batch_size": int(schedule["maxPrefillBatchSize"])},
        ),
    )
    return SimEngineConfig(**common.apply_factors(fields, factors))


def main(argv: Sequence[str] | None = None) -> int:
    return common.run_main(parse, argv)
