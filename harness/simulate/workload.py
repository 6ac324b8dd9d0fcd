"""A validated trajectory frame as flat per-step columns the event loop indexes directly.

Python lists, not numpy arrays, for the loop (scalar indexing of a list is several times
faster); numpy arrays for the record writer's vectorised lookups.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from harness.errors import InputError
from harness.traces.schema import KIND_TOOL

OUTCOMES = ("ok", "error", "timeout", "abandoned")


@dataclass(frozen=True)
class Workload:
    """Steps of every trajectory, contiguous; trajectory k owns steps first[k] .. first[k]+n[k]-1.

    Per step: `inp`/`out` tokens (LLM steps), `ctx` = tokens in the context after the step
    (the retained tokens at a tool step), tool `lat` (NaN: never returns), effective `deadline`,
    `cls`/`name` codes into `classes`/`names`, `outcome` code into OUTCOMES.
    """

    ids: list[str]
    first: list[int]
    n_steps: list[int]
    start_s: np.ndarray
    priority: list[str]
    inp: np.ndarray
    out: np.ndarray
    ctx: np.ndarray
    lat: np.ndarray
    deadline: np.ndarray
    cls: np.ndarray
    name: np.ndarray
    outcome: np.ndarray
    classes: list[str]
    names: list[str]

    @property
    def n_trajectories(self) -> int:
        return len(self.ids)

    @property
    def n_pauses(self) -> int:
        return int((self.cls >= 0).sum())


def build_workload(df: pd.DataFrame, default_deadline_s: float) -> Workload:
    """Flatten a validated trajectory frame (rows contiguous per trajectory, steps in order)."""
    n = len(df)
    if n == 0:
        raise InputError("empty workload: the trace holds no steps")
    tid = df["trajectory_id"].astype(object).to_numpy()
    change = np.empty(n, dtype=bool)
    change[0] = True
    change[1:] = tid[1:] != tid[:-1]
    first = np.flatnonzero(change)
    n_steps = np.diff(np.append(first, n))
    is_tool = (df["kind"] == KIND_TOOL).to_numpy()
    inp = df["input_tokens"].to_numpy(dtype="float64", na_value=0.0).astype(np.int64)
    out = df["output_tokens"].to_numpy(dtype="float64", na_value=0.0).astype(np.int64)
    inp[is_tool] = 0
    out[is_tool] = 0
    tokens = inp + out
    cum = np.cumsum(tokens)
    base = np.repeat(cum[first] - tokens[first], n_steps)
    ctx = cum - base
    lat = df["latency_s"].to_numpy(dtype="float64", na_value=np.nan)
    deadline = df["deadline_s"].to_numpy(dtype="float64", na_value=np.nan)
    deadline = np.where(np.isnan(deadline), default_deadline_s, deadline)
    cls_codes, classes = pd.factorize(df["tool_class"].astype(object))
    name_codes, names = pd.factorize(df["tool_name"].astype(object).where(
        df["tool_name"].notna(), df["tool_class"]))
    outcome = np.full(n, -1, dtype=np.int8)
    raw_outcome = df["outcome"].astype(object).to_numpy()
    for k, o in enumerate(OUTCOMES):
        outcome[raw_outcome == o] = k
    cls_codes = np.where(is_tool, cls_codes, -1)
    return Workload(
        ids=[str(t) for t in tid[first]], first=first.tolist(), n_steps=n_steps.tolist(),
        start_s=df["start_s"].to_numpy(dtype="float64")[first],
        priority=[str(p) for p in df["priority"].astype(object).to_numpy()[first]],
        inp=inp, out=out, ctx=ctx, lat=np.where(is_tool, lat, np.nan),
        deadline=np.where(is_tool, deadline, np.nan), cls=cls_codes.astype(np.int32),
        name=np.where(is_tool, name_codes, -1).astype(np.int32), outcome=outcome,
        classes=[str(c) for c in classes], names=[str(c) for c in names])
