"""The client's garbage collector during a replay: kept out of the measurements, and accounted.

Python's cyclic collector stops the event loop while it walks the young objects (and, in a full
collection, every object): at 10,000 agents against a ~0 ms stub its pauses reached 90-440 ms
and made the client's lag P99 146-340 ms, where with the collector off it was 58 ms and the peak
RSS the same (367 MiB): the replay makes almost no cyclic garbage, reference counting frees the
rest. So during a replay the objects built before it (trace, plan, policy) are frozen out of the
collector's reach, automatic collection is off, and a watch collects only when the objects
tracked since the last collection have grown by `COLLECT_AFTER_OBJECTS` (a long run that does
make cyclic garbage, failing calls with their tracebacks, stays bounded). Every collection that
runs is timed and reported in run.json (`client_gc`), with the most objects it had pending.
"""

from __future__ import annotations

import asyncio
import gc
import time
from typing import Any

COLLECT_AFTER_OBJECTS = 2_000_000  # tracked objects allocated (net) since the last collection
WATCH_S = 1.0


class GcWatch:
    """Use as `async with`: freeze and stop automatic collection on entry; collect when the
    tracked objects grow past the bound; on exit, restore the collector and collect once."""

    def __init__(self, collect_after: int = COLLECT_AFTER_OBJECTS, watch_s: float = WATCH_S
                 ) -> None:
        self.collect_after = collect_after
        self.watch_s = watch_s
        self.collections = [0, 0, 0]
        self.forced = 0
        self.total_s = 0.0
        self.max_s = 0.0
        self.over_1ms = 0
        self.frozen = 0
        self.most_pending = 0
        self.after_replay: dict[str, float] | None = None
        self._t0 = 0.0
        self._was_enabled = True
        self._task: asyncio.Task[None] | None = None

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
            return
        took = time.perf_counter() - self._t0
        self.collections[info["generation"]] += 1
        self.total_s += took
        self.max_s = max(self.max_s, took)
        if took > 1e-3:
            self.over_1ms += 1

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.watch_s)
            self.check()

    def check(self) -> None:
        """Collect (all generations) when the objects pending have grown past the bound."""
        pending = gc.get_count()[0]
        self.most_pending = max(self.most_pending, pending)
        if pending >= self.collect_after:
            self.forced += 1
            gc.collect()

    async def __aenter__(self) -> GcWatch:
        gc.collect()  # what is garbage already goes now, not in the middle of the replay
        gc.freeze()
        self.frozen = gc.get_freeze_count()
        self._was_enabled = gc.isenabled()
        gc.disable()
        gc.callbacks.append(self._callback)
        self._task = asyncio.create_task(self._watch())
        return self

    async def __aexit__(self, *_: object) -> None:
        if self._task is not None:
            self._task.cancel()
        self.check()
        gc.callbacks.remove(self._callback)
        gc.unfreeze()
        t0 = time.perf_counter()
        found = gc.collect()
        self.after_replay = {"ms": round(1e3 * (time.perf_counter() - t0), 3),
                             "unreachable": found}
        if self._was_enabled:
            gc.enable()

    def to_dict(self) -> dict[str, Any]:
        """Collections during the replay (the one after it apart), their time, the largest
        number of objects pending, and how many objects were frozen."""
        return {"automatic": False, "collect_after_objects": self.collect_after,
                "collections": {str(g): n for g, n in enumerate(self.collections)},
                "forced": self.forced, "total_ms": round(1e3 * self.total_s, 3),
                "max_ms": round(1e3 * self.max_s, 3), "over_1ms": self.over_1ms,
                "most_pending_objects": self.most_pending, "frozen_objects": self.frozen,
                "after_replay": self.after_replay}
