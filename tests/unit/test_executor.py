"""Executor behaviour on a virtual clock with an in-memory adapter: exact times, no sleeping."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from harness.plan.injection import Injection
from harness.plan.planner import Arrivals, CallStep, Plan, ToolStep, TrajectoryPlan
from harness.plan.tokens import stable_seed
from harness.policies import Decision, PauseContext, make_policy
from harness.policies.base import ServerRates
from harness.records.manifest import RunManifest
from harness.records.store import read_json, read_records
from harness.replay.clock import NS, VirtualClock
from harness.replay.runner import ReplaySettings, replay
from tests.fakes.memory_adapter import MemoryAdapter

RATES = ServerRates(prefill_tok_s=1000.0, swap_bytes_per_s=1e9, kv_bytes_per_token=100.0)


def traj(tid: str, latency: float | None = 2.0, deadline: float = 10.0, disconnect: bool = False,
         arrival: float = 0.0) -> TrajectoryPlan:
    return TrajectoryPlan(tid, arrival, "interactive", "t", (
        CallStep(0, 100, stable_seed(tid, 0), 5),
        ToolStep(1, "search", "remote_read", latency, deadline,
                 "ok" if latency is not None else "abandoned", False, True),
        CallStep(2, 10, stable_seed(tid, 2), 5, disconnect=disconnect),
    ))


def plan_of(*trajs: TrajectoryPlan, concurrency: int = 4, mode: str = "closed") -> Plan:
    return Plan(tuple(trajs), (), Arrivals(mode=mode, concurrency=concurrency), 0, Injection())


def run_plan(tmp_path: Path, plan: Plan, policy: Any, **adapter_kw: Any
             ) -> tuple[pd.DataFrame, dict[str, Any], MemoryAdapter]:
    async def go() -> tuple[dict[str, Any], MemoryAdapter]:
        clock = VirtualClock()
        adapter = MemoryAdapter(clock, **adapter_kw)
        manifest = RunManifest(run_id="run1", policy=getattr(policy, "name", "x"))
        await replay(adapter, clock, plan, policy, tmp_path / "out", manifest, RATES,
                     ReplaySettings(0.5))
        return manifest.to_dict(), adapter

    run, adapter = asyncio.run(go())
    return read_records(tmp_path / "out"), run, adapter


def resume_ms(rec: pd.DataFrame) -> list[float]:
    out = []
    for _, g in rec[rec.traffic == "agent"].groupby("trajectory_id"):
        ends = g[g.event == "tool_end"]
        firsts = g[(g.event == "first_token") & (g.step > 0)]
        for (_, e), (_, f) in zip(ends.iterrows(), firsts.iterrows(), strict=False):
            out.append((f.t_ns - e.t_ns) / 1e6)
    return out


@pytest.mark.parametrize(("policy", "expected_ms", "recomputed", "swapped"), [
    ("keep", 20.0, 0, 0),
    ("recompute", 125.0, 105, 0),
    ("swap", 23.0, 0, 2 * 105 * 100),
])
def test_resume_latency_per_policy_is_exact(tmp_path: Path, policy: str, expected_ms: float,
                                            recomputed: int, swapped: int) -> None:
    rec, run, adapter = run_plan(tmp_path, plan_of(traj("a")), make_policy(policy))
    assert resume_ms(rec) == [pytest.approx(expected_ms, abs=1e-6)]
    assert int(rec.recomputed_tokens.fillna(0).sum()) == recomputed
    assert int(rec.loc[rec.event.isin(["swap_out", "swap_in"]), "bytes"].sum()) == swapped
    resumed = rec[(rec.event == "call_end") & (rec.step == 2)].iloc[0]
    assert resumed.cached_tokens == (0 if policy == "recompute" else 105)
    assert run["outcome"] == {"completed": 1, "cancelled": 0, "failed": 0,
                              "unsupported_actions": 0, "server_failed": 0, "interrupted": 0}
    assert adapter.files == {} and adapter.cache == {}  # every server-side state released


def test_tool_wait_is_timed_from_the_plan(tmp_path: Path) -> None:
    rec, _, _ = run_plan(tmp_path, plan_of(traj("a", latency=2.0)), make_policy("keep"))
    start = rec[rec.event == "tool_start"].t_ns.iloc[0]
    end = rec[rec.event == "tool_end"].t_ns.iloc[0]
    assert start == round(0.15 * NS) and end - start == 2 * NS


@pytest.mark.parametrize(("tau", "expect_swap", "expected_ms"), [("1", True, 23.0),
                                                                  ("3", False, 20.0)])
def test_ttl_swaps_only_after_tau(tmp_path: Path, tau: str, expect_swap: bool,
                                  expected_ms: float) -> None:
    rec, _, _ = run_plan(tmp_path, plan_of(traj("a")),
                         make_policy("ttl", {"tau": tau, "after": "swap"}))
    swaps = rec[rec.event == "swap_out"]
    assert (len(swaps) == 1) is expect_swap
    if expect_swap:
        t0 = rec[rec.event == "tool_start"].t_ns.iloc[0]
        assert swaps.t_ns.iloc[0] - t0 == pytest.approx(1 * NS + 0.002 * NS, abs=10)
        assert swaps.reason.iloc[0] == "ttl-expired"
    assert resume_ms(rec) == [pytest.approx(expected_ms, abs=1e-6)]
    assert rec[rec.event == "pause_decision"].action.iloc[0] == "ttl"


def test_never_returning_tool_cancels_at_deadline_and_releases(tmp_path: Path) -> None:
    rec, run, adapter = run_plan(tmp_path, plan_of(traj("a", latency=None, deadline=5.0)),
                                 make_policy("swap"))
    end = rec[rec.event == "tool_end"].iloc[0]
    start = rec[rec.event == "tool_start"].iloc[0]
    assert end.status == "abandoned" and end.t_ns - start.t_ns == 5 * NS
    assert rec[rec.event == "trajectory_end"].status.tolist() == ["cancelled"]
    assert rec[rec.event == "cancel"].reason.iloc[0].startswith("tool abandoned")
    assert adapter.files == {} and adapter.deleted  # the dump was deleted
    assert run["cleanup"]["errors"] == []
    assert len(adapter.calls) == 1  # the call after the tool never ran


def test_tool_slower_than_deadline_times_out(tmp_path: Path) -> None:
    rec, run, _ = run_plan(tmp_path, plan_of(traj("a", latency=8.0, deadline=5.0)),
                           make_policy("keep"))
    assert rec[rec.event == "tool_end"].status.tolist() == ["timeout"]
    assert run["outcome"]["cancelled"] == 1


def test_kept_slots_block_admission(tmp_path: Path) -> None:
    plan = plan_of(traj("a"), traj("b"), traj("c"), concurrency=3)
    rec, run, _ = run_plan(tmp_path, plan, make_policy("keep"), slots=2)
    waits = rec[rec.event == "slot_wait"]
    assert waits.trajectory_id.tolist() == ["c"]
    # c starts only when a or b ends and frees its slot
    first_end = rec[rec.event == "trajectory_end"].t_ns.min()
    c_start = rec[(rec.event == "call_start") & (rec.trajectory_id == "c")].t_ns.min()
    assert c_start >= first_end
    assert run["outcome"]["completed"] == 3


def test_swap_frees_slots_for_others(tmp_path: Path) -> None:
    plan = plan_of(traj("a"), traj("b"), traj("c"), concurrency=3)
    rec, _, _ = run_plan(tmp_path, plan, make_policy("swap"), slots=2)
    c_start = rec[(rec.event == "call_start") & (rec.trajectory_id == "c")].t_ns.min()
    first_end = rec[rec.event == "trajectory_end"].t_ns.min()
    assert c_start < first_end  # admitted during a's or b's pause


def test_server_error_fails_trajectory_and_releases_slot(tmp_path: Path) -> None:
    rec, run, adapter = run_plan(tmp_path, plan_of(traj("a")), make_policy("keep"),
                                 fail_calls={1})
    assert rec[rec.event == "trajectory_end"].status.tolist() == ["failed"]
    assert run["outcome"]["failed"] == 1 and adapter.cache == {}


def test_client_disconnect_cancels(tmp_path: Path) -> None:
    rec, run, _ = run_plan(tmp_path, plan_of(traj("a", disconnect=True)), make_policy("keep"))
    assert rec[(rec.event == "call_end") & (rec.step == 2)].status.tolist() == ["aborted"]
    assert rec[rec.event == "cancel"].reason.tolist() == ["client-disconnect"]
    assert run["outcome"]["cancelled"] == 1


def test_unsupported_swap_is_recorded_not_faked(tmp_path: Path) -> None:
    rec, run, _ = run_plan(tmp_path, plan_of(traj("a")), make_policy("swap"),
                           swap_supported=False)
    d = rec[rec.event == "pause_decision"].iloc[0]
    assert d.action == "swap" and d.status == "unsupported"
    assert rec[rec.event.isin(["swap_out", "swap_in"])].empty
    assert run["outcome"]["unsupported_actions"] == 1
    paused = rec[(rec.event == "kv_state") & (rec.status == "paused")]
    assert paused.kv_tokens.tolist() == [105]  # the context stayed where it was


class Spy:
    name = "spy"

    def __init__(self, oracle: bool) -> None:
        self.sees_true_latency = oracle
        self.seen: list[PauseContext] = []

    def decide(self, ctx: PauseContext) -> Decision:
        # history_s is live (valid during decide): keep a copy, as a policy must
        self.seen.append(dataclasses.replace(ctx, history_s=tuple(ctx.history_s)))
        return Decision("keep", "spy")


@pytest.mark.parametrize("oracle", [False, True])
def test_only_oracles_see_the_true_latency(tmp_path: Path, oracle: bool) -> None:
    spy = Spy(oracle)
    run_plan(tmp_path, plan_of(traj("a", latency=2.0)), spy)
    ctx = spy.seen[0]
    assert ctx.true_latency_s == (2.0 if oracle else None)
    assert ctx.retained_tokens == 105 and ctx.deadline_ms == 10_000
    assert ctx.free_slots == 1 and ctx.total_slots == 2


def test_history_grows_per_tool_class(tmp_path: Path) -> None:
    spy = Spy(False)
    run_plan(tmp_path, plan_of(traj("a", latency=1.0), traj("b", latency=3.0, arrival=5.0),
                               mode="trace"), spy)
    assert [tuple(c.history_s) for c in spy.seen] == [(), (1.0,)]


def test_interrupted_run_releases_and_keeps_records(tmp_path: Path) -> None:
    async def go() -> MemoryAdapter:
        clock = VirtualClock()
        adapter = MemoryAdapter(clock)
        manifest = RunManifest(run_id="run1", policy="swap")
        task = asyncio.create_task(replay(adapter, clock, plan_of(traj("a", latency=100.0)),
                                          make_policy("swap"), tmp_path / "out", manifest, RATES))
        while clock.now_ns() < 10 * NS:
            await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return adapter

    adapter = asyncio.run(go())
    rec = read_records(tmp_path / "out")
    ends = rec[rec.event == "trajectory_end"]
    assert ends.status.tolist() == ["interrupted"] and ends.reason.tolist() == ["run-interrupted"]
    assert adapter.files == {} and adapter.cache == {}
    run = read_json(tmp_path / "out" / "run.json")
    assert run["status"] == "interrupted" and run["outcome"]["interrupted"] == 1
    assert run["outcome"]["cancelled"] == 0


def test_ttl_expiry_without_harness_slots_uses_a_fresh_salt(tmp_path: Path) -> None:
    """Runtimes that manage their own cache: ttl holds the context (pinned), and its recompute
    after tau drops it and sends a new cache salt."""

    async def go() -> MemoryAdapter:
        clock = VirtualClock()
        adapter = MemoryAdapter(clock, slotted=False)
        manifest = RunManifest(run_id="run1", policy="ttl")
        await replay(adapter, clock, plan_of(traj("a", latency=2.0)),
                     make_policy("ttl", {"tau": "1", "after": "recompute"}),
                     tmp_path / "out", manifest, RATES)
        return adapter

    adapter = asyncio.run(go())
    rec = read_records(tmp_path / "out")
    erase = rec[rec.event == "erase"].iloc[0]
    assert erase.reason.startswith("ttl-expired")
    t0 = rec[rec.event == "tool_start"].t_ns.iloc[0]
    assert erase.t_ns - t0 == 1 * NS
    assert [c.cache_salt for c in adapter.calls] == [None, "run1-a-1"]
    assert rec[rec.event == "pause_decision"].status.tolist() == ["ok"]
    assert adapter.pause_log == [("hold", "a"), ("drop", "a"), ("release", "a")]
    assert [c.hold for c in adapter.calls] == [True, True]
    assert adapter.calls[1].prompt and rec[rec.event == "call_end"].cached_tokens.tolist() == [
        0, 0]
    assert asyncio.run(adapter.held()) == []


def test_slot_pool_is_first_come_first_served() -> None:
    from harness.replay.recorder import SlotPool

    async def go() -> list[str]:
        pool = SlotPool(1)
        order: list[str] = []
        held = await pool.acquire()

        async def waiter(name: str) -> None:
            slot = await pool.acquire()
            order.append(name)
            await pool.release(slot)

        tasks = [asyncio.create_task(waiter(n)) for n in ("w1", "w2")]
        await asyncio.sleep(0)
        await pool.release(held)
        again = asyncio.create_task(waiter("releaser-again"))  # asks right after releasing
        await asyncio.gather(*tasks, again)
        assert pool.free == 1
        return order

    assert asyncio.run(go()) == ["w1", "w2", "releaser-again"]


def test_cancelled_waiter_does_not_lose_a_slot() -> None:
    from harness.replay.recorder import SlotPool

    async def go() -> int:
        pool = SlotPool(1)
        held = await pool.acquire()
        w = asyncio.create_task(pool.acquire())
        await asyncio.sleep(0)
        await pool.release(held)  # handed to w ...
        w.cancel()  # ... which is cancelled before it runs
        with contextlib.suppress(asyncio.CancelledError):
            await w
        return pool.free

    assert asyncio.run(go()) == 1


class _LateClock:
    """A virtual clock whose every wake-up comes `late_ns` after the time asked for, as an
    overloaded event loop's would."""

    def __init__(self, late_ns: int) -> None:
        self.inner = VirtualClock()
        self.late_ns = late_ns

    def now_ns(self) -> int:
        return self.inner.now_ns()

    async def sleep_until(self, t_ns: int) -> None:
        await self.inner.sleep_until(t_ns + self.late_ns)


