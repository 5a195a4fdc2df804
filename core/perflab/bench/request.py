"""What to benchmark: :class:`BenchRequest`, one field per ``perflab bench`` option."""

from __future__ import annotations

import dataclasses
import importlib.util
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from perflab.contract.errors import UsageError
from perflab.contract.types import BENCH_EXTENSIONS

BACKENDS = ("openai-chat", "openai")
DEFAULT_ENDPOINTS = {"openai-chat": "/v1/chat/completions", "openai": "/v1/completions"}
DATASETS = ("random", "sharegpt", "prefix-repetition", "synthetic-sharegpt", "multi-turn")
HTTP_STACKS = ("raw", "aiohttp")
DEFAULT_STALL_S = 60.0
# Prompts are generated lazily, but every request is still encoded and timed one by one and
# keeps a trace: beyond this a plan is a typo (10**12), not a benchmark.
MAX_NUM_PROMPTS = 10_000_000
# The longest prompt or answer perflab builds or asks for, in tokens: the largest context an
# open model declares is 10 M (Llama 4 Scout); beyond it a length is a typo (10**8 kept the
# client silent for minutes building one prompt), refused before anything is generated.
MAX_SEQUENCE_TOKENS = 10_485_760
# A stream that has started but never ends is cut this long after its first byte: a minimum,
# plus the request's max_tokens at a floor rate (wall-clock seconds; --timeout replaces it).
# Counted from the first byte, not the send, so that a request queued in a busy server (no
# byte yet) is not cut: a silent server is the stall watchdog's (--stall-s).
STREAM_DEADLINE_MIN_S = 60.0
STREAM_DEADLINE_FLOOR_TOK_S = 1.0
PERCENTILE_METRICS = ("latency", "ttft", "tpot", "itl", "e2el")
GOODPUT_METRICS = ("ttft", "tpot", "e2el")
# ShareGPT's prompt cap and the synthetic ShareGPT lengths' means (input, output): the datasets
# build with them, and a request's expected prompt length is checked with them here
SHAREGPT_MAX_PROMPT_LEN = 1024
SYNTHETIC_SHAREGPT_MEANS = (217.0, 202.0)  # seeds 000-002: 217393 / ~201700 tokens over 1000 requests


