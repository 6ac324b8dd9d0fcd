"""The executor's event sink and its KV slot pool."""

from __future__ import annotations

import asyncio
from typing import Any

from harness.records.schema import RECORD_COLUMNS
from harness.records.store import PartWriter
from harness.replay.clock import Clock


class Recorder:
    """Stamps events with run id, sequence number and clock time, and appends them."""

    def __init__(self, writer: PartWriter, run_id: str, clock: Clock) -> None:
        self._writer = writer
        self._run_id = run_id
        self._clock = clock
        self._seq = 0

    def emit(self, event: str, t_ns: int | None = None, **cols: Any) -> int:
        """Append one event; returns its timestamp. Unknown columns are a programming error."""
        unknown = set(cols) - set(RECORD_COLUMNS)
        if unknown:
            raise KeyError(f"unknown record columns: {sorted(unknown)}")
        t = self._clock.now_ns() if t_ns is None else t_ns
        row = {"run_id": self._run_id, "seq": self._seq, "t_ns": t, "event": event}
        row.update(cols)
        self._seq += 1
        self._writer.append(row)
        return t

    def flush(self) -> None:
        self._writer.flush()


class SlotPool:
    """The server's KV slots; the harness assigns them, so a kept slot blocks admission."""

    def __init__(self, slots: int) -> None:
        if slots < 1:
            raise ValueError("a slot pool needs at least one slot")
        self.total = slots
        self._free = list(range(slots - 1, -1, -1))
        self._cond = asyncio.Condition()

    @property
    def free(self) -> int:
        return len(self._free)

    async def acquire(self) -> int:
        async with self._cond:
            await self._cond.wait_for(lambda: bool(self._free))
            return self._free.pop()

    async def release(self, slot: int) -> None:
        async with self._cond:
            if slot in self._free:
                raise RuntimeError(f"slot {slot} released twice")
            self._free.append(slot)
            self._cond.notify()
