"""The simulated vLLM serves what a real vLLM 0.32.0 serves: the test parses the captures in
tests/fixtures/real/ and the simulator's answers to the same requests, and compares their
*shapes* (kinds of chunks in order, keys of each kind in order, status lines, headers that
matter), so a drift on either side is caught. Values that differ by nature (ids, texts,
timestamps, hashes) are checked by pattern."""

from __future__ import annotations

import http.client
import json
import re
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from test_runtime import READY, engine, sim_env  # noqa: F401 - sim_env is a fixture

REAL = Path(__file__).resolve().parent.parent / "fixtures" / "real" / "vllm-0.32.0-cpu"
MODEL = "tiny"


def sim_vllm(env: dict[str, str], **cfg: object) -> Any:
    """The runtime configured as the vLLM front end configures it for 0.32.0."""
    return engine(env, engine="vllm", engine_version="0.32.0", served_model_names=[MODEL], **cfg)


# --------------------------------------------------------------------------- parsing


def parse_http(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    """(status, headers, body) of one HTTP/1.1 response; a chunked body is de-chunked."""
    head, _, rest = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    if headers.get("transfer-encoding") == "chunked":
        body = b""
        while rest:
            size_line, _, rest = rest.partition(b"\r\n")
            size = int(size_line, 16)
            if size == 0:
                break
            body, rest = body + rest[:size], rest[size + 2 :]
        return status, headers, body
    return status, headers, rest


def raw_request(port: int, method: str, path: str, body: dict[str, Any] | None = None) -> bytes:
    """One request, ``Connection: close``, everything the server sends back."""
    data = b"" if body is None else json.dumps(body).encode()
    head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n"
    if body is not None:
        head += f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(head.encode() + b"\r\n" + data)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return out


def sse_events(body: str) -> list[dict[str, Any]]:
    """The JSON events of an SSE body; asserts the ``data: `` framing and the final [DONE]."""
    blocks = [b for b in body.split("\n\n") if b.strip()]
    assert all(b.startswith("data: ") for b in blocks), blocks
    assert blocks[-1] == "data: [DONE]"
    return [json.loads(b[len("data: ") :]) for b in blocks[:-1]]


def chunk_kind(event: dict[str, Any]) -> str:
    if not event["choices"]:
        return "usage"
    choice = event["choices"][0]
    if "role" in choice.get("delta", {}):
        return "role"
    return "finish" if choice["finish_reason"] is not None else "token"


def stream_shape(events: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """Per chunk kind, in order (runs of token chunks collapsed to one): the kind, the
    top-level keys, the choice's keys, the delta's keys, the usage's keys, all in order."""
    out: list[tuple[Any, ...]] = []
    for ev in events:
        choice = ev["choices"][0] if ev["choices"] else {}
        shape = (
            chunk_kind(ev),
            tuple(ev),
            tuple(choice),
            tuple(choice.get("delta", {})),
            tuple(ev.get("usage") or ()),
        )
        if not out or out[-1] != shape:
            out.append(shape)
    return out


def key_tree(obj: Any) -> Any:
    """The keys of a JSON value, recursively and in order (lists by their first item)."""
    if isinstance(obj, dict):
        return [(k, key_tree(v)) for k, v in obj.items()]
    if isinstance(obj, list):
        return [key_tree(obj[0])] if obj else []
    return type(obj).__name__ if obj is None else "value"


def capture_body(name: str) -> str:
    path = REAL / name
    if name.endswith(".http"):
        return parse_http(path.read_bytes())[2].decode()
    return path.read_text()


# --------------------------------------------------------------------------- streams

CHAT = {"messages": [{"role": "user", "content": "Hello there"}]}
COMPLETION = {"prompt": "Hello world"}
USAGE = {"include_usage": True}
CONTINUOUS = {"include_usage": True, "continuous_usage_stats": True}

STREAMS = [
    # capture, endpoint, request fields, stream_options (None: none sent)
    ("chat_stream.txt", "/v1/chat/completions", CHAT, USAGE),
    ("chat_stream_continuous_usage.txt", "/v1/chat/completions", CHAT, CONTINUOUS),
    ("completions_stream.txt", "/v1/completions", COMPLETION, USAGE),
    ("completions_stream_continuous_usage.txt", "/v1/completions", COMPLETION, CONTINUOUS),
    ("http/chat_stream_no_usage.http", "/v1/chat/completions", CHAT, None),
    ("http/chat_stream_usage.http", "/v1/chat/completions", CHAT, USAGE),
    ("http/completions_stream_no_usage.http", "/v1/completions", COMPLETION, None),
    ("http/completions_stream_continuous_usage.http", "/v1/completions", COMPLETION, CONTINUOUS),
]


@pytest.fixture
def vllm032(sim_env: dict[str, str]) -> Iterator[Any]:  # noqa: F811
    with sim_vllm(sim_env, max_model_len=512) as e:
        assert e.read_until(READY)
        yield e


def test_streams_have_the_captured_shapes(vllm032: Any) -> None:
    for capture, path, fields, options in STREAMS:
        real = sse_events(capture_body(capture))
        body: dict[str, Any] = {"model": MODEL, "max_tokens": 4, "ignore_eos": True, "stream": True, **fields}
        if options is not None:
            body["stream_options"] = options
        r = httpx.post(vllm032.url + path, json=body, timeout=10)
        assert r.status_code == 200 and r.headers["content-type"] == "text/event-stream; charset=utf-8"
        sim = sse_events(r.text)
        assert stream_shape(sim) == stream_shape(real), capture
        prefix = "chatcmpl-" if "chat" in path else "cmpl-"
        for events in (real, sim):
            assert len({ev["id"] for ev in events}) == 1
            assert re.fullmatch(prefix + "[0-9a-f]{16}", events[0]["id"])
            fingerprints = [ev["system_fingerprint"] for ev in events if "system_fingerprint" in ev]
            assert len(fingerprints) == 1 and re.fullmatch(r"vllm-0\.32\.0-[0-9a-f]{8}", fingerprints[0])
        # usage counts what was streamed
        text = "".join(c.get("text", c.get("delta", {}).get("content", "")) for ev in sim for c in ev["choices"])
        if options is not None:
            assert sim[-1]["usage"]["completion_tokens"] == 4 == len(text.split())


def test_non_streamed_bodies_models_version_health_have_the_captured_shapes(vllm032: Any) -> None:
    port = vllm032.port
    for capture, path, fields in (
        ("http/completions.http", "/v1/completions", COMPLETION),
        ("http/chat.http", "/v1/chat/completions", CHAT),
    ):
        status, _, body = parse_http(REAL.joinpath(capture).read_bytes())
        s_status, s_headers, s_body = parse_http(raw_request(port, "POST", path, {"model": MODEL, "max_tokens": 4, **fields}))
        assert (s_status, s_headers["content-type"]) == (status, "application/json")
        assert key_tree(json.loads(s_body)) == key_tree(json.loads(body)), capture
        assert int(s_headers["content-length"]) == len(s_body)
    for capture, path in (("http/models.http", "/v1/models"), ("http/version.http", "/version")):
        status, _, body = parse_http(REAL.joinpath(capture).read_bytes())
        s_status, _, s_body = parse_http(raw_request(port, "GET", path))
        assert s_status == status and key_tree(json.loads(s_body)) == key_tree(json.loads(body)), capture
    assert json.loads(parse_http(raw_request(port, "GET", "/version"))[2]) == {"version": "0.32.0"}
    # /health: 200, empty, no content-type (uvicorn's empty Response; health.txt)
    real_head = (REAL / "health.txt").read_text()
    s_status, s_headers, s_body = parse_http(raw_request(port, "GET", "/health"))
    assert (s_status, s_body, s_headers["content-length"]) == (200, b"", "0")
    assert "content-type" not in s_headers and "content-type" not in real_head.lower()


# --------------------------------------------------------------------------- HEAD, 404, 405


@pytest.mark.parametrize(
    ("method", "path", "capture"),
    [
        ("HEAD", "/health", "head_health"),
        ("HEAD", "/v1/models", "head_models"),
        ("HEAD", "/metrics", "head_metrics"),
        ("HEAD", "/nope", "head_notfound"),
        ("GET", "/nope", "get_notfound"),
        ("POST", "/health", "post_health"),
    ],
)
def test_head_and_wrong_methods_answer_as_fastapi_does(vllm032: Any, method: str, path: str, capture: str) -> None:
    status, headers, body = parse_http((REAL / "http" / f"{capture}.http").read_bytes())
    s_status, s_headers, s_body = parse_http(raw_request(vllm032.port, method, path, {} if method == "POST" else None))
    assert s_status == status
    assert s_body == body  # HEAD: no body at all
    assert s_headers.get("allow") == headers.get("allow")
    if "content-length" in headers:  # the length the GET/POST body has
        assert s_headers["content-length"] == headers["content-length"]
    assert s_headers.get("content-type", "").split(";")[0] == headers.get("content-type", "").split(";")[0]


def test_head_keeps_the_connection_usable(vllm032: Any) -> None:
    """A HEAD answer with Content-Length but no body must not desynchronise keep-alive."""
    conn = http.client.HTTPConnection("127.0.0.1", vllm032.port, timeout=10)
    try:
        for _ in range(2):
            conn.request("HEAD", "/metrics")
            r = conn.getresponse()
            assert r.status == 200 and r.read() == b"" and int(r.headers["content-length"]) > 0
            conn.request("GET", "/health")
            r = conn.getresponse()
            assert r.status == 200 and r.read() == b""
    finally:
        conn.close()


# --------------------------------------------------------------------------- tokenize


def test_tokenize_and_detokenize_as_vllm(vllm032: Any) -> None:
    port = vllm032.port
    real = {n: json.loads(parse_http((REAL / "http" / f"{n}.http").read_bytes())[2])
            for n in ("tokenize_completion", "tokenize_token_strs", "tokenize_chat", "detokenize", "tokenize_unknown_model")}
    prompt = "the quick brown fox jumps over the lazy dog"
    status, _, body = parse_http(raw_request(port, "POST", "/tokenize", {"model": MODEL, "prompt": prompt, "add_special_tokens": False}))
    tok = json.loads(body)
    assert status == 200 and key_tree(tok) == key_tree(real["tokenize_completion"])
    assert tok["count"] == len(tok["tokens"]) == 9 and tok["max_model_len"] == 512 and tok["token_strs"] is None
    assert tok["tokens"][0] == tok["tokens"][6]  # "the" twice: one id
    strs = json.loads(parse_http(raw_request(port, "POST", "/tokenize", {"prompt": prompt, "return_token_strs": True}))[2])
    assert list(strs) == list(real["tokenize_token_strs"]) and strs["token_strs"] == prompt.split()
    chat = json.loads(parse_http(raw_request(port, "POST", "/tokenize", {"messages": [{"role": "user", "content": prompt}]}))[2])
    assert list(chat) == list(real["tokenize_chat"]) and chat["count"] == 9
    # what `vllm bench serve` does to align prompts: detokenize the first N ids
    status, _, body = parse_http(raw_request(port, "POST", "/detokenize", {"model": MODEL, "tokens": tok["tokens"][:4]}))
    assert status == 200 and list(json.loads(body)) == list(real["detokenize"])
    assert json.loads(body)["prompt"] == "the quick brown fox"
    status, _, body = parse_http(raw_request(port, "POST", "/tokenize", {"model": "nope", "prompt": "x"}))
    assert status == 404 and key_tree(json.loads(body)) == key_tree(real["tokenize_unknown_model"])
    assert json.loads(body)["error"]["message"] == real["tokenize_unknown_model"]["error"]["message"]


# --------------------------------------------------------------------------- metrics


def families(text: str) -> dict[str, Any]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def value(fams: dict[str, Any], sample: str, **labels: str) -> float:
    name = sample.removesuffix("_total").removesuffix("_count").removesuffix("_sum")
    for s in fams[name].samples:
        if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()):
            return float(s.value)
    raise AssertionError(f"no sample {sample} {labels}")


def test_metrics_use_vllms_names_types_labels_and_count_what_was_served(vllm032: Any) -> None:
    real = families(parse_http((REAL / "http" / "metrics_after.http").read_bytes())[2].decode())
    idle = families((REAL / "metrics-idle.txt").read_text())
    prompts, generated = 0, 0
    for words, max_tokens in ((3, 5), (7, 2), (12, 9)):
        r = httpx.post(vllm032.url + "/v1/completions", timeout=10, json={
            "model": MODEL, "prompt": " ".join(["w"] * words), "max_tokens": max_tokens, "ignore_eos": True})
        usage = r.json()["usage"]
        prompts, generated = prompts + usage["prompt_tokens"], generated + usage["completion_tokens"]
    r = httpx.get(vllm032.url + "/metrics", timeout=10)
    assert r.status_code == 200 and r.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    sim = families(r.text)
    ours = {n: f for n, f in sim.items() if n.startswith("vllm:")}
    assert not any(n.startswith("perflab") for n in sim)
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:prompt_tokens", "vllm:generation_tokens", "vllm:request_success", "vllm:num_preemptions",
                 "vllm:prefix_cache_queries", "vllm:prefix_cache_hits", "vllm:time_to_first_token_seconds",
                 "vllm:inter_token_latency_seconds", "vllm:e2e_request_latency_seconds"):
        assert name in ours, name
    for name, fam in ours.items():
        assert name in real and name in idle, f"{name} is not a vLLM 0.32.0 metric"
        assert fam.type == real[name].type and fam.documentation == real[name].documentation, name
        label_sets = {frozenset(s.labels) - {"le"} for s in fam.samples}
        assert label_sets == {frozenset(s.labels) - {"le"} for s in real[name].samples}, name
    for name in ("vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds", "vllm:inter_token_latency_seconds"):
        les = [s.labels["le"] for s in ours[name].samples if s.name.endswith("_bucket")]
        assert les == [s.labels["le"] for s in real[name].samples if s.name.endswith("_bucket")], name
    lab = {"engine": "0", "model_name": MODEL}
    assert value(sim, "vllm:prompt_tokens_total", **lab) == prompts == 22
    assert value(sim, "vllm:generation_tokens_total", **lab) == generated == 16
    assert value(sim, "vllm:request_success_total", finished_reason="length", **lab) == 3
    assert value(sim, "vllm:request_success_total", finished_reason="stop", **lab) == 0
    assert value(sim, "vllm:time_to_first_token_seconds_count", **lab) == 3
    assert value(sim, "vllm:inter_token_latency_seconds_count", **lab) == generated - 3
    assert value(sim, "vllm:request_generation_tokens_sum", **lab) == generated
    assert value(sim, "vllm:prefix_cache_queries_total", **lab) == prompts
    assert value(sim, "vllm:num_requests_running", **lab) == 0


