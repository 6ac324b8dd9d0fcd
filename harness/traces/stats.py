"""Descriptive statistics of a trajectory table (what `harness traces describe` prints)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from harness.traces.context import context_lengths
from harness.traces.reuse import ideal_reuse
from harness.traces.schema import KIND_LLM, KIND_TOOL, TOOL_SUBAGENT, Provenance, gap_steps


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
    """Tokens held in KV at each tool step: the context its trajectory's calls built before it
    (everything appended and generated, less what a `keep_tokens` cut dropped)."""
    before = pd.Series(context_lengths(df).before, index=df.index)
    return before[(df["kind"] == KIND_TOOL).to_numpy()]


def subagent_counts(df: pd.DataFrame) -> dict[str, int]:
    """Sub-agents of a validated frame: `children` (trajectories with a parent),
    `subagent_steps` (tool steps that start them), `max_fanout` (most started by one step)."""
    tid = df["trajectory_id"].astype(object)
    is_spawn = (df["kind"] == KIND_TOOL) & (df["tool_class"].astype(object) == TOOL_SUBAGENT)
    if "parent_id" not in df.columns:
        return {"children": 0, "subagent_steps": int(is_spawn.sum()), "max_fanout": 0}
    child = df["parent_id"].notna()
    kids = df.loc[child, ["parent_id", "spawn_step", "trajectory_id"]].astype(object)
    fan = kids.drop_duplicates().groupby(["parent_id", "spawn_step"]).size()
    return {"children": int(tid[child].nunique()), "subagent_steps": int(is_spawn.sum()),
            "max_fanout": int(fan.max()) if len(fan) else 0}


def import_summary(provenance: Provenance | None) -> dict[str, Any] | None:
    """What an importer counted over its source (provenance extra "files" and "totals"), or
    None when the file's provenance has neither."""
    if provenance is None:
        return None
    found: dict[str, Any] = {k: provenance.extra[k] for k in ("files", "totals")
                             if k in provenance.extra}
    return found or None


def describe(df: pd.DataFrame, provenance: Provenance | None = None) -> dict[str, Any]:
    """Summary of a validated trajectory frame; keys documented in the README. With the file's
    `provenance`, an importer's source counts are added under "import". A gap step between
    back-to-back calls (schema.gap_steps) is counted as one, not as a tool call."""
    gaps = gap_steps(df)
    is_tool = (df["kind"] == KIND_TOOL) & ~gaps
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
        "gap_steps": int(gaps.sum()),
        "abandoned": int(abandoned.sum()),
        "abandoned_fraction": float(abandoned.mean()) if len(tools) else 0.0,
        "tool_calls_by_class": {k: v["calls"] for k, v in by_class.items()},
        "tool_latency_s": quantiles(tools["latency_s"].dropna().to_numpy()),
        "tool_latency_s_by_class": by_class,
        "retained_tokens": rq,
        "turns_per_trajectory": quantiles(llm_per_traj.to_numpy()),
        "input_tokens_total": int(df["input_tokens"].fillna(0).sum()),
        "output_tokens_total": int(df["output_tokens"].fillna(0).sum()),
        "subagents": subagent_counts(df),
        "ideal_reuse": ideal_reuse(df),
        **({"import": imported} if (imported := import_summary(provenance)) else {}),
    }
