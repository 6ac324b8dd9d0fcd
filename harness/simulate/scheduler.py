"""The simulated server's iterations and the event loop that interleaves them with the rest.

Continuous batching in iterations, as llama.cpp's server loop runs (and vLLM's scheduler, to
first order). An iteration computes one token for every generating call and a chunk of pending
prompt tokens, up to `batch_tokens` in all (prompts in slot order, or in order of arrival in a
token pool); its cost is `IterationCosts` (harness.model.iteration): a fixed cost, a cost per token
and attention per attended cell, micro-batch by micro-batch over slots (harness.simulate.batch).
A prompt's first token comes at the end of the iteration that finishes it; then one token per
iteration. A request that arrives while an iteration runs joins the next one (an idle server
starts at once); so does one sent in reaction to an iteration's end (a call's end, a freed slot),
as a real client's would. Control tasks (erase, slot save and restore, the release at a
trajectory's end) are served between iterations, as llama.cpp's task queue serves them. Runs of
identical decode-only iterations are one event, not one per token.
"""

from __future__ import annotations

import heapq
from array import array
from collections import deque
from collections.abc import Callable
from typing import NamedTuple

from harness.model.iteration import IterationCosts
from harness.simulate.batch import slot_iteration_s

IDLE, PREFILL, DECODE = range(3)  # what the server is running
FLUSH_EVERY = 4096  # loop events between two checks for records to flush
Task = tuple[int, int, int, int]  # (kind, trajectory, a, b), served at the iteration's end


class Scheduler(NamedTuple):
    """The server's side of the loop, as closures over its state."""

    pre: deque[int]  # calls with prompt tokens left (start_call appends), in order of arrival
    wake: Callable[[float], None]  # work arrived at t
    defer: Callable[[int, int, int, int, float], None]  # a control task (now if idle)
    idle: Callable[[], bool]  # nothing running, nothing waiting to run
    run: Callable[[list[tuple[float, int, int, int, int]]], tuple[int, float]]  # the loop


def make_scheduler(costs: IterationCosts, slot_mode: bool, slot: list[int], pos: list[int],
                   out: list[int], dcost: list[float], rem: list[int], ppos: list[int],
                   pre_t: array[float], on_first: Callable[[int, float], None],
                   on_end: Callable[[int, float], None],
                   on_task: Callable[[int, int, int, int, float], None],
                   on_external: Callable[[int, int, int, float], None],
                   on_flush: Callable[[], None]) -> Scheduler:
    """The server over per-trajectory lists the engine shares (`slot`, `pos`: its LLM step,
    `rem`/`ppos`: prompt tokens left and where they start; `pre_t`: per-step prefill start,
    an array the engine's records read). Callbacks: a first token, a call's last token, a
    control task, an external event (kind, trajectory, generation, t), a chance to flush."""
    alpha, beta, batch_tokens = costs.alpha, costs.beta, costs.batch_tokens
    a_tiled, a_row, tiled_rows = costs.a_tiled, costs.a_row, costs.tiled_rows
    hd: list[tuple[int, int, int]] = []  # decoding calls: (iteration of their last token, seq, ti)
    dec_set: set[int] = set()  # slot mode: the decoding calls
    pre: deque[int] = deque()
    chunks: list[tuple[int, int]] = []  # (ti, tokens) of the running prefill iteration
    tasks: list[Task] = []
    push, pop = heapq.heappush, heapq.heappop
    inf = float("inf")
    seq = 0
    mode, t_srv = IDLE, inf  # what runs, and the next iteration boundary the loop must see
    it = it0 = 0  # iterations done; at the start of the running decode run
    t0 = step_s = 0.0  # start of the running iteration (or decode run), decode iteration length
    n_d, dsum = 0, 0.0  # decoding calls, their decode cost per iteration

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
            on_task(kind, ti, a, b, t)
        else:
            tasks.append((kind, ti, a, b))
            wake(t)

    def idle() -> bool:
        return mode == IDLE and not pre and not tasks

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
                a = a_tiled if m >= tiled_rows else a_row  # IterationCosts.chunk_s, inlined
                cost += m * beta + a * (m * ppos[ti] + m * (m + 1) * 0.5)
                chunks.append((ti, m))
        if chunks:
            for ti, _ in chunks:
                g = pos[ti]
                if pre_t[g] < 0:  # the prompt's first chunk
                    pre_t[g] = t
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
        done = None
        if hd and hd[0][0] <= it:
            done = []
            while hd and hd[0][0] <= it:
                ti = pop(hd)[2]
                n_d -= 1
                dsum -= dcost[pos[ti]]
                done.append(ti)
            if slot_mode:
                dec_set.difference_update(done)
        firsts = None
        if chunks:
            firsts = []
            for ti, m in chunks:
                r = rem[ti] - m
                rem[ti] = r
                if r:
                    ppos[ti] += m
                    continue
                firsts.append(ti)
                g = pos[ti]
                o = out[g]
                if o > 1:
                    seq += 1
                    push(hd, (it + o - 1, seq, ti))
                    n_d += 1
                    dsum += dcost[g]
                    if slot_mode:
                        dec_set.add(ti)
            chunks.clear()
            if slot_mode:
                for ti in firsts:
                    pre.remove(ti)
            else:
                while pre and rem[pre[0]] == 0:
                    pre.popleft()
        compose(t)
        if tasks:
            todo = tasks[:]
            tasks.clear()
            for kind, ti, a, b in todo:
                on_task(kind, ti, a, b, t)
        if firsts:
            for ti in firsts:
                on_first(ti, t)
        if done:
            for ti in done:
                on_end(ti, t)

    def run(ext: list[tuple[float, int, int, int, int]]) -> tuple[int, float]:
        """Until nothing is left: external events (a heap) and iteration boundaries in time
        order, events at a boundary's instant first. Returns (events, last time)."""
        events = 0
        t = 0.0
        while True:
            events += 1
            if ext and ext[0][0] <= t_srv:
                t, _, kind, ti, gn = pop(ext)
                on_external(kind, ti, gn, t)
            elif t_srv < inf:
                t = t_srv
                boundary(t)
            else:
                break
            if not events % FLUSH_EVERY:
                on_flush()
        return events, t

    return Scheduler(pre, wake, defer, idle, run)
