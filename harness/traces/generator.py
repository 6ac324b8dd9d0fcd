"""Synthetic trajectories from a profile: deterministic for a seed, vectorised over all steps."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from harness.arrays import AnyArray, BoolArray, FloatArray, IntArray, ObjectArray, StrArray
from harness.errors import InputError
from harness.limits import MAX_SECONDS, MAX_TOKENS
from harness.traces.profiles import Dist, Profile
from harness.traces.schema import COLUMNS, KIND_LLM, KIND_TOOL, Provenance


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
    for c in ("input_tokens", "output_tokens"):
        df[c] = df[c].astype("Int64")
    for c in ("start_s", "latency_s", "deadline_s"):
        df[c] = df[c].astype("float64")
    df["mutating"] = df["mutating"].astype("boolean")
    return df


def generate(profile: Profile, trajectories: int, seed: int) -> pd.DataFrame:
    """Generate `trajectories` trajectories (or the profile's fixed ones) for `seed`."""
    if profile.fixed:
        return _fixed_frame(profile)
    if trajectories <= 0:
        raise InputError("--trajectories must be > 0 (an empty workload cannot be replayed)")
    # Every draw below comes from this one generator, in a fixed order: the same seed gives the
    # same trace, so the order of the calls must not change.
    rng = np.random.default_rng(seed)
    lay = _layout(rng.integers(profile.turns_min, profile.turns_max + 1, size=trajectories))
    inp = np.zeros(lay.total, dtype=np.int64)
    out = np.zeros(lay.total, dtype=np.int64)
    inp[lay.first] = _tokens(profile.prompt_tokens, lay.n, rng, 1)
    out[lay.is_llm] = _tokens(profile.output_tokens, int(lay.is_llm.sum()), rng, 1)
    tools = _draw_tools(profile, len(lay.tool_pos), rng)
    inp[lay.tool_pos + 1] = tools.result_tokens  # a tool result is the next LLM step's input
    keep = _kept_steps(profile, lay, inp, out, tools.outcome)
    level = _draw_trajectory_fields(profile, lay.n, rng)
    df = _frame(profile, lay, inp, out, tools, level)
    return df[keep].reset_index(drop=True)


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

    cls_idx: IntArray  # index into the profile's tool classes
    latency: FloatArray  # NaN: never returns
    result_tokens: IntArray
    deadline: FloatArray
    mutating: BoolArray
    tool_name: ObjectArray
    outcome: ObjectArray


def _draw_tools(profile: Profile, n_tool: int, rng: np.random.Generator) -> _ToolSteps:
    classes = profile.tool_classes
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
        result_tok[m] = _tokens(c.result_tokens or profile.result_tokens, cnt, rng, 0)
        deadline[m] = c.deadline_s if c.deadline_s is not None else np.nan
        mutating[m] = c.mutating
        tool_name[m] = np.asarray(c.tool_names, dtype=object)[
            rng.integers(0, len(c.tool_names), size=cnt)]
        never = m & (u_never < c.never_returns)
        err = m & ~never & (u_err < c.error)
        outcome[never] = "abandoned"
        latency[never] = np.nan
        outcome[err] = "error"
    return _ToolSteps(cls_idx, latency, result_tok, deadline, mutating, tool_name, outcome)


def _kept_steps(profile: Profile, lay: _Layout, inp: IntArray, out: IntArray,
                outcome: ObjectArray) -> BoolArray:
    """The steps that stay: none after a tool that never returns, none past the context cap."""
    step, traj = lay.step, lay.traj
    keep = np.ones(lay.total, dtype=bool)
    never_pos = lay.tool_pos[outcome == "abandoned"]
    if never_pos.size:
        cut = np.full(lay.n, np.iinfo(np.int64).max)
        np.minimum.at(cut, traj[never_pos], step[never_pos])
        keep &= step <= cut[traj]
    if profile.max_context_tokens is not None:
        ctx = pd.Series(inp + out).groupby(traj).cumsum().to_numpy()
        over = lay.is_llm & (ctx > profile.max_context_tokens) & (step > 0)
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
    priority: StrArray
    tenants: ObjectArray
    groups: ObjectArray


def _draw_trajectory_fields(profile: Profile, n: int,
                            rng: np.random.Generator) -> _TrajectoryFields:
    starts = (np.cumsum(rng.exponential(1.0 / profile.arrival_rate_per_s, size=n))
              if profile.arrival_rate_per_s else np.zeros(n))
    prio = np.where(rng.random(n) < profile.interactive_fraction, "interactive", "batch")
    tenants = np.asarray(profile.tenants, dtype=object)[rng.integers(0, len(profile.tenants), n)]
    groups = (np.array([f"pg{g}" for g in rng.integers(0, profile.prefix_groups, n)],
                       dtype=object) if profile.prefix_groups else np.full(n, None, dtype=object))
    width = len(str(n - 1))
    ids = np.array([f"{profile.name}-{i:0{width}d}" for i in range(n)], dtype=object)
    return _TrajectoryFields(ids, starts, prio, tenants, groups)


def _frame(profile: Profile, lay: _Layout, inp: IntArray, out: IntArray, tools: _ToolSteps,
           level: _TrajectoryFields) -> pd.DataFrame:
    """Every step (kept or not) in the canonical columns."""
    traj, is_tool, is_llm = lay.traj, lay.is_tool, lay.is_llm

    def tool_col(values: AnyArray, fill: object) -> AnyArray:
        return _scatter(lay.total, lay.tool_pos, values, fill)

    class_names = np.array([c.name for c in profile.tool_classes], dtype=object)
    mutating = np.zeros(lay.total, dtype=bool)
    mutating[lay.tool_pos] = tools.mutating
    df = pd.DataFrame({
        "trajectory_id": level.ids[traj],
        "step": lay.step.astype(np.int32),
        "kind": np.where(is_tool, KIND_TOOL, KIND_LLM).astype(object),
        "start_s": np.round(level.starts[traj], 6),
        "priority": level.priority[traj].astype(object),
        "tenant": level.tenants[traj],
        "prefix_group": level.groups[traj],
        "input_tokens": pd.array(np.where(is_llm, inp, 0), dtype="Int64"),
        "output_tokens": pd.array(np.where(is_llm, out, 0), dtype="Int64"),
        "tool_name": tool_col(tools.tool_name, None),
        "tool_class": tool_col(class_names[tools.cls_idx], None),
        "latency_s": np.round(tool_col(tools.latency, np.nan).astype(float), 6),
        "deadline_s": tool_col(tools.deadline, np.nan).astype(float),
        "outcome": tool_col(tools.outcome, None),
        "mutating": pd.arrays.BooleanArray(mutating, ~is_tool),  # null at the LLM steps
    })
    df.loc[is_tool, ["input_tokens", "output_tokens"]] = pd.NA
    return df


def _scatter(total: int, pos: IntArray, values: AnyArray,
             fill: object) -> AnyArray:
    out = np.full(total, fill, dtype=object if values.dtype == object else values.dtype)
    out[pos] = values
    return out


def provenance_for(profile: Profile, trajectories: int, seed: int) -> Provenance:
    return Provenance(
        source_format="generator",
        source_files=[],
        inferred={"*": "synthetic: every value drawn from the profile's distributions"},
        notes=[profile.description] if profile.description else [],
        extra={"profile": profile.name, "trajectories": trajectories, "seed": seed},
    )
