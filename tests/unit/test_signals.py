"""SIGINT and SIGTERM during a replay's event loop cancel its work, let its cleanup run, and
surface as KeyboardInterrupt / Terminated; the process's own handlers are put back."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

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


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_while_the_command_starts_ends_it_in_one_line(signum: int, code: int) -> None:
    """From its first instruction the command handles stop signals (harness.entry): one that
    lands while the command line is being imported ends it with the signal's code and one
    line, never Python's KeyboardInterrupt traceback."""
    # The child installs the entry's handlers, then signals itself before any command runs.
    code_text = ("import os, signal, time\n"
                 "from harness.signals import stop_while_starting\n"
                 "for s in (signal.SIGINT, signal.SIGTERM):\n"
                 "    signal.signal(s, stop_while_starting)\n"
                 f"os.kill(os.getpid(), {int(signum)})\n"
                 "time.sleep(30)\n")
    done = subprocess.run([sys.executable, "-c", code_text], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == code
    assert done.stderr == (f"error: stopped by {signal.Signals(signum).name} while starting; "
                           "nothing ran\n")


def test_the_command_replaces_the_starting_handler_with_its_own() -> None:
    signal.signal(signal.SIGINT, signals.stop_while_starting)
    signal.signal(signal.SIGTERM, signals.stop_while_starting)
    signals.install()
    assert signal.getsignal(signal.SIGINT) is signals._on_sigint
    assert signal.getsignal(signal.SIGTERM) is signals._on_sigterm


def test_a_caller_s_own_sigint_handler_is_kept() -> None:
    def mine(_signum: int, _frame: object) -> None:
        pass

    signal.signal(signal.SIGINT, mine)
    signals.install()
    assert signal.getsignal(signal.SIGINT) is mine


def test_the_entry_point_handles_signals_before_importing_the_command_line(
        tmp_path: Path) -> None:
    """Ctrl-C the moment `harness` starts (its import takes a second or two): exit 130 and
    one `error:` line, whether it lands while importing or once the command runs."""
    proc = subprocess.Popen([sys.executable, "-m", "harness", "record", "--upstream",
                             "http://127.0.0.1:9", "--listen", "127.0.0.1:0", "--out",
                             str(tmp_path / "rec")], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert [ln for ln in err.splitlines() if ln.startswith("error:")], err
