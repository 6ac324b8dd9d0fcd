"""The discrete-event simulation: one server, one trace, one pause policy (plain heapq).

The server's iterations and the event loop are harness.simulate.scheduler; this module is the
trajectories' side: arrivals, admission, calls, pauses, policies, swaps, records.

Memory: a call reserves its whole context (prompt + output) when admitted (no growth, so no
preemption of running calls); a paused trajectory that keeps its KV keeps its reservation (its
slot, in slot mode). Admission is first come first served, except that in a token pool a resumed
trajectory still holding KV grows before anything new is admitted, and that in a closed loop on
slots an agent may take the slot it freed (see `simulate`). When the server is idle and the first
resuming trajectory cannot grow, the latest one behind it is preempted (dropped, recomputed when
admitted): that is the only preemption. A slot freed by recompute is free when the running
iteration ends (control tasks wait for it). Swaps use one FIFO link per direction (host tier
unbounded) and do not stall compute. Policies decide through harness.policies with the context
the replay builds (free/total slots in slot mode, free/total tokens in a token pool; the class's
latency history, its last `history_window` observations); only an oracle sees the true latency;
keep, swap and recompute are asked once, as they decide the same at every pause.
"""

from __future__ import annotations

import gc
import heapq
from collections import deque

import numpy as np

from harness.policies.base import KEEP, SWAP, PauseContext, PausePolicy
from harness.policies.builtin import Keep, Recompute, Swap
from harness.simulate.records import (
    E_CALL_END,
    E_CANCEL,
    E_ERASE,
    E_KV_STATE,
    E_SLOT_WAIT,
    E_SWAP_IN,
    E_SWAP_OUT,
    E_TOOL_END,
    E_TRAJ_END,
    E_TRAJ_START,
    RecordSink,
)
from harness.simulate.scheduler import make_scheduler
from harness.simulate.server import (
    DROP,
    Capacity,
    Counters,
    History,
    ServerModel,
    context_factory,
    resolve,
)
from harness.simulate.workload import Workload

ARRIVE, TOOL_END, DEADLINE, TTL, SWAP_OUT_DONE, SWAP_IN_DONE = range(6)
RUNNING, KEPT, SWAPPING, WAIT_SWAPOUT, SWAPPED, DROPPED, RESTORING, DONE = range(8)
DROPPING, WAIT_DROP = 8, 9  # an erase waits for the iteration's end; the tool has returned
T_DROP, T_SWAP_OUT, T_RESTORE, T_FINISH = range(4)  # control tasks served between iterations
SLOT_HANDOFFS = ("agent", "fifo")
NAN = float("nan")