@pytest.mark.parametrize(
    ("engine_name", "path", "names"),
    [
        ("sglang", "/metrics", ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage",
                                "sglang:prompt_tokens", "sglang:generation_tokens", "sglang:time_to_first_token_seconds")),
        ("trtllm", "/prometheus/metrics", ("trtllm_request_success", "trtllm_time_to_first_token_seconds",
                                           "trtllm_kv_cache_utilization", "trtllm_e2e_request_latency_seconds")),
    ],
)
def test_other_engines_export_their_own_metric_names(sim_env: dict[str, str], engine_name: str, path: str,  # noqa: F811
                                                     names: tuple[str, ...]) -> None:
    with engine(sim_env, engine=engine_name, served_model_names=[MODEL]) as e:
        assert e.read_until(READY)
        r = httpx.post(e.url + "/v1/completions", json={"prompt": "a b c", "max_tokens": 3, "ignore_eos": True}, timeout=10)
        assert r.status_code == 200
        fams = families(httpx.get(e.url + path, timeout=10).text)
        assert set(names) <= set(fams) and not any(n.startswith(("vllm:", "perflab")) for n in fams)
        if engine_name == "sglang":
            assert value(fams, "sglang:generation_tokens_total", model_name=MODEL) == 3
        else:
            assert value(fams, "trtllm_request_success_total", model_name=MODEL, finished_reason="length") == 1


