"""``perflab eval``: score an OpenAI-compatible endpoint on an accuracy task (lm-evaluation-harness)."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import click

from perflab.accuracy.tasks import SHIPPED_TASK
from perflab.contract.errors import PerflabError, UsageError

# Exit codes of `perflab eval` (docs/user-guide.md, "Accuracy"): 0 scored; 1 the endpoint
# failed the evaluation (unreachable, HTTP errors, timeouts) or lm-eval did; 2 a usage error
# (an unknown task, a bad option); 3 lm-eval is not installed (pip install 'perflab[accuracy]').

_HEADERS = ("dataset", "metric", "mode", "score", "samples")


@click.command(context_settings={"show_default": True})
@click.option("--base-url", required=True, metavar="URL", help="Endpoint base URL, e.g. http://127.0.0.1:8000.")
@click.option("--model", required=True, help="Model name the server serves.")
@click.option("--served-model-name", help="Name sent in requests, if it differs from --model.")
@click.option("--task", default=SHIPPED_TASK, metavar="NAME|FILE",
              help=f"{SHIPPED_TASK} (shipped, offline), an lm-eval task or group (gsm8k, mmlu, ...: needs its "
                   "data, online or in the HF datasets cache), a .jsonl of question/answer items, or an lm-eval task .yaml.")
@click.option("--api", type=click.Choice(["chat", "completions"]), default="chat",
              help="chat: /v1/chat/completions with the server's chat template; completions: /v1/completions "
                   "(plain-text prompts; needed for log-likelihood tasks such as mmlu).")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Score only the first N items  [default: all]")
@click.option("--concurrency", type=click.IntRange(min=1), default=8, help="Requests in flight at once.")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=300.0, help="Per-request timeout, seconds.")
@click.option("--max-gen-toks", type=click.IntRange(min=1), default=256, help="Most tokens generated per answer.")
@click.option("--label", default=None, help="Result label (file name prefix).")
@click.option("--save-result", is_flag=True, default=False, help="Write the JSON result (the score, the endpoint, the time, perflab's version).")
@click.option("--result-dir", default=None, type=click.Path(file_okay=False), help="Directory for --save-result  [default: .]")
@click.option("--result-filename", default=None, help="File name for --save-result  [default: {label}-{task}-{model}-{date}.json]")
@click.option("-v", "--verbose", is_flag=True, help="Show lm-eval's log and progress bars on stderr.")
@click.option("--json", "as_json", is_flag=True, help="Print the JSON result instead of the table.")
def eval_(**kw: Any) -> None:
    """Score an OpenAI-compatible endpoint on an accuracy task.

    lm-evaluation-harness (the perflab[accuracy] extra) sends the task's prompts and scores
    the answers; perflab prints the primary metric as a table (dataset, metric, mode, score in
    points 0..100, samples) or --json. The default task, perflab_arith, ships with perflab
    (200 arithmetic word problems in gsm8k's format, 3-shot, exact match on the number after
    "####"): it needs no network.

    An API key is read from OPENAI_API_KEY, as perflab bench and lm-eval read it; it is sent,
    never printed or saved.

    Example: perflab eval --base-url http://127.0.0.1:8000 --model Qwen/Qwen3-8B --limit 100

    Exit codes: 0 scored; 1 the endpoint failed the evaluation (unreachable, HTTP errors,
    timeouts: no score); 2 usage error (unknown task, bad option); 3 lm-eval is not installed.
    """
    import anyio

    from perflab import redact
    from perflab.accuracy import harness

    harness.ensure_available()  # before anything else: one line when the extra is missing
    if kw["task"] == SHIPPED_TASK or kw["task"].lower().endswith(".jsonl"):
        # local data: nothing may reach for the hub (datasets reads these on import, which is later)
        os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
    spec = harness.resolve_task(kw["task"])
    harness.configure_logging(kw["verbose"])
    if not kw["verbose"]:
        import logging

        # its retries of an unreachable hub, one warning each: the final one-line error says it
        logging.getLogger("huggingface_hub").setLevel(logging.ERROR)
    api_key = os.environ.get("OPENAI_API_KEY") or None
    if api_key:
        redact.register([api_key])
    model = kw["served_model_name"] or kw["model"]
    base_url = harness.api_base(kw["base_url"])
    endpoint = redact.scrub(harness.redact_url(base_url))

    # the result's folder is made and checked before the evaluation, not after it (a score lost)
    directory = _result_dir(kw["result_dir"], kw["result_filename"]) if kw["save_result"] else None

    show = sys.stderr.isatty() and not kw["as_json"] and not kw["verbose"]
    progress = _progress_printer() if show else None
    if show:
        click.echo(f"perflab eval: {spec.name} on {endpoint} ({kw['api']} API, {kw['concurrency']} at a time)", err=True)
    result = anyio.run(lambda: harness.evaluate(
        base_url, model, task=kw["task"], api=kw["api"], limit=kw["limit"], concurrency=kw["concurrency"],
        timeout_s=kw["timeout"], api_key=api_key, max_gen_toks=kw["max_gen_toks"], progress=progress))
    if progress is not None:
        click.echo("", err=True)

    # a score from perflab's simulator is the simulator's accuracy model, not a model's: said
    simulated = _is_simulated(base_url, api_key)
    out = {**result.to_json(), "simulated": simulated}
    if kw["as_json"]:
        click.echo(redact.scrub(json.dumps(out, indent=2)))
    else:
        click.echo(redact.scrub(format_table([result], simulated=simulated)))
    if kw["save_result"]:
        record = {**out, "perflab": {
            "version": _version(), "base_url": endpoint, "endpoint": redact.scrub(harness.redact_url(
                base_url.rstrip("/") + harness.API_PATHS[result.api])),
            "model": kw["model"], "served_model_name": model, "limit": kw["limit"], "concurrency": kw["concurrency"],
            "timeout_s": kw["timeout"], "max_gen_toks": kw["max_gen_toks"], "task_arg": kw["task"], "simulated": simulated,
            "date": datetime.now().astimezone().isoformat(timespec="seconds"), "label": kw["label"]}}
        assert directory is not None
        path = directory / Path(kw["result_filename"] or _default_filename(kw["label"], result.task, kw["model"])).name
        try:
            redact.write_text(path, json.dumps(record, indent=2) + "\n")
        except OSError as exc:
            raise PerflabError(f"--save-result: cannot write {path}: {exc.strerror or exc}") from None
        click.echo(f"perflab: result saved to {path}", err=True)


def _result_dir(result_dir: str | None, filename: str | None) -> Path:
    """The folder --save-result writes into (made if missing), or a usage error saying why it cannot."""
    base = Path(result_dir) if result_dir else Path.cwd()
    directory = (base / filename).parent if filename else base
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--save-result: cannot create the folder {directory}: {exc.strerror or exc}") from None
    if not os.access(directory, os.W_OK | os.X_OK):
        raise UsageError(f"--save-result: the folder {directory} is not writable")
    return directory


def _is_simulated(base_url: str, api_key: str | None) -> bool:
    """Whether the endpoint runs on a faster clock of its own, a simulator's (it stamps every
    answer with its time scale, :data:`perflab.bench.serverclock.TIME_SCALE_HEADER`, as
    ``perflab bench`` recognises it)."""
    import httpx

    from perflab.bench.serverclock import TIME_SCALE_HEADER

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        response = httpx.get(base_url.rstrip("/") + "/v1/models", headers=headers, timeout=5.0)
    except (httpx.HTTPError, ValueError):
        return False
    return TIME_SCALE_HEADER in response.headers


def format_table(results: list[Any], *, simulated: bool = False) -> str:
    """Seed 003's accuracy table: dataset | metric | mode | score | samples (Markdown)."""
    rows = [(r.task, f"{r.metric} ({r.filter})" if r.filter not in ("none", "") else r.metric, r.mode,
             f"{r.score:.2f}" + (f" ± {r.stderr:.2f}" if r.stderr is not None else ""), str(r.samples)) for r in results]
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(_HEADERS)]

    def line(cells: tuple[str, ...]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    out = [line(_HEADERS), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out.extend(line(row) for row in rows)
    tail = results[0] if results else None
    if tail is not None:
        sim = "; simulated engine: the score is its accuracy model's" if simulated else ""
        out.append(f"({tail.harness}, {tail.api} API, {tail.seconds:.1f} s{sim})")
    return "\n".join(out)


def _default_filename(label: str | None, task: str, model: str) -> str:
    short = model.rstrip("/").split("/")[-1] or "model"
    return f"{label or 'eval'}-{task}-{short}-{datetime.now().strftime('%Y%m%d-%H%M%S')}.json"


def _version() -> str:
    from perflab import __version__

    return __version__


def _progress_printer() -> Callable[[int, int], None]:
    def progress(done: int, total: int) -> None:
        sys.stderr.write(f"\rperflab eval: {done}/{total} answers")
        sys.stderr.flush()

    return progress


eval_.name = "eval"