@dataclass(frozen=True)
class BenchRequest:
    """One benchmark run against one or more OpenAI-compatible endpoints.

    Field names follow ``vllm bench serve``'s options. Times given by the user (SLOs,
    request rate) are in the server's time: on a simulator running ``time_scale`` times
    faster than real time, perflab sends ``request_rate × time_scale`` requests per real
    second and multiplies every measured duration by ``time_scale``. ``timeout`` stays
    wall-clock seconds.
    """

    base_urls: tuple[str, ...]
    model: str
    backend: str = "openai-chat"
    endpoint: str | None = None  # default: /v1/chat/completions or /v1/completions
    served_model_name: str | None = None  # the "model" field sent (default: model)
    dataset: str = "random"
    dataset_path: str | None = None
    num_prompts: int = 1000
    random_input_len: int = 1024
    random_output_len: int = 128
    random_range_ratio: float = 0.0
    random_prefix_len: int = 0
    sharegpt_output_len: int | None = None
    prefix_repetition_prefix_len: int = 256
    prefix_repetition_suffix_len: int = 256
    prefix_repetition_num_prefixes: int = 10
    prefix_repetition_output_len: int = 128
    # multi-turn: conversations of this many turns; each turn's prompt is the conversation so far
    # (earlier user messages and answers) plus a new user message (perflab.bench.datasets)
    multi_turn_turns: int = 4
    multi_turn_input_len: int = 128  # tokens of each new user message
    multi_turn_output_len: int = 128  # tokens asked for each answer (and of each earlier answer in the prompt)
    request_rate: float = math.inf
    burstiness: float = 1.0
    max_concurrency: int | None = None
    seed: int = 0
    goodput: tuple[tuple[str, float], ...] = ()  # (("ttft", 500.0), ("tpot", 50.0))
    percentiles: tuple[float, ...] = (99.0,)
    percentile_metrics: tuple[str, ...] = ("ttft", "tpot", "itl")
    warmup: int = 0
    # per request, wall-clock seconds; None: a started stream is cut at stream_deadline_s(),
    # a request with no byte yet after 6 h (vLLM's AIOHTTP_TIMEOUT)
    timeout: float | None = None
    tokenizer: str | None = None  # None/"auto", "whitespace", "approx", a tokenizer.json or model dir
    # None: vLLM 0.33's default — on for the random dataset (a real engine would otherwise stop
    # at EOS early and runs would not be comparable), off for the others
    # (vllm/benchmarks/serve.py main_async: "when using random datasets, default to ignoring EOS")
    ignore_eos: bool | None = None
    # the request extensions the engine's server takes (EnginePlugin.request_extensions); None:
    # all of BENCH_EXTENSIONS. Without ignore_eos the output lengths are counted, not forced.
    extensions: tuple[str, ...] | None = None
    # None: not sent, the server's default applies (vLLM 0.33 "no longer sets
    # temperature==0 (greedy) in requests by default", vllm/benchmarks/serve.py)
    temperature: float | None = None
    extra_body: tuple[tuple[str, Any], ...] = ()
    headers: tuple[tuple[str, str], ...] = ()
    continuous_usage_stats: bool = False  # ask for usage on every chunk (vLLM, SGLang, TRT-LLM)
    label: str | None = None
    save_result: bool = False
    save_detailed: bool = False
    result_dir: str | None = None
    result_filename: str | None = None
    workers: int = 1
    http_stack: str = "raw"
    time_scale: float = 1.0  # simulated time compression: measured durations are multiplied by it
    # the lab knows the engine is simulated (its hardware snapshot is): time requests by the
    # engine's model-clock stamps when the server proves to be perflab's simulator (the
    # probe), never by a real engine's; docs/simulator.md "Reproducible time"
    server_clock: bool = False
    profile: str | None = None
    keep_text: bool = False  # keep generated texts (for --save-detailed)
    # Stall watchdog: no byte on any open stream for this many seconds of *engine* time
    # (divided by time_scale on the simulator) ends the run as stalled; None or 0: off.
    stall_s: float | None = DEFAULT_STALL_S

    # ------------------------------------------------------------------ derived

    @property
    def api_endpoint(self) -> str:
        return self.endpoint or DEFAULT_ENDPOINTS[self.backend]

    def takes(self, extension: str) -> bool:
        """Whether the server takes request extension ``extension`` (one of BENCH_EXTENSIONS)."""
        return self.extensions is None or extension in self.extensions

    @property
    def send_ignore_eos(self) -> bool:
        """``ignore_eos`` as sent: the explicit choice, else on for the random dataset where
        the server takes it."""
        if self.ignore_eos is not None:
            return self.ignore_eos
        return self.dataset == "random" and self.takes("ignore_eos")

    @property
    def output_lengths(self) -> str:
        """How the answers' lengths come about, as the result says it: ``forced`` (ignore_eos
        sent), ``capped`` (max_tokens only: the model may stop earlier), or ``counted`` (the
        engine cannot force them: what it generated is counted and reported)."""
        if self.send_ignore_eos:
            return "forced"
        return "counted" if not self.takes("ignore_eos") else "capped"

    @property
    def request_model(self) -> str:
        return self.served_model_name or self.model

    @property
    def goodput_dict(self) -> dict[str, float]:
        return dict(self.goodput)

    def replace(self, **changes: Any) -> BenchRequest:
        return dataclasses.replace(self, **changes)

    def validate(self) -> BenchRequest:
        """Raise :class:`UsageError` (one line) for an impossible request; return self."""
        if self.extensions is not None and (unknown := set(self.extensions) - set(BENCH_EXTENSIONS)):
            raise UsageError(f"request extensions {sorted(unknown)}: perflab's bench knows {', '.join(BENCH_EXTENSIONS)}")
        if self.ignore_eos and not self.takes("ignore_eos"):
            raise UsageError("--ignore-eos: this engine's server does not take ignore_eos (it refuses the field); "
                             "output lengths cannot be forced, perflab counts what is generated")
        if not self.base_urls:
            raise UsageError("--base-url is required: the endpoint to benchmark, e.g. http://127.0.0.1:8000")
        for url in self.base_urls:
            if not url.startswith(("http://", "https://")):
                raise UsageError(f"--base-url {url!r}: expected http://HOST:PORT or https://HOST:PORT")
        if not self.model:
            raise UsageError("--model is required (the model name the server serves)")
        if self.backend not in BACKENDS:
            raise UsageError(f"--backend {self.backend!r}: expected one of {', '.join(BACKENDS)}")
        if self.dataset not in DATASETS:
            raise UsageError(f"--dataset {self.dataset!r}: expected one of {', '.join(DATASETS)}")
        if self.dataset == "sharegpt" and not self.dataset_path:
            raise UsageError(
                "--dataset sharegpt needs --dataset-path (a local ShareGPT JSON such as "
                "ShareGPT_V3_unfiltered_cleaned_split.json); perflab downloads nothing"
            )
        positive = {
            "--num-prompts": self.num_prompts,
            "--random-input-len": self.random_input_len,
            "--random-output-len": self.random_output_len,
            "--prefix-repetition-num-prefixes": self.prefix_repetition_num_prefixes,
            "--prefix-repetition-output-len": self.prefix_repetition_output_len,
            "--multi-turn-turns": self.multi_turn_turns,
            "--multi-turn-input-len": self.multi_turn_input_len,
            "--multi-turn-output-len": self.multi_turn_output_len,
            "--workers": self.workers,
        }
        for name, value in positive.items():
            if value < 1:
                raise UsageError(f"{name} {value}: expected a positive integer")
        lengths = {
            "--random-input-len": self.random_input_len,
            "--random-output-len": self.random_output_len,
            "--random-prefix-len": self.random_prefix_len,
            "--sharegpt-output-len": self.sharegpt_output_len or 0,
            "--prefix-repetition-prefix-len": self.prefix_repetition_prefix_len,
            "--prefix-repetition-suffix-len": self.prefix_repetition_suffix_len,
            "--prefix-repetition-output-len": self.prefix_repetition_output_len,
            "--multi-turn-input-len": self.multi_turn_input_len,
            "--multi-turn-output-len": self.multi_turn_output_len,
        }
        for name, value in lengths.items():
            if value > MAX_SEQUENCE_TOKENS:
                raise UsageError(
                    f"{name} {value}: longer than any model's context (perflab builds at most "
                    f"{MAX_SEQUENCE_TOKENS:,} tokens per prompt or answer)"
                )
        if self.dataset != "sharegpt" and (whole := expected_prompt_tokens(self)) > MAX_SEQUENCE_TOKENS:
            raise UsageError(
                f"--dataset {self.dataset}: prompts of up to {whole:,} tokens (prefix, input and earlier "
                f"turns together), longer than any model's context ({MAX_SEQUENCE_TOKENS:,} tokens at most)"
            )
        if self.num_prompts > MAX_NUM_PROMPTS:
            raise UsageError(
                f"--num-prompts {self.num_prompts}: more than perflab runs in one benchmark "
                f"({MAX_NUM_PROMPTS:,}); split the run"
            )
        if self.stall_s is not None and (self.stall_s < 0 or self.stall_s != self.stall_s):
            raise UsageError(f"--stall-s {self.stall_s}: expected seconds >= 0 (0: no stall watchdog)")
        if self.random_prefix_len < 0 or self.prefix_repetition_prefix_len < 0 or self.prefix_repetition_suffix_len < 0:
            raise UsageError("prefix and suffix lengths must be >= 0")
        if self.sharegpt_output_len is not None and self.sharegpt_output_len < 1:
            raise UsageError(f"--sharegpt-output-len {self.sharegpt_output_len}: expected a positive integer")
        if not 0.0 <= self.random_range_ratio < 1.0:
            raise UsageError(f"--random-range-ratio {self.random_range_ratio}: expected a value in [0, 1)")
        if not self.request_rate > 0:
            raise UsageError(f"--request-rate {self.request_rate}: expected a positive number or inf")
        if not self.burstiness > 0:
            raise UsageError(f"--burstiness {self.burstiness}: expected a positive number (1 = Poisson)")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise UsageError(f"--max-concurrency {self.max_concurrency}: expected a positive integer")
        if self.max_concurrency is not None and self.workers > self.max_concurrency:
            raise UsageError(
                f"--workers {self.workers} exceeds --max-concurrency {self.max_concurrency}: "
                "each worker process needs at least one concurrent request"
            )
        if self.warmup < 0:
            raise UsageError(f"--warmup {self.warmup}: expected 0 or more requests")
        if self.timeout is not None and not self.timeout > 0:
            raise UsageError(f"--timeout {self.timeout}: expected a positive number of seconds")
        if not self.time_scale > 0:
            raise UsageError(f"--time-scale {self.time_scale}: expected a positive factor")
        if self.http_stack not in HTTP_STACKS:
            raise UsageError(f"--http-stack {self.http_stack!r}: expected one of {', '.join(HTTP_STACKS)}")
        if self.http_stack == "aiohttp" and importlib.util.find_spec("aiohttp") is None:  # an extra, not the core's
            raise UsageError("--http-stack aiohttp needs aiohttp: pip install 'perflab[aiohttp]'")
        for p in self.percentiles:
            if not 0 < p < 100:
                raise UsageError(f"--percentiles: {p} is not in (0, 100)")
        bad = [m for m in self.percentile_metrics if m not in PERCENTILE_METRICS]
        if bad:
            raise UsageError(f"--percentile-metrics {','.join(bad)}: expected some of {','.join(PERCENTILE_METRICS)}")
        for name, limit in self.goodput:
            if name not in GOODPUT_METRICS:
                raise UsageError(f"--goodput {name}:{limit}: the metric must be one of {', '.join(GOODPUT_METRICS)}")
            if value < 0:
                raise UsageError(f"--goodput {name}:{value}: the SLO must be >= 0 milliseconds")
        return self


