"""The best prefix-cache hit rate a trace allows, and what each fixed policy would get with
unlimited memory: a pure function of a validated step frame.

Per LLM call, the reusable tokens are the context it keeps (`context_lengths(df).kept`: every
earlier token it does not cut with `keep_tokens`), and, for a trajectory's first call, its
prefix group's shared prefix when an earlier trajectory of the group already sent it: the
shorter of the two prefixes. "Earlier" is start order (`start_s`, then the file's order, which
puts a parent before its sub-agents). The hit rate is the reusable tokens over all prompt
tokens. With unlimited memory:

- keep and swap reuse everything: the ideal;
- recompute reuses nothing on a resumed call (a call after a pause), the group prefix on a
  first call;
- ttl with time-to-live `tau` keeps through a pause of at most `tau`; after a longer one it
  reuses what swap does when it swaps after `tau` (the policy's default), nothing when it
  recomputes.

The figures are broken down by the length of the pause before each call, in the buckets of
`harness.traces.buckets` (the ones a run's measured reuse uses); a trajectory's first call is
its own bucket. A pause is its tool's `latency_s` (null: its
`deadline_s`, else unbounded); a `subagent` step's pause also holds its longest sub-agent's
tool time, a lower bound, as the trace does not record the sub-agents' LLM time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from harness.arrays import BoolArray, FloatArray, IntArray, ObjectArray
from harness.policies.builtin import Ttl
from harness.traces.buckets import PAUSE_BUCKET_LABELS, PAUSE_BUCKETS, bucket_index
from harness.traces.context import context_lengths, trajectory_starts
from harness.traces.schema import DEFAULT_PREFIX_TOKENS, KIND_TOOL, TOOL_SUBAGENT

FIRST_CALL = "first call"
# Every bucket of the breakdown, in order.
BUCKETS: tuple[str, ...] = (FIRST_CALL, *PAUSE_BUCKET_LABELS)
POLICIES: tuple[str, ...] = ("keep", "swap", "recompute", "ttl")
# The ttl policy's tau before it has seen any latency (it then follows their P90).
DEFAULT_TAU_S: float = Ttl().default_tau
DEFAULT_TTL_AFTER: str = Ttl().after


@dataclass(frozen=True)
class _Trajectories:
    """Per trajectory, in the frame's order: its first row, parent and group."""

    first: IntArray
    ids: ObjectArray
    parents: ObjectArray
    groups: ObjectArray


def _trajectories(df: pd.DataFrame) -> _Trajectories:
    first = np.flatnonzero(trajectory_starts(df["trajectory_id"].astype(object).to_numpy()))
    col = {c: df[c].astype(object).to_numpy()[first] if c in df.columns
           else np.full(len(first), None, dtype=object)
           for c in ("trajectory_id", "parent_id", "prefix_group")}
    return _Trajectories(first, col["trajectory_id"], col["parent_id"], col["prefix_group"])


def pause_lengths(df: pd.DataFrame) -> FloatArray:
    """Per row, how long the pause of a tool step lasts at least (NaN at LLM steps): its
    latency (null: its deadline, else inf), plus, for a `subagent` step, the most tool time
    of any sub-agent it starts (their own pauses summed, recursively)."""
    is_tool = (df["kind"].astype(object) == KIND_TOOL).to_numpy()
    lat = df["latency_s"].to_numpy(dtype="float64", na_value=np.nan)
    dl = df["deadline_s"].to_numpy(dtype="float64", na_value=np.nan)
    own = np.where(np.isnan(lat), np.where(np.isnan(dl), np.inf, dl), lat)
    pause = np.where(is_tool, own, np.nan)
    if "parent_id" not in df.columns or df["parent_id"].isna().all():
        return pause
    t = _trajectories(df)
    row_traj = np.cumsum(trajectory_starts(df["trajectory_id"].astype(object).to_numpy())) - 1
    spawn = df["spawn_step"].to_numpy(dtype="float64", na_value=np.nan)[t.first]
    index = {str(x): k for k, x in enumerate(t.ids)}
    parent_idx = np.array([index.get(str(p), -1) if isinstance(p, str) else -1
                           for p in t.parents], dtype=np.int64)
    depth = np.zeros(len(t.ids), dtype=np.int64)
    for k in np.flatnonzero(parent_idx >= 0):  # validated: every chain ends at a root
        p = parent_idx[k]
        while p >= 0:
            depth[k] += 1
            p = parent_idx[p]
    step = df["step"].to_numpy(dtype=np.int64)
    cls = df["tool_class"].astype(object).to_numpy()
    spawn_row = {(int(row_traj[r]), int(step[r])): int(r)
                 for r in np.flatnonzero(is_tool & (cls == TOOL_SUBAGENT))}
    # The deepest sub-agents first: a trajectory's tool time is known once its children's is.
    for d in range(int(depth.max()), 0, -1):
        tool_time = pd.Series(np.where(is_tool, pause, 0.0)).groupby(row_traj).sum().to_numpy()
        longest: dict[int, float] = {}
        for k in np.flatnonzero(depth == d):
            r = spawn_row.get((int(parent_idx[k]), int(spawn[k])), -1)
            if r >= 0:
                longest[r] = max(longest.get(r, 0.0), float(tool_time[k]))
        for r, v in longest.items():
            pause[r] = own[r] + v
    return pause


