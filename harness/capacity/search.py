"""Adaptive search for the most concurrent agents a server holds under an SLO.

A pure state machine: the driver asks `next_agents()`, measures that many agents, and hands the
outcome back with `record()`. No I/O, no clocks, no randomness.

- Ramp: measure `start`, then max(prev + 1, ceil(prev * growth)) capped at `max_agents`, while
  every count passes. The first failing count ends the ramp; a passing `max_agents` ends the
  search ("max-agents").
- Bisection: lo is the largest passing count below the smallest failing count hi (lo is 0 when
  none passes, so a failing `start` bisects downward). While hi - lo > max(1, floor(resolution *
  lo)) the midpoint is measured; then the search is "resolved" (or "none-pass" when 1 fails).
  lo and hi are recomputed from every judged count, so noise that bends the curve cannot wedge it.
- Repeats near the boundary: a measurement marked `close` (some SLO term within the closeness
  margin) is measured again, up to `max_repeats` measurements of that count; a count fails if
  any of its measurements failed or saturated.
- Falling goodput: a count also fails when its best goodput is below (1 - goodput_drop) times the
  best goodput of a smaller passing count: more agents finishing less work is over-saturation.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class PointVerdict:
    """What one measurement at `agents` concurrent agents showed."""

    agents: int
    passed: bool  # every SLO term met
    close: bool = False  # some SLO term within the closeness margin: worth measuring again
    saturated: bool = False  # the server saturated during the point (growing queues): a fail
    goodput_per_min: float | None = None  # successful tasks per minute in the measured window


def judge(points: Iterable[PointVerdict], goodput_drop: float) -> dict[int, bool]:
    """Each measured count's verdict from all its measurements, smallest count first."""
    by_count: dict[int, list[PointVerdict]] = {}
    for p in points:
        by_count.setdefault(p.agents, []).append(p)
    verdicts: dict[int, bool] = {}
    best_below: float | None = None  # best goodput of a smaller passing count
    for n in sorted(by_count):
        ms = by_count[n]
        ok = all(m.passed and not m.saturated for m in ms)
        goodputs = [m.goodput_per_min for m in ms if m.goodput_per_min is not None]
        best = max(goodputs) if goodputs else None
        if ok and best is not None and best_below is not None:
            ok = best >= (1.0 - goodput_drop) * best_below
        verdicts[n] = ok
        if ok and best is not None:
            best_below = best if best_below is None else max(best_below, best)
    return verdicts


def bounds(verdicts: dict[int, bool]) -> tuple[int, int | None]:
    """(lo, hi): hi the smallest failing count (None if none fails), lo the largest passing count
    below hi (0 if none)."""
    failing = [n for n, ok in verdicts.items() if not ok]
    hi = min(failing) if failing else None
    passing = [n for n, ok in verdicts.items() if ok and (hi is None or n < hi)]
    return (max(passing) if passing else 0), hi


@dataclass(frozen=True)
class SearchResult:
    """Where the search stands: the capacity found, the failing count above it, and why."""

    capacity: int  # largest agent count judged passing (0 when none passed)
    failing_above: int | None  # smallest failing count above capacity (None: none failed)
    reason: str  # "resolved", "max-agents", "none-pass", "budget", "in-progress"
    points: tuple[PointVerdict, ...]  # every measurement, in order
    goodput_drop: float = 0.1  # the falling-goodput rule the verdicts were judged with

    def judged(self) -> dict[int, bool]:
        """Agents -> passing verdict, after repeats and the falling-goodput rule."""
        return judge(self.points, self.goodput_drop)


class CapacitySearch:
    """Ramp, then bisect, for the largest agent count that meets the SLO."""

    def __init__(self, start: int = 1, max_agents: int = 64, growth: float = 2.0,
                 resolution: float = 0.1, max_repeats: int = 2,
                 goodput_drop: float = 0.1) -> None:
        if start < 1:
            raise ValueError(f"start must be >= 1, got {start}")
        if max_agents < start:
            raise ValueError(f"max_agents ({max_agents}) must be >= start ({start})")
        if not growth > 1:
            raise ValueError(f"growth must be > 1, got {growth}")
        if not resolution > 0:
            raise ValueError(f"resolution must be > 0, got {resolution}")
        if max_repeats < 1:
            raise ValueError(f"max_repeats must be >= 1, got {max_repeats}")
        if not 0 <= goodput_drop < 1:
            raise ValueError(f"goodput_drop must be in [0, 1), got {goodput_drop}")
        self._start, self._max, self._growth = start, max_agents, growth
        self._resolution, self._max_repeats, self._drop = resolution, max_repeats, goodput_drop
        self._points: list[PointVerdict] = []
        self._reason: str | None = None
        self._next: int | None = start

    def next_agents(self) -> int | None:
        """The count to measure next; None once done."""
        return self._next

    def record(self, verdict: PointVerdict) -> None:
        """Take the outcome of measuring `next_agents()` agents and choose the next count."""
        if self._next is None:
            raise ValueError(f"the search is done ({self._reason}); nothing to record")
        if verdict.agents != self._next:
            raise ValueError(f"measured {verdict.agents} agents, the search asked for {self._next}")
        self._points.append(verdict)
        self._next = self._choose()

    def stop(self, reason: str = "budget") -> None:
        """End early (the driver ran out of time); a search already done keeps its reason."""
        if self._reason is None:
            self._reason, self._next = reason, None

    @property
    def done(self) -> bool:
        """True once there is nothing more to measure."""
        return self._reason is not None

    def result(self) -> SearchResult:
        """The current lo as capacity, hi as failing_above; reason "in-progress" until done."""
        lo, hi = bounds(judge(self._points, self._drop))
        return SearchResult(lo, hi, self._reason or "in-progress", tuple(self._points),
                            self._drop)

    def _choose(self) -> int | None:
        last = self._points[-1]
        if last.close and sum(p.agents == last.agents for p in self._points) < self._max_repeats:
            return last.agents
        verdicts = judge(self._points, self._drop)
        lo, hi = bounds(verdicts)
        if hi is None:  # ramp: every count so far passes
            prev = max(verdicts)
            if prev >= self._max:
                self._reason = "max-agents"
                return None
            return min(self._max, max(prev + 1, math.ceil(prev * self._growth)))
        if hi - lo <= max(1, math.floor(self._resolution * lo)):
            self._reason = "none-pass" if lo == 0 else "resolved"
            return None
        mid = (lo + hi) // 2  # lo < mid < hi, and nothing strictly between lo and hi is judged
        assert mid not in verdicts
        return mid