# --------------------------------------------------------------------------- option parsing


def stream_deadline_s(max_tokens: int | None) -> float | None:
    """How long after its first byte a request's stream may last (None: no such limit, the
    request has no ``max_tokens``): :data:`STREAM_DEADLINE_MIN_S` plus ``max_tokens`` at
    :data:`STREAM_DEADLINE_FLOOR_TOK_S`."""
    if max_tokens is None:
        return None
    return STREAM_DEADLINE_MIN_S + max_tokens / STREAM_DEADLINE_FLOOR_TOK_S


def parse_rate(value: str | float) -> float:
    """``--request-rate``: a positive number or ``inf``."""
    if isinstance(value, (int, float)):
        return float(value)
    text = value.strip().lower()
    if text in ("inf", "infinity"):
        return math.inf
    try:
        rate = float(text)
    except ValueError:
        raise UsageError(f"--request-rate {value!r}: expected a number of requests per second or 'inf'") from None
    if not rate > 0:
        raise UsageError(f"--request-rate {value!r}: expected a positive number or 'inf'")
    return rate


def parse_goodput(values: str | Sequence[str] | Mapping[str, float] | None) -> tuple[tuple[str, float], ...]:
    """``--goodput ttft:500 tpot:50 e2el:20000`` (milliseconds), vLLM's ``KEY:VALUE`` pairs."""
    if not values:
        return ()
    if isinstance(values, Mapping):
        pairs = [(str(k), float(v)) for k, v in values.items()]
    else:
        items = values.split() if isinstance(values, str) else [w for v in values for w in str(v).replace(",", " ").split()]
        pairs = []
        for item in items:
            name, sep, num = item.partition(":")
            try:
                if not sep:
                    raise ValueError
                pairs.append((name.strip().lower(), float(num)))
            except ValueError:
                raise UsageError(
                    f"--goodput {item!r}: expected METRIC:MILLISECONDS pairs such as ttft:500 tpot:50 e2el:20000"
                ) from None
    for name, value in pairs:
        if name not in GOODPUT_METRICS:
            raise UsageError(f"--goodput {name}:{value:g}: the metric must be one of {', '.join(GOODPUT_METRICS)}")
        if value < 0:
            raise UsageError(f"--goodput {name}:{value:g}: the SLO must be >= 0 milliseconds")
    return tuple(pairs)


