"""Naming why an engine died: shared signature matching, log-line triage and signal deaths.

Every engine plugin matches its engine's own error strings against the engine's output; this
module holds the shared shape (a :class:`Signature`), the scan orders plugins need, and the
core's own rules that apply to every engine:

* :func:`first_signature` — signatures in priority order; for the first one found anywhere,
  quote its first matching line (the root cause, not a later wrapper error).
* :func:`earliest_line` — lines in log order; the earliest line matching any signature wins
  (for engines whose final error only wraps a root cause printed earlier, like vLLM's
  "Engine core initialization failed"). INFO/DEBUG lines never match.
* :func:`is_notable` — which lines the output pump keeps from the *whole* output (everything
  but INFO/DEBUG lines), so a root cause printed long before the end is still classified.
* :func:`root_exception_line` — the first Python exception line (``SomeError: message``), for
  wrappers whose root cause no signature names (never perflab's own ``CancelledError``).
* :func:`signal_cause` / :func:`fallback_cause` — deaths by signal are named
  (``killed-by-signal``), and an unnamed exit quotes the first error line, not the last.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Sequence
from dataclasses import dataclass, replace

from perflab.contract.types import CrashCause


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


#: Failures that read the same whatever the engine: the model is loaded through Hugging Face
#: (huggingface_hub's RepositoryNotFoundError / GatedRepoError / HFValidationError, transformers'
#: "is not a local folder and is not a valid model identifier" and "does not appear to have a
#: file named config.json"), identical in SGLang's and TensorRT-LLM's logs. The default
#: :meth:`perflab.contract.plugin_base.EnginePlugin.classify_crash` tries them after a plugin's own.
MODEL_NOT_FOUND = signature(
    "model-not-found",
    r"RepositoryNotFoundError|Repository Not Found for url|is not a local folder and is not a valid model identifier"
    r"|GatedRepoError|does not appear to have a file named config\.json|HFValidationError",
    "the model could not be found (not a local path, unknown or gated Hugging Face repo)",
    "check the model id/path, HF_TOKEN for gated repos, and HF_HUB_OFFLINE",
    "https://huggingface.co/docs/huggingface_hub/package_reference/utilities#huggingface_hub.errors.RepositoryNotFoundError",
)
SHARED_SIGNATURES: tuple[Signature, ...] = (MODEL_NOT_FOUND,)


# ---------------------------------------------------------------------------- line triage

#: vLLM prefixes a process tag: ``(APIServer pid=1)``, ``(EngineCore_DP0 pid=2)``,
#: ``(VllmWorker TP0 pid=3)``.
#: Informational log lines of the engines perflab knows; they never name a root cause, and
#: the output pump does not keep them beyond the tail. Sources of the formats:
#: vLLM ``(APIServer pid=1) INFO 11-24 06:04:11 [file.py:1] ...`` (vllm/logger.py, 0.32.0) and
#: uvicorn's ``INFO:     ...``; llama.cpp ``0.00.080.619 I srv ...`` (common/log.cpp, level
#: letters I/D/W/E); TensorRT-LLM ``[TensorRT-LLM][INFO]`` and ``[TRT-LLM] [I]``
#: (tensorrt_llm/logger.py); SGLang and MindIE ``[...] INFO ...``-style Python logging.
_INFO_LINE = re.compile(
    r"^\s*(?:\([\w:. -]+?(?: pid=\d+)?\)\s+)?(?:INFO|DEBUG)(?::|\s+\d\d-\d\d\s)"  # vLLM, uvicorn
    r"|^\d+\.\d\d\.\d\d\d\.\d\d\d [ID] "  # llama.cpp with timestamps
    r"|\[TensorRT-LLM\]\[(?:INFO|DEBUG|VERBOSE)\]|\[TRT-LLM\] \[[IV]\]"  # TensorRT-LLM
    r"|^\[[\d\-: ,.T]+(?: [\w\-]+)?\] (?:INFO|DEBUG)\b"  # [time] INFO (SGLang style)
    r"|^(?:INFO|DEBUG)\s+\d{4}-\d\d-\d\d"  # INFO 2025-01-01 ...
)

#: A Python exception line as the traceback module prints it: ``pkg.mod.SomeError: message``.
_EXCEPTION_LINE = re.compile(r"^(?:\([\w:. -]+?(?: pid=\d+)?\)\s+)?(?:ERROR\s.*?\]\s+)?([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt))(?::\s|$)")

#: perflab's own cancellation and normal shutdown surface as these; they are never a root cause.
_NOT_ROOT = re.compile(r"\b(?:asyncio\.(?:exceptions\.)?)?CancelledError\b|\bKeyboardInterrupt\b|\bSystemExit\b|\bGeneratorExit\b")

#: Warnings name no root cause (vLLM's ulimit warning quotes "OSError: [Errno 24]").
_WARNING_LINE = re.compile(r"^\s*(?:\([\w:. -]+?(?: pid=\d+)?\)\s+)?WARNING\b|^\d+\.\d\d\.\d\d\d\.\d\d\d W |\[TensorRT-LLM\]\[WARNING\]|\[TRT-LLM\] \[W\]")

#: The traceback module's own lines between chained exceptions.
_CHAIN = re.compile(r"Traceback \(most recent call last\):|^During handling of the above exception|^The above exception was the direct cause")

#: Lines that look like errors, for the generic fallback (no plugin signature matched).
_ERRORISH = re.compile(r"(?:Error|Exception|error:|FATAL|Traceback|Killed|failed|abort|Segmentation fault)", re.I)


def is_info(line: str) -> bool:
    """An engine's INFO/DEBUG line (never a root cause)."""
    return bool(_INFO_LINE.search(line))


