"""Sub-agents: a parent's tool step that spawns child trajectories and waits for them, with the
step's deadline and a TTL alarm on the way; and settling tasks however they end. Timers run on
the executor's clock (a virtual one in tests), never asyncio's own.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

from harness.plan.planner import ToolStep, TrajectoryPlan
from harness.policies.base import Decision
from harness.records.kinds import ToolEnd
from harness.replay.clock import NS, Clock
from harness.replay.context import ReplayContext, ToolOutcome, TrajectoryState
from harness.replay.kv_actions import evict

# Runs one trajectory (plan, planned start ns, the parent's step that spawned it) to its end;
# returns its status. The executor's, injected so this module need not import it.
RunTrajectory = Callable[[TrajectoryPlan, int, int], Coroutine[Any, Any, str]]


async def settle(tasks: Sequence[asyncio.Task[Any]], cancel: bool) -> None:
    """Wait until every task is done (first cancelling, when `cancel`, those not cancelled
    yet: a second cancel would cut their cleanup short); a cancel that arrives meanwhile is
    passed on to them, and the wait goes on until they have ended."""
    if cancel:
        for t in tasks:
            if not t.cancelling():
                t.cancel()
    cancelled = False
    while True:
        try:
            await asyncio.gather(*tasks, return_exceptions=True)
            break
        except asyncio.CancelledError:
            cancelled = True
            for t in tasks:
                t.cancel()
    if cancelled:
        raise asyncio.CancelledError()  # the cancel that arrived is not lost


async def join_by(clock: Clock, tasks: Sequence[asyncio.Task[Any]], deadline_ns: int | None,
                  alarm_ns: int | None, on_alarm: Callable[[], Awaitable[None]]) -> bool:
    """Wait until every task has ended: True; or until `deadline_ns` passes with some still
    running: False (they are left running). `on_alarm` runs once at `alarm_ns` if that comes
    first. Cancelled, the wait cancels nothing itself."""
    join = asyncio.ensure_future(asyncio.wait(tasks))
    try:
        while not join.done():
            wake = min((x for x in (deadline_ns, alarm_ns) if x is not None), default=None)
            if wake is None:
                await asyncio.wait([join])
                break
            timer = asyncio.ensure_future(clock.sleep_until(wake))
            try:
                await asyncio.wait([join, timer], return_when=asyncio.FIRST_COMPLETED)
            finally:
                timer.cancel()
            if join.done():
                break
            if alarm_ns is not None and clock.now_ns() >= alarm_ns:
                alarm_ns = None
                await on_alarm()
            if deadline_ns is not None and clock.now_ns() >= deadline_ns and not join.done():
                return False
        return True
    finally:
        join.cancel()


class _TtlAlarm:
    """A TTL decision's expiry for a parent's pause: evicts at most once, whether it rings
    while the children run or after they have ended."""

    def __init__(self, ctx: ReplayContext, st: TrajectoryState, after: str | None,
                 step: int) -> None:
        self.ctx, self.st, self.after, self.step = ctx, st, after, step
        self.fired = False

    async def ring(self) -> None:
        """Apply the decision's `after` action, if it has not been and there is KV to evict."""
        if not self.fired and self.after and self.ctx.holds_kv(self.st):
            self.fired = True  # before the eviction's awaits: it never runs twice
            await evict(self.ctx, self.st, self.after, self.step, "ttl-expired")


class Subagents:
    """Spawns a parent's sub-agents and joins them; remembers which ones a parent stopped
    waiting for, so their own trajectories end cancelled (not interrupted)."""

    def __init__(self, ctx: ReplayContext, run_trajectory: RunTrajectory) -> None:
        self.ctx = ctx
        self._run_trajectory = run_trajectory
        self._stopped: dict[str, str] = {}  # sub-agents being cancelled by their parent: why

    def spawn(self, tool: ToolStep, t0: int) -> list[asyncio.Task[str]]:
        """Start the step's sub-agents, all at once, each a trajectory of its own planned at
        the tool's start `t0`."""
        return [asyncio.create_task(self._run_trajectory(c, t0, tool.step))
                for c in tool.children]

    def stop_reason(self, tid: str) -> str | None:
        """Why trajectory `tid`'s parent stopped it (and forget it), or None when its
        cancel came from the run itself."""
        return self._stopped.pop(tid, None)

    async def join(self, st: TrajectoryState, tool: ToolStep, d: Decision, supported: bool,
                   t0: int, children: list[asyncio.Task[str]]) -> ToolOutcome:
        """A parent's pause while its sub-agents run: the tool ends `latency_s` after the last
        has ended (unless the step's deadline comes first, which cancels those still
        running). A TTL decision expires as for any tool."""
        deadline_ns = (t0 + int(tool.deadline_s * NS) if math.isfinite(tool.deadline_s)
                       else None)
        ttl_ns = (t0 + int(d.ttl_s * NS) if supported and d.ttl_s is not None and d.after
                  else None)
        alarm = _TtlAlarm(self.ctx, st, d.after, tool.step)
        try:
            joined_all = await join_by(self.ctx.clock, children, deadline_ns, ttl_ns,
                                       alarm.ring)
        except BaseException:
            await settle(children, cancel=True)
            raise
        if not joined_all:
            assert deadline_ns is not None
            return await self._stop_waiting(st, tool, children, deadline_ns)
        return await self._residual(st, tool, t0, ttl_ns, alarm)

    async def _stop_waiting(self, st: TrajectoryState, tool: ToolStep,
                            children: list[asyncio.Task[str]], deadline_ns: int) -> ToolOutcome:
        """The deadline passed with sub-agents still running: cancel them (each recording why)
        and end the parent's tool in a timeout."""
        for c in tool.children:
            self._stopped[c.trajectory_id] = (
                f"parent-timeout: {st.tid} stopped waiting after {tool.deadline_s:g}s")
        await settle(children, cancel=True)
        for c in tool.children:
            self._stopped.pop(c.trajectory_id, None)
        self.ctx.rec.emit(ToolEnd(
            trajectory_id=st.tid, traffic="agent", step=tool.step, tool_class=tool.tool_class,
            status="timeout", planned_ns=deadline_ns))
        return "cancelled", f"tool timeout: deadline {tool.deadline_s:g}s", deadline_ns

    async def _residual(self, st: TrajectoryState, tool: ToolStep, t0: int, ttl_ns: int | None,
                        alarm: _TtlAlarm) -> ToolOutcome:
        """Every sub-agent has ended: the tool's own remaining `latency_s`, with the TTL alarm
        still due if it falls inside it, then the tool ends."""
        ctx = self.ctx
        joined = ctx.clock.now_ns()
        wait_s = (joined - t0) / NS
        end_ns = joined + int((tool.latency_s or 0.0) * NS)
        if ttl_ns is not None and ttl_ns < end_ns:
            await ctx.clock.sleep_until(ttl_ns)
            await alarm.ring()
        await ctx.clock.sleep_until(end_ns)
        wake = ctx.clock.now_ns()
        if end_ns > joined:  # a planned wake-up: its lateness is the client's own
            ctx.progress.lags_ms.append((wake - end_ns) / 1e6)
        ctx.history[tool.tool_class].add(wait_s + (tool.latency_s or 0.0))
        ctx.rec.emit(ToolEnd(trajectory_id=st.tid, traffic="agent", step=tool.step,
                             tool_class=tool.tool_class, status=tool.outcome,
                             planned_ns=end_ns), wake)
        return "completed", None, end_ns
