"""The simulator's typed seams: EngineBehaviour from JSON, the wire format's request parsing,
the engine tables loaded from sim/data."""

from __future__ import annotations

import pytest

from perflab_sim import metrics
from perflab_sim.config import EngineBehaviour
from perflab_sim.frontends import sglang_args, vllm_args
from perflab_sim.wire import CompletionRequest, parse_request


def test_behaviour_from_json_types_ports_and_lines() -> None:
    b = EngineBehaviour.from_json({
        "health_paths_by_port": {"1026": ["/health"]}, "port_hosts": {"1026": "127.0.0.2"},
        "bind_error_lines": ["busy {port}"], "fail_signal": 9,
    })
    assert b.health_paths_by_port == {1026: ("/health",)}
    assert b.port_hosts == {1026: "127.0.0.2"}
    assert b.bind_error_lines == ("busy {port}",) and b.fail_signal == 9
    assert b.eos_mean_tokens == 16384.0 and b.bind_before_load is False


def test_behaviour_from_json_names_an_unknown_key() -> None:
    with pytest.raises(ValueError, match="unknown engine behaviour bind_befor_load"):
        EngineBehaviour.from_json({"bind_befor_load": True})


def test_parse_request_chat_and_completion() -> None:
    chat = parse_request({"messages": [{"role": "user", "content": "a b c"}], "max_tokens": 5, "ignore_eos": True,
                          "stream": True, "stream_options": {"include_usage": True}}, True, 4096, 100.0)
    assert isinstance(chat, CompletionRequest)
    assert (chat.chat, chat.max_tokens, chat.stop_at, chat.stream, chat.include_usage) == (True, 5, 5, True, True)
    completion = parse_request({"prompt": "one two three"}, False, 4096, 16384.0)
    assert isinstance(completion, CompletionRequest)
    assert completion.max_tokens == 16  # vLLM's CompletionRequest default
    assert 1 <= completion.stop_at <= 16


def test_parse_request_errors_are_vllms_messages() -> None:
    assert parse_request({}, True, 4096, 1.0) == "'messages' is required"
    assert parse_request({}, False, 4096, 1.0) == "'prompt' is required"
    too_long = parse_request({"prompt": "w " * 50, "max_tokens": 60}, False, 100, 1.0)
    assert isinstance(too_long, str) and too_long.startswith("'max_tokens' or 'max_completion_tokens' is too large: 60.")


def test_engine_tables_load_from_data() -> None:
    assert list(vllm_args.TABLES) == ["0.9.1", "0.11.0", "0.17.1"]
    options = {row[0][0] for row in vllm_args.TABLES["0.17.1"]}
    assert "--performance-mode" in options and "--task" not in options  # 0.17.1's own and removed rows
    assert "--num-scheduler-steps" in {row[0][0] for row in vllm_args.TABLES["0.9.1"]}
    assert sglang_args.V0_5_5[0] == (("--model-path", "--model"), {"type": "str", "required": True})
    labels, families = metrics.FAMILIES["vllm"]
    assert labels == ("engine", "model_name")
    assert [f.name for f in families][:2] == ["vllm:num_requests_running", "vllm:num_requests_waiting"]
