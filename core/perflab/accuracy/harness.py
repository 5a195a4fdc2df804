"""Score an OpenAI-compatible endpoint on an accuracy task with lm-evaluation-harness.

perflab does not write a harness: lm-evaluation-harness (``lm-eval[api]``, the
``perflab[accuracy]`` extra, pinned) sends the task's prompts to the endpoint through its
``local-chat-completions`` / ``local-completions`` models and scores the answers. This module
keeps the wrapper thin: it picks the task, builds lm-eval's API model with perflab's
concurrency, timeout and API key, runs it in a worker thread, and turns lm-eval's results dict
into an :class:`~perflab.accuracy.types.EvalResult`.

A task is

- ``perflab_arith``, the shipped offline task (``data/perflab_arith.yaml`` and its JSONL);
- a local ``.jsonl`` file with the shipped task's fields (``question``; ``answer``, the worked
  solution ending in ``#### <number>``), scored as the shipped task is;
- a task ``.yaml`` file (lm-eval's task format; ``data_files`` relative to the file resolve
  against its folder);
- any lm-eval task or group by name (``gsm8k``, ``mmlu``...), where its data is available
  (downloaded from the Hugging Face hub when online, else from the HF datasets cache).

The score is the task's primary metric: the first of its ``metric_list`` after the first of its
``filter_list`` (gsm8k and perflab_arith: ``exact_match`` after ``strict-match``, the number
after "####"), in points (0..100).

An endpoint that refuses, errors or times out gives :class:`EndpointFailed` naming it, never a
score. The API key travels in the request header lm-eval sends (its ``header`` argument) and
is registered with :mod:`perflab.redact`: it is never written, logged or put in the process
environment (two evaluations of two engines may run at once in one process).
"""

from __future__ import annotations

import asyncio
import difflib
import functools
import importlib
import importlib.util
import json
import logging
import math
import random
import re
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.from_thread
import anyio.lowlevel

from perflab import __version__, redact
from perflab.accuracy.tasks import SHIPPED_TASK
from perflab.accuracy.types import EvalResult
from perflab.contract.errors import PerflabError, UsageError

INSTALL_HINT = "pip install 'perflab[accuracy]'"
# lm-eval[api]'s own imports (lm_eval/models/api_models.py) and the datasets loader
_REQUIRED_MODULES = ("lm_eval", "aiohttp", "tenacity", "requests", "tqdm", "datasets")

API_PATHS: dict[str, str] = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
MAX_RETRIES = 2  # lm-eval's attempts per request (tenacity, 1-10 s back-off): a dead server fails fast
# lm-eval's bootstrap resamples for the stderr of metrics that are not a mean (a mean's stderr
# is closed-form); its default 100000 takes minutes
BOOTSTRAP_ITERS = 1000

# lm-eval reports these metrics as fractions: perflab's scores are points (0..100)
_FRACTION_METRICS = frozenset({"acc", "acc_norm", "acc_mutual_info", "exact_match", "f1", "mcc", "em",
                               "contains", "pass@1", "pass_at_1"})
# these are already on a 0..100 scale (sacrebleu)
_POINT_METRICS = frozenset({"bleu", "chrf", "ter"})
_LOGLIKELIHOOD_TYPES = frozenset({"loglikelihood", "loglikelihood_rolling", "multiple_choice"})

class AccuracyUnavailable(PerflabError):
    """lm-evaluation-harness (the ``perflab[accuracy]`` extra) is not installed."""

    exit_code = 3


class EndpointFailed(PerflabError):
    """The endpoint failed the evaluation's requests (unreachable, an HTTP error, a timeout,
    an answer that is not an OpenAI completion): there is no score."""

    def __init__(self, endpoint: str, reason: str) -> None:
        self.endpoint, self.reason = endpoint, reason
        super().__init__(f"{endpoint}: {reason}")


class _NotACompletion(ValueError):
    """An HTTP 200 whose body is not an OpenAI completion (lm-eval's chat model would score it
    as an empty answer: a wrong one)."""


class _Stopped(Exception):
    """The caller gave up on the evaluation (cancelled): the worker's remaining requests stop."""