def test_tool_end_is_stamped_at_the_wake_and_the_lag_kept_apart(tmp_path: Path) -> None:
    """Resume latency excludes the harness's own wake-up lag; the lag is recorded (t_ns -
    planned_ns of tool_end) and summarised as client lag."""
    async def go() -> None:
        clock = _LateClock(3_000_000)
        adapter = MemoryAdapter(clock.inner)
        await replay(adapter, clock, plan_of(traj("a")), make_policy("keep"), tmp_path / "out",
                     RunManifest(run_id="late", policy="keep"), RATES)

    asyncio.run(go())
    rec = read_records(tmp_path / "out")
    end = rec[rec.event == "tool_end"].iloc[0]
    assert end.t_ns - end.planned_ns == 3_000_000
    assert resume_ms(rec) == [pytest.approx(20.0, abs=1e-6)]  # as with an exact clock
    summary = read_json(tmp_path / "out" / "summary.json")
    assert summary["client_lag_ms"]["p50"] == pytest.approx(3.0)
    assert summary["warnings"] and "client lag P99 3.0 ms" in summary["warnings"][0]
    exact, _, _ = run_plan(tmp_path / "exact", plan_of(traj("a")), make_policy("keep"))
    e = exact[exact.event == "tool_end"].iloc[0]
    assert e.t_ns == e.planned_ns


