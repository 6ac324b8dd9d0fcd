"""Sub-agents and context cuts in the executor, on a virtual clock with an in-memory adapter."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

from harness.errors import InputError
from harness.metrics.frames import build_frames
from harness.metrics.outcomes import cache_mismatches, trajectory_outcomes
from harness.plan.injection import Injection
from harness.plan.planner import Arrivals, CallStep, Plan, ToolStep, TrajectoryPlan, make_plan
from harness.plan.tokens import stable_seed
from harness.policies import make_policy
from harness.records.store import read_records
from harness.replay.clock import NS
from harness.replay.preflight import check_subagent_slots, context_needed
from harness.traces.schema import steps_table
from tests.unit.test_executor import run_plan


def child(tid: str, latency: float = 1.0) -> TrajectoryPlan:
    return TrajectoryPlan(tid, 0.0, "interactive", "t", (
        CallStep(0, 50, stable_seed(tid, 0), 5),
        ToolStep(1, "grep", "local_read", latency, 10.0, "ok", False, True),
        CallStep(2, 10, stable_seed(tid, 2), 5),
    ), parent_id="p")


def parent(residual: float = 0.5, deadline: float = math.inf,
           kids: tuple[TrajectoryPlan, ...] | None = None) -> TrajectoryPlan:
    kids = kids if kids is not None else (child("p/a"), child("p/b", latency=3.0))
    return TrajectoryPlan("p", 0.0, "interactive", "t", (
        CallStep(0, 100, stable_seed("p", 0), 5),
        ToolStep(1, "Task", "subagent", residual, deadline, "ok", False, True, children=kids),
        CallStep(2, 10, stable_seed("p", 2), 5),
    ))


def plan_of(*trajs: TrajectoryPlan) -> Plan:
    return Plan(tuple(trajs), (), Arrivals(mode="closed", concurrency=1), 0, Injection())


def ev(rec: pd.DataFrame, event: str, tid: str) -> pd.DataFrame:
    return rec[(rec.event == event) & (rec.trajectory_id == tid)]


@pytest.mark.parametrize("policy", ["keep", "recompute", "swap"])
def test_children_run_beside_each_other_and_the_parent_waits(tmp_path: Path,
                                                             policy: str) -> None:
    rec, run, adapter = run_plan(tmp_path, plan_of(parent()), make_policy(policy), slots=3)
    t0 = ev(rec, "tool_start", "p").t_ns.iloc[0]
    starts = {t: ev(rec, "trajectory_start", t) for t in ("p/a", "p/b")}
    for s in starts.values():
        # started at the parent's pause, named as its sub-agent
        assert s.t_ns.iloc[0] == t0 and s.parent_id.iloc[0] == "p" and s.spawn_step.iloc[0] == 1
    # both children's first calls were under way before either ended: concurrent
    ends = {t: ev(rec, "trajectory_end", t).t_ns.iloc[0] for t in ("p/a", "p/b")}
    first_calls = [ev(rec, "call_start", t).t_ns.iloc[0] for t in ("p/a", "p/b")]
    assert max(first_calls) < min(ends.values())
    # the parent's tool ends its residual 0.5 s after the last child ended
    tool_end = ev(rec, "tool_end", "p").t_ns.iloc[0]
    assert tool_end - max(ends.values()) == round(0.5 * NS)
    assert ev(rec, "call_start", "p").t_ns.iloc[-1] >= tool_end
    assert ev(rec, "pause_decision", "p").tool_class.iloc[0] == "subagent"
    assert run["outcome"]["completed"] == 3
    assert adapter.files == {} and adapter.cache == {}
    frames = build_frames(read_records(tmp_path / "out"))
    outcome = trajectory_outcomes(frames, {})
    assert outcome["total"] == 1 and outcome["succeeded"] == 1
    assert outcome["subagents"]["total"] == 2 and outcome["subagents"]["succeeded"] == 2
    assert cache_mismatches(frames).empty


def test_a_parent_succeeds_only_with_its_children(tmp_path: Path) -> None:
    kids = (child("p/a"), TrajectoryPlan("p/b", 0.0, "interactive", "t", (
        CallStep(0, 50, stable_seed("p/b", 0), 5),
        ToolStep(1, "grep", "local_read", None, 2.0, "abandoned", False, True),
        CallStep(2, 10, stable_seed("p/b", 2), 5)), parent_id="p"))
    _, run, _ = run_plan(tmp_path, plan_of(parent(kids=kids)), make_policy("keep"), slots=3)
    outcome = trajectory_outcomes(build_frames(read_records(tmp_path / "out")), {})
    assert run["outcome"]["cancelled"] == 1  # the child whose tool never returned
    assert outcome["total"] == 1 and outcome["succeeded"] == 0
    assert outcome["subagent_failed"] == 1
    assert outcome["subagents"]["cancelled"] == 1


def test_the_wait_for_children_ends_at_the_deadline(tmp_path: Path) -> None:
    rec, run, adapter = run_plan(tmp_path, plan_of(parent(deadline=2.0)), make_policy("keep"),
                                 slots=3)
    t0 = ev(rec, "tool_start", "p").t_ns.iloc[0]
    end = ev(rec, "tool_end", "p").iloc[0]
    assert end.status == "timeout" and end.t_ns - t0 == 2 * NS
    assert ev(rec, "trajectory_end", "p").status.iloc[0] == "cancelled"
    # the child still running was cancelled, and everything it held released
    end_b = ev(rec, "trajectory_end", "p/b").iloc[0]
    assert end_b.status == "cancelled" and end_b.reason.startswith("parent-timeout")
    assert adapter.cache == {} and run["cleanup"]["errors"] == []


def test_keep_tokens_cuts_the_context_and_reuse_is_judged_on_the_kept_part(
        tmp_path: Path) -> None:
    t = TrajectoryPlan("a", 0.0, "interactive", "t", (
        CallStep(0, 100, stable_seed("a", 0), 5),
        ToolStep(1, "search", "remote_read", 1.0, 10.0, "ok", False, True),
        CallStep(2, 30, stable_seed("a", 2), 5, keep_tokens=64),
    ))
    rec, _, adapter = run_plan(tmp_path, plan_of(t), make_policy("keep"))
    assert len(adapter.calls[1].prompt) == 64 + 30
    assert adapter.calls[1].prompt[:64] == adapter.calls[0].prompt[:64]
    resumed = rec[(rec.event == "call_end") & (rec.step == 2)].iloc[0]
    assert resumed.cached_tokens == 64
    assert cache_mismatches(build_frames(read_records(tmp_path / "out"))).empty


def frame_rows() -> list[dict[str, object]]:
    tool = dict(kind="tool", latency_s=0.5, outcome="ok", mutating=False)
    return [
        dict(trajectory_id="p", step=0, kind="llm", input_tokens=100, output_tokens=5,
             prefix_group="g", prefix_tokens=40),
        dict(trajectory_id="p", step=1, tool_name="Task", tool_class="subagent",
             prefix_group="g", prefix_tokens=40, **tool),
        dict(trajectory_id="p", step=2, kind="llm", input_tokens=10, output_tokens=5,
             keep_tokens=64, prefix_group="g", prefix_tokens=40),
        *[r for k in ("a", "b") for r in (
            dict(trajectory_id=f"p/{k}", step=0, kind="llm", input_tokens=50, output_tokens=5,
                 parent_id="p", spawn_step=1),
            dict(trajectory_id=f"p/{k}", step=1, tool_name="grep", tool_class="local_read",
                 parent_id="p", spawn_step=1, **tool),
            dict(trajectory_id=f"p/{k}", step=2, kind="llm", input_tokens=5, output_tokens=5,
                 parent_id="p", spawn_step=1))],
    ]


def test_the_planner_hangs_children_under_their_parent() -> None:
    df = steps_table(frame_rows(), {"start_s": 0.0, "priority": "interactive",
                                    "tenant": "t"}).to_pandas()
    plan = make_plan(df, Injection(), Arrivals(mode="poisson", rate=1.0), seed=1)
    assert [t.trajectory_id for t in plan.trajectories] == ["p"]
    spawn = plan.trajectories[0].steps[1]
    assert isinstance(spawn, ToolStep) and spawn.deadline_s == math.inf
    assert [c.trajectory_id for c in spawn.children] == ["p/a", "p/b"]
    assert all(c.parent_id == "p" for c in spawn.children)
    first = plan.trajectories[0].steps[0]
    assert isinstance(first, CallStep) and first.shared_prefix == 40
    last = plan.trajectories[0].steps[2]
    assert isinstance(last, CallStep) and last.keep_tokens == 64
    assert [t.trajectory_id for t in plan.all_trajectories()] == ["p", "p/a", "p/b"]
    assert plan.trajectories[0].peak_slots() == 3
    assert plan.trajectories[0].peak_requests() == 2
    assert context_needed(plan.trajectories[0]) == 105  # its first call; the cut shortens


def test_too_few_slots_for_kept_parents_and_their_children_is_refused() -> None:
    plan = Plan((parent(), parent()), (), Arrivals(mode="closed", concurrency=2), 0,
                Injection())
    check_subagent_slots(plan, 6)
    with pytest.raises(InputError, match="need up to 6 slots at once"):
        check_subagent_slots(plan, 5)
    check_subagent_slots(plan, None)  # the server manages its own memory


def test_measured_reuse_by_pause_sits_beside_the_ideal(tmp_path: Path) -> None:
    from harness.metrics.reuse import measured_reuse, reuse_rows
    from harness.traces.reuse import ideal_reuse

    t = TrajectoryPlan("a", 0.0, "interactive", "t", (
        CallStep(0, 100, stable_seed("a", 0), 5),
        ToolStep(1, "search", "remote_read", 2.0, 10.0, "ok", False, True),
        CallStep(2, 30, stable_seed("a", 2), 5, keep_tokens=64),
    ))
    run_plan(tmp_path, plan_of(t), make_policy("keep"))
    measured = measured_reuse(build_frames(read_records(tmp_path / "out")))
    assert measured is not None
    by = {b["bucket"]: b for b in measured["by_bucket"]}
    assert by["first call"]["cached_tokens"] == 0 and by["first call"]["prompt_tokens"] == 100
    assert by["1-10s"] == {"bucket": "1-10s", "calls": 1, "prompt_tokens": 94,
                           "cached_tokens": 64, "hit_rate": 64 / 94}
    df = steps_table([
        dict(trajectory_id="a", step=0, kind="llm", input_tokens=100, output_tokens=5),
        dict(trajectory_id="a", step=1, kind="tool", tool_name="search",
             tool_class="remote_read", latency_s=2.0, outcome="ok", mutating=False),
        dict(trajectory_id="a", step=2, kind="llm", input_tokens=30, output_tokens=5,
             keep_tokens=64)], {"start_s": 0.0, "priority": "interactive",
                                "tenant": "t"}).to_pandas()
    rows = {r["bucket"]: r for r in reuse_rows(measured, ideal_reuse(df), "keep")}
    assert rows["1-10s"]["measured"] == rows["1-10s"]["ideal"] == 64 / 94
    assert rows["1-10s"]["policy_ideal"] == 64 / 94
    assert set(rows) == {"first call", "1-10s"}  # buckets without calls are left out


def test_a_ttl_expires_while_the_children_run(tmp_path: Path) -> None:
    rec, _, _ = run_plan(tmp_path, plan_of(parent()),
                         make_policy("ttl", {"tau": "1", "after": "recompute"}), slots=3)
    t0 = ev(rec, "tool_start", "p").t_ns.iloc[0]
    erase = ev(rec, "erase", "p")
    assert erase.reason.iloc[0] == "ttl-expired" and erase.t_ns.iloc[0] - t0 == 1 * NS
    assert len(erase[erase.reason == "ttl-expired"]) == 1
    resumed = rec[(rec.event == "call_end") & (rec.trajectory_id == "p") & (rec.step == 2)]
    assert resumed.cached_tokens.iloc[0] == 0


def test_a_sub_agent_cache_salt_is_a_name_servers_accept() -> None:
    from harness.replay.kv_actions import cache_salt

    run = "recompute-20261201T000000-abcdef"
    key = cache_salt(run, "trace_0254/agent_001", 3)
    assert "/" not in key and len(key) <= 128 and key.endswith("-3")
    assert key != cache_salt(run, "trace_0254_agent_001", 3)
    assert cache_salt(run, "trace_0254_agent_001", 3) == f"{run}-trace_0254_agent_001-3"
    assert len(cache_salt(run, "x" * 200, 3)) <= 128