def ensure_available() -> None:
    """Raise :class:`AccuracyUnavailable`, with the one-line install hint, unless lm-eval and
    its API models' dependencies import."""
    # find_spec, not import: the caller may still set the HF_* environment datasets reads on import
    missing = []
    for name in _REQUIRED_MODULES:
        try:
            found = sys.modules[name] is not None if name in sys.modules else importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing.append(name)
    if missing:
        raise AccuracyUnavailable(
            f"accuracy evaluation needs lm-evaluation-harness ({', '.join(missing)} not installed): {INSTALL_HINT}")


# ================================================================== tasks


@dataclass(frozen=True)
class TaskSpec:
    """What to hand lm-eval's TaskManager for the ``task`` a user named."""

    name: str  # the name lm-eval's results use
    spec: str | dict[str, Any]  # a registered name, a YAML path, or an inline task config
    needs_index: bool  # lm-eval's own task index is needed (a name, a group of named tasks): seconds to build


def shipped_yaml() -> Path:
    from perflab.accuracy.tasks import data_path

    return data_path().with_suffix(".yaml")


def resolve_task(task: str) -> TaskSpec:
    """The task spec for ``--task``; :class:`UsageError` for a file that is not one."""
    task = task.strip()
    if not task:
        raise UsageError("--task is empty: a task name (perflab_arith, gsm8k, ...) or a .jsonl/.yaml file")
    if task == SHIPPED_TASK:
        return TaskSpec(SHIPPED_TASK, _shipped_config(), needs_index=False)
    path = Path(task).expanduser()
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".yaml", ".yml") or path.is_file():
        if not path.is_file():
            raise UsageError(f"--task {task}: no such file")
        if suffix == ".jsonl":
            return _jsonl_task(path)
        if suffix in (".yaml", ".yml"):
            return _yaml_task(path)
        raise UsageError(f"--task {task}: a task file is a .jsonl (question/answer lines) or an lm-eval task .yaml")
    return TaskSpec(task, task, needs_index=True)


def _read_yaml(path: Path) -> dict[str, Any]:
    # lm-eval's own loader: `include:` and `!function` resolve against the file's folder
    from lm_eval.tasks._yaml_loader import load_yaml

    try:
        cfg = load_yaml(path, resolve_func=True)
    except Exception as exc:  # noqa: BLE001 - YAML, include and import errors all mean a bad task file
        raise UsageError(f"--task {path}: not a readable lm-eval task file ({_one_line(exc)})") from None
    if not isinstance(cfg, dict):
        raise UsageError(f"--task {path}: not an lm-eval task file (a mapping with 'task' or 'group')")
    return dict(cfg)


def _with_local_data(cfg: dict[str, Any], base: Path) -> dict[str, Any]:
    """``cfg`` with relative ``dataset_kwargs.data_files`` paths made absolute against ``base``
    (lm-eval hands them to ``datasets.load_dataset``, which reads them from the working directory)."""
    kwargs = dict(cfg.get("dataset_kwargs") or {})
    files = kwargs.get("data_files")
    if files is None:
        return cfg

    def fix(p: Any) -> Any:
        if isinstance(p, str) and "://" not in p and not Path(p).is_absolute() and (base / p).exists():
            return str((base / p).resolve())
        return p

    if isinstance(files, Mapping):
        kwargs["data_files"] = {k: [fix(x) for x in v] if isinstance(v, list) else fix(v) for k, v in files.items()}
    elif isinstance(files, list):
        kwargs["data_files"] = [fix(x) for x in files]
    else:
        kwargs["data_files"] = fix(files)
    return {**cfg, "dataset_kwargs": kwargs}


def _shipped_config() -> dict[str, Any]:
    import yaml

    path = shipped_yaml()
    return _with_local_data(yaml.safe_load(path.read_text(encoding="utf-8")), path.parent)


# what the shipped task's strict-match filter reads (perflab_arith.yaml, as gsm8k.yaml)
_STRICT_ANSWER = re.compile(r"#### (\-?[0-9\.\,]+)")


def _jsonl_task(path: Path) -> TaskSpec:
    """A JSONL of gsm8k-format items, scored as the shipped task: every line is checked, since
    an answer without its "#### <number>" would silently score as a wrong one."""
    items = 0
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UsageError(f"--task {path}: line {n} is not JSON ({exc.msg})") from None
        if (not isinstance(item, dict) or not isinstance(item.get("question"), str)
                or not isinstance(item.get("answer"), str) or not _STRICT_ANSWER.search(item["answer"])):
            raise UsageError(f"--task {path}: line {n} needs string fields 'question' and 'answer' "
                             "(the worked solution ending in '#### <number>', as gsm8k's)")
        items += 1
    if not items:
        raise UsageError(f"--task {path}: the file has no items")
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", path.stem) or "local"
    cfg = {**_shipped_config(), "task": name,
           "dataset_kwargs": {"data_files": {"test": str(path.resolve())}}}
    return TaskSpec(name, cfg, needs_index=False)


