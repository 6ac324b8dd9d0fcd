"""The executor: drives one adapter through a plan, applying the pause policy at every tool call.

Lifecycle per trajectory: prefill -> decode -> tool_wait -> restoring -> decode -> ... ->
completed | cancelled | failed | interrupted, each transition recorded. Server-side state the
run creates (slot contents, dump files) is released when a trajectory ends, however it ends.

This module owns the run and each trajectory's lifecycle (arrivals, the horizon, the LLM
calls); the pause at a tool step is `pause`, what is done to the KV `kv_actions`, sub-agents
`subagents`, bystander traffic `bystanders`, and the state they share `context`.
"""

from __future__ import annotations

import asyncio
import math
from collections import defaultdict
from dataclasses import dataclass

from harness.adapters.base import Adapter, CompletionRequest
from harness.plan.planner import CallStep, Plan, ToolStep, TrajectoryPlan
from harness.policies.base import KEEP, PausePolicy, ServerRates, call_priority, program_order
from harness.policies.history import DEFAULT_WINDOW, History
from harness.records.atomic import UnwritableResults
from harness.records.kinds import (
    CallEnd,
    CallStart,
    Cancel,
    KvState,
    TrajectoryEnd,
    TrajectoryStart,
)
from harness.replay.bystanders import Bystanders
from harness.replay.clock import NS, Clock
from harness.replay.context import ReplayContext, RunCounters, TrajectoryState
from harness.replay.hints import HintLedger
from harness.replay.kv_actions import learn_prefill, release, restore
from harness.replay.pause import pause_at_tool
from harness.replay.progress import Progress
from harness.replay.recorder import ChunkTimes, Recorder, SlotPool
from harness.replay.subagents import Subagents, settle

__all__ = ["SERVER_FAULTS", "Executor", "RunCounters"]

# Failure reasons that mean the server failed, not the task (its tools, its context).
SERVER_FAULTS = ("server error:", "timeout:")


@dataclass(frozen=True)
class ServerFacts:
    """What the executor needs to know of the server: its vocabulary (token ids are drawn
    below it), its slots and context per slot (None where the runtime has none), the rates
    policies price actions with, and a shard's own slots (None: all of them)."""

    vocab_size: int
    slots: int | None
    ctx_per_slot: int | None
    rates: ServerRates
    slot_ids: list[int] | None = None


def longest_pause_s(traj: TrajectoryPlan) -> float | None:
    """The longest pause `traj`'s plan has: a tool's latency, or its deadline when it does not
    return by then; None when one may last without bound (a tool that never returns and has no
    deadline, or sub-agents, whose length the plan does not fix)."""
    longest = 0.0
    for step in traj.steps:
        if isinstance(step, ToolStep):
            if step.children:
                return None
            ends = (step.latency_s if step.latency_s is not None
                    and step.latency_s <= step.deadline_s else step.deadline_s)
            if not math.isfinite(ends):
                return None
            longest = max(longest, ends)
    return longest


