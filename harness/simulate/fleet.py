"""K identical servers behind a router: `harness simulate --servers K --router R`.

Each server is the single-server model of harness.simulate.engine, with the same calibration
and the same capacity (`--slots`/`--ctx-per-slot` or `--capacity-tokens` apply to each). The
servers share one event loop and clock, the trajectories, the records and the policy with its
latency history (the policy is the client's, as in a replay; a pause's context shows the free
memory of the server that holds the trajectory). The engine's per-server state (its scheduler,
free slots or tokens, admission queues, swap links) is that of the server a transition is about:
`Fleet` swaps it in before the engine acts, and each server has its own `Scheduler`.

Routers (every LLM call is routed once, when it asks for admission):

- `round-robin`: each call goes to the next server in turn (one counter over all calls, first
  calls included), as a stateless load balancer does. A resumed call that lands on another server
  than its previous call finds no KV there: its whole kept context is prefilled again (recorded
  as a `recompute`), and what it held on the old server is released there at once (`erase`,
  reason `router-moved`); a copy swapped out to the old server's host tier is forgotten.
- `prefix-affinity`: every call of a trajectory goes to the server of its first call; a first
  call (a root's, or a sub-agent's: sub-agents are placed by the same rule and may land on another
  server than their parent) goes to the server with the fewest trajectories assigned and not yet
  ended, ties to the lowest index. Not a hash of the trace's `prefix_group`: the simulator models
  no prefix shared across trajectories (a trajectory's KV is its own), so grouping by prefix
  would buy no reuse here and could only unbalance the servers.

Records: each `call_end`'s `reason` names the server that served the call (`server-0`, ...), as
a replay records the worker that served it, so summary.json's `routing` (resumed calls that
stayed on their server or moved) reads a simulated fleet as it reads a real one. One server runs
no fleet at all: its results are exactly the single-server simulation's.

Approximations: the release on the old server happens when the call is routed, not at the end of
that server's running iteration as a policy's drop does; a context overflow (a call longer than
a server's context limit) fails on whichever server it is routed to, and its `call_end` names none.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass
from typing import Any

from harness.errors import InputError
from harness.simulate.block_cache import BlockCache
from harness.simulate.engine import Engine
from harness.simulate.scheduler import FLUSH_EVERY, INF, Event, Scheduler
from harness.simulate.trajectory import DROPPED, F_SRV, STEP_WIDTH, Trajectory

ROUND_ROBIN = "round-robin"
PREFIX_AFFINITY = "prefix-affinity"
ROUTERS = (ROUND_ROBIN, PREFIX_AFFINITY)
NOISE_STRIDE = 7919  # a prime: where each server starts in the drawn noise
MOVED_REASON = "router-moved"  # the erase of a KV left behind on the server a call moved from


def server_name(k: int) -> str:
    """Server k's name in the records (a call_end's `reason`)."""
    return f"server-{k}"


def check_fleet(servers: int, router: str) -> None:
    """K >= 1 servers and a known router, else InputError (the CLI's one-line error)."""
    if servers < 1:
        raise InputError(f"--servers must be an integer >= 1, got {servers}")
    if router not in ROUTERS:
        raise InputError(f"--router must be one of {', '.join(ROUTERS)}, got {router!r}")


@dataclass
class _Server:
    """One server's share of the engine's state (Engine's attributes of the same names), held
    here while another server is the active one."""

    sched: Scheduler
    free_slots: list[int]
    free_tok: int
    queue: deque[Trajectory]
    resume_q: deque[Trajectory]
    cache: BlockCache | None
    link_out: float = 0.0
    link_in: float = 0.0
    inflight: int = 0
    barge: bool = False


class Fleet:
    """K servers behind `router` (see the module docstring). Give it to
    harness.simulate.engine.simulate, which binds it to its engine; read `report` after."""

    def __init__(self, servers: int, router: str = ROUND_ROBIN) -> None:
        check_fleet(servers, router)
        self.k = servers
        self.router = router
        self.affinity = router == PREFIX_AFFINITY
        self.next_rr = 0  # round-robin: the server of the next call
        self.active = 0  # the server whose state the engine holds
        self.servers: list[_Server] = []
        self.home: list[int] = []  # per trajectory: the server of its latest call (-1: none yet)
        self.load = [0] * servers  # trajectories whose latest call went there and not ended
        self.calls = [0] * servers  # calls routed to each server
        self.stayed = 0  # resumed calls routed to the server of their previous call
        self.moved = 0  # ... and to another
        self.names: list[float] = []  # each server's name, as the records' text index
        self.r_moved = 0
        self.e: Engine

    def bind(self, e: Engine) -> None:
        """Serve `e`'s trajectories: server 0 is the state `e` was built with, the others start
        empty, each with a scheduler of its own."""
        self.e = e
        # one front end for K servers would queue their requests together: not modelled here
        e.client.fe_turn = e.client.fe_in = e.client.fe_out = 0.0
        # nor one way's wake for K servers: it stays in each server's first iteration after idle
        way, e.client.way_curve = e.client.way_curve, ()
        self.home = [-1] * len(e.trajs)
        self.names = [float(e.sink.text(server_name(k))) for k in range(self.k)]
        self.r_moved = e.sink.text(MOVED_REASON)
        e.sched.wake_way(way)
        self.servers = [_Server(e.sched, e.free_slots, e.free_tok, e.queue, e.resume_q,
                                e.cache)]
        c = e.cache
        for n in range(1, self.k):
            sched = Scheduler(e, e.costs, e.slot_mode, e.out, e.dcost, e.rb)
            # the same drawn noise, from another place in it (servers not in step)
            sched.noise, sched.noise_i = e.sched.noise, n * NOISE_STRIDE
            sched.wake_way(way)
            if e.growth is not None:  # it acts on the active server's state
                e.growth.attach(sched)
            self.servers.append(_Server(
                sched, list(range(e.total - 1, -1, -1)) if e.slot_mode else [], e.total,
                deque(), deque(),
                None if c is None else BlockCache(c.block, c.host_cap, len(c.g_users))))
        self.active = 0
        e.fleet = self

    def activate(self, k: int) -> None:
        """Make server k's state the engine's, keeping the active server's here."""
        if k == self.active:
            return
        e, s, n = self.e, self.servers[self.active], self.servers[k]
        s.sched, s.free_slots, s.free_tok, s.queue, s.resume_q, s.cache = (
            e.sched, e.free_slots, e.free_tok, e.queue, e.resume_q, e.cache)
        s.link_out, s.link_in, s.inflight, s.barge = e.link_out, e.link_in, e.inflight, e.barge
        e.sched, e.free_slots, e.free_tok, e.queue, e.resume_q, e.cache = (
            n.sched, n.free_slots, n.free_tok, n.queue, n.resume_q, n.cache)
        e.link_out, e.link_in, e.inflight, e.barge = n.link_out, n.link_in, n.inflight, n.barge
        self.active = k

    def use(self, tr: Trajectory) -> None:
        """The engine's call: act on `tr`'s server (that of its latest call), if it has one."""
        h = self.home[tr.ti]
        if h >= 0:
            self.activate(h)

    def choose(self, tr: Trajectory) -> int:
        """The server of `tr`'s next call (the router's rule)."""
        if self.affinity:
            h = self.home[tr.ti]
            if h >= 0:
                return h
            load = self.load
            return load.index(min(load))  # the least loaded, the lowest index on ties
        k = self.next_rr
        self.next_rr = (k + 1) % self.k
        return k

    def route(self, tr: Trajectory, t: float) -> None:
        """The engine's call for `tr`'s next call at `t`: pick its server, move what it holds
        if the server changes, and ask that server (Engine.request_here); the server active
        before is active again after."""
        e = self.e
        prev = self.active
        k = self.choose(tr)
        old = self.home[tr.ti]
        if old >= 0:  # a resumed call
            if k == old:
                self.stayed += 1
            else:
                self.moved += 1
                self._leave(tr, old, t)
            self.load[old] -= 1
        self.load[k] += 1
        self.home[tr.ti] = k
        self.calls[k] += 1
        e.rb[tr.pos * STEP_WIDTH + F_SRV] = self.names[k]  # its call_end's reason
        self.activate(k)
        e.request_here(tr, t)
        self.activate(prev)

    def _leave(self, tr: Trajectory, old: int, t: float) -> None:
        # The new server holds nothing of tr: its call prefills what it keeps of the context
        # again, and the KV it kept on the old server is released there (which may admit a
        # waiter there). A dropped or swapped KV holds no device memory to release; a copy in
        # the old server's host tier is dropped. What the old server's prefix cache holds of
        # it stays there, reusable should a later call come back.
        e = self.e
        g = tr.pos
        if tr.slot >= 0 or tr.held or tr.host:
            self.activate(old)
            if tr.host:
                e.forget_host_copy(tr)
            if tr.slot >= 0 or tr.held:
                e.release(tr, t, self.r_moved, g - 1 - tr.first)  # the pause's step
                e.try_admit(t)
        tr.state = DROPPED
        if e.cache is None:
            tr.need_rc = e.kept[g]
        # else the new server's prefix cache decides what is reused (Engine.grab), unless the
        # pause dropped the context under a fresh cache salt (need_rc already all of it)

    def caches(self) -> list[BlockCache | None]:
        """Every server's prefix cache (None: an engine without one)."""
        self.servers[self.active].cache = self.e.cache
        return [s.cache for s in self.servers]

    def ended(self, tr: Trajectory) -> None:
        """The engine's call: `tr` ended (it stays on its server for what is still due there,
        e.g. a swap in flight, but no longer counts in the server's load)."""
        h = self.home[tr.ti]
        if h >= 0:
            self.load[h] -= 1

    def run(self, ext: list[Event]) -> tuple[int, float]:
        """Scheduler.run over K servers: the external events (a heap) and every server's
        iteration boundaries in time order; at one instant external events first, then the
        servers by index. Returns (events, the last time anything happened)."""
        e, home, k_all = self.e, self.home, self.k
        scheds = [s.sched for s in self.servers]
        events = 0
        t_busy = 0.0
        while True:
            events += 1
            k, ts = 0, scheds[0].t_srv
            for j in range(1, k_all):
                tj = scheds[j].t_srv
                if tj < ts:
                    k, ts = j, tj
            if ext and ext[0][0] <= ts:
                t, _, kind, tr, key = heapq.heappop(ext)
                h = home[tr.ti]
                if h >= 0:  # else an arrival: its call is routed
                    self.activate(h)
                e.external(kind, tr, key, t)
            elif ts < INF:
                t_busy = ts
                self.activate(k)
                scheds[k].boundary(ts)
            else:
                break
            if not events % FLUSH_EVERY:
                e.maybe_flush()
        return events, max(t_busy, e.t_real)

    def report(self) -> dict[str, Any]:
        """What the router did, for run.json's `simulator`: calls per server, and how many
        resumed calls stayed on the server of their previous call."""
        resumed = self.stayed + self.moved
        return {"calls_per_server": list(self.calls), "resumed_calls": resumed,
                "resumed_same_server": self.stayed,
                "same_server_share": self.stayed / resumed if resumed else None}


def fleet_line(servers: int, router: str, routing: dict[str, Any]) -> str:
    """One line on what the router did (run.json's simulator.routing)."""
    share = routing["same_server_share"]
    stayed = "no resumed calls" if share is None else (
        f"{routing['resumed_same_server']} of {routing['resumed_calls']} resumed calls "
        f"({share:.0%}) stayed on their server")
    calls = "/".join(str(n) for n in routing["calls_per_server"])
    return f"{servers} servers, {router}: {stayed}; calls per server {calls}"
