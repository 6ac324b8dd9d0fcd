"""The simulator's fleet: K identical servers behind a router (harness.simulate.fleet)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from click.testing import CliRunner

from harness.cli import main
from harness.errors import InputError
from harness.model.calibration import Calibration, read_calibration
from harness.model.iteration import NOISE_DRAWS
from harness.policies import make_policy
from harness.records.store import RECORDS_DIR, RUN_JSON, SUMMARY_JSON, read_records
from harness.simulate import native
from harness.simulate.fleet import MOVED_REASON, Fleet, check_fleet, server_name
from harness.simulate.options import Loop, SimOptions
from harness.simulate.records import RecordSink
from harness.simulate.run import Arrivals, run_simulation, simulate
from harness.simulate.server import Capacity, ServerModel
from harness.simulate.trajectory import Trajectory
from harness.simulate.workload import build_workload
from harness.traces.validate import load_trajectories

ROOT = Path(__file__).resolve().parents[2]
TRACES = ROOT / "traces"
CAL_PATH = ROOT / "tests" / "data" / "llamacpp-bench-small" / "calibration.json"
CAL = read_calibration(CAL_PATH)


def sim(tmp: Path, name: str, trace: str, policy: str, cap: Capacity, agents: int,
        summary: bool = False, **fleet: Any) -> tuple[pd.DataFrame, dict[str, Any]]:
    out = tmp / name
    run = run_simulation(SimOptions(TRACES / trace, policy, {}, cap, None, Arrivals("closed",
                                    agents), 0, out, write_summary=summary, **fleet), CAL)
    return read_records(out), run.to_dict()


def summary_of(tmp: Path, name: str) -> dict[str, Any]:
    out: dict[str, Any] = json.loads((tmp / name / SUMMARY_JSON).read_text())
    return out


def plain(df: pd.DataFrame) -> pd.DataFrame:
    """The records with their string columns as objects: the runs' vocabularies differ."""
    return df.astype({c: object for c in df.columns if isinstance(df[c].dtype,
                                                                  pd.CategoricalDtype)})


def count(df: pd.DataFrame, event: str) -> int:
    return int((df["event"] == event).sum())


def server_model(cal: Calibration) -> ServerModel:
    return ServerModel(cal.prefill_tok_s, cal.decode_tok_s, cal.swap_out_bytes_per_s,
                       cal.swap_in_bytes_per_s, cal.kv_bytes_per_token, cal.prefill_points,
                       cal.decode_points, cal.append_points)


def engine_run(tmp: Path, trace: str, policy: str, args: dict[str, str], cap: Capacity,
               agents: int, fleet: Fleet | None) -> pd.DataFrame:
    """engine.simulate itself (run_simulation runs no fleet for one server)."""
    w = build_workload(load_trajectories(TRACES / trace), 30.0)
    out = tmp / ("none" if fleet is None else f"{fleet.k}-{fleet.router}")
    sink = RecordSink(out / RECORDS_DIR, "r", w, CAL.kv_bytes_per_token, cap.context_limit)
    try:
        simulate(w, server_model(CAL), cap, make_policy(policy, args), sink, "r", Loop(None,
            agents, 1000, "fifo", fleet))
    finally:
        sink.close()
    return read_records(out)


def test_one_server_is_exactly_the_simulation_without_the_flags(tmp_path: Path) -> None:
    cap = Capacity(slots=4, ctx_per_slot=4096)
    plain, run = sim(tmp_path, "plain", "coding-subagents.parquet", "keep", cap, 4, summary=True)
    one, run1 = sim(tmp_path, "one", "coding-subagents.parquet", "keep", cap, 4, summary=True,
                    servers=1, router="prefix-affinity")
    pd.testing.assert_frame_equal(plain, one)
    assert summary_of(tmp_path, "plain") == summary_of(tmp_path, "one")
    assert summary_of(tmp_path, "one")["routing"] is None  # no call names a server
    assert plain.loc[plain["event"] == "call_end", "served_by"].isna().all()
    for r in (run, run1):
        assert r["simulator"]["servers"] == 1 and r["simulator"]["router"] is None
        assert "routing" not in r["simulator"]


