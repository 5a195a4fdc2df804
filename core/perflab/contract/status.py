"""The one status vocabulary of perflab: the supervisor's states, a run's state and a
measurement's status are all :class:`Status` members.

:class:`Status` is a :class:`enum.StrEnum`: a member *is* its string (``Status.CRASHED ==
"crashed"``), so JSON written by earlier versions (``run.json``, ``measurement-*.json``,
``outcome.json``, ``study.db``) loads as it is, and ``json.dumps`` writes plain strings.

What a status means for the lab is carried by the member (never by a tuple of statuses kept
somewhere else):

``blame``
    :attr:`Blame.CONFIGURATION` — a fact about the configuration on this machine (it served,
    it was refused, it crashed, it stalled ...): a *result*, stored and reused;
    :attr:`Blame.MACHINE` — the machine or perflab got in the way (the run was interrupted,
    the devices were busy): never a result, never reused; ``None`` for the supervisor's
    passing states and for "not measured yet".
``terminal``
    nothing follows it: a launch, a run or a measurement that reached it is over.
``retried``
    ``perflab run --retry-failed`` measures it again (a failure that may not repeat).
``startup``
    the supervisor can end a launch in it before anything was served (preflight refusal,
    crash, readiness timeout); such a run decides every profile of the configuration.
``measured``
    the measurement has figures (it served the workload, perhaps stopped early).
``supervised``
    a state of :class:`perflab.supervisor.LaunchOutcome` (the lifecycle of one launch).
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["Blame", "Status"]


class Blame(StrEnum):
    """Whose fact a status is: the configuration's (a result) or the machine's (not one)."""

    CONFIGURATION = "configuration"
    MACHINE = "machine"


class Status(StrEnum):
    """A launch's, a run's or a measurement's state; see the module docstring for its facts."""

    blame: Blame | None
    terminal: bool
    retried: bool
    startup: bool
    supervised: bool
    measured: bool

    def __new__(cls, value: str, blame: Blame | None = None, facts: dict[str, bool] | None = None) -> Status:
        member = str.__new__(cls, value)
        member._value_ = value
        member.blame = blame
        flags = facts or {}
        unknown = set(flags) - {"terminal", "retried", "startup", "supervised", "measured"}
        assert not unknown, unknown
        member.terminal = flags.get("terminal", False)
        member.retried = flags.get("retried", False)
        member.startup = flags.get("startup", False)
        member.supervised = flags.get("supervised", False)
        member.measured = flags.get("measured", False)
        return member

    # -- the supervisor's lifecycle of one launch (preflight -> ... -> done)
    PREFLIGHT = "preflight", None, {"supervised": True}
    LAUNCHING = "launching", None, {"supervised": True}
    WAITING_READY = "waiting-ready", None, {"supervised": True}
    READY = "ready", None, {"supervised": True}
    TEARING_DOWN = "tearing-down", None, {"supervised": True}
    DONE = "done", None, {"supervised": True, "terminal": True}  # torn down after it served (or never started)
    # -- a run in the study store, before it ends
    RUNNING = "running"
    # -- results: facts about the configuration
    OK = "ok", Blame.CONFIGURATION, {"terminal": True, "measured": True}  # measured
    # measured, but stopped before the end: it had clearly lost, or was over-saturated
    # (perflab.lab.decide: early_stop); the figures that decided are kept — never a failure
    STOPPED_EARLY = "stopped-early", Blame.CONFIGURATION, {"terminal": True, "measured": True}
    UNSUPPORTED = "unsupported", Blame.CONFIGURATION, {"terminal": True, "startup": True, "supervised": True}  # refused: never launched
    CRASHED = "crashed", Blame.CONFIGURATION, {"terminal": True, "retried": True, "startup": True, "supervised": True}  # the engine died
    TIMEOUT = "timeout", Blame.CONFIGURATION, {"terminal": True, "retried": True, "startup": True, "supervised": True}  # never ready in time
    # the engine served but the benchmark could not run (ended a run before any measurement:
    # that decides every profile, as a startup failure does)
    FAILED = "failed", Blame.CONFIGURATION, {"terminal": True, "retried": True, "startup": True}
    # the engine, alive, stopped streaming: no token on any open stream for stall_s
    STALLED = "stalled", Blame.CONFIGURATION, {"terminal": True, "retried": True}
    # -- not a result
    PENDING = "pending"  # not measured (yet)
    INTERRUPTED = "interrupted", Blame.MACHINE, {"terminal": True}  # Ctrl-C, a busy machine, perflab itself

    @property
    def is_result(self) -> bool:
        """A stored fact about the configuration (reused by a resumed study)."""
        return self.blame is Blame.CONFIGURATION

    @property
    def is_failure(self) -> bool:
        """A result that is not a measurement: the configuration did not serve or measure."""
        return self.is_result and not self.measured

    @classmethod
    def startup_failures(cls) -> tuple[Status, ...]:
        """The states a run can end in before measuring anything, deciding every profile."""
        return tuple(s for s in cls if s.startup)

    @classmethod
    def supervisor_states(cls) -> tuple[Status, ...]:
        """The states of one launch, in lifecycle order."""
        return tuple(s for s in cls if s.supervised)
