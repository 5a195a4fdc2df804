"""What a running study shows: the step, the configuration, the engine's state, the benchmark.

On a terminal it is a rich live panel; otherwise (CI, pipes, tests) one plain line per
notable event. Both are fed the same events: the lab's own (``step``, ``launch``,
``benchmark``, ``progress``, ``result``) and the supervisor's ``engine.state`` log events.
"""

from __future__ import annotations

import sys
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, TextIO

from rich.console import Console, Group
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from perflab import redact
from perflab.status import Status

_MARK = {Status.OK: ("✓", "green"), "reused": ("↺", "cyan"), Status.UNSUPPORTED: ("⊘", "yellow"),
         Status.STOPPED_EARLY: ("⏹", "cyan"), Status.CRASHED: ("✗", "red"), Status.TIMEOUT: ("✗", "red"), Status.FAILED: ("✗", "red"),
         "skipped": ("–", "yellow")}
# the engine states worth a line of their own: ready, or how a launch failed
_SHOWN_STATES = frozenset({Status.READY, *(s for s in Status.supervisor_states() if s.is_failure)})


@dataclass
class _State:
    header: str = ""
    step: str = ""
    label: str = ""
    engine: str = ""
    state: str = ""
    profile: str = ""
    done: int = 0
    total: int = 0
    started: float = field(default_factory=time.monotonic)
    finished: deque[tuple[str, str, str]] = field(default_factory=lambda: deque(maxlen=10))
    counts: dict[str, int] = field(default_factory=dict)


class StudyProgress:
    """Feed it events with :meth:`event`; use as a context manager around the study."""

    def __init__(self, header: str, *, live: bool | None = None, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.live_mode = self.stream.isatty() if live is None else live
        self.console = Console(file=self.stream, highlight=False, soft_wrap=False)
        self.s = _State(header=header)
        self._live: Live | None = None

    def __enter__(self) -> StudyProgress:
        if self.live_mode:
            self._live = Live(self._render(), console=self.console, refresh_per_second=4, transient=False)
            self._live.__enter__()
        else:
            self._line(self.s.header)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._live is not None:
            self._live.update(self._render())
            self._live.__exit__(*exc)
            self._live = None

    # ------------------------------------------------------------------ events

    def event(self, kind: str, **f: Any) -> None:
        f = redact.redact_obj(f)  # labels and errors may carry a secret
        s = self.s
        if kind == "step":
            s.step = f.get("title", "")
            self._line(f"== {s.step}")
        elif kind == "measure":
            s.label, s.engine, s.state, s.profile, s.done, s.total = f.get("label", ""), f.get("engine", ""), "preflight", "", 0, 0
        elif kind == "launch":
            s.state = "launching" + (f" replica {f['replica']}/{f['replicas']}" if f.get("replicas", 1) > 1 else "")
            self._line(f"   {s.label}: launching {f.get('engine', '')}")
        elif kind == "engine.state":
            s.state = str(f.get("state", s.state))
            if s.state in _SHOWN_STATES:
                self._line(f"   {s.label}: {s.state}")
        elif kind == "benchmark":
            s.state, s.profile, s.done, s.total = "benchmarking", f.get("profile", ""), 0, int(f.get("total") or 0)
            self._line(f"   {s.label}: benchmarking {s.profile} ({s.total} prompts)")
        elif kind == "progress":
            s.done, s.total = int(f.get("done") or 0), int(f.get("total") or s.total)
        elif kind == "teardown":
            s.state = "tearing down"
        elif kind == "waiting":  # the devices it needs are held by someone else (perflab.lab.integrity)
            s.state = "waiting for the machine"
            self._line(f"   {s.label}: waiting for the machine: {'; '.join(f.get('holders') or [])}")
        elif kind == "result":
            status = f.get("status", "")
            key = "reused" if f.get("reused") and status == Status.OK else status
            s.counts[key] = s.counts.get(key, 0) + 1
            s.finished.append((key, f.get("label", ""), f.get("summary", "")))
            mark = _MARK.get(key, ("·", "white"))[0]
            self._line(f"   {mark} {f.get('label', '')}: {f.get('summary', '')}")
            s.state, s.profile, s.done, s.total = "", "", 0, 0
        if self._live is not None:
            self._live.update(self._render())

    def log_listener(self, event: str, fields: dict[str, Any]) -> None:
        """structlog hands every event here (see :mod:`perflab.lab.studylog`)."""
        if event == "engine.state":
            self.event("engine.state", **fields)

    def message(self, text: str) -> None:
        if self._live is not None:
            self._live.console.print(text)
        else:
            self._line(text)

    # ------------------------------------------------------------------ rendering

    def _line(self, text: str) -> None:
        if self._live is None:
            print(text, file=self.stream, flush=True)

    def _render(self) -> Group:
        s = self.s
        grid = Table.grid(padding=(0, 1))
        grid.add_column(style="bold", no_wrap=True)
        grid.add_column()
        grid.add_row("Study", s.header)
        grid.add_row("Step", s.step or "-")
        now = f"{s.label} ({s.engine})" if s.label else "-"
        grid.add_row("Configuration", now)
        grid.add_row("State", s.state or "-")
        if s.total:
            bar = ProgressBar(total=s.total, completed=s.done, width=30)
            grid.add_row("Benchmark", Group(Text(f"{s.profile}: {s.done}/{s.total} requests"), bar))
        elapsed = int(time.monotonic() - s.started)
        counts = ", ".join(f"{v} {k}" for k, v in sorted(s.counts.items())) or "none yet"
        grid.add_row("Finished", f"{counts}  (elapsed {elapsed // 60}:{elapsed % 60:02d})")
        done = Table.grid(padding=(0, 1))
        for key, label, summary in s.finished:
            mark, colour = _MARK.get(key, ("·", "white"))
            done.add_row(Text(mark, style=colour), Text(label, style="bold"), Text(summary))
        return Group(grid, done)
