"""Ctrl-C and SIGTERM stop a run cleanly against the real llama-server the harness started:
exit 130 / 143 within 10 s, run.json `interrupted`, the server's process group ended and its
private folder removed; a second signal stops at once and still kills the server."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from harness.cli import main
from harness.records.store import read_records
from tests.live.processes import alive

pytestmark = pytest.mark.live


def _start_run(tmp_path: Path) -> tuple[subprocess.Popen[bytes], Path]:
    trace = tmp_path / "t.parquet"
    assert CliRunner().invoke(main, ["traces", "gen", "--profile", "bench-small",
                                     "--trajectories", "12", "--seed", "1",
                                     "--out", str(trace)]).exit_code == 0
    out = tmp_path / "run"
    # Its own session, as a shell job would be: a signal to its group is what Ctrl-C sends.
    proc = subprocess.Popen([sys.executable, "-m", "harness", "run", "--trace", str(trace),
                             "--policy", "swap", "--slots", "2", "--ctx-per-slot", "2048",
                             "--out", str(out)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and not any((out / "records").glob("part-*.parquet")):
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
        time.sleep(0.2)
    time.sleep(1.0)  # requests in flight, a swap dump or two on disk
    return proc, out


def _server(out: Path) -> dict[str, Any]:
    run = json.loads((out / "run.json").read_text())
    process: dict[str, Any] = run["server_process"]
    assert process["pid"] and alive(process["pid"])
    return process


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_stop_signal_ends_the_run_cleanly(tmp_path: Path, signum: int, code: int) -> None:
    proc, out = _start_run(tmp_path)
    server = _server(out)
    t0 = time.monotonic()
    os.killpg(proc.pid, signum)
    proc.wait(timeout=30)
    took = time.monotonic() - t0
    err = proc.stderr.read().decode() if proc.stderr else ""
    assert proc.returncode == code, err
    assert took < 10, f"stopping took {took:.1f} s"
    # Progress lines may come first; the end is one line saying what happened.
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith("error: "), err
    run = json.loads((out / "run.json").read_text())
    assert run["status"] == "interrupted"
    assert not alive(server["pid"]), "the local llama-server outlived the run"
    assert not Path(server["tmp_dir"]).exists(), "the server's dump folder was left behind"
    # What was measured before the signal stays readable, each started trajectory ended.
    rec = read_records(out)
    started = set(rec[rec.event == "trajectory_start"].trajectory_id)
    ends = rec[rec.event == "trajectory_end"]
    assert started and set(ends.trajectory_id) == started
    assert "run-interrupted" in set(ends.reason)
    assert set(ends[ends.reason == "run-interrupted"].status) == {"interrupted"}


def test_a_second_signal_stops_at_once_and_kills_the_server(tmp_path: Path) -> None:
    proc, out = _start_run(tmp_path)
    server = _server(out)
    os.killpg(proc.pid, signal.SIGTERM)
    time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(timeout=10)
    assert proc.returncode == 143
    deadline = time.monotonic() + 5
    while alive(server["pid"]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(server["pid"]), "a forced exit left the local llama-server running"
    assert not Path(server["tmp_dir"]).exists(), "a forced exit left the server's dump folder"


def test_a_local_server_that_dies_ends_the_run_at_once(tmp_path: Path) -> None:
    """The llama-server killed mid-run: the harness stops within seconds with one line and
    exit 3 instead of sending every remaining call to a dead server."""
    proc, out = _start_run(tmp_path)
    server = _server(out)
    os.kill(server["pid"], signal.SIGKILL)
    t0 = time.monotonic()
    proc.wait(timeout=60)
    took = time.monotonic() - t0
    err = proc.stderr.read().decode() if proc.stderr else ""
    assert proc.returncode == 3, err
    assert took < 10, f"the dead server was noticed after {took:.1f} s"
    last = err.strip().splitlines()[-1]
    assert "exited mid-run" in last and "Traceback" not in err
    run = json.loads((out / "run.json").read_text())
    assert run["status"] == "interrupted" and "exited mid-run" in run["stop_reason"]
    assert not Path(server["tmp_dir"]).exists()
