"""The engine model's pin-release valve, and what became of each pause's hint.

A pause that keeps its context (keep, or a ttl before its expiry) pins it: its blocks are held
out of the prefix cache's eviction (harness.simulate.block_cache lists the pins). Pins that fill
the pool would stall the engine: a waiting call could never be admitted, a running one never
grow. Engines do not deadlock so: Continuum unpins the pins of the program that arrived last
when nothing fits, vLLM preempts. Here, where the engine cannot admit a waiting call
(Engine.try_admit, before it preempts a waiting context) or grow its running calls (vLLM's
Growth.make_room, before it preempts a running call), `relieve` releases pins in the declared
order (harness.policies.pin_release: `latest-program`, `lru`, `largest`) until it can, never the
pin of the call being admitted. A released pin's blocks go to the evictable cache, where a
resume that comes soon may still hit them; its trajectory resumes as after keep-evictable. To
admit a call, the valve opens only when releasing every other pin would make room for it: else
the call waits for the running calls, as it would with nothing pinned. Under `latest-program`
(programs first come, first served, as Continuum serves them) those are only the pins of
trajectories that arrived after the call's own while any call runs: an earlier program's pin
is taken for a later program's call only when nothing else would end the stall (as the vLLM
connector's valve does: a trajectory is its session there).

Every pause that sends the server a hint (keep, swap, recompute, ttl: not keep-evictable, as
the replay's harness.replay.hints) gets one hint_outcome record (`settle`): `clipped` when its
pin was released early (by the valve, or a waiting context's preemption), with how long it
was held; `rejected` when the engine refused it (an offload the host tier had no room for);
else `accepted`, at the resume (or at the trajectory's end).

Compiled with mypyc together with harness.simulate.engine (see harness.simulate.native); it
runs unchanged as plain Python.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from harness.policies.pin_release import (
    ACCEPTED,
    CLIPPED,
    DEFERRED,
    DEFERRED_AFTER_S,
    HINT_OUTCOMES,
    LATEST_PROGRAM,
    REJECTED,
)
from harness.simulate.decode import E_KV_STATE, KV_STATUSES
from harness.simulate.trajectory import (
    F_HO_CODE,
    F_HO_DETAIL,
    F_HO_HELD,
    F_HO_T,
    PREEMPTED,
    Trajectory,
)

if TYPE_CHECKING:
    from harness.simulate.engine import Engine

# a hint's outcome as the loop records it: an index into HINT_OUTCOMES
H_ACCEPTED: Final = HINT_OUTCOMES.index(ACCEPTED)
H_CLIPPED: Final = HINT_OUTCOMES.index(CLIPPED)
H_DEFERRED: Final = HINT_OUTCOMES.index(DEFERRED)
H_REJECTED: Final = HINT_OUTCOMES.index(REJECTED)
KV_EVICTABLE: Final = KV_STATUSES.index("evictable")  # a kv_state: left to the cache
NAN: Final = float("nan")


class Valve:
    """The pin-release valve of one engine (of every server of a fleet: the pins are each
    server's cache's) under `order`, and the hint outcomes it records."""

    def __init__(self, engine: Engine, order: str) -> None:
        self.engine = engine
        self.order = order
        self.released = 0  # pins released
        text = engine.sink.text
        self.r_valve = text(f"valve: {order}")
        self.r_resumed = text("resumed")
        self.r_end = text("trajectory-end")
        self.r_refused = text("refused")
        self.d_host_full = text("host tier full")
        self.r_late = text("applied late")

    def relieve(self, tr: Trajectory | None, t: float) -> bool:
        """The engine cannot admit `tr` at `t` (None: grow its running calls): release the first
        pin in the declared order, never `tr`'s; to admit `tr`, only if releasing every other
        pin would make room for it. Whether a pin was released; O(1) while none is held."""
        e = self.engine
        cache = e.cache
        if cache is None or not cache.pins:
            return False
        after = -1.0
        if tr is not None:
            # Continuum's programs first come, first served: a call waits for the running
            # calls rather than take an earlier program's pin, unless nothing runs
            if self.order == LATEST_PROGRAM and not e.sched.idle():
                after = tr.arrived
            b = cache.block
            need = e.adm[tr.pos] if tr.state != PREEMPTED else -(-(tr.ret + 1) // b) * b
            short = need - e.free_units() - tr.held + cache.join_cost(tr)
            if cache.pinned < short:  # all the pins together could not make room
                return False
            # enough once it covers the shortfall and what the decoding calls may owe
            owed_max = e.growth.owed(t, 0) if e.growth is not None else 0
            spare = cache.releasable(tr, after, short + owed_max) - short
            if spare < 0 or (e.growth is not None and spare < e.growth.owed(t, spare)):
                return False
        p = cache.victim(tr, self.order, e.ids, after)
        if p is None:
            return False
        held, held_s = p.held, t - p.pin_at
        e.leave_cached(p)  # unpinned; it resumes as after keep-evictable
        e.emit(t, E_KV_STATE, p.ti, -1, -1, held, KV_EVICTABLE, 0)
        if p.hint >= 0:
            self.settle(p, t, H_CLIPPED, self.r_valve, held_s)
        self.released += 1
        return True

    def settle(self, tr: Trajectory, t: float, outcome: int, reason: int, held_s: float = NAN,
               detail: int = 0) -> None:
        """Record at `t` what became of the hint `tr`'s pause (its step `tr.hint`) sent:
        `outcome` (H_*), why (a text), how long it was held (clipped) and a detail text. An
        accepted hint whose offload or drop the engine applied DEFERRED_AFTER_S or more after
        it was asked (a task waiting for the running iteration's end) is deferred, with that
        delay in the held field's place (decode: hint_delay_s)."""
        if outcome == H_ACCEPTED and tr.late >= DEFERRED_AFTER_S:
            outcome, reason, held_s = H_DEFERRED, self.r_late, tr.late
        tr.late = 0.0
        e = self.engine
        row = e.stamp(tr.hint, F_HO_T, t)
        tr.hint = -1
        rb = e.rb
        rb[row + F_HO_CODE] = outcome + 8 * reason
        rb[row + F_HO_HELD] = held_s
        rb[row + F_HO_DETAIL] = detail
