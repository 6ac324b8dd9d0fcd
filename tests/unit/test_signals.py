"""SIGINT and SIGTERM during a replay's event loop cancel its work, let its cleanup run, and
surface as KeyboardInterrupt / Terminated; the process's own handlers are put back."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from harness import signals
from harness.errors import Terminated
from harness.replay import loop

# the signal handlers and the signals seen, as they were before each test
pytestmark = pytest.mark.usefixtures("fresh_signal_state")


@pytest.mark.parametrize(("signum", "raised"), [(signal.SIGTERM, Terminated),
                                                (signal.SIGINT, KeyboardInterrupt)])
def test_a_signal_cancels_the_loop_and_its_cleanup_runs(signum: int,
                                                        raised: type[BaseException]) -> None:
    cleaned: list[str] = []

    async def work() -> None:
        try:
            os.kill(os.getpid(), signum)
            await asyncio.sleep(30)
        finally:
            await asyncio.sleep(0.01)  # a cleanup that awaits still runs
            cleaned.append("done")

    before = signal.getsignal(signum)
    with pytest.raises(raised):
        loop.run(work())
    assert cleaned == ["done"]
    assert signals.received() == signum
    assert signal.getsignal(signum) is before


def test_without_a_signal_a_cancelled_run_stays_a_cancellation() -> None:
    async def work() -> None:
        task = asyncio.current_task()
        assert task is not None
        task.cancel()
        await asyncio.sleep(1)

    with pytest.raises(asyncio.CancelledError):
        loop.run(work())


def test_install_makes_sigterm_raise_terminated() -> None:
    signals.install()
    with pytest.raises(Terminated):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler interrupts the sleep