def _yaml_task(path: Path) -> TaskSpec:
    cfg = _read_yaml(path)
    if isinstance(cfg.get("task"), str) and "group" not in cfg:
        return TaskSpec(cfg["task"], _with_local_data(cfg, path.resolve().parent), needs_index=False)
    name = cfg.get("group") or cfg.get("task")
    if not isinstance(name, str):
        raise UsageError(f"--task {path}: not an lm-eval task file (no 'task' or 'group' name)")
    # a group names registered tasks: lm-eval loads it by path, with its index
    return TaskSpec(name, str(path.resolve()), needs_index=True)


@functools.cache
def _task_manager(needs_index: bool) -> Any:
    """lm-eval's TaskManager; with its own task index only when a task is looked up by name
    (scanning lm-eval's ~15000 task files takes seconds)."""
    from lm_eval.tasks import TaskManager

    return TaskManager(include_defaults=needs_index)


def _check_known(name: str, tm: Any) -> None:
    if name in tm.all_tasks:
        return
    near = difflib.get_close_matches(name, tm.all_tasks, n=3, cutoff=0.75)
    hint = f" (did you mean {', '.join(near)}?)" if near else ""
    raise UsageError(f"unknown task {name!r}{hint}: give {SHIPPED_TASK}, an lm-eval task or group name "
                     "(gsm8k, mmlu, ...), or a .jsonl/.yaml task file")


def check_task(task: str) -> None:
    """Raise the one-line UsageError for a task the harness would not run: a task file that is
    not one, or a name lm-eval does not know (its task index: seconds, for names only)."""
    spec = resolve_task(task)
    if spec.needs_index:
        _check_known(spec.name, _task_manager(True))


# ================================================================== lm-eval, quietly


class _Capture(logging.Handler):
    """Keeps the last server answer lm-eval logged on the thread that ran the request: the
    text of the HTTP error it then raises without."""

    _RESPONSE = re.compile(r"(?:Response text: |error message: )(.*?)\. Retrying", re.S)

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.local = threading.local()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            m = self._RESPONSE.search(record.getMessage())
        except Exception:  # noqa: BLE001 - a log record must never break the evaluation
            return
        if m:
            self.local.response = m.group(1)

    def take(self) -> str | None:
        text = getattr(self.local, "response", None)
        self.local.response = None
        return text


class _ScrubbingFormatter(logging.Formatter):
    """lm-eval logs a failed request's repr, headers (the API key) included."""

    def format(self, record: logging.LogRecord) -> str:
        return redact.scrub(super().format(record))


_CAPTURE = _Capture()
_state = {"configured": False, "verbose": False}
_state_lock = threading.Lock()


def configure_logging(verbose: bool = False) -> None:
    """lm-eval's logging and progress bars: by default neither reaches the terminal (its
    warnings about failed requests become :class:`EndpointFailed`'s message; perflab reports
    progress itself); ``verbose`` shows its INFO log and its progress bars on stderr."""
    with _state_lock:
        _state["verbose"] = verbose
        lm_log = logging.getLogger("lm_eval")
        lm_log.setLevel(logging.INFO if verbose else logging.WARNING)
        lm_log.propagate = False
        if _CAPTURE not in lm_log.handlers:
            lm_log.addHandler(_CAPTURE)
        stream = [h for h in lm_log.handlers if getattr(h, "_perflab_stderr", False)]
        if verbose and not stream:
            h = logging.StreamHandler(sys.stderr)
            h.setFormatter(_ScrubbingFormatter("lm-eval %(levelname)s %(name)s: %(message)s"))
            h._perflab_stderr = True  # type: ignore[attr-defined]
            lm_log.addHandler(h)
        elif not verbose:
            for old in stream:
                lm_log.removeHandler(old)
        _state["configured"] = True