def simulate(w: Workload, server: ServerModel, cap: Capacity, policy: PausePolicy,
             arrival_s: np.ndarray | None, concurrency: int, sink: RecordSink, run_id: str,
             history_window: int = 1000, slot_handoff: str = "fifo") -> Counters:
    """Run every trajectory to its end; events go to `sink`. `arrival_s` None: closed loop.

    `slot_handoff` (slot mode, closed loop): "fifo", as the replay's slot pool does it: every
    freed slot goes to the longest waiter; "agent": the agent that ends a trajectory starts its
    next one on the slot it just freed, ahead of the calls waiting for a slot.
    """
    if slot_handoff not in SLOT_HANDOFFS:
        raise ValueError(f"slot_handoff must be one of {SLOT_HANDOFFS}, got {slot_handoff!r}")
    agent_handoff = slot_handoff == "agent" and cap.slot_mode and arrival_s is None
    barge = [False]
    inp, out, ctx = w.inp.tolist(), w.out.tolist(), w.ctx.tolist()
    lat, dl, cls = w.lat.tolist(), w.deadline.tolist(), w.cls.tolist()
    first, ids, prio = w.first, w.ids, w.priority
    costs = server.iteration_costs()
    # per LLM step: what one of its decode tokens adds to an iteration (context at mid-output)
    dcost = (costs.beta + costs.decode_cell * (w.ctx - w.out / 2.0)).tolist()
    n = w.n_trajectories
    end = [f + k for f, k in zip(first, w.n_steps, strict=True)]
    pos = list(first)
    state, gen, held, slot = [DONE] * n, [0] * n, [0] * n, [-1] * n
    need_rc, ret, due = [0] * n, [0] * n, [0.0] * n
    ready = [0.0] * n
    rem, ppos = [0] * n, [0] * n
    xfer_ms, swap_reason, after_swap = [0.0] * n, [0] * n, [False] * n
    hist = [History(history_window) for _ in w.classes]
    classes = w.classes
    bpt = server.kv_bytes_per_token
    bw_out, bw_in = server.swap_out_bytes_per_s, server.swap_in_bytes_per_s
    rates = server.policy_rates()
    make_ctx, decide, oracle = context_factory(), policy.decide, policy.sees_true_latency
    slot_mode, limit, total = cap.slot_mode, cap.context_limit, cap.units
    free_slots = list(range(total - 1, -1, -1)) if slot_mode else []
    rows_ext, text = sink.rows.extend, sink.text
    sc = sink.cols  # per-step columns of the frequent events (harness.simulate.steps)
    st_t, st_seq, slot_, due_, rc_, pre_t = sc.st_t, sc.st_seq, sc.slot, sc.due, sc.rc, sc.pre_t
    ft_t, ft_seq, en_t, en_seq = sc.ft_t, sc.ft_seq, sc.en_t, sc.en_seq
    pa_t, pa_seq, pa_code, pa_wait, pa_reason = (sc.pa_t, sc.pa_seq, sc.pa_code, sc.pa_wait,
                                                 sc.pa_reason)
    te_t, te_seq, te_slot = sc.te_t, sc.te_seq, sc.te_slot
    cnt = 0  # the next record's seq
    REASON = {k: text(k) for k in ("policy", "ttl-expired", "trajectory-end", "preempted",
                                   "context-overflow")}
    texts: dict[str, int] = {}
    ext: list[tuple[float, int, int, int, int]] = []
    queue: deque[int] = deque()  # waiting for admission
    resume_q: deque[int] = deque()  # token pool: waiting to grow KV they hold
    push = heapq.heappush
    c = Counters()
    seq = 0  # tie-break of the event heap
    free_tok = total  # token pool
    link_out = link_in = 0.0  # when each swap link is next free
    inflight = 0  # swaps in flight
    next_ti = 0  # closed loop: the next trajectory to start

    def emit(t: float, ev: int, ti: int, step: int, s: int, a: float, b: float,
             c: float) -> None:
        nonlocal cnt
        rows_ext((cnt, t, ev, ti, step, s, a, b, c))
        cnt += 1

    def arrive(ti: int, t: float) -> None:
        emit(t, E_TRAJ_START, ti, -1, -1, t, 0, 0)
        due[ti], state[ti] = t, DROPPED
        request_call(ti, t)

    def request_call(ti: int, t: float) -> None:
        nonlocal free_tok
        g = pos[ti]
        if ctx[g] > limit:
            emit(t, E_CALL_END, ti, g - first[ti], slot[ti], NAN, 0, 0)
            finish(ti, t, 2, REASON["context-overflow"])
            return
        ready[ti] = t
        if slot[ti] >= 0:  # slot mode, KV kept: the slot is still ours
            start_call(ti, t)
            return
        if not queue and not resume_q and state[ti] != SWAPPED:  # nobody waits: fast path
            if slot_mode:
                if free_slots:
                    slot[ti] = free_slots.pop()
                    barge[0] = False
                    start_call(ti, t)
                    return
            else:
                need = ctx[g]
                grow = need - held[ti]
                if grow <= free_tok:
                    free_tok -= grow
                    held[ti] = need
                    start_call(ti, t)
                    return
        if barge[0] and queue:  # the agent's next trajectory takes the slot it just freed
            barge[0] = False
            queue.append(queue.popleft())  # the waiter woken for it queues again, at the back
            queue.appendleft(ti)
        else:
            barge[0] = False
            (resume_q if held[ti] else queue).append(ti)
        try_admit(t)

    def try_admit(t: float) -> None:
        # Trajectories that still hold KV (token pool) grow first, as a running batch would;
        # new, swapped and dropped ones are admitted after them, first come first served.
        nonlocal free_tok
        while resume_q or queue:
            q = resume_q if resume_q else queue
            ti = q[0]
            if slot_mode:
                if not free_slots:
                    return
                slot[ti] = free_slots.pop()
            else:
                need = ctx[pos[ti]]
                grow = need - held[ti]
                if grow > free_tok:
                    if q is resume_q and preempt(t):
                        continue
                    return
                free_tok -= grow
                held[ti] = need
            q.popleft()
            admit(ti, t)

    def preempt(t: float) -> bool:
        # Idle server, nothing in transfer, and the first resuming trajectory cannot grow:
        # drop the KV of the latest one behind it (it recomputes when admitted).
        if not idle() or inflight or len(resume_q) < 2:
            return False
        head = resume_q[0]
        for ti in reversed(resume_q):
            if held[ti] and ti != head:
                c.preemptions += 1
                release(ti, t, REASON["preempted"], pos[ti] - first[ti])
                need_rc[ti], state[ti] = ret[ti], DROPPED
                return True
        return False

    def admit(ti: int, t: float) -> None:
        if t > ready[ti]:
            emit(t, E_SLOT_WAIT, ti, pos[ti] - first[ti], slot[ti], t - ready[ti], 0, 0)
        if state[ti] == SWAPPED:
            state[ti] = RESTORING
            defer(T_RESTORE, ti, 0, 0, t)
        else:
            start_call(ti, t)

    def start_call(ti: int, t: float) -> None:
        nonlocal cnt
        g = pos[ti]
        r = need_rc[ti]
        work = inp[g] + r
        st_seq[g] = cnt
        if r:  # recompute, kv_state, call_start
            rc_[g] = r
            need_rc[ti] = 0
            cnt += 3
        else:  # kv_state, call_start
            cnt += 2
        st_t[g], slot_[g], due_[g], state[ti] = t, slot[ti], due[ti], RUNNING
        rem[ti] = work if work > 0 else 1
        ppos[ti] = ctx[g] - out[g] - rem[ti]
        pre.append(ti)
        wake(t)

    def first_token(ti: int, t: float) -> None:
        nonlocal cnt
        g = pos[ti]
        ft_t[g], ft_seq[g] = t, cnt
        cnt += 1
        if out[g] <= 1:
            call_end(ti, t)

    def run_task(kind: int, ti: int, a: int, b: int, t: float) -> None:
        nonlocal link_out, link_in, inflight, seq
        if kind == T_FINISH:
            end_trajectory(ti, t, a, b)
        elif state[ti] == DONE and kind != T_DROP:
            return  # the trajectory ended while the task waited
        elif kind == T_DROP:
            if slot[ti] >= 0 or held[ti]:
                release(ti, t, a, b)
            if state[ti] == WAIT_DROP:
                state[ti] = DROPPED
                request_call(ti, t)
            elif state[ti] == DROPPING:
                state[ti] = DROPPED
            try_admit(t)
        else:  # a slot save or restore: over its link, FIFO
            dur = ret[ti] * bpt / (bw_out if kind == T_SWAP_OUT else bw_in)
            if kind == T_SWAP_OUT:
                done = link_out = (link_out if link_out > t else t) + dur
            else:
                done = link_in = (link_in if link_in > t else t) + dur
            inflight += 1
            xfer_ms[ti] = dur * 1000
            seq += 1
            push(ext, (done, seq, SWAP_OUT_DONE if kind == T_SWAP_OUT else SWAP_IN_DONE, ti,
                       gen[ti]))

    def call_end(ti: int, t: float) -> None:
        nonlocal cnt
        g = pos[ti]
        en_t[g], en_seq[g] = t, cnt
        cnt += 1
        g += 1
        pos[ti] = g
        if g == end[ti]:
            finish(ti, t, 0, 0)
        else:
            pause(ti, t, g)

    def pause(ti: int, t: float, g: int) -> None:
        nonlocal seq, cnt
        c.pauses += 1
        retained = ret[ti] = ctx[g]
        lt, dlt = lat[g], dl[g]
        returns = lt == lt and lt <= dlt
        if fixed is None:
            k = cls[g]
            d = decide(make_ctx(
                run_id, ids[ti], classes[k], dlt * 1000.0, retained, g + 1 < end[ti], prio[ti],
                hist[k], len(free_slots) if slot_mode else free_tok, total, rates,
                (lt if lt == lt else None) if oracle else None))
            ttl, after, action, code, ri, wait = resolve(d, texts, text)
        else:  # a policy whose decision never changes
            ttl, after, action, code, ri, wait = fixed
        # pause_decision, tool_start (and kv_state paused unless the KV is dropped)
        pa_t[g], pa_seq[g], pa_code[g], pa_reason[g], pa_wait[g] = t, cnt, code, ri, wait
        cnt += 2 if code == DROP else 3
        te = t + (lt if returns else dlt)
        seq += 1
        push(ext, (te, seq, TOOL_END if returns else DEADLINE, ti, gen[ti]))
        if action == KEEP or ttl is not None:
            state[ti] = KEPT
            if ttl is not None and t + ttl < te:
                after_swap[ti] = after == SWAP
                seq += 1
                push(ext, (t + ttl, seq, TTL, ti, gen[ti]))
        elif action == SWAP:
            swap_out(ti, t, REASON["policy"])
        else:
            drop(ti, t, REASON["policy"])

    def swap_out(ti: int, t: float, reason: int) -> None:
        swap_reason[ti], state[ti] = reason, SWAPPING
        defer(T_SWAP_OUT, ti, 0, 0, t)

    def release(ti: int, t: float, reason: int, step: int) -> None:
        nonlocal free_tok
        emit(t, E_ERASE, ti, step, slot[ti], reason, 0, 0)
        if slot_mode:
            free_slots.append(slot[ti])
            slot[ti] = -1
        else:
            free_tok += held[ti]
            held[ti] = 0
        emit(t, E_KV_STATE, ti, -1, -1, 0, 2, 0)

    def drop(ti: int, t: float, reason: int) -> None:
        need_rc[ti], state[ti] = ret[ti], DROPPING
        defer(T_DROP, ti, reason, pos[ti] - first[ti], t)

    def finish(ti: int, t: float, status: int, reason: int) -> None:
        gen[ti] += 1  # whatever is still scheduled for this trajectory is void
        state[ti] = DONE
        if slot[ti] >= 0 or held[ti]:
            defer(T_FINISH, ti, status, reason, t)  # the erase is served between iterations
        else:
            end_trajectory(ti, t, status, reason)

    def end_trajectory(ti: int, t: float, status: int, reason: int) -> None:
        nonlocal next_ti
        if slot[ti] >= 0 or held[ti]:
            release(ti, t, REASON["trajectory-end"], -1)
            barge[0] = agent_handoff
        else:
            emit(t, E_KV_STATE, ti, -1, -1, 0, 2, 0)
        emit(t, E_TRAJ_END, ti, -1, -1, status, reason, 0)
        if status == 0:
            c.completed += 1
        elif status == 1:
            c.cancelled += 1
        else:
            c.failed += 1
        if arrival_s is None and next_ti < n:
            next_ti += 1
            arrive(next_ti - 1, t)
        barge[0] = False
        try_admit(t)

    def external(kind: int, ti: int, gn: int, t: float) -> None:
        nonlocal cnt, inflight
        if kind >= SWAP_OUT_DONE:
            inflight -= 1
        if gn != gen[ti]:
            return  # scheduled for a trajectory that has ended since
        g = pos[ti]
        if kind == TOOL_END:
            te_t[g], te_seq[g], te_slot[g] = t, cnt, slot[ti]
            cnt += 1
            if fixed is None:
                hist[cls[g]].add(lat[g])
            pos[ti] = g + 1
            due[ti] = t
            st = state[ti]
            if g + 1 == end[ti]:
                finish(ti, t, 0, 0)
            elif st == SWAPPING:
                state[ti] = WAIT_SWAPOUT
            elif st == DROPPING:
                state[ti] = WAIT_DROP
            else:
                request_call(ti, t)
        elif kind == SWAP_OUT_DONE:
            waiting = state[ti] == WAIT_SWAPOUT
            step = g - first[ti] - waiting
            emit(t, E_SWAP_OUT, ti, step, slot[ti], ret[ti], xfer_ms[ti], swap_reason[ti])
            release(ti, t, swap_reason[ti], step)
            state[ti] = SWAPPED
            if waiting:
                request_call(ti, t)
            else:
                try_admit(t)
        elif kind == SWAP_IN_DONE:
            emit(t, E_SWAP_IN, ti, g - first[ti], slot[ti], ret[ti], xfer_ms[ti], 0)
            start_call(ti, t)
        elif kind == TTL:
            if state[ti] == KEPT:
                if after_swap[ti]:
                    swap_out(ti, t, REASON["ttl-expired"])
                else:
                    drop(ti, t, REASON["ttl-expired"])
        elif kind == DEADLINE:
            status = 3 if lat[g] != lat[g] else 2
            emit(t, E_TOOL_END, ti, g - first[ti], slot[ti], status, 0, 0)
            why = text(f"tool {'abandoned' if status == 3 else 'timeout'}: deadline {dl[g]:g}s")
            emit(t, E_CANCEL, ti, -1, -1, why, 0, 0)
            finish(ti, t, 1, why)
        else:
            arrive(ti, t)

    def maybe_flush() -> None:
        if cnt - sink.seq >= flush_rows:
            sink.flush(cnt)

    sched = make_scheduler(costs, slot_mode, slot, pos, out, dcost, rem, ppos, pre_t,
                           first_token, call_end, run_task, external, maybe_flush)
    pre, wake, defer, idle = sched.pre, sched.wake, sched.defer, sched.idle
    # keep, swap and recompute decide the same at every pause: decide once, skip the context
    fixed = (resolve(policy.decide(PauseContext(run_id, "", "", None, 0, True, "")), texts, text)
             if type(policy) in (Keep, Swap, Recompute) else None)
    starts = range(min(concurrency, n)) if arrival_s is None else range(n)
    for ti in starts:
        seq += 1
        push(ext, (0.0 if arrival_s is None else float(arrival_s[ti]), seq, ARRIVE, ti, 0))
    if arrival_s is None:
        next_ti = len(starts)
    flush_rows = sink.flush_rows
    events, t_last = 0, 0.0
    # The loop makes no reference cycles; the cyclic collector would only rescan its large lists.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        events, t_last = sched.run(ext)
    finally:
        sink.total = cnt
        if gc_was_enabled:
            gc.enable()
    c.events = events
    c.sim_time_s = t_last
    return c
