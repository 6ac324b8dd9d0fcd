"""What one replay shares across its parts: the injected collaborators (adapter, clock, recorder,
policy), the learned server rates, the outcome counters, and what each trajectory holds on the
server. The lowest layer of the executor's modules: every other one takes these explicitly.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from harness.adapters.base import Adapter
from harness.policies.base import PausePolicy, ServerRates
from harness.policies.history import History, RecentMean
from harness.records.manifest import Outcome
from harness.replay.clock import Clock
from harness.replay.hints import HintLedger
from harness.replay.progress import Progress
from harness.replay.recorder import Recorder, SlotPool

# A pause's outcome: (status, reason, when the tool ended in ns); the trajectory goes on
# while status is "completed", and its next call is due at that end.
ToolOutcome = tuple[str, str | None, int]


@dataclass
class RunCounters:
    """A run's outcome counts (run.json's `outcome`, counted as the run goes: a trajectory's
    end under its status, a pause action the server could not do as unsupported) and the
    cleanup it could not do, for run.json."""

    outcome: Outcome = field(default_factory=Outcome)
    bystanders_ended_s: float | None = None  # the planned bystanders ran out before the agents
    cleanup_errors: list[str] = field(default_factory=list)
    remote_dumps_left: list[str] = field(default_factory=list)


@dataclass
class TrajectoryState:
    """What one trajectory (or bystander request) holds on the server right now."""

    tid: str
    context: list[int] = field(default_factory=list)
    slot: int | None = None
    dump: str | None = None
    salt: str | None = None
    # Pinned through its pause on a server without harness slots (held, not yet evicted).
    pinned: bool = False
    rank: int = 0  # its task's arrival order in the run (0 first): its calls' program order
    # The step of the pause whose hint is out (until its resume): the tag of its hint.
    hint_step: int | None = None
    longest_pause_s: float | None = None  # the longest pause its plan has (None: unbounded)


@dataclass
class ReplayContext:
    """The state every part of one replay works on. Not frozen: `rates` is replaced as the
    run measures the server (prefill and swap speeds), and later pauses decide on the new
    rates."""

    adapter: Adapter
    clock: Clock
    rec: Recorder
    policy: PausePolicy
    run_id: str
    vocab: int
    pool: SlotPool | None  # None: the server manages its own slots (no harness slot control)
    rates: ServerRates
    counters: RunCounters
    progress: Progress
    # Per tool class; each pause hands the policy the live window (no copy): decide() is
    # synchronous.
    history: dict[str, History]
    hints: HintLedger
    # Agents' calls ask the server to hold their context once they end (runtimes that pin).
    hold_calls: bool = False
    # Recent queueing delays of resumed calls whose context was not held (queue_delay_s).
    queue_delays: RecentMean = field(default_factory=RecentMean)

    def kept_through_pause(self, st: TrajectoryState) -> bool:
        """Whether the paused context is still held for its resumed call: its slot kept, or,
        without slot control, pinned and not evicted since."""
        return st.slot is not None if self.pool is not None else st.pinned

    def holds_kv(self, st: TrajectoryState) -> bool:
        """Whether an eviction has something to act on: the trajectory's slot, or, without
        slot control, the server's own cache of its prefix."""
        return st.slot is not None or self.pool is None