def _quiet_progress_bars() -> None:
    """lm-eval's and datasets' tqdm bars: off unless verbose (lm-eval takes no option for the
    bars of its API models and task building: its module globals are wrapped, once; it is
    pinned); its git probe of the working directory: off."""
    import datasets
    import lm_eval.api.task as lm_task
    import lm_eval.evaluator as lm_evaluator
    import lm_eval.models.api_models as lm_api
    from tqdm import tqdm
    from tqdm.asyncio import tqdm_asyncio

    class QuietTqdm(tqdm):
        _perflab_quiet = True

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["disable"] = kwargs.get("disable", False) or not _state["verbose"]
            super().__init__(*args, **kwargs)

    class QuietTqdmAsyncio(tqdm_asyncio):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["disable"] = kwargs.get("disable", False) or not _state["verbose"]
            super().__init__(*args, **kwargs)

    with _state_lock:
        if not getattr(lm_api.tqdm, "_perflab_quiet", False):
            lm_api.tqdm = QuietTqdm
            lm_api.tqdm_asyncio = QuietTqdmAsyncio
            lm_task.tqdm = QuietTqdm
            # simple_evaluate records the git hash of the caller's working directory by running
            # `git describe`, whose "fatal: not a git repository" reaches the terminal outside
            # one; that hash says nothing about the endpoint scored
            lm_evaluator.get_git_commit_hash = lambda: None
    if _state["verbose"]:
        datasets.enable_progress_bars()
    else:
        datasets.disable_progress_bars()


@functools.cache
def _no_environment_probes() -> None:
    """lm-eval stamps its results with the working directory's git commit (running ``git``,
    whose "fatal: not a git repository" reaches the terminal) and, where torch is installed,
    torch's environment report (subprocesses, seconds): perflab keeps neither."""
    import lm_eval.evaluator as lm_evaluator

    lm_evaluator.get_git_commit_hash = lambda: None
    lm_evaluator.add_env_info = lambda storage: None


def _readable_choice(choice: Any, *, chat: bool) -> bool:
    """An OpenAI choice lm-eval can read: its ``index``, and the chat ``message.content`` (a
    string, or null: no answer, as a reasoning model cut before it answers gives) or the
    completion's ``text``."""
    if not isinstance(choice, dict) or not isinstance(choice.get("index"), int):
        return False
    if chat:
        message = choice.get("message")
        return isinstance(message, dict) and "content" in message and isinstance(message["content"], (str, type(None)))
    return isinstance(choice.get("text"), str)