@pytest.mark.parametrize("trace, policy, args, cap, agents", [
    # parents keep their slots: deadlines cancel sub-agents wherever they wait or run
    ("coding-subagents.parquet", "keep", {}, Capacity(slots=3, ctx_per_slot=4096), 4),
    # a tight token pool: preemptions, TTL expiries into swaps
    ("coding-agent.parquet", "ttl", {"tau": "1"}, Capacity(tokens=70000), 6),
])
def test_a_fleet_of_one_server_simulates_what_one_server_does(
        tmp_path: Path, trace: str, policy: str, args: dict[str, str], cap: Capacity,
        agents: int) -> None:
    alone = engine_run(tmp_path, trace, policy, args, cap, agents, None)
    fleet = engine_run(tmp_path, trace, policy, args, cap, agents, Fleet(1, "round-robin"))
    ends = fleet["event"] == "call_end"
    served = fleet["prompt_n"].notna()  # a context overflow names no server
    assert (fleet.loc[ends & served, "served_by"] == server_name(0)).all()
    fleet = plain(fleet)
    fleet.loc[ends, "served_by"] = float("nan")
    pd.testing.assert_frame_equal(plain(alone), fleet)
    assert count(alone, "cancel") > 0 or count(alone, "swap_out") > 0


def test_the_routers_rules() -> None:
    trs = [Trajectory(ti, 2 * ti, 2 * ti + 2) for ti in range(3)]
    rr = Fleet(3, "round-robin")
    rr.home = [-1, 2, -1]
    # every call to the next server, resumed (trs[1]) or not
    assert [rr.choose(trs[0]) for _ in range(4)] + [rr.choose(trs[1])] == [0, 1, 2, 0, 1]
    pa = Fleet(3, "prefix-affinity")
    pa.home = [-1, 2, -1]
    pa.load = [2, 1, 1]
    assert pa.choose(trs[0]) == 1  # the fewest trajectories, the lowest index on ties
    assert pa.choose(trs[1]) == 2  # a resumed call: its trajectory's server
    pa.load = [0, 1, 1]
    assert pa.choose(trs[2]) == 0


def test_prefix_affinity_keeps_resumed_calls_and_reuses_more_than_round_robin(
        tmp_path: Path) -> None:
    cap = Capacity(slots=4, ctx_per_slot=4096)
    for router in ("round-robin", "prefix-affinity"):
        sim(tmp_path, router, "mixed-tools.parquet", "keep", cap, 8, summary=True, servers=2,
            router=router)
    rr, pa = summary_of(tmp_path, "round-robin"), summary_of(tmp_path, "prefix-affinity")
    for s in (rr, pa):
        assert s["routing"]["workers"] == 2 and s["routing"]["calls"] == 259
        assert s["routing"]["resumed"] == 209
    assert pa["routing"]["resumed_same_worker"] == 209
    assert pa["routing"]["same_worker_share"] == 1.0
    assert rr["routing"]["calls_per_worker"] == {"server-0": 130, "server-1": 129}  # in turn
    assert 0 < rr["routing"]["same_worker_share"] < 1
    assert pa["reuse"]["cached_tokens"] > rr["reuse"]["cached_tokens"]
    assert rr["routing"]["cached_moved"] == 0.0  # a moved call finds nothing cached
    assert pa["tokens_recomputed"] == 0 < rr["tokens_recomputed"]  # keep recomputes only moves
    assert pa["resume_latency_ms"]["p50"] < rr["resume_latency_ms"]["p50"]


def test_round_robin_releases_what_a_moved_call_left_and_recomputes_it(tmp_path: Path) -> None:
    df, run = sim(tmp_path, "o", "mixed-tools.parquet", "keep", Capacity(slots=4,
                  ctx_per_slot=4096), 8, servers=2, router="round-robin")
    routing = run["simulator"]["routing"]
    moved = routing["resumed_calls"] - routing["resumed_same_server"]
    assert moved > 0 and routing["calls_per_server"] == [130, 129]
    erased = df[(df["event"] == "erase") & (df["reason"] == MOVED_REASON)]
    assert len(erased) == moved == count(df, "recompute")  # keep: every move left a KV
    assert run["simulator"]["servers"] == 2 and run["simulator"]["router"] == "round-robin"


