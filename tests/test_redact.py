"""perflab.redact: what a secret is, how it is masked, and that the engine still gets it.

The end-to-end check (a whole study, ``launch --check --json``, ``engines command``) is in
tests/test_secrets_e2e.py.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx
import psutil
import pytest
import yaml

from perflab import redact
from perflab.lab.plan import load_plan_text
from perflab.lifecycle.output import OutputPump


@pytest.fixture(autouse=True)
def fresh_registry() -> Iterator[None]:
    redact.forget_all()
    yield
    redact.forget_all()


def _secret(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:12]}"


# ============================================================================ what is secret


@pytest.mark.parametrize("name", ["HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "OPENAI_API_KEY", "AWS_SECRET_ACCESS_KEY",
                                  "DB_PASSWORD", "MYAPIKEY", "hf_token", "api-key", "GITHUB_PASSPHRASE"])
def test_secret_names(name: str) -> None:
    assert redact.is_secret_name(name)


@pytest.mark.parametrize("name", ["TOKENIZERS_PARALLELISM", "VLLM_MAX_TOKENS", "SSL_KEYFILE", "CUDA_VISIBLE_DEVICES",
                                  "PATH", "max_batched_tokens", "KEYFILE"])
def test_not_secret_names(name: str) -> None:
    assert not redact.is_secret_name(name)


def test_argv_secrets_both_forms_and_underscores() -> None:
    argv = ["vllm", "serve", "m", "--api-key", "k-one", "--hf-token=hf-two", "--api_key", "k-three", "--admin-api-key=x4x4",
            "--hf-token", "--port", "8000"]  # a bare --hf-token (use the cached login) takes no value
    assert redact.argv_secrets(argv) == ["k-one", "hf-two", "k-three", "x4x4"]


def test_secrets_in_a_plan_tree() -> None:
    plan = {"serve": {"env": {"HF_TOKEN": "hf-a1", "TOKENIZERS_PARALLELISM": "false"}, "extra_args": "--api-key sk-b2"},
            "candidates": [{"set": {"extra_args": ["--api-key=sk-c3"], "engine_options": {"api_key": "opt-d4"}}}],
            "config_key": "not-a-secret"}
    assert sorted(redact.secrets_in(plan)) == ["hf-a1", "opt-d4", "sk-b2", "sk-c3"]


# ============================================================================ masking


def test_redact_argv_masks_values_by_position_whatever_their_length() -> None:
    redact.register(["long-secret-value"])
    argv = ["x", "--api-key", "ab", "--hf-token=cd", "--note", "has long-secret-value inside"]
    assert redact.redact_argv(argv) == ["x", "--api-key", "***", "--hf-token=***", "--note", "has *** inside"]


def test_redact_obj_masks_env_keys_and_scrubs_strings_but_keeps_perflab_keys() -> None:
    tok = _secret("hf_")
    redact.register([tok])
    value = {"config_key": "0123abcd", "launch": {"env": {"HF_TOKEN": "x1", "PATH": "/bin"},
                                                   "argv": ["vllm", "--api-key", "zz"]},
             "line": f"non-default args: {{'hf_token': '{tok}'}}", "n": 3, "ok": True}
    out = redact.redact_obj(value)
    assert out["config_key"] == "0123abcd" and out["n"] == 3 and out["ok"] is True
    assert out["launch"]["env"] == {"HF_TOKEN": "***", "PATH": "/bin"}
    assert out["launch"]["argv"] == ["vllm", "--api-key", "***"]
    assert tok not in json.dumps(out)


def test_scrub_catches_json_and_url_escaped_forms() -> None:
    tricky = 'p"a/ss\\w0rd'
    redact.register([tricky])
    assert tricky not in redact.scrub(f"x {tricky} y")
    assert json.dumps(tricky)[1:-1] not in redact.scrub(json.dumps({"v": tricky}))
    from urllib.parse import quote

    assert quote(tricky, safe="") not in redact.scrub(f"http://h/?k={quote(tricky, safe='')}")


def test_short_and_boolean_values_are_not_scrubbed_from_free_text() -> None:
    redact.register(["abc", "true", "false"])
    assert redact.scrub("abc is true or false") == "abc is true or false"
    assert not redact.active()


def test_masked_plan_parses_and_keys_like_the_real_one() -> None:
    tok, key = _secret("hf_"), _secret("sk-")
    text = (f"name: s\nmodel: Qwen/Qwen3-8B\nhardware: sim:a100-80g-x8\nengines: [vllm]\n"
            f"serve:\n  env: {{HF_TOKEN: {tok}}}\n  extra_args: \"--api-key {key} --enforce-eager\"\n"
            f"profiles:\n  main: {{input_len: 8, output_len: 2, num_prompts: 2}}\n")
    real = load_plan_text(text, path="plan.yaml", check_files=False)
    redact.register(redact.secrets_in(real))
    masked_text = redact.scrub_plan(text)
    assert tok not in masked_text and key not in masked_text
    yaml.safe_load(masked_text)  # a bare *** would be a YAML alias
    masked = load_plan_text(masked_text, path="plan.yaml", check_files=False)
    assert masked.engine_defaults("vllm").key() == real.engine_defaults("vllm").key()
    assert real.engine_defaults("vllm").canonical()["options"]["env"] == {"HF_TOKEN": "***"}
    # a plan without secrets keys exactly as before (the redaction changes nothing)
    plain = load_plan_text(text.replace(tok, "x").replace(key, "y"), path="plan.yaml", check_files=False)
    assert plain.engine_defaults("vllm").canonical()["options"]["extra_args"] == ["--api-key", "***", "--enforce-eager"]


def test_toml_plan_masking_stays_inside_quotes() -> None:
    import tomllib

    key = _secret("sk-")
    redact.register([key])
    masked = redact.scrub_plan(f'[serve]\nextra_args = ["--api-key", "{key}"]\nenv = {{ HF_TOKEN = "{key}" }}\n')
    assert tomllib.loads(masked)["serve"] == {"extra_args": ["--api-key", "***"], "env": {"HF_TOKEN": "***"}}


def test_write_text_makes_a_file_holding_a_mask_private(tmp_path: Path) -> None:
    key = _secret("sk-")
    redact.register([key])
    p = redact.write_text(tmp_path / "a.txt", f"--api-key {key}\n")
    assert p.read_text() == "--api-key ***\n"
    assert p.stat().st_mode & 0o777 == 0o600
    q = redact.write_text(tmp_path / "b.txt", "nothing\n")
    assert q.stat().st_mode & 0o077 == os.stat(tmp_path / "b.txt").st_mode & 0o077  # untouched: umask


def test_private_dir_only_when_secrets_are_known(tmp_path: Path) -> None:
    redact.private_dir(tmp_path / "plain")
    redact.register([_secret("sk-")])
    d = redact.private_dir(tmp_path / "secret" / "study")
    assert d.stat().st_mode & 0o777 == 0o700


def test_output_pump_scrubs_the_engine_log(tmp_path: Path) -> None:
    key = _secret("sk-")
    redact.register([key])
    r, w = os.pipe()
    os.set_blocking(r, False)
    pump = OutputPump(r, tmp_path / "engine.log")
    os.write(w, f"INFO non-default args: {{'api_key': ['{key}']}}\npartial {key}".encode())
    os.close(w)
    pump.read_available()
    pump.note(f"crashed with {key}")
    pump.close()
    text = (tmp_path / "engine.log").read_text()
    assert key not in text and key not in pump.tail_text()
    assert "'api_key': ['***']" in text and "partial ***" in text and "[perflab] crashed with ***" in text


def test_structlog_processor_masks_events() -> None:
    key = _secret("sk-")
    redact.register([key])
    ev = redact.structlog_processor(None, "info", {"event": "engine.state", "argv": ["v", "--api-key", key], "x": key})
    assert key not in json.dumps(ev)


def test_api_key_and_headers() -> None:
    assert redact.api_key(["vllm", "--api-key", "k1"]) == "k1"
    assert redact.api_key(["vllm", "--api-key=k2"], {"VLLM_API_KEY": "env"}) == "k2"
    assert redact.api_key(["vllm"], {"VLLM_API_KEY": "env"}) == "env"
    assert redact.auth_headers(["vllm"]) == {}
    assert redact.auth_headers(["vllm", "--api-key", "k"]) == {"Authorization": "Bearer k"}


# ============================================================================ the engine gets the real values


REAL = Path(__file__).parent / "fixtures" / "real" / "vllm-0.32.0-cpu-api-key"


def test_scrubbing_leaves_a_real_engine_log_alone(tmp_path: Path) -> None:
    """No false positives: with secrets known, a real vLLM log (which masks api_key itself)
    goes through the engine-log pump byte for byte."""
    redact.register(json.loads((REAL / "responses.json").read_text())["secrets"])
    src = (REAL / "serve.log").read_bytes()
    r, w = os.pipe()
    os.set_blocking(r, False)
    pump = OutputPump(r, tmp_path / "engine.log")
    os.write(w, src)
    os.close(w)
    pump.read_available()
    pump.close()
    *lines, last = src.split(b"\n")  # the pump writes lines, without a trailing \r
    expected = b"".join(line.rstrip(b"\r") + b"\n" for line in [*lines, *([last] if last else [])])
    assert (tmp_path / "engine.log").read_bytes() == expected
    assert "'api_key': '***'" in src.decode()


def test_supervised_sim_vllm_receives_the_real_secrets_and_requires_the_key(tmp_path: Path) -> None:
    """The simulated vLLM gets the real --api-key and HF_TOKEN (argv, environment), answers
    with and without the key as the real vLLM 0.32 did (tests/fixtures/real/...-api-key), the
    readiness probe passes with the key, and launch.json / the engine log / the outcome hold
    only ***."""
    from perflab.contract.types import ServeConfig
    from perflab.hardware import resolve
    from perflab.plugins import load
    from perflab.supervisor import EngineInstance

    captured = json.loads((REAL / "responses.json").read_text())
    key, tok = captured["secrets"]
    state = tmp_path / "sim-state"
    state.mkdir()
    pm = load()
    hw, env = resolve(pm, "sim:a100-80g-x1", {**os.environ, "PERFLAB_SIM_STATE_DIR": str(state),
                                              "PERFLAB_SIM_TIME_SCALE": "20"})
    seen: dict[str, object] = {}

    async def main() -> None:
        config = ServeConfig(model="Qwen/Qwen3-8B", extra_args=("--api-key", key), extra_env={"HF_TOKEN": tok})
        async with EngineInstance(pm, "vllm", config, hardware=hw, env=env, workdir=tmp_path / "run", startup_timeout=60,
                             grace=2.0) as inst:
            assert inst.outcome.state == "ready", inst.outcome.to_json()
            proc = psutil.Process(inst.pid)
            seen["cmdline"], seen["env"] = proc.cmdline(), proc.environ()
            body = {"model": inst.launch.served_model_name, "prompt": "hi", "max_tokens": 1}
            answers = []
            async with httpx.AsyncClient(trust_env=False) as c:
                for q in captured["requests"]:
                    headers = {"Authorization": q["authorization"]} if q["authorization"] else {}
                    r = await c.request(q["method"], inst.base_url + q["path"], headers=headers,
                                        json=body if q["method"] == "POST" else None)
                    answers.append((r.status_code, r.text if q["body"] is not None else None))
            seen["answers"] = answers
        seen["outcome"] = json.dumps(inst.outcome.to_json())

    anyio.run(main)
    assert key in seen["cmdline"] and seen["env"]["HF_TOKEN"] == tok  # type: ignore[operator,index]
    assert seen["answers"] == [(q["status"], q["body"]) for q in captured["requests"]]
    for path in (tmp_path / "run").rglob("*"):
        data = path.read_bytes()
        assert tok.encode() not in data and key.encode() not in data, path
    launch = json.loads((tmp_path / "run" / "launch.json").read_text())
    assert launch["env"]["HF_TOKEN"] == "***" and "***" in launch["argv"]
    assert (tmp_path / "run" / "launch.json").stat().st_mode & 0o777 == 0o600
    assert "'api_key': ['***']" in (tmp_path / "run" / "engine.log").read_text()  # vLLM echoes its args
    assert tok not in str(seen["outcome"]) and key not in str(seen["outcome"])


def test_short_numbers_are_not_scrubbed_but_dataclasses_are() -> None:
    from perflab.contract.types import CrashCause

    key = _secret("sk-")
    redact.register(["8000", key])
    assert redact.scrub("http://127.0.0.1:8000") == "http://127.0.0.1:8000"
    out = redact.redact_obj({"cause": CrashCause("x", f"died with --api-key {key}")})
    assert out["cause"]["explanation"] == "died with --api-key ***"


def test_bench_client_sends_the_engines_key_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The lab passes the engine's key as an explicit header; an OPENAI_API_KEY in the
    environment (what `vllm bench serve` reads) must not add a second, wrong one."""
    from perflab.bench.client import request_headers
    from perflab.bench.request import BenchRequest

    monkeypatch.setenv("OPENAI_API_KEY", "from-env")
    req = BenchRequest(base_urls=("http://127.0.0.1:1",), model="m",
                       headers=tuple(redact.auth_headers(["vllm", "--api-key", "engine-key"]).items()))
    auth = [v for k, v in request_headers(req) if k.lower() == "authorization"]
    assert auth == ["Bearer engine-key"]
    plain = BenchRequest(base_urls=("http://127.0.0.1:1",), model="m")
    assert [v for k, v in request_headers(plain) if k.lower() == "authorization"] == ["Bearer from-env"]


def test_study_log_masks_secrets_in_tracebacks(tmp_path: Path) -> None:
    from perflab.lab.store.studylog import study_logging

    key = _secret("sk-")
    redact.register([key])
    with study_logging(tmp_path) as log:
        try:
            raise RuntimeError(f"engine refused --api-key {key}")
        except RuntimeError:
            log.exception("lab.run-error", argv=["vllm", "--api-key", key])
    text = (tmp_path / "study.log").read_text()
    assert key not in text and "engine refused --api-key ***" in text


def test_plan_errors_do_not_quote_a_secret() -> None:
    from perflab.contract.errors import UsageError

    key = _secret("sk-")
    text = (f"name: s\nmodel: m\nengines: [vllm]\nserve:\n  env: {{HF_TOKEN: {key}}}\n  max_num_seqs: {key}\n"
            f"profiles:\n  main: {{input_len: 8, output_len: 2}}\n")
    with pytest.raises(UsageError) as err:
        load_plan_text(text, path="plan.yaml", check_files=False)
    assert "max_num_seqs" in str(err.value) and key in str(err.value)  # the message quotes the value
    assert key not in redact.scrub(str(err.value))  # what `perflab: error:` prints
