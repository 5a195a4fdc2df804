"""The command line's log output: structlog configured once per invocation, by the ``perflab``
group's ``--log-level`` / ``-v`` (:func:`perflab.cli.cli`), for the invocation.

Log lines go to stderr (stdout is for results and ``--json``), rendered for a reader, secrets
scrubbed. The default shows warnings and errors only: the events a command logs as it works
(an engine's state changes, a probe's progress) are for ``-v``. A study's own ``study.log``
records every event whatever the level (:mod:`perflab.lab.store.studylog`).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

#: ``--log-level`` choices -> the logging module's numbers
LEVELS: Mapping[str, int] = {"debug": 10, "info": 20, "warning": 30, "error": 40}
DEFAULT_LEVEL = "warning"
#: ``-v`` once, twice
VERBOSE_LEVELS = ("info", "debug")


def level_for(log_level: str | None, verbose: int) -> str:
    """The level asked for: ``--log-level`` wins over ``-v``; neither: :data:`DEFAULT_LEVEL`."""
    if log_level:
        return log_level
    if verbose:
        return VERBOSE_LEVELS[min(verbose, len(VERBOSE_LEVELS)) - 1]
    return DEFAULT_LEVEL


class StderrLogger:
    """structlog output on the *current* sys.stderr (pytest's capture replaces it between calls)."""

    def msg(self, message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    log = debug = info = warning = warn = error = critical = exception = fatal = msg


@contextmanager
def logging_at(level: str) -> Iterator[None]:
    """structlog routed to stderr at ``level`` for the block (a command's invocation), the
    previous configuration restored after: structlog's default prints every level to stdout,
    which would corrupt ``--json``, and a caller that runs commands in-process (a test) keeps its own."""
    import structlog

    from perflab import redact

    old = structlog.get_config()
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="%H:%M:%S"),
            structlog.processors.format_exc_info,
            redact.structlog_processor,  # after the traceback is text: it may quote a secret
            structlog.dev.ConsoleRenderer(colors=False),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(LEVELS[level]),
        logger_factory=lambda *a: StderrLogger(),
        cache_logger_on_first_use=False,
    )
    try:
        yield
    finally:
        structlog.configure(**old)