def _quiet_unretrieved(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    if context.get("message") == "Task exception was never retrieved":
        return
    loop.default_exception_handler(context)


@functools.cache
def _lm_classes() -> dict[str, type]:
    """lm-eval's two OpenAI-compatible API models, each watched by perflab: progress, and a
    stop when the caller gives up."""
    from lm_eval.models.openai_completions import LocalChatCompletion, LocalCompletionsAPI

    class Watched:
        _stop: threading.Event
        _progress: Callable[[int, int], None] | None
        _header: dict[str, str]  # lm-eval's API model's (the class this one is mixed into)
        _done = 0
        _total = 0

        def _tick(self, n: int) -> None:
            self._done += n
            if self._progress is not None:
                self._progress(self._done, self._total)

        def _check(self) -> None:
            if self._stop.is_set():
                raise _Stopped()

        @property
        def header(self) -> dict[str, str]:
            # lm-eval reads the headers as it sends a request, after waiting for its turn
            # (its concurrency semaphore): the last moment to not send it
            self._check()
            return dict(self._header)

        def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
            self._total += len(requests)
            return super().generate_until(requests, disable_tqdm=True)  # type: ignore[misc]

        def loglikelihood(self, requests: list[Any], disable_tqdm: bool = False) -> list[Any]:
            self._total += len(requests)
            return super().loglikelihood(requests, disable_tqdm=True)  # type: ignore[misc]

        def parse_generations(self, outputs: Any, **kwargs: Any) -> list[str]:
            for out in outputs if isinstance(outputs, list) else [outputs]:
                if not isinstance(out, dict) or not isinstance(out.get("choices"), list) or not out["choices"]:
                    raise _NotACompletion(f"no choices in {_one_line(json.dumps(out, default=str), 120)}")
                for choice in out["choices"]:
                    # lm-eval turns a choice it cannot read into an empty answer: a wrong one
                    if not _readable_choice(choice, chat=isinstance(self, LocalChatCompletion)):
                        raise _NotACompletion(f"a choice without its answer: {_one_line(json.dumps(choice, default=str), 120)}")
            return super().parse_generations(outputs=outputs, **kwargs)  # type: ignore[misc]

        async def get_batched_requests(self, *args: Any, **kwargs: Any) -> Any:
            # lm-eval gathers the requests on a loop of its own (asyncio.run): when one fails
            # for good, the failures of the others are never retrieved, and asyncio would print
            # each with its traceback; the first is what perflab reports
            asyncio.get_running_loop().set_exception_handler(_quiet_unretrieved)
            return await super().get_batched_requests(*args, **kwargs)  # type: ignore[misc]

        async def amodel_call(self, *args: Any, **kwargs: Any) -> Any:
            self._check()
            out = await super().amodel_call(*args, **kwargs)  # type: ignore[misc]
            self._tick(len(out) if isinstance(out, list) else 1)
            return out

        def model_call(self, *args: Any, **kwargs: Any) -> Any:
            self._check()
            out = super().model_call(*args, **kwargs)  # type: ignore[misc]
            self._tick(1)
            return out

    class Chat(Watched, LocalChatCompletion):
        pass

    class Completions(Watched, LocalCompletionsAPI):
        pass

    return {"chat": Chat, "completions": Completions}


def _make_lm(api: str, url: str, model: str, *, concurrency: int, timeout_s: float, api_key: str | None,
             max_gen_toks: int, needs_tokenizer: bool, progress: Callable[[int, int], None] | None,
             stop: threading.Event) -> Any:
    header = {"User-Agent": f"perflab/{__version__} (lm-eval)"}
    if api_key:
        header["Authorization"] = f"Bearer {api_key}"
    kwargs: dict[str, Any] = dict(
        model=model, base_url=url, num_concurrent=concurrency, max_retries=MAX_RETRIES,
        timeout=max(1, math.ceil(timeout_s)), max_gen_toks=max_gen_toks, header=header, batch_size=1)
    if api == "completions" and needs_tokenizer:
        # log-likelihood tasks count prompt tokens: the server's /tokenize where it has one
        # (vLLM), else the model's Hugging Face tokenizer (lm-eval's "auto")
        kwargs.update(tokenizer_backend="auto", auth_token=api_key)
    else:
        # generation tasks send text: no tokenizer, nothing downloaded
        kwargs.update(tokenizer_backend=None, tokenized_requests=False)
    try:
        lm = _lm_classes()[api](**kwargs)
    except ImportError as exc:
        raise UsageError(
            f"a log-likelihood task needs {model}'s tokenizer: the server has no /tokenize and /tokenizer_info "
            f"(vLLM has them), and {exc.name or 'transformers'} is not installed to load it from the Hugging Face hub "
            "(pip install transformers)") from None
    except OSError as exc:  # transformers could not fetch the tokenizer (offline, gated, unknown name)
        raise PerflabError(f"a log-likelihood task needs {model}'s tokenizer, which could not be loaded: {_one_line(exc)}") from None
    lm._stop, lm._progress = stop, progress
    return lm


def _top_level(loaded: Mapping[str, Any]) -> list[Any]:
    """The groups and tasks the user named (not their children), as lm-eval built them."""
    children = {str(c) for kids in (loaded.get("group_map") or {}).values() for c in kids}
    groups = [g for name, g in loaded["groups"].items() if str(name) not in children]
    tasks = [t for name, t in loaded["tasks"].items() if str(name) not in children]
    return [*groups, *tasks]


def _evaluate_sync(*args: Any) -> EvalResult:
    """:func:`_evaluate` leaving the process's global random and numpy generators as it found
    them: lm-eval seeds them (and its task loading draws from them), the caller's sequences
    go on afterwards as if it had not run."""
    import numpy

    saved = random.getstate(), numpy.random.get_state()
    try:
        return _evaluate(*args)
    finally:
        random.setstate(saved[0])
        numpy.random.set_state(saved[1])


def _evaluate(spec: TaskSpec, base_url: str, model: str, api: str, limit: int | None, concurrency: int,
              timeout_s: float, api_key: str | None, max_gen_toks: int,
              progress: Callable[[int, int], None] | None, stop: threading.Event) -> EvalResult:
    import lm_eval

    if not _state["configured"]:
        configure_logging(False)
    _quiet_progress_bars()
    _no_environment_probes()
    url = base_url.rstrip("/") + API_PATHS[api]
    endpoint = redact.scrub(redact_url(url))
    tm = _task_manager(spec.needs_index)
    if isinstance(spec.spec, str) and not spec.spec.endswith((".yaml", ".yml")):
        _check_known(spec.name, tm)
    loaded = _load_task(tm, spec)
    top = _top_level(loaded)
    types = {str(t.get_config("output_type")) for t in loaded["tasks"].values()}
    if api == "chat" and types & _LOGLIKELIHOOD_TYPES:
        raise UsageError(f"task {spec.name} scores log-likelihoods ({', '.join(sorted(types & _LOGLIKELIHOOD_TYPES))}), "
                         "which chat completions cannot return: use --api completions")
    lm = _make_lm(api, url, model, concurrency=concurrency, timeout_s=timeout_s, api_key=api_key,
                  max_gen_toks=max_gen_toks, needs_tokenizer=bool(types & _LOGLIKELIHOOD_TYPES),
                  progress=progress, stop=stop)
    _CAPTURE.take()
    t0 = time.monotonic()
    try:
        results = lm_eval.simple_evaluate(
            model=lm, tasks=top, task_manager=tm, limit=limit, log_samples=True, bootstrap_iters=BOOTSTRAP_ITERS,
            apply_chat_template=api == "chat", fewshot_as_multiturn=api == "chat")
    except _Stopped:
        raise
    except PerflabError:
        raise
    except BaseException as exc:  # noqa: BLE001 - every failure of the run is the endpoint's or named as lm-eval's
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        raise _request_failure(exc, endpoint, timeout_s, _CAPTURE.take()) from None
    seconds = time.monotonic() - t0
    if not results:
        raise PerflabError(f"lm-eval returned no results for task {spec.name}")
    return result_from_lm_eval(results, spec.name, api=api, seconds=seconds,
                               harness=f"lm-eval {lm_eval.__version__}")


def _load_task(tm: Any, spec: TaskSpec) -> dict[str, Any]:
    try:
        loaded: dict[str, Any] = tm.load([spec.spec])
    except (KeyError, ValueError, TypeError) as exc:
        raise UsageError(f"task {spec.name}: {_one_line(exc)}") from None
    except Exception as exc:  # noqa: BLE001 - the data could not be had (offline, a missing file, the hub)
        raise PerflabError(
            f"task {spec.name}: its data could not be loaded ({_one_line(exc)}); offline, pre-populate the "
            "Hugging Face datasets cache (HF_DATASETS_OFFLINE=1 then reads it) or give --task a local .jsonl/.yaml") from None
    if not loaded.get("tasks"):
        raise UsageError(f"task {spec.name} has no tasks to run")
    return loaded


def _request_failure(exc: BaseException, endpoint: str, timeout_s: float, response: str | None) -> PerflabError:
    """One line for a failed evaluation request (lm-eval raises the last attempt's error)."""
    import aiohttp
    import requests

    if isinstance(exc, (aiohttp.ClientResponseError, requests.HTTPError)):
        status = exc.status if isinstance(exc, aiohttp.ClientResponseError) else getattr(exc.response, "status_code", "?")
        detail = _server_message(response) or (exc.message if isinstance(exc, aiohttp.ClientResponseError) else "")
        return EndpointFailed(endpoint, f"answered an evaluation request with HTTP {status}" + (f": {detail}" if detail else ""))
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError, requests.Timeout)):
        return EndpointFailed(endpoint, f"an evaluation request got no answer within {timeout_s:g} s (--timeout)")
    if isinstance(exc, (aiohttp.ClientConnectorError, requests.ConnectionError, ConnectionError)):
        return EndpointFailed(endpoint, f"cannot connect ({_one_line(exc)})")
    if isinstance(exc, aiohttp.ClientError):
        return EndpointFailed(endpoint, f"the connection failed ({type(exc).__name__}: {_one_line(exc)})")
    if isinstance(exc, (_NotACompletion, KeyError, IndexError, json.JSONDecodeError, aiohttp.ContentTypeError)):
        return EndpointFailed(endpoint, f"answered something that is not an OpenAI completion ({type(exc).__name__}: {_one_line(exc)})")
    return PerflabError(f"lm-eval failed evaluating {endpoint}: {type(exc).__name__}: {_one_line(exc)}")


