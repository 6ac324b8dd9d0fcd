"""The discrete-event loop: one server, one trace, one pause policy (plain heapq).

Server: continuous batching in iterations, as llama.cpp's server loop runs (and vLLM's
scheduler, to first order). An iteration computes one token for every generating call and a
chunk of pending prompt tokens, up to `batch_tokens` in all (prompts in slot order, or in order
of arrival in a token pool); its cost is `IterationCosts` (harness.model.iteration): a fixed cost,
a cost per token and attention per attended cell. A prompt's first token comes at the end of the
iteration that finishes it; then one token per iteration. A request that arrives while an
iteration runs joins the next one (an idle server starts at once); so does one sent in reaction
to an iteration's end (a call's end, a freed slot), as a real client's would. Control tasks
(erase, slot save and restore, the release at a trajectory's end) are served between iterations,
as llama.cpp's task queue serves them: a slot freed by recompute is free when the running
iteration ends. Runs of identical decode-only iterations are one event, not one per token.

Memory: a call reserves its whole context (prompt + output) when admitted (no growth, so no
preemption of running calls); a paused trajectory that keeps its KV keeps its reservation (its
slot, in slot mode). Admission is first come first served, except that in a token pool a resumed
trajectory still holding KV grows before anything new is admitted. When the server is idle and
the first of those cannot grow, the latest one behind it is preempted (dropped, recomputed when
admitted): that is the only preemption. Swaps use one FIFO link per direction (host tier
unbounded) and do not stall compute. Policies decide through harness.policies with the context
the replay builds (free/total slots in slot mode, free/total tokens in a token pool; the class's
latency history, its last `history_window` observations); only an oracle sees the true latency.
"""

from __future__ import annotations

import gc
import heapq
from collections import deque

import numpy as np

from harness.policies.base import KEEP, SWAP, PausePolicy
from harness.simulate.batch import slot_iteration_s
from harness.simulate.records import (
    E_CALL_END,
    E_CALL_START,
    E_CANCEL,
    E_DECISION,
    E_ERASE,
    E_FIRST_TOKEN,
    E_KV_STATE,
    E_RECOMPUTE,
    E_SLOT_WAIT,
    E_SWAP_IN,
    E_SWAP_OUT,
    E_TOOL_END,
    E_TOOL_START,
    E_TRAJ_END,
    E_TRAJ_START,
    RecordSink,
)
from harness.simulate.server import Capacity, Counters, History, ServerModel, context_factory
from harness.simulate.workload import Workload

ARRIVE, TOOL_END, DEADLINE, TTL, SWAP_OUT_DONE, SWAP_IN_DONE = range(6)
RUNNING, KEPT, SWAPPING, WAIT_SWAPOUT, SWAPPED, DROPPED, RESTORING, DONE = range(8)
DROPPING, WAIT_DROP = 8, 9  # an erase waits for the iteration's end; the tool has returned
IDLE, PREFILL, DECODE = range(3)  # what the server is running
T_DROP, T_SWAP_OUT, T_RESTORE, T_FINISH = range(4)  # control tasks served between iterations
_ACTION_CODE = {KEEP: 0, SWAP: 1, "recompute": 2}
SLOT_HANDOFFS = ("agent", "fifo")
NAN = float("nan")


