"""Sharding a plan among load generators that act as one run.

Every load generator computes the same whole plan (it is a pure function of the trace, the
injection, the arrivals and the seed) and keeps its shard of it:

- root trajectories by a stable hash of their id (sub-agents go with their root), so each
  keeps its planned arrival time and the shards' arrivals together are the whole run's;
- bystanders every n-th, so their rates add up to the one asked for;
- a closed loop's agents split as evenly as they go (the first `concurrency % n` shards get one
  more), so the agents add up to `--concurrency`;
- a runtime's harness-assigned slots every n-th (slot i to shard i % n), so two shards never
  put two requests in one slot.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from harness.errors import InputError
from harness.plan.planner import Arrivals, Plan
from harness.plan.tokens import stable_seed

MAX_SHARDS = 1024
_SHARD_RE = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")


@dataclass(frozen=True)
class Shard:
    """Shard `index` of `count` (0-based)."""

    index: int
    count: int

    def __post_init__(self) -> None:
        if not 1 <= self.count <= MAX_SHARDS:
            raise InputError(f"a run splits into 1 to {MAX_SHARDS} shards, got {self.count}")
        if not 0 <= self.index < self.count:
            raise InputError(f"shard index must be in [0, {self.count}), got {self.index}")

    @classmethod
    def parse(cls, text: str) -> Shard:
        """'i/n' as a Shard; InputError naming the form otherwise."""
        m = _SHARD_RE.match(text)
        if m is None:
            raise InputError(f"--shard must be i/n with 0 <= i < n (e.g. 0/2), got {text[:40]!r}")
        return cls(int(m.group(1)), int(m.group(2)))

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    def owns(self, trajectory_id: str) -> bool:
        """Whether this shard replays the root trajectory `trajectory_id`."""
        return shard_index(trajectory_id, self.count) == self.index


WHOLE = Shard(0, 1)


def shard_index(trajectory_id: str, count: int) -> int:
    """The shard of a root trajectory: a hash of its id, the same in every process."""
    return stable_seed("shard", trajectory_id) % count


def split_count(total: int, shard: Shard) -> int:
    """This shard's part of `total` things split as evenly as they go (the parts add up)."""
    return total // shard.count + (shard.index < total % shard.count)


def shard_slots(slots: int, shard: Shard) -> list[int]:
    """The slot ids of `slots` that this shard assigns (every n-th, from its index)."""
    return list(range(shard.index, slots, shard.count))


def check_shardable(plan: Plan, shard_count: int) -> None:
    """InputError when the whole `plan` cannot split into `shard_count` shards: a closed loop
    with fewer agents than shards."""
    if shard_count > 1 and plan.arrivals.mode == "closed" and (
            plan.arrivals.concurrency < shard_count):
        raise InputError(f"{shard_count} load generators need --concurrency >= "
                         f"{shard_count} (one agent each at least), got "
                         f"{plan.arrivals.concurrency}")


def check_shard_slots(slots: int | None, shard_count: int) -> None:
    """InputError when a server's harness-assigned slots (None: not assigned by the harness)
    are fewer than the shards: each shard assigns slots of its own."""
    if slots is not None and slots < shard_count:
        raise InputError(f"{shard_count} load generators need a server with >= "
                         f"{shard_count} slots (each assigns its own), it has {slots}")


def shard_plan(plan: Plan, shard: Shard) -> Plan:
    """The part of `plan` that `shard` replays (the plan itself for a whole run)."""
    if shard.count == 1:
        return plan
    check_shardable(plan, shard.count)
    a = plan.arrivals
    arrivals = (Arrivals(a.mode, split_count(a.concurrency, shard), a.rate, a.time_scale)
                if a.mode == "closed" else a)
    return dataclasses.replace(
        plan, trajectories=tuple(t for t in plan.trajectories if shard.owns(t.trajectory_id)),
        bystanders=plan.bystanders[shard.index::shard.count], arrivals=arrivals)
