"""Crash causes name the root line: real vLLM 0.32.0 fault logs, signals, whole-output scans.

The logs under tests/fixtures/real/vllm-0.32.0-cpu/faults/ were captured from a real vLLM CPU
build (see their README); faults.json says what each one must be named and which line is
its root cause.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from perflab.contract import crashes
from perflab.lifecycle.output import OutputPump
from perflab.plugins import load

FAULTS = Path(__file__).parent / "fixtures" / "real" / "vllm-0.32.0-cpu" / "faults"
CASES = {k: v for k, v in json.loads((FAULTS / "faults.json").read_text()).items() if not k.startswith("_")}
ULIMIT = "Found ulimit of"


@pytest.fixture(scope="module")
def pm():  # type: ignore[no-untyped-def]
    return load()


def test_every_captured_log_has_an_expectation() -> None:
    assert {p.stem for p in FAULTS.glob("*.log")} == set(CASES)


@pytest.mark.parametrize("case", sorted(CASES))
def test_real_vllm_fault_is_named_from_its_root_line(pm, case: str) -> None:  # type: ignore[no-untyped-def]
    spec = CASES[case]
    log = (FAULTS / f"{case}.log").read_text()
    cause = pm.engine("vllm").classify_crash(spec["exit_code"], log)
    assert cause.name == spec["cause"], cause
    if spec["root"] is None:
        assert cause.line is None or ULIMIT not in cause.line, cause
    else:
        assert cause.line is not None and spec["root"] in cause.line, cause
        assert cause.line in log  # quoted, not made up
    assert ULIMIT not in (cause.line or "")  # the warning vLLM prints at every start
    assert " INFO " not in (cause.line or "")
    assert "CancelledError" not in (cause.line or "") and "KeyboardInterrupt" not in (cause.line or "")
    assert "root cause is not in" not in cause.explanation
    assert cause.source


def test_signal_deaths_are_named_with_what_they_usually_mean() -> None:
    kill9 = crashes.fallback_cause(-signal.SIGKILL, (FAULTS / "apiserver-kill9.log").read_text())
    assert kill9.name == "killed-by-signal"
    assert "SIGKILL" in kill9.explanation and "OOM killer" in kill9.explanation
    assert kill9.line is None  # the ulimit warning is not a root cause
    segv = crashes.fallback_cause(-signal.SIGSEGV, "")
    assert segv.name == "killed-by-signal" and "SIGSEGV" in segv.explanation and "segmentation" in segv.explanation


def test_a_named_cause_notes_the_signal_it_died_of(pm) -> None:  # type: ignore[no-untyped-def]
    log = (FAULTS / "port-taken.log").read_text()
    cause = pm.engine("vllm").classify_crash(-signal.SIGKILL, log)
    assert cause.name == "address-in-use" and "killed by SIGKILL" in cause.explanation


def test_exit_code_zero_without_a_signature_is_still_a_crash_quoting_the_first_exception() -> None:
    log = "INFO starting\nTraceback (most recent call last):\nValueError: bad thing\n\nDuring handling of the above exception, another exception occurred:\nRuntimeError: wrapper\n"
    cause = crashes.fallback_cause(0, log)
    assert cause.name == "unknown" and "code 0" in cause.explanation
    assert cause.line == "ValueError: bad thing"


def test_cancellation_and_info_lines_are_never_the_root() -> None:
    log = (
        "(APIServer pid=1) INFO 11-24 07:10:45 [x.py:1] request failed: RuntimeError: not me\n"
        "asyncio.exceptions.CancelledError\n"
        "KeyboardInterrupt\n"
        "(EngineCore pid=2) ERROR 11-24 07:10:45 [core.py:9] torch.OutOfMemoryError: nope\n"
    )
    assert crashes.root_exception_line(log) == "(EngineCore pid=2) ERROR 11-24 07:10:45 [core.py:9] torch.OutOfMemoryError: nope"
    assert crashes.root_exception_line("asyncio.exceptions.CancelledError\nKeyboardInterrupt\n") is None
    assert crashes.fallback_cause(1, "asyncio.exceptions.CancelledError\n").line is None


def test_traceback_source_lines_do_not_match() -> None:
    log = (
        '  File "/x/configuration_utils.py", line 886, in _get_config_dict\n'
        "    raise OSError(f\"It looks like the config file at '{f}' is not a valid JSON file.\")\n"
    )
    sig = crashes.signature("x", r"is not a valid JSON file", "e", "h", "s")
    assert crashes.earliest_line(log, [sig]) is None
    assert crashes.earliest_line(log + "OSError: It looks like the config file at '/m' is not a valid JSON file.\n", [sig])


def test_the_whole_output_is_scanned_not_a_tail(pm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Under load the root cause is followed by thousands of request lines."""
    r, w = os.pipe()
    os.set_blocking(r, False)
    pump = OutputPump(r, tmp_path / "engine.log", tail_lines=50)
    try:
        lines = [
            "(APIServer pid=1) WARNING 11-24 07:09:08 [system_utils.py:255] Found ulimit of 20000 and failed to automatically increase with error current limit exceeds maximum limit. This can cause fd limit errors like `OSError: [Errno 24] Too many open files`.",
            "(EngineCore pid=2) ERROR 11-24 07:10:45 [core.py:9] RuntimeError: CUDA error: an illegal memory access was encountered",
            *[f'INFO:     127.0.0.1:{40000 + i} - "POST /v1/completions HTTP/1.1" 200 OK' for i in range(3000)],
            "(APIServer pid=1) ERROR 11-24 07:10:46 [async_llm.py:906] vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the root cause.",
        ]
        for i in range(0, len(lines), 200):
            os.write(w, ("\n".join(lines[i : i + 200]) + "\n").encode())
            pump.read_available()
        assert "illegal memory access" not in pump.tail_text()
        text = pump.scan_text()
        assert text.count("\n") < 100  # INFO lines are not kept beyond the tail
        cause = pm.engine("vllm").classify_crash(1, text)
        assert cause.name == "cuda-illegal-memory-access" and "illegal memory access" in (cause.line or "")
    finally:
        os.close(w)
        pump.close()


