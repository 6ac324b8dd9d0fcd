"""What a long replay shows while it runs: agents active, calls done of planned, calls per
second, errors, the client's own lag, elapsed time and an estimate of what is left.

The executor keeps the counts (`Progress`); `report` prints a line every `every_s` seconds of
the run's clock, to a terminal as one line rewritten in place, elsewhere (a CI log, a file) as
plain lines.
"""

from __future__ import annotations

import sys
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TextIO

import numpy as np

from harness.replay.clock import NS, Clock, sleep_s

LAG_WINDOW = 2000  # the latest tool-end wake-up lags the P99 is taken over


@dataclass
class Progress:
    """Counts the executor keeps as it goes."""

    calls_planned: int
    agents_active: int = 0
    calls_done: int = 0
    call_errors: int = 0
    trajectories_done: int = 0
    lags_ms: deque[float] = field(default_factory=lambda: deque(maxlen=LAG_WINDOW))

    def line(self, elapsed_s: float) -> str:
        """One status line at `elapsed_s` into the run."""
        rate = self.calls_done / elapsed_s if elapsed_s > 0 else 0.0
        left = max(0, self.calls_planned - self.calls_done)
        eta = f"{left / rate:.0f}s" if rate > 0 else "-"
        lag = (f"{float(np.percentile(np.fromiter(self.lags_ms, float), 99)):.1f} ms"
               if self.lags_ms else "-")
        return (f"[{elapsed_s:6.0f}s] {self.agents_active} agents active, "
                f"{self.calls_done:,}/{self.calls_planned:,} calls ({rate:,.1f}/s), "
                f"{self.call_errors} errors, client lag P99 {lag}, ETA {eta}")


def interval_s(stream: TextIO | None = None) -> float:
    """How often to report: every second on a terminal, every ten seconds in a log."""
    return 1.0 if (stream or sys.stderr).isatty() else 10.0


async def report(progress: Progress, clock: Clock, every_s: float,
                 write: Callable[[str], None] | None = None,
                 stream: TextIO | None = None) -> None:
    """Print progress.line every `every_s` s until cancelled: to `write` when given, else to
    `stream` (stderr), rewritten in place when it is a terminal."""
    out = stream or sys.stderr
    tty = write is None and out.isatty()
    try:
        while True:
            await sleep_s(clock, every_s)
            text = progress.line(clock.now_ns() / NS)
            if write is not None:
                write(text)
            elif tty:
                out.write("\r" + text + "\x1b[K")
                out.flush()
            else:
                out.write(text + "\n")
                out.flush()
    finally:
        if tty:
            out.write("\n")
            out.flush()
