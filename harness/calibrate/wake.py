"""How an engine's iteration times vary: after idle time (the wake), and from one to the next.

A paged engine on CPU computes its first iteration after idling slower: measured on the pinned
vLLM server, a 48-token append after 512 cached tokens took 3.2 ms right after other work and
4.6 ms after 100 ms or more of idle time, growing smoothly in between (3.5 ms after 10 ms, 4.0
after 30, 4.4 after 60). A calibration's appends run back to back, an agent's resume after a
tool's wait, so the simulator adds wake (1 - e^(-idle / tau)) to the first iteration after idle
time (harness.model.iteration.IterationCosts.wake_after). calibrate measures the same append
right after its prefix's call, after WAKE_MID_S and after WAKE_IDLE_S of idle time;
`wake_from` turns the three medians into (wake, tau).

On other machines the wake does not level off. On a 2-core Xeon VM (2026-12-05), the same append
on the pinned vLLM server took 4.8 ms right after other work, 6.5 after 10 ms idle, 7.6 after 30,
8.8 after 100, 11.0 after 300, 19.4 after 1 s and 33.2 after 3 s (16 each), and its way there and
back (the client's time to first token less the server's prompt time) grew from 5.7 to 58.6 ms;
a plain aiohttp client and a raw-asyncio stub answering at once took 0.65 ms busy and 18.4 ms
after 3 s idle, with a spinning process on either core or not. So calibrate also measures the
wake at WAKE_CURVE_GAPS_S, up to the longest, and `wake_curve` keeps what each idle time added to
the server's time and to the way: the simulator interpolates it (linearly in the idle time,
flat past its last point) wherever it was measured, and the (wake, tau) form elsewhere; the
server's part in the first iteration after idle time, the way's in the request's way there.

A replay samples the server's metrics (every 0.2 s by default), and a sample wakes the front
end: on the pinned vLLM server (2026-12-06, 8 each, interleaved) the way added 69.8 ms after
1 s of idle time without a sampler and 42.5 ms with one every 0.2 s, 125.6 against 72.5 ms after
3 s (the prompt time 47.6 / 39.8 and 87.0 / 79.8 ms). So calibrate measures the wake under the
replays' sampling (harness.calibrate.calls.metrics_sampled).

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
WAKE_CURVE_GAPS_S = (0.01, WAKE_MID_S, WAKE_IDLE_S, 1.0, 3.0)  # the wake's curve: idle times
WAKE_GAPS_S = (0.0, *WAKE_CURVE_GAPS_S)
WAKE_REPEATS = 5  # of each idle time
WAKE_LONG_REPEATS = 3  # of each idle time of a second or more (their median is wide apart)
NOISE_REPEATS = 30  # of the append right after other work (the wake's first point too)


def repeats(gap_s: float) -> int:
    """How many times calibrate times the append after `gap_s` of idle time."""
    return NOISE_REPEATS if gap_s == 0 else WAKE_REPEATS if gap_s < 1.0 else WAKE_LONG_REPEATS


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


def wake_curve(busy: tuple[float, float], after: dict[float, tuple[float, float]]
               ) -> tuple[tuple[float, float, float], ...]:
    """(idle s, server s, way s) per idle time of `after`, ascending: what the append's server
    time and its way there and back (medians, `after[idle]`) took beyond `busy`'s (the same
    right after other work). Each part is at least 0 and never less than at a shorter idle
    time (a longer idle costs no less: a dip is the medians' noise). Empty where idling cost
    nothing measurable."""
    curve: list[tuple[float, float, float]] = []
    server = way = 0.0
    for idle in sorted(after):
        s, w = after[idle]
        server = max(server, s - busy[0])
        way = max(way, w - busy[1])
        curve.append((idle, server, way))
    return tuple(curve) if server + way > 0 else ()