def prefix_sent(df: pd.DataFrame, first: IntArray, first_prompt: IntArray) -> IntArray:
    """Per trajectory (its first row in `first`), how many tokens of its first call start with
    its prefix group's shared prefix, as the replay's planner sends them: its prefix_tokens
    (DEFAULT_PREFIX_TOKENS where null), never more than the call's `first_prompt` tokens.
    Whether the trajectory has a group at all is the caller's to say."""
    raw = (df["prefix_tokens"].to_numpy(dtype="float64", na_value=np.nan)[first]
           if "prefix_tokens" in df.columns else np.full(len(first), np.nan))
    pre = np.where(np.isnan(raw), DEFAULT_PREFIX_TOKENS, raw).astype(np.int64)
    sent: IntArray = np.minimum(pre, first_prompt)
    return sent


def _first_call_prefix(df: pd.DataFrame, prompt: IntArray, t: _Trajectories) -> IntArray:
    """Per trajectory, the shared-prefix tokens its first call finds already sent by an earlier
    trajectory of its group (0 without one)."""
    n = len(t.first)
    out = np.zeros(n, dtype=np.int64)
    has_group = np.array([isinstance(g, str) for g in t.groups], dtype=bool)
    if not has_group.any():
        return out
    sent = prefix_sent(df, t.first, prompt[t.first])
    start = df["start_s"].to_numpy(dtype="float64")[t.first]
    order = np.argsort(start, kind="stable")
    frame = pd.DataFrame({"g": t.groups[order], "p": sent[order]})[has_group[order]]
    before = frame.groupby("g", sort=False)["p"].cummax()
    earlier = before.groupby(frame["g"], sort=False).shift(1)  # the most sent before it
    reuse = np.minimum(frame["p"].to_numpy(), earlier.fillna(0).to_numpy().astype(np.int64))
    out[order[has_group[order]]] = reuse
    return out


def _rate(reused: float, prompt: float) -> float | None:
    return reused / prompt if prompt else None


def _summary(mask: BoolArray, prompt: IntArray, reusable: dict[str, IntArray]) -> dict[str, Any]:
    total = int(prompt[mask].sum())
    ideal = int(reusable["ideal"][mask].sum())
    return {
        "calls": int(mask.sum()),
        "prompt_tokens": total,
        "reusable_tokens": ideal,
        "hit_rate": _rate(ideal, total),
        "policies": {p: _rate(int(reusable[p][mask].sum()), total) for p in POLICIES},
    }


def ideal_reuse(df: pd.DataFrame, tau_s: float = DEFAULT_TAU_S,
                ttl_after: str = DEFAULT_TTL_AFTER) -> dict[str, Any]:
    """The ideal prefix-hit rate of a validated frame and each fixed policy's with unlimited
    memory (ttl with `tau_s`, then `ttl_after`: swap, which restores everything,
    keep-evictable, which unlimited memory never evicts, or recompute), overall and by the
    pause before each call: a JSON-ready dict (`hit_rate` and the policies' rates are None
    where there are no prompt tokens)."""
    if not (tau_s >= 0 and math.isfinite(tau_s)):
        raise ValueError(f"tau_s must be finite and >= 0, got {tau_s!r}")
    if ttl_after not in ("swap", "recompute", "keep-evictable"):
        raise ValueError(f"ttl_after must be swap, recompute or keep-evictable, got "
                         f"{ttl_after!r}")
    lengths = context_lengths(df)
    is_tool = (df["kind"].astype(object) == KIND_TOOL).to_numpy()
    is_llm = ~is_tool
    starts = trajectory_starts(df["trajectory_id"].astype(object).to_numpy())
    t = _trajectories(df)
    prefix = np.zeros(len(df), dtype=np.int64)
    prefix[t.first] = _first_call_prefix(df, lengths.prompt, t)
    first = is_llm & starts
    resumed = is_llm & ~starts
    ideal = np.where(first, prefix, lengths.kept).astype(np.int64)
    pause = np.full(len(df), np.nan)
    pause_all = pause_lengths(df)
    pause[1:] = pause_all[:-1]  # the pause before each call (a resumed call follows its tool)
    ttl_keeps = resumed & ((pause <= tau_s) | (ttl_after != "recompute"))
    reusable = {
        "ideal": ideal,
        "keep": ideal,
        "swap": ideal,
        "recompute": np.where(first, prefix, 0).astype(np.int64),
        "ttl": np.where(first, prefix, np.where(ttl_keeps, lengths.kept, 0)).astype(np.int64),
    }
    bucket = np.where(resumed, bucket_index(pause), -1)
    by_bucket = [{"bucket": FIRST_CALL, "min_s": None, "max_s": None,
                  **_summary(first, lengths.prompt, reusable)}]
    for b, (label, lo, hi) in enumerate(PAUSE_BUCKETS):
        by_bucket.append({"bucket": label, "min_s": lo,
                          "max_s": hi if math.isfinite(hi) else None,
                          **_summary(resumed & (bucket == b), lengths.prompt, reusable)})
    return {"tau_s": float(tau_s), "ttl_after": ttl_after,
            **_summary(is_llm, lengths.prompt, reusable),
            "by_bucket": by_bucket}


def ideal_reuse_for(df: pd.DataFrame, policy: object) -> dict[str, Any]:
    """`ideal_reuse` with the ttl figures for `policy`'s own tau and `after` when it is a ttl
    policy (a run records the ideal of what it runs), the defaults otherwise."""
    if isinstance(policy, Ttl):
        return ideal_reuse(df, policy.tau if policy.tau is not None else policy.default_tau,
                           policy.after)
    return ideal_reuse(df)