# --------------------------------------------------------------------------- logprobs


def logprobs_shape(obj: Any) -> Any:
    """:func:`key_tree`, but a completions ``top_logprobs`` entry (a dict keyed by token
    strings) by its size and value types: its keys are the tokens, not a schema."""
    if isinstance(obj, dict):
        out = []
        for k, v in obj.items():
            if k == "top_logprobs" and isinstance(v, list) and v and isinstance(v[0], dict) and "token" not in v[0]:
                out.append((k, [("entries", len(v[0])), ("values", sorted({type(x).__name__ for x in v[0].values()}))]))
            else:
                out.append((k, logprobs_shape(v)))
        return out
    if isinstance(obj, list):
        return [logprobs_shape(obj[0])] if obj else []
    return type(obj).__name__ if obj is None else "value"


LOGPROBS = [
    # capture, endpoint, request fields (vLLM's ways of asking for the chosen tokens' logprobs)
    ("http/chat_logprobs.http", "/v1/chat/completions", {**CHAT, "logprobs": True, "top_logprobs": 0}),
    ("http/chat_logprobs_top2.http", "/v1/chat/completions", {**CHAT, "logprobs": True, "top_logprobs": 2}),
    ("http/completions_logprobs.http", "/v1/completions", {**COMPLETION, "logprobs": 0}),
    ("http/completions_logprobs_top2.http", "/v1/completions", {**COMPLETION, "logprobs": 2}),
]


