"""A run that lost trajectories to its server says so (exit 4, a warning); an incomplete run's
summary says it is incomplete."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from harness.commands.exits import SERVER_FAILURES_EXIT, exit_on_server_failures
from harness.metrics.summary import summarize_dir
from harness.policies import make_policy
from harness.records.manifest import Outcome, RunManifest, read_manifest
from harness.replay.clock import VirtualClock
from harness.replay.runner import ReplaySettings, replay
from tests.fakes.memory_adapter import MemoryAdapter
from tests.unit.test_executor import RATES, plan_of, traj

BASELINE = Path(__file__).resolve().parents[2] / "reports" / "baseline" / "keep"


def test_server_failures_are_counted_apart_from_task_failures(tmp_path: Path) -> None:
    async def go() -> RunManifest:
        clock = VirtualClock()
        run = RunManifest(run_id="s", policy="keep")
        # Call 0 (trajectory a's first) fails on the server; b's context overflows a tiny slot.
        adapter = MemoryAdapter(clock, fail_calls={0}, ctx=200)
        big = traj("b")
        await replay(adapter, clock, plan_of(traj("a"), big, traj("c"), concurrency=1),
                     make_policy("keep"), tmp_path / "o", run, RATES, ReplaySettings(0.5))
        return run

    run = asyncio.run(go())
    assert run.outcome is not None
    assert run.outcome.failed == 1 and run.outcome.server_failed == 1
    warnings = summarize_dir(tmp_path / "o", run=run)["warnings"]
    assert any("failed because the server failed" in w for w in warnings)


def test_exit_code_4_names_the_policies(capsys: pytest.CaptureFixture[str]) -> None:
    ok = RunManifest(run_id="a", policy="keep", outcome=Outcome(3, 0, 0, 0, 0))
    bad = RunManifest(run_id="b", policy="swap", outcome=Outcome(1, 0, 2, 0, 2))
    exit_on_server_failures([ok])  # nothing to say
    with pytest.raises(SystemExit) as e:
        exit_on_server_failures([ok, bad])
    assert e.value.code == SERVER_FAILURES_EXIT
    assert "swap: 2" in capsys.readouterr().err


def test_an_incomplete_run_is_marked_incomplete(tmp_path: Path) -> None:
    run_dir = tmp_path / "keep"
    shutil.copytree(BASELINE, run_dir)
    text = (run_dir / "run.json").read_text().replace('"status": "finished"',
                                                      '"status": "running"')
    (run_dir / "run.json").write_text(text)
    assert read_manifest(run_dir).status == "running"
    warnings = summarize_dir(run_dir)["warnings"]
    assert any(w.startswith("incomplete run (status running)") for w in warnings)


def test_a_server_that_exits_mid_run_ends_it_with_its_reason(tmp_path: Path) -> None:
    from harness.errors import ServerError
    from harness.replay.run import RunOptions, execute_run
    from harness.selftest.measure import synthetic_trace
    from harness.specs.shared import arrivals_of
    from tests.fakes.runtime import MemoryRuntime

    trace = synthetic_trace(tmp_path / "t.parquet", 2, 5, 1.0, 2)  # 1 s tool waits
    opts = RunOptions(trace=trace, policy="keep", out=tmp_path / "o", runtime="memory",
                      arrivals=arrivals_of(2, None, False, 1.0), pinning=None,
                      scrape_interval_s=0.05)
    with pytest.raises(ServerError, match="exited mid-run"):
        execute_run(opts, lambda _: None, runtime=MemoryRuntime(dies_after_s=0.5))
    run = read_manifest(tmp_path / "o")
    assert run.status == "interrupted" and run.stop_reason is not None
    assert run.duration_s is not None and run.duration_s < 2.5  # not the plan's ~4 s


def test_dumps_left_on_a_remote_server_are_named(tmp_path: Path) -> None:
    import dataclasses

    class Remote(MemoryAdapter):
        def __post_init__(self) -> None:
            super().__post_init__()
            self.capabilities = dataclasses.replace(self.capabilities, local_dump_files=False)

    async def go() -> RunManifest:
        clock = VirtualClock()
        run = RunManifest(run_id="r", policy="swap")
        await replay(Remote(clock), clock, plan_of(traj("a")), make_policy("swap"),
                     tmp_path / "o", run, RATES, ReplaySettings(0.5))
        return run

    run = asyncio.run(go())
    assert run.cleanup is not None and len(run.cleanup.remote_dumps_left) == 1
    assert run.cleanup.remote_dumps_left[0].startswith("r-a-")
    assert read_manifest(tmp_path / "o").cleanup == run.cleanup  # round trip
    warnings = summarize_dir(tmp_path / "o", run=run)["warnings"]
    assert any("left on the remote server's disk" in w for w in warnings)


def test_a_cleanup_warning_is_one_short_line_however_many_errors() -> None:
    from harness.records.manifest import Cleanup

    errors = [f"a{i}: ConnectionTimeoutError: erase of slot {i}" for i in range(6000)]
    c = Cleanup(False, ["d1.bin", "d2.bin"], errors[:50], [], 6000)
    line = "; ".join(c.problems())
    assert line == ("slots still busy at the end; 2 dump file(s) left; 6000 cleanup error(s), "
                    "the first: a0: ConnectionTimeoutError: erase of slot 0")
    assert Cleanup(True, [], ["x"], []).problems() == ["1 cleanup error(s), the first: x"]
    assert Cleanup(True, [], [], ["remote.bin"]).problems() == []
