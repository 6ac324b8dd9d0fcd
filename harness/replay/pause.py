"""The pause at a tool step: ask the policy what to do with the trajectory's KV, do it while the
tool runs (or its sub-agents do), wait the tool out on the clock, let a TTL decision expire on
the way, and end the tool, returned or cut off by its deadline.
"""

from __future__ import annotations

import math

from harness.plan.planner import ToolStep, TrajectoryPlan
from harness.policies.base import KEEP, Decision, PauseContext
from harness.records.atomic import UnwritableResults
from harness.records.kinds import KvState, PauseDecision, ToolEnd, ToolStart
from harness.replay.clock import NS
from harness.replay.context import ReplayContext, ToolOutcome, TrajectoryState
from harness.replay.kv_actions import evict, hold
from harness.replay.subagents import Subagents, settle


async def pause_at_tool(ctx: ReplayContext, subagents: Subagents, st: TrajectoryState,
                        traj: TrajectoryPlan, tool: ToolStep) -> ToolOutcome:
    """Run one tool step of `traj` under the pause policy; returns how it ended and when (the
    next call is due then)."""
    d, supported = _decide(ctx, st, traj, tool)
    st.hint_step = tool.step if ctx.hints.sent(st.tid, tool.step, d, supported) else None
    t0 = ctx.rec.emit(ToolStart(
        trajectory_id=st.tid, traffic="agent", step=tool.step, tool_class=tool.tool_class,
        tool_name=tool.tool_name, planned_latency_s=tool.latency_s,
        deadline_s=tool.deadline_s if math.isfinite(tool.deadline_s) else None))
    # Sub-agents start with the tool, while their parent's KV is being dealt with.
    children = subagents.spawn(tool, t0)
    try:
        await _park(ctx, st, tool, d, supported)
    except BaseException:
        await settle(children, cancel=True)
        raise
    if children:
        return await subagents.join(st, tool, d, supported, t0, children)
    end_ns, returns = _planned_end(tool, t0)
    if supported and d.ttl_s is not None and d.after:
        await _expire_ttl(ctx, st, tool.step, d.after, t0, d.ttl_s, end_ns)
    wake = await _wake_at(ctx, end_ns)
    return _end_tool(ctx, st, tool, returns, end_ns, wake)


def _decide(ctx: ReplayContext, st: TrajectoryState, traj: TrajectoryPlan,
            tool: ToolStep) -> tuple[Decision, bool]:
    """The policy's decision for this pause, and whether the server supports it (an
    unsupported one is recorded as such and not carried out)."""
    d = ctx.policy.decide(_pause_context(ctx, st, traj, tool))
    actions = ctx.adapter.capabilities.pause_actions
    supported = d.action in actions and (d.after is None or d.after in actions)
    ctx.rec.emit(PauseDecision(
        trajectory_id=st.tid, traffic="agent", step=tool.step, tool_class=tool.tool_class,
        action=d.label, reason=d.reason, retained_tokens=len(st.context),
        predicted_wait_s=d.predicted_wait_s, slot=st.slot,
        status="ok" if supported else "unsupported",
        detail=f"ttl_s={d.ttl_s} after={d.after}" if d.ttl_s is not None else None))
    return d, supported


def _pause_context(ctx: ReplayContext, st: TrajectoryState, traj: TrajectoryPlan,
                   tool: ToolStep) -> PauseContext:
    """What the policy may know at this pause."""
    return PauseContext(
        run_id=ctx.run_id, trajectory_id=st.tid, tool_class=tool.tool_class,
        deadline_ms=tool.deadline_s * 1000.0 if math.isfinite(tool.deadline_s) else None,
        retained_tokens=len(st.context),
        resume_required=tool.resume_required, priority=traj.priority,
        history_s=ctx.history[tool.tool_class],
        free_slots=ctx.pool.free if ctx.pool else 0,
        total_slots=ctx.pool.total if ctx.pool else 1, rates=ctx.rates,
        # a parent's wait is its sub-agents', known only once they end
        true_latency_s=(tool.latency_s if ctx.policy.sees_true_latency
                        and not tool.children else None),
        queue_delay_s=ctx.queue_delays.mean())


