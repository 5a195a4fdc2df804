"""Real peer clients against the simulated vLLM 0.32 (the `vllm` front end, as perflab's
plugin launches it) at time scale 1: the `openai` Python client, and aiohttp probing
`/metrics` as AIPerf's server-metrics check does (HEAD first, then GET) — aiohttp fails on a
HEAD answer that carries a body."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import suppress

import aiohttp
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from test_runtime import MACHINE, Engine, free_port

FRONT_END = "import sys; from perflab_sim.frontends import vllm; sys.exit(vllm.main(sys.argv[1:]))"


@pytest.fixture
def vllm032(tmp_path: object) -> Iterator[Engine]:
    port = free_port()
    env = dict(os.environ)
    env.pop("PERFLAB_SIM_FAULT", None)
    env.update({
        "PERFLAB_SIM_HARDWARE": MACHINE,
        "PERFLAB_SIM_STATE_DIR": str(tmp_path),
        "PERFLAB_SIM_TIME_SCALE": "1",
        "PERFLAB_SIM_ENGINE_VERSIONS": "vllm=0.32.0",
    })
    argv = [sys.executable, "-c", FRONT_END, "serve", "Qwen/Qwen3-8B", "--served-model-name", "tiny",
            "--max-model-len", "4096", "--host", "127.0.0.1", "--port", str(port)]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        yield Engine(proc, port, env)
    finally:
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=5)
        for pipe in (proc.stdout, proc.stderr):
            if pipe:
                pipe.close()


def test_openai_client_and_aiperf_style_metrics_probe(vllm032: Engine) -> None:
    assert vllm032.read_until(f"Starting vLLM server on http://127.0.0.1:{vllm032.port}", timeout=20)
    assert vllm032.read_until("Application startup complete.", timeout=5)
    assert not any("Starting vLLM API server" in line for line in vllm032.out)  # 0.32's wording only

    client = openai.OpenAI(base_url=vllm032.url + "/v1", api_key="none", timeout=20, max_retries=0)
    assert [m.id for m in client.models.list().data] == ["tiny"]
    stream = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "say something"}], max_tokens=6, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(text.split()) == 6
    assert chunks[-1].choices == [] and chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 6
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    done = client.completions.create(model="tiny", prompt="one two three", max_tokens=3, extra_body={"ignore_eos": True})
    assert done.usage is not None and (done.usage.prompt_tokens, done.usage.completion_tokens) == (3, 3)
    assert done.system_fingerprint is not None and done.system_fingerprint.startswith("vllm-0.32.0-")
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="other", prompt="x", max_tokens=1)

    async def aiperf_probe() -> tuple[int, int, int, str]:
        async with aiohttp.ClientSession() as session:  # one keep-alive connection for all
            async with session.head(vllm032.url + "/metrics") as head:
                head_status = head.status
                assert await head.read() == b""
            async with session.head(vllm032.url + "/health") as head:
                health_status = head.status  # FastAPI: GET-only route -> 405
            async with session.get(vllm032.url + "/metrics") as get:
                return head_status, health_status, get.status, await get.text()

    head_status, health_status, get_status, text = asyncio.run(aiperf_probe())
    assert (head_status, health_status, get_status) == (200, 405, 200)
    samples = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    assert samples["vllm:generation_tokens_total"] == 9
    assert samples["vllm:prompt_tokens_total"] == 2 + 3  # chat: "say something", completion: 3 words
    assert samples["vllm:time_to_first_token_seconds_count"] == 2

    vllm032.proc.send_signal(signal.SIGTERM)
    assert vllm032.finish() == 0
    assert "INFO:     Application shutdown complete." in vllm032.out
