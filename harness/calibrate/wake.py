"""How an engine's iteration times vary: after idle time (the wake), and from one to the next.

A paged engine on CPU computes its first iteration after idling slower: measured on the pinned
vLLM server, a 48-token append after 512 cached tokens took 3.2 ms right after other work and
4.6 ms after 100 ms or more of idle time, growing smoothly in between (3.5 ms after 10 ms, 4.0
after 30, 4.4 after 60). A calibration's appends run back to back, an agent's resume after a
tool's wait, so the simulator adds wake (1 - e^(-idle / tau)) to the first iteration after idle
time (harness.model.iteration.IterationCosts.wake_after). calibrate measures the same append
right after its prefix's call, after WAKE_MID_S and after WAKE_IDLE_S of idle time;
`wake_from` turns the three medians into (wake, tau).

The same append repeated NOISE_REPEATS times right after other work gives the server's own
spread: each time over their median (`noise_from`), which the simulator draws a factor from for
each iteration. Measured on the CPU servers (k new tokens after c cached, three of each, against
their median): vLLM P5 0.83, P95 1.20, P99 1.98; SGLang 0.93, 1.17, 1.54. Without it the model
prices every iteration at its median, and its tails come out short by the spread.
"""

from __future__ import annotations

import math

WAKE_CONTEXT = 512  # cached tokens before the timed append
WAKE_MID_S = 0.03  # idle time of the middle measurement (where the growth is steep)
WAKE_IDLE_S = 0.3  # idle time long enough for the whole cost (measured: flat from 0.1 s)
WAKE_GAPS_S = (0.0, WAKE_MID_S, WAKE_IDLE_S)
WAKE_REPEATS = 5  # of each idle time
NOISE_REPEATS = 30  # of the append right after other work (the wake's first point too)


def wake_from(busy_s: float, mid_s: float, idle_s: float) -> tuple[float, float] | None:
    """(wake, tau) in seconds from the median times of the same append sent right after other
    work, after WAKE_MID_S and after WAKE_IDLE_S of idle time; None where idling cost nothing
    measurable (the idle append no slower than the busy one). The middle point gives tau:
    mid - busy = wake (1 - e^(-WAKE_MID_S / tau)), its fraction clamped to [0.05, 0.95]."""
    wake = idle_s - busy_s
    if not (math.isfinite(wake) and wake > 0):
        return None
    frac = min(max((mid_s - busy_s) / wake, 0.05), 0.95)
    return wake, -WAKE_MID_S / math.log(1.0 - frac)

