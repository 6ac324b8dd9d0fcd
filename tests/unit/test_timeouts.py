"""Timeouts end in a recorded failure or one line, never a hang or a traceback."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from harness.adapters.base import CompletionRequest, CompletionResult
from harness.cli import main
from harness.policies import make_policy
from harness.records.manifest import RunManifest
from harness.records.store import read_records
from harness.replay.clock import VirtualClock
from harness.replay.runner import ReplaySettings, replay
from tests.fakes.memory_adapter import MemoryAdapter
from tests.unit.test_executor import RATES, plan_of, traj

TRACE = Path(__file__).resolve().parents[2] / "traces" / "bench-small.parquet"


@pytest.fixture
def silent_server() -> Iterator[str]:
    """Accepts connections and never answers."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        sock.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(sock.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    stop.set()
    thread.join()
    for c in held:
        c.close()
    sock.close()


def test_a_server_that_never_answers_is_one_line_and_exit_3(silent_server: str,
                                                            tmp_path: Path) -> None:
    t0 = time.monotonic()
    res = CliRunner().invoke(main, ["run", "--url", silent_server, "--trace", str(TRACE),
                                    "--policy", "keep", "--out", str(tmp_path / "o"),
                                    "--request-timeout", "0.5"])
    assert res.exit_code == 3, res.output
    assert time.monotonic() - t0 < 10
    lines = res.output.strip().splitlines()
    assert lines[-1].startswith("error: ") and "server-info" in lines[-1]
    assert "Traceback" not in res.output


@pytest.mark.parametrize("flag", ["--stall-timeout", "--first-token-timeout",
                                  "--connect-timeout", "--request-timeout"])
def test_a_timeout_flag_out_of_range_is_refused(flag: str, tmp_path: Path) -> None:
    res = CliRunner().invoke(main, ["run", "--url", "http://127.0.0.1:9", "--trace",
                                    str(TRACE), "--policy", "keep", "--out",
                                    str(tmp_path / "o"), flag, "0"])
    assert res.exit_code == 2 and flag in res.output
    assert len(res.output.strip().splitlines()) == 1


class _StallsOnce(MemoryAdapter):
    """The first call of trajectory 'a' ends as a stalled stream does."""

    async def complete(self, req: CompletionRequest,
                       on_tokens: Callable[[], object]) -> CompletionResult:
        if not self.calls:
            self.calls.append(req)
            return CompletionResult(status="timeout", tokens=[7],
                                    error="timeout: the stream stalled: no data for 120 s")
        return await super().complete(req, on_tokens)


def test_a_stalled_call_fails_its_trajectory_and_the_run_goes_on(tmp_path: Path) -> None:
    async def go() -> RunManifest:
        clock = VirtualClock()
        run = RunManifest(run_id="t", policy="keep")
        await replay(_StallsOnce(clock), clock,
                     plan_of(traj("a"), traj("b"), concurrency=1), make_policy("keep"),
                     tmp_path / "out", run, RATES, ReplaySettings(0.5))
        return run

    run = asyncio.run(go())
    rec = read_records(tmp_path / "out")
    ends = rec[rec.event == "trajectory_end"].set_index("trajectory_id")
    assert ends.loc["a", "status"] == "failed" and ends.loc["a", "reason"].startswith("timeout")
    assert ends.loc["b", "status"] == "completed"
    first = rec[rec.event == "call_end"].iloc[0]
    assert first.status == "timeout" and first.trajectory_id == "a"
    assert run.status == "finished" and run.outcome is not None and run.outcome.failed == 1
