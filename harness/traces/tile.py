"""A trace repeated end to end, so a bounded run of many agents never runs out of work.

Copy k of trajectory `t` is `t~k` (copy 0 keeps its id; `t~~k` where the trace already has
`t~k`, a tiled trace tiled again), with its sub-agents' parents renamed alike. The planner seeds
token ids from the trajectory id, so every copy sends new content: no copy finds another's
prompt in a server's prefix cache. Prefix groups stay shared, as the trace means them to be.

Copies are otherwise identical: a closed loop that starts several agents at once on copies of
one trajectory keeps their calls in step, every resume meeting the other copies' on the server
at the same moment, for as long as their timing does not drift apart, which turns on sub-
millisecond differences (a server's, a client's timers). `jitter` takes that out of the trace:
each tool's latency is scaled by its own factor drawn uniformly from 1 +/- jitter (seeded), so
copies part after their first tool, as real agents' tools never take the same time twice.
Pure functions of data.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from harness.errors import InputError
from harness.traces.schema import KIND_LLM, TOOL_SUBAGENT

# Each call takes at least this long on any server (a lower bound for sizing, not a model).
MIN_CALL_S = 0.02
MAX_TILED_TRAJECTORIES = 20_000


def copy_id(tid: str, k: int, sep: str = "~") -> str:
    return tid if k == 0 else f"{tid}{sep}{k}"


def copy_separator(ids: set[str], copies: int) -> str:
    """"~", or as many more as it takes for no copy's id to be one the trace has: a trace
    that is itself a tiled one has `t~1` beside `t`."""
    def clashes(sep: str) -> bool:
        for tid in ids:
            head, found, k = tid.rpartition(sep)
            if found and head in ids and k.isdigit() and 0 < int(k) < copies:
                return True
        return False

    sep = "~"
    while clashes(sep):
        sep += "~"
    return sep


def tile_steps(steps: pd.DataFrame, copies: int, jitter: float = 0.0,
               seed: int = 0, default_deadline_s: float = math.inf) -> pd.DataFrame:
    """`steps` repeated `copies` times, copy after copy (a closed loop takes them in order);
    with `jitter` > 0, every tool latency (copy 0's too) scaled by its own factor drawn
    uniformly from [1 - jitter, 1 + jitter] by a generator seeded by `seed`
    (`default_deadline_s`: the deadline of a tool without one, as the replay's injection
    profile gives it: `jittered`)."""
    if copies < 1:
        raise InputError(f"copies must be >= 1, got {copies}")
    if not 0.0 <= jitter < 1.0:
        raise InputError(f"jitter must be in [0, 1), got {jitter}")
    if copies == 1:
        return jittered(steps, jitter, seed, default_deadline_s)
    sep = copy_separator({str(t) for t in steps["trajectory_id"].unique()}, copies)
    parts = []
    for k in range(copies):
        part = steps.copy()
        part["trajectory_id"] = [copy_id(str(t), k, sep) for t in part["trajectory_id"]]
        if "parent_id" in part.columns:
            part["parent_id"] = [None if p is None or (isinstance(p, float) and math.isnan(p))
                                 else copy_id(str(p), k, sep) for p in part["parent_id"]]
        parts.append(part)
    return jittered(pd.concat(parts, ignore_index=True), jitter, seed, default_deadline_s)


def jittered(steps: pd.DataFrame, jitter: float, seed: int,
             default_deadline_s: float = math.inf) -> pd.DataFrame:
    """`steps` with each tool's latency times its own draw from U(1 - jitter, 1 + jitter);
    `steps` itself where jitter is 0. A tool that never returns (NaN) stays so, and one with a
    deadline (its own, else `default_deadline_s`; a sub-agent's tool has none) stays on its
    side of it: one that returns by then no later than halfway to it (one at the deadline
    itself no later than it was), one past it no earlier than halfway back. Jitter moves
    times; it does not turn a tool's result into a timeout or back."""
    if jitter <= 0.0:
        return steps
    out = steps.copy()
    lat = out["latency_s"].to_numpy(dtype="float64", na_value=np.nan)
    factors = np.random.default_rng([seed, 0x7117]).uniform(1.0 - jitter, 1.0 + jitter, len(lat))
    moved = lat * factors
    dl = (out["deadline_s"].to_numpy(dtype="float64", na_value=np.nan)
          if "deadline_s" in out.columns else np.full(len(lat), np.nan))
    sub = ((out["tool_class"] == TOOL_SUBAGENT).to_numpy() if "tool_class" in out.columns
           else np.zeros(len(lat), dtype=bool))
    dl = np.where(np.isnan(dl) & ~sub, default_deadline_s, dl)
    with np.errstate(invalid="ignore"):
        mid = (lat + dl) / 2.0  # inf where there is no deadline
        cap = np.where(lat < dl, mid, lat)  # (lat <= dl) a result stays one
        moved = np.where(lat <= dl, np.minimum(moved, cap),
                         np.where(lat > dl, np.maximum(moved, mid), moved))
    tool = (out["kind"] != KIND_LLM).to_numpy()
    out["latency_s"] = np.where(tool, moved, lat)
    return out


def least_trajectory_s(steps: pd.DataFrame, time_scale: float = 1.0) -> float:
    """The mean least time a root trajectory (with its sub-agents) takes: its tool time plus
    MIN_CALL_S per call; never-returning tools count nothing (their deadline may be long)."""
    lat = steps["latency_s"].astype("float64").fillna(0.0) * time_scale
    tool_s = float(lat[steps["kind"] != KIND_LLM].sum())
    calls = int((steps["kind"] == KIND_LLM).sum())
    roots = steps["trajectory_id"].nunique()
    if "parent_id" in steps.columns:
        roots = steps.loc[steps["parent_id"].isna(), "trajectory_id"].nunique()
    return (tool_s + MIN_CALL_S * calls) / max(roots, 1)


def copies_needed(steps: pd.DataFrame, agents: int, duration_s: float,
                  time_scale: float = 1.0) -> int:
    """How many copies keep `agents` closed-loop agents busy for `duration_s`, with a margin
    of two: each agent can finish at most duration / least_trajectory_s trajectories."""
    roots = steps["trajectory_id"].nunique()
    if "parent_id" in steps.columns:
        roots = steps.loc[steps["parent_id"].isna(), "trajectory_id"].nunique()
    per_agent = duration_s / max(least_trajectory_s(steps, time_scale), MIN_CALL_S)
    need = 2 * agents * per_agent / max(roots, 1)
    most = max(1, MAX_TILED_TRAJECTORIES // max(roots, 1))
    return int(min(max(1, math.ceil(need)), most))
