"""The policy interface: a pause contract in, a decision out.

A policy sees what a serving layer could know at a pause (the pause contract, this tool class's
latency history in the run so far, the server's state and measured rates), never the injected
latency itself, except a policy that declares itself an oracle.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

# What a pause can do with a context.
KEEP = "keep"  # held, pinned: out of the engine's eviction until resumed or released
KEEP_EVICTABLE = "keep-evictable"  # left to the engine's own prefix cache, which may evict it
SWAP = "swap"  # offloaded to host memory (or a file) and restored for the resumed call
RECOMPUTE = "recompute"  # dropped; the resumed call prefills the whole context again
ACTIONS = (KEEP, SWAP, RECOMPUTE)  # what the slot model (analytical, simulator) prices
PAUSE_ACTIONS = (KEEP, KEEP_EVICTABLE, SWAP, RECOMPUTE)  # what a runtime may execute


@dataclass(frozen=True)
class ServerRates:
    """Rates a policy may use to price its options; measured on the server as the run goes."""

    prefill_tok_s: float
    swap_bytes_per_s: float
    kv_bytes_per_token: float

    def restore_s(self, tokens: int) -> float:
        """Seconds to swap `tokens` of KV back in; infinite where the engine has no swap (a
        calibration's null swap rates: bandwidth 0), so a policy that prices it never picks it."""
        if self.swap_bytes_per_s <= 0:
            return math.inf
        return tokens * self.kv_bytes_per_token / self.swap_bytes_per_s

    def recompute_s(self, tokens: int) -> float:
        """Seconds to re-prefill `tokens`."""
        return tokens / self.prefill_tok_s


@dataclass(frozen=True)
class PauseContext:
    """What a policy may see at a pause (the pause contract plus run-local observations)."""

    run_id: str
    trajectory_id: str
    tool_class: str
    deadline_ms: float | None
    retained_tokens: int
    resume_required: bool
    priority: str
    # The tool class's observed latencies up to now, oldest first (the last DEFAULT_WINDOW of
    # them). Valid while decide() runs: the replay and the simulator pass their live history,
    # so a policy that wants to keep it copies it.
    history_s: Sequence[float] = field(default_factory=tuple)
    free_slots: int = 0
    total_slots: int = 1
    rates: ServerRates | None = None
    true_latency_s: float | None = None  # filled in only for policies with sees_true_latency
    # The mean wait, over the run's recent resumed calls whose context was not held through
    # their pause, between the call reaching the server and its prefill starting (None until
    # one is measured): what losing a context costs in queueing, beside its reload.
    queue_delay_s: float | None = None


@dataclass(frozen=True)
class Decision:
    """A policy's choice at a pause.

    `action` is what happens at the pause. With `ttl_s` set, the KV is kept for that long and then
    `after` (swap, recompute or keep-evictable) is applied if the tool has not returned yet.
    """

    action: str
    reason: str
    predicted_wait_s: float | None = None
    ttl_s: float | None = None
    after: str | None = None

    @property
    def label(self) -> str:
        return "ttl" if self.ttl_s is not None else self.action


class PausePolicy(Protocol):
    """A pause policy: small classes, one method; users add their own.

    A policy may set `holds = False` when it never keeps a context pinned (keep-evictable,
    recompute): its calls are then not held on the server between a call's end and the
    pause's decision. Without the attribute, calls are held (the safe default: a pin is
    always released at the pause or the trajectory's end). A policy may set
    `program_order = True` to have its calls served in program order (harness.policies.
    program_order) where the runtime schedules by a call's priority."""

    name: str
    sees_true_latency: bool

    def decide(self, ctx: PauseContext) -> Decision: ...


# A call's priority under program order (lower is served first): a resumed call whose context
# is still pinned before every other, then every call by its program's (task's) arrival rank.
UNPINNED_PRIORITY = 1_000_000


def program_order(policy: object) -> bool:
    """Whether `policy` asks for program-level first-come-first-served scheduling: the calls
    of earlier tasks (a root trajectory with its sub-agents) first, pinned ones before all."""
    return bool(getattr(policy, "program_order", False))


def call_priority(rank: int, pinned: bool) -> int:
    """The priority of a call of the task that arrived `rank`-th (0 first) under program
    order, its context still pinned or not."""
    return rank if pinned else UNPINNED_PRIORITY + rank
