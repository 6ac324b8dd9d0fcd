"""How long each trajectory's context is around each step: a pure function of a step frame.

A call appends `input_tokens` to its context and generates `output_tokens`, which join it; a call
with `keep_tokens` first cuts the context to that many leading tokens. Tool steps leave it as
it is. Vectorised: the steps between two cuts (or a trajectory's start) add up with a cumsum.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from harness.arrays import BoolArray, IntArray
from harness.traces.schema import KIND_TOOL


@dataclass(frozen=True)
class ContextLengths:
    """Per step (the frame's row order): `before`, the context the call finds (for a tool step,
    what its pause retains); `kept`, the tokens of it the call keeps (what a cache could reuse);
    `prompt`, the call's prompt; `after`, the context once the call has generated its output.
    Tool steps have kept = prompt = 0 and after = before."""

    before: IntArray
    kept: IntArray
    prompt: IntArray
    after: IntArray


def trajectory_starts(tid: np.ndarray) -> BoolArray:
    """True at the first row of each trajectory (rows contiguous per trajectory)."""
    change = np.empty(len(tid), dtype=bool)
    if len(tid):
        change[0] = True
        change[1:] = tid[1:] != tid[:-1]
    return change


def context_lengths(df: pd.DataFrame) -> ContextLengths:
    """The context lengths of a frame whose rows are contiguous per trajectory, steps in order
    (a validated frame)."""
    n = len(df)
    is_tool = (df["kind"].astype(object) == KIND_TOOL).to_numpy()
    inp = df["input_tokens"].to_numpy(dtype="float64", na_value=0.0).astype(np.int64)
    out = df["output_tokens"].to_numpy(dtype="float64", na_value=0.0).astype(np.int64)
    inp[is_tool] = 0
    out[is_tool] = 0
    keep_raw = (df["keep_tokens"].to_numpy(dtype="float64", na_value=np.nan)
                if "keep_tokens" in df.columns else np.full(n, np.nan))
    cut = ~np.isnan(keep_raw) & ~is_tool
    start = trajectory_starts(df["trajectory_id"].astype(object).to_numpy())
    # A segment starts at each trajectory's start and at each cut; within one, the context is
    # the segment's base plus what its steps added.
    seg_start = start | cut
    seg = np.cumsum(seg_start) - 1
    added = inp + out
    csum = np.cumsum(added)
    seg_first = np.flatnonzero(seg_start)
    seg_base_csum = (csum - added)[seg_first]  # cumsum before each segment's first row
    within_before = (csum - added) - seg_base_csum[seg]  # added in the segment before this row
    # A segment's base is its cut, or 0 at a trajectory's start (validation checks that a cut
    # keeps no more than the context holds).
    base = np.where(cut[seg_first], np.nan_to_num(keep_raw[seg_first]), 0).astype(np.int64)
    ctx = base[seg] + within_before  # the context a row finds, as far as its segment says
    before = ctx.copy()
    # At a cut, the context found is what the previous row left.
    at_cut = np.flatnonzero(cut & ~start)
    before[at_cut] = ctx[at_cut - 1] + added[at_cut - 1]
    before[cut & start] = 0
    kept = np.where(is_tool, 0, ctx)
    prompt = np.where(is_tool, 0, kept + inp)
    after = np.where(is_tool, before, kept + inp + out)
    return ContextLengths(before, kept.astype(np.int64), prompt.astype(np.int64),
                          after.astype(np.int64))
