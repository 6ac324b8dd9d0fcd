"""What the event loop's engine knows, and the bookkeeping its transitions share.

`EngineState` holds one simulation's inputs as the loop reads them (the workload's per-step
columns as lists, the trajectories, capacity, server rates, the policy and its fixed decision)
and its running state (free memory, queues, counters), and does the bookkeeping every transition
uses: records (a compact row, or a time and seq stamped into a step's row of the per-step
fields, harness.simulate.steps) and the external event heap. The transitions themselves are
harness.simulate.engine's `Engine`, a subclass.

Compiled with mypyc together with harness.simulate.engine (see harness.simulate.native): every
attribute is assigned in `__init__` itself, not in a helper, so that mypyc knows it is always
defined and reads it without a check.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, cast

from harness.model.iteration import IterationCosts
from harness.policies.base import RECOMPUTE, PauseContext, PausePolicy, ServerRates, program_order
from harness.policies.history import RecentMean
from harness.policies.pin_release import DEFAULT_PIN_RELEASE
from harness.simulate.block_cache import BlockCache, share_prefixes
from harness.simulate.client import Client
from harness.simulate.growth import Growth, admission_tokens
from harness.simulate.pins import Pins, PinState
from harness.simulate.records import E_ERASE, E_KV_STATE, RecordSink
from harness.simulate.scheduler import Event, Scheduler
from harness.simulate.server import (
    ACTION_CODE,
    Capacity,
    Counters,
    History,
    ServerModel,
    context_factory,
    fixed_decision,
    resolve,
)
from harness.simulate.trajectory import (
    DONE,
    DROPPED,
    DROPPING,
    KEPT,
    PREEMPTED,
    RUNNING,
    STEP_WIDTH,
    SWAPPING,
    Trajectory,
)
from harness.simulate.valve import H_CLIPPED, H_REJECTED, Valve
from harness.simulate.workload import Workload, decode_costs, step_lists, trajectories

if TYPE_CHECKING:
    from harness.simulate.engine import Engine
    from harness.simulate.fleet import Fleet

# external events; those of a pause (TOOL_END, DEADLINE, TTL) carry its step, not a generation
ARRIVE: Final = 0
TOOL_END: Final = 1
DEADLINE: Final = 2
TTL: Final = 3
SWAP_OUT_DONE: Final = 4  # swaps from here on (the in-flight count)
SWAP_IN_DONE: Final = 5
# SENT (6: a call reaches the engine) and TIMEOUT (7) are harness.simulate.client's
A_KEEP: Final = 0  # action codes (server.ACTION_CODE); anything else drops the KV
A_SWAP: Final = 1
A_EVICTABLE: Final = 4  # keep-evictable: left to the engine's prefix cache
# control tasks served between iterations
T_DROP: Final = 0
T_SWAP_OUT: Final = 1
T_RESTORE: Final = 2
T_FINISH: Final = 3
NAN: Final = float("nan")
INF: Final = float("inf")


def action_code(action: str) -> int:
    """KEEP, SWAP or the drop of a decision, as the loop compares it (server.ACTION_CODE)."""
    return ACTION_CODE[action]


@dataclass(frozen=True)
class LoopRules:
    """How the loop runs besides its workload and server (harness.simulate.run's `simulate`
    says what each rule means); read once, at the engine's construction."""

    open_loop: bool = False
    history_window: int = 1000
    agent_handoff: bool = False
    seed: int = 0
    first_token_timeout_s: float = INF
    pins: Pins | None = None
    pin_release: str = DEFAULT_PIN_RELEASE