@pytest.mark.parametrize(("capture", "path", "fields"), LOGPROBS)
def test_logprobs_have_the_captured_shapes(vllm032: Any, capture: str, path: str, fields: dict[str, Any]) -> None:
    real = json.loads(capture_body(capture))
    body = {"model": MODEL, "max_tokens": 4, "temperature": 0, **fields}
    sim = httpx.post(vllm032.url + path, json=body, timeout=10).json()
    assert logprobs_shape(sim) == logprobs_shape(real)
    for b in (real, sim):
        choice = b["choices"][0]
        lp = choice["logprobs"]
        if "chat" in path:
            entries = lp["content"]
            assert len(entries) == 4 and all(e["bytes"] == list(e["token"].encode()) for e in entries)
            assert "".join(e["token"] for e in entries) == choice["message"]["content"]
            assert all(len(e["top_logprobs"]) == fields["top_logprobs"] for e in entries)
            if fields["top_logprobs"]:  # greedy: the chosen token is the most likely one
                assert all(e["top_logprobs"][0]["logprob"] == e["logprob"] for e in entries)
        else:
            assert "".join(lp["tokens"]) == choice["text"] and len(lp["token_logprobs"]) == 4
            assert lp["text_offset"] == [sum(len(t) for t in lp["tokens"][:i]) for i in range(4)]
            assert all(len(top) == max(1, fields["logprobs"]) for top in lp["top_logprobs"])
            assert all(top[t] == x for top, t, x in zip(lp["top_logprobs"], lp["tokens"], lp["token_logprobs"], strict=True))
    # the simulator's tokens count as its tokenizer says: one word each
    assert sim["usage"]["completion_tokens"] == 4


