"""`harness run --workers 2` on a local Ray instance against a real llama-server it starts: the
merged results count what a single process counts; a load generator killed mid-run is recorded
(worker-lost) and the run finishes; Ctrl-C stops the actors, Ray and the server, whenever it
comes (Ray starting included)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from harness.cli import main
from harness.records.store import read_records
from tests.live.processes import alive

pytestmark = pytest.mark.live

RUN = ["--policy", "swap", "--slots", "2", "--ctx-per-slot", "2048", "--concurrency", "2",
       "--token-scale", "0.5"]


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("trace") / "t.parquet"
    assert CliRunner().invoke(main, ["traces", "gen", "--profile", "bench-small",
                                     "--trajectories", "8", "--seed", "1",
                                     "--out", str(path)]).exit_code == 0
    return path


def _harness(*args: str, **kw: Any) -> subprocess.Popen[bytes]:
    # Its own session, as a shell job is: Ctrl-C goes to its whole process group.
    return subprocess.Popen([sys.executable, "-m", "harness", "run", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True, **kw)


def _ray_folders() -> set[str]:
    return {p.name for p in Path("/tmp").glob("harness-ray-*")}


def _nothing_left(out: Path, before: set[str]) -> None:
    run = json.loads((out / "run.json").read_text())
    pids = [w["pid"] for w in run["workers"]] + [(run.get("server_process") or {}).get("pid")]
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and any(p and alive(p) for p in pids):
        time.sleep(0.2)
    assert not [p for p in pids if p and alive(p)], "a load generator or the server is left"
    assert _ray_folders() <= before, "the local Ray instance's folder is left"


def _counts(out: Path) -> dict[str, Any]:
    s = json.loads((out / "summary.json").read_text())
    rec = read_records(out)
    return {"trajectories": s["trajectories"], "pauses": s["pauses"],
            "actions": s["pause_actions"], "events": Counter(rec["event"].astype(str)),
            "mismatches": s["cache_mismatches"]}


def test_two_workers_count_what_one_process_counts(trace: Path, tmp_path: Path) -> None:
    before = _ray_folders()
    one = _harness("--trace", str(trace), *RUN, "--out", str(tmp_path / "one"))
    assert one.wait(600) == 0, one.stderr.read().decode() if one.stderr else ""
    two = _harness("--trace", str(trace), *RUN, "--workers", "2", "--out", str(tmp_path / "two"))
    assert two.wait(600) == 0, two.stderr.read().decode() if two.stderr else ""
    a, b = _counts(tmp_path / "one"), _counts(tmp_path / "two")
    assert b["trajectories"]["total"] == 8 and b == a
    run = json.loads((tmp_path / "two" / "run.json").read_text())
    assert run["status"] == "finished" and [w["shard"] for w in run["workers"]] == ["0/2", "1/2"]
    assert all(w["outcome"]["completed"] + w["outcome"]["cancelled"] for w in run["workers"])
    assert run["cleanup"]["slots_idle"] is True and run["cleanup"]["dump_files_left"] == []
    # the driver's own local server, pinned as one process's is (not at all where the
    # session's process was pinned to one CPU by an earlier in-process run)
    single = json.loads((tmp_path / "one" / "run.json").read_text())
    assert run["server_flags"] and bool(run["cpu_pinning"]) == bool(single["cpu_pinning"])
    slots = [{int(s) for s in read_records(tmp_path / "two")
              .query("trajectory_id in @ids")["slot"].dropna()}
             for ids in ([t for t, k in _shard_of(tmp_path / "two").items() if k == i]
                         for i in range(2))]
    assert slots == [{0}, {1}]  # each load generator assigns its own slot
    _nothing_left(tmp_path / "two", before)


def _shard_of(out: Path) -> dict[str, int]:
    """Which shard replayed each trajectory (the planner's hash of its id)."""
    from harness.plan.shard import shard_index

    ids = read_records(out).query("event == 'trajectory_start'")["trajectory_id"].astype(str)
    return {t: shard_index(t, 2) for t in ids}


def _wait_running(proc: subprocess.Popen[bytes], out: Path) -> dict[str, Any]:
    deadline = time.monotonic() + 240
    shards = [out / "shards" / f"shard-{i}" / "records" for i in range(2)]
    while time.monotonic() < deadline and not all(any(s.glob("part-*.parquet"))
                                                 for s in shards):
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
        time.sleep(0.2)
    time.sleep(1.0)
    run: dict[str, Any] = json.loads((out / "run.json").read_text())
    return run


def test_a_lost_worker_is_recorded_and_the_run_finishes(trace: Path, tmp_path: Path) -> None:
    before = _ray_folders()
    out = tmp_path / "lost"
    proc = _harness("--trace", str(trace), *RUN, "--workers", "2", "--out", str(out))
    started = _wait_running(proc, out)
    victim = next(w for w in started["workers"] if w["shard"] == "1/2")
    os.kill(victim["pid"], signal.SIGKILL)
    assert proc.wait(600) == 0, proc.stderr.read().decode() if proc.stderr else ""
    err = proc.stderr.read().decode() if proc.stderr else ""
    assert "load generator 1/2 was lost" in err and "Traceback" not in err
    run = json.loads((out / "run.json").read_text())
    lost = {w["shard"]: w["lost"] for w in run["workers"]}
    assert lost == {"0/2": False, "1/2": True} and run["status"] == "interrupted"
    s = json.loads((out / "summary.json").read_text())
    assert s["trajectories"]["total"] == 8 and s["trajectories"]["failed"] >= 1
    ends = read_records(out).query("event == 'trajectory_end'")
    assert len(ends) == 8 and (ends["reason"].astype(str) == "worker-lost").sum() >= 1
    _nothing_left(out, before)


@pytest.mark.parametrize("signum,to_group,code", [(signal.SIGINT, True, 130),
                                                  (signal.SIGTERM, False, 143)])
def test_a_stop_signal_stops_every_worker_ray_and_the_server(
        trace: Path, tmp_path: Path, signum: int, to_group: bool, code: int) -> None:
    """Ctrl-C reaches the whole process group (Ray's processes too); SIGTERM only the command,
    as a supervisor sends it."""
    before = _ray_folders()
    out = tmp_path / "stopped"
    proc = _harness("--trace", str(trace), *RUN, "--workers", "2", "--out", str(out))
    _wait_running(proc, out)
    t0 = time.monotonic()
    if to_group:
        os.killpg(proc.pid, signum)
    else:
        proc.send_signal(signum)
    assert proc.wait(60) == code
    assert time.monotonic() - t0 < 30
    err = proc.stderr.read().decode() if proc.stderr else ""
    assert ("interrupted" in err or "terminated" in err) and "Traceback" not in err
    run = json.loads((out / "run.json").read_text())
    assert run["status"] == "interrupted" and len(run["workers"]) == 2
    assert (out / "summary.json").is_file()
    _nothing_left(out, before)


def _status(out: Path) -> str | None:
    try:
        status: str | None = json.loads((out / "run.json").read_text()).get("status")
    except (OSError, ValueError):
        return None
    return status


def _ray_processes() -> set[int]:
    """Every running process of a Ray instance (its raylet, GCS, agents and workers)."""
    found = set()
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            cmd = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if (cmd.startswith("ray::") or "/ray/" in cmd) and _running(int(cmdline.parent.name)):
            found.add(int(cmdline.parent.name))
    return found


@pytest.mark.parametrize("signum,to_group,delay_s,code", [
    (signal.SIGTERM, False, 0.0, 143), (signal.SIGINT, True, 0.5, 130),
    (signal.SIGTERM, False, 2.0, 143), (signal.SIGINT, True, 3.0, 130)])
def test_a_stop_signal_while_ray_or_its_actors_start_leaves_nothing(
        trace: Path, tmp_path: Path, signum: int, to_group: bool, delay_s: float,
        code: int) -> None:
    """A stop signal soon after run.json says `running` (Ray starting, its actors starting):
    the run ends interrupted with what its records count, and nothing of Ray is left."""
    before, ray_before = _ray_folders(), _ray_processes()
    out = tmp_path / "early"
    proc = _harness("--trace", str(trace), *RUN, "--workers", "2", "--out", str(out))
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and _status(out) != "running":
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
        time.sleep(0.05)
    time.sleep(delay_s)
    if to_group:
        os.killpg(proc.pid, signum)
    else:
        proc.send_signal(signum)
    assert proc.wait(60) == code
    err = proc.stderr.read().decode() if proc.stderr else ""
    assert "Traceback" not in err, err
    run = json.loads((out / "run.json").read_text())
    ends = read_records(out).query("event == 'trajectory_end'")
    assert run["status"] == "interrupted" and sum(run["outcome"].values()) == len(ends)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and _ray_processes() - ray_before:
        time.sleep(0.2)
    assert not _ray_processes() - ray_before, "a process of the Ray instance is left"
    assert _ray_folders() <= before, "the local Ray instance's folder is left"
    res = CliRunner().invoke(main, ["clean", str(out)])
    assert res.exit_code == 0 and "nothing left behind" in res.output, res.output


def test_a_killed_driver_leaves_what_harness_clean_stops(trace: Path, tmp_path: Path) -> None:
    """SIGKILL to the command alone (no cleanup of its own can run): its run.json names the
    local server and the local Ray instance, and `harness clean OUT` stops both and removes
    their folders."""
    before = _ray_folders()
    out = tmp_path / "killed"
    proc = _harness("--trace", str(trace), *RUN, "--workers", "2", "--out", str(out))
    run = _wait_running(proc, out)
    assert run["status"] == "running" and run["server_process"]["pid"]
    folder = run["ray_instance"]["tmp_dir"]
    assert len(run["ray_instance"]["processes"]) >= 4  # Ray's own, its agents, the actors
    proc.kill()
    proc.wait(30)
    assert alive(run["server_process"]["pid"]) and Path(folder).is_dir()  # left, as said
    res = CliRunner().invoke(main, ["clean", str(out)])
    assert res.exit_code == 0, res.output
    assert "stopped the server process group" in res.output
    assert f"process(es) of {folder}" in res.output and f"removed {folder}" in res.output
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and alive(run["server_process"]["pid"]):
        time.sleep(0.2)
    assert not alive(run["server_process"]["pid"])
    assert _ray_folders() <= before
    assert not [p for p in run["ray_instance"]["processes"] if _running(p["pid"])], "Ray is left"
    assert json.loads((out / "run.json").read_text())["status"] == "interrupted"


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