def test_each_pause_gets_the_live_windowed_history_not_a_copy(tmp_path: Path) -> None:
    """O(1) per pause: the policy sees the tool class's History itself (the simulator's, with
    the same window), and run.json records the window."""
    from harness.policies.history import DEFAULT_WINDOW, History

    kinds: list[type] = []

    class Typed(Spy):
        def decide(self, ctx: PauseContext) -> Decision:
            kinds.append(type(ctx.history_s))
            return super().decide(ctx)

    spy = Typed(False)
    _, run, _ = run_plan(tmp_path, plan_of(traj("a", latency=1.0), traj("b", latency=3.0,
                                                                          arrival=5.0),
                                           mode="trace"), spy)
    assert kinds == [History, History]
    assert [c.history_s for c in spy.seen] == [(), (1.0,)]
    assert run["history_window"] == DEFAULT_WINDOW


def test_a_costly_server_sample_stretches_the_sampler_interval(tmp_path: Path) -> None:
    """A scrape that costs 10 ms of client time is taken at most every 0.5 s (2% of the
    client), not every 0.1 s as asked; run.json says how many samples were taken."""
    import time

    class SlowScrape(MemoryAdapter):
        async def scrape(self) -> list[tuple[str, str, str, float]]:
            time.sleep(0.01)  # a large /slots parse, as the client pays it
            return await super().scrape()

    async def go(slow: bool) -> dict[str, float]:
        clock = VirtualClock()
        adapter = (SlowScrape if slow else MemoryAdapter)(clock)
        run = RunManifest(run_id="s", policy="keep")
        await replay(adapter, clock, plan_of(traj("a", latency=10.0)), make_policy("keep"),
                     tmp_path / f"out-{slow}", run, RATES, ReplaySettings(scrape_interval_s=0.1))
        assert run.scrape is not None and run.duration_s is not None
        return {**run.scrape, "duration_s": run.duration_s}

    fast, slow = asyncio.run(go(False)), asyncio.run(go(True))
    assert fast["samples"] >= fast["duration_s"] / 0.1 - 1
    assert slow["longest_interval_s"] >= 0.5 and slow["cost_ms_max"] >= 10.0
    assert slow["samples"] <= slow["duration_s"] / 0.5 + 1


