"""Synthetic trajectories from a profile: deterministic for a seed, vectorised over all steps."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from harness.arrays import AnyArray, BoolArray, FloatArray, IntArray, ObjectArray
from harness.errors import InputError
from harness.limits import MAX_SECONDS, MAX_TOKENS
from harness.traces.profiles import Dist, Profile, Subagents, ToolClass
from harness.traces.schema import COLUMNS, KIND_LLM, KIND_TOOL, TOOL_SUBAGENT, Provenance


def sample(dist: Dist, n: int, rng: np.random.Generator, most: float) -> FloatArray:
    """Lognormal body around the median; a fraction replaced by a Pareto tail; clipped to
    [dist.min, dist.max] and never above `most` (a heavy tail or a wide sigma overflows)."""
    with np.errstate(over="ignore"):
        body: FloatArray = dist.median * np.exp(dist.sigma * rng.standard_normal(n))
        if dist.tail_fraction > 0:
            in_tail = rng.random(n) < dist.tail_fraction
            # Pareto with scale x_m and shape alpha by inversion: x_m * U^(-1/alpha).
            tail = dist.tail_scale * (1.0 - rng.random(n)) ** (-1.0 / dist.tail_alpha)
            body = np.where(in_tail, tail, body)
    clipped: FloatArray = np.clip(body, min(dist.min, most), min(dist.max, most))
    return clipped


def _tokens(dist: Dist, n: int, rng: np.random.Generator, minimum: int) -> IntArray:
    tokens: IntArray = np.maximum(np.rint(sample(dist, n, rng, MAX_TOKENS)).astype(np.int64),
                                  minimum)
    return tokens


def _fixed_frame(profile: Profile) -> pd.DataFrame:
    rows = []
    for t in profile.fixed:
        for i, s in enumerate(t.steps):
            rows.append({
                "trajectory_id": t.trajectory_id, "step": i, "kind": s.kind,
                "start_s": t.start_s, "priority": t.priority, "tenant": t.tenant,
                "prefix_group": None,
                "input_tokens": s.input_tokens, "output_tokens": s.output_tokens,
                "tool_name": s.tool_name or s.tool_class if s.kind == KIND_TOOL else None,
                "tool_class": s.tool_class, "latency_s": s.latency_s,
                "deadline_s": s.deadline_s,
                "outcome": s.outcome if s.kind == KIND_TOOL else None,
                "mutating": s.mutating if s.kind == KIND_TOOL else None,
            })
    return _typed(pd.DataFrame(rows, columns=list(COLUMNS)))


def _typed(df: pd.DataFrame) -> pd.DataFrame:
    df["step"] = df["step"].astype("int32")
    df["spawn_step"] = df["spawn_step"].astype("Int32")
    for c in ("input_tokens", "output_tokens", "prefix_tokens", "keep_tokens"):
        df[c] = df[c].astype("Int64")
    for c in ("start_s", "latency_s", "deadline_s"):
        df[c] = df[c].astype("float64")
    df["mutating"] = df["mutating"].astype("boolean")
    return df


def generate(profile: Profile, trajectories: int, seed: int) -> pd.DataFrame:
    """Generate `trajectories` trajectories (or the profile's fixed ones) for `seed`; with a
    [subagent] table, each top-level trajectory's sub-agents follow its rows."""
    if profile.fixed:
        return _fixed_frame(profile)
    if trajectories <= 0:
        raise InputError("--trajectories must be > 0 (an empty workload cannot be replayed)")
    # Every draw below comes from this one generator, in a fixed order: the same seed gives the
    # same trace, so the order of the calls must not change. What a profile without
    # prefix_tokens or [subagent] draws comes first, in the order it always had.
    rng = np.random.default_rng(seed)
    roots = _draw_steps(profile.turns_min, profile.turns_max, profile.prompt_tokens,
                        profile.output_tokens, profile.tool_classes, profile.result_tokens,
                        trajectories, rng)
    level = _draw_trajectory_fields(profile, roots.lay.n, rng)
    if profile.prefix_tokens is not None:
        level = _add_prefix(roots, level,
                            _tokens(profile.prefix_tokens, profile.prefix_groups, rng, 1))
    sub = profile.subagent
    spawns = _draw_spawns(sub, roots, rng) if sub is not None else None
    keep = _kept_steps(profile.max_context_tokens, roots.lay, roots.inp, roots.out,
                       roots.tools.outcome)
    df = _frame(roots, level)[keep].reset_index(drop=True)
    if sub is None or spawns is None:
        return df
    kept = keep[roots.lay.tool_pos[spawns.idx]]  # a step past a cut starts nothing
    if not kept.any():
        return df
    return _with_children(profile, sub, df, roots.lay.traj[keep], level,
                          _Spawns(spawns.idx[kept], spawns.fanout[kept]), roots, rng)


@dataclass
class _Steps:
    """Drawn steps: where they are, the tokens of each LLM step, what each tool step does."""

    lay: _Layout
    inp: IntArray
    out: IntArray
    tools: _ToolSteps


def _draw_steps(turns_min: int, turns_max: int, prompt: Dist, output: Dist,
                classes: tuple[ToolClass, ...], result: Dist, n: int,
                rng: np.random.Generator) -> _Steps:
    """The steps of `n` trajectories: turns, first prompts, outputs, then the tool steps."""
    lay = _layout(rng.integers(turns_min, turns_max + 1, size=n))
    inp = np.zeros(lay.total, dtype=np.int64)
    out = np.zeros(lay.total, dtype=np.int64)
    inp[lay.first] = _tokens(prompt, lay.n, rng, 1)
    out[lay.is_llm] = _tokens(output, int(lay.is_llm.sum()), rng, 1)
    tools = _draw_tools(classes, result, len(lay.tool_pos), rng)
    inp[lay.tool_pos + 1] = tools.result_tokens  # a tool result is the next LLM step's input
    return _Steps(lay, inp, out, tools)


@dataclass(frozen=True)
class _Layout:
    """Where the steps are: trajectory k's 2 x turns - 1 steps alternate LLM, tool, ..., LLM."""

    n: int  # trajectories
    total: int  # steps
    traj: IntArray  # each step's trajectory
    first: IntArray  # each trajectory's first step
    step: IntArray  # each step's index in its trajectory
    is_tool: BoolArray
    is_llm: BoolArray
    tool_pos: IntArray  # the tool steps


def _layout(turns: IntArray) -> _Layout:
    n = len(turns)
    n_steps = 2 * turns - 1
    total = int(n_steps.sum())
    traj = np.repeat(np.arange(n), n_steps)
    first = np.concatenate(([0], np.cumsum(n_steps)[:-1]))
    step = np.arange(total) - np.repeat(first, n_steps)
    is_tool = (step % 2) == 1
    return _Layout(n, total, traj, first, step, is_tool, ~is_tool, np.flatnonzero(is_tool))


@dataclass(frozen=True)
class _ToolSteps:
    """What was drawn for each tool step, in step order."""

    cls_name: ObjectArray
    latency: FloatArray  # NaN: never returns
    result_tokens: IntArray
    deadline: FloatArray
    mutating: BoolArray
    tool_name: ObjectArray
    outcome: ObjectArray


def _draw_tools(classes: tuple[ToolClass, ...], default_result: Dist, n_tool: int,
                rng: np.random.Generator) -> _ToolSteps:
    weights = np.array([c.weight for c in classes], dtype=float)
    cls_idx = rng.choice(len(classes), size=n_tool, p=weights / weights.sum())
    latency = np.empty(n_tool)
    result_tok = np.empty(n_tool, dtype=np.int64)
    deadline = np.full(n_tool, np.nan)
    mutating = np.zeros(n_tool, dtype=bool)
    tool_name = np.empty(n_tool, dtype=object)
    outcome = np.full(n_tool, "ok", dtype=object)
    u_never, u_err = rng.random(n_tool), rng.random(n_tool)
    for k, c in enumerate(classes):
        m = cls_idx == k
        cnt = int(m.sum())
        latency[m] = sample(c.latency_s, cnt, rng, MAX_SECONDS)
        result_tok[m] = _tokens(c.result_tokens or default_result, cnt, rng, 0)
        deadline[m] = c.deadline_s if c.deadline_s is not None else np.nan
        mutating[m] = c.mutating
        tool_name[m] = np.asarray(c.tool_names, dtype=object)[
            rng.integers(0, len(c.tool_names), size=cnt)]
        never = m & (u_never < c.never_returns)
        err = m & ~never & (u_err < c.error)
        outcome[never] = "abandoned"
        latency[never] = np.nan
        outcome[err] = "error"
    names = np.array([c.name for c in classes], dtype=object)[cls_idx]
    return _ToolSteps(names, latency, result_tok, deadline, mutating, tool_name, outcome)


def _kept_steps(max_context: int | None, lay: _Layout, inp: IntArray, out: IntArray,
                outcome: ObjectArray) -> BoolArray:
    """The steps that stay: none after a tool that never returns, none past the context cap."""
    step, traj = lay.step, lay.traj
    keep = np.ones(lay.total, dtype=bool)
    never_pos = lay.tool_pos[outcome == "abandoned"]
    if never_pos.size:
        cut = np.full(lay.n, np.iinfo(np.int64).max)
        np.minimum.at(cut, traj[never_pos], step[never_pos])
        keep &= step <= cut[traj]
    if max_context is not None:
        ctx = pd.Series(inp + out).groupby(traj).cumsum().to_numpy()
        over = lay.is_llm & (ctx > max_context) & (step > 0)
        if over.any():
            cut = np.full(lay.n, np.iinfo(np.int64).max)
            # Drop the first LLM step past the cap and the tool step before it.
            np.minimum.at(cut, traj[over], step[over] - 1)
            keep &= step < cut[traj]
    return keep


@dataclass(frozen=True)
class _TrajectoryFields:
    """What was drawn for each trajectory: the fields every one of its steps carries."""

    ids: ObjectArray
    starts: FloatArray
    priority: ObjectArray
    tenants: ObjectArray
    groups: ObjectArray
    group_idx: IntArray  # each one's prefix group (-1: none)
    parents: ObjectArray  # None: a top-level trajectory
    spawn_step: FloatArray  # NaN: a top-level trajectory
    prefix: FloatArray  # prefix_tokens; NaN: not set


def _draw_trajectory_fields(profile: Profile, n: int,
                            rng: np.random.Generator) -> _TrajectoryFields:
    starts = (np.cumsum(rng.exponential(1.0 / profile.arrival_rate_per_s, size=n))
              if profile.arrival_rate_per_s else np.zeros(n))
    prio = np.where(rng.random(n) < profile.interactive_fraction, "interactive", "batch")
    tenants = np.asarray(profile.tenants, dtype=object)[rng.integers(0, len(profile.tenants), n)]
    if profile.prefix_groups:
        group_idx = rng.integers(0, profile.prefix_groups, n).astype(np.int64)
        groups = np.array([f"pg{g}" for g in group_idx], dtype=object)
    else:
        group_idx, groups = np.full(n, -1, dtype=np.int64), np.full(n, None, dtype=object)
    width = len(str(n - 1))
    ids = np.array([f"{profile.name}-{i:0{width}d}" for i in range(n)], dtype=object)
    return _TrajectoryFields(ids, starts, prio.astype(object), tenants, groups, group_idx,
                             np.full(n, None, dtype=object), np.full(n, np.nan),
                             np.full(n, np.nan))


def _frame(steps: _Steps, level: _TrajectoryFields) -> pd.DataFrame:
    """Every step (kept or not) in the canonical columns."""
    lay, tools = steps.lay, steps.tools
    traj, is_tool, is_llm = lay.traj, lay.is_tool, lay.is_llm

    def tool_col(values: AnyArray, fill: object) -> AnyArray:
        return _scatter(lay.total, lay.tool_pos, values, fill)

    mutating = np.zeros(lay.total, dtype=bool)
    mutating[lay.tool_pos] = tools.mutating
    spawn, prefix = level.spawn_step[traj], level.prefix[traj]
    df = pd.DataFrame({
        "trajectory_id": level.ids[traj],
        "step": lay.step.astype(np.int32),
        "kind": np.where(is_tool, KIND_TOOL, KIND_LLM).astype(object),
        "start_s": np.round(level.starts[traj], 6),
        "priority": level.priority[traj],
        "tenant": level.tenants[traj],
        "prefix_group": level.groups[traj],
        "input_tokens": pd.array(np.where(is_llm, steps.inp, 0), dtype="Int64"),
        "output_tokens": pd.array(np.where(is_llm, steps.out, 0), dtype="Int64"),
        "tool_name": tool_col(tools.tool_name, None),
        "tool_class": tool_col(tools.cls_name, None),
        "latency_s": np.round(tool_col(tools.latency, np.nan).astype(float), 6),
        "deadline_s": tool_col(tools.deadline, np.nan).astype(float),
        "outcome": tool_col(tools.outcome, None),
        "mutating": pd.arrays.BooleanArray(mutating, ~is_tool),  # null at the LLM steps
        "parent_id": level.parents[traj],
        "spawn_step": pd.arrays.IntegerArray(np.nan_to_num(spawn).astype(np.int32),
                                             np.isnan(spawn)),
        "prefix_tokens": pd.arrays.IntegerArray(np.nan_to_num(prefix).astype(np.int64),
                                                np.isnan(prefix)),
        "keep_tokens": pd.arrays.IntegerArray(np.zeros(lay.total, dtype=np.int64),
                                              np.ones(lay.total, dtype=bool)),  # all null
    })
    df.loc[is_tool, ["input_tokens", "output_tokens"]] = pd.NA
    return df


def _scatter(total: int, pos: IntArray, values: AnyArray,
             fill: object) -> AnyArray:
    out = np.full(total, fill, dtype=object if values.dtype == object else values.dtype)
    out[pos] = values
    return out


def _add_prefix(steps: _Steps, level: _TrajectoryFields,
                per_group: IntArray) -> _TrajectoryFields:
    """Each trajectory's first call starts with its group's shared prefix (added to its
    prompt); prefix_tokens is set to it, never above the first call's input."""
    has = level.group_idx >= 0
    pre = np.zeros(steps.lay.n, dtype=np.int64)
    pre[has] = per_group[level.group_idx[has]]
    steps.inp[steps.lay.first] += pre
    capped = np.minimum(pre, steps.inp[steps.lay.first]).astype(float)
    return replace(level, prefix=np.where(has, capped, np.nan))


@dataclass(frozen=True)
class _Spawns:
    """The `subagent` steps (indices into the tool steps) and how many sub-agents each starts."""

    idx: IntArray
    fanout: IntArray


def _draw_spawns(sub: Subagents, steps: _Steps, rng: np.random.Generator) -> _Spawns:
    """Turn tool steps that return into `subagent` steps with `sub.probability`: their latency
    becomes the residual after the sub-agents, their result the sub-agents' reports."""
    t = steps.tools
    n = len(t.latency)
    u = rng.random(n)
    fanout = rng.integers(sub.fanout_min, sub.fanout_max + 1, size=n).astype(np.int64)
    residual = sample(sub.residual_s, n, rng, MAX_SECONDS)
    result = _tokens(sub.result_tokens, n, rng, 1)
    names = np.asarray(sub.tool_names, dtype=object)[rng.integers(0, len(sub.tool_names), n)]
    idx = np.flatnonzero((u < sub.probability) & (t.outcome != "abandoned"))
    t.cls_name[idx] = TOOL_SUBAGENT
    t.latency[idx] = residual[idx]
    t.result_tokens[idx] = result[idx]
    t.deadline[idx] = sub.deadline_s if sub.deadline_s is not None else np.nan
    t.mutating[idx] = False
    t.tool_name[idx] = names[idx]
    t.outcome[idx] = "ok"
    steps.inp[steps.lay.tool_pos[idx] + 1] = result[idx]
    return _Spawns(idx, fanout[idx])


def _with_children(profile: Profile, sub: Subagents, df: pd.DataFrame, row_root: IntArray,
                   level: _TrajectoryFields, spawns: _Spawns, roots: _Steps,
                   rng: np.random.Generator) -> pd.DataFrame:
    """`df` (the top-level trajectories' kept rows, `row_root` each row's trajectory) with the
    sub-agents of the kept `spawns`, each parent's right after its own rows."""
    pos = roots.lay.tool_pos[spawns.idx]
    c_parent = np.repeat(roots.lay.traj[pos], spawns.fanout)  # non-decreasing
    c_spawn = np.repeat(roots.lay.step[pos], spawns.fanout)
    n = len(c_parent)
    k = np.arange(n) - np.searchsorted(c_parent, c_parent, side="left")
    classes = tuple(c for c in profile.tool_classes
                    if not sub.tool_classes or c.name in sub.tool_classes)
    kids = _draw_steps(sub.turns_min, sub.turns_max, sub.prompt_tokens,
                       sub.output_tokens or profile.output_tokens, classes,
                       profile.result_tokens, n, rng)
    groups = np.array([None if g is None else f"{g}-sub" for g in level.groups[c_parent]],
                      dtype=object)
    kid_level = _TrajectoryFields(
        ids=np.array([f"{level.ids[p]}/sa{j}" for p, j in zip(c_parent, k, strict=True)],
                     dtype=object),
        starts=level.starts[c_parent], priority=level.priority[c_parent],
        tenants=level.tenants[c_parent], groups=groups, group_idx=level.group_idx[c_parent],
        parents=level.ids[c_parent], spawn_step=c_spawn.astype(float),
        prefix=np.full(n, np.nan))
    if sub.prefix_tokens is not None:
        kid_level = _add_prefix(kids, kid_level,
                                _tokens(sub.prefix_tokens, profile.prefix_groups, rng, 1))
    keep = _kept_steps(profile.max_context_tokens, kids.lay, kids.inp, kids.out,
                       kids.tools.outcome)
    kid_df = _frame(kids, kid_level)[keep]
    kid_traj = kids.lay.traj[keep]
    # Rows sort by top-level trajectory, then the parent before its sub-agents in order; a
    # stable sort keeps each trajectory's steps in order.
    key = np.concatenate((row_root * (n + 1), c_parent[kid_traj] * (n + 1) + kid_traj + 1))
    both = pd.concat([df, kid_df], ignore_index=True)
    return both.iloc[np.argsort(key, kind="stable")].reset_index(drop=True)


def provenance_for(profile: Profile, trajectories: int, seed: int) -> Provenance:
    return Provenance(
        source_format="generator",
        source_files=[],
        inferred={"*": "synthetic: every value drawn from the profile's distributions"},
        notes=[profile.description] if profile.description else [],
        extra={"profile": profile.name, "trajectories": trajectories, "seed": seed},
    )
