"""vLLM's memory as its calls grow: blocks allocated as they are needed, and the latest running
call preempted when the pool has none left.

vLLM admits a call with blocks for its prompt and the first token it samples (less what its
prefix cache already holds) and gives a running call its next block when its tokens cross into
it, the running calls before any waiting one at every step. When a running call finds no free
block, the scheduler preempts the call it admitted last: that call's blocks are freed (their
contents stay cached, evictable, so that its readmission hits what is left of them), it goes
back to the head of the waiting queue, and once readmitted it computes its prompt and the
tokens it had produced again, less what is still cached, and decodes the rest. A finished
call's last, partial block is freed (only whole blocks are cached or pinned). A context a pause
pinned (the project's connector holds one extra reference on its blocks) stays held through its
call's preemption. All calls wait in one first-come-first-served queue whose head blocks the
rest (Engine.try_admit), calls resuming onto pinned blocks too: a request holds no computed
tokens when it is queued, so vLLM queues it in `waiting`.

A call crosses into a new block every block-size iterations after its first crossing, so the
blocks an iteration needs are counted per phase (iteration modulo the block size), not per
crossing; a decode run is cut only where the pool would run short before it ends. SGLang and
llama.cpp keep the admission that reserves the output too (Engine.try_admit): SGLang admits
against its running calls' expected remaining output, llama.cpp a slot.

Compiled with mypyc together with harness.simulate.engine (see harness.simulate.native); it
runs unchanged as plain Python.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING

from harness.simulate.trajectory import PREEMPTED, RUNNING, Trajectory

if TYPE_CHECKING:
    from harness.simulate.engine import Engine
    from harness.simulate.scheduler import Scheduler


def admission_tokens(ctx: list[int], out: list[int], block: int) -> list[int]:
    """Per step, what a call is admitted with: the blocks of its prompt and first token."""
    return [-(-(c - o + 1 if o > 0 else c) // block) * block
            for c, o in zip(ctx, out, strict=True)]


class Growth:
    """Allocation as the engine's decoding calls grow, and preemption (see the module
    docstring). Per server of a fleet, its scheduler keeps the state: `xq`, the heap of the
    decoding calls' first crossings; `phase`, how many calls that crossed once cross again at
    each iteration modulo the block size (every block-size iterations after); `charged`, the
    iteration through which their blocks are taken from the pool."""

    def __init__(self, engine: Engine, block: int) -> None:
        self.engine = engine
        self.block = block
        self.admitted = 0  # calls admitted so far: the running list's order
        self.preempted = 0  # running calls preempted
        self.seq = 0

    def admit(self, tr: Trajectory) -> None:
        """`tr`'s call joins the running calls, after those admitted before it."""
        self.admitted += 1
        tr.admitted = self.admitted

    def attach(self, sched: Scheduler) -> None:
        """Grow the calls of `sched`'s server (the engine's, or one of a fleet's)."""
        sched.growth = self
        sched.phase = [0] * self.block

    def take(self, n: int) -> None:
        """`n` tokens from the pool (evicting cached ones where none are free)."""
        e = self.engine
        e.free_tok -= n
        cache = e.cache
        if e.free_tok < 0 and cache is not None:
            e.free_tok += cache.evict(-e.free_tok)

    def start(self, tr: Trajectory, it: int, tokens: int, last: int) -> None:
        """`tr` decodes from iteration `it` + 1 to `last`, with `tokens` tokens so far in the
        blocks it holds: its first crossing, if it has one."""
        tr.dstart = it
        tr.tok0 = tokens
        tr.dlast = last
        tr.phase = -1
        x = it + tr.held - tokens + 1
        if x > last:
            tr.xseq = -1
            return
        self.seq += 1
        tr.xseq = self.seq
        heapq.heappush(self.engine.sched.xq, (x, self.seq, tr))

    def periodic(self, a: int, b: int) -> int:
        """Crossings in iterations a + 1 .. b of the calls that crossed once already."""
        s = self.engine.sched
        full, rest = divmod(b - a, self.block)
        n = full * s.n_phase
        phase = s.phase
        for i in range(a + 1, a + 1 + rest):
            n += phase[i % self.block]
        return n

    def firsts(self, upto: int) -> int:
        """The crossings through iteration `upto` of the calls whose first is pending."""
        b = self.block
        return sum(1 + (upto - x) // b for x, seq, tr in self.engine.sched.xq
                   if x <= upto and tr.xseq == seq)

    def charge(self, upto: int) -> None:
        """Take the blocks the decoding calls cross into through iteration `upto`."""
        s = self.engine.sched
        a = s.charged
        if upto <= a:
            return
        b = self.block
        n = self.periodic(a, upto)
        xq = s.xq
        while xq and (xq[0][0] <= upto or xq[0][2].xseq != xq[0][1]):
            x, seq, tr = heapq.heappop(xq)
            if tr.xseq != seq:
                continue  # it no longer decodes
            n += 1 + (upto - x) // b
            tr.xseq = -1
            tr.phase = x % b
            s.phase[tr.phase] += 1
            s.n_phase += 1
        s.charged = upto
        if n:
            self.take(n * b)

    def leave(self, tr: Trajectory) -> None:
        """`tr` stops decoding: it holds the blocks taken for it so far."""
        s = self.engine.sched
        if tr.phase >= 0:
            s.phase[tr.phase] -= 1
            s.n_phase -= 1
            tr.phase = -1
        tr.xseq = -1
        i = s.charged if s.charged < tr.dlast else tr.dlast
        b = self.block
        n = tr.tok0 + i - tr.dstart
        n = -(-n // b) * b
        if n > tr.held:
            tr.held = n

    def trim(self, tr: Trajectory, tokens: int) -> None:
        """`tr`'s call ended with `tokens` tokens: its last, partial block is freed."""
        spare = tr.held - tokens + tokens % self.block if tokens < tr.held else 0
        if spare > 0:
            self.engine.free_tok += spare
            tr.held -= spare

    def finish(self, tr: Trajectory, it: int) -> None:
        """`tr`'s call produced its last token in iteration `it`."""
        self.leave(tr)
        self.trim(tr, tr.tok0 + it - tr.dstart)

    def owed(self, t: float, spare: int) -> int:
        """What the decoding calls will need by the end of the iteration after the running
        one (they allocate before a waiting call is admitted at a step); 0 when `spare` covers
        any it could be."""
        s = self.engine.sched
        if not s.n_d:
            return 0
        done = s.done_by(t)
        span = done + 2 - s.charged
        if span <= 0:
            return 0
        n = self.periodic(s.charged, done + 2)
        if spare >= self.block * (n + len(s.xq) * (1 + span // self.block)):
            return 0
        return self.block * (n + self.firsts(done + 2))

    def settle(self, tr: Trajectory, t: float) -> None:
        """`tr`'s decoding call leaves the batch at `t` (cancelled)."""
        self.charge(self.engine.sched.done_by(t))
        self.leave(tr)

    def run_length(self, it: int, k: int) -> int:
        """A decode run from iteration `it` of `k` iterations, cut where the pool would run
        short of the blocks its calls cross into."""
        s = self.engine.sched
        a = s.charged  # it + 1: make_room took the first iteration's
        room = self.engine.free_units() // self.block
        if room >= self.periodic(a, it + k) + len(s.xq) * (1 + k // self.block):
            return k
        # at most a block's worth of iterations, where a first crossing is its call's only one
        end = it + k if it + k < a + self.block else a + self.block
        xs = sorted(x for x, seq, tr in s.xq if tr.xseq == seq and x <= end)
        n, f, phase = 0, 0, s.phase
        for i in range(a + 1, end + 1):
            n += phase[i % self.block]
            while f < len(xs) and xs[f] <= i:
                f += 1
            if n + f > room:
                return i - 1 - it if i - 1 > it else 1
        return end - it

    def make_room(self, it: int, t: float) -> bool:
        """Before iteration `it` + 1 (at its boundary, `t`): the blocks the decoding calls cross
        into there, releasing pinned paused contexts first (the pin-release valve, .valve), then
        preempting the call admitted last, until the pool has them. Whether any call was."""
        s = self.engine.sched
        any_preempted = False
        e = self.engine
        if e.free_units() < self.block * (s.n_phase + len(s.xq)):
            while s.n_d and e.free_units() < self.block * (
                    self.periodic(it, it + 1) + self.firsts(it + 1)):
                if not e.valve.relieve(None, t):
                    self.preempt(max(s.hd, key=_admitted), it)
                    any_preempted = True
        self.charge(it + 1)
        return any_preempted

    def preempt(self, entry: tuple[int, int, Trajectory], it: int) -> None:
        """Preempt a decoding call (its entry in the scheduler's heap) after iteration `it`."""
        e = self.engine
        s = e.sched
        end, _, tr = entry
        s.hd.remove(entry)
        heapq.heapify(s.hd)
        s.n_d -= 1
        s.dsum -= s.dcost[tr.pos]
        self.leave(tr)
        tr.oleft = end - it  # tokens it still has to produce (at least one)
        pinned = tr.pinned
        cache = e.cache
        # what a pause pinned stays (its group's shared prefix with it); else the group's
        # prefix is let go after the rest
        rest = tr.held - pinned if pinned or cache is None else cache.own_part(tr)
        cached = cache.leave(tr.ti, rest) if cache is not None else 0
        e.free_tok += rest - cached
        tr.held = pinned
        if not pinned and cache is not None:
            cache.unshare(tr)
        tr.ret = tr.tok0 + it - tr.dstart  # its tokens so far: its readmission's prompt
        tr.state = PREEMPTED
        e.queue.appendleft(tr)  # first in line
        self.preempted += 1

    def readmit(self, tr: Trajectory, t: float) -> bool:
        """Readmit preempted `tr` at `t` if the pool has room for its tokens so far and the next
        one: it reuses what it still holds and what is still cached of the rest, computes the
        others again and decodes on. False: nothing changed."""
        e = self.engine
        cache = e.cache
        known = tr.ret
        b = self.block
        need = -(-(known + 1) // b) * b
        spare = e.free_units() - (need - tr.held) - (cache.join_cost(tr) if cache else 0)
        if spare < 0 or spare < self.owed(t, spare):
            return False
        if not tr.held and cache is not None:
            hit = cache.reuse(tr, known, known - 1)
            e.free_tok += cache.freed
        else:
            own = cache.take(tr.ti) if cache is not None else 0
            cap = (known - 1) - (known - 1) % b - tr.held
            used = own if own < cap else (cap if cap > 0 else 0)
            e.free_tok += own - used
            hit = tr.held + used
            tr.held = hit
        self.take(need - tr.held)
        tr.held = need
        tr.rem = known - hit if known > hit else 1
        tr.ppos = known - tr.rem
        self.admit(tr)
        tr.state = RUNNING
        s = e.sched
        s.pre.append(tr)
        s.wake(t)
        return True


def _admitted(entry: tuple[int, int, Trajectory]) -> int:
    return entry[2].admitted