def simulate(w: Workload, server: ServerModel, cap: Capacity, policy: PausePolicy,
             arrival_s: np.ndarray | None, concurrency: int, sink: RecordSink, run_id: str,
             history_window: int = 1000, slot_handoff: str = "agent") -> Counters:
    """Run every trajectory to its end; events go to `sink`. `arrival_s` None: closed loop.

    `slot_handoff` (slot mode, closed loop): "agent" as the replay's slot pool does it (the agent
    that ends a trajectory starts its next one on the slot it just freed, ahead of the calls
    waiting for a slot, and the waiter woken for that slot queues again at the back); "fifo":
    every freed slot goes to the longest waiter.
    """
    if slot_handoff not in SLOT_HANDOFFS:
        raise ValueError(f"slot_handoff must be one of {SLOT_HANDOFFS}, got {slot_handoff!r}")
    agent_handoff = slot_handoff == "agent" and cap.slot_mode and arrival_s is None
    barge = [False]
    inp, out, ctx = w.inp.tolist(), w.out.tolist(), w.ctx.tolist()
    lat, dl, cls, outcome = w.lat.tolist(), w.deadline.tolist(), w.cls.tolist(), w.outcome.tolist()
    first, ids, prio = w.first, w.ids, w.priority
    costs = server.iteration_costs()
    alpha, chunk_s, batch_tokens = costs.alpha, costs.chunk_s, costs.batch_tokens
    # per LLM step: what one of its decode tokens adds to an iteration (context at mid-output)
    dcost = (costs.beta + costs.a_row * (w.ctx - w.out / 2.0)).tolist()
    n = w.n_trajectories
    end = [f + k for f, k in zip(first, w.n_steps, strict=True)]
    pos = list(first)
    state, gen, held, slot = [DONE] * n, [0] * n, [0] * n, [-1] * n
    need_rc, ret, due = [0] * n, [0] * n, [0.0] * n
    ready, t_start, t_first, t_pre = [0.0] * n, [0.0] * n, [0.0] * n, [-1.0] * n
    pn, rem, ppos = [0] * n, [0] * n, [0] * n
    xfer_ms, swap_reason, after_swap = [0.0] * n, [0] * n, [False] * n
    hist = [History(history_window) for _ in w.classes]
    classes = w.classes
    bpt = server.kv_bytes_per_token
    bw_out, bw_in = server.swap_out_bytes_per_s, server.swap_in_bytes_per_s
    rates = server.policy_rates()
    make_ctx, decide, oracle = context_factory(), policy.decide, policy.sees_true_latency
    slot_mode, limit, total = cap.slot_mode, cap.context_limit, cap.units
    free_slots = list(range(total - 1, -1, -1)) if slot_mode else []
    emit, text = sink.rows.extend, sink.text
    REASON = {k: text(k) for k in ("policy", "ttl-expired", "trajectory-end", "preempted",
                                   "context-overflow")}
    texts: dict[str, int] = {}
    ext: list[tuple[float, int, int, int, int]] = []
    hd: list[tuple[int, int, int]] = []  # decoding calls: (iteration of their last token, seq, ti)
    dec_set: set[int] = set()  # slot mode: the decoding calls
    pre: deque[int] = deque()  # calls with prompt tokens left, in order of arrival
    chunks: list[tuple[int, int]] = []  # (ti, tokens) of the running prefill iteration
    tasks: list[tuple[int, int, int, int]] = []  # control tasks waiting for the iteration's end
    queue: deque[int] = deque()  # waiting for admission
    resume_q: deque[int] = deque()  # token pool: waiting to grow KV they hold
    push, pop = heapq.heappush, heapq.heappop
    c = Counters()
    inf = float("inf")
    seq = 0
    mode, t_srv = IDLE, inf  # what runs, and the next iteration boundary the loop must see
    it = it0 = 0  # iterations done; at the start of the running decode run
    t0 = step_s = 0.0  # start of the running iteration (or decode run), decode iteration length
    n_d, dsum = 0, 0.0  # decoding calls, their decode cost per iteration
    free_tok = total  # token pool
    link_out = link_in = 0.0  # when each swap link is next free
    inflight = 0  # swaps in flight
    next_ti = 0  # closed loop: the next trajectory to start

    def wake(t: float) -> None:
        # Work or a task arrived: an idle server starts now, a decode run stops at its next step.
        nonlocal t_srv
        if mode == IDLE:
            t_srv = t
        elif mode == DECODE:
            tb = t0 + (int((t - t0) / step_s) + 1) * step_s
            if tb < t_srv:
                t_srv = tb

    def defer(kind: int, ti: int, a: int, b: int, t: float) -> None:
        if mode == IDLE:
            run_task(kind, ti, a, b, t)
        else:
            tasks.append((kind, ti, a, b))
            wake(t)

    def arrive(ti: int, t: float) -> None:
        emit((t, E_TRAJ_START, ti, -1, -1, t, 0, 0))
        due[ti], state[ti] = t, DROPPED
        request_call(ti, t)

    def request_call(ti: int, t: float) -> None:
        g = pos[ti]
        if ctx[g] > limit:
            emit((t, E_CALL_END, ti, g - first[ti], slot[ti], NAN, 0, 0))
            finish(ti, t, 2, REASON["context-overflow"])
            return
        ready[ti] = t
        if slot[ti] >= 0:  # slot mode, KV kept: the slot is still ours
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
        if mode != IDLE or pre or inflight or tasks or len(resume_q) < 2:
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
            emit((t, E_SLOT_WAIT, ti, pos[ti] - first[ti], slot[ti], t - ready[ti], 0, 0))
        if state[ti] == SWAPPED:
            state[ti] = RESTORING
            defer(T_RESTORE, ti, 0, 0, t)
        else:
            start_call(ti, t)

    def start_call(ti: int, t: float) -> None:
        g = pos[ti]
        step, s = g - first[ti], slot[ti]
        work = inp[g] + need_rc[ti]
        if need_rc[ti]:
            emit((t, E_RECOMPUTE, ti, step, s, need_rc[ti], 0, 0))
            need_rc[ti] = 0
        emit((t, E_KV_STATE, ti, -1, -1, ctx[g] - out[g], 0, 0))
        emit((t, E_CALL_START, ti, step, s, due[ti], 0, 0))
        pn[ti], t_start[ti], state[ti], t_pre[ti] = work, t, RUNNING, -1.0
        rem[ti] = work if work > 0 else 1
        ppos[ti] = ctx[g] - out[g] - rem[ti]
        pre.append(ti)
        wake(t)

    def compose(t: float) -> None:
        # The next iteration, from the calls in the batch before `t`'s reactions.
        nonlocal mode, t_srv, t0, step_s, it0
        budget = batch_tokens - n_d
        if slot_mode:  # llama.cpp: slot order, split into micro-batches (harness.simulate.batch)
            prompts = []
            for ti in sorted(pre, key=slot.__getitem__):
                if budget <= 0:
                    break
                m = rem[ti] if rem[ti] <= budget else budget
                budget -= m
                prompts.append((slot[ti], m, ppos[ti]))
                chunks.append((ti, m))
            dec = sorted((slot[ti], dcost[pos[ti]]) for ti in dec_set)
            cost = slot_iteration_s(costs, dec, prompts)
        else:
            cost = alpha + dsum
            for ti in pre:
                if budget <= 0:
                    break
                m = rem[ti] if rem[ti] <= budget else budget
                budget -= m
                cost += chunk_s(ppos[ti], m)
                chunks.append((ti, m))
        if chunks:
            for ti, _ in chunks:
                if t_pre[ti] < 0:
                    t_pre[ti] = t
            mode, t0, t_srv = PREFILL, t, t + cost
        elif n_d:
            mode, t0, step_s, it0 = DECODE, t, cost, it
            t_srv = t + (hd[0][0] - it) * cost
        else:
            mode, t_srv = IDLE, inf

    def boundary(t: float) -> None:
        nonlocal it, n_d, dsum, seq
        if mode == PREFILL:
            it += 1
        elif mode == DECODE:
            it = it0 + round((t - t0) / step_s)
        done = []
        while hd and hd[0][0] <= it:
            ti = pop(hd)[2]
            n_d -= 1
            dsum -= dcost[pos[ti]]
            dec_set.discard(ti)
            done.append(ti)
        firsts = []
        for ti, m in chunks:
            rem[ti] -= m
            ppos[ti] += m
            if rem[ti] == 0:
                firsts.append(ti)
                g = pos[ti]
                if out[g] > 1:
                    seq += 1
                    push(hd, (it + out[g] - 1, seq, ti))
                    n_d += 1
                    dsum += dcost[g]
                    if slot_mode:
                        dec_set.add(ti)
        if firsts:
            if slot_mode:
                for ti in firsts:
                    pre.remove(ti)
            else:
                while pre and rem[pre[0]] == 0:
                    pre.popleft()
        chunks.clear()
        compose(t)
        if tasks:
            todo = tasks[:]
            tasks.clear()
            for kind, ti, a, b in todo:
                run_task(kind, ti, a, b, t)
        for ti in firsts:
            emit((t, E_FIRST_TOKEN, ti, pos[ti] - first[ti], slot[ti], 0, 0, 0))
            t_first[ti] = t
            if out[pos[ti]] <= 1:
                call_end(ti, t)
        for ti in done:
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
        elif kind == T_SWAP_OUT:
            dur = ret[ti] * bpt / bw_out
            link_out = (link_out if link_out > t else t) + dur
            inflight += 1
            xfer_ms[ti] = dur * 1000
            seq += 1
            push(ext, (link_out, seq, SWAP_OUT_DONE, ti, gen[ti]))
        elif kind == T_RESTORE:
            dur = ret[ti] * bpt / bw_in
            link_in = (link_in if link_in > t else t) + dur
            inflight += 1
            xfer_ms[ti] = dur * 1000
            seq += 1
            push(ext, (link_in, seq, SWAP_IN_DONE, ti, gen[ti]))

    def call_end(ti: int, t: float) -> None:
        g = pos[ti]
        tf = t_first[ti]
        emit((t, E_CALL_END, ti, g - first[ti], slot[ti], pn[ti], (tf - t_pre[ti]) * 1000,
              (t - tf) * 1000))
        g += 1
        pos[ti] = g
        if g == end[ti]:
            finish(ti, t, 0, 0)
        else:
            pause(ti, t, g)

    def pause(ti: int, t: float, g: int) -> None:
        nonlocal seq
        c.pauses += 1
        k, step, s = cls[g], g - first[ti], slot[ti]
        retained = ret[ti] = ctx[g]
        lt, dlt = lat[g], dl[g]
        returns = lt == lt and lt <= dlt
        d = decide(make_ctx(
            run_id, ids[ti], classes[k], dlt * 1000.0, retained, g + 1 < end[ti], prio[ti],
            hist[k], len(free_slots) if slot_mode else free_tok, total, rates,
            (lt if lt == lt else None) if oracle else None))
        ttl, action, reason = d.ttl_s, d.action, d.reason
        ri = texts.get(reason)
        if ri is None:
            ri = texts[reason] = text(reason)
        code = _ACTION_CODE[action] if ttl is None else 3 + 8 * text(f"ttl_s={ttl} after={d.after}")
        wait = d.predicted_wait_s
        emit((t, E_DECISION, ti, step, s, code, NAN if wait is None else wait, ri))
        emit((t, E_TOOL_START, ti, step, s, 0, 0, 0))
        te = t + (lt if returns else dlt)
        seq += 1
        push(ext, (te, seq, TOOL_END if returns else DEADLINE, ti, gen[ti]))
        if ttl is not None or action == KEEP:
            state[ti] = KEPT
            emit((t, E_KV_STATE, ti, -1, -1, retained, 1, 0))
            if ttl is not None and t + ttl < te:
                after_swap[ti] = d.after == SWAP
                seq += 1
                push(ext, (t + ttl, seq, TTL, ti, gen[ti]))
        elif action == SWAP:
            emit((t, E_KV_STATE, ti, -1, -1, retained, 1, 0))
            swap_out(ti, t, REASON["policy"])
        else:
            drop(ti, t, REASON["policy"])

    def swap_out(ti: int, t: float, reason: int) -> None:
        swap_reason[ti], state[ti] = reason, SWAPPING
        defer(T_SWAP_OUT, ti, 0, 0, t)

    def release(ti: int, t: float, reason: int, step: int) -> None:
        nonlocal free_tok
        emit((t, E_ERASE, ti, step, slot[ti], reason, 0, 0))
        if slot_mode:
            free_slots.append(slot[ti])
            slot[ti] = -1
        else:
            free_tok += held[ti]
            held[ti] = 0
        emit((t, E_KV_STATE, ti, -1, -1, 0, 2, 0))

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
            emit((t, E_KV_STATE, ti, -1, -1, 0, 2, 0))
        emit((t, E_TRAJ_END, ti, -1, -1, status, reason, 0))
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

    def external(kind: int, ti: int, t: float) -> None:
        g = pos[ti]
        if kind == TOOL_END:
            emit((t, E_TOOL_END, ti, g - first[ti], slot[ti], outcome[g], 0, 0))
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
            emit((t, E_SWAP_OUT, ti, step, slot[ti], ret[ti], xfer_ms[ti], swap_reason[ti]))
            release(ti, t, swap_reason[ti], step)
            state[ti] = SWAPPED
            if waiting:
                request_call(ti, t)
            else:
                try_admit(t)
        elif kind == SWAP_IN_DONE:
            emit((t, E_SWAP_IN, ti, g - first[ti], slot[ti], ret[ti], xfer_ms[ti], 0))
            start_call(ti, t)
        elif kind == TTL:
            if state[ti] == KEPT:
                if after_swap[ti]:
                    swap_out(ti, t, REASON["ttl-expired"])
                else:
                    drop(ti, t, REASON["ttl-expired"])
        elif kind == DEADLINE:
            status = 3 if lat[g] != lat[g] else 2
            emit((t, E_TOOL_END, ti, g - first[ti], slot[ti], status, 0, 0))
            why = text(f"tool {'abandoned' if status == 3 else 'timeout'}: deadline {dl[g]:g}s")
            emit((t, E_CANCEL, ti, -1, -1, why, 0, 0))
            finish(ti, t, 1, why)
        else:
            arrive(ti, t)

    starts = range(min(concurrency, n)) if arrival_s is None else range(n)
    for ti in starts:
        seq += 1
        push(ext, (0.0 if arrival_s is None else float(arrival_s[ti]), seq, ARRIVE, ti, 0))
    if arrival_s is None:
        next_ti = len(starts)

    t_last = 0.0
    rows, flush_at = sink.rows, sink.flush_at
    events = 0
    # The loop makes no reference cycles; the cyclic collector would only rescan its large lists.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        while True:
            events += 1
            if ext and ext[0][0] <= t_srv:  # events at a boundary's instant come first
                t, _, kind, ti, gn = pop(ext)
                if kind >= SWAP_OUT_DONE:
                    inflight -= 1
                if gn == gen[ti]:
                    external(kind, ti, t)
            elif t_srv < inf:
                t = t_srv
                boundary(t)
            else:
                break
            t_last = t
            if len(rows) >= flush_at:
                sink.flush()
    finally:
        if gc_was_enabled:
            gc.enable()
    c.events = events
    c.sim_time_s = t_last
    return c