def test_the_sampler_is_never_starved(tmp_path: Path) -> None:
    """A sample that costs 100 ms would stretch the interval to 5 s; it stops at 20 x 0.1 s."""
    import time

    from harness.replay.runner import SCRAPE_MAX_STRETCH

    class CostlyScrape(MemoryAdapter):
        async def scrape(self) -> list[tuple[str, str, str, float]]:
            time.sleep(0.1)
            return await super().scrape()

    async def go() -> dict[str, float]:
        clock = VirtualClock()
        run = RunManifest(run_id="s", policy="keep")
        await replay(CostlyScrape(clock), clock, plan_of(traj("a", latency=10.0)),
                     make_policy("keep"), tmp_path / "out", run, RATES,
                     ReplaySettings(scrape_interval_s=0.1))
        assert run.scrape is not None and run.duration_s is not None
        return {**run.scrape, "duration_s": run.duration_s}

    got = asyncio.run(go())
    assert got["longest_interval_s"] == pytest.approx(SCRAPE_MAX_STRETCH * 0.1)
    assert got["samples"] >= got["duration_s"] / (SCRAPE_MAX_STRETCH * 0.1)


def test_an_interrupted_run_waits_for_every_trajectory_to_record_its_end(tmp_path: Path
                                                                          ) -> None:
    """One trajectory's cleanup hangs (its erase never answers): the first cancel lets the
    others finish theirs, the second cuts the hung one short, and every end is on disk."""

    class HungErase(MemoryAdapter):
        async def erase_slot(self, slot: int) -> None:
            if slot == 1:
                await asyncio.sleep(3600)
            await super().erase_slot(slot)

    async def go() -> RunManifest:
        from harness.replay.clock import RealClock

        clock = RealClock()
        run = RunManifest(run_id="i", policy="keep")
        task = asyncio.create_task(replay(
            HungErase(clock), clock, plan_of(traj("a", latency=30.0), traj("b", latency=30.0)),
            make_policy("keep"), tmp_path / "out", run, RATES, ReplaySettings(0.5)))
        await asyncio.sleep(0.3)
        task.cancel()
        await asyncio.sleep(0.3)
        assert not task.done(), "the run ended before a trajectory's cleanup did"
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return run

    run = asyncio.run(go())
    rec = read_records(tmp_path / "out")
    ends = rec[rec.event == "trajectory_end"]
    assert sorted(ends.trajectory_id) == ["a", "b"]
    assert set(ends.reason) == {"run-interrupted"} and run.status == "interrupted"


