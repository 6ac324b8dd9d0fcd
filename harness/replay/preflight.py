"""Checks a plan against the server before the first request: a trajectory whose context cannot
fit a slot (or the client's memory) is refused up front, or skipped and recorded when asked,
instead of being found mid-run (or growing the client to a MemoryError)."""

from __future__ import annotations

import dataclasses

from harness.errors import InputError
from harness.limits import MAX_TOKENS
from harness.plan.planner import CallStep, Plan, TrajectoryPlan

# The most context one trajectory may hold on the client whatever the server.
MAX_CONTEXT_TOKENS = MAX_TOKENS


def context_needed(traj: TrajectoryPlan) -> int:
    """Tokens a trajectory's last call needs in its slot: every call's appended prompt and
    output before it, its own prompt and output (no policy changes that length)."""
    return sum(s.append_tokens + s.output_tokens for s in traj.steps if isinstance(s, CallStep))


def oversized(plan: Plan, ctx_per_slot: int | None) -> list[tuple[str, int]]:
    """(trajectory id, tokens needed) of each trajectory that cannot fit."""
    limit = min(ctx_per_slot or MAX_CONTEXT_TOKENS, MAX_CONTEXT_TOKENS)
    return [(t.trajectory_id, n) for t in plan.trajectories
            if (n := context_needed(t)) > limit]


def check_plan(plan: Plan, ctx_per_slot: int | None, skip: bool) -> tuple[Plan, list[str]]:
    """The plan to replay and the ids skipped. InputError (one line, the first few named) when
    a trajectory cannot fit and `skip` is False; every one skipped is recorded by the caller."""
    limit = min(ctx_per_slot or MAX_CONTEXT_TOKENS, MAX_CONTEXT_TOKENS)
    if plan.bystanders:
        b = plan.bystanders[0]  # every bystander has the injection's size
        if (need := b.prompt_tokens + b.output_tokens) > limit:
            raise InputError(f"bystander requests need {need:,} tokens of context "
                             f"(injection prompt_tokens + output_tokens), more than {limit:,}")
    bad = oversized(plan, ctx_per_slot)
    if not bad:
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
    return dataclasses.replace(plan, trajectories=kept), sorted(ids)