def test_k_servers_hold_what_overflows_one(tmp_path: Path) -> None:
    slots = Capacity(slots=2, ctx_per_slot=4096)  # 8 agents that keep their slot, 2 slots
    one, run1 = sim(tmp_path, "one", "mixed-tools.parquet", "keep", slots, 8)
    four, run4 = sim(tmp_path, "four", "mixed-tools.parquet", "keep", slots, 8, servers=4,
                     router="prefix-affinity")
    assert count(one, "slot_wait") > 0 and count(four, "slot_wait") == 0
    assert run4["duration_s"] < run1["duration_s"]
    pool = Capacity(tokens=70000)
    # (without a first-token timeout, the model preempts where one server's pool stalls)
    _, run1 = sim(tmp_path, "pool1", "coding-agent.parquet", "keep", pool, 6,
                  first_token_timeout_s=math.inf)
    _, run2 = sim(tmp_path, "pool2", "coding-agent.parquet", "keep", pool, 6, servers=2,
                  router="prefix-affinity", first_token_timeout_s=math.inf)
    assert run1["simulator"]["preemptions"] > 0 and run2["simulator"]["preemptions"] == 0
    # sub-agents waiting behind parents that keep every slot: cancelled on one server only
    sub = Capacity(slots=4, ctx_per_slot=4096)
    _, run1 = sim(tmp_path, "sub1", "coding-subagents.parquet", "keep", sub, 4)
    _, run2 = sim(tmp_path, "sub2", "coding-subagents.parquet", "keep", sub, 4, servers=2,
                  router="prefix-affinity")
    assert run1["outcome"]["cancelled"] > 0
    assert run2["outcome"] == run1["outcome"] | {"completed": 22, "cancelled": 0}


@pytest.mark.parametrize("router", ["round-robin", "prefix-affinity"])
@pytest.mark.parametrize("trace, policy, args, cap, agents", [
    ("coding-subagents.parquet", "keep", {}, Capacity(slots=3, ctx_per_slot=4096), 4),
    ("flaky-tools.parquet", "ttl", {"tau": "0.5"}, Capacity(tokens=4000), 10),
    ("coding-subagents.parquet", "swap", {}, Capacity(tokens=6000), 6),
    # prefix caches, and groups that share 1,500 and 500 tokens, under pressure
    ("coding-subagents.parquet", "keep-evictable", {},
     Capacity(tokens=5000, engine="vllm", block_size=16), 6),
    ("coding-subagents.parquet", "keep", {}, Capacity(tokens=6000, engine="sglang"), 6),
    ("coding-subagents.parquet", "recompute", {},
     Capacity(tokens=5000, engine="vllm", block_size=16), 6),
])
def test_every_server_ends_empty(tmp_path: Path, router: str, trace: str, policy: str,
                                 args: dict[str, str], cap: Capacity, agents: int) -> None:
    fleet = Fleet(3, router)
    df = engine_run(tmp_path, trace, policy, args, cap, agents, fleet)
    e = fleet.e
    for k in range(3):
        fleet.activate(k)
        # nothing held: every token is free or cached, no group holds its prefix
        free = len(e.free_slots) if e.slot_mode else e.free_tok + (
            e.cache.tokens if e.cache is not None else 0)
        assert (free, len(e.queue), len(e.resume_q), e.inflight) == (e.total, 0, 0, 0)
        if e.cache is not None:
            assert (sum(e.cache.lru.values()), e.cache.host_used) == (e.cache.tokens, 0)
            assert not any(e.cache.g_users) and not any(e.cache.g_span)
        assert e.sched.idle()
    # every call is routed once: it starts, overflows, or is cancelled while it waits
    started = count(df, "call_start") + int(
        df.loc[df["event"] == "call_end", "prompt_n"].isna().sum())
    assert started <= sum(fleet.calls) <= started + count(df, "cancel")
    assert fleet.load == [0, 0, 0]  # every trajectory ended