def test_an_eviction_that_outlasts_the_tool_counts_in_resume_latency(tmp_path: Path) -> None:
    """A 2 s swap-out under a 0.5 s tool: the tool ends at its planned time (no client lag),
    and the resume waits for the save to finish, as the agent would."""
    rec, _, _ = run_plan(tmp_path, plan_of(traj("a", latency=0.5)), make_policy("swap"),
                         save_s=2.0)
    start = rec[rec.event == "tool_start"].t_ns.iloc[0]
    end = rec[rec.event == "tool_end"].iloc[0]
    assert end.t_ns == end.planned_ns == start + NS // 2  # stamped at its planned end
    assert resume_ms(rec)[0] >= 1500.0  # the rest of the save, then restore and prefill


@pytest.mark.parametrize("tid", ["a", "../../etc/passwd", "x..y", "trajectoire-é/1", "t" * 300,
                                 "", ".hidden"])
def test_dump_names_are_always_valid_file_names(tid: str) -> None:
    import re

    from harness.replay.kv_actions import dump_name

    name = dump_name("swap-20261201T000000-abc123", tid, 3)
    assert re.fullmatch(r"[A-Za-z0-9_-]+\.bin", name) and ".." not in name
    assert len(name) <= 110
    assert dump_name("swap-20261201T000000-abc123", tid + "x", 3) != name


