"""The discrete-event loop: one server, one trace, one pause policy (plain heapq).

Server (first order, two calibrated numbers): prefill and decode share the server's compute,
R = prefill tok/s, as a processor-sharing fluid. Each running decode gets
min(decode_tok_s, R / running) tokens/s, i.e. a step takes max(1 / decode_tok_s, batch / R):
memory-bound until the batch's compute fills a step; prefills share what the decodes leave.
Progress is one virtual clock per phase, so a batch change costs O(log n), not a pass over it.

Memory: a call reserves its whole context (prompt + output) when admitted (no growth, so no
preemption of running calls); a paused trajectory that keeps its KV keeps its reservation (its
slot, in slot mode). Admission is first come first served, except that in a token pool a resumed
trajectory still holding KV grows before anything new is admitted. When the server is idle and
the first of those cannot grow, the latest one behind it is preempted (dropped, recomputed when
admitted): that is the only preemption. Swaps use one FIFO link
per direction (host tier unbounded) and do not stall compute. Policies decide through
harness.policies with the context the replay builds (free/total slots in slot mode, free/total
tokens in a token pool; the class's latency history, its last `history_window` observations);
only an oracle sees the true latency.
"""

from __future__ import annotations

import gc
import heapq
from collections import deque

import numpy as np

from harness.model.calibration import prefill_rate_at
from harness.policies.base import KEEP, SWAP, PausePolicy
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
_ACTION_CODE = {KEEP: 0, SWAP: 1, "recompute": 2}
NAN = float("nan")


