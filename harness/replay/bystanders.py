"""Bystander traffic: plain one-call requests arriving on the plan's schedule beside the agents,
each taking a slot like any request and giving it back when it ends. They run only while agents
do: the run's measure is the agents', the bystanders are load.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from harness.adapters.base import CompletionRequest
from harness.plan.planner import BystanderPlan
from harness.plan.tokens import token_ids
from harness.records.kinds import CallEnd, CallStart
from harness.replay.clock import NS
from harness.replay.context import ReplayContext, TrajectoryState
from harness.replay.kv_actions import acquire, free_slot
from harness.replay.recorder import ChunkTimes


class Bystanders:
    """Sends the planned bystander requests until the agents are done (`agents_done`); the
    requests in flight are in `in_flight`, for the run to wait on or stop."""

    def __init__(self, ctx: ReplayContext, planned: Sequence[BystanderPlan]) -> None:
        self.ctx = ctx
        self.planned = planned
        self.agents_done = asyncio.Event()
        self.in_flight: set[asyncio.Task[None]] = set()

    async def run(self) -> None:
        """Start each planned request at its arrival time, until the agents are done."""
        ctx = self.ctx
        for b in self.planned:
            await ctx.clock.sleep_until(int(b.arrival_s * NS))
            if self.agents_done.is_set():
                return
            task = asyncio.create_task(self._request(
                b.request_id, b.prompt_tokens, b.output_tokens, b.seed, int(b.arrival_s * NS)))
            self.in_flight.add(task)
            task.add_done_callback(self.in_flight.discard)
        if self.planned and not self.agents_done.is_set():
            # The planned arrivals ran out while agents still ran: said, never silent.
            ctx.counters.bystanders_ended_s = ctx.clock.now_ns() / NS

    async def _request(self, rid: str, n_prompt: int, n_out: int, seed: int, due: int) -> None:
        """One bystander request: a slot, one call, the slot back (however the call ends)."""
        ctx = self.ctx
        st = TrajectoryState(rid)
        prompt = token_ids(seed, n_prompt, ctx.vocab)
        try:
            await acquire(ctx, st, 0, "bystander")
            ctx.rec.emit(CallStart(trajectory_id=rid, traffic="bystander", step=0,
                                   slot=st.slot, planned_ns=due, prompt_tokens=n_prompt,
                                   appended_tokens=n_prompt, is_resume=False))
            chunks = ChunkTimes(ctx.rec, ctx.clock, rid, "bystander", 0, st.slot)
            res = await ctx.adapter.complete(CompletionRequest(prompt, n_out, st.slot), chunks)
            ctx.rec.emit(CallEnd(
                trajectory_id=rid, traffic="bystander", step=0, slot=st.slot, status=res.status,
                output_tokens=len(res.tokens), cached_tokens=res.cached_tokens,
                prompt_n=res.prompt_n, server_ms=res.prompt_ms, decode_ms=res.decode_ms,
                detail=res.error, token_gaps=chunks.gaps(),
                engine_queue_s=None if res.queue_ms is None else res.queue_ms / 1e3))
        finally:
            try:
                await free_slot(ctx, st, "request-end", "bystander")
            except Exception as exc:
                ctx.counters.cleanup_errors.append(f"{rid}: {type(exc).__name__}: {exc}")
