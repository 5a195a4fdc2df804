"""perflab's benchmark client for OpenAI-compatible streaming endpoints.

``vllm bench serve``'s metrics and result format, measured by a client built not to be the
bottleneck (docs/benchmark.md)::

    from perflab.bench import BenchRequest, run_benchmark

    req = BenchRequest(base_urls=("http://127.0.0.1:8000",), model="Qwen/Qwen3-8B",
                       random_input_len=128, random_output_len=16, num_prompts=200,
                       max_concurrency=32)
    result = await run_benchmark(req)          # any anyio backend: runs in a worker thread
    print(result.format_block())
    result.metrics.total_token_throughput   # vLLM --save-result field names (perflab.bench.metrics.BenchMetrics)

To stop a benchmark from outside, pass ``cancel=threading.Event()`` and set it: the call
raises :class:`BenchCancelled` within about half a second (see :mod:`perflab.bench.cancel`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from perflab.bench.cancel import BenchCancelled
from perflab.bench.profiles import PROFILE_DESCRIPTIONS, PROFILES, apply_profile
from perflab.bench.request import BenchRequest
from perflab.bench.result import (
    BenchResult,
    format_result_block,
    parse_result_block,
    parse_result_blocks,
)
from perflab.bench.trace import RequestTrace
from perflab.plugins import PluginManager

if TYPE_CHECKING:  # the runner is imported when a benchmark runs, not at start-up
    from perflab.bench.runner import RunMarks

__all__ = [
    "PROFILES",
    "PROFILE_DESCRIPTIONS",
    "BenchCancelled",
    "BenchRequest",
    "BenchResult",
    "RequestTrace",
    "apply_profile",
    "available_backends",
    "format_result_block",
    "parse_result_block",
    "parse_result_blocks",
    "run_benchmark",
    "run_benchmark_sync",
]


async def run_benchmark(
    req: BenchRequest,
    *,
    progress: Callable[[int, int], None] | None = None,
    backend: str = "perflab",
    pm: PluginManager | None = None,
    cancel: threading.Event | None = None,
) -> BenchResult:
    """Benchmark ``req`` and return the result (raises :class:`perflab.contract.errors.PerflabError`).

    The run happens in a worker thread with its own event loop (uvloop when installed), so
    the caller's loop — asyncio or trio through anyio — stays responsive and does not skew
    the client's timings.

    :param progress: ``progress(done, total)``, called from the worker thread about ten
        times a second (built-in client only).
    :param backend: ``"perflab"`` (built in), ``"vllm-bench"``, or a plugin's backend name.
    :param pm: a loaded plugin manager, to find plugin backends (loaded on demand if omitted).
    :param cancel: set it to stop the run: :class:`BenchCancelled` is raised within about
        half a second (built-in client only; other backends run to their end). Cancelling
        the awaiting task (anyio) sets it too and waits, up to a few seconds, for the
        client's thread to stop before the cancellation goes on.
    """
    import anyio
    import anyio.to_thread

    if backend != "perflab":
        from perflab.bench.backends import get_backend

        driver = get_backend(backend, pm)
        return await anyio.to_thread.run_sync(driver, req)

    from perflab.bench.cancel import JOIN_S, signalling_end, wait_set
    from perflab.bench.runner import run_benchmark_sync as run

    stop = cancel if cancel is not None else threading.Event()
    finished = threading.Event()
    work = signalling_end(finished, lambda: run(req, progress, stop))
    try:
        return await anyio.to_thread.run_sync(work, abandon_on_cancel=True)
    except anyio.get_cancelled_exc_class():
        stop.set()
        with anyio.CancelScope(shield=True):
            await wait_set(finished, JOIN_S)
        raise


def run_benchmark_sync(
    req: BenchRequest,
    progress: Callable[[int, int], None] | None = None,
    cancel: threading.Event | None = None,
    observe: Callable[[Any], None] | None = None,
    marks: RunMarks | None = None,
) -> BenchResult:
    """:func:`run_benchmark` for callers without an event loop (the CLI, the lab's thread).

    :param cancel: set it (from any thread) to stop the run; :class:`BenchCancelled` is then
        raised within about half a second, carrying the partial result (``.result``).
    :param observe: called with the timed run's counts (:class:`perflab.bench.drive.Observation`)
        every few tenths of a second; it may stop the run by setting ``cancel``.
    :param marks: its ``begin()`` is called just before the first timed request (after the
        warm-up), its ``end()`` right after the last response
        (:class:`perflab.bench.runner.RunMarks`).
    """
    from perflab.bench.runner import run_benchmark_sync as run

    return run(req, progress, cancel, observe, marks)


def available_backends(pm: PluginManager | None = None) -> dict[str, Callable[[BenchRequest], BenchResult]]:
    from perflab.bench.backends import available_backends as _available

    return _available(pm)