def is_notable(line: str) -> bool:
    """Worth keeping from the whole output for crash classification (not INFO/DEBUG, not blank)."""
    return bool(line.strip()) and not is_info(line)


#: vLLM's per-process prefix and level, e.g. ``(EngineCore pid=1) ERROR 11-24 07:10:45 [core.py:9] ``.
_PREFIX = re.compile(r"^\s*\([\w:. -]+?(?: pid=\d+)?\)\s+(?:[A-Z]+\s+\d\d-\d\d(?: \d\d:\d\d:\d\d)? \[[^\]]*\]\s?)?")
_FRAME = re.compile(r'^\s*File "[^"]*", line \d+')


def _candidates(lines: Sequence[str]) -> list[str]:
    """Lines that may name a cause: not INFO/DEBUG, not blank, and not the source-code line a
    traceback prints under each ``File "...", line N`` (it quotes code such as
    ``raise HFValidationError(`` or an f-string holding the very message a signature matches)."""
    out: list[str] = []
    after_frame = False
    for ln in lines:
        body = _PREFIX.sub("", ln, count=1)
        if after_frame:
            after_frame = False
            if body.startswith((" ", "\t")):
                continue
        if _FRAME.match(body):
            after_frame = True
            continue
        if ln.strip() and not is_info(ln):
            out.append(ln)
    return out


# ---------------------------------------------------------------------------- scan orders


def first_signature(log_tail: str, signatures: Sequence[Signature]) -> CrashCause | None:
    lines = _candidates(log_tail.splitlines())
    for sig in signatures:
        for line in lines:
            if sig.pattern.search(line):
                return sig.cause(line)
    return None


def earliest_line(log_tail: str, signatures: Sequence[Signature]) -> CrashCause | None:
    for line in _candidates(log_tail.splitlines()):
        for sig in signatures:
            if sig.pattern.search(line):
                return sig.cause(line)
    return None


def root_exception_line(log_text: str, *, exclude: re.Pattern[str] | None = None) -> str | None:
    """The first Python exception line in the log (``SomeError: message``), skipping
    cancellations/interrupts and lines matching ``exclude`` (the wrapper itself)."""
    for line in _candidates(log_text.splitlines()):
        s = line.strip()
        m = _EXCEPTION_LINE.match(s)
        if not m or _NOT_ROOT.search(m.group(1)):
            continue
        if exclude is not None and exclude.search(s):
            continue
        return s
    return None


# ---------------------------------------------------------------------------- signals and fallback

#: What a death by signal usually means; SIGKILL without a request from perflab is most often
#: the kernel's OOM killer (signal(7), and the kernel's mm/oom_kill.c sends SIGKILL).
SIGNAL_MEANINGS: dict[int, str] = {
    signal.SIGKILL: "possibly the kernel's OOM killer (check `dmesg` / `journalctl -k` for 'Out of memory')",
    signal.SIGSEGV: "a segmentation fault (a crash in native code: a kernel, driver or extension)",
    signal.SIGBUS: "a bus error (often /dev/shm too small in a container, or a truncated memory-mapped file)",
    signal.SIGABRT: "an abort (a native assertion or std::terminate; see the lines above it)",
    signal.SIGILL: "an illegal instruction (native code built for a newer CPU than this one, or using AMX tiles "
                   "its process never asked Linux for)",
    signal.SIGFPE: "an arithmetic exception in native code",
    signal.SIGTERM: "terminated by someone other than perflab",
    signal.SIGINT: "interrupted (SIGINT) by someone other than perflab",
    signal.SIGHUP: "its terminal or session went away (SIGHUP)",
}


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def signal_cause(exit_code: int | None, log_text: str = "") -> CrashCause | None:
    """``killed-by-signal`` for a negative exit code (Popen's "killed by signal N")."""
    if exit_code is None or exit_code >= 0:
        return None
    signum = -exit_code
    name = signal_name(signum)
    meaning = SIGNAL_MEANINGS.get(signum, "")
    return CrashCause(
        "killed-by-signal",
        f"the engine was killed by {name}" + (f": {meaning}" if meaning else ""),
        line=root_exception_line(log_text),
        hint="see the engine log and the kernel log (dmesg) for who sent it",
        source="signal(7)",
    )


def with_signal(cause: CrashCause, exit_code: int | None) -> CrashCause:
    """A plugin's named cause, noting that the process died by a signal."""
    if exit_code is None or exit_code >= 0 or cause.name == "killed-by-signal":
        return cause
    return replace(cause, explanation=f"{cause.explanation} (the process was killed by {signal_name(-exit_code)})")


def _last_errorish(log_text: str) -> str | None:
    lines = [ln.strip() for ln in _candidates(log_text.splitlines()) if not _NOT_ROOT.search(ln)]
    errorish = [ln for ln in lines if _ERRORISH.search(ln) and not _WARNING_LINE.search(ln) and not _CHAIN.search(ln)]
    return errorish[-1] if errorish else None


def fallback_cause(exit_code: int | None, log_text: str) -> CrashCause:
    """No plugin named it: a signal death is named; else quote the first exception line
    (the root of a traceback chain), else the last error-looking line."""
    by_signal = signal_cause(exit_code, log_text)
    if by_signal is not None:
        return by_signal
    line = root_exception_line(log_text) or _last_errorish(log_text)
    how = f"exited with code {exit_code}" if exit_code is not None else "failed"
    if exit_code == 0:
        how = "exited with code 0 although perflab did not stop it"
    return CrashCause("unknown", f"the engine {how}", line=line, hint="see the engine log")
