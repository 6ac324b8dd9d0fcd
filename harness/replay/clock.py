"""Clocks injected into the executor: the real monotonic clock, and a virtual one for tests.

The virtual clock never waits for real time: when every task is blocked on the clock it jumps to
the earliest wake-up, so tests of tool waits, TTLs and deadlines run instantly and exactly.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from typing import Protocol

NS = 1_000_000_000


class Clock(Protocol):
    """Monotonic nanoseconds since the clock's origin, and sleeping on that timeline."""

    def now_ns(self) -> int: ...

    async def sleep_until(self, t_ns: int) -> None: ...


async def sleep_s(clock: Clock, seconds: float) -> None:
    """Sleep `seconds` on `clock`."""
    await clock.sleep_until(clock.now_ns() + int(seconds * NS))


class RealClock:
    """time.monotonic_ns relative to construction; wall_anchor_ns is the wall time at origin.

    `origin_wall_ns`: put the origin at that wall-clock time instead (it may lie ahead: the
    clock reads negative until then), so load generators started apart share one timeline."""

    def __init__(self, origin_wall_ns: int | None = None) -> None:
        mono, wall = time.monotonic_ns(), time.time_ns()
        anchor = wall if origin_wall_ns is None else origin_wall_ns
        self._origin = mono + (anchor - wall)
        self.wall_anchor_ns = anchor

    def now_ns(self) -> int:
        return time.monotonic_ns() - self._origin

    async def sleep_until(self, t_ns: int) -> None:
        delay = (t_ns - self.now_ns()) / NS
        if delay > 0:
            await asyncio.sleep(delay)
        else:
            await asyncio.sleep(0)


class VirtualClock:
    """Virtual time that advances only when all tasks are waiting on it.

    Idle is detected by letting the event loop spin `settle` times with no new sleeper and no
    wake-up; that is exact for code whose only waits are this clock, asyncio primitives and
    in-memory fakes (what unit tests use).
    """

    def __init__(self, settle: int = 50) -> None:
        self._now = 0
        self._heap: list[tuple[int, int, asyncio.Future[None]]] = []
        self._counter = itertools.count()
        self._settle = settle
        self._driver: asyncio.Task[None] | None = None
        self._activity = 0
        self.wall_anchor_ns = 0

    def now_ns(self) -> int:
        return self._now

    async def sleep_until(self, t_ns: int) -> None:
        if t_ns <= self._now:
            await asyncio.sleep(0)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._heap, (t_ns, next(self._counter), fut))
        self._activity += 1
        self._ensure_driver()
        await fut

    def _ensure_driver(self) -> None:
        if self._driver is None or self._driver.done():
            self._driver = asyncio.get_running_loop().create_task(self._drive())

    async def _drive(self) -> None:
        while self._heap:
            seen = self._activity
            for _ in range(self._settle):
                await asyncio.sleep(0)
            if seen != self._activity:
                continue
            t, _, fut = heapq.heappop(self._heap)
            if fut.cancelled():
                continue
            self._now = max(self._now, t)
            self._activity += 1
            fut.set_result(None)