def parse_percentiles(value: str | Sequence[float]) -> tuple[float, ...]:
    """``--percentiles 50,90,95,99``."""
    if isinstance(value, str):
        try:
            out = tuple(float(v) for v in value.replace(" ", ",").split(",") if v)
        except ValueError:
            raise UsageError(f"--percentiles {value!r}: expected a comma list of numbers such as 50,90,95,99") from None
    else:
        out = tuple(float(v) for v in value)
    if not out:
        raise UsageError("--percentiles: expected at least one percentile such as 99")
    for p in out:
        if not 0 < p < 100:
            raise UsageError(f"--percentiles: {p:g} is not in (0, 100)")
    return out


def parse_percentile_metrics(value: str | Sequence[str]) -> tuple[str, ...]:
    items = tuple(v.strip() for v in (value.split(",") if isinstance(value, str) else value) if v.strip())
    bad = [m for m in items if m not in PERCENTILE_METRICS]
    if bad or not items:
        raise UsageError(f"--percentile-metrics {value!r}: expected a comma list of {','.join(PERCENTILE_METRICS)}")
    return items


def frozen_pairs(mapping: Mapping[str, Any] | None) -> tuple[tuple[str, Any], ...]:
    return tuple((mapping or {}).items())



def expected_prompt_tokens(req: BenchRequest) -> int:
    """A prompt's length in tokens, roughly, for the memory estimate."""
    if req.dataset == "random":
        return req.random_prefix_len + math.ceil(req.random_input_len * (1 + req.random_range_ratio))
    if req.dataset == "prefix-repetition":
        return req.prefix_repetition_prefix_len + req.prefix_repetition_suffix_len
    if req.dataset == "multi-turn":
        return req.multi_turn_turns * (req.multi_turn_input_len + req.multi_turn_output_len)
    return SHAREGPT_MAX_PROMPT_LEN if req.dataset == "sharegpt" else round(SYNTHETIC_SHAREGPT_MEANS[0] * 2)


__all__ = [
    "BACKENDS",
    "DATASETS",
    "DEFAULT_ENDPOINTS",
    "BenchRequest",
    "expected_prompt_tokens",
    "frozen_pairs",
    "parse_goodput",
    "parse_percentile_metrics",
    "parse_percentiles",
    "parse_rate",
    "stream_deadline_s",
]
