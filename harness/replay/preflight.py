"""Checks a plan against the server before the first request: a trajectory whose context cannot
fit a slot (or the client's memory) is refused up front, or skipped and recorded when asked,
instead of being found mid-run (or growing the client to a MemoryError)."""

from __future__ import annotations

import dataclasses
import os

from harness.errors import InputError
from harness.limits import MAX_TOKENS
from harness.plan.planner import CallStep, Plan, TrajectoryPlan
from harness.records.host import meminfo_bytes

# The most context one trajectory may hold on the client whatever the server.
MAX_CONTEXT_TOKENS = MAX_TOKENS
# Client memory per context token: its id is a Python int (28 B) in a list slot (8 B).
BYTES_PER_CONTEXT_TOKEN = 36
# Of the memory available at the start, the share the client's contexts may take.
MEMORY_SHARE = 0.8


def context_needed(traj: TrajectoryPlan) -> int:
    """Tokens the longest call of a trajectory (or of one of its sub-agents, each in a slot of
    its own) needs in its slot: what it keeps of the context, its appended prompt and its
    output (no policy changes that length)."""
    most = ctx = 0
    for s in traj.steps:
        if isinstance(s, CallStep):
            if s.keep_tokens is not None:
                ctx = min(ctx, s.keep_tokens)
            ctx += s.append_tokens + s.output_tokens
            most = max(most, ctx)
        else:
            most = max([most, *(context_needed(c) for c in s.children)])
    return most


def slots_needed(plan: Plan) -> int:
    """The most slots the plan's trajectories can hold at once when every parent keeps its slot
    while its sub-agents run: in a closed loop the `concurrency` hungriest trajectories
    together, in open loop all of them (a bound: arrivals may not overlap)."""
    peaks = sorted((t.peak_slots() for t in plan.trajectories), reverse=True)
    if plan.arrivals.mode == "closed":
        peaks = peaks[:plan.arrivals.concurrency]
    return sum(peaks)


def check_subagent_slots(plan: Plan, slots: int | None) -> None:
    """InputError when sub-agents could wait forever for a slot: on a server whose slots the
    harness assigns, a parent that keeps its slot while its sub-agents run leaves them fewer;
    if paused parents can hold every slot, their children never start."""
    if not slots or all(t.peak_slots() == 1 for t in plan.trajectories):
        return
    need = slots_needed(plan)
    if plan.arrivals.mode == "closed" and need > slots:
        raise InputError(
            f"the sub-agents need up to {need} slots at once (each parent keeps its slot while "
            f"its sub-agents run, each in a slot of its own) but the server has {slots}: lower "
            "--concurrency or give the server more slots")


def oversized(plan: Plan, ctx_per_slot: int | None) -> list[tuple[str, int]]:
    """(trajectory id, tokens needed) of each trajectory that cannot fit."""
    limit = min(ctx_per_slot or MAX_CONTEXT_TOKENS, MAX_CONTEXT_TOKENS)
    return [(t.trajectory_id, n) for t in plan.trajectories
            if (n := context_needed(t)) > limit]


def client_bytes(plan: Plan) -> int | None:
    """The most client memory the contexts take at once in a closed loop (the `concurrency`
    longest held together); None in open loop, where the overlap is known only as it runs."""
    if plan.arrivals.mode != "closed":
        return None
    needs = sorted((context_needed(t) for t in plan.trajectories), reverse=True)
    return BYTES_PER_CONTEXT_TOKEN * sum(needs[:plan.arrivals.concurrency])


def available_memory() -> int | None:
    """MemAvailable from /proc/meminfo in bytes (else the free pages); None where neither
    can be read."""
    if (available := meminfo_bytes("MemAvailable")) is not None:
        return available
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return None


def _check_memory(plan: Plan, memory: int | None) -> None:
    need = client_bytes(plan)
    if need is None or memory is None or need <= MEMORY_SHARE * memory:
        return
    gib = 1 << 30
    raise InputError(f"{plan.arrivals.concurrency} agents holding the longest contexts at once "
                     f"need {need / gib:.1f} GiB of client memory, more than "
                     f"{MEMORY_SHARE:.0%} of the {memory / gib:.1f} GiB available; lower "
                     "--concurrency or shorten the trajectories")


def check_plan(plan: Plan, ctx_per_slot: int | None, skip: bool,
               memory: int | None = None) -> tuple[Plan, list[str]]:
    """The plan to replay and the ids skipped. InputError (one line, the first few named) when
    a trajectory cannot fit and `skip` is False, or when the closed loop's contexts together
    would not fit in `memory` bytes; every one skipped is recorded by the caller."""
    limit = min(ctx_per_slot or MAX_CONTEXT_TOKENS, MAX_CONTEXT_TOKENS)
    if plan.bystanders:
        b = plan.bystanders[0]  # every bystander has the injection's size
        if (need := b.prompt_tokens + b.output_tokens) > limit:
            raise InputError(f"bystander requests need {need:,} tokens of context "
                             f"(injection prompt_tokens + output_tokens), more than {limit:,}")
    bad = oversized(plan, ctx_per_slot)
    if not bad:
        _check_memory(plan, memory)
        return plan, []
    where = (f"a slot's {ctx_per_slot:,} tokens" if ctx_per_slot and ctx_per_slot <= limit
             else f"the client's limit of {MAX_CONTEXT_TOKENS:,} tokens")
    if not skip:
        named = ", ".join(f"{tid} ({n:,})" for tid, n in bad[:3])
        raise InputError(f"{len(bad)} of {len(plan.trajectories)} trajectories need more "
                         f"context than {where}: {named}{', ...' if len(bad) > 3 else ''}; "
                         "shorten them, give the server more context per slot, or pass "
                         "--skip-oversized")
    ids = {tid for tid, _ in bad}
    kept = tuple(t for t in plan.trajectories if t.trajectory_id not in ids)
    if not kept:
        raise InputError(f"every trajectory needs more context than {where}; nothing to run")
    plan = dataclasses.replace(plan, trajectories=kept)
    _check_memory(plan, memory)
    return plan, sorted(ids)