def test_check_fleet() -> None:
    check_fleet(1, "round-robin")
    check_fleet(8, "prefix-affinity")
    with pytest.raises(InputError, match="--servers"):
        check_fleet(0, "round-robin")
    with pytest.raises(InputError, match="--router"):
        check_fleet(2, "random")


def cli(tmp: Path, *extra: str) -> Any:
    return CliRunner().invoke(main, [
        "simulate", "--trace", str(TRACES / "bench-small.parquet"), "--policy", "keep",
        "--slots", "2", "--ctx-per-slot", "4096", "--calibration", str(CAL_PATH),
        "--no-summary", "--out", str(tmp / "o"), *extra])


@pytest.mark.parametrize("extra, needle", [
    (["--servers", "0"], "--servers must be in [1, 1,024], got 0"),
    (["--servers", "-2"], "--servers must be in [1, 1,024], got -2"),
    (["--servers", "1000000000"], "--servers must be in [1, 1,024], got 1,000,000,000"),
    (["--servers", "two"], "--servers 'two': not an integer"),
    (["--servers", "1.5"], "--servers"),
    (["--servers", "2", "--router", "random"], "--router must be one of round-robin, "
                                                "prefix-affinity, got 'random'"),
    (["--router", "least-loaded"], "--router"),
])
def test_cli_refuses_bad_fleets_in_one_line(tmp_path: Path, extra: list[str],
                                            needle: str) -> None:
    res = cli(tmp_path, *extra)
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], res.output
    assert not (tmp_path / "o").exists()


def test_cli_runs_a_fleet_and_says_what_the_router_did(tmp_path: Path) -> None:
    res = cli(tmp_path, "--servers", "2", "--router", "prefix-affinity")
    assert res.exit_code == 0, res.output
    run = json.loads((tmp_path / "o" / RUN_JSON).read_text())["simulator"]
    assert (run["servers"], run["router"]) == (2, "prefix-affinity")
    resumed = run["routing"]["resumed_calls"]
    assert resumed > 0 and run["routing"]["same_server_share"] == 1.0
    assert (f"2 servers, prefix-affinity: {resumed} of {resumed} resumed calls (100%) stayed "
            "on their server") in res.output
    # bench-small's 60 calls, less those its cancelled trajectories never made
    assert sum(run["routing"]["calls_per_server"]) == count(read_records(tmp_path / "o"),
                                                            "call_start") < 60


def test_compiled_and_pure_loops_route_alike(tmp_path: Path) -> None:
    if native.ENGINE != native.COMPILED_ENGINE:
        pytest.skip(f"the event loop is not compiled here: {native.ENGINE}")
    records = []
    for mode in ("auto", "python"):
        out = tmp_path / mode
        res = subprocess.run(
            [sys.executable, "-m", "harness", "simulate", "--trace",
             str(TRACES / "coding-subagents.parquet"), "--policy", "ttl", "--policy-arg",
             "tau=2", "--capacity-tokens", "6000", "--calibration", str(CAL_PATH),
             "--concurrency", "6", "--servers", "3", "--router", "round-robin", "--no-summary",
             "--out", str(out)], env={**os.environ, "HARNESS_SIMULATOR": mode},
            capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stderr
        records.append(read_records(out))
    assert records[0]["served_by"].isin([server_name(k) for k in range(3)]).sum() > 0
    pd.testing.assert_frame_equal(records[0], records[1])


def test_a_wake_up_that_runs_nothing_draws_no_spread_and_keeps_the_idle_time(
        tmp_path: Path) -> None:
    """The scheduler prices the wake and draws the next spread factor only for an iteration
    it runs: a wake-up that finds nothing to run leaves both for the next real iteration."""
    fleet = Fleet(2, "round-robin")
    engine_run(tmp_path, "coding-subagents.parquet", "keep", {}, Capacity(tokens=6000), 4,
               fleet)
    fleet.activate(0)
    sched = fleet.e.sched
    assert sched.idle()
    sched.noise = [2.0] * NOISE_DRAWS
    drawn, idle_since = sched.noise_i, sched.idle_since
    sched.compose(idle_since + 10.0)
    assert (sched.noise_i, sched.idle_since, sched.t_srv) == (drawn, idle_since, math.inf)