def test_scan_text_keeps_log_order_and_each_line_once(tmp_path: Path) -> None:
    r, w = os.pipe()
    os.set_blocking(r, False)
    pump = OutputPump(r, tmp_path / "engine.log", tail_lines=3)
    try:
        os.write(w, b"ERROR a\nINFO: b\nERROR c\nINFO: d\nERROR e\n")
        pump.read_available()
        assert pump.scan_text().splitlines() == ["ERROR a", "ERROR c", "INFO: d", "ERROR e"]
    finally:
        os.close(w)
        pump.close()


def test_llamacpp_random_bytes_gguf_is_named_from_the_magic_line() -> None:
    import importlib.util

    path = Path(__file__).parent / "external_plugins" / "llamacpp" / "perflab_llamacpp" / "__init__.py"
    spec = importlib.util.spec_from_file_location("perflab_llamacpp_src", path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    log = (
        "0.00.010.000 I llama_model_loader: loading model\n"
        "gguf_init_from_file_impl: invalid magic characters: '\\x8f\\x12?a', expected 'GGUF'\n"
        "llama_model_load: error loading model: llama_model_loader: failed to load model from /models/x.gguf\n"
        "srv    load_model: failed to load model, '/models/x.gguf'\n"
    )
    cause = mod.LlamaCpp().classify_crash(1, log)
    assert cause.name == "not-a-gguf-file" and "invalid magic characters" in cause.line


def test_llamacpp_ready_patterns_match_the_real_server_lines() -> None:
    """The real llama-server (0.6.0-dev) start-up; its ready line must wake the probes."""
    import importlib.util
    import re

    path = Path(__file__).parent / "external_plugins" / "llamacpp" / "perflab_llamacpp" / "__init__.py"
    spec = importlib.util.spec_from_file_location("perflab_llamacpp_src2", path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    from perflab.contract.types import LaunchSpec

    ready = mod.LlamaCpp().readiness(LaunchSpec(engine="llama-cpp", argv=("llama-server",), host="127.0.0.1", port=18080, served_model_name="m"))
    lines = (Path(__file__).parent / "fixtures" / "real" / "llama-server" / "startup.log").read_text().splitlines()
    matched = [ln for ln in lines if any(re.search(p, ln) for p in ready.ready_log_patterns)]
    assert matched and matched[0].endswith("llama_server: model loaded")


def test_a_vllm_worker_killed_by_a_signal_is_named_with_the_signal(pm) -> None:  # type: ignore[no-untyped-def]
    """The executor's monitor names a dead worker and its exit code (amx-sigill.log: ``None``,
    the death seen before the code; in another run of the same fault, ``-4``)."""
    log = (FAULTS / "amx-sigill.log").read_text()
    unknown = pm.engine("vllm").classify_crash(0, log)
    assert unknown.name == "worker-died" and "without an error of its own" in unknown.explanation
    sigill = pm.engine("vllm").classify_crash(0, log.replace("(exit code: None)", "(exit code: -4)"))
    assert sigill.name == "worker-died" and "SIGILL" in sigill.explanation and "AMX" in sigill.explanation
    assert "(exit code: -4)" in (sigill.line or "")
