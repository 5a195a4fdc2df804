"""The study's structured log: every event as one JSON line in ``study.log``.

While a study runs, structlog is configured to write JSON lines to the study's log file —
the lab's own events and those of the supervisor (engine state transitions, leftovers) — and
to hand each event to the live display first. The previous configuration is restored after.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import structlog

from perflab import redact

LOG_NAME = "study.log"

Listener = Callable[[str, dict[str, Any]], None]


def _forwarder(listener: Listener | None) -> Callable[..., Any]:
    def forward(logger: Any, method: str, event_dict: dict[str, Any]) -> dict[str, Any]:
        if listener is not None:
            try:
                listener(str(event_dict.get("event", "")), dict(event_dict))
            except Exception:  # the display must never break the study
                pass
        return event_dict

    return forward


@contextmanager
def study_logging(directory: Path, listener: Listener | None = None) -> Iterator[structlog.typing.FilteringBoundLogger]:
    """Route structlog to ``directory/study.log`` (appending) for the duration of the block."""
    old = structlog.get_config()
    path = directory / LOG_NAME
    fh = path.open("a", encoding="utf-8", buffering=1)
    structlog.configure(
        processors=[
            redact.structlog_processor,  # before the display and the file see the event
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            _forwarder(listener),
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            redact.structlog_processor,  # again: a traceback may quote a secret
            structlog.processors.JSONRenderer(default=str),
        ],
        logger_factory=structlog.WriteLoggerFactory(file=fh),
        wrapper_class=structlog.make_filtering_bound_logger(0),
        cache_logger_on_first_use=False,
    )
    try:
        yield structlog.get_logger("perflab.lab")
    finally:
        structlog.configure(**old)
        fh.close()
