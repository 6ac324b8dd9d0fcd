"""Descriptive statistics of a trajectory table (what `harness traces describe` prints)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from harness.traces.schema import KIND_LLM, KIND_TOOL


def quantiles(
    values: np.ndarray | pd.Series, qs: tuple[float, ...] = (50, 95, 99)
) -> dict[str, Any]:
    """{'n', 'p50', 'p95', 'p99'} with linear interpolation; None for the quantiles of no data."""
    arr = np.asarray(values, dtype="float64")
    arr = arr[np.isfinite(arr)]
    out: dict[str, Any] = {"n": int(arr.size)}
    for q in qs:
        out[f"p{q:g}"] = float(np.percentile(arr, q)) if arr.size else None
    return out


def retained_tokens_at_pauses(df: pd.DataFrame) -> pd.Series:
    """Tokens held in KV at each tool step: everything appended and generated before it."""
    tokens = df["input_tokens"].fillna(0).astype("int64") + df["output_tokens"].fillna(0).astype(
        "int64"
    )
    cum = tokens.groupby(df["trajectory_id"].astype(object), sort=False).cumsum()
    return cum[df["kind"] == KIND_TOOL]


def describe(df: pd.DataFrame) -> dict[str, Any]:
    """Summary of a validated trajectory frame; keys documented in the README."""
    is_tool = df["kind"] == KIND_TOOL
    tools = df[is_tool]
    tid = df["trajectory_id"].astype(object)
    abandoned = tools["latency_s"].isna() | (tools["outcome"] == "abandoned")
    retained = retained_tokens_at_pauses(df)
    by_class: dict[str, Any] = {}
    for cls, grp in tools.groupby(tools["tool_class"].astype(object), sort=True):
        q = quantiles(grp["latency_s"].dropna().to_numpy())
        by_class[str(cls)] = {
            "calls": int(len(grp)),
            "never_return": int(grp["latency_s"].isna().sum()),
            "errors": int((grp["outcome"] == "error").sum()),
            "latency_s": q,
        }
    llm_per_traj = (df["kind"] == KIND_LLM).groupby(tid, sort=False).sum()
    rq = quantiles(retained.to_numpy())
    rq["max"] = int(retained.max()) if len(retained) else None
    return {
        "trajectories": int(tid.nunique()),
        "steps": int(len(df)),
        "llm_calls": int((df["kind"] == KIND_LLM).sum()),
        "tool_calls": int(is_tool.sum()),
        "abandoned": int(abandoned.sum()),
        "abandoned_fraction": float(abandoned.mean()) if len(tools) else 0.0,
        "tool_calls_by_class": {k: v["calls"] for k, v in by_class.items()},
        "tool_latency_s": quantiles(tools["latency_s"].dropna().to_numpy()),
        "tool_latency_s_by_class": by_class,
        "retained_tokens": rq,
        "turns_per_trajectory": quantiles(llm_per_traj.to_numpy()),
        "input_tokens_total": int(df["input_tokens"].fillna(0).sum()),
        "output_tokens_total": int(df["output_tokens"].fillna(0).sum()),
    }
