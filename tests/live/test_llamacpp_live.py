"""Every pause policy replayed against a real llama-server.

Asserts with the server's own numbers (timings.cache_n) that each policy really happened, and that
the run left nothing behind: no dump files, every slot idle.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from click.testing import CliRunner

from harness.adapters.http import connect
from harness.adapters.launchers.llamacpp_server import LocalLlamaServer
from harness.adapters.llamacpp import LlamaCppAdapter
from harness.cli import main
from harness.plan.injection import Injection
from harness.plan.planner import Arrivals, CallStep, Plan, ToolStep, TrajectoryPlan
from harness.plan.tokens import stable_seed
from harness.policies import make_policy
from harness.policies.builtin import FALLBACK_RATES
from harness.records.manifest import RunManifest
from harness.records.store import read_json, read_records
from harness.replay.clock import RealClock
from harness.replay.runner import ReplaySettings, replay
from tests.live.traces import write_one_pause_trace

pytestmark = pytest.mark.live

# keep/swap must reuse the whole context except the last generated token (never evaluated).
REUSE_SLACK = 2


def _traj(tid: str, latency: float | None, deadline: float = 5.0) -> TrajectoryPlan:
    return TrajectoryPlan(tid, 0.0, "interactive", "live", (
        CallStep(0, 96, stable_seed(tid, 0), 4),
        ToolStep(1, "search", "remote_read", latency, deadline,
                 "ok" if latency is not None else "abandoned", False, True),
        CallStep(2, 16, stable_seed(tid, 2), 4),
        ToolStep(3, "cat", "local_read", 0.1, deadline, "ok", False, True),
        CallStep(4, 8, stable_seed(tid, 4), 4),
    ))


def _plan() -> Plan:
    trajs = (_traj("live-a", 0.3), _traj("live-b", 0.2), _traj("live-gone", None, 1.0))
    return Plan(trajs, (), Arrivals(mode="closed", concurrency=3), 0, Injection())


def _replay(server: LocalLlamaServer, policy: str, args: dict[str, str], out: Path
            ) -> tuple[pd.DataFrame, dict[str, Any]]:
    run = RunManifest(run_id=f"live-{policy}", policy=policy)

    async def go() -> None:
        async with connect(server.url, 8) as http:
            adapter = LlamaCppAdapter(http, dump_dir=server.dump_dir)
            await replay(adapter, RealClock(), _plan(), make_policy(policy, args), out, run,
                         FALLBACK_RATES, ReplaySettings(
                             0.1, lambda: server.leftover_dumps(str(run.run_id))))

    asyncio.run(go())
    return read_records(out), run.to_dict()


def _resumed(rec: pd.DataFrame) -> pd.DataFrame:
    """Resumed calls joined with the decision taken at the pause before them."""
    ends = rec[(rec.event == "call_end") & (rec.step > 0)][
        ["trajectory_id", "step", "cached_tokens", "prompt_n", "status"]]
    dec = rec[rec.event == "pause_decision"][["trajectory_id", "step", "action",
                                               "retained_tokens"]].copy()
    dec["step"] = dec["step"] + 1
    return ends.merge(dec, on=["trajectory_id", "step"])


def _evictions(rec: pd.DataFrame) -> set[tuple[str, int]]:
    ev = rec[rec.event.isin(["swap_out", "erase"]) & rec.step.notna()]
    return {(t, int(s) + 1) for t, s in zip(ev.trajectory_id, ev.step, strict=True)}


@pytest.mark.parametrize(("policy", "args"), [
    ("keep", {}), ("swap", {}), ("recompute", {}),
    ("ttl", {"tau": "0.05", "after": "swap"}), ("threshold", {}), ("min-waste", {}),
    ("oracle", {}),
])
def test_policy_runs_for_real(llama_server: LocalLlamaServer, tmp_path: Path, policy: str,
                              args: dict[str, str]) -> None:
    rec, run = _replay(llama_server, policy, args, tmp_path / policy)
    assert run["outcome"]["completed"] == 2 and run["outcome"]["cancelled"] == 1
    assert run["outcome"]["failed"] == 0
    resumed = _resumed(rec)
    assert len(resumed) == 4 and (resumed.status == "ok").all()
    swapped_in = {(t, int(s)) for t, s in
                  zip(rec[rec.event == "swap_in"].trajectory_id,
                      rec[rec.event == "swap_in"].step, strict=True)}
    evicted = _evictions(rec)
    for r in resumed.itertuples():
        key = (r.trajectory_id, int(r.step))
        if key in evicted and key not in swapped_in:  # recomputed: nothing reused
            assert r.cached_tokens <= 1, r
            assert r.prompt_n >= r.retained_tokens
        else:  # kept or restored from a dump: the whole context reused
            assert r.cached_tokens >= r.retained_tokens - REUSE_SLACK, r
    expect = {"keep": (0, 0), "swap": (4, 4), "recompute": (4, 0), "ttl": (4, 4)}
    if policy in expect:
        n_evict, n_swap = expect[policy]
        assert len(evicted & set(zip(resumed.trajectory_id, resumed.step, strict=True))) == \
            n_evict
        assert len(swapped_in) == n_swap
    if policy == "swap":
        out = rec[rec.event == "swap_out"]
        per_token = out.bytes / out.retained_tokens
        assert (per_token > 20_000).all() and (per_token < 26_000).all()  # ~23 KB/token
    # the abandoned tool cancelled its trajectory at the deadline
    gone = rec[rec.trajectory_id == "live-gone"]
    assert gone[gone.event == "trajectory_end"].status.tolist() == ["cancelled"]
    assert run["cleanup"] == {"slots_idle": True, "dump_files_left": [], "errors": [],
                              "remote_dumps_left": [], "errors_total": 0,
                              "held_left": []}
    assert llama_server.leftover_dumps() == []
    summary = read_json(tmp_path / policy / "summary.json")
    assert summary["cache_mismatches"] == 0
    assert summary["resume_latency_ms"]["n"] == 4


def test_run_command_against_a_running_server(llama_server: LocalLlamaServer,
                                              tmp_path: Path) -> None:
    trace = write_one_pause_trace(tmp_path / "t.parquet", first_input_tokens=64)
    out = tmp_path / "out"
    res = CliRunner().invoke(main, ["run", "--url", llama_server.url, "--trace", str(trace),
                                    "--policy", "keep", "--out", str(out)])
    assert res.exit_code == 0, res.output
    run = json.loads((out / "run.json").read_text())
    assert run["runtime"] == "llamacpp" and run["status"] == "finished"
    assert run["outcome"]["completed"] == 1
    # one agent + the scrape: a pool of 2 keep-alive connections, no request waited for one
    assert run["http"]["connection_limit"] == 2 and run["http"]["queued_requests"] == 0
    assert run["event_loop"].startswith("uvloop")
    rec = read_records(out)
    assert rec[(rec.event == "call_end") & (rec.step == 2)].cached_tokens.iloc[0] >= 66
    sm = (out / "server_metrics")
    assert any(sm.glob("part-*.parquet"))


def test_killed_run_leaves_readable_results(llama_server: LocalLlamaServer,
                                            tmp_path: Path) -> None:
    """SIGKILL mid-run: whatever was measured until then is on disk and readable."""
    import os
    import signal
    import subprocess
    import sys
    import time

    trace = tmp_path / "t.parquet"
    assert CliRunner().invoke(main, ["traces", "gen", "--profile", "bench-small",
                                     "--trajectories", "6", "--seed", "1",
                                     "--out", str(trace)]).exit_code == 0
    out = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-m", "harness", "run", "--url", llama_server.url,
                             "--trace", str(trace), "--policy", "swap", "--out", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not any((out / "records").glob("part-*.parquet")):
        time.sleep(0.2)
    time.sleep(1.5)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    rec = read_records(out)
    assert len(rec) > 0 and {"trajectory_start", "call_start"} <= set(rec.event)
    assert json.loads((out / "run.json").read_text())["status"] == "running"
    # The harness was killed, so it could not clean up: the server is reset for the next test.
    async def reset() -> None:
        async with connect(llama_server.url, 8) as http:
            adapter = LlamaCppAdapter(http, dump_dir=llama_server.dump_dir)
            for slot in range(2):
                await adapter.erase_slot(slot)
    time.sleep(2)
    asyncio.run(reset())
    for leftover in llama_server.dump_dir.iterdir():
        leftover.unlink()


def test_calibrate_measures_the_real_server(llama_server: LocalLlamaServer) -> None:
    """Every rate `harness calibrate` measures comes from the server's own timings: the appended
    prompt reuses the cached prefix (prompt_n = 32), and a longer context costs more."""
    from harness.calibrate.measure import measure

    async def go() -> Any:
        async with connect(llama_server.url, 8) as http:
            ad = LlamaCppAdapter(http, dump_dir=llama_server.dump_dir)
            return await measure(ad, contexts=(64, 1024), repeats=1, decode_tokens=8)

    m = asyncio.run(go())
    assert [n for n, _ in m.prefill_points] == [64, 1024]
    assert [n for n, _ in m.append_points] == [64, 1024], "the cached prefix was not reused"
    (_, short), (_, long) = m.append_points
    assert short > long > 0  # attention over a longer cached context
    assert all(r > 0 for _, r in m.decode_points) and m.swap_in_bytes_per_s > 0
    assert llama_server.leftover_dumps() == []


def test_a_dump_truncated_while_paused_fails_only_its_trajectory(
        llama_server: LocalLlamaServer, tmp_path: Path) -> None:
    """Truncated under a real llama-server (which would abort loading it): the restore is never
    sent, the trajectory fails with the reason, the dump is deleted, the server lives on."""
    import urllib.request

    run = RunManifest(run_id="live-corrupt", policy="swap")
    out = tmp_path / "corrupt"
    plan = Plan((_traj("live-c", 2.0),), (), Arrivals(mode="closed", concurrency=1), 0,
                Injection())

    async def go() -> None:
        async with connect(llama_server.url, 8) as http:
            adapter = LlamaCppAdapter(http, dump_dir=llama_server.dump_dir)
            task = asyncio.create_task(replay(
                adapter, RealClock(), plan, make_policy("swap"), out, run, FALLBACK_RATES,
                ReplaySettings(0.1, lambda: llama_server.leftover_dumps(str(run.run_id)))))
            for _ in range(200):
                dumps = [p for p in llama_server.dump_dir.glob("*.bin")
                         if p.name.startswith("live-corrupt")]
                if dumps:
                    await asyncio.sleep(0.5)  # the save has answered; the tool waits 2 s
                    dumps[0].write_bytes(dumps[0].read_bytes()[:1000])
                    break
                await asyncio.sleep(0.02)
            await task

    asyncio.run(go())
    rec = read_records(out)
    end = rec[rec.event == "trajectory_end"].iloc[0]
    assert end.status == "failed" and "changed while paused" in end.reason
    assert llama_server.leftover_dumps(str(run.run_id)) == []
    with urllib.request.urlopen(llama_server.url + "/health", timeout=5) as resp:
        assert resp.status == 200
