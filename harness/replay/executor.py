"""The executor: drives one adapter through a plan, applying the pause policy at every tool call.

Lifecycle per trajectory: prefill -> decode -> tool_wait -> restoring -> decode -> ... ->
completed | cancelled | failed | interrupted, each transition recorded. Server-side state the
run creates (slot contents, dump files) is released when a trajectory ends, however it ends.
"""

from __future__ import annotations

import asyncio
import math
from collections import defaultdict
from dataclasses import dataclass, field

from harness.adapters.base import Adapter, CompletionRequest, Unsupported
from harness.plan.planner import CallStep, Plan, ToolStep, TrajectoryPlan
from harness.plan.tokens import token_ids
from harness.policies.base import (
    KEEP,
    RECOMPUTE,
    SWAP,
    Decision,
    PauseContext,
    PausePolicy,
    ServerRates,
)
from harness.policies.history import DEFAULT_WINDOW, History
from harness.replay.clock import NS, Clock
from harness.replay.join import join_by, settle
from harness.replay.names import cache_salt, dump_name
from harness.replay.progress import Progress
from harness.replay.recorder import ChunkTimes, Recorder, SlotPool

MIN_PREFILL_SAMPLE = 64  # prompts shorter than this time overheads, not prefill


@dataclass
class _State:
    """What one trajectory holds on the server right now."""

    tid: str
    context: list[int] = field(default_factory=list)
    slot: int | None = None
    dump: str | None = None
    salt: str | None = None


@dataclass
class RunCounters:
    completed: int = 0
    cancelled: int = 0
    failed: int = 0
    interrupted: int = 0
    unsupported: int = 0
    server_failed: int = 0  # failed because the server failed (an error, a timeout, bad data)
    bystanders_ended_s: float | None = None  # the planned bystanders ran out before the agents
    cleanup_errors: list[str] = field(default_factory=list)
    remote_dumps_left: list[str] = field(default_factory=list)


# Failure reasons that mean the server failed, not the task (its tools, its context).
SERVER_FAULTS = ("server error:", "timeout:")


