"""The executor's event sink and its KV slot pool."""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

from harness.records.parts import PartWriter
from harness.records.schema import RECORD_COLUMNS
from harness.replay.clock import Clock

_KNOWN = frozenset(RECORD_COLUMNS)


class Recorder:
    """Stamps events with run id, sequence number and clock time, and appends them."""

    def __init__(self, writer: PartWriter, run_id: str, clock: Clock) -> None:
        self._writer = writer
        self._run_id = run_id
        self._clock = clock
        self._seq = 0

    def emit(self, event: str, t_ns: int | None = None, **cols: Any) -> int:
        """Append one event; returns its timestamp. Unknown columns are a programming error."""
        if not _KNOWN.issuperset(cols):
            raise KeyError(f"unknown record columns: {sorted(set(cols) - _KNOWN)}")
        t = self._clock.now_ns() if t_ns is None else t_ns
        # The keyword dict is the caller's own: it becomes the row (one dict per event).
        cols["run_id"], cols["seq"], cols["t_ns"], cols["event"] = self._run_id, self._seq, t, event
        self._seq += 1
        self._writer.append(cols)
        return t

    def flush(self) -> None:
        """Hand what is buffered to the writer (written in the background)."""
        self._writer.flush()

    def close(self) -> None:
        """Flush and wait until every record is on disk."""
        self._writer.close()


class SlotPool:
    """The server's KV slots; the harness assigns them, so a kept slot blocks admission.

    First come, first served: a released slot goes straight to the longest waiter, so a task that
    frees a slot and asks again at once queues behind those already waiting.
    """

    def __init__(self, slots: int) -> None:
        if slots < 1:
            raise ValueError("a slot pool needs at least one slot")
        self.total = slots
        self._free = list(range(slots - 1, -1, -1))
        self._is_free = [True] * slots  # membership in O(1): pools of thousands of slots
        self._waiters: deque[asyncio.Future[int]] = deque()

    @property
    def free(self) -> int:
        return len(self._free)

    async def acquire(self) -> int:
        if self._free and not self._waiters:
            slot = self._free.pop()
            self._is_free[slot] = False
            return slot
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            return await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self._give(fut.result())  # handed over as we were cancelled: pass it on
            else:
                self._waiters.remove(fut)
            raise

    async def release(self, slot: int) -> None:
        if self._is_free[slot]:
            raise RuntimeError(f"slot {slot} released twice")
        self._give(slot)

    def _give(self, slot: int) -> None:
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(slot)
                return
        self._free.append(slot)
        self._is_free[slot] = True
