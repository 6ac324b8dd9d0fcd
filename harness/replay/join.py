"""Waiting on tasks with the injected clock: settling tasks however they end, and a parent's
wait for its sub-agents with a deadline and a TTL alarm on the way (timers on the executor's
clock, a virtual one in tests, never asyncio's own)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from harness.replay.clock import Clock


async def settle(tasks: Sequence[asyncio.Task[Any]], cancel: bool) -> None:
    """Wait until every task is done (first cancelling, when `cancel`, those not cancelled
    yet: a second cancel would cut their cleanup short); a cancel that arrives meanwhile is
    passed on to them, and the wait goes on until they have ended."""
    if cancel:
        for t in tasks:
            if not t.cancelling():
                t.cancel()
    cancelled = False
    while True:
        try:
            await asyncio.gather(*tasks, return_exceptions=True)
            break
        except asyncio.CancelledError:
            cancelled = True
            for t in tasks:
                t.cancel()
    if cancelled:
        raise asyncio.CancelledError()  # the cancel that arrived is not lost


async def join_by(clock: Clock, tasks: Sequence[asyncio.Task[Any]], deadline_ns: int | None,
                  alarm_ns: int | None, on_alarm: Callable[[], Awaitable[None]]) -> bool:
    """Wait until every task has ended: True; or until `deadline_ns` passes with some still
    running: False (they are left running). `on_alarm` runs once at `alarm_ns` if that comes
    first. Cancelled, the wait cancels nothing itself."""
    join = asyncio.ensure_future(asyncio.wait(tasks))
    try:
        while not join.done():
            wake = min((x for x in (deadline_ns, alarm_ns) if x is not None), default=None)
            if wake is None:
                await asyncio.wait([join])
                break
            timer = asyncio.ensure_future(clock.sleep_until(wake))
            try:
                await asyncio.wait([join, timer], return_when=asyncio.FIRST_COMPLETED)
            finally:
                timer.cancel()
            if join.done():
                break
            if alarm_ns is not None and clock.now_ns() >= alarm_ns:
                alarm_ns = None
                await on_alarm()
            if deadline_ns is not None and clock.now_ns() >= deadline_ns and not join.done():
                return False
        return True
    finally:
        join.cancel()