class Executor:
    """Replays a plan through an adapter (clock, adapter, HTTP injected; slot_ids: a shard's)."""

    def __init__(self, adapter: Adapter, clock: Clock, recorder: Recorder, policy: PausePolicy,
                 plan: Plan, run_id: str, vocab_size: int, slots: int | None,
                 ctx_per_slot: int | None, rates: ServerRates, history_window: int = DEFAULT_WINDOW,
                 slot_ids: list[int] | None = None) -> None:
        self.adapter = adapter
        self.clock = clock
        self.rec = recorder
        self.policy = policy
        self.plan = plan
        self.run_id = run_id
        self.vocab = vocab_size
        self.ctx_per_slot = ctx_per_slot
        self.rates = rates
        caps = adapter.capabilities
        self.pool = SlotPool(slots, slot_ids) if caps.harness_slots and slots else None
        # Each pause hands the policy the live window (no copy): decide() is synchronous.
        self.history_window = history_window
        self.history: dict[str, History] = defaultdict(lambda: History(history_window))
        self.counters = RunCounters()
        self.progress = Progress(sum(isinstance(s, CallStep) for t in plan.all_trajectories()
                                     for s in t.steps))
        self._agents_done = asyncio.Event()
        self._bystander_tasks: set[asyncio.Task[None]] = set()
        self._stopped: dict[str, str] = {}  # sub-agents being cancelled by their parent: why
        self._horizon_hit = False  # a bounded run reached its horizon (plan.horizon_s)

    # ---- the run -------------------------------------------------------------------------
    async def run(self) -> RunCounters:
        """Run every trajectory (and bystanders) to its end; returns the outcome counters.
        Cancelled (an interrupted run), every trajectory's own cleanup finishes, and records
        its end, before this returns; a second cancel cuts those cleanups short."""
        bystanders = asyncio.create_task(self._bystanders())
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
            self._agents_done.set()
            bystanders.cancel()
            # A cancelled gather returns at once; the trajectories' cleanups may still run.
            await settle([*tasks, bystanders], cancel=interrupted)
            # Requests already sent finish (and free their slots) before the run ends; an
            # interrupted run stops them.
            await settle(list(self._bystander_tasks), cancel=interrupted)
            self.rec.flush()
        return self.counters

    async def _horizon(self, tasks: list[asyncio.Task[None]], horizon_s: float) -> None:
        """At a bounded run's end: stop every trajectory still running (interrupted, reason
        run-horizon) and every arrival still to come."""
        await self.clock.sleep_until(int(horizon_s * NS))
        self._horizon_hit = True
        for t in tasks:
            t.cancel()

    async def _agent(self, queue: asyncio.Queue[TrajectoryPlan]) -> None:
        while not queue.empty() and not self._horizon_hit:
            traj = queue.get_nowait()
            await self.trajectory(traj, self.clock.now_ns())

    async def _open_loop(self, traj: TrajectoryPlan) -> None:
        due = int(traj.arrival_s * NS)
        await self.clock.sleep_until(due)
        await self.trajectory(traj, due)

    # ---- one trajectory ------------------------------------------------------------------
    async def trajectory(self, traj: TrajectoryPlan, planned_ns: int,
                         spawn_step: int | None = None) -> str:
        """Run one trajectory; it ends completed | cancelled | failed | interrupted. A
        sub-agent's record names its parent and the parent's step that spawned it."""
        st = _State(traj.trajectory_id)
        self.progress.agents_active += 1
        self.rec.emit("trajectory_start", trajectory_id=st.tid, traffic="agent",
                      planned_ns=planned_ns, detail=traj.priority, parent_id=traj.parent_id,
                      step=spawn_step)
        status, reason = "completed", None
        server_fault = False
        due = planned_ns
        try:
            for i, step in enumerate(traj.steps):
                if isinstance(step, CallStep):
                    status, reason = await self._call(st, step, due, is_resume=i > 0)
                else:
                    status, reason, due = await self._tool(st, traj, step)
                if status != "completed":
                    server_fault = reason is not None and reason.startswith(SERVER_FAULTS)
                    break
        except asyncio.CancelledError:
            # A sub-agent its parent stopped waiting for was cancelled, not the run.
            stopped = self._stopped.pop(st.tid, None)
            status, reason = (("cancelled", stopped) if stopped else (
                "interrupted", "run-horizon" if self._horizon_hit else "run-interrupted"))
            raise
        except Exception as exc:  # a server that breaks the protocol fails this trajectory only
            status, reason = "failed", f"{type(exc).__name__}: {exc}"[:300]
            server_fault = True
        finally:
            if status == "cancelled":
                self.rec.emit("cancel", trajectory_id=st.tid, traffic="agent", reason=reason)
            try:
                await self._release(st, "trajectory-end")
            finally:
                # Recorded even when an interrupted run cuts its cleanup short.
                self.rec.emit("trajectory_end", trajectory_id=st.tid, traffic="agent",
                              status=status, reason=reason)
            setattr(self.counters, status, getattr(self.counters, status) + 1)
            self.counters.server_failed += status == "failed" and server_fault
            self.progress.agents_active -= 1
            self.progress.trajectories_done += 1
        return status

    async def _call(self, st: _State, call: CallStep, due_ns: int,
                    is_resume: bool) -> tuple[str, str | None]:
        appended = call.append_ids(self.vocab)
        # A trace that says the call shares only part of its context keeps just that part.
        kept = st.context if call.keep_tokens is None else st.context[:call.keep_tokens]
        prompt = kept + appended
        if self.ctx_per_slot and len(prompt) + call.output_tokens > self.ctx_per_slot:
            self.rec.emit("call_end", trajectory_id=st.tid, traffic="agent", step=call.step,
                          status="error", detail=f"context overflow: {len(prompt)} + "
                          f"{call.output_tokens} tokens exceed {self.ctx_per_slot} per slot")
            return "failed", "context-overflow"
        await self._restore(st, call.step)
        if st.context:
            # The resumed call holds its context on the device from here (kept, restored, or
            # being re-prefilled).
            self.rec.emit("kv_state", trajectory_id=st.tid, traffic="agent",
                          kv_tokens=len(st.context), status="active")
        self.rec.emit("call_start", trajectory_id=st.tid, traffic="agent", step=call.step,
                      slot=st.slot, planned_ns=due_ns, prompt_tokens=len(prompt),
                      appended_tokens=len(appended), is_resume=is_resume)
        chunks = ChunkTimes(self.rec, self.clock, st.tid, "agent", call.step, st.slot)
        res = await self.adapter.complete(
            CompletionRequest(prompt, call.output_tokens, st.slot,
                              abort_after_first_token=call.disconnect, cache_salt=st.salt,
                              session=st.tid),
            chunks)
        self.rec.emit("call_end", trajectory_id=st.tid, traffic="agent", step=call.step,
                      slot=st.slot, status=res.status, output_tokens=len(res.tokens),
                      cached_tokens=res.cached_tokens, prompt_n=res.prompt_n,
                      server_ms=res.prompt_ms, decode_ms=res.decode_ms, detail=res.error,
                      reason=res.served_by, token_gaps=chunks.gaps())
        self._learn_prefill(res.prompt_n, res.prompt_ms)
        self.progress.calls_done += 1
        self.progress.call_errors += res.status in ("error", "timeout")
        if res.status == "aborted":
            return "cancelled", "client-disconnect"
        if res.status == "timeout":
            return "failed", f"{res.error}"[:300]
        if res.status != "ok":
            return "failed", f"server error: {res.error}"
        st.context = prompt + res.tokens
        self.rec.emit("kv_state", trajectory_id=st.tid, traffic="agent",
                      kv_tokens=len(st.context), status="active")
        return "completed", None

    async def _tool(self, st: _State, traj: TrajectoryPlan,
                    tool: ToolStep) -> tuple[str, str | None, int]:
        ctx = PauseContext(
            run_id=self.run_id, trajectory_id=st.tid, tool_class=tool.tool_class,
            deadline_ms=tool.deadline_s * 1000.0 if math.isfinite(tool.deadline_s) else None,
            retained_tokens=len(st.context),
            resume_required=tool.resume_required, priority=traj.priority,
            history_s=self.history[tool.tool_class],
            free_slots=self.pool.free if self.pool else 0,
            total_slots=self.pool.total if self.pool else 1, rates=self.rates,
            # a parent's wait is its sub-agents', known only once they end
            true_latency_s=(tool.latency_s if self.policy.sees_true_latency
                            and not tool.children else None))
        d = self.policy.decide(ctx)
        supported = d.action in self.adapter.capabilities.pause_actions and (
            d.after is None or d.after in self.adapter.capabilities.pause_actions)
        self.rec.emit("pause_decision", trajectory_id=st.tid, traffic="agent", step=tool.step,
                      tool_class=tool.tool_class, action=d.label, reason=d.reason,
                      retained_tokens=len(st.context), value_s=d.predicted_wait_s, slot=st.slot,
                      status="ok" if supported else "unsupported",
                      detail=f"ttl_s={d.ttl_s} after={d.after}" if d.ttl_s is not None else None)
        t0 = self.rec.emit("tool_start", trajectory_id=st.tid, traffic="agent", step=tool.step,
                           tool_class=tool.tool_class, tool_name=tool.tool_name,
                           value_s=tool.latency_s,
                           deadline_s=tool.deadline_s if math.isfinite(tool.deadline_s)
                           else None)
        # Sub-agents start with the tool, while their parent's KV is being dealt with.
        children = [asyncio.create_task(self.trajectory(c, t0, tool.step))
                    for c in tool.children]
        try:
            if not supported:
                # Nothing was done, so the context stays where it was: held while paused.
                self.counters.unsupported += 1
            if supported and d.action != KEEP:
                await self._evict(st, d.action, tool.step, "policy")
            else:
                self.rec.emit("kv_state", trajectory_id=st.tid, traffic="agent",
                              kv_tokens=len(st.context), status="paused")
        except BaseException:
            await settle(children, cancel=True)
            raise
        if children:
            return await self._subagents(st, tool, d, supported, t0, children)
        returns = tool.latency_s is not None and tool.latency_s <= tool.deadline_s
        end_ns = t0 + int((tool.latency_s if returns and tool.latency_s is not None
                           else tool.deadline_s) * NS)
        if supported and d.ttl_s is not None and d.after and t0 + d.ttl_s * NS < end_ns:
            await self.clock.sleep_until(t0 + int(d.ttl_s * NS))
            if st.slot is not None or self.pool is None:
                await self._evict(st, d.after, tool.step, "ttl-expired")
        # Still busy with this pause's eviction when the tool returned: the harness was waiting
        # on the server, not late, and what follows is the policy's cost (resume latency runs
        # from the tool's end).
        overran = self.clock.now_ns() >= end_ns
        await self.clock.sleep_until(end_ns)
        if overran:
            wake = end_ns
        else:
            # Stamped when the harness woke, not when it meant to: resume latency runs from the
            # moment the harness could act, and the lag (t_ns - planned_ns) is the client's own.
            wake = self.clock.now_ns()
            self.progress.lags_ms.append((wake - end_ns) / 1e6)
        if not returns:
            status = "abandoned" if tool.latency_s is None else "timeout"
            self.rec.emit("tool_end", wake, trajectory_id=st.tid, traffic="agent",
                          step=tool.step, tool_class=tool.tool_class, status=status,
                          planned_ns=end_ns)
            return "cancelled", f"tool {status}: deadline {tool.deadline_s:g}s", end_ns
        assert tool.latency_s is not None
        self.history[tool.tool_class].add(tool.latency_s)
        self.rec.emit("tool_end", wake, trajectory_id=st.tid, traffic="agent", step=tool.step,
                      tool_class=tool.tool_class, status=tool.outcome, planned_ns=end_ns)
        return "completed", None, end_ns

    async def _subagents(self, st: _State, tool: ToolStep, d: Decision, supported: bool,
                         t0: int, children: list[asyncio.Task[str]]
                         ) -> tuple[str, str | None, int]:
        """A parent's pause while its sub-agents run: all start at once, each a trajectory of
        its own; the tool ends `latency_s` after the last has ended (unless the step's deadline
        comes first, which cancels those still running). A TTL decision expires as for any
        tool."""
        deadline_ns = (t0 + int(tool.deadline_s * NS) if math.isfinite(tool.deadline_s)
                       else None)
        ttl_ns = (t0 + int(d.ttl_s * NS) if supported and d.ttl_s is not None and d.after
                  else None)
        expired: list[bool] = []

        async def expire() -> None:  # once, whether during the children or after them
            if not expired and d.after and (st.slot is not None or self.pool is None):
                expired.append(True)
                await self._evict(st, d.after, tool.step, "ttl-expired")

        try:
            joined_all = await join_by(self.clock, children, deadline_ns, ttl_ns, expire)
        except BaseException:
            await settle(children, cancel=True)
            raise
        if not joined_all:
            assert deadline_ns is not None
            for c in tool.children:
                self._stopped[c.trajectory_id] = (
                    f"parent-timeout: {st.tid} stopped waiting after {tool.deadline_s:g}s")
            await settle(children, cancel=True)
            for c in tool.children:
                self._stopped.pop(c.trajectory_id, None)
            self.rec.emit("tool_end", trajectory_id=st.tid, traffic="agent", step=tool.step,
                          tool_class=tool.tool_class, status="timeout", planned_ns=deadline_ns)
            return "cancelled", f"tool timeout: deadline {tool.deadline_s:g}s", deadline_ns
        joined = self.clock.now_ns()
        wait_s = (joined - t0) / NS
        end_ns = joined + int((tool.latency_s or 0.0) * NS)
        if ttl_ns is not None and ttl_ns < end_ns:
            await self.clock.sleep_until(ttl_ns)
            await expire()
        await self.clock.sleep_until(end_ns)
        wake = self.clock.now_ns()
        if end_ns > joined:  # a planned wake-up: its lateness is the client's own
            self.progress.lags_ms.append((wake - end_ns) / 1e6)
        self.history[tool.tool_class].add(wait_s + (tool.latency_s or 0.0))
        self.rec.emit("tool_end", wake, trajectory_id=st.tid, traffic="agent", step=tool.step,
                      tool_class=tool.tool_class, status=tool.outcome, planned_ns=end_ns)
        return "completed", None, end_ns

    # ---- KV actions ----------------------------------------------------------------------
    async def _acquire(self, st: _State, step: int, traffic: str = "agent") -> None:
        if self.pool is None or st.slot is not None:
            return
        t0 = self.clock.now_ns()
        contended = self.pool.free == 0
        st.slot = await self.pool.acquire()
        if contended:
            self.rec.emit("slot_wait", trajectory_id=st.tid, traffic=traffic, step=step,
                          slot=st.slot, value_s=(self.clock.now_ns() - t0) / NS)

    async def _restore(self, st: _State, step: int) -> None:
        had_slot = st.slot is not None
        await self._acquire(st, step)
        if st.dump is not None and st.slot is not None:
            io = await self.adapter.restore_slot(st.slot, st.dump)
            self.rec.emit("swap_in", trajectory_id=st.tid, traffic="agent", step=step,
                          slot=st.slot, bytes=io.bytes, server_ms=io.ms,
                          retained_tokens=io.tokens)
            if io.ms > 0 and io.bytes > 0:
                self.rates = ServerRates(self.rates.prefill_tok_s,
                                         0.7 * self.rates.swap_bytes_per_s
                                         + 0.3 * io.bytes / (io.ms / 1000.0),
                                         self.rates.kv_bytes_per_token)
            await self._delete_dump(st)
        elif not had_slot and st.context and self.pool is not None:
            self.rec.emit("recompute", trajectory_id=st.tid, traffic="agent", step=step,
                          recomputed_tokens=len(st.context))

    async def _evict(self, st: _State, action: str, step: int, reason: str) -> None:
        """Swap out or discard this trajectory's KV and give its slot back."""
        if self.pool is None:
            if action == RECOMPUTE:
                # Without slot control a fresh cache salt forbids reuse of the old prefix.
                st.salt = cache_salt(self.run_id, st.tid, step)
                self.rec.emit("erase", trajectory_id=st.tid, traffic="agent", step=step,
                              reason=f"{reason}: fresh cache salt")
                self.rec.emit("recompute", trajectory_id=st.tid, traffic="agent", step=step,
                              recomputed_tokens=len(st.context))
            return
        if st.slot is None:
            return
        if action == SWAP:
            name = dump_name(self.run_id, st.tid, step)
            try:
                io = await self.adapter.save_slot(st.slot, name)
            except Unsupported as exc:
                self.counters.unsupported += 1
                self.rec.emit("swap_out", trajectory_id=st.tid, traffic="agent", step=step,
                              slot=st.slot, status="unsupported", detail=str(exc)[:300])
                return
            st.dump = name
            self.rec.emit("swap_out", trajectory_id=st.tid, traffic="agent", step=step,
                          slot=st.slot, bytes=io.bytes, server_ms=io.ms,
                          retained_tokens=io.tokens, reason=reason)
        await self.adapter.erase_slot(st.slot)
        self.rec.emit("erase", trajectory_id=st.tid, traffic="agent", step=step, slot=st.slot,
                      reason=reason)
        await self.pool.release(st.slot)
        st.slot = None
        self.rec.emit("kv_state", trajectory_id=st.tid, traffic="agent", kv_tokens=0,
                      status="released")

    async def _delete_dump(self, st: _State) -> None:
        if st.dump is None:
            return
        name, st.dump = st.dump, None
        if not self.adapter.capabilities.local_dump_files:
            # On a remote server's disk, which no server API lets the client delete: named in
            # run.json (cleanup.remote_dumps_left) so its owner can.
            self.counters.remote_dumps_left.append(name)
        elif not await self.adapter.delete_dump(name):
            self.counters.cleanup_errors.append(f"dump file {name} still exists")

    async def _free_slot(self, st: _State, reason: str, traffic: str) -> None:
        """Erase the request's slot (recorded) and give it back to the pool, even when the
        erase fails."""
        if st.slot is None or self.pool is None:
            return
        slot, st.slot = st.slot, None
        try:
            await self.adapter.erase_slot(slot)
            self.rec.emit("erase", trajectory_id=st.tid, traffic=traffic, slot=slot,
                          reason=reason)
        finally:
            await self.pool.release(slot)

    async def _release(self, st: _State, reason: str) -> None:
        """Erase the slot and delete any dump file: runs on every trajectory end."""
        try:
            await self._free_slot(st, reason, "agent")
            await self._delete_dump(st)
        except Exception as exc:
            self.counters.cleanup_errors.append(f"{st.tid}: {type(exc).__name__}: {exc}")
        self.rec.emit("kv_state", trajectory_id=st.tid, traffic="agent", kv_tokens=0,
                      status="released")

    def _learn_prefill(self, prompt_n: int | None, prompt_ms: float | None) -> None:
        if prompt_n and prompt_ms and prompt_n >= MIN_PREFILL_SAMPLE and prompt_ms > 0:
            measured = prompt_n / (prompt_ms / 1000.0)
            self.rates = ServerRates(0.7 * self.rates.prefill_tok_s + 0.3 * measured,
                                     self.rates.swap_bytes_per_s, self.rates.kv_bytes_per_token)

    # ---- bystander traffic ---------------------------------------------------------------
    async def _bystanders(self) -> None:
        for b in self.plan.bystanders:
            await self.clock.sleep_until(int(b.arrival_s * NS))
            if self._agents_done.is_set():
                return
            task = asyncio.create_task(self._bystander(
                b.request_id, b.prompt_tokens, b.output_tokens, b.seed, int(b.arrival_s * NS)))
            self._bystander_tasks.add(task)
            task.add_done_callback(self._bystander_tasks.discard)
        if self.plan.bystanders and not self._agents_done.is_set():
            # The planned arrivals ran out while agents still ran: said, never silent.
            self.counters.bystanders_ended_s = self.clock.now_ns() / NS

    async def _bystander(self, rid: str, n_prompt: int, n_out: int, seed: int,
                         due: int) -> None:
        st = _State(rid)
        prompt = token_ids(seed, n_prompt, self.vocab)
        try:
            await self._acquire(st, 0, "bystander")
            self.rec.emit("call_start", trajectory_id=rid, traffic="bystander", step=0,
                          slot=st.slot, planned_ns=due, prompt_tokens=n_prompt,
                          appended_tokens=n_prompt, is_resume=False)
            chunks = ChunkTimes(self.rec, self.clock, rid, "bystander", 0, st.slot)
            res = await self.adapter.complete(CompletionRequest(prompt, n_out, st.slot), chunks)
            self.rec.emit("call_end", trajectory_id=rid, traffic="bystander", step=0,
                          slot=st.slot, status=res.status, output_tokens=len(res.tokens),
                          cached_tokens=res.cached_tokens, prompt_n=res.prompt_n,
                          server_ms=res.prompt_ms, decode_ms=res.decode_ms, detail=res.error,
                          token_gaps=chunks.gaps())
        finally:
            try:
                await self._free_slot(st, "request-end", "bystander")
            except Exception as exc:
                self.counters.cleanup_errors.append(f"{rid}: {type(exc).__name__}: {exc}")