@pytest.mark.parametrize(("capture", "path", "fields"), [
    ("http/chat_stream_logprobs.http", "/v1/chat/completions", {**CHAT, "logprobs": True, "top_logprobs": 0}),
    ("http/completions_stream_logprobs.http", "/v1/completions", {**COMPLETION, "logprobs": 0}),
])
def test_streamed_logprobs_have_the_captured_shapes(vllm032: Any, capture: str, path: str, fields: dict[str, Any]) -> None:
    real = sse_events(capture_body(capture))
    body = {"model": MODEL, "max_tokens": 4, "temperature": 0, "stream": True, "stream_options": USAGE, **fields}
    sim = sse_events(httpx.post(vllm032.url + path, json=body, timeout=10).text)
    assert stream_shape(sim) == stream_shape(real)
    token_chunks = {kind: [logprobs_shape(ev["choices"][0]["logprobs"]) for ev in events if chunk_kind(ev) in ("token", "finish")]
                    for kind, events in (("real", real), ("sim", sim))}
    assert token_chunks["sim"][0] == token_chunks["real"][0] and len(set(map(repr, token_chunks["sim"]))) == 1
    for events in (real, sim):
        chunks = [ev["choices"][0] for ev in events if chunk_kind(ev) in ("token", "finish")]
        if "chat" in path:
            assert all("".join(e["token"] for e in c["logprobs"]["content"]) == c["delta"]["content"] for c in chunks)
        else:  # text_offset counts from the completion's start, across chunks
            offsets = [o for c in chunks for o in c["logprobs"]["text_offset"]]
            texts = [c["text"] for c in chunks]
            assert offsets == [sum(len(t) for t in texts[:i]) for i in range(len(texts))]
