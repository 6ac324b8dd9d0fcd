"""The pause seam on a server that manages its own memory and pins per session (vLLM with the
project's connector, SGLang sessions), on a virtual clock with the in-memory adapter: which
action each policy sends, what the server then holds, what the resumed call reuses, and that
nothing stays held when a trajectory ends, however it ends."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from harness.policies import make_policy
from harness.records.manifest import RunManifest
from harness.records.store import read_json, read_records
from harness.replay.clock import VirtualClock
from harness.replay.runner import ReplaySettings, replay
from tests.fakes.memory_adapter import MemoryAdapter
from tests.unit.test_executor import RATES, plan_of, traj


def run_unslotted(tmp_path: Path, policy: str, args: dict[str, str] | None = None,
                  pressure_at_s: float | None = None, **kw: Any
                  ) -> tuple[pd.DataFrame, dict[str, Any], MemoryAdapter]:
    """One trajectory (call, 2 s tool, call) on an unslotted server; with `pressure_at_s`,
    every unpinned context is evicted at that time into the pause."""
    async def go() -> tuple[dict[str, Any], MemoryAdapter]:
        clock = VirtualClock()
        adapter = MemoryAdapter(clock, slotted=False, **kw)
        manifest = RunManifest(run_id="run1", policy=policy)
        pressure = None
        if pressure_at_s is not None:
            async def squeeze() -> None:
                await clock.sleep_until(int(pressure_at_s * 1e9))
                adapter.evict_unpinned()
            pressure = asyncio.create_task(squeeze())
        await replay(adapter, clock, plan_of(traj("a")), make_policy(policy, args),
                     tmp_path / "out", manifest, RATES, ReplaySettings(0.5))
        if pressure is not None:
            await pressure
        return manifest.to_dict(), adapter

    run, adapter = asyncio.run(go())
    return read_records(tmp_path / "out"), run, adapter


def resumed_cached(rec: pd.DataFrame) -> int:
    return int(rec[(rec.event == "call_end") & (rec.step == 2)].cached_tokens.iloc[0])


@pytest.mark.parametrize(("policy", "log", "cached"), [
    ("keep", [("hold", "a"), ("release", "a")], 105),
    ("keep-evictable", [("unpin", "a"), ("release", "a")], 0),
    ("swap", [("offload", "a"), ("restore", "a"), ("release", "a")], 105),
    ("recompute", [("drop", "a"), ("release", "a")], 0),
])
def test_each_action_reaches_the_server_and_pinning_survives_pressure(
        tmp_path: Path, policy: str, log: list[tuple[str, str]], cached: int) -> None:
    """Under memory pressure during the pause, a pinned context is reused whole, an evictable
    one is lost, an offloaded one comes back on the resumed call, a dropped one is not
    reused; the server holds nothing for the run at its end."""
    rec, run, adapter = run_unslotted(tmp_path, policy, pressure_at_s=1.0)
    assert adapter.pause_log == log
    assert resumed_cached(rec) == cached
    assert run["cleanup"]["held_left"] == []
    assert run["capabilities"]["pause_actions"] == ["keep", "keep-evictable", "recompute",
                                                    "swap"]
    assert run["outcome"]["unsupported_actions"] == 0
    summary = read_json(tmp_path / "out" / "summary.json")
    if policy == "keep-evictable":  # lost to the pressure: never a mismatch, a retention
        assert summary["hint_honoured"] is None
        assert summary["effective_retention"]["rate"] == 0.0
    else:
        assert summary["hint_honoured"]["rate"] == 1.0
        assert summary["effective_retention"] is None
    assert summary["cache_mismatches"] == 0


def test_calls_are_held_only_for_policies_that_may_keep(tmp_path: Path) -> None:
    """keep-evictable and recompute never pin, so their calls are not held at their end;
    every other policy's are, until the pause decides."""
    for policy, held in (("keep", True), ("keep-evictable", False), ("recompute", False),
                         ("swap", True), ("threshold", True)):
        _, _, adapter = run_unslotted(tmp_path / policy, policy)
        assert {c.hold for c in adapter.calls} == {held}, policy