async def _park(ctx: ReplayContext, st: TrajectoryState, tool: ToolStep, d: Decision,
                supported: bool) -> None:
    """Carry out the decision at the tool's start: evict the KV, or hold it while paused. A
    control the server does not answer leaves the hint missing and the context where it was;
    the trajectory goes on."""
    try:
        if supported and d.action != KEEP:
            await evict(ctx, st, d.action, tool.step, "policy")
            return
        if supported:
            await hold(ctx, st, d.ttl_s)
        else:
            # Nothing was done, so the context stays where it was: held while paused.
            ctx.counters.outcome.unsupported_actions += 1
    except UnwritableResults:
        raise
    except Exception as exc:
        ctx.hints.lost(st.tid, tool.step, exc)
        st.pinned = ctx.pool is None
    finally:
        ctx.hints.collect()
    ctx.rec.emit(KvState(trajectory_id=st.tid, traffic="agent",
                         kv_tokens=len(st.context), status="paused"))


def _planned_end(tool: ToolStep, t0: int) -> tuple[int, bool]:
    """When the tool ends, and whether it returns by then (False: its deadline ends it, or it
    never returns)."""
    if tool.latency_s is not None and tool.latency_s <= tool.deadline_s:
        return t0 + int(tool.latency_s * NS), True
    return t0 + int(tool.deadline_s * NS), False


async def _expire_ttl(ctx: ReplayContext, st: TrajectoryState, step: int, after: str, t0: int,
                     ttl_s: float, end_ns: int) -> None:
    """A TTL decision kept the KV for `ttl_s`: if the tool is still out then, apply `after`."""
    if t0 + ttl_s * NS < end_ns:
        await ctx.clock.sleep_until(t0 + int(ttl_s * NS))
        if ctx.holds_kv(st):
            await evict(ctx, st, after, step, "ttl-expired")


async def _wake_at(ctx: ReplayContext, end_ns: int) -> int:
    """Sleep until the tool's end; returns the time its end is stamped with."""
    # Still busy with this pause's eviction when the tool returned: the harness was waiting
    # on the server, not late, and what follows is the policy's cost (resume latency runs
    # from the tool's end).
    overran = ctx.clock.now_ns() >= end_ns
    await ctx.clock.sleep_until(end_ns)
    if overran:
        return end_ns
    # Stamped when the harness woke, not when it meant to: resume latency runs from the
    # moment the harness could act, and the lag (t_ns - planned_ns) is the client's own.
    wake = ctx.clock.now_ns()
    ctx.progress.lags_ms.append((wake - end_ns) / 1e6)
    return wake


def _end_tool(ctx: ReplayContext, st: TrajectoryState, tool: ToolStep, returns: bool,
              end_ns: int, wake: int) -> ToolOutcome:
    """Record the tool's end: returned (its latency joins the class's history), or cut off at
    its deadline, which cancels the trajectory."""
    if not returns:
        status = "abandoned" if tool.latency_s is None else "timeout"
        ctx.rec.emit(ToolEnd(trajectory_id=st.tid, traffic="agent", step=tool.step,
                             tool_class=tool.tool_class, status=status, planned_ns=end_ns), wake)
        return "cancelled", f"tool {status}: deadline {tool.deadline_s:g}s", end_ns
    assert tool.latency_s is not None  # a tool that returns has a latency (_planned_end)
    ctx.history[tool.tool_class].add(tool.latency_s)
    ctx.rec.emit(ToolEnd(trajectory_id=st.tid, traffic="agent", step=tool.step,
                         tool_class=tool.tool_class, status=tool.outcome, planned_ns=end_ns), wake)
    return "completed", None, end_ns
