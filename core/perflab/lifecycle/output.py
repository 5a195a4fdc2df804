"""The engine's combined stdout/stderr: to the run's log file line by line, and a tail in memory.

The log is flushed per line so that ``tail -f engine.log`` shows what the engine prints as it
prints it, and so that nothing is lost if perflab itself is killed.

Crash classification reads :meth:`OutputPump.scan_text`: every *notable* line of the whole
output as it streamed (by default everything but INFO/DEBUG lines, see
:func:`perflab.contract.crashes.is_notable`; the first ``keep_max`` of them) merged in log order with
the last ``tail_lines`` lines. Under load an engine prints thousands of request lines after
its root-cause error; a tail alone would have lost it.
"""

from __future__ import annotations

import errno
import os
import re
import time
from collections import deque
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO

import anyio

from perflab import redact
from perflab.contract.crashes import is_notable

MAX_LINE = 64 * 1024  # a line longer than this is split (progress bars without newlines)
KEPT_LINE_MAX = 4096  # notable lines are kept this long at most (2000 of them: at most 8 MiB)


class OutputPump:
    def __init__(
        self,
        fd: int,
        log_path: Path,
        *,
        tail_lines: int = 400,
        patterns: Iterable[str] = (),
        on_pattern: Callable[[str, str], None] | None = None,
        keep: Callable[[str], bool] | None = None,
        keep_max: int = 2000,
    ) -> None:
        self.fd: int | None = fd
        self.log_path = log_path
        self._log: IO[str] | None = log_path.open("a", encoding="utf-8", errors="replace")
        self.tail: deque[str] = deque(maxlen=tail_lines)
        self._tail_index: deque[int] = deque(maxlen=tail_lines)  # line numbers of `tail`
        self.lines = 0  # lines seen so far
        self._keep = keep if keep is not None else is_notable
        self._keep_max = keep_max
        self.kept: list[tuple[int, str]] = []  # (line number, text) of notable lines, first keep_max
        self._partial = b""
        self._patterns = [(p, re.compile(p)) for p in patterns]
        self._on_pattern = on_pattern
        self.pattern_seen: dict[str, float] = {}  # pattern -> time.time() of its first match
        self.eof = False

    # ---------------------------------------------------------------- reading

    def read_available(self) -> None:
        """Consume everything the pipe holds right now (non-blocking)."""
        while self.fd is not None and not self.eof:
            try:
                chunk = os.read(self.fd, 65536)
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno == errno.EINTR:
                    continue
                self.eof = True
                break
            if not chunk:
                self.eof = True
                break
            self._feed(chunk)
        if self.eof:
            self._flush_partial()

    async def run(self) -> None:
        """Pump until end of file (every writer closed the pipe) or cancellation."""
        while self.fd is not None and not self.eof:
            await anyio.wait_readable(self.fd)
            self.read_available()

    def _feed(self, chunk: bytes) -> None:
        data = self._partial + chunk
        *lines, self._partial = data.split(b"\n")
        for raw in lines:
            self._line(raw.rstrip(b"\r").decode("utf-8", errors="replace"))
        while len(self._partial) > MAX_LINE:
            head, self._partial = self._partial[:MAX_LINE], self._partial[MAX_LINE:]
            self._line(head.decode("utf-8", errors="replace"))

    def _flush_partial(self) -> None:
        if self._partial:
            raw, self._partial = self._partial, b""
            self._line(raw.decode("utf-8", errors="replace"))

    def _line(self, text: str) -> None:
        text = redact.scrub(text)  # engines echo their arguments (vLLM's "non-default args")
        if self._log is not None:
            self._log.write(text + "\n")
            self._log.flush()
        self.tail.append(text)
        self._tail_index.append(self.lines)
        if len(self.kept) < self._keep_max and self._keep(text):
            self.kept.append((self.lines, text[:KEPT_LINE_MAX]))
        self.lines += 1
        for pattern, rx in self._patterns:
            if pattern not in self.pattern_seen and rx.search(text):
                self.pattern_seen[pattern] = time.time()
                if self._on_pattern is not None:
                    self._on_pattern(pattern, text)

    # ---------------------------------------------------------------- results

    def tail_text(self) -> str:
        return "\n".join(self.tail)

    def scan_text(self) -> str:
        """The notable lines of the whole output and the tail, in log order, each once."""
        merged = dict(self.kept)
        merged.update(zip(self._tail_index, self.tail, strict=True))
        return "\n".join(merged[i] for i in sorted(merged))

    def note(self, text: str) -> None:
        """Write a perflab line into the engine log (marked, so it is not mistaken for the engine's)."""
        if self._log is not None:
            self._log.write(f"[perflab] {redact.scrub(text)}\n")
            self._log.flush()

    def close(self) -> None:
        """Take what is left in the pipe, then close the pipe and the log file."""
        if self.fd is not None:
            self.read_available()
            self._flush_partial()
            os.close(self.fd)
            self.fd = None
        if self._log is not None:
            self._log.close()
            self._log = None
