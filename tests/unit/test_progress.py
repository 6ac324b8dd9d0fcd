"""The progress line of a long replay."""

from __future__ import annotations

import asyncio
import contextlib
import io
from pathlib import Path

import pytest

from harness.policies import make_policy
from harness.policies.base import ServerRates
from harness.records.manifest import RunManifest
from harness.replay.clock import VirtualClock
from harness.replay.progress import Progress, interval_s, report
from harness.replay.runner import ReplaySettings, replay
from tests.fakes.memory_adapter import MemoryAdapter
from tests.unit.test_executor import plan_of, traj


def test_the_line_says_where_the_run_is() -> None:
    p = Progress(calls_planned=300, agents_active=4, calls_done=100, call_errors=2)
    p.lags_ms.extend([0.1] * 90 + [5.0] * 10)
    assert p.line(20.0) == ("[    20s] 4 agents active, 100/300 calls (5.0/s), 2 errors, "
                            "client lag P99 5.0 ms, ETA 40s")
    assert Progress(calls_planned=10).line(0.0).endswith("client lag P99 -, ETA -")


def test_report_prints_on_the_run_clock_until_cancelled() -> None:
    lines: list[str] = []

    async def go() -> None:
        clock = VirtualClock()
        p = Progress(calls_planned=5)
        task = asyncio.create_task(report(p, clock, 2.0, lines.append))
        await clock.sleep_until(5 * 10**9)
        p.calls_done = 5
        await clock.sleep_until(7 * 10**9)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    asyncio.run(go())
    assert [ln.split("]")[0] for ln in lines] == ["[     2s", "[     4s", "[     6s"]
    assert "5/5 calls" in lines[-1]
    assert interval_s(io.StringIO()) == 10.0  # not a terminal: a plain line now and then


def test_a_replay_reports_as_it_goes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    async def go() -> None:
        clock = VirtualClock()
        await replay(MemoryAdapter(clock), clock, plan_of(traj("a", latency=5.0)),
                     make_policy("keep"), tmp_path / "out", RunManifest(run_id="p"),
                     ServerRates(1000.0, 1e9, 100.0), ReplaySettings(progress_every_s=2.0))

    asyncio.run(go())
    err = capsys.readouterr().err.splitlines()  # a 5.1 s run: lines at 2 s and 4 s
    assert len(err) == 2
    assert err[0].startswith("[     2s] 1 agents active, 1/2 calls")
    assert err[1].startswith("[     4s] 1 agents active, 1/2 calls")
