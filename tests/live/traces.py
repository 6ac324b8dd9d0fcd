"""The small trace the live CLI tests replay: one LLM call, one tool pause, one resumed call."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from harness.traces.schema import Provenance, write_trajectories


def write_one_pause_trace(path: Path, first_input_tokens: int = 80) -> Path:
    """Trajectory "cli": `first_input_tokens` in + 4 out, a 0.1 s `cat`, then 8 in + 4 out."""
    base = {"trajectory_id": "cli", "start_s": 0.0, "priority": "interactive", "tenant": "t",
            "prefix_group": None, "tool_name": None, "tool_class": None, "latency_s": None,
            "deadline_s": None, "outcome": None, "mutating": None, "input_tokens": None,
            "output_tokens": None}
    rows = [{"step": 0, "kind": "llm", "input_tokens": first_input_tokens, "output_tokens": 4},
            {"step": 1, "kind": "tool", "tool_class": "local_read", "tool_name": "cat",
             "latency_s": 0.1, "deadline_s": 5.0, "outcome": "ok", "mutating": False},
            {"step": 2, "kind": "llm", "input_tokens": 8, "output_tokens": 4}]
    df = pd.DataFrame([{**base, **r} for r in rows])
    for c in ("input_tokens", "output_tokens"):
        df[c] = df[c].astype("Int64")
    df["step"] = df["step"].astype("int32")
    df["mutating"] = df["mutating"].astype("boolean")
    return write_trajectories(df, path, Provenance("test"))
