"""Errors with a one-line message for the user (the CLI prints them without a traceback)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def did_you_mean(name: object, choices: Iterable[str]) -> str:
    """`` (did you mean 'vllm'?)``: the choice closest to ``name`` (dashes and underscores and
    case alike: ``max-num-seqs`` finds ``max_num_seqs``), or ``""`` when none is close."""
    def norm(text: object) -> str:
        return str(text).lower().replace("-", "_")

    by_norm = {norm(c): c for c in choices}
    hint = difflib.get_close_matches(norm(name), list(by_norm), n=1)
    return f" (did you mean {by_norm[hint[0]]!r}?)" if hint else ""


class PerflabError(Exception):
    """A user-facing error: ``str(exc)`` is a complete, actionable one-line message."""

    exit_code = 1


class UsageError(PerflabError):
    """The user asked for something malformed (bad option, bad plan file)."""

    exit_code = 2


class UnsupportedOption(PerflabError):
    """A plugin cannot express a serving option on its engine."""

    exit_code = 2

    def __init__(self, engine: str, option: str, why: str) -> None:
        self.engine, self.option, self.why = engine, option, why
        super().__init__(f"{engine} cannot express {option}: {why}")


class UnknownEngine(UsageError):
    def __init__(self, name: str, known: list[str]) -> None:
        known_s = ", ".join(sorted(known)) or "none installed"
        super().__init__(f"unknown engine {name!r}{did_you_mean(name, known)} (installed engines: {known_s})")


class PluginLoadError(PerflabError):
    """Raised in --strict mode when any plugin failed to load."""


class HookDeadlineExceeded(PerflabError):
    """A plugin's hook did not return within its deadline (:data:`perflab.contract.hookspecs.HOOK_DEADLINES_S`):
    the plugin's fault, never the configuration's. Python cannot stop a thread, so the call is
    abandoned in its daemon thread, which ends with perflab's process at the latest."""

    def __init__(self, plugin: str, hook: str, deadline_s: float) -> None:
        self.plugin, self.hook, self.deadline_s = plugin, hook, deadline_s
        super().__init__(
            f"plugin {plugin}: {hook} did not return within its deadline of {deadline_s:g} s "
            "(that plugin's fault: perflab abandoned the call, which ends with perflab at the latest)"
        )
