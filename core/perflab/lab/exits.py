"""``perflab run``'s (and ``perflab demo``'s) exit statuses, declared once.

The CLI's ``--help`` epilog, ``--json``'s ``exit_status``, the one-line summary on stderr
and docs/user-guide.md all derive from :class:`RunExit`. An interrupted study exits with
128 + the signal's number (the shell's convention: SIGINT 130, SIGTERM 143, SIGHUP 129),
which :func:`interrupted_status` gives; it is not a member because it depends on the signal.
"""

from __future__ import annotations

import signal
from enum import IntEnum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from perflab.lab.study import StudyOutcome

INTERRUPTED_BASE = 128  # + the signal's number


class RunExit(IntEnum):
    OK = 0
    ERROR = 1
    USAGE = 2
    ENVIRONMENT = 3
    NOTHING_MEASURED = 4
    BASELINE_NOT_MEASURED = 5
    RECOMMENDATION_NOT_MEASURED = 6

    @property
    def meaning(self) -> str:
        return _MEANINGS[self]


_MEANINGS: dict[RunExit, str] = {
    RunExit.OK: "the baseline and the recommended configuration were measured",
    RunExit.ERROR: "perflab error or storage fault (disk full, read-only, corrupt study.db)",
    RunExit.USAGE: "usage error: bad option or plan, a study of another plan in --out, a locked study",
    RunExit.ENVIRONMENT: "environment fault: the machine was not ready, an engine lost its port twice, "
                           "`perflab kill` stopped the study, or a teardown left something behind",
    RunExit.NOTHING_MEASURED: "nothing was measured: every configuration was refused or failed",
    RunExit.BASELINE_NOT_MEASURED: "the baseline was not measured: no improvement over it can be stated",
    RunExit.RECOMMENDATION_NOT_MEASURED: "the baseline was measured, but no recommended configuration was",
}


def interrupted_status(signum: int) -> int:
    """The exit status of a study stopped by ``signum`` (SIGINT: 130)."""
    return INTERRUPTED_BASE + int(signum)


def describe(status: int) -> tuple[str, str]:
    """(name, meaning) of an exit status, interrupted ones included."""
    if status in RunExit._value2member_map_:
        member = RunExit(status)
        return member.name, member.meaning
    if status > INTERRUPTED_BASE:
        try:
            sig = signal.Signals(status - INTERRUPTED_BASE).name
        except ValueError:
            sig = f"signal {status - INTERRUPTED_BASE}"
        return "INTERRUPTED", f"interrupted by {sig}; everything measured so far is kept"
    return "ERROR", RunExit.ERROR.meaning


def as_json(status: int) -> dict[str, Any]:
    """What ``--json`` carries: ``{"exit_status": N, "exit_name": ..., "exit_meaning": ...}``."""
    name, meaning = describe(status)
    return {"exit_status": int(status), "exit_name": name, "exit_meaning": meaning}


def outcome_status(outcome: StudyOutcome) -> RunExit:
    """The status of a study that ran to its end: OK only when the baseline and the
    recommendation (the optimized configuration) were measured on the main profile."""
    # measured: Status's own flag (a run stopped early, lost or over-saturated, was measured:
    # its figures decided)
    base_ok = outcome.baseline.result.status.measured
    opt_ok = outcome.optimized is not None and outcome.optimized.result.status.measured
    if base_ok and opt_ok:
        return RunExit.OK
    measured = [e.result for s in outcome.steps for e in s.entries if e.result is not None]
    measured += [r for c in outcome.cases for r in (c.baseline, c.optimized) if r is not None]
    if not any(r.status.measured for r in measured) and not base_ok:
        return RunExit.NOTHING_MEASURED
    if not base_ok:
        return RunExit.BASELINE_NOT_MEASURED
    return RunExit.RECOMMENDATION_NOT_MEASURED


def epilog() -> str:
    """The exit statuses as ``perflab run --help`` lists them (click keeps ``\\b`` blocks as written)."""
    rows = [f"  {m.value:<4d} {m.meaning}" for m in RunExit]
    rows.append(f"  {INTERRUPTED_BASE}+N interrupted by signal N: 130 Ctrl-C (SIGINT), 143 SIGTERM, 129 SIGHUP; "
                "the same command resumes")
    return "\b\nExit status:\n" + "\n".join(rows) + "\n"


__all__ = ["INTERRUPTED_BASE", "RunExit", "as_json", "describe", "epilog", "interrupted_status", "outcome_status"]
