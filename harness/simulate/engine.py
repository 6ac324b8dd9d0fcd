"""The discrete-event simulation: one server, one trace, one pause policy (plain heapq).

The server's iterations and the event loop are .scheduler; this module is the trajectories' side
(arrivals, admission, calls, pauses, policies, swaps, records), with the bookkeeping it shares in
.engine_state. Memory: a call reserves its whole context when admitted, except on vLLM, whose calls
grow and are preempted (.growth); a kept KV keeps what it holds (a slot, in slot mode); with a
prefix cache (vLLM, SGLang) the rest is cached, evictable (EngineState.grab); a held KV serves only
what the next call keeps. Admission is FCFS, but in a token pool a resumed trajectory holding KV
grows first (not on vLLM), and in a closed loop on slots an agent may take the slot it freed. The
client (.client) times calls out and sends vLLM's pause controls; only without a timeout, when the
server is idle and the first resuming one cannot grow, the latest one behind it is preempted. Swaps
use one FIFO link per direction beside the compute, but on llama.cpp's slots the server's loop
saves and restores itself (.scheduler). Policies decide through harness.policies
with the replay's context (only an oracle sees the true latency; fixed policies are asked once).
Sub-agents start at their parent's spawning step, which ends `latency_s` after the last ended (a
deadline cancels what still runs). A fleet (.fleet) runs K servers through the same transitions:
its router picks each call's server. Typed classes, compiled by mypyc (.native); they run unchanged
as Python.
"""

from __future__ import annotations

import heapq
from typing import Final

from harness.simulate.client import PAUSE_CONTROL, RELEASE, SENT
from harness.simulate.engine_state import (
    A_EVICTABLE,
    A_KEEP,
    A_SWAP,
    ARRIVE,
    DEADLINE,
    INF,
    NAN,
    SWAP_IN_DONE,
    SWAP_OUT_DONE,
    T_DROP,
    T_FINISH,
    T_RESTORE,
    T_SWAP_OUT,
    TOOL_END,
    TTL,
    EngineState,
    action_code,
)
from harness.simulate.records import (
    E_CALL_END,
    E_CANCEL,
    E_KV_STATE,
    E_SWAP_IN,
    E_SWAP_OUT,
    E_TOOL_END,
    E_TRAJ_END,
    E_TRAJ_START,
    KV_STATUSES,
)
from harness.simulate.server import DROP, Counters
from harness.simulate.trajectory import (
    DONE,
    DROPPED,
    DROPPING,
    F_DUE,
    F_EN_T,
    F_FT_T,
    F_PA_CODE,
    F_PA_REASON,
    F_PA_T,
    F_PA_WAIT,
    F_RC,
    F_SLOT,
    F_ST_T,
    F_SW_SLOT,
    F_SW_T,
    F_SW_WAIT,
    F_TE_SLOT,
    F_TE_T,
    KEPT,
    PREEMPTED,
    RESTORING,
    RUNNING,
    SWAPPED,
    SWAPPING,
    WAIT_DROP,
    WAIT_SWAPOUT,
    Trajectory,
)
from harness.simulate.valve import H_ACCEPTED

KV_EVICTABLE: Final = KV_STATUSES.index("evictable")  # a kv_state left to the cache
__all__ = ["A_KEEP", "A_SWAP", "SLOT_HANDOFFS", "Engine", "action_code"]
SLOT_HANDOFFS = ("agent", "fifo")


