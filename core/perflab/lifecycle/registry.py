"""Every engine this process started and has not torn down yet, and the ways to stop them.

* :func:`signal_guard` (async context manager, used by ``perflab launch`` and the lab
  runner): the first SIGINT/SIGTERM/SIGHUP (a closed SSH session) cancels the work inside it, so every engine's context
  manager tears down (shielded); a second signal says teardown is under way; a third
  SIGKILLs every registered engine at once.
* :func:`install_signal_handlers` for callers without an event loop at hand: SIGTERM and
  SIGHUP behave like Ctrl-C, and the atexit last resort is armed.
* An ``atexit`` hook SIGKILLs whatever is still registered when the interpreter exits
  (an exception escaped, ``sys.exit`` from a thread...).
* Should perflab itself be SIGKILLed, every engine's keeper (:mod:`.keeper`) sees its lifeline
  close and stops the engine; see docs/lifecycle.md.
"""

from __future__ import annotations

import atexit
import signal
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Protocol

import anyio
import structlog

log = structlog.get_logger("perflab.supervisor")


class _Live(Protocol):
    engine: str

    async def teardown(self) -> None: ...

    def kill_now(self) -> None: ...


_LIVE: dict[int, _Live] = {}
_LOCK = threading.Lock()
_ATEXIT_ARMED = False


def register(instance: _Live) -> None:
    global _ATEXIT_ARMED
    with _LOCK:
        _LIVE[id(instance)] = instance
        if not _ATEXIT_ARMED:
            atexit.register(kill_all_now)
            _ATEXIT_ARMED = True


def unregister(instance: _Live) -> None:
    with _LOCK:
        _LIVE.pop(id(instance), None)


def live_instances() -> list[_Live]:
    with _LOCK:
        return list(_LIVE.values())


def kill_all_now() -> None:
    """SIGKILL every registered engine's processes, synchronously (last resort)."""
    for inst in live_instances():
        try:
            inst.kill_now()
        except Exception:  # a last resort must try every instance
            pass


async def teardown_all() -> None:
    """Tear every registered engine down concurrently; shielded from cancellation."""
    with anyio.CancelScope(shield=True):
        async with anyio.create_task_group() as tg:
            for inst in live_instances():
                tg.start_soon(inst.teardown)


@dataclass
class SignalGuard:
    signals: list[int] = field(default_factory=list)

    @property
    def interrupted(self) -> bool:
        return bool(self.signals)

    @property
    def exit_code(self) -> int:
        """The conventional exit status for the first signal received (130 for SIGINT)."""
        return 128 + int(self.signals[0]) if self.signals else 0


@asynccontextmanager
async def signal_guard(signals: tuple[signal.Signals, ...] = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)) -> AsyncIterator[SignalGuard]:
    """Run the body so that SIGINT/SIGTERM cancel it and every engine is torn down.

    The body is cancelled (not killed): ``async with EngineInstance(...)`` blocks inside it run
    their shielded teardown. On leaving, anything still registered is torn down too.
    The caller checks ``guard.interrupted`` / ``guard.exit_code`` afterwards.
    """
    guard = SignalGuard()
    error: BaseException | None = None
    body = anyio.CancelScope()

    async def watch(*, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        with anyio.open_signal_receiver(*signals) as received:
            task_status.started()
            async for sig in received:
                guard.signals.append(int(sig))
                name = signal.Signals(sig).name
                n = len(guard.signals)
                if n == 1:
                    log.warning("signal.received", signal=name, action="tearing down every engine")
                    body.cancel()
                elif n == 2:
                    log.warning("signal.received", signal=name,
                                action="teardown under way; send it once more to SIGKILL every engine now")
                else:
                    log.warning("signal.received", signal=name, action="SIGKILL every engine")
                    kill_all_now()

    async with anyio.create_task_group() as tg:
        await tg.start(watch)
        try:
            with body:
                yield guard
        except anyio.get_cancelled_exc_class():
            raise  # cancelled from outside: the task group handles it
        except BaseException as exc:  # re-raised below, unwrapped by the task group
            error = exc
        finally:
            await teardown_all()
            tg.cancel_scope.cancel()
    if error is not None:
        raise error


def install_signal_handlers() -> None:
    """For callers without :func:`signal_guard`: make SIGTERM and SIGHUP act like Ctrl-C (so
    the same cancellation and teardown path runs) and arm the atexit last resort. Main thread only."""
    global _ATEXIT_ARMED
    with _LOCK:
        if not _ATEXIT_ARMED:
            atexit.register(kill_all_now)
            _ATEXIT_ARMED = True
    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) in (signal.SIG_DFL, None):
            signal.signal(sig, lambda signum, frame: signal.raise_signal(signal.SIGINT))