def _server_message(text: str | None) -> str:
    if not text:
        return ""
    try:
        body = json.loads(text)
        err = body.get("error", body) if isinstance(body, dict) else body
        msg = err.get("message") if isinstance(err, dict) else err
        text = str(msg) if msg else text
    except (json.JSONDecodeError, AttributeError):
        pass
    return _one_line(text)


def _one_line(value: object, limit: int = 240) -> str:
    text = " ".join(str(value).split())
    text = redact.scrub(text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def api_base(base_url: str) -> str:
    """``base_url`` without a trailing ``/v1``: OpenAI clients are given ``http://host:port/v1``,
    and ``perflab bench`` and the agreement client take either."""
    base = base_url.rstrip("/")
    return base[: -len("/v1")] if base.endswith("/v1") else base


def redact_url(url: str) -> str:
    """``url`` without a password in it (``user:***@host``)."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    if parts.password:
        redact.register([parts.password])
        host = parts.hostname or ""
        netloc = f"{parts.username}:{redact.MASK}@{host}" + (f":{parts.port}" if parts.port else "")
        return urlunsplit(parts._replace(netloc=netloc))
    return url


# ================================================================== results


def result_from_lm_eval(results: Mapping[str, Any], name: str, *, api: str, seconds: float, harness: str) -> EvalResult:
    """lm-eval's results dict (``simple_evaluate``'s return) as perflab's EvalResult for the
    task or group ``name``: its primary metric and filter (the first of the task's
    ``metric_list`` after the first of its ``filter_list``; a group's first aggregate), in points."""
    entry = (results.get("groups") or {}).get(name) or (results.get("results") or {}).get(name)
    if not isinstance(entry, Mapping):
        raise PerflabError(f"lm-eval's results have no entry for task {name}")
    leaves = _leaves(results, name)
    configs = results.get("configs") or {}
    cfg = configs.get(name) or (configs.get(leaves[0]) if leaves else None) or {}
    metric, filt = _primary(entry, cfg if name in configs else {})
    value = entry[f"{metric},{filt}"]
    if not isinstance(value, (int, float)) or isinstance(value, bool) or math.isnan(float(value)):
        raise PerflabError(f"task {name}: lm-eval gave no number for {metric} ({filt}): {value!r}")
    scale = _scale(metric, name)
    stderr = entry.get(f"{metric}_stderr,{filt}")
    stderr = float(stderr) * scale if isinstance(stderr, (int, float)) and not isinstance(stderr, bool) and not math.isnan(stderr) else None
    output_type = str(cfg.get("output_type") or "generate_until")
    return EvalResult(
        task=name, metric=metric, filter=filt,
        mode="gen" if output_type == "generate_until" else "loglikelihood",
        score=float(value) * scale, stderr=stderr, samples=_samples(results, leaves, filt),
        seconds=round(seconds, 3), harness=harness, api=api)


def _leaves(results: Mapping[str, Any], name: str) -> list[str]:
    """The leaf tasks under ``name`` (itself when it is a task)."""
    tree = results.get("group_subtasks") or {}
    if name not in tree:
        return [name]
    out: list[str] = []
    for child in tree[name]:
        out.extend(_leaves(results, child))
    return out


def _primary(entry: Mapping[str, Any], cfg: Mapping[str, Any]) -> tuple[str, str]:
    keys = [k for k in entry if isinstance(k, str) and "," in k and "_stderr," not in k]
    metrics = [m["metric"] for m in cfg.get("metric_list") or () if isinstance(m, Mapping) and isinstance(m.get("metric"), str)]
    filters = [f["name"] for f in cfg.get("filter_list") or () if isinstance(f, Mapping) and isinstance(f.get("name"), str)]
    if metrics:
        wanted = f"{metrics[0]},{filters[0] if filters else 'none'}"
        if wanted in entry:
            return metrics[0], filters[0] if filters else "none"
    if not keys:
        raise PerflabError(f"lm-eval's results carry no metric: {sorted(entry)}")
    metric, _, filt = keys[0].partition(",")
    return metric, filt


def _scale(metric: str, task: str) -> float:
    if metric in _FRACTION_METRICS or metric.startswith(("acc", "exact_match")):
        return 100.0
    if metric in _POINT_METRICS:
        return 1.0
    raise PerflabError(f"task {task}: its primary metric {metric} is not a rate perflab can score in points "
                       "(acc, exact_match, f1, ...)")


def _samples(results: Mapping[str, Any], leaves: list[str], filt: str) -> int:
    """Items scored: the logged samples of the primary filter, else lm-eval's effective count."""
    logged = results.get("samples") or {}
    n_samples = results.get("n-samples") or {}
    total = 0
    for leaf in leaves:
        rows = logged.get(leaf)
        if rows:
            total += len({r.get("doc_id") for r in rows if r.get("filter", filt) == filt})
        else:
            total += int((n_samples.get(leaf) or {}).get("effective") or 0)
    return total


# ================================================================== the entry point


async def evaluate(
    base_url: str,
    model: str,
    *,
    task: str = SHIPPED_TASK,
    api: str = "chat",
    limit: int | None = None,
    concurrency: int = 8,
    timeout_s: float = 300,
    api_key: str | None = None,
    max_gen_toks: int = 256,
    progress: Callable[[int, int], None] | None = None,
) -> EvalResult:
    """Score the endpoint at ``base_url`` (``http://host:port``) serving ``model`` (the name
    sent in requests) on ``task`` through lm-eval, in a worker thread.

    ``api``: ``chat`` (/v1/chat/completions, the server's chat template) or ``completions``
    (/v1/completions, the prompt as text). ``limit``: the first N items. ``concurrency``:
    requests in flight. ``timeout_s``: per request. ``api_key``: sent as a bearer token (None:
    ``OPENAI_API_KEY`` from the environment, as lm-eval and ``perflab bench`` read it).
    ``progress(done, total)`` is called from the worker thread as answers arrive.

    Raises :class:`AccuracyUnavailable` without the extra, :class:`UsageError` for an
    unknown task or bad arguments, :class:`EndpointFailed` when the endpoint fails.
    Cancelling the caller stops the worker's remaining requests.
    """
    if api not in API_PATHS:
        raise UsageError(f"api {api!r}: expected one of {', '.join(API_PATHS)}")
    if limit is not None and limit < 1:
        raise UsageError(f"limit {limit}: expected at least 1 item")
    if concurrency < 1:
        raise UsageError(f"concurrency {concurrency}: expected at least 1")
    if not timeout_s > 0:
        raise UsageError(f"timeout {timeout_s}: expected a positive number of seconds")
    if max_gen_toks < 1:
        raise UsageError(f"max_gen_toks {max_gen_toks}: expected at least 1")
    if not base_url.startswith(("http://", "https://")):
        raise UsageError(f"base URL {redact.scrub(base_url)!r}: expected http://host:port")
    base_url = api_base(base_url)
    ensure_available()
    spec = resolve_task(task)
    if api_key is None:
        import os

        api_key = os.environ.get("OPENAI_API_KEY") or None
    if api_key:
        redact.register([api_key])
    stop = threading.Event()
    try:
        return await _in_daemon_thread(functools.partial(
            _evaluate_sync, spec, base_url, model, api, limit, concurrency, timeout_s, api_key, max_gen_toks,
            progress, stop))
    except ImportError as exc:  # installed, but broken (a dependency of lm-eval's that does not import)
        raise AccuracyUnavailable(f"lm-evaluation-harness does not import ({_one_line(exc)}): {INSTALL_HINT}") from None
    finally:
        stop.set()  # cancelled: the abandoned worker sends nothing more


async def _in_daemon_thread(fn: Callable[[], EvalResult]) -> EvalResult:
    """``fn()`` in a daemon thread of its own, awaited cancellably. Not anyio's worker thread:
    the interpreter joins those at exit, and an abandoned evaluation waiting on a request the
    server never answers would keep a Ctrl-C'd ``perflab eval`` alive for its whole timeout."""
    done = anyio.Event()
    token = anyio.lowlevel.current_token()
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append((True, fn()))
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting task
            outcome.append((False, exc))
        try:
            anyio.from_thread.run_sync(done.set, token=token)
        except RuntimeError:  # the caller's loop is gone (cancelled, then closed): nobody waits
            pass

    threading.Thread(target=run, name="perflab-eval", daemon=True).start()
    await done.wait()
    ok, value = outcome[0]
    if ok:
        return value
    raise value


__all__ = [
    "API_PATHS",
    "INSTALL_HINT",
    "AccuracyUnavailable",
    "EndpointFailed",
    "TaskSpec",
    "api_base",
    "check_task",
    "configure_logging",
    "ensure_available",
    "evaluate",
    "redact_url",
    "resolve_task",
    "result_from_lm_eval",
]