def test_evictable_context_survives_without_pressure(tmp_path: Path) -> None:
    rec, _, adapter = run_unslotted(tmp_path, "keep-evictable")
    assert resumed_cached(rec) == 105
    kv = rec[(rec.event == "kv_state") & (rec.status == "evictable")]
    assert kv.kv_tokens.tolist() == [105]


def test_swap_restored_on_the_call_is_recorded_without_a_server_time(tmp_path: Path) -> None:
    rec, _, _ = run_unslotted(tmp_path, "swap")
    out = rec[rec.event == "swap_out"].iloc[0]
    back = rec[rec.event == "swap_in"].iloc[0]
    assert (out.bytes, out.retained_tokens) == (105 * 100, 105)
    assert back.detail == "on the resumed call" and pd.isna(back.server_ms)
    released = rec[(rec.event == "kv_state") & (rec.step.isna())]
    assert "released" in released.status.tolist()


def test_swap_unsupported_keeps_the_context_pinned(tmp_path: Path) -> None:
    """A server that cannot offload: the decision is recorded unsupported and the context
    stays held (pinned) through the pause, and is still released at the end."""
    rec, run, adapter = run_unslotted(tmp_path, "swap", swap_supported=False,
                                      pressure_at_s=1.0)
    assert rec[rec.event == "pause_decision"].status.tolist() == ["unsupported"]
    assert run["outcome"]["unsupported_actions"] == 1
    assert resumed_cached(rec) == 105
    assert run["cleanup"]["held_left"] == [] and adapter.pinned == set()


def test_ttl_holds_then_applies_after_at_tau(tmp_path: Path) -> None:
    rec, _, adapter = run_unslotted(tmp_path, "ttl", {"tau": "1", "after": "swap"})
    assert adapter.pause_log == [("hold", "a"), ("offload", "a"), ("restore", "a"),
                                 ("release", "a")]
    assert resumed_cached(rec) == 105


def test_a_leak_is_a_cleanup_problem(tmp_path: Path) -> None:
    """A server that still holds something for the run at its end fails the cleanup check."""
    class Leaky(MemoryAdapter):
        async def release(self, kv: Any) -> None:
            self.pause_log.append(("release", kv.session))  # forgets to unpin

    async def go() -> dict[str, Any]:
        clock = VirtualClock()
        adapter = Leaky(clock, slotted=False)
        manifest = RunManifest(run_id="run1", policy="keep")
        await replay(adapter, clock, plan_of(traj("a")), make_policy("keep"),
                     tmp_path / "out", manifest, RATES, ReplaySettings(0.5))
        return manifest.to_dict()

    run = asyncio.run(go())
    assert run["cleanup"]["held_left"] == ["a"]
    manifest = RunManifest.from_dict(run)
    assert manifest.cleanup is not None
    assert manifest.cleanup.problems() == [
        "1 context(s) still held on the server, the first: a"]
    checks = {c["check"]: c for c in read_json(tmp_path / "out" / "summary.json")["health"]}
    assert checks["cleanup"]["status"] == "fail"


def test_a_refused_offload_at_tau_holds_the_context_for_the_rest_of_the_pause(
        tmp_path: Path) -> None:
    """ttl then swap on a server whose host memory is full: the offload is refused (recorded
    unsupported) and the context is held again without the TTL's expiry."""
    from harness.adapters.base import PausedKv, SlotIO, Unsupported

    class Full(MemoryAdapter):
        holds: list[float | None] = []

        async def hold(self, kv: PausedKv, ttl_s: float | None) -> None:
            self.holds.append(ttl_s)
            await super().hold(kv, ttl_s)

        async def offload(self, kv: PausedKv, name: str) -> SlotIO:
            raise Unsupported("host memory cap: the copy needs more")

    async def go() -> Full:
        clock = VirtualClock()
        adapter = Full(clock, slotted=False)
        await replay(adapter, clock, plan_of(traj("a")),
                     make_policy("ttl", {"tau": "1", "after": "swap"}), tmp_path / "out",
                     RunManifest(run_id="run1", policy="ttl"), RATES, ReplaySettings(0.5))
        return adapter

    adapter = asyncio.run(go())
    assert adapter.holds == [1.0, None]
    rec = read_records(tmp_path / "out")
    assert rec[rec.event == "swap_out"].status.tolist() == ["unsupported"]
    assert resumed_cached(rec) == 105