class EngineState:
    """One simulation's inputs and running state, and the record and event bookkeeping."""

    def __init__(self, w: Workload, server: ServerModel, cap: Capacity, policy: PausePolicy,
                 sink: RecordSink, run_id: str, rules: LoopRules) -> None:
        seed, first_token_timeout_s, pins = rules.seed, rules.first_token_timeout_s, rules.pins
        self.open_loop = open_loop = rules.open_loop
        self.agent_handoff = rules.agent_handoff and cap.slot_mode and not open_loop
        self.barge = False  # the agent that just freed a slot starts its next trajectory on it
        # per step
        self.inp, self.out, self.ctx, self.kept, self.lat, self.dl, self.cls = step_lists(w)
        self.costs: IterationCosts = server.iteration_costs()
        self.dcost = decode_costs(w, self.costs, server.stream_token_s)
        # per trajectory
        self.ids: list[str] = list(w.ids)
        self.prio: list[str] = list(w.priority)
        self.trajs = trajectories(w)
        # sub-agents: a parent's index (-1: a root, which arrives on its own), the parent's
        # step that starts it (its trajectory_start's step), the children of each spawning step
        self.parent: list[int] = w.parent.tolist()
        self.spawn_at: list[int] = w.spawn_step.tolist()
        self.kids: dict[int, list[int]] = w.children()
        self.roots: list[int] = w.roots.tolist()
        self.n_roots = len(self.roots)
        # the first bystander's index (Workload.bystanders: the last ones; none: past the end)
        self.agents_end = w.n_trajectories - w.bystanders
        # a replay's own tool ends and trajectory starts, where the run is held to them
        self.pins: PinState | None = PinState(pins) if pins is not None else None
        self.classes: list[str] = list(w.classes)
        self.hist: list[History] = [History(rules.history_window) for _ in w.classes]
        # resumed calls that lost their context: their wait for admission (queue_delay_s)
        self.queue_delays = RecentMean()
        # server, capacity, policy
        self.bpt: float = server.kv_bytes_per_token
        self.bw_out: float = server.swap_out_bytes_per_s
        self.bw_in: float = server.swap_in_bytes_per_s
        self.rates: ServerRates = server.policy_rates()
        self.make_ctx: Callable[..., PauseContext] = context_factory()
        self.policy = policy
        # program order: calls wait in their task's arrival order, not their own
        self.ordered = program_order(policy)
        self.next_rank = 0
        self.oracle: bool = policy.sees_true_latency
        self.run_id = run_id
        self.slot_mode: bool = cap.slot_mode
        self.limit: int = cap.context_limit
        self.total: int = cap.units
        self.free_slots: list[int] = list(range(self.total - 1, -1, -1)) if self.slot_mode else []
        self.free_tok: int = self.total  # token pool: neither held nor cached
        # vLLM, SGLang: the evictable prefix cache and the host tier (None: llama.cpp)
        self.cache: BlockCache | None = BlockCache(
            cap.block_size, cap.host_tokens if cap.host_tokens is not None else 2**62,
            int(w.group.max()) + 1 if len(w.group) else 0
        ) if cap.prefix_cache and not self.slot_mode else None
        if self.cache is not None:
            share_prefixes(self.trajs, w.group.tolist(), w.prefix.tolist(), cap.block_size)
        # vLLM: a call's memory grows as it decodes (None: its whole context from admission);
        # what a call is admitted with, per step
        self.growth: Growth | None = Growth(cast("Engine", self), cap.block_size) if (
            cap.engine == "vllm" and self.cache is not None) else None
        self.adm: list[int] = (self.ctx if self.growth is None
                               else admission_tokens(self.ctx, self.out, cap.block_size))
        # records
        self.sink = sink
        self.rows: list[float] = sink.rows
        self.rb: Any = sink.cols.buf  # per-step fields of the frequent events (steps.py)
        self.flush_rows: int = sink.flush_rows
        self.n_steps = len(self.inp)
        self.g_lo = self.n_steps  # the steps whose fields changed since the last flush
        self.g_hi = -1
        self.cnt = 0  # the next record's seq
        self.r_policy = sink.text("policy")
        self.r_ttl = sink.text("ttl-expired")
        self.r_end = sink.text("trajectory-end")
        self.r_preempted = sink.text("preempted")
        self.r_overflow = sink.text("context-overflow")
        # the pauses' hints: what became of each, and the pin-release valve (.valve)
        self.valve = Valve(cast("Engine", self), rules.pin_release)
        self.texts: dict[str, int] = {}
        # running state
        self.ext: list[Event] = []
        self.t_real = 0.0  # the last external event that did something (not a void one)
        self.queue: deque[Trajectory] = deque()  # waiting for admission
        self.resume_q: deque[Trajectory] = deque()  # token pool: waiting to grow KV they hold
        self.c = Counters()
        self.pauses = 0
        self.preemptions = 0
        self.seq = 0  # tie-break of the event heap
        self.link_out = 0.0  # when each swap link is next free
        self.link_in = 0.0
        self.inflight = 0  # swaps in flight
        self.next_ti = 0  # closed loop: the next root (index into `roots`) to start
        self.fixed, self.f_action, self.f_code, self.f_reason, self.f_wait = fixed_decision(
            policy, run_id, self.texts, sink.text, self.cache is not None)
        # K servers behind a router (harness.simulate.fleet); None: one server, and then the
        # per-server state above (sched, free_slots, free_tok, queue, resume_q, link_out,
        # link_in, inflight, barge) is the only server's, else the active server's
        self.fleet: Fleet | None = None
        # the server's iterations; it calls the transitions back (Engine, this class's only
        # subclass, is what it is built with)
        self.sched = Scheduler(cast("Engine", self), self.costs, self.slot_mode, self.out,
                               self.dcost, self.rb)
        self.sched.noise = server.noise_draws(seed)
        if self.growth is not None:
            self.growth.attach(self.sched)
        # the agents' client: request overheads, the first-token timeout and its message
        controls = self.growth is not None  # vLLM's pause controls are requests (Client)
        self.client = Client(cast("Engine", self), server, len(self.inp), seed,
                             first_token_timeout_s,
                             sink.text(f"timeout: no token within {first_token_timeout_s:g} s")
                             if first_token_timeout_s < INF else 0, self.slot_mode, controls)

    def emit(self, t: float, ev: int, ti: int, step: int, s: int, a: float, b: float,
             c: float) -> None:
        """Append a compact row (an event that is not stored in the per-step fields)."""
        self.rows.extend((self.cnt, t, ev, ti, step, s, a, b, c))
        self.cnt += 1

    def release(self, tr: Trajectory, t: float, reason: int, step: int,
                cached: bool = True) -> None:
        """Free `tr`'s device KV (its slot, or the tokens it holds): erase, kv_state released.
        With a prefix cache, its whole blocks stay cached, never to be matched again (the
        trajectory ended, or its pause dropped it with a fresh cache salt), unless not
        `cached` (an offload's device copy is discarded)."""
        self.emit(t, E_ERASE, tr.ti, step, tr.slot, reason, 0, 0)
        if self.slot_mode:
            self.free_slots.append(tr.slot)
            tr.slot = -1
        else:
            cache = self.cache
            if cache is None:
                self.free_tok += tr.held
            else:
                cache.unpin(tr)
                own = cache.own_part(tr)  # its group holds its prefix
                self.free_tok += own - (cache.leave(-1, own) if cached else 0)
                cache.unshare(tr)
            tr.held = 0
        self.emit(t, E_KV_STATE, tr.ti, -1, -1, 0, 2, 0)

    def leave_cached(self, tr: Trajectory) -> None:
        """Keep-evictable: `tr`'s KV is left to the prefix cache, reusable by its next call
        for as long as nothing evicts it (no erase: the engine frees nothing yet)."""
        cache = self.cache
        assert cache is not None
        cache.unpin(tr)
        own = cache.own_part(tr)
        self.free_tok += own - cache.leave(tr.ti, own)
        tr.held = 0
        cache.unshare(tr)
        tr.state = DROPPED  # its next call is admitted as a new one, reusing what is left

    def grab(self, tr: Trajectory, need: int, t: float) -> bool:
        """Token pool: make `tr` hold the `need` tokens of its next call (its step `tr.pos`),
        if the pool has them at `t`; False (nothing changed) if not. With a prefix cache, what
        the cache still holds of `tr`'s context is reused (whole blocks; the rest of what the
        call keeps is recomputed: `need_rc`), and the cache is evicted for the rest; where
        calls grow, the decoding calls' next tokens come first (Growth.owed)."""
        cache = self.cache
        if cache is None:
            grow = need - tr.held
            if grow > self.free_tok:
                return False
            self.free_tok -= grow
            tr.held = need
            return True
        spare = self.free_tok + cache.tokens - need + tr.held - cache.join_cost(tr)
        if spare < 0 or (self.growth is not None and spare < self.growth.owed(t, spare)):
            return False
        g = tr.pos
        kept = self.kept[g]
        tr.pinned = cache.whole(tr.held)
        if tr.held:  # pinned through the pause: its whole blocks are matched
            tr.need_rc = kept - cache.reusable(kept, self.inp[g])
        elif not tr.host:  # not a swapped context, whose restore brings it back
            # below 0: a first call's tokens found in the group's shared prefix
            hit = cache.reuse(tr, kept, kept + self.inp[g] - 1)
            self.free_tok += cache.freed
            rc = kept - hit
            if rc < 0 or tr.need_rc < rc:
                tr.need_rc = rc
        elif tr.grp >= 0:  # the restore brings its own blocks; the prefix is the group's
            self.free_tok -= cache.share(tr)
        grow = need - tr.held
        if grow > self.free_tok:
            self.free_tok += cache.evict(grow - self.free_tok)
        self.free_tok -= grow
        tr.held = need
        return True

    def swap_out(self, tr: Trajectory, t: float, reason: int) -> None:
        """Offload `tr`'s paused KV (a slot save between iterations, then its link), unless
        the host tier refuses it: then it stays pinned for the rest of the pause."""
        cache = self.cache
        if cache is not None and not cache.reserve_host(tr):
            tr.state = KEPT  # refused: pinned for the rest of the pause
            cache.pin(tr, t)
            if tr.hint >= 0:
                v = self.valve
                v.settle(tr, t, H_REJECTED, v.r_refused, NAN, v.d_host_full)
            return
        tr.swap_reason = reason
        tr.state = SWAPPING
        tr.asked = t
        self.sched.defer(T_SWAP_OUT, tr, 0, 0, t)

    def drop(self, tr: Trajectory, t: float, reason: int) -> None:
        """Erase `tr`'s paused KV between iterations; its next call recomputes what it
        keeps (the rest is discarded)."""
        tr.need_rc = self.kept[tr.pos]
        if self.cache is not None:
            tr.grp = -1  # its calls carry a fresh cache salt from now on: they share nothing
        tr.state = DROPPING
        tr.asked = t
        self.sched.defer(T_DROP, tr, reason, tr.pos - tr.first, t)

    def restored(self, tr: Trajectory) -> None:
        """`tr`'s KV is back from the host tier: with a prefix cache, its whole blocks (one
        prompt token is computed again) and the host copy is consumed."""
        cache = self.cache
        if cache is not None:
            self.forget_host_copy(tr)
            g = tr.pos
            kept = self.kept[g]
            tr.need_rc = kept - cache.reusable(kept, self.inp[g])

    def forget_host_copy(self, tr: Trajectory) -> None:
        """`tr`'s copy in the host tier is consumed (restored) or dropped."""
        cache = self.cache
        if cache is not None:
            cache.host_used -= tr.host
        tr.host = 0

    def free_units(self) -> int:
        """What a pause's policy sees as free: slots, or tokens neither held nor pinned (the
        prefix cache gives its tokens back on demand)."""
        if self.slot_mode:
            return len(self.free_slots)
        cache = self.cache
        return self.free_tok + (cache.tokens if cache is not None else 0)

    def maybe_flush(self) -> None:
        """The scheduler's call, now and then: hand a part's worth of records to the sink."""
        if self.cnt - self.sink.seq >= self.flush_rows:
            self.sink.flush(self.cnt, self.steps_touched())

    def steps_touched(self) -> tuple[int, int]:
        """The steps whose fields changed since the last call, as a range (the writer looks
        for a part's events there only), and start anew."""
        lo, hi = (self.g_lo, self.g_hi + 1) if self.g_hi >= 0 else (0, 0)
        self.g_lo, self.g_hi = self.n_steps, -1
        return lo, hi

    def stamp(self, g: int, f_t: int, t: float, records: int = 1) -> int:
        """Store time `t` and the next seq in step `g`'s fields `f_t` and `f_t + 1` for an
        event of `records` records (its seq and the following ones); returns the step's row."""
        if g < self.g_lo:
            self.g_lo = g
        if g > self.g_hi:
            self.g_hi = g
        row = g * STEP_WIDTH
        rb = self.rb
        rb[row + f_t] = t
        rb[row + f_t + 1] = self.cnt
        self.cnt += records
        return row

    def ask_policy(self, tr: Trajectory, g: int, spawns: bool
                   ) -> tuple[int, int, int, float, bool, int, float]:
        """The policy's decision at `tr`'s pause at tool step `g` (`spawns`: it starts
        sub-agents): action, code, reason text and predicted wait as the loop records them,
        then whether a TTL runs, the action code of its expiry and its length."""
        k = self.cls[g]
        lt, dlt = self.lat[g], self.dl[g]
        # a parent's wait is its sub-agents': not known until they end, even to an oracle
        d = self.policy.decide(self.make_ctx(
            self.run_id, self.ids[tr.ti], self.classes[k],
            dlt * 1000.0 if dlt < INF else None, self.ctx[g], g + 1 < tr.end, self.prio[tr.ti],
            self.hist[k], self.free_units(), self.total, self.rates,
            (lt if lt == lt else None) if self.oracle and not spawns else None,
            self.queue_delays.mean()))
        ttl_s, after, act, code, ri, wait = resolve(d, self.texts, self.sink.text,
                                                    self.cache is not None)
        if ttl_s is None:
            return action_code(act), code, ri, wait, False, 0, 0.0
        return action_code(act), code, ri, wait, True, action_code(after or RECOMPUTE), ttl_s

    def transfer(self, out: bool, tr: Trajectory, t: float) -> None:
        """Start `tr`'s slot save (`out`) or restore of `tr.ret` tokens over its link, FIFO;
        its end is an external event. On slots the server's loop does the transfer itself
        (Scheduler.occupy_loop), and a restore's end is when its answer has come back and the
        call it restored for has reached the server (the client sends it then)."""
        dur = tr.ret * self.bpt / (self.bw_out if out else self.bw_in)
        if self.slot_mode:
            done = self.sched.occupy_loop(t, dur)
            if not out:
                c = self.client
                done += c.overheads[tr.pos] if c.overheads else c.overhead
        elif out:
            done = self.link_out = (self.link_out if self.link_out > t else t) + dur
        else:
            done = self.link_in = (self.link_in if self.link_in > t else t) + dur
        self.inflight += 1
        tr.xfer_ms = dur * 1000
        self.push(done, SWAP_OUT_DONE if out else SWAP_IN_DONE, tr, tr.gen)

    def count_end(self, tr: Trajectory, status: int) -> None:
        """Count `tr`'s end by its status (and tell a fleet, which counts trajectories per
        server)."""
        c = self.c
        if status == 0:
            c.completed += 1
        elif status == 1:
            c.cancelled += 1
        else:
            c.failed += 1
        if self.fleet is not None:
            self.fleet.ended(tr)

    def use(self, tr: Trajectory) -> None:
        """A fleet: make `tr`'s server the one the transitions act on (one server: nothing)."""
        if self.fleet is not None:
            self.fleet.use(tr)

    def kids_done(self, tr: Trajectory, t: float) -> None:
        """The last sub-agent of `tr`'s pause ended at `t`: its tool ends `latency_s` later
        (the trace's residual), the step's deadline notwithstanding (it bounds the children)."""
        g = tr.pos
        lt = self.lat[g]
        self.push(t + (lt if lt == lt else 0.0), TOOL_END, tr, g)

    def occupies_loop(self, tasks: list[tuple[int, Trajectory, int, int]]) -> bool:
        """Whether a save or restore is among the queued control `tasks`."""
        return any(kind in (T_SWAP_OUT, T_RESTORE) for kind, _, _, _ in tasks)

    def push(self, t: float, kind: int, tr: Trajectory, key: int) -> None:
        """Schedule external event `kind` of `tr` at `t`; `key`: the step of the pause it
        belongs to (TOOL_END, DEADLINE, TTL: void once the pause is over), else `tr`'s
        generation (void once the trajectory has ended)."""
        self.seq += 1
        heapq.heappush(self.ext, (t, self.seq, kind, tr, key))

    def preempt(self, t: float) -> bool:
        # Idle server, nothing in transfer, and the first waiting call cannot be admitted:
        # drop the KV of the latest one behind it that holds some (it recomputes when
        # admitted). Only where nothing else ends the stall: with a first-token timeout, the
        # waiting calls time out and fail, releasing what they hold, as on the engines (which
        # never preempt a paused context: it is no running request).
        q = self.resume_q if self.resume_q else self.queue
        if self.client.timeout_s < INF or not self.sched.idle() or self.inflight or len(q) < 2:
            return False
        head = q[0]
        for tr in reversed(q):
            if tr.held and tr is not head:
                if tr.pin_at >= 0 and tr.hint >= 0:  # a pin, released early
                    self.valve.settle(tr, t, H_CLIPPED, self.r_preempted, t - tr.pin_at)
                self.preemptions += 1
                self.release(tr, t, self.r_preempted, tr.pos - tr.first)
                if tr.state == PREEMPTED:  # its call goes on, recomputing the pinned part too
                    tr.pinned = 0
                else:
                    tr.need_rc = self.kept[tr.pos]
                    tr.state = DROPPED
                return True
        return False

    def withdraw(self, tr: Trajectory, t: float) -> None:
        """Take `tr`'s call out of the batch or the queue it is in at `t` (on its own server,
        in a fleet), so that it is never admitted: its trajectory is about to end."""
        self.use(tr)
        if tr.state == RUNNING:
            self.sched.cancel(tr, t)
        elif tr in self.queue:
            self.queue.remove(tr)
        elif tr in self.resume_q:
            self.resume_q.remove(tr)

    def take_out(self, kids: list[int], t: float, out: list[Trajectory]) -> None:
        """Those of `kids` still running, and theirs, into `out` (parents first), each taken
        out of the batch or the queue it is in: their parent is cancelled at `t`, and none of
        them may be admitted as another ends."""
        for ki in kids:
            c = self.trajs[ki]
            if c.state == DONE:
                continue
            out.append(c)
            self.withdraw(c, t)
            nested = self.kids.get(c.pos) if c.kids_left else None
            if nested is not None:
                self.take_out(nested, t, out)
