"""What keeps the client's own stalls out of the numbers: the garbage collector off during a
replay (bounded, accounted), and a large server sample recorded in slices."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import pytest

from harness.replay.clock import RealClock
from harness.replay.gcwatch import GcWatch
from harness.replay.runner import SCRAPE_YIELD_ROWS, ScrapeStats, _scrape_loop


class _Cycle:
    def __init__(self) -> None:
        self.me = self


def test_collection_is_off_during_a_replay_bounded_and_accounted() -> None:
    async def go() -> tuple[bool, int, dict[str, Any]]:
        watch = GcWatch(collect_after=5_000, watch_s=0.01)
        async with watch:
            enabled_inside = gc.isenabled()
            frozen_inside = gc.get_freeze_count()
            for _ in range(20):
                for _ in range(1_000):
                    _Cycle()  # cyclic garbage: only the collector frees it
                await asyncio.sleep(0.02)
        return enabled_inside, frozen_inside, watch.to_dict()

    assert gc.isenabled()
    enabled_inside, frozen_inside, report = asyncio.run(go())
    assert not enabled_inside and frozen_inside > 0
    assert gc.isenabled() and gc.get_freeze_count() == 0
    assert report["automatic"] is False and report["forced"] >= 2
    assert int(report["collections"]["2"]) == report["forced"]  # the forced ones are full
    assert 5_000 <= report["most_pending_objects"] < 20_000
    assert report["after_replay"] is not None and report["after_replay"]["unreachable"] >= 0


def test_the_collector_is_restored_even_when_the_replay_fails() -> None:
    async def go() -> None:
        async with GcWatch():
            raise RuntimeError("replay failed")

    with pytest.raises(RuntimeError, match="replay failed"):
        asyncio.run(go())
    assert gc.isenabled() and gc.get_freeze_count() == 0


class _ManySlots:
    """An adapter whose every sample is 10 slices' worth of rows."""

    def __init__(self) -> None:
        self.rows = 10 * SCRAPE_YIELD_ROWS

    async def scrape(self) -> list[tuple[str, str, str, float]]:
        return [("slots", "n_prompt_tokens", f'{{"slot": {i}}}', 1.0) for i in range(self.rows)]


class _Rows:
    def __init__(self, marks: list[str]) -> None:
        self.marks = marks
        self.count = 0

    def append(self, row: dict[str, Any]) -> None:
        self.count += 1
        if self.count % SCRAPE_YIELD_ROWS == 1:
            self.marks.append("slice")


def test_a_large_sample_is_recorded_in_slices_with_the_loop_served_between() -> None:
    async def go() -> tuple[list[str], int, ScrapeStats]:
        marks: list[str] = []
        rows = _Rows(marks)
        stats = ScrapeStats(60.0)
        sampler = asyncio.create_task(_scrape_loop(
            _ManySlots(), RealClock(), rows, stats, []))  # type: ignore[arg-type]

        async def other_work() -> None:
            while True:
                marks.append("other")
                await asyncio.sleep(0)

        other = asyncio.create_task(other_work())
        while stats.samples < 1:
            await asyncio.sleep(0.001)
        sampler.cancel()
        other.cancel()
        return marks, rows.count, stats

    marks, count, stats = asyncio.run(go())
    assert count == 10 * SCRAPE_YIELD_ROWS and stats.samples == 1
    first, last = marks.index("slice"), len(marks) - marks[::-1].index("slice")
    between = marks[first:last]
    assert between.count("slice") == 10 and between.count("other") >= 9
