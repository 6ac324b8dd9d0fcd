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
trajectory's end) are served between iterations, as llama.cpp's task queue serves them; on
slots a save or restore is the loop's own work (llama.cpp reads and writes the slot's state in
its loop), so once one is queued the loop serves every queued task in turn, for as long as their
transfers take, and only then composes the next iteration, with the calls that reached it
meanwhile (`TASKS`). Runs of identical decode-only iterations are one event, not one per
token. A server whose pause controls are requests (vLLM's, through the harness's connector: one
prompt token, two generated) runs them in its iterations like any call, a token each, without
memory (`control`). Where the
server's front end shares the engine's processors (harness.simulate.client), its work pauses the
engine's compute (`steal`): the running iteration ends that much later, and one that starts
while the front end works runs in what the front end leaves (`after`).

Written as typed classes so that mypyc can compile this module with harness.simulate.engine
(see harness.simulate.native); it runs unchanged as plain Python.
"""

from __future__ import annotations

import heapq
from collections import deque
from typing import TYPE_CHECKING, Any, Final

from harness.model.iteration import NOISE_DRAWS, IterationCosts, curve_at
from harness.simulate.batch import slot_iteration_s
from harness.simulate.trajectory import F_PRE_T, STEP_WIDTH, Trajectory

if TYPE_CHECKING:
    from harness.simulate.engine import Engine
    from harness.simulate.growth import Growth

IDLE: Final = 0  # what the server is running
PREFILL: Final = 1
DECODE: Final = 2
TASKS: Final = 3  # slot mode: saves and restores, which llama.cpp's loop runs itself
FLUSH_EVERY: Final = 4096  # loop events between two checks for records to flush
INF: Final = float("inf")
NOISE_MASK: Final = NOISE_DRAWS - 1
Event = tuple[float, int, int, Trajectory, int]  # (time, tie-break, kind, trajectory, its gen)


def slot_of(tr: Trajectory) -> int:
    return tr.slot


class Scheduler:
    """The server's side of the loop: the calls of the engine's trajectories.

    A call reads its trajectory's `slot`, `pos` (its global LLM step), `rem`/`ppos` (prompt
    tokens left and where they start); `out` and `dcost` (what one decode token of a step adds
    to an iteration) are per step; `rows` is the buffer of per-step record fields, where a
    call's prefill start goes (steps.StepColumns).
    The engine is called back on a first token, a call's last token, a control task and an
    external event, and asked to flush records now and then.
    """

    def __init__(self, engine: Engine, costs: IterationCosts, slot_mode: bool,
                 out: list[int], dcost: list[float], rows: Any) -> None:
        self.engine = engine
        self.costs = costs
        self.alpha: float = costs.alpha
        self.alpha_dec: float = costs.decode_alpha  # an iteration of decode tokens only
        self.beta: float = costs.beta
        self.batch_tokens: int = costs.batch_tokens
        self.a_tiled: float = costs.a_tiled
        self.a_row: float = costs.a_row
        self.tiled_rows: int = costs.tiled_rows
        self.a_ctx: float = costs.a_context
        self.a_ctx_sq: float = costs.a_context_sq
        self.free: int = costs.free_tokens  # tokens within the fixed cost (IterationCosts)
        # the first iteration after idle time costs more (IterationCosts.wake_after): measured
        self.wakes: bool = costs.wake > 0.0 or bool(costs.wake_curve)
        self.idle_since = -INF  # the server idled before the run
        # a fleet's: the way's wake after idle time in the first iteration after it (wake_way)
        self.way_curve: tuple[tuple[float, float], ...] = ()
        # each iteration's time over the model's, drawn from the measured spread (the
        # server's own noise: harness.simulate.server.noise_draws); empty: none
        self.noise: list[float] = []
        self.noise_i = 0
        self.slot_mode = slot_mode
        self.out = out
        self.dcost = dcost
        self.rows = rows
        self.hd: list[tuple[int, int, Trajectory]] = []  # decoding: (its last iteration, seq, _)
        self.dec_set: set[Trajectory] = set()  # slot mode: the decoding calls
        self.pre: deque[Trajectory] = deque()  # calls with prompt tokens left, in arrival order
        self.chunks: list[tuple[Trajectory, int]] = []  # (call, tokens) of the running prefill
        self.tasks: list[tuple[int, Trajectory, int, int]] = []  # (kind, _, a, b) for its end
        self.seq = 0
        self.mode = IDLE
        self.t_srv = INF  # the next iteration boundary the loop must see
        self.it = 0  # iterations done
        self.it0 = 0  # iterations done at the start of the running decode run
        self.t0 = 0.0  # start of the running iteration (or decode run)
        self.step_s = 0.0  # a decode iteration's length
        self.n_d = 0  # decoding calls
        self.dsum = 0.0  # their decode cost per iteration
        # vLLM: blocks allocated as calls grow (harness.simulate.growth: None, a call holds
        # its whole context from its admission); its state on this server
        self.growth: Growth | None = None
        self.xq: list[tuple[int, int, Trajectory]] = []
        self.phase: list[int] = []
        self.n_phase = 0
        self.charged = 0
        # control requests (kind, trajectory): arrived; in the running iteration's prompts; in
        # its decodes (their last token: answered at its end)
        self.ctl_wait: list[tuple[int, Trajectory]] = []
        self.ctl_pre: list[tuple[int, Trajectory]] = []
        self.ctl_dec: list[tuple[int, Trajectory]] = []
        # the front end's work on the engine's processors: (start, end) in time order, none
        # overlapping; and what of it the running decode run's last step waits for
        self.fe: deque[tuple[float, float]] = deque()
        self.lag = 0.0
        self.loop_free = -INF  # slot mode: when the loop is done with the saves and restores

    def wake_way(self, curve: tuple[tuple[float, float], ...]) -> None:
        """Add the way's wake after idle time (`curve`: ServerModel.way_wake_curve) to the
        first iteration after it, as a fleet's servers do (a single server's client adds it
        to the request's way instead: Client.way_wake)."""
        self.way_curve = curve
        self.wakes = self.wakes or bool(curve)

    def steal(self, s: float, e: float) -> None:
        """The front end computes from `s` (now or later) to `e`, the engine not: the
        iteration running at `s` ends that much later (a decode run ends with it)."""
        self.fe.append((s, e))
        if s >= self.t_srv or self.mode == IDLE:
            return
        if self.mode == DECODE:
            t0, step = self.t0, self.step_s
            tb = t0 + (int((s - t0) / step) + 1) * step  # the end of the step running at s
            if tb < self.t_srv - self.lag:  # before the run's last step: it ends the run
                self.t_srv, self.lag = tb, 0.0
        self.t_srv += e - s
        self.lag += e - s

    def after(self, t: float, cost: float) -> float:
        """When an iteration of `cost` started at `t` ends, in the time the front end's work
        leaves the engine."""
        fe = self.fe
        while fe and fe[0][1] <= t:
            fe.popleft()
        cur, left = t, cost
        for s, e in fe:
            if s >= cur + left:
                break
            if s > cur:
                left -= s - cur
            if e > cur:
                cur = e
        return cur + left

    def control(self, kind: int, tr: Trajectory, t: float) -> None:
        """A control request about `tr` reaches the engine at `t`: its one prompt token joins
        the next iteration, its second token the one after; then it is answered
        (Client.answered)."""
        self.ctl_wait.append((kind, tr))
        self.wake(t)

    def occupy_loop(self, t: float, dur: float) -> float:
        """Slot mode: a save or restore of `dur` s served at `t` runs on the loop after what it
        has; when it is done."""
        start = t if t > self.loop_free else self.loop_free
        self.loop_free = start + dur
        return self.loop_free

    def wake(self, t: float) -> None:
        """Work or a task arrived at `t`: an idle server starts now, a decode run stops at its
        next step (the loop serving tasks composes when they are done)."""
        if self.mode == IDLE:
            self.t_srv = t
        elif self.mode == DECODE:
            t0, step_s = self.t0, self.step_s
            tb = t0 + (int((t - t0) / step_s) + 1) * step_s
            if tb < self.t_srv - self.lag:  # (else the run's last step ends it)
                self.t_srv, self.lag = tb, 0.0

    def defer(self, kind: int, tr: Trajectory, a: int, b: int, t: float) -> None:
        """A control task: served now when idle, else at the running iteration's end (or, while
        the loop serves tasks, with them)."""
        if self.mode == IDLE:
            self.engine.run_task(kind, tr, a, b, t)
            if self.loop_free > t and self.mode == IDLE:  # a save or restore: the loop's
                self.mode = TASKS
                self.t_srv = self.loop_free
        else:
            self.tasks.append((kind, tr, a, b))
            self.wake(t)

    def cancel(self, tr: Trajectory, t: float) -> None:
        """Take `tr`'s running call out of the batch at `t` (its trajectory was cancelled):
        the running iteration costs what it was composed with; the next one goes without it."""
        if tr.rem:  # prompt tokens left
            self.pre.remove(tr)
            self.chunks[:] = [c for c in self.chunks if c[0] is not tr]
        else:
            hd = self.hd
            rest = [e for e in hd if e[2] is not tr]
            if len(rest) < len(hd):
                if self.growth is not None:
                    self.growth.settle(tr, t)
                hd[:] = rest
                heapq.heapify(hd)
                self.n_d -= 1
                self.dsum -= self.dcost[tr.pos]
                self.dec_set.discard(tr)
        self.wake(t)  # a decode run's iterations cost less from its next step on

    def done_by(self, t: float) -> int:
        """The iterations done by `t` (a decode run's as its steps end)."""
        if self.mode == DECODE:
            k = int((t - self.t0) / self.step_s)  # the last step waits for the front end
            return self.it0 + min(k, round((self.t_srv - self.lag - self.t0) / self.step_s) - 1
                                  if t < self.t_srv else k)
        return self.it

    def idle(self) -> bool:
        """Nothing running, nothing waiting to run."""
        return self.mode == IDLE and not self.pre and not self.tasks and not self.ctl_wait

    def compose(self, t: float) -> None:
        # The next iteration, from the calls in the batch before `t`'s reactions.
        budget = self.batch_tokens - self.n_d
        chunks = self.chunks
        if self.slot_mode:  # llama.cpp: slot order, split into micro-batches (batch.py)
            dcost = self.dcost
            prompts: list[tuple[int, int, int]] = []
            for tr in sorted(self.pre, key=slot_of):
                if budget <= 0:
                    break
                r = tr.rem
                m = r if r <= budget else budget
                budget -= m
                prompts.append((tr.slot, m, tr.ppos))
                chunks.append((tr, m))
            dec = sorted([(tr.slot, dcost[tr.pos]) for tr in self.dec_set])
            cost = slot_iteration_s(self.costs, dec, prompts)
        else:
            cost = self.alpha_dec + self.dsum
            beta, a_tiled, a_row, tiled_rows = self.beta, self.a_tiled, self.a_row, self.tiled_rows
            a_ctx, a_ctx_sq = self.a_ctx, self.a_ctx_sq
            if self.ctl_wait or self.ctl_dec:  # control requests: a token each (at context 0)
                n_ctl = len(self.ctl_wait) + len(self.ctl_dec)
                budget -= n_ctl
                cost += n_ctl * beta
                self.ctl_pre = self.ctl_wait
                self.ctl_wait = []
            for tr in self.pre:
                if budget <= 0:
                    break
                r = tr.rem
                m = r if r <= budget else budget
                budget -= m
                a = a_tiled if m >= tiled_rows else a_row  # IterationCosts.chunk_s, inlined
                p = tr.ppos
                cost += m * beta + a * (m * p + m * (m + 1) * 0.5) + p * (a_ctx + a_ctx_sq * p)
                chunks.append((tr, m))
            if chunks or self.ctl_pre:  # a prompt iteration's own fixed cost
                cost += self.alpha - self.alpha_dec
            if self.free:  # IterationCosts.free_s: tokens within the fixed cost
                used = self.batch_tokens - budget
                cost -= beta * (used if used < self.free else self.free)
        prompt = bool(chunks or self.ctl_pre or self.ctl_dec)
        if prompt or self.n_d:  # an iteration runs (a wake-up that finds none draws nothing)
            if self.mode == IDLE and self.wakes:  # the engine idled: it wakes slower
                idle = t - self.idle_since
                cost += self.costs.wake_after(idle)
                if self.way_curve:
                    cost += curve_at(self.way_curve, idle)
            if self.noise:  # a run of decodes draws once: its steps as long as each other
                cost *= self.noise[self.noise_i & NOISE_MASK]
                self.noise_i += 1
        self.lag = 0.0
        if prompt:  # one iteration (not a run of decodes)
            for tr, _ in chunks:
                if not tr.prefilling:  # the prompt's first chunk
                    tr.prefilling = True
                    self.rows[tr.pos * STEP_WIDTH + F_PRE_T] = t  # read with the call's end
            self.mode = PREFILL
            self.t0 = t
            self.t_srv = t + cost if not self.fe else self.after(t, cost)
        elif self.n_d:
            self.mode = DECODE
            self.t0 = t
            self.step_s = cost
            self.it0 = self.it
            k = self.hd[0][0] - self.it
            if self.growth is not None:
                k = self.growth.run_length(self.it, k)
            end = t + k * cost
            if self.fe and self.fe[-1][1] > t:  # the front end works: the run ends at the step
                for s, e in self.fe:  # it first takes from, which waits for it
                    if e > t:
                        if s < end:
                            k = min(k, int((s - t) / cost) + 1 if s > t else 1)
                            end = self.after(t, k * cost)
                            self.lag = end - t - k * cost
                        break
            self.t_srv = end
        else:
            if self.mode != IDLE:  # idle from its last iteration's end (not from a wake-up
                self.idle_since = t  # that found nothing it could run)
            self.mode = IDLE
            self.t_srv = INF

    def serve_tasks(self, t: float) -> None:
        """Serve the queued control tasks at `t`, in the order they came."""
        todo = self.tasks[:]
        self.tasks.clear()
        for kind, tr, a, b in todo:
            self.engine.run_task(kind, tr, a, b, t)

    def serve_then_compose(self, t: float) -> None:
        """Slot mode: serve the queued tasks at `t`; the next iteration is composed once the
        saves and restores among them are done (`TASKS` until then), else now."""
        self.serve_tasks(t)
        if self.loop_free > t:
            self.mode = TASKS
            self.t_srv = self.loop_free
        else:
            self.compose(t)

    def boundary(self, t: float) -> None:
        # The running iteration (or decode run) ends at `t`: tokens, then the next iteration,
        # then the reactions (tasks, first tokens, ended calls). On slots, queued saves and
        # restores come before the next iteration, which waits for them.
        if self.mode == TASKS:  # its tasks served; those queued meanwhile too, until none is left
            if self.tasks:
                self.serve_then_compose(t)
            else:
                self.compose(t)
            return
        if self.mode == PREFILL:
            self.it += 1
        elif self.mode == DECODE:
            self.it = self.it0 + round((t - self.lag - self.t0) / self.step_s)
        it = self.it
        answered = self.ctl_dec  # control requests: their last token; the first for the next
        self.ctl_dec = self.ctl_pre
        self.ctl_pre = []
        hd, dcost = self.hd, self.dcost
        gr = self.growth
        if gr is not None:  # the blocks the run's calls crossed into (it had room for them)
            gr.charge(it)
        done: list[Trajectory] = []
        while hd and hd[0][0] <= it:
            tr = heapq.heappop(hd)[2]
            self.n_d -= 1
            self.dsum -= dcost[tr.pos]
            if gr is not None:
                gr.finish(tr, it)
            done.append(tr)
        if done and self.slot_mode:
            self.dec_set.difference_update(done)
        firsts: list[Trajectory] = []
        chunks = self.chunks
        if chunks:
            out = self.out
            for tr, m in chunks:
                r = tr.rem - m
                tr.rem = r
                if r:
                    tr.ppos += m
                    continue
                g = tr.pos
                o = tr.oleft
                if o:  # a preempted call, readmitted: it had its first token
                    tr.oleft = 0
                    if o == 1:
                        done.append(tr)
                else:
                    firsts.append(tr)
                    o = out[g]
                if gr is not None:  # its tokens: the prompt and the first one sampled
                    if o > 1:
                        gr.start(tr, it, tr.ppos + m + 1, it + o - 1)
                    else:
                        gr.trim(tr, tr.ppos + m + 1)
                if o > 1:
                    self.seq += 1
                    heapq.heappush(hd, (it + o - 1, self.seq, tr))
                    self.n_d += 1
                    self.dsum += dcost[g]
                    if self.slot_mode:
                        self.dec_set.add(tr)
            chunks.clear()
            pre = self.pre
            if self.slot_mode:
                for tr in firsts:
                    pre.remove(tr)
            else:
                while pre and pre[0].rem == 0:
                    pre.popleft()
        # vLLM: the decoding calls' next blocks, preempting the latest where the pool is full
        preempted = gr is not None and gr.make_room(it, t)
        engine = self.engine
        if self.slot_mode and self.tasks and engine.occupies_loop(self.tasks):
            self.serve_then_compose(t)
        else:
            self.compose(t)
        if engine.client.fe_out > 0.0:  # the answers' front-end work (Client.replied)
            n = len(done) + len(answered)
            for tr in firsts:
                if self.out[tr.pos] <= 1:
                    n += 1
            engine.client.replied(n, t)
        if self.tasks and self.mode != TASKS:
            self.serve_tasks(t)
        for tr in firsts:
            engine.first_token(tr, t)
        for tr in done:
            engine.call_end(tr, t)
        for kind, tr in answered:
            engine.client.answered(kind, tr, t)
        # a preempted call waits first in line: admitted if it fits now; an engine idle after
        # its controls preempts where nothing can run (no timeout), as after a call
        if preempted or (answered and self.idle()):
            engine.try_admit(t)

    def run(self, ext: list[Event]) -> tuple[int, float]:
        """Until nothing is left: external events (a heap) and iteration boundaries in time
        order, events at a boundary's instant first. Returns (events, the last time anything
        happened: a void event, e.g. a first-token watch with nothing left to watch, is not)."""
        engine = self.engine
        events = 0
        t_busy = 0.0
        while True:
            events += 1
            if ext and ext[0][0] <= self.t_srv:
                t, _, kind, tr, gn = heapq.heappop(ext)
                engine.external(kind, tr, gn, t)
            elif self.t_srv < INF:
                t_busy = self.t_srv
                self.boundary(t_busy)
            else:
                break
            if not events % FLUSH_EVERY:
                engine.maybe_flush()
        return events, t_busy if t_busy > engine.t_real else engine.t_real
