"""``perflab bench``: benchmark any OpenAI-compatible endpoint with vllm bench serve's metrics."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

import click

from perflab.bench.request import DATASETS, STREAM_DEADLINE_FLOOR_TOK_S, STREAM_DEADLINE_MIN_S
from perflab.cli.options import parse_json_object
from perflab.contract.errors import PerflabError, UsageError

# Options whose tokens may follow them without repeating the flag, as argparse's nargs="+"
# in vllm bench serve: --goodput ttft:500 tpot:50 e2el:20000.
_GREEDY = ("--goodput",)


class _BenchCommand(click.Command):
    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        out: list[str] = []
        i = 0
        while i < len(args):
            arg = args[i]
            out.append(arg)
            i += 1
            if arg in _GREEDY:
                values = []
                while i < len(args) and not args[i].startswith("-"):
                    values.append(args[i])
                    i += 1
                out.append(" ".join(values))
        return super().parse_args(ctx, out)


# option name -> BenchRequest field, for options that map one to one
_FIELDS = (
    "model", "backend", "endpoint", "served_model_name", "dataset", "dataset_path", "num_prompts",
    "random_input_len", "random_output_len", "random_range_ratio", "random_prefix_len",
    "sharegpt_output_len", "prefix_repetition_prefix_len", "prefix_repetition_suffix_len",
    "prefix_repetition_num_prefixes", "prefix_repetition_output_len", "multi_turn_turns",
    "multi_turn_input_len", "multi_turn_output_len", "burstiness",
    "max_concurrency", "seed", "warmup", "timeout", "tokenizer", "temperature", "label",
    "result_dir", "result_filename", "workers", "http_stack", "time_scale", "profile", "stall_s",
    "ignore_eos",
)  # fmt: skip

# Exit codes of `perflab bench` (docs/benchmark.md): 0 every request succeeded; 1 nothing
# measured (every request failed, or the server/client failed); 2 a usage error; 3 the run
# finished but some requests failed; 4 the stall watchdog stopped the run; 5 the server's
# token counts were impossible for some requests (they failed; the figures cannot be trusted).
EXIT_SOME_FAILED = 3
EXIT_STALLED = 4
EXIT_IMPOSSIBLE_COUNTS = 5


@click.command(cls=_BenchCommand, context_settings={"show_default": True})
@click.option("--base-url", "base_urls", multiple=True, required=True, metavar="URL", help="Endpoint base URL, e.g. http://127.0.0.1:8000 (repeat for replicas: requests are spread round-robin, metrics aggregated).")
@click.option("--model", required=True, help="Model name the server serves.")
@click.option("--served-model-name", help="Name sent in requests, if it differs from --model.")
@click.option("--backend", type=click.Choice(["openai-chat", "openai"]), default=None, help="openai-chat: /v1/chat/completions; openai: /v1/completions  [default: openai-chat]")
@click.option("--endpoint", help="API path (default by backend).")
@click.option("--profile", metavar="NAME", help="A seed workload: " + "sharegpt|throughput|long-context|generation-heavy|sharegpt-inf|sharegpt-c4|random-128-4|random-2000-100|random-4000-200|random-32000-100.")
@click.option("--dataset", type=click.Choice(list(DATASETS)), default=None, help="Prompt source  [default: random]")
@click.option("--dataset-path", type=click.Path(dir_okay=False), help="Local ShareGPT JSON (nothing is downloaded).")
@click.option("--num-prompts", type=int, default=None, help="Requests to send  [default: 1000]")
@click.option("--random-input-len", type=int, default=None, help="Prompt tokens (random)  [default: 1024]")
@click.option("--random-output-len", type=int, default=None, help="Output tokens asked (random)  [default: 128]")
@click.option("--random-range-ratio", type=float, default=None, help="Lengths drawn in [L(1-r), L(1+r)]  [default: 0]")
@click.option("--random-prefix-len", type=int, default=None, help="Shared prefix tokens before each random prompt  [default: 0]")
@click.option("--sharegpt-output-len", type=int, default=None, help="Fixed output length for ShareGPT.")
@click.option("--prefix-repetition-prefix-len", type=int, default=None, help="[default: 256]")
@click.option("--prefix-repetition-suffix-len", type=int, default=None, help="[default: 256]")
@click.option("--prefix-repetition-num-prefixes", type=int, default=None, help="[default: 10]")
@click.option("--prefix-repetition-output-len", type=int, default=None, help="[default: 128]")
@click.option("--multi-turn-turns", type=int, default=None, help="Turns per conversation (multi-turn): each prompt is the conversation so far plus a new message  [default: 4]")
@click.option("--multi-turn-input-len", type=int, default=None, help="Tokens of each new user message (multi-turn)  [default: 128]")
@click.option("--multi-turn-output-len", type=int, default=None, help="Output tokens of each answer (multi-turn)  [default: 128]")
@click.option("--request-rate", default=None, metavar="RATE|inf", help="Requests per second, or inf (all at once)  [default: inf]")
@click.option("--burstiness", type=float, default=None, help="Gamma shape of the arrivals; 1 = Poisson  [default: 1]")
@click.option("--max-concurrency", type=int, default=None, help="Most requests in flight at once.")
@click.option("--seed", type=int, default=None, help="Dataset and arrival seed  [default: 0]")
@click.option("--goodput", "goodput", default=None, metavar="METRIC:MS ...", help="SLOs for goodput: ttft:MS tpot:MS e2el:MS.")
@click.option("--percentiles", "--metric-percentiles", "percentiles", default=None, metavar="P,P", help="Percentiles to report  [default: 99]")
@click.option("--percentile-metrics", default=None, metavar="M,M", help="Block sections among latency,ttft,tpot,itl,e2el  [default: ttft,tpot,itl]")
@click.option("--warmup", type=int, default=None, help="Warm-up requests before measuring  [default: 0]")
@click.option("--timeout", type=float, default=None, help=f"Per-request timeout, wall-clock seconds  [default: a started stream {STREAM_DEADLINE_MIN_S:g} s + max_tokens at {STREAM_DEADLINE_FLOOR_TOK_S:g} token/s after its first byte; before it, 6 h]")
@click.option("--tokenizer", default=None, metavar="PATH|whitespace|approx", help="tokenizer.json or model directory; default: whitespace on perflab's simulator, the model directory's tokenizer, else approximate.")
@click.option("--ignore-eos/--no-ignore-eos", default=None, help="Ask the server to ignore EOS (exact output lengths)  [default: on for the random dataset, as vLLM 0.33]")
@click.option("--engine", default=None, metavar="NAME", help="The engine behind the endpoint (an installed engine plugin): only the request extensions it takes are sent (transformers serve refuses ignore_eos; output lengths are then counted, not forced).")
@click.option("--temperature", type=float, default=None, help="Sampling temperature  [default: not sent: the server's default, as vLLM 0.33]")
@click.option("--stall-s", type=float, default=None, help="Stop the run as stalled when no open stream has received anything for this many seconds of engine time; 0: never  [default: 60]")
@click.option("--header", "headers", multiple=True, metavar="KEY=VALUE", help="Extra HTTP header (repeatable).")
@click.option("--extra-body", default=None, metavar="JSON", help="JSON object merged into every request body.")
@click.option("--continuous-usage-stats", is_flag=True, default=False, help="Ask for usage on every chunk (exact tokens per chunk; vLLM, SGLang, TensorRT-LLM).")
@click.option("--label", default=None, help="Result label (file name prefix).")
@click.option("--save-result", is_flag=True, default=False, help="Write the JSON result (vllm bench serve field names).")
@click.option("--save-detailed", is_flag=True, default=False, help="Add per-request lists to the saved JSON.")
@click.option("--result-dir", default=None, type=click.Path(file_okay=False), help="Directory for --save-result.")
@click.option("--result-filename", default=None, help="File name for --save-result.")
@click.option("--workers", type=int, default=None, help="Client processes (for loads one core cannot drive)  [default: 1]")
@click.option("--http-stack", type=click.Choice(["raw", "aiohttp"]), default=None, help="HTTP client: raw (fastest) or aiohttp (proxies; needs perflab[aiohttp])  [default: raw]")
@click.option("--time-scale", type=float, default=None, help="Simulated time compression (auto from perflab's simulator).")
@click.option("--clock", type=click.Choice(["auto", "host"]), default="auto", help="How requests are timed: auto = by perflab's simulator's own model clock when the server proves to be it (reproducible whatever the host does), else by this host's clock; host = always this host's clock.")
@click.option("--bench-backend", default="perflab", help="Benchmark driver: perflab, vllm-bench, or a plugin's.")
@click.option("--json", "as_json", is_flag=True, help="Print the JSON result instead of the block.")
def bench(**kw: Any) -> None:
    """Benchmark an OpenAI-compatible streaming endpoint.

    Prints vllm bench serve's "Serving Benchmark Result" block (or --json), with its metric
    definitions: TTFT, TPOT, ITL, E2EL, throughputs, peak concurrency, goodput.

    Example: perflab bench --base-url http://127.0.0.1:8000 --model Qwen/Qwen3-8B
    --random-input-len 128 --random-output-len 16 --num-prompts 200 --max-concurrency 32

    Exit codes: 0 all requests succeeded; 1 nothing measured (all failed, server or client
    error); 2 usage error; 3 some requests failed (the result is printed); 4 stalled (no
    token on any open stream for --stall-s; the partial result is printed); 5 the server's
    token counts (usage) were impossible for some requests: negative, a zero prompt, more
    output than max_tokens, or far from the streamed chunks (those requests count as failed;
    the result is printed, docs/benchmark.md "Token counts").

    A stream that has started is cut after a limit derived from its max_tokens (see
    --timeout; an error for that request).
    """
    from perflab.bench import BenchRequest, run_benchmark_sync
    from perflab.bench.profiles import apply_profile
    from perflab.bench.request import (
        frozen_pairs,
        parse_goodput,
        parse_percentile_metrics,
        parse_percentiles,
        parse_rate,
    )

    values: dict[str, Any] = {k: kw[k] for k in _FIELDS if kw.get(k) is not None}
    if kw["request_rate"] is not None:
        values["request_rate"] = parse_rate(kw["request_rate"])
    if kw["goodput"]:
        values["goodput"] = parse_goodput(kw["goodput"])
    if kw["percentiles"] is not None:
        values["percentiles"] = parse_percentiles(kw["percentiles"])
    if kw["percentile_metrics"] is not None:
        values["percentile_metrics"] = parse_percentile_metrics(kw["percentile_metrics"])
    if kw["headers"]:
        values["headers"] = tuple(_pair(h, "--header") for h in kw["headers"])
    if kw["extra_body"]:
        values["extra_body"] = frozen_pairs(parse_json_object(kw["extra_body"], "--extra-body", example='{"top_p": 0.9}'))
    for flag in ("continuous_usage_stats", "save_result", "save_detailed"):
        if kw[flag]:
            values[flag] = True
    if not values.get("model"):
        raise UsageError("--model is required (the model name the server serves)")

    values["server_clock"] = kw["clock"] == "auto"
    if kw["engine"]:
        values["extensions"] = _engine_extensions(kw["engine"])
    req = BenchRequest(base_urls=tuple(kw["base_urls"]), **values)
    req = apply_profile(req, explicit=set(values)).validate()

    progress = _progress_printer() if sys.stderr.isatty() and not kw["as_json"] else None
    if kw["bench_backend"] == "perflab":
        result = run_benchmark_sync(req, progress)
    else:
        from perflab.bench.backends import get_backend
        from perflab.cli import get_pm

        result = get_backend(kw["bench_backend"], get_pm())(req)
    if progress is not None:
        click.echo("", err=True)

    if kw["as_json"]:
        click.echo(json.dumps(result.to_json(), indent=2))
    else:
        click.echo(result.format_block())
    if result.errors:
        failed = result.metrics.failed or 0
        click.echo(f"perflab: {failed} request(s) failed; first errors:", err=True)
        for err in result.errors[:5]:
            click.echo(f"  {err}", err=True)
    if result.info.get("output_lengths") == "counted":
        click.echo("perflab: output lengths were not forced (the engine refuses ignore_eos): the output tokens are "
                   "those it generated, each answer up to max_tokens", err=True)
    if "result_path" in result.info:
        click.echo(f"perflab: result saved to {result.info['result_path']}", err=True)
    if result.stall is not None:
        click.echo(f"perflab: {result.stall.message()}", err=True)
        sys.exit(EXIT_STALLED)
    impossible = int(result.metrics.usage_mismatches or 0)
    if impossible:
        over = int(result.metrics.over_max_tokens or 0)
        beyond = f", {over} of them beyond max_tokens" if over else ""
        click.echo(f"perflab: the server reported impossible token counts for {impossible} request(s){beyond}; "
                   f"they count as failed; exit code {EXIT_IMPOSSIBLE_COUNTS}", err=True)
        sys.exit(EXIT_IMPOSSIBLE_COUNTS)
    if not result.metrics.completed:
        raise PerflabError(f"all {result.metrics.failed or 0} requests failed: {result.errors[0] if result.errors else 'no error recorded'}")
    failed = int(result.metrics.failed or 0)
    if failed:
        total = failed + int(result.metrics.completed or 0)
        click.echo(f"perflab: {failed} of {total} requests failed ({failed / total:.0%}); exit code {EXIT_SOME_FAILED}", err=True)
        sys.exit(EXIT_SOME_FAILED)


def _engine_extensions(name: str) -> tuple[str, ...] | None:
    """The request extensions engine ``name``'s server takes (None: all of perflab's)."""
    from perflab.cli import get_pm

    return get_pm().engine(name).bench_extensions()


def _pair(item: str, what: str) -> tuple[str, str]:
    key, sep, value = item.partition("=")
    if not sep or not key.strip():
        raise UsageError(f"{what} {item!r}: expected KEY=VALUE")
    return key.strip(), value.strip()


def _progress_printer() -> Callable[[int, int], None]:
    def progress(done: int, total: int) -> None:
        sys.stderr.write(f"\rperflab bench: {done}/{total} requests done")
        sys.stderr.flush()

    return progress