def test_bystanders_that_run_out_before_the_agents_are_recorded(tmp_path: Path) -> None:
    import dataclasses

    from harness.plan.planner import BystanderPlan

    few = tuple(BystanderPlan(f"bystander-{i}", 0.1 * (i + 1), 8, 2, i) for i in range(2))
    plan = dataclasses.replace(plan_of(traj("a", latency=5.0)), bystanders=few)
    rec, run, _ = run_plan(tmp_path, plan, make_policy("keep"))
    assert run["bystanders_ended_s"] == pytest.approx(0.2, abs=0.05)
    assert (rec[rec.event == "call_start"].traffic == "bystander").sum() == 2
    enough = tuple(BystanderPlan(f"bystander-{i}", 0.1 * (i + 1), 8, 2, i) for i in range(200))
    plan = dataclasses.replace(plan_of(traj("b", latency=5.0)), bystanders=enough)
    assert run_plan(tmp_path / "2", plan, make_policy("keep"))[1]["bystanders_ended_s"] is None


def test_each_calls_chunk_times_are_recorded_exactly(tmp_path: Path) -> None:
    """The memory server streams one token per chunk, 10 ms apart on the virtual clock: each
    5-token call records 4 gaps of exactly 10,000 us (bystanders alike)."""
    rec, _, _ = run_plan(tmp_path, plan_of(traj("a", 0.0, 1.0)), make_policy("keep"))
    ends = rec[(rec.event == "call_end") & (rec.traffic == "agent")]
    gaps = [list(memoryview(b).cast("I")) for b in ends["token_gaps"]]
    assert gaps == [[10_000] * 4, [10_000] * 4]
