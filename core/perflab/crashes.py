"""Helpers for ``perflab_classify_crash`` implementations: named log signatures.

Every engine plugin matches its engine's own error strings against the log tail; this module
holds the shared shape (a :class:`Signature`) and the two scan orders plugins need:

* :func:`first_signature` — signatures in priority order; for the first one found anywhere,
  quote its first matching line (the root cause, not a later wrapper error).
* :func:`earliest_line` — lines in log order; the earliest line matching any signature wins
  (for engines whose final error only wraps a root cause printed earlier, like vLLM's
  "Engine core initialization failed").
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from perflab.types import CrashCause


@dataclass(frozen=True)
class Signature:
    """A named failure: the regex of the engine's own log line, and what to tell the user."""

    name: str
    pattern: re.Pattern[str]
    explanation: str
    hint: str
    source: str  # where the error string comes from (engine file or issue URL)

    def cause(self, line: str) -> CrashCause:
        return CrashCause(self.name, self.explanation, line=line.strip(), hint=self.hint, source=self.source)


def signature(name: str, regex: str, explanation: str, hint: str, source: str) -> Signature:
    return Signature(name, re.compile(regex), explanation, hint, source)


def first_signature(log_tail: str, signatures: Sequence[Signature]) -> CrashCause | None:
    lines = log_tail.splitlines()
    for sig in signatures:
        for line in lines:
            if sig.pattern.search(line):
                return sig.cause(line)
    return None


def earliest_line(log_tail: str, signatures: Sequence[Signature]) -> CrashCause | None:
    for line in log_tail.splitlines():
        for sig in signatures:
            if sig.pattern.search(line):
                return sig.cause(line)
    return None
