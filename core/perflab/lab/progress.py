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
from perflab.contract.status import Status

_MARK = {Status.OK: ("✓", "green"), "reused": ("↺", "cyan"), Status.UNSUPPORTED: ("⊘", "yellow"),
         Status.STOPPED_EARLY: ("⏹", "cyan"), Status.CRASHED: ("✗", "red"), Status.TIMEOUT: ("✗", "red"), Status.FAILED: ("✗", "red"),
         "skipped": ("–", "yellow")}
# the engine states worth a line of their own: ready, or how a launch failed
_SHOWN_STATES = frozenset({Status.READY, *(s for s in Status.supervisor_states() if s.is_failure)})


@dataclass
class _Run:
    """One configuration being measured (several at once with ``perflab run --parallel``)."""

    engine: str = ""
    state: str = ""
    profile: str = ""
    done: int = 0
    total: int = 0
    devices: str = ""


@dataclass
class _State:
    header: str = ""
    step: str = ""
    runs: dict[str, _Run] = field(default_factory=dict)  # by label, in the order they started
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

    def _run(self, f: dict[str, Any]) -> _Run:
        """The run an event is about: its ``label`` (the supervisor's events carry the
        backend's ``run_label``), else the only one running."""
        label = f.get("label") or f.get("run_label")
        if label is None and len(self.s.runs) == 1:
            label = next(iter(self.s.runs))
        return self.s.runs.setdefault(str(label or ""), _Run())

    def event(self, kind: str, **f: Any) -> None:
        f = redact.redact_obj(f)  # labels and errors may carry a secret
        s = self.s
        label = f.get("label") or f.get("run_label") or ""
        if kind == "step":
            s.step = f.get("title", "")
            self._line(f"== {s.step}")
        elif kind == "measure":
            s.runs[label] = _Run(engine=f.get("engine", ""), state="preflight")
        elif kind == "queued":  # waiting for free devices (a sibling holds them)
            self._run(f).state = "queued for devices"
        elif kind == "placed":
            r = self._run(f)
            r.devices = ",".join(str(d) for d in f.get("devices") or [])
            node = f.get("node")
            where = f" node {node}" if node and node != "local" else ""  # a Ray node (perflab.lab.run.backends.ray)
            if r.devices or where:
                self._line(f"   {label}: on{where}" + (f" devices {r.devices}" if r.devices else ""))
        elif kind == "requeued":  # its Ray node or agent was lost: launched once more elsewhere
            self._run(f).state = "re-queued"
            self._line(f"   {label}: lost with its node; re-queued")
        elif kind == "relaunch":  # its engine lost its port to another process: once more, on a fresh one
            self._line(f"   {label}: {f.get('why', 'relaunched')}; launching it once more on a fresh port")
        elif kind == "point-reused":  # a load point an interrupted run finished (perflab.lab.run.executor)
            self._line(f"   {label}: {f.get('profile', '')} at {f.get('point', '')}: kept from the interrupted run")
        elif kind == "launch":
            self._run(f).state = "launching" + (f" replica {f['replica']}/{f['replicas']}" if f.get("replicas", 1) > 1 else "")
            self._line(f"   {label}: launching {f.get('engine', '')}")
        elif kind == "engine.state":
            r = self._run(f)
            r.state = str(f.get("state", r.state))
            if f.get("stopped_by"):  # perflab kill: a deliberate stop, not the engine's crash
                r.state = "stopped"
                self._line(f"   {label or f.get('engine', '')}: {f['stopped_by']}")
            elif r.state in _SHOWN_STATES:
                self._line(f"   {label or f.get('engine', '')}: {r.state}")
        elif kind == "benchmark":
            r = self._run(f)
            r.state, r.profile, r.done, r.total = "benchmarking", f.get("profile", ""), 0, int(f.get("total") or 0)
            self._line(f"   {label}: benchmarking {r.profile} ({r.total} prompts)")
        elif kind == "accuracy":  # the plan's accuracy measurement (perflab.lab.run.executor): "evaluating accuracy (...)"
            r = self._run(f)
            r.state = str(f.get("what", "accuracy"))
            self._line(f"   {label}: {r.state}")
        elif kind == "rejected":  # measured, then rejected by the accuracy gate (perflab.lab.study)
            self._line(f"   ✗ {label}: {f.get('note', 'rejected')}")
        elif kind == "progress":
            r = self._run(f)
            r.done, r.total = int(f.get("done") or 0), int(f.get("total") or r.total)
        elif kind == "teardown":
            self._run(f).state = "tearing down"
        elif kind == "waiting":  # the devices it needs are held by someone else (perflab.lab.store.integrity)
            self._run(f).state = "waiting for the machine"
            self._line(f"   {label}: waiting for the machine: {'; '.join(f.get('holders') or [])}")
        elif kind == "result":
            status = f.get("status", "")
            key = "reused" if f.get("reused") and status == Status.OK else status
            s.counts[key] = s.counts.get(key, 0) + 1
            s.finished.append((key, label, f.get("summary", "")))
            mark = _MARK.get(key, ("·", "white"))[0]
            self._line(f"   {mark} {label}: {f.get('summary', '')}")
            s.runs.pop(label, None)
        if self._live is not None:
            self._live.update(self._render())

    def log_listener(self, event: str, fields: dict[str, Any]) -> None:
        """structlog hands every event here (see :mod:`perflab.lab.store.studylog`)."""
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
        if not s.runs:
            grid.add_row("Configuration", "-")
        for label, r in s.runs.items():  # one block per configuration running now
            where = f" on {r.devices}" if r.devices else ""
            grid.add_row("Configuration", f"{label} ({r.engine}){where}")
            grid.add_row("State", r.state or "-")
            if r.total:
                bar = ProgressBar(total=r.total, completed=r.done, width=30)
                grid.add_row("Benchmark", Group(Text(f"{r.profile}: {r.done}/{r.total} requests"), bar))
        elapsed = int(time.monotonic() - s.started)
        counts = ", ".join(f"{v} {k}" for k, v in sorted(s.counts.items())) or "none yet"
        grid.add_row("Finished", f"{counts}  (elapsed {elapsed // 60}:{elapsed % 60:02d})")
        done = Table.grid(padding=(0, 1))
        for key, label, summary in s.finished:
            mark, colour = _MARK.get(key, ("·", "white"))
            done.add_row(Text(mark, style=colour), Text(label, style="bold"), Text(summary))
        return Group(grid, done)
