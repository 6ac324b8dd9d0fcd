"""The executor's event sink and its KV slot pool."""

from __future__ import annotations

import asyncio
import sys
from array import array
from collections import deque
from operator import attrgetter

from harness.records.kinds import KINDS, FirstToken, Record, columns_of
from harness.records.parts import PartWriter
from harness.replay.clock import Clock

# Per event kind, its columns and a getter of their values from a declared record.
_ROWS = {k: (cols, attrgetter(*cols)) for k in KINDS for cols in [columns_of(k)]}


class Recorder:
    """Stamps events with run id, sequence number and clock time, and appends them."""

    def __init__(self, writer: PartWriter, run_id: str, clock: Clock) -> None:
        self._writer = writer
        self._run_id = run_id
        self._clock = clock
        self._seq = 0

    def emit(self, record: Record, t_ns: int | None = None) -> int:
        """Append one event (its kind's declaration, harness.records.kinds: a column the kind
        does not have cannot be given); returns its timestamp (now unless `t_ns`)."""
        t = self._clock.now_ns() if t_ns is None else t_ns
        cols, values = _ROWS[type(record)]
        row = dict(zip(cols, values(record), strict=True))
        row["run_id"], row["seq"], row["t_ns"], row["event"] = self._run_id, self._seq, t, \
            record.KIND
        self._seq += 1
        self._writer.append(row)
        return t

    def flush(self) -> None:
        """Hand what is buffered to the writer (written in the background)."""
        self._writer.flush()

    def close(self) -> None:
        """Flush and wait until every record is on disk."""
        self._writer.close()


class ChunkTimes:
    """The callback of one streamed call: at its first chunk of tokens it records
    `first_token`; the time from each chunk to the next it keeps, in whole microseconds, for
    `call_end`'s `token_gaps` (little-endian uint32): per-token ITL as the client saw it."""

    __slots__ = ("_rec", "_clock", "_cols", "_last", "_gaps", "first_ns")

    def __init__(self, rec: Recorder, clock: Clock, trajectory_id: str, traffic: str,
                 step: int, slot: int | None) -> None:
        self._rec = rec
        self._clock = clock
        self._cols = (trajectory_id, traffic, step, slot)
        self._last: int | None = None
        self._gaps = array("I")
        self.first_ns: int | None = None  # when the first chunk of tokens came

    def __call__(self) -> None:
        if self._last is None:
            tid, traffic, step, slot = self._cols
            self._last = self._rec.emit(FirstToken(trajectory_id=tid, traffic=traffic,
                                                   step=step, slot=slot))
            self.first_ns = self._last
            return
        now = self._clock.now_ns()
        self._gaps.append(min((now - self._last) // 1000, 0xFFFFFFFF))
        self._last = now

    def gaps(self) -> bytes | None:
        """The gaps as stored, None when the call streamed fewer than two chunks."""
        if not self._gaps:
            return None
        if self._gaps.itemsize != 4 or sys.byteorder != "little":
            return b"".join(int(g).to_bytes(4, "little") for g in self._gaps)
        return self._gaps.tobytes()


class SlotPool:
    """The server's KV slots; the harness assigns them, so a kept slot blocks admission.

    First come, first served: a released slot goes straight to the longest waiter, so a task that
    frees a slot and asks again at once queues behind those already waiting.
    """

    def __init__(self, slots: int, ids: list[int] | None = None) -> None:
        """A pool of slots 0..slots-1, or of `ids` among them (a shard of a run assigns its
        own slots only: harness.plan.shard.shard_slots)."""
        ids = list(range(slots)) if ids is None else ids
        if not ids or min(ids) < 0 or max(ids) >= slots:
            raise ValueError("a slot pool needs at least one slot, each in [0, slots)")
        self.total = len(ids)
        self._free = sorted(ids, reverse=True)
        self._is_free = [False] * slots  # membership in O(1): pools of thousands of slots
        for i in ids:
            self._is_free[i] = True
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
