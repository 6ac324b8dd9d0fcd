"""Every pause that sends the server a hint gets one outcome, from what the server did and said:
accepted, clipped, deferred, rejected or missing (harness.replay.hints)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from harness.adapters.base import HintReport, PausedKv, Unsupported
from harness.policies import make_policy
from harness.policies.pin_release import (
    LARGEST,
    LATEST_PROGRAM,
    LRU,
    PinSettings,
    PinView,
    release_order,
)
from harness.records.manifest import RunManifest
from harness.records.store import read_records
from harness.replay.clock import VirtualClock
from harness.replay.runner import ReplaySettings, replay
from tests.fakes.memory_adapter import MemoryAdapter
from tests.unit.test_executor import RATES, plan_of, run_plan, traj


def outcomes(rec: pd.DataFrame) -> list[tuple[str, int, str, str]]:
    rows = rec[rec.event == "hint_outcome"]
    return [(r.trajectory_id, int(r.step), r.action, r.status) for r in rows.itertuples()]


@pytest.mark.parametrize("policy", ["keep", "swap", "recompute"])
def test_slots_the_harness_owns_accept_each_hint_at_the_resume(tmp_path: Path, policy: str) -> None:
    rec, _, _ = run_plan(tmp_path, plan_of(traj("a"), traj("b")), make_policy(policy))
    assert sorted(outcomes(rec)) == [("a", 1, policy, "accepted"), ("b", 1, policy, "accepted")]
    # the outcome comes after the tool's end: at the resume
    a = rec[rec.trajectory_id == "a"]
    assert (a[a.event == "hint_outcome"].seq.iloc[0] > a[a.event == "tool_end"].seq.iloc[0])


def test_keep_evictable_sends_no_hint(tmp_path: Path) -> None:
    rec, _, _ = run_plan(tmp_path, plan_of(traj("a")), make_policy("keep-evictable"),
                         slotted=False)
    assert outcomes(rec) == []


def test_an_action_the_runtime_cannot_do_is_rejected(tmp_path: Path) -> None:
    rec, _, _ = run_plan(tmp_path, plan_of(traj("a")), make_policy("swap"),
                         swap_supported=False)
    rows = rec[rec.event == "hint_outcome"]
    assert outcomes(rec) == [("a", 1, "swap", "rejected")]
    assert rows.reason.iloc[0] == "unsupported"


def test_a_lost_control_leaves_the_pause_missing_and_the_trajectory_goes_on(tmp_path: Path) -> None:
    rec, run, _ = run_plan(tmp_path, plan_of(traj("a")), make_policy("recompute"),
                           slotted=False, fail_ops={"drop"})
    rows = rec[rec.event == "hint_outcome"]
    assert outcomes(rec) == [("a", 1, "recompute", "missing")]
    assert rows.reason.iloc[0] == "control failed" and "never answered" in rows.detail.iloc[0]
    assert run["outcome"]["completed"] == 1


class Clipping(MemoryAdapter):
    """A server that reports, at each hold, that its valve released the pin 0.25 s in."""

    async def hold(self, kv: PausedKv, ttl_s: float | None) -> None:
        await super().hold(kv, ttl_s)
        assert kv.step is not None  # the pause's tag travels with its control
        self.reports.append(HintReport(kv.session, kv.step, "clipped", reason="valve:lru",
                                       held_s=0.25))


def run_on(tmp_path: Path, adapter_cls: type[MemoryAdapter], policy: str,
           **kw: Any) -> pd.DataFrame:
    async def go() -> None:
        clock = VirtualClock()
        adapter = adapter_cls(clock, slotted=False, reports_hints=True, **kw)
        await replay(adapter, clock, plan_of(traj("a"), traj("b")), make_policy(policy),
                     tmp_path / "out", RunManifest(run_id="r", policy=policy), RATES,
                     ReplaySettings(0.5))

    asyncio.run(go())
    return read_records(tmp_path / "out")


def test_a_server_that_reports_settles_its_hints_from_its_reports(tmp_path: Path) -> None:
    rec = run_on(tmp_path, Clipping, "keep")
    assert sorted(outcomes(rec)) == [("a", 1, "keep", "clipped"), ("b", 1, "keep", "clipped")]
    rows = rec[rec.event == "hint_outcome"]
    assert set(rows.reason) == {"valve:lru"} and set(rows.held_s) == {0.25}


def test_a_reporting_server_that_says_nothing_leaves_its_hints_missing(tmp_path: Path) -> None:
    rec = run_on(tmp_path, MemoryAdapter, "keep")
    assert sorted(outcomes(rec)) == [("a", 1, "keep", "missing"), ("b", 1, "keep", "missing")]
    assert set(rec[rec.event == "hint_outcome"].reason) == {"unreported"}


def test_the_valve_orders_agree_on_ties_and_kinds() -> None:
    pins = [PinView("b", arrived=1.0, used=5.0, blocks=3), PinView("a", 2.0, 4.0, 3),
            PinView("c", 2.0, 6.0, 9)]
    assert release_order(pins, LATEST_PROGRAM) == ["a", "c", "b"]
    assert release_order(pins, LRU) == ["a", "b", "c"]
    assert release_order(pins, LARGEST) == ["c", "a", "b"]


@pytest.mark.parametrize(("kw", "message"), [
    ({"release_order": "nonsense"}, "pin release order"),
    ({"expiry_s": -1.0}, "pin expiry"),
    ({"expiry_s": float("nan")}, "pin expiry"),
    ({"host_cap_bytes": -1}, "host cap"),
])
def test_pin_settings_refuse_what_no_server_can_do(kw: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PinSettings(**kw)  # type: ignore[arg-type]


def test_a_trajectory_s_longest_pause_comes_from_its_plan() -> None:
    from harness.replay.executor import longest_pause_s

    assert longest_pause_s(traj("a", latency=2.0, deadline=10.0)) == 2.0
    assert longest_pause_s(traj("a", latency=30.0, deadline=10.0)) == 10.0  # cut at its deadline
    assert longest_pause_s(traj("a", latency=None, deadline=5.0)) == 5.0
    assert longest_pause_s(traj("a", latency=None, deadline=float("inf"))) is None


class ReleasedBeforeTheOffload(MemoryAdapter):
    """A server whose valve released the pin before the pause's offload arrived: it refuses
    the offload and reports the release with the refusal."""

    async def offload(self, kv: PausedKv, name: str) -> Any:
        assert kv.step is not None
        self.reports.append(HintReport(kv.session, kv.step, "clipped", reason="valve: lru",
                                       held_s=0.1))
        raise Unsupported("nothing is pinned for the session: nothing to offload")


def test_an_offload_refused_because_the_valve_came_first_is_clipped(tmp_path: Path) -> None:
    rec = run_on(tmp_path, ReleasedBeforeTheOffload, "swap")
    assert sorted(outcomes(rec)) == [("a", 1, "swap", "clipped"), ("b", 1, "swap", "clipped")]


def test_a_pause_cut_off_by_its_tool_s_deadline_is_accepted_at_the_release(
        tmp_path: Path) -> None:
    rec, run, _ = run_plan(tmp_path, plan_of(traj("a", latency=None, deadline=5.0)),
                           make_policy("keep"))
    assert run["outcome"]["cancelled"] == 1
    rows = rec[rec.event == "hint_outcome"]
    assert outcomes(rec) == [("a", 1, "keep", "accepted")]
    assert rows.reason.iloc[0] == "held until the trajectory ended"
