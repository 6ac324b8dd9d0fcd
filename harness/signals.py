"""SIGINT and SIGTERM mean "stop now, cleanly"; a second one means "stop at once".

The first signal unwinds the command: in a replay the running task is cancelled (in-flight
requests end, every trajectory is recorded as interrupted, slots are erased, dumps deleted, the
local server stopped, run.json marked `interrupted`); elsewhere KeyboardInterrupt (SIGINT) or
`Terminated` (SIGTERM) is raised and the same `finally` blocks run. The command exits 130 or
143. A second signal while that cleanup runs kills every local server this process started
(by process group) and exits at once with the same code.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Callable, Iterator
from types import FrameType

from harness.errors import Terminated

EXIT_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}

_received: list[int] = []
# Running replays' stop hooks (harness.replay.loop): a stop asked for from another thread (a
# load generator's driver) reaches them as a signal would.
_stoppers: list[Callable[[int], None]] = []
# What a forced exit must still do before it leaves: kill the local servers this process
# started (registered by harness.adapters.launchers.process, which knows them).
_at_force_exit: list[Callable[[], None]] = []


def at_force_exit(hook: Callable[[], None]) -> None:
    """Run `hook` (errors ignored) when a second signal forces the process out."""
    if hook not in _at_force_exit:
        _at_force_exit.append(hook)


def forget_at_force_exit(hook: Callable[[], None]) -> None:
    """Drop a hook `at_force_exit` registered (what it would stop has ended)."""
    with contextlib.suppress(ValueError):
        _at_force_exit.remove(hook)


def force_exit(signum: int) -> None:
    """Kill every local server this process started (by process group) and leave now, with
    the signal's exit code."""
    for hook in list(_at_force_exit):
        with contextlib.suppress(Exception):
            hook()
    sys.stderr.write(f"\nerror: {signal.Signals(signum).name} again: stopped at once\n")
    sys.stderr.flush()
    os._exit(EXIT_CODES.get(signal.Signals(signum), 1))


def note(signum: int) -> bool:
    """Record a signal; True when it is the second one (the caller forces the exit)."""
    _received.append(signum)
    return len(_received) > 1


def received() -> int | None:
    """The first stop signal received, if any."""
    return _received[0] if _received else None


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    if note(signum):
        force_exit(signum)
    raise Terminated()


def _on_sigint(signum: int, frame: FrameType | None) -> None:
    if note(signum):
        force_exit(signum)
    raise KeyboardInterrupt()


def stop_while_starting(signum: int, _frame: FrameType | None) -> None:
    """The handler from the command's first instruction until `install`: importing the command
    line takes a second or two, in which nothing has been started or written, so a stop
    signal ends it at once, in one line (not Python's KeyboardInterrupt traceback)."""
    os.write(2, f"error: stopped by {signal.Signals(signum).name} while starting; nothing "
             "ran\n".encode())
    os._exit(EXIT_CODES.get(signal.Signals(signum), 1))


def install() -> None:
    """Make SIGTERM unwind like Ctrl-C, and a second signal force the exit (main thread). A
    SIGINT handler of the caller's own (a test runner's) is left in place."""
    _received.clear()
    signal.signal(signal.SIGTERM, _on_sigterm)
    if signal.getsignal(signal.SIGINT) in (signal.default_int_handler, stop_while_starting):
        signal.signal(signal.SIGINT, _on_sigint)


@contextlib.contextmanager
def deferred() -> Iterator[Callable[[], None]]:
    """While code waits inside a C extension that must not see an exception raised by a signal
    handler (Ray's calls turn one into a SystemError), SIGINT and SIGTERM are only noted; the
    check it yields raises KeyboardInterrupt or Terminated, as the handlers above would, where
    the caller can act on it. A second signal still forces the exit. Main thread only."""
    got: list[int] = []

    def note_only(signum: int, frame: FrameType | None) -> None:
        if note(signum):
            force_exit(signum)
        got.append(signum)

    def check() -> None:
        if got:
            raise KeyboardInterrupt() if got[0] == signal.SIGINT else Terminated()

    previous = {s: signal.signal(s, note_only) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield check
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def add_stopper(stop: Callable[[int], None]) -> None:
    """Register a running replay's stop hook (thread-safe to call: see request_stop)."""
    _stoppers.append(stop)


def remove_stopper(stop: Callable[[int], None]) -> None:
    with contextlib.suppress(ValueError):
        _stoppers.remove(stop)


def request_stop(signum: int = signal.SIGTERM) -> bool:
    """Stop the running replays as `signum` would, from any thread; False when none runs."""
    for stop in list(_stoppers):
        stop(signum)
    return bool(_stoppers)