class Engine(EngineState):
    """The trajectories' transitions over EngineState's state and bookkeeping; `run` runs."""

    def run(self, times: list[float]) -> Counters:
        """Root k arrives at `times[k]`; run the loop to its end, return the counters."""
        for k, t in enumerate(times):
            self.seq += 1
            heapq.heappush(self.ext, (t, self.seq, ARRIVE, self.trajs[self.roots[k]], 0))
        if not self.open_loop:
            self.next_ti = len(times)
        pins = self.pins
        for ti in range(self.agents_end, len(self.trajs)):  # a replay's bystanders, when sent
            assert pins is not None  # (a workload has bystanders only pinned to a replay)
            self.seq += 1
            at = max(0.0, pins.start[ti])
            heapq.heappush(self.ext, (at, self.seq, ARRIVE, self.trajs[ti], 0))
        fleet = self.fleet
        events, t_last = self.sched.run(self.ext) if fleet is None else fleet.run(self.ext)
        c = self.c
        c.pauses, c.preemptions, c.events, c.sim_time_s = (self.pauses, self.preemptions,
                                                           events, t_last)
        c.preempted_calls, c.control_requests = (
            self.growth.preempted if self.growth is not None else 0, self.client.sent)
        c.pins_released = self.valve.released
        c.stalled = sum(1 for tr in self.trajs if tr.state != DONE)  # e.g. on parents' pins
        if self.pins is not None:
            c.late, c.late_s, c.late_max_s = self.pins.late, self.pins.late_s, self.pins.late_max_s
        for cache in ([self.cache] if fleet is None else fleet.caches()):
            if cache is not None:
                c.evicted_tokens += cache.evicted
                c.swaps_refused += cache.refused
        return c

    def arrive(self, tr: Trajectory, t: float) -> None:
        if self.pins is not None and (at := self.pins.start_at(tr.ti, t)) > t:
            self.push(at, ARRIVE, tr, 0)  # pinned: it starts when the replay's did
            return
        # a sub-agent's start names its parent's step that started it
        self.emit(t, E_TRAJ_START, tr.ti, self.spawn_at[tr.ti], -1, t, 0, 0)
        tr.arrived = t
        pi = self.parent[tr.ti]
        if pi >= 0:
            tr.rank = self.trajs[pi].rank
        else:
            tr.rank = self.next_rank
            self.next_rank += 1
        tr.due = t
        tr.state = DROPPED
        self.request_call(tr, t)

    def request_call(self, tr: Trajectory, t: float) -> None:
        """`tr`'s client sends its next call at `t` (harness.simulate.client)."""
        client = self.client
        if client.from_send:
            client.watch(tr, t)
        at = client.reach(client.overheads[tr.pos] if client.overheads else client.overhead, t)
        if at > t:
            self.push(at, SENT, tr, tr.gen)
        else:
            self.send(tr, t)

    def send(self, tr: Trajectory, t: float) -> None:
        self.t_real = t
        if self.fleet is None:
            self.request_here(tr, t)
        else:  # the router picks the server, then calls request_here on it
            self.fleet.route(tr, t)

    def request_here(self, tr: Trajectory, t: float) -> None:
        """`tr`'s next call asks this server (the only one, or the fleet's active one)."""
        g = tr.pos
        need = self.ctx[g]
        if need > self.limit:
            self.emit(t, E_CALL_END, tr.ti, g - tr.first, tr.slot, NAN, 0, 0)
            self.finish(tr, t, 2, self.r_overflow)
            return
        tr.ready = t
        if tr.slot >= 0:  # slot mode, KV kept: the slot is still ours
            self.start_call(tr, t)
            return
        queue = self.queue
        if not queue and not self.resume_q and tr.state != SWAPPED:  # nobody waits
            if self.slot_mode:
                if self.free_slots:
                    tr.slot = self.free_slots.pop()
                    self.barge = False
                    self.start_call(tr, t)
                    return
            elif self.grab(tr, self.adm[g], t):
                self.start_call(tr, t)
                return
        if self.barge and queue:  # the agent's next trajectory takes the slot it just freed
            self.barge = False
            queue.append(queue.popleft())  # the waiter woken for it queues again, at the back
            queue.appendleft(tr)
        else:
            self.barge = False
            # a call onto a held context waits apart and is admitted first, but on vLLM, whose
            # one waiting queue is first come first served
            q = self.resume_q if tr.held and self.growth is None else queue
            if self.ordered:  # behind the calls of its own and earlier tasks
                i = len(q)
                while i and q[i - 1].rank > tr.rank:
                    i -= 1
                q.insert(i, tr)
            else:
                q.append(tr)
        self.try_admit(t)

    def try_admit(self, t: float) -> None:
        # Trajectories that still hold KV (token pool) grow first, as a running batch would;
        # new, swapped and dropped ones are admitted after them, first come first served.
        resume_q, queue = self.resume_q, self.queue
        while resume_q or queue:
            q = resume_q if resume_q else queue
            tr = q[0]
            if self.slot_mode:
                if not self.free_slots:
                    return
                tr.slot = self.free_slots.pop()
            elif not (self.grab(tr, self.adm[tr.pos], t) if tr.state != PREEMPTED
                      else self.growth is not None and self.growth.readmit(tr, t)):
                # pins in the way are released first (.valve), a waiting context preempted last
                if self.valve.relieve(tr, t) or self.preempt(t):
                    continue
                return
            q.popleft()
            if tr.state != RUNNING:  # else a preempted call (vLLM), readmitted
                self.admit(tr, t)

    def admit(self, tr: Trajectory, t: float) -> None:
        if t > tr.ready:  # slot_wait
            row = self.stamp(tr.pos, F_SW_T, t)
            self.rb[row + F_SW_WAIT] = t - tr.ready
            self.rb[row + F_SW_SLOT] = tr.slot
        if tr.state == SWAPPED and self.kept[tr.pos]:
            # only what the call keeps comes back (a keep_tokens cut discards the rest)
            tr.ret = self.kept[tr.pos]
            tr.state = RESTORING
            self.sched.defer(T_RESTORE, tr, 0, 0, t)
        else:
            self.start_call(tr, t)

    def start_call(self, tr: Trajectory, t: float) -> None:
        g = tr.pos
        client = self.client
        if client.from_start:  # on slots the timeout runs from here
            client.watch(tr, t)
        if not self.fixed and g > tr.first and tr.state != KEPT:
            # a resumed call whose context was not held: a deciding policy sees its wait
            self.queue_delays.add(t - tr.ready)
        if tr.pin_at >= 0:  # its pin ends: the call resumes onto it
            cache = self.cache
            assert cache is not None
            cache.unpin(tr)
        if tr.hint >= 0:  # the hint its pause sent was carried out
            self.valve.settle(tr, t, H_ACCEPTED, self.valve.r_resumed)
        r = tr.need_rc  # below 0: the first call's tokens found in its group's prefix
        work = self.inp[g] + r
        # (recompute if any), kv_state, call_start
        row = self.stamp(g, F_ST_T, t, 3 if r > 0 else 2)
        rb = self.rb
        if r:
            rb[row + F_RC] = r
            tr.need_rc = 0
        rb[row + F_SLOT] = tr.slot
        rb[row + F_DUE] = tr.due
        tr.state = RUNNING
        tr.prefilling = False
        if self.growth is not None:
            self.growth.admit(tr)
        m = work if work > 0 else 1
        tr.rem = m
        tr.ppos = self.ctx[g] - self.out[g] - m
        self.sched.pre.append(tr)
        self.sched.wake(t)

    def first_token(self, tr: Trajectory, t: float) -> None:
        """The scheduler's call: the prompt of `tr`'s call is done at `t`."""
        g = tr.pos
        tr.awaiting = False
        self.stamp(g, F_FT_T, t)
        if self.out[g] <= 1:
            self.call_end(tr, t)

    def run_task(self, kind: int, tr: Trajectory, a: int, b: int, t: float) -> None:
        """The scheduler's call: serve a control task (between iterations)."""
        if kind == T_FINISH:
            self.end_trajectory(tr, t, a, b)
            return
        if tr.state == DONE and kind != T_DROP:
            return  # the trajectory ended while the task waited
        if tr.hint >= 0 and kind != T_RESTORE and t - tr.asked > tr.late:
            tr.late = t - tr.asked  # its pause's offload or drop, applied now
        if kind == T_DROP:
            if tr.slot >= 0 or tr.held:
                self.release(tr, t, a, b)
            if tr.state == WAIT_DROP:
                tr.state = DROPPED
                self.request_call(tr, t)
            elif tr.state == DROPPING:
                tr.state = DROPPED
            self.try_admit(t)
        else:  # a slot save or restore: over its link, FIFO
            self.transfer(kind == T_SWAP_OUT, tr, t)

    def call_end(self, tr: Trajectory, t: float) -> None:
        """The scheduler's call: `tr`'s call produced its last token at `t`."""
        g = tr.pos
        self.stamp(g, F_EN_T, t)
        g += 1
        tr.pos = g
        if g == tr.end:
            self.finish(tr, t, 0, 0)
        else:
            self.pause(tr, t, g)

    def pause(self, tr: Trajectory, t: float, g: int) -> None:
        self.pauses += 1
        tr.ret = self.ctx[g]
        lt, dlt = self.lat[g], self.dl[g]
        returns = lt == lt and lt <= dlt
        kids = self.kids.get(g) if self.kids else None  # the sub-agents this step starts
        if self.fixed:  # a policy whose decision never changes
            action, code, ri, wait = self.f_action, self.f_code, self.f_reason, self.f_wait
            has_ttl, after, ttl = False, 0, 0.0
        else:
            action, code, ri, wait, has_ttl, after, ttl = self.ask_policy(
                tr, g, kids is not None)
        # pause_decision, tool_start (and kv_state paused unless the KV is dropped)
        row = self.stamp(g, F_PA_T, t, 2 if code == DROP else 3)
        rb = self.rb
        rb[row + F_PA_CODE] = code
        rb[row + F_PA_REASON] = ri
        rb[row + F_PA_WAIT] = wait
        if code & 7 != A_EVICTABLE:  # it sends the server a hint: its outcome is open
            tr.hint = g
            tr.late = 0.0
        if kids is None:
            te = t + (lt if returns else dlt)
            if returns and self.pins is not None:  # pinned: when the replay's did (or now)
                te = self.pins.tool_end_at(g, t, te)
            if te < INF:  # else it never ends (nothing to bound the wait)
                self.push(te, TOOL_END if returns else DEADLINE, tr, g)
        else:  # the tool ends once the children have (kids_done), unless the deadline is first
            te = t + dlt
            if te < INF:
                self.push(te, DEADLINE, tr, g)
            tr.kids_left = len(kids)
        if action == A_KEEP or has_ttl:
            tr.state = KEPT
            if self.cache is not None and tr.held:  # pinned, out of eviction (.valve)
                self.cache.pin(tr, t)
            if has_ttl and t + ttl < te:
                tr.after = after
                self.push(t + ttl, TTL, tr, g)
        elif action == A_SWAP:
            self.swap_out(tr, t, self.r_policy)
        elif action == A_EVICTABLE:
            self.leave_cached(tr)
        else:
            self.drop(tr, t, self.r_policy)
        tr.ctl = 1 if self.client.control(PAUSE_CONTROL, tr, t) else 0  # where one
        if kids is not None:  # all at once, as the pause starts (and after its own action)
            trajs = self.trajs
            for ki in kids:
                self.arrive(trajs[ki], t)

    def finish(self, tr: Trajectory, t: float, status: int, reason: int) -> None:
        tr.gen += 1  # whatever is still scheduled for this trajectory is void
        tr.state = DONE
        if tr.hint >= 0:  # a pause's hint, open to the end
            self.valve.settle(tr, t, H_ACCEPTED, self.valve.r_end)
        if tr.slot >= 0 or tr.held:
            self.sched.defer(T_FINISH, tr, status, reason, t)  # erased between iterations
        else:
            self.end_trajectory(tr, t, status, reason)

    def end_trajectory(self, tr: Trajectory, t: float, status: int, reason: int) -> None:
        pi = self.parent[tr.ti]
        if tr.host:  # its copy in the host tier is dropped
            self.forget_host_copy(tr)
        if tr.slot >= 0 or tr.held:
            self.release(tr, t, self.r_end, -1)
            self.barge = self.agent_handoff and pi < 0  # a sub-agent's end starts no root
        else:
            self.emit(t, E_KV_STATE, tr.ti, -1, -1, 0, 2, 0)
        self.emit(t, E_TRAJ_END, tr.ti, -1, -1, status, reason, 0)
        if tr.ti >= self.agents_end:  # a bystander's request: nothing to release, no successor
            self.barge = False
            self.try_admit(t)
            return
        self.count_end(tr, status)
        if not self.client.control(RELEASE, tr, t):  # else once the release is answered
            self.successor(tr, t)
        self.barge = False
        self.try_admit(t)

    def successor(self, tr: Trajectory, t: float) -> None:
        """`tr` has ended: its parent goes on after its last sub-agent, or its agent starts
        the next trajectory (closed loop)."""
        pi = self.parent[tr.ti]
        if pi >= 0:  # a sub-agent: its parent waits for it (it is not one of the agents)
            p = self.trajs[pi]
            p.kids_left -= 1
            if p.kids_left == 0 and p.state != DONE:
                self.kids_done(p, t)
        elif not self.open_loop and self.next_ti < self.n_roots:
            self.next_ti += 1
            self.arrive(self.trajs[self.roots[self.next_ti - 1]], t)

    def tool_done(self, tr: Trajectory, t: float) -> None:
        """`tr`'s tool returned: its next call or its end, once its pause's control is answered."""
        if tr.ctl:  # unanswered: it waits, Client.answered calls again
            tr.ctl = 2
        elif tr.pos == tr.end:
            self.finish(tr, t, 0, 0)
        elif tr.state == SWAPPING:
            tr.state = WAIT_SWAPOUT
        elif tr.state == DROPPING:
            tr.state = WAIT_DROP
        else:
            self.request_call(tr, t)

    def external(self, kind: int, tr: Trajectory, key: int, t: float) -> None:
        """The scheduler's call: an external event (kinds above); `key` as EngineState.push
        was given it."""
        if kind >= SENT:  # the client's: a call or control reaching the engine, timeouts
            self.client.event(kind, tr, key, t)
            return
        if kind >= SWAP_OUT_DONE:
            self.inflight -= 1
            if key != tr.gen:
                return  # scheduled for a trajectory that has ended since
        elif kind != ARRIVE and (key != tr.pos or tr.state == DONE):
            return  # scheduled for a pause that is over (or a trajectory that has ended)
        self.t_real = t
        g = tr.pos
        if kind == TOOL_END:
            row = self.stamp(g, F_TE_T, t)
            self.rb[row + F_TE_SLOT] = tr.slot
            if not self.fixed:  # a parent's wait: its sub-agents' time and the residual
                self.hist[self.cls[g]].add(self.lat[g] if not self.kids or g not in self.kids
                                           else t - self.rb[row + F_PA_T])
            tr.pos, tr.due = g + 1, t
            self.tool_done(tr, t)
        elif kind == SWAP_OUT_DONE:
            waiting = tr.state == WAIT_SWAPOUT
            step = g - tr.first - (1 if waiting else 0)
            reason = tr.swap_reason
            self.emit(t, E_SWAP_OUT, tr.ti, step, tr.slot, tr.ret, tr.xfer_ms, reason)
            self.release(tr, t, reason, step, False)  # the device copy is discarded
            tr.state = SWAPPED
            if waiting:
                self.request_call(tr, t)
            else:
                self.try_admit(t)
        elif kind == SWAP_IN_DONE:
            self.emit(t, E_SWAP_IN, tr.ti, g - tr.first, tr.slot, tr.ret, tr.xfer_ms, 0)
            self.restored(tr)
            self.start_call(tr, t)
        elif kind == TTL:
            if tr.state == KEPT:
                if tr.after == A_SWAP:
                    self.swap_out(tr, t, self.r_ttl)
                elif tr.after == A_EVICTABLE:
                    held = tr.held
                    self.leave_cached(tr)
                    self.emit(t, E_KV_STATE, tr.ti, -1, -1, held, KV_EVICTABLE, 0)
                    self.try_admit(t)  # what it held is evictable now
                else:
                    self.drop(tr, t, self.r_ttl)
        elif kind == DEADLINE:
            kids = self.kids.get(g) if self.kids else None
            if kids is not None and not tr.kids_left:
                return  # the children ended in time: the residual is not bounded
            lt = self.lat[g]
            status = 3 if lt != lt and kids is None else 2
            self.emit(t, E_TOOL_END, tr.ti, g - tr.first, tr.slot, status, 0, 0)
            why = self.sink.text(
                f"tool {'abandoned' if status == 3 else 'timeout'}: deadline {self.dl[g]:g}s")
            self.emit(t, E_CANCEL, tr.ti, -1, -1, why, 0, 0)
            doomed: list[Trajectory] = []
            if kids is not None:  # the sub-agents still running are cancelled with it
                self.take_out(kids, t, doomed)
                self.use(tr)
            self.finish(tr, t, 1, why)
            if doomed:
                why = self.sink.text("parent-cancelled")
                for c in doomed:
                    self.emit(t, E_CANCEL, c.ti, -1, -1, why, 0, 0)
                    self.use(c)
                    self.finish(c, t, 1, why)
        else:
            self.arrive(tr, t)
