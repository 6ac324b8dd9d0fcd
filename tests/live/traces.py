"""The small trace the live CLI tests replay: one LLM call, one tool pause, one resumed call."""

from __future__ import annotations

from pathlib import Path

from harness.traces.schema import SYNTHETIC_DEFAULTS, Provenance, steps_table, write_trajectories


def write_one_pause_trace(path: Path, first_input_tokens: int = 80) -> Path:
    """Trajectory "cli": `first_input_tokens` in + 4 out, a 0.1 s `cat`, then 8 in + 4 out."""
    rows = [{"step": 0, "kind": "llm", "input_tokens": first_input_tokens, "output_tokens": 4},
            {"step": 1, "kind": "tool", "tool_class": "local_read", "tool_name": "cat",
             "latency_s": 0.1, "deadline_s": 5.0, "outcome": "ok", "mutating": False},
            {"step": 2, "kind": "llm", "input_tokens": 8, "output_tokens": 4}]
    table = steps_table(rows, {**SYNTHETIC_DEFAULTS, "trajectory_id": "cli"})
    return write_trajectories(table, path, Provenance("test"))
