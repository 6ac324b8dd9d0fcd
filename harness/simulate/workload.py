"""A validated trajectory frame as flat per-step columns the event loop indexes directly.

Python lists, not numpy arrays, for the loop (scalar indexing of a list is several times
faster); numpy arrays for the record writer's vectorised lookups.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from harness.errors import InputError
from harness.model.iteration import IterationCosts
from harness.simulate.trajectory import Trajectory
from harness.traces.context import context_lengths, trajectory_starts
from harness.traces.reuse import prefix_sent
from harness.traces.schema import KIND_TOOL, TOOL_SUBAGENT

OUTCOMES = ("ok", "error", "timeout", "abandoned")


@dataclass(frozen=True)
class Workload:
    """Steps of every trajectory, contiguous; trajectory k owns steps first[k] .. first[k]+n[k]-1.

    Per step: `inp`/`out` tokens (LLM steps; `inp` is what a call prefills on top of what it
    reuses), `ctx` = tokens in the context after the step (the retained tokens at a tool step),
    `kept` = the tokens of the context before a call that the call keeps (what a kept or swapped
    KV can reuse; a `keep_tokens` cut frees the rest), at a tool step the `kept` of the call
    after it (what its pause's KV is worth to the resume), tool `lat` (NaN: never returns),
    effective `deadline` (inf: none), `cls`/`name` codes into `classes`/`names`, `outcome`
    code into OUTCOMES. A call's prompt is kept + inp tokens.

    Shared prefixes: `group` per trajectory (an index into its prefix_group's names, -1: none)
    and `prefix`, the tokens of its first call that the group shares (the trace's prefix_tokens,
    128 where null, never above the first call's input), as the replay's planner builds them.

    Sub-agents: `parent` per trajectory (its parent's index, -1 for a root) and `spawn_step`
    (the parent's step, within the parent, that starts it; -1 for a root). The tool steps that
    start children are `spawns` (global step indexes, ascending); those of spawns[j] are
    `kids[kid_ptr[j]:kid_ptr[j + 1]]`, in workload order.
    """

    ids: list[str]
    first: list[int]
    n_steps: list[int]
    start_s: np.ndarray
    priority: list[str]
    inp: np.ndarray
    out: np.ndarray
    ctx: np.ndarray
    kept: np.ndarray
    lat: np.ndarray
    deadline: np.ndarray
    cls: np.ndarray
    name: np.ndarray
    outcome: np.ndarray
    classes: list[str]
    names: list[str]
    parent: np.ndarray
    spawn_step: np.ndarray
    spawns: np.ndarray
    kid_ptr: np.ndarray
    kids: np.ndarray
    group: np.ndarray
    prefix: np.ndarray
    # The last `bystanders` trajectories are a replay's bystander requests (one call each, read
    # by harness.simulate.pins from the replay a simulation is pinned to): they arrive at the
    # replay's times, outside the agents' loop, and are recorded as its bystander calls.
    bystanders: int = 0

    @property
    def n_trajectories(self) -> int:
        return len(self.ids)

    @property
    def n_pauses(self) -> int:
        return int((self.cls >= 0).sum())

    @property
    def roots(self) -> np.ndarray:
        """The agents' trajectories that arrive on their own (not sub-agents, not bystanders),
        in workload order."""
        return np.flatnonzero(self.parent[:self.n_trajectories - self.bystanders] < 0)

    def children(self) -> dict[int, list[int]]:
        """Each spawning tool step (global index) -> its children's trajectory indexes."""
        ptr = self.kid_ptr.tolist()
        kids: list[int] = self.kids.tolist()
        return {int(g): kids[ptr[j]:ptr[j + 1]] for j, g in enumerate(self.spawns.tolist())}


def build_workload(df: pd.DataFrame, default_deadline_s: float) -> Workload:
    """Flatten a validated trajectory frame (rows contiguous per trajectory, steps in order).

    A tool step without a deadline gets `default_deadline_s`, except a `subagent` step: its
    parent waits for its children as long as they run (as the replay plan does)."""
    n = len(df)
    if n == 0:
        raise InputError("empty workload: the trace holds no steps")
    tid = df["trajectory_id"].astype(object).to_numpy()
    first = np.flatnonzero(trajectory_starts(tid))
    n_steps = np.diff(np.append(first, n))
    is_tool = (df["kind"] == KIND_TOOL).to_numpy()
    inp = df["input_tokens"].to_numpy(dtype="float64", na_value=0.0).astype(np.int64)
    out = df["output_tokens"].to_numpy(dtype="float64", na_value=0.0).astype(np.int64)
    inp[is_tool] = 0
    out[is_tool] = 0
    lengths = context_lengths(df)
    ctx = lengths.after
    kept = _kept(lengths.kept, ctx, is_tool, first, n_steps)
    lat = df["latency_s"].to_numpy(dtype="float64", na_value=np.nan)
    raw_class = df["tool_class"].astype(object)
    deadline = df["deadline_s"].to_numpy(dtype="float64", na_value=np.nan)
    deadline = np.where(np.isnan(deadline), np.where(
        (raw_class == TOOL_SUBAGENT).to_numpy(), np.inf, default_deadline_s), deadline)
    cls_codes, classes = pd.factorize(raw_class)
    name_codes, names = pd.factorize(df["tool_name"].astype(object).where(
        df["tool_name"].notna(), df["tool_class"]))
    outcome = np.full(n, -1, dtype=np.int8)
    raw_outcome = df["outcome"].astype(object).to_numpy()
    for k, o in enumerate(OUTCOMES):
        outcome[raw_outcome == o] = k
    cls_codes = np.where(is_tool, cls_codes, -1)
    ids = [str(t) for t in tid[first]]
    parent, spawn_step, spawns, kid_ptr, kids = _subagents(df, ids, first, n_steps, is_tool)
    group, prefix = _shared_prefixes(df, first, inp)
    return Workload(
        ids=ids, first=first.tolist(), n_steps=n_steps.tolist(),
        start_s=df["start_s"].to_numpy(dtype="float64")[first],
        priority=[str(p) for p in df["priority"].astype(object).to_numpy()[first]],
        inp=inp, out=out, ctx=ctx, kept=kept, lat=np.where(is_tool, lat, np.nan),
        deadline=np.where(is_tool, deadline, np.nan), cls=cls_codes.astype(np.int32),
        name=np.where(is_tool, name_codes, -1).astype(np.int32), outcome=outcome,
        classes=[str(c) for c in classes], names=[str(c) for c in names], parent=parent,
        spawn_step=spawn_step, spawns=spawns, kid_ptr=kid_ptr, kids=kids, group=group,
        prefix=prefix)


def _shared_prefixes(df: pd.DataFrame, first: np.ndarray, inp: np.ndarray
                     ) -> tuple[np.ndarray, np.ndarray]:
    """Per trajectory, its prefix group's index (-1: none) and the tokens of its first call
    that start with the group's shared prefix."""
    raw = df["prefix_group"].astype(object).to_numpy()[first]
    named = np.array([isinstance(g, str) and g != "" for g in raw], dtype=bool)
    codes, _ = pd.factorize(pd.Series(raw).where(named, None))  # -1 where not named
    return (codes.astype(np.int64),
            np.where(named, prefix_sent(df, first, inp[first]), 0).astype(np.int64))


def _kept(call_kept: np.ndarray, ctx: np.ndarray, is_tool: np.ndarray, first: np.ndarray,
          n_steps: np.ndarray) -> np.ndarray:
    """Per step, what the call reuses of the context it finds; at a tool step, what the next
    call reuses of the KV the pause retains (all of it when no call follows)."""
    kept = call_kept.astype(np.int64).copy()
    nxt = np.flatnonzero(is_tool)
    last = np.repeat(first + n_steps - 1, n_steps)[nxt]
    has_next = nxt < last
    # never more than the pause retains (a validated trace cuts no more than the context)
    kept[nxt[has_next]] = np.minimum(call_kept[nxt[has_next] + 1], ctx[nxt[has_next]])
    kept[nxt[~has_next]] = ctx[nxt[~has_next]]
    return kept


def _subagents(df: pd.DataFrame, ids: list[str], first: np.ndarray, n_steps: np.ndarray,
               is_tool: np.ndarray) -> tuple[np.ndarray, ...]:
    """parent, spawn_step (per trajectory) and spawns, kid_ptr, kids (see Workload); the
    checks a validated frame passes, so that the loop never waits for a child that cannot
    start."""
    n_traj = len(ids)
    none = np.full(n_traj, -1, dtype=np.int64)
    if "parent_id" not in df.columns:
        empty = np.zeros(0, dtype=np.int64)
        return none, none.copy(), empty, np.zeros(1, dtype=np.int64), empty
    raw_parent = df["parent_id"].astype(object).to_numpy()[first]
    has_parent = pd.notna(raw_parent)
    parent = none.copy()
    if has_parent.any():
        found = pd.Index(ids).get_indexer(raw_parent[has_parent].astype(str))
        if (found < 0).any():
            bad = ids[int(np.flatnonzero(has_parent)[int(np.argmax(found < 0))])]
            raise InputError(f"trajectory {bad!r}: its parent is not in the trace")
        parent[has_parent] = found
    spawn_raw = df["spawn_step"].to_numpy(dtype="float64", na_value=np.nan)[first]
    spawn_step = np.where(has_parent, np.nan_to_num(spawn_raw, nan=-1.0), -1).astype(np.int64)
    child = np.flatnonzero(has_parent)
    p = parent[child]
    s = spawn_step[child]
    ok = (s >= 0) & (s < n_steps[p])
    g = first[p] + np.where(ok, s, 0)
    ok &= is_tool[g]
    if not ok.all():
        bad = ids[int(child[int(np.argmin(ok))])]
        raise InputError(f"trajectory {bad!r}: its spawn_step is not a tool step of its parent")
    _check_acyclic(parent, ids)
    order = np.lexsort((child, g))  # by spawning step, then workload order
    spawns, counts = np.unique(g[order], return_counts=True)
    kid_ptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    return parent, spawn_step, spawns.astype(np.int64), kid_ptr, child[order].astype(np.int64)


def _check_acyclic(parent: np.ndarray, ids: list[str]) -> None:
    """Every chain of parents ends at a root (pointer doubling: log2(n) rounds)."""
    anc = parent.copy()  # after round k: each trajectory's 2^k-th ancestor (-1: none)
    for _ in range(int(len(parent)).bit_length() + 1):
        up = anc >= 0
        if not up.any():
            return
        anc[up] = anc[anc[up]]
    if (anc >= 0).any():
        bad = ids[int(np.argmax(anc >= 0))]
        raise InputError(f"trajectory {bad!r}: its chain of parents comes back to itself")


StepLists = tuple[list[int], list[int], list[int], list[int], list[float], list[float],
                  list[int]]


def step_lists(w: Workload) -> StepLists:
    """The workload's per-step columns the loop reads, as lists (a list's item is quicker to
    read than an array's): input, output, context and kept tokens, tool latency, deadline,
    class."""
    return (w.inp.tolist(), w.out.tolist(), w.ctx.tolist(), w.kept.tolist(), w.lat.tolist(),
            w.deadline.tolist(), w.cls.tolist())


def decode_costs(w: Workload, costs: IterationCosts, streamed_s: float = 0.0) -> list[float]:
    """What one decode token of each LLM step adds to an iteration (context at mid-output;
    `streamed_s`: the front end's compute to send it, ServerModel.stream_token_s)."""
    per_step: list[float] = (costs.beta + streamed_s
                             + costs.decode_cell * (w.ctx - w.out / 2.0)).tolist()
    return per_step


def trajectories(w: Workload) -> list[Trajectory]:
    """The loop's state object of every trajectory, in workload order."""
    return [Trajectory(ti, f, f + k)
            for ti, (f, k) in enumerate(zip(w.first, w.n_steps, strict=True))]