def simulate(w: Workload, server: ServerModel, cap: Capacity, policy: PausePolicy,
             arrival_s: np.ndarray | None, concurrency: int, sink: RecordSink, run_id: str,
             history_window: int = 1000) -> Counters:
    """Run every trajectory to its end; events go to `sink`. `arrival_s` None: closed loop."""
    inp, out, ctx = w.inp.tolist(), w.out.tolist(), w.ctx.tolist()
    lat, dl, cls, outcome = w.lat.tolist(), w.deadline.tolist(), w.cls.tolist(), w.outcome.tolist()
    first, ids, prio = w.first, w.ids, w.priority
    rate = prefill_rate_at(server.prefill_points, server.prefill_tok_s,
                           (w.ctx - w.out).astype(float))
    pf = (server.prefill_tok_s / rate).tolist()  # prefill work per token, by context length
    n = w.n_trajectories
    end = [f + k for f, k in zip(first, w.n_steps, strict=True)]
    pos = list(first)
    state, gen, held, slot = [DONE] * n, [0] * n, [0] * n, [-1] * n
    need_rc, ret, due = [0] * n, [0] * n, [0.0] * n
    ready, t_start, t_first = [0.0] * n, [0.0] * n, [0.0] * n
    pn, xfer_ms, swap_reason, after_swap = [0] * n, [0.0] * n, [0] * n, [False] * n
    hist = [History(history_window) for _ in w.classes]
    classes = w.classes
    bpt, rate_total, dec = server.kv_bytes_per_token, server.prefill_tok_s, server.decode_tok_s
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
    hp: list[tuple[float, int, int]] = []
    hd: list[tuple[float, int, int]] = []
    queue: deque[int] = deque()  # waiting for admission
    resume_q: deque[int] = deque()  # token pool: waiting to grow KV they hold
    push, pop = heapq.heappush, heapq.heappop
    c = Counters()
    seq = 0
    vp = vd = 0.0  # virtual progress (tokens per request) of the prefill and decode phases
    n_p = n_d = 0  # requests in each phase
    free_tok = total  # token pool
    link_out = link_in = 0.0  # when each swap link is next free
    inflight = 0  # swaps in flight
    next_ti = 0  # closed loop: the next trajectory to start

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
        if n_p or n_d or inflight or len(resume_q) < 2:
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
        nonlocal link_in, inflight, seq
        if t > ready[ti]:
            emit((t, E_SLOT_WAIT, ti, pos[ti] - first[ti], slot[ti], t - ready[ti], 0, 0))
        if state[ti] == SWAPPED:
            dur = ret[ti] * bpt / bw_in
            link_in = (link_in if link_in > t else t) + dur
            inflight += 1
            xfer_ms[ti], state[ti] = dur * 1000, RESTORING
            seq += 1
            push(ext, (link_in, seq, SWAP_IN_DONE, ti, gen[ti]))
        else:
            start_call(ti, t)

    def start_call(ti: int, t: float) -> None:
        nonlocal seq, n_p
        g = pos[ti]
        step, s = g - first[ti], slot[ti]
        work = inp[g] + need_rc[ti]
        if need_rc[ti]:
            emit((t, E_RECOMPUTE, ti, step, s, need_rc[ti], 0, 0))
            need_rc[ti] = 0
        emit((t, E_KV_STATE, ti, -1, -1, ctx[g] - out[g], 0, 0))
        emit((t, E_CALL_START, ti, step, s, due[ti], 0, 0))
        pn[ti], t_start[ti], state[ti] = work, t, RUNNING
        seq += 1
        push(hp, (vp + (work if work > 0 else 1) * pf[g], seq, ti))
        n_p += 1

    def prefill_done(ti: int, t: float) -> None:
        nonlocal seq, n_p, n_d
        g = pos[ti]
        emit((t, E_FIRST_TOKEN, ti, g - first[ti], slot[ti], 0, 0, 0))
        t_first[ti] = t
        n_p -= 1
        if out[g] > 1:
            seq += 1
            push(hd, (vd + out[g] - 1, seq, ti))
            n_d += 1
        else:
            call_end(ti, t)

    def call_end(ti: int, t: float) -> None:
        g = pos[ti]
        tf = t_first[ti]
        emit((t, E_CALL_END, ti, g - first[ti], slot[ti], pn[ti], (tf - t_start[ti]) * 1000,
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
        nonlocal link_out, inflight, seq
        dur = ret[ti] * bpt / bw_out
        link_out = (link_out if link_out > t else t) + dur
        inflight += 1
        xfer_ms[ti], swap_reason[ti], state[ti] = dur * 1000, reason, SWAPPING
        seq += 1
        push(ext, (link_out, seq, SWAP_OUT_DONE, ti, gen[ti]))

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
        release(ti, t, reason, pos[ti] - first[ti])
        need_rc[ti], state[ti] = ret[ti], DROPPED
        try_admit(t)

    def finish(ti: int, t: float, status: int, reason: int) -> None:
        nonlocal next_ti, seq
        if slot[ti] >= 0 or held[ti]:
            release(ti, t, REASON["trajectory-end"], -1)
        else:
            emit((t, E_KV_STATE, ti, -1, -1, 0, 2, 0))
        emit((t, E_TRAJ_END, ti, -1, -1, status, reason, 0))
        gen[ti] += 1
        state[ti] = DONE
        if status == 0:
            c.completed += 1
        elif status == 1:
            c.cancelled += 1
        else:
            c.failed += 1
        if arrival_s is None and next_ti < n:
            next_ti += 1
            arrive(next_ti - 1, t)
        try_admit(t)

    def external(kind: int, ti: int, t: float) -> None:
        g = pos[ti]
        if kind == TOOL_END:
            emit((t, E_TOOL_END, ti, g - first[ti], slot[ti], outcome[g], 0, 0))
            hist[cls[g]].add(lat[g])
            pos[ti] = g + 1
            due[ti] = t
            if g + 1 == end[ti]:
                finish(ti, t, 0, 0)
            elif state[ti] == SWAPPING:
                state[ti] = WAIT_SWAPOUT
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

    inf = float("inf")
    t_last = 0.0
    rows, flush_at = sink.rows, sink.flush_at
    events = 0
    # The loop makes no reference cycles; the cyclic collector would only rescan its large lists.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        while True:
            r_d = r_p = 0.0
            if n_p or n_d:
                share = rate_total / (n_p + n_d)
                r_d = dec if dec < share else share
                if n_p:
                    r_p = (rate_total - n_d * r_d) / n_p
            te = ext[0][0] if ext else inf
            tp = t_last + (hp[0][0] - vp) / r_p if n_p else inf
            td = t_last + (hd[0][0] - vd) / r_d if n_d else inf
            events += 1
            if te <= tp and te <= td:
                if te == inf:
                    break
                t, _, kind, ti, gn = pop(ext)
                vp += r_p * (t - t_last)
                vd += r_d * (t - t_last)
                t_last = t
                if kind >= SWAP_OUT_DONE:
                    inflight -= 1
                if gn == gen[ti]:
                    external(kind, ti, t)
            elif tp <= td:
                t = tp if tp > t_last else t_last
                vd += r_d * (t - t_last)
                vp, _, ti = pop(hp)
                t_last = t
                prefill_done(ti, t)
            else:
                t = td if td > t_last else t_last
                vp += r_p * (t - t_last)
                vd, _, ti = pop(hd)
                n_d -= 1
                t_last = t
                call_end(ti, t)
            if len(rows) >= flush_at:
                sink.flush()
    finally:
        if gc_was_enabled:
            gc.enable()
    c.events = events
    c.sim_time_s = t_last
    return c
