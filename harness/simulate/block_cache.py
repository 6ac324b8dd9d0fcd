"""An engine's paged prefix cache, as the simulator models vLLM's and SGLang's.

Device KV is allocated in blocks of `block` tokens. Blocks no running call and no pause policy
references stay cached but evictable: they are reused by a later call whose prompt starts with
them, and taken, least recently freed first, when an allocation finds no free block. That is
vLLM's free block queue (a request's blocks are freed in reverse order, so the tail of a context
goes first) and SGLang's radix cache (least recently used leaves first, again a context's tail).

The simulator keeps no token contents: a trajectory's KV is its own, but for the prefix its
trajectory's prefix group shares (the trace's prefix_group and prefix_tokens: one canonical
sequence per group, of which each trajectory's first call starts with its own length). The
cache is one entry per context left to it, in the order they were freed:
  - a paused context left to the cache (keep-evictable) under its trajectory's index: what a
    later call of the trajectory may reuse, whole blocks only, shortened from its tail as the
    cache evicts it; of a trajectory that shares a prefix, the blocks after that prefix;
  - a context that can never be matched again (its trajectory ended, or its pause dropped it
    with a fresh cache salt: recompute, a TTL's expiry) under a negative key: memory the cache
    gives back when asked, in its turn;
  - a group's shared prefix that no trajectory holds any more, under GROUP_KEY0 - group: left
    after the context of the last one that held it (a context's head is freed last), matched
    by any later call of the group as far as it is left.
While trajectories of a group hold KV, their prefix is held once, for all of them (`g_span`:
the longest prefix any of them brought; one that leaves does not shorten it).
Pinned contexts (keep, ttl before expiry) and running calls hold their blocks outside it; the
pinned paused contexts are listed (`pins`), for the pin-release valve (EngineState.relieve) to
give back, in its order, when they fill the pool.

The host tier of a swap (vLLM's offload through the project's connector) has a capacity of its
own, in tokens: an offload that does not fit is refused and the context stays pinned.

Compiled with mypyc with the event loop (harness.simulate.native); runs unchanged as Python.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, insort
from collections import OrderedDict
from typing import Final

from harness.policies.pin_release import LATEST_PROGRAM, LRU
from harness.simulate.trajectory import KEPT, Trajectory

GROUP_KEY0: Final = -(1 << 40)  # a group's cached shared prefix: key GROUP_KEY0 - group


class BlockCache:
    """The evictable part of one server's KV pool (see the module docstring). `tokens` counts
    the evictable tokens; the engine counts the free and the held ones."""

    def __init__(self, block: int, host_tokens: int, groups: int = 0) -> None:
        if block < 1:
            raise ValueError(f"block size must be >= 1, got {block}")
        self.block = block
        self.lru: OrderedDict[int, int] = OrderedDict()  # key -> tokens, oldest first
        self.tokens = 0
        self.next_dead = -1
        self.host_cap = host_tokens  # the host tier's capacity (tokens)
        self.host_used = 0
        self.evicted = 0  # tokens taken from the cache to make room
        self.refused = 0  # offloads refused: the host tier was full
        # per prefix group: the shared prefix held for the trajectories that hold it (tokens;
        # 0 while none does), and how many do
        self.g_span = [0] * groups
        self.g_users = [0] * groups
        self.freed = 0  # what the last `reuse` gave back to the pool (below 0: took)
        # the pinned paused contexts (trajectory index -> it), what each held beyond its
        # group's shared prefix when pinned, and their sum (what releasing all gives back)
        self.pins: dict[int, Trajectory] = {}
        self.pin_tokens: dict[int, int] = {}
        self.pinned = 0
        # the pins by arrival, (arrived, index) ascending: `releasable` counts from the latest
        # and stops at the first that arrived too early
        self.by_arrival: list[tuple[float, int]] = []
        # the pins in the valve's order (latest-program, lru: keys fixed while pinned), for
        # `victim`: (key, id, index, pin_at), least first; an entry whose pin ended is left
        # until it surfaces (its pin_at no longer the trajectory's). Built at the first
        # `victim` (`heap_order`: the order it holds; "" none), with the trajectory ids.
        self.heap: list[tuple[float, str, int, float]] = []
        self.heap_order = ""
        self.heap_ids: list[str] = []

    def whole(self, n: int) -> int:
        """`n` tokens rounded down to whole blocks."""
        return n - n % self.block

    def reusable(self, kept: int, appended: int) -> int:
        """What a call keeping `kept` tokens of context and adding `appended` can reuse at
        most: whole blocks of what it keeps, leaving at least one prompt token to compute."""
        last = kept + appended - 1
        return self.whole(kept if kept < last else last)

    def leave(self, key: int, tokens: int) -> int:
        """Leave a context of `tokens` to the cache: its whole blocks, under `key` (a
        trajectory's index: reusable; -1: never matched again). Returns the tokens cached
        (the caller frees the rest: a partial block is not cached)."""
        n = self.whole(tokens)
        if n <= 0:
            return 0
        if key < 0:
            key = self.next_dead
            self.next_dead -= 1
        else:
            # the trajectory's call took whatever this server had cached for it: an entry
            # left here is always its newest context (a prefix of it would be its own blocks)
            self.tokens -= self.lru.pop(key, 0)
        self.lru[key] = n
        self.tokens += n
        return n

    def take(self, key: int) -> int:
        """The tokens cached under `key`, taken out of the cache (its owner's call resumes)."""
        n = self.lru.pop(key, 0)
        self.tokens -= n
        return n

    def evict(self, need: int) -> int:
        """Free at least `need` tokens (whole blocks, least recently freed entries first, an
        entry's tail first) or all there are; returns the tokens freed."""
        lru, block = self.lru, self.block
        freed = 0
        while freed < need and lru:
            key = next(iter(lru))
            n = lru[key]
            want = need - freed
            want += (block - want % block) % block
            if want >= n:
                del lru[key]
                freed += n
            else:
                lru[key] = n - want  # keeps its place: still the oldest
                freed += want
        self.tokens -= freed
        self.evicted += freed
        return freed

    def shared_cost(self, g: int, p: int) -> int:
        """What a trajectory joining group `g` with a prefix of `p` tokens (whole blocks)
        takes from the pool (free or cached tokens): the blocks of it not held yet, and the
        group's cached prefix when no trajectory holds it (it leaves the cache)."""
        if self.g_users[g]:
            s = self.g_span[g]
            return p - s if p > s else 0
        s = self.lru.get(GROUP_KEY0 - g, 0)
        return s if s > p else p

    def join(self, g: int, p: int) -> int:
        """A trajectory with a prefix of `p` tokens (whole blocks) of group `g`'s holds it
        from now on: the tokens of it that were there (held for others, or cached). The group
        then holds at least `p` (the caller takes the rest, `p` less those, from the pool)."""
        s = self.g_span[g] if self.g_users[g] else self.take(GROUP_KEY0 - g)
        self.g_users[g] += 1
        self.g_span[g] = s if s > p else p
        return s if s < p else p

    def part(self, g: int) -> None:
        """A trajectory of group `g` lets its prefix go; the last one's goes to the cache,
        after what that trajectory left there."""
        self.g_users[g] -= 1
        if not self.g_users[g]:
            n = self.g_span[g]
            self.g_span[g] = 0
            if n:
                self.lru[GROUP_KEY0 - g] = n
                self.tokens += n

    def own_part(self, tr: Trajectory) -> int:
        """The tokens `tr` holds beyond the shared prefix its group holds for it."""
        return tr.held - (tr.pre if tr.sg >= 0 else 0)

    def share(self, tr: Trajectory) -> int:
        """`tr`, holding nothing, holds its group's shared prefix from now on (tr.held: its
        length); returns the tokens that takes from the pool (those of it not there)."""
        p = tr.pre
        tr.sg = tr.grp
        tr.held = p
        return p - self.join(tr.grp, p)

    def unshare(self, tr: Trajectory) -> None:
        """`tr` no longer holds its group's shared prefix (what it left of the rest of its
        context is in the cache already, before the prefix, should it be the last)."""
        if tr.sg >= 0:
            self.part(tr.sg)
            tr.sg = -1

    def join_cost(self, tr: Trajectory) -> int:
        """What `tr`, holding nothing, joining its group's shared prefix changes in the pool
        its call takes (below 0: the prefix held for others saves it that much)."""
        if tr.grp < 0 or tr.held:
            return 0
        return self.shared_cost(tr.grp, tr.pre) - tr.pre

    def reuse(self, tr: Trajectory, kept: int, last: int) -> int:
        """`tr`, holding nothing, takes what the cache has of its context: its group's shared
        prefix (`share`) and its own cached blocks after it, up to `kept` tokens (the shared
        prefix up to `last`). Returns the tokens matched; `tr` holds its prefix and its own
        blocks matched, the rest of its entry is freed. `freed`: what the pool gets back (the
        prefix's missing blocks taken; below 0 the caller evicts for it with the call's need)."""
        base = m = freed = 0
        if tr.grp >= 0:
            freed = -self.share(tr)
            base = tr.pre
            m = base + freed  # of the prefix, what was there
        own = self.take(tr.ti)
        cap = self.whole(last if last < kept or last < m else (kept if kept > m else m))
        whole_prefix = m == base  # else the blocks after the prefix cannot match either
        total = base + own if whole_prefix else m
        hit = total if total < cap else (cap if cap > 0 else 0)
        used = hit - base if whole_prefix and hit > base else 0
        self.freed = freed + own - used
        tr.held = base + used
        return hit

    def reserve_host(self, tr: Trajectory) -> bool:
        """Room in the host tier for `tr`'s offload (its whole blocks), reserved; False: the
        tier is full and the offload is refused (counted)."""
        n = self.whole(tr.ret)
        if not self.host_fits(n):
            self.refused += 1
            return False
        self.host_used += n
        tr.host = n
        return True

    def host_fits(self, tokens: int) -> bool:
        """Whether an offload of `tokens` fits in the host tier now."""
        return self.host_used + tokens <= self.host_cap


    def pin(self, tr: Trajectory, t: float) -> None:
        """`tr`'s paused context, held out of eviction from `t` on, is a pin."""
        if tr.pin_at < 0:
            self.pins[tr.ti] = tr
            own = self.own_part(tr)
            self.pin_tokens[tr.ti] = own
            self.pinned += own
            tr.pin_at = t
            insort(self.by_arrival, (tr.arrived, tr.ti))
            if self.heap_order:
                heapq.heappush(self.heap, self._entry(tr))

    def unpin(self, tr: Trajectory) -> None:
        """`tr` holds no pin any more."""
        if self.pins.pop(tr.ti, None) is not None:
            # what was counted when pinned (its context may have changed since: a call
            # admitted onto it grows it before the pin ends)
            self.pinned -= self.pin_tokens.pop(tr.ti)
            by_arrival = self.by_arrival
            del by_arrival[bisect_left(by_arrival, (tr.arrived, tr.ti))]
        tr.pin_at = -1.0

    def releasable(self, keep: Trajectory | None, after: float, cap: int) -> int:
        """The tokens that releasing every pin the valve may release (but `keep`'s; only those
        of trajectories that arrived after `after`) gives back to the pool: what they held
        beyond their groups' shared prefixes when pinned; counted up to `cap` (the sum once it
        reaches `cap`: a scan of the pins, the latest arrival first, stops there, or at the first
        pin that arrived too early)."""
        total = 0
        tokens, pins, by_arrival = self.pin_tokens, self.pins, self.by_arrival
        i = len(by_arrival) - 1
        while i >= 0:
            arrived, ti = by_arrival[i]
            if arrived <= after:
                break
            p = pins[ti]
            if p.state == KEPT and p is not keep:
                total += tokens[ti]
                if total >= cap:
                    break
            i -= 1
        return total

    def _entry(self, p: Trajectory) -> tuple[float, str, int, float]:
        """`p`'s place in the heap: least first (latest-program: the latest arrival; lru: the
        oldest pin), ties by trajectory id, as harness.policies.pin_release orders them."""
        key = -p.arrived if self.heap_order == LATEST_PROGRAM else p.pin_at
        return key, self.heap_ids[p.ti], p.ti, p.pin_at

    def victim(self, keep: Trajectory | None, order: str, ids: list[str],
               after: float = -1.0) -> Trajectory | None:
        """The pin the valve releases first under `order` (harness.policies.pin_release),
        never `keep`'s (the trajectory being admitted), only of a trajectory that arrived after
        `after`; None: there is none. Latest-program and lru from a heap of the pins (O(log n)
        a release: the valve may release once per iteration of a full pool), largest by a
        scan (a pin's size may change while it is held)."""
        if order == LATEST_PROGRAM or (order == LRU and after < 0):
            return self._first_in_heap(keep, order, ids, after)
        return self._scan(keep, order, ids, after)

    def _first_in_heap(self, keep: Trajectory | None, order: str, ids: list[str],
                       after: float) -> Trajectory | None:
        pins = self.pins
        if self.heap_order != order or len(self.heap) > 2 * len(pins) + 64:
            # (re)built from the pins: the first call, or stale entries outnumber live ones
            self.heap_order, self.heap_ids = order, ids
            self.heap = [self._entry(p) for p in pins.values()]
            heapq.heapify(self.heap)
        heap = self.heap
        passed: list[tuple[float, str, int, float]] = []
        best: Trajectory | None = None
        while heap:
            entry = heap[0]
            p = pins.get(entry[2])
            if p is None or p.pin_at != entry[3]:  # its pin ended (or is a newer one's)
                heapq.heappop(heap)
                continue
            if p.arrived <= after:  # latest-program: every later entry arrived no later
                break
            if p.state != KEPT or p is keep:
                passed.append(heapq.heappop(heap))
                continue
            best = p
            break
        for entry in passed:
            heapq.heappush(heap, entry)
        return best

    def _scan(self, keep: Trajectory | None, order: str, ids: list[str],
              after: float) -> Trajectory | None:
        best: Trajectory | None = None
        best_key = 0.0
        for p in self.pins.values():
            if p.state != KEPT or p is keep or p.arrived <= after:
                continue
            # harness.policies.pin_release's orders, as one number each (larger goes first)
            key = (p.arrived if order == LATEST_PROGRAM else -p.pin_at if order == LRU
                   else float(-(-p.held // self.block)))
            if best is None or key > best_key or (key == best_key
                                                  and ids[p.ti] < ids[best.ti]):
                best, best_key = p, key
        return best


def share_prefixes(trajs: list[Trajectory], group: list[int], prefix: list[int],
                   block: int) -> None:
    """A prefix-cache engine: each trajectory's prefix group and the whole blocks of its first
    call (`prefix` tokens) that the group shares (none under a block)."""
    for tr, g, p in zip(trajs, group, prefix, strict=True):
        if g >= 0 and p >= block:
            tr.grp, tr.pre = g, p - p % block