class Executor:
    """Replays a plan through an adapter (clock, adapter, HTTP injected)."""

    def __init__(self, adapter: Adapter, clock: Clock, recorder: Recorder, policy: PausePolicy,
                 plan: Plan, run_id: str, server: ServerFacts,
                 history_window: int = DEFAULT_WINDOW) -> None:
        vocab_size, slots, ctx_per_slot, rates, slot_ids = (
            server.vocab_size, server.slots, server.ctx_per_slot, server.rates, server.slot_ids)
        self.plan = plan
        self.ctx_per_slot = ctx_per_slot
        self.history_window = history_window
        caps = adapter.capabilities
        pool = SlotPool(slots, slot_ids) if caps.harness_slots and slots else None
        self.ctx = ReplayContext(
            adapter=adapter, clock=clock, rec=recorder, policy=policy, run_id=run_id,
            vocab=vocab_size, pool=pool, rates=rates, counters=RunCounters(),
            progress=Progress(sum(isinstance(s, CallStep) for t in plan.all_trajectories()
                                  for s in t.steps)),
            history=defaultdict(lambda: History(history_window)),
            hints=HintLedger(recorder, adapter),
            # Where the server pins on request, an agent's call is held once it ends, so its
            # context cannot be evicted before the pause's decision reaches the server.
            hold_calls=(pool is None and KEEP in caps.pause_actions
                        and getattr(policy, "holds", True)))
        self.subagents = Subagents(self.ctx, self.trajectory)
        self.bystanders = Bystanders(self.ctx, plan.bystanders)
        self._horizon_hit = False  # a bounded run reached its horizon (plan.horizon_s)
        # Program order: each task's arrival rank (sub-agents take their root's), sent as the
        # calls' priority where the policy asks for it and the server schedules by it.
        self.ordered = program_order(policy) and caps.call_priority
        self._ranks: dict[str, int] = {}

    @property
    def counters(self) -> RunCounters:
        """The run's outcome counters (final once `run` has returned)."""
        return self.ctx.counters

    @property
    def progress(self) -> Progress:
        """Live counts for the progress line."""
        return self.ctx.progress

    @property
    def rates(self) -> ServerRates:
        """The server rates as learned so far (the run's final rates once it has ended)."""
        return self.ctx.rates

    # ---- the run -------------------------------------------------------------------------
    async def run(self) -> RunCounters:
        """Run every trajectory (and bystanders) to its end; returns the outcome counters.
        Cancelled (an interrupted run), every trajectory's own cleanup finishes, and records
        its end, before this returns; a second cancel cuts those cleanups short."""
        bystanders = asyncio.create_task(self.bystanders.run())
        if self.plan.arrivals.mode == "closed":
            queue: asyncio.Queue[TrajectoryPlan] = asyncio.Queue()
            for t in self.plan.trajectories:
                queue.put_nowait(t)
            n = min(self.plan.arrivals.concurrency, len(self.plan.trajectories))
            tasks = [asyncio.create_task(self._agent(queue)) for _ in range(n)]
        else:
            tasks = [asyncio.create_task(self._open_loop(t)) for t in self.plan.trajectories]
        horizon = self.plan.horizon_s
        timer = (asyncio.create_task(self._horizon(tasks, horizon)) if horizon is not None
                 else None)
        interrupted = True
        try:
            # Trajectories stopped at the horizon end cancelled, which is not the run's end.
            for r in await asyncio.gather(*tasks, return_exceptions=timer is not None):
                if isinstance(r, Exception):
                    raise r
            interrupted = False
        finally:
            if timer is not None:
                timer.cancel()
            self.bystanders.agents_done.set()
            bystanders.cancel()
            # A cancelled gather returns at once; the trajectories' cleanups may still run.
            await settle([*tasks, bystanders], cancel=interrupted)
            # Requests already sent finish (and free their slots) before the run ends; an
            # interrupted run stops them.
            await settle(list(self.bystanders.in_flight), cancel=interrupted)
            self.ctx.hints.finish()
            self.ctx.rec.flush()
        return self.ctx.counters

    async def _horizon(self, tasks: list[asyncio.Task[None]], horizon_s: float) -> None:
        """At a bounded run's end: stop every trajectory still running (interrupted, reason
        run-horizon) and every arrival still to come."""
        await self.ctx.clock.sleep_until(int(horizon_s * NS))
        self._horizon_hit = True
        for t in tasks:
            t.cancel()

    async def _agent(self, queue: asyncio.Queue[TrajectoryPlan]) -> None:
        """A closed loop's agent: runs queued trajectories one after another."""
        while not queue.empty() and not self._horizon_hit:
            traj = queue.get_nowait()
            await self.trajectory(traj, self.ctx.clock.now_ns())

    async def _open_loop(self, traj: TrajectoryPlan) -> None:
        """An open loop's arrival: the trajectory starts at its planned time."""
        due = int(traj.arrival_s * NS)
        await self.ctx.clock.sleep_until(due)
        await self.trajectory(traj, due)

    # ---- one trajectory ------------------------------------------------------------------
    async def trajectory(self, traj: TrajectoryPlan, planned_ns: int,
                         spawn_step: int | None = None) -> str:
        """Run one trajectory; it ends completed | cancelled | failed | interrupted. A
        sub-agent's record names its parent and the parent's step that spawned it."""
        ctx = self.ctx
        st = TrajectoryState(traj.trajectory_id, longest_pause_s=longest_pause_s(traj))
        parent = self._ranks.get(traj.parent_id) if traj.parent_id is not None else None
        st.rank = self._ranks.setdefault(traj.trajectory_id,
                                         len(self._ranks) if parent is None else parent)
        ctx.progress.agents_active += 1
        ctx.rec.emit(TrajectoryStart(
            trajectory_id=st.tid, traffic="agent", planned_ns=planned_ns,
            priority=traj.priority, parent_id=traj.parent_id, spawn_step=spawn_step))
        status, reason = "completed", None
        server_fault = False
        due = planned_ns
        try:
            for i, step in enumerate(traj.steps):
                if isinstance(step, CallStep):
                    status, reason = await self._call(st, step, due, is_resume=i > 0)
                else:
                    status, reason, due = await pause_at_tool(ctx, self.subagents, st, traj,
                                                              step)
                if status != "completed":
                    server_fault = reason is not None and reason.startswith(SERVER_FAULTS)
                    break
        except asyncio.CancelledError:
            # A sub-agent its parent stopped waiting for was cancelled, not the run.
            stopped = self.subagents.stop_reason(st.tid)
            status, reason = (("cancelled", stopped) if stopped else (
                "interrupted", "run-horizon" if self._horizon_hit else "run-interrupted"))
            raise
        except UnwritableResults as exc:  # the disk, not the server: the run stops
            status, reason = "interrupted", f"results could not be written: {exc}"[:300]
            raise
        except Exception as exc:  # a server that breaks the protocol fails this trajectory only
            status, reason = "failed", f"{type(exc).__name__}: {exc}"[:300]
            server_fault = True
        finally:
            await self._end(st, status, reason, server_fault)
        return status

    async def _end(self, st: TrajectoryState, status: str, reason: str | None,
                   server_fault: bool) -> None:
        """A trajectory's end, however it ended: its server-side state released, its end
        recorded and counted."""
        ctx = self.ctx
        if status == "cancelled":
            ctx.rec.emit(Cancel(trajectory_id=st.tid, traffic="agent", reason=reason))
        try:
            await release(ctx, st, "trajectory-end")
            ctx.hints.ended(st.tid, st.hint_step)
            ctx.hints.collect()
        finally:
            # Recorded even when an interrupted run cuts its cleanup short.
            ctx.rec.emit(TrajectoryEnd(trajectory_id=st.tid, traffic="agent",
                                       status=status, reason=reason))
        outcome = ctx.counters.outcome
        setattr(outcome, status, getattr(outcome, status) + 1)
        outcome.server_failed += status == "failed" and server_fault
        ctx.progress.agents_active -= 1
        ctx.progress.trajectories_done += 1

    async def _call(self, st: TrajectoryState, call: CallStep, due_ns: int,
                    is_resume: bool) -> tuple[str, str | None]:
        """One LLM call of the trajectory, its KV restored first; the context grows by the
        prompt's appended tokens and the output."""
        ctx = self.ctx
        appended = call.append_ids(ctx.vocab)
        # A trace that says the call shares only part of its context keeps just that part.
        kept = st.context if call.keep_tokens is None else st.context[:call.keep_tokens]
        prompt = kept + appended
        if self.ctx_per_slot and len(prompt) + call.output_tokens > self.ctx_per_slot:
            ctx.rec.emit(CallEnd(
                trajectory_id=st.tid, traffic="agent", step=call.step, status="error",
                detail=f"context overflow: {len(prompt)} + {call.output_tokens} tokens exceed "
                f"{self.ctx_per_slot} per slot"))
            return "failed", "context-overflow"
        # Lost its context while paused: its wait for the server joins queue_delay_s.
        evicted = is_resume and bool(st.context) and not ctx.kept_through_pause(st)
        await restore(ctx, st, call.step)
        if is_resume:
            ctx.hints.resumed(st.tid, st.hint_step)
            st.hint_step = None
        if st.context:
            # The resumed call holds its context on the device from here (kept, restored, or
            # being re-prefilled).
            ctx.rec.emit(KvState(trajectory_id=st.tid, traffic="agent",
                                 kv_tokens=len(st.context), status="active"))
        sent_ns = ctx.rec.emit(CallStart(trajectory_id=st.tid, traffic="agent",
                                         step=call.step, slot=st.slot, planned_ns=due_ns,
                                         prompt_tokens=len(prompt), appended_tokens=len(appended),
                                         is_resume=is_resume))
        chunks = ChunkTimes(ctx.rec, ctx.clock, st.tid, "agent", call.step, st.slot)
        res = await ctx.adapter.complete(
            CompletionRequest(prompt, call.output_tokens, st.slot,
                              abort_after_first_token=call.disconnect, cache_salt=st.salt,
                              session=st.tid, hold=ctx.hold_calls, hold_s=st.longest_pause_s,
                              priority=(call_priority(st.rank, is_resume and not evicted)
                                        if self.ordered else None)),
            chunks)
        ctx.rec.emit(CallEnd(trajectory_id=st.tid, traffic="agent", step=call.step,
                             slot=st.slot, status=res.status, output_tokens=len(res.tokens),
                             cached_tokens=res.cached_tokens, prompt_n=res.prompt_n,
                             server_ms=res.prompt_ms, decode_ms=res.decode_ms, detail=res.error,
                             served_by=res.served_by, token_gaps=chunks.gaps(),
                             engine_queue_s=None if res.queue_ms is None else res.queue_ms / 1e3))
        learn_prefill(ctx, res.prompt_n, res.prompt_ms)
        st.pinned = ctx.hold_calls  # the call's end holds its context until the pause decides
        if evicted and chunks.first_ns is not None and res.prompt_ms is not None:
            # time to first token less the server's own prompt time: the wait before it
            ctx.queue_delays.add(max((chunks.first_ns - sent_ns) / NS - res.prompt_ms / 1e3,
                                     0.0))
        ctx.progress.calls_done += 1
        ctx.progress.call_errors += res.status in ("error", "timeout")
        if res.status == "aborted":
            return "cancelled", "client-disconnect"
        if res.status == "timeout":
            return "failed", f"{res.error}"[:300]
        if res.status != "ok":
            return "failed", f"server error: {res.error}"
        st.context = prompt + res.tokens
        ctx.rec.emit(KvState(trajectory_id=st.tid, traffic="agent",
                             kv_tokens=len(st.context), status="active"))
        return "completed", None
