"""The event loop a replay runs on: uvloop where it is installed (its lower per-callback cost is
less client lag at load), else asyncio's default; HARNESS_EVENT_LOOP=asyncio forces the latter.
run.json records which loop ran (`event_loop`)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from harness import signals
from harness.errors import Terminated

T = TypeVar("T")
# After a stop signal, how long the replay's own cleanup (slots erased, dumps deleted, records
# flushed) may take before it is cut short; the local server's stop follows.
CLEANUP_S = 5.0


def _uvloop_factory() -> tuple[Callable[[], asyncio.AbstractEventLoop], str] | None:
    if os.environ.get("HARNESS_EVENT_LOOP", "").lower() == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        return None
    from importlib.metadata import version

    return uvloop.new_event_loop, f"uvloop {version('uvloop')}"


def loop_name() -> str:
    """What `run` will run on: 'uvloop <version>' or 'asyncio'."""
    found = _uvloop_factory()
    return found[1] if found else "asyncio"


def run(coro: Coroutine[Any, Any, T]) -> T:
    """asyncio.run on the loop `loop_name` names. SIGINT and SIGTERM cancel `coro` (its
    cleanup runs, for at most CLEANUP_S before it is cancelled again); then KeyboardInterrupt
    or Terminated is raised. A second signal forces the exit (harness.signals)."""
    found = _uvloop_factory()
    with asyncio.Runner(loop_factory=found[0] if found else None) as runner:
        try:
            return runner.run(_stoppable(coro))
        except asyncio.CancelledError:
            signum = signals.received()
            if signum == signal.SIGTERM:
                raise Terminated() from None
            if signum == signal.SIGINT:
                raise KeyboardInterrupt() from None
            raise


async def _stoppable(coro: Coroutine[Any, Any, T]) -> T:
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None

    def stop(signum: int) -> None:
        if signals.note(signum):
            signals.force_exit(signum)
        task.cancel()
        loop.call_later(CLEANUP_S, task.cancel)  # a cleanup that hangs is cut short

    def stop_from_any_thread(signum: int) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nothing to stop
            loop.call_soon_threadsafe(stop, signum)

    signals.add_stopper(stop_from_any_thread)
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    installed = []
    for s in previous:
        try:
            loop.add_signal_handler(s, stop, s)
            installed.append(s)
        except (ValueError, RuntimeError, NotImplementedError):
            pass  # not the main thread, or no signals here: the process-wide handlers hold
    try:
        return await coro
    finally:
        signals.remove_stopper(stop_from_any_thread)
        for s in installed:
            loop.remove_signal_handler(s)
            signal.signal(s, previous[s])
