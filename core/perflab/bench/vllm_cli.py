"""The ``vllm bench serve`` command for a :class:`~perflab.bench.request.BenchRequest`: one
builder for the command the ``vllm-bench`` backend runs and the "equivalent command" a study
report prints (:meth:`perflab.lab.plan.Profile.bench_command`).

Option names are vLLM's own: ``vllm/benchmarks/serve.py`` (``add_cli_args``: --backend,
--base-url, --endpoint, --request-rate, --burstiness, --max-concurrency, --goodput,
--percentile-metrics, --metric-percentiles, --save-result, --result-dir, --result-filename,
--ignore-eos, --temperature, --num-warmups, --header, --served-model-name) and
``vllm/benchmarks/datasets.py`` (``add_dataset_parser``: --dataset-name, --dataset-path,
--random-input-len, --random-output-len, --random-range-ratio, --random-prefix-len,
--sharegpt-output-len, --prefix-repetition-*), vLLM 0.33.
"""

from __future__ import annotations

import math
from pathlib import Path

from perflab.bench.request import BenchRequest
from perflab.contract.errors import UsageError

RESULT_FILENAME = "perflab-vllm-bench.json"
# vLLM's --dataset-name for perflab's datasets; synthetic-sharegpt has no vLLM counterpart
VLLM_DATASETS = {"random": "random", "sharegpt": "sharegpt", "prefix-repetition": "prefix_repetition"}
# the file vLLM's docs download for --dataset-name sharegpt (what a report's command names
# when perflab generated ShareGPT-like conversations instead)
SHAREGPT_FILE = "ShareGPT_V3_unfiltered_cleaned_split.json"


def vllm_tokenizer_dir(spec: str | None) -> str | None:
    """``--tokenizer`` for vLLM: a directory or hub id, never a ``tokenizer.json`` file.

    vLLM loads it with ``AutoTokenizer.from_pretrained`` (vllm/benchmarks/serve.py ->
    ``get_tokenizer``), which takes a directory (or a hub id); perflab accepts the
    ``tokenizer.json`` file itself, so the file's directory is passed. perflab's own
    ``whitespace``/``approx`` have no vLLM counterpart: nothing is passed (vLLM then uses
    ``--model``)."""
    if spec in (None, "", "auto", "whitespace", "approx", "none"):
        return None
    path = Path(spec).expanduser()
    if path.is_file():
        return str(path.resolve().parent)
    return str(spec)


def _num(value: float) -> str:
    """A number as a short, exact command-line value: ``inf``, ``1``, ``0.5``, ``0.123456789``."""
    if math.isinf(value):
        return "inf"
    short = f"{value:g}"
    return short if float(short) == value else repr(float(value))


def _options(*pairs: tuple[str, object | None]) -> list[str]:
    """``[flag, value, ...]`` for the pairs whose value is not None."""
    out: list[str] = []
    for flag, value in pairs:
        if value is not None:
            out += [flag, _num(value) if isinstance(value, float) else str(value)]
    return out


def vllm_bench_argv(req: BenchRequest, result_dir: str | None = None, executable: list[str] | None = None) -> list[str]:
    """The ``vllm bench serve`` command for ``req``.

    With ``result_dir`` it is the command the ``vllm-bench`` backend runs: one endpoint
    (``--base-url``), every workload option spelled out (vLLM's defaults change between
    versions), the client-side options (tokenizer, goodput, warm-ups, headers) and
    ``--save-result`` into ``result_dir``. Without, it is the equivalent command a report
    prints: the workload only, the options left at vLLM's defaults omitted, no address; a
    dataset vLLM does not have (synthetic-sharegpt) is named as the real ShareGPT file.
    """
    run = result_dir is not None
    dataset = req.dataset
    if dataset == "synthetic-sharegpt" and not run:
        dataset = "sharegpt"  # the closest command reads the real file
    if dataset not in VLLM_DATASETS:
        raise UsageError(f"--bench-backend vllm-bench: vLLM has no dataset {req.dataset!r} (use random, sharegpt or prefix-repetition)")
    if run and len(req.base_urls) != 1:
        raise UsageError("--bench-backend vllm-bench drives one endpoint; use the built-in client (perflab) for replicas")
    rate = req.request_rate * req.time_scale
    argv = [*(executable or ["vllm"]), "bench", "serve", "--model", req.model]
    argv += _options(("--served-model-name", req.served_model_name or None), ("--backend", req.backend))
    if run:
        from perflab.bench.client import make_target

        target = make_target(req.base_urls[0], req.api_endpoint)
        host = f"[{target.host}]" if ":" in target.host else target.host
        argv += ["--base-url", f"{target.scheme}://{host}:{target.port}", "--endpoint", target.path]
    else:
        argv += ["--endpoint", req.api_endpoint]
    argv += ["--dataset-name", VLLM_DATASETS[dataset]]
    if req.dataset_path or dataset == "sharegpt":
        argv += ["--dataset-path", str(req.dataset_path or SHAREGPT_FILE)]
    if dataset == "random":
        argv += _options(
            ("--random-input-len", req.random_input_len), ("--random-output-len", req.random_output_len),
            ("--random-range-ratio", float(req.random_range_ratio) if run or req.random_range_ratio else None),
            ("--random-prefix-len", req.random_prefix_len if run or req.random_prefix_len else None),
        )
    elif dataset == "sharegpt":
        argv += _options(("--sharegpt-output-len", req.sharegpt_output_len or None))
    else:
        argv += _options(
            ("--prefix-repetition-prefix-len", req.prefix_repetition_prefix_len),
            ("--prefix-repetition-suffix-len", req.prefix_repetition_suffix_len),
            ("--prefix-repetition-num-prefixes", req.prefix_repetition_num_prefixes),
            ("--prefix-repetition-output-len", req.prefix_repetition_output_len),
        )
    finite = not math.isinf(rate)
    argv += _options(
        ("--num-prompts", req.num_prompts),
        ("--request-rate", float(rate) if run or finite else None),
        ("--burstiness", float(req.burstiness) if run or (finite and req.burstiness != 1.0) else None),
        ("--max-concurrency", req.max_concurrency or None),
        ("--seed", req.seed),
    )
    if result_dir is None:
        return argv
    argv += [
        "--percentile-metrics", "ttft,tpot,itl,e2el",
        "--metric-percentiles", ",".join(f"{p:g}" for p in req.percentiles),
        "--save-result", "--result-dir", result_dir, "--result-filename", RESULT_FILENAME, "--disable-tqdm",
    ]  # fmt: skip
    argv += _options(("--tokenizer", vllm_tokenizer_dir(req.tokenizer)), ("--temperature", req.temperature),
                     ("--num-warmups", req.warmup or None))
    if req.goodput:
        argv += ["--goodput", *(f"{k}:{v:g}" for k, v in req.goodput)]
    if req.send_ignore_eos:  # vLLM 0.33 turns it on for random by itself; said for older ones
        argv.append("--ignore-eos")
    if req.headers:
        argv += ["--header", *(f"{k}={v}" for k, v in req.headers)]
    if req.save_detailed:
        argv.append("--save-detailed")
    return argv
