"""Why the advisor chose what it chose, per tool class: how long the class's pauses are, what
the context held across them costs to bring back (swap-in vs re-prefill, from the calibration),
and what the recommended policy did at them (in its simulated run at the operating point)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from harness.metrics.latency import pct
from harness.metrics.summary import load_frames
from harness.model.calibration import Calibration
from harness.traces.schema import KIND_TOOL
from harness.traces.stats import retained_tokens_at_pauses


def explain(steps: pd.DataFrame, calibration: Calibration, actions_dir: Path | None
            ) -> list[dict[str, Any]]:
    """One row per tool class of the (token-scaled) trace; `actions_dir`: the recommended
    candidate's results directory at the operating point, whose pause decisions are counted."""
    tools = steps[(steps["kind"] == KIND_TOOL).to_numpy()]
    retained = retained_tokens_at_pauses(steps)
    rates = calibration.rates()
    actions: dict[str, dict[str, int]] = {}
    if actions_dir is not None and actions_dir.is_dir():
        pauses = load_frames(actions_dir)[0].pauses
        for cls, act in zip(pauses["tool_class"].astype(object), pauses["action"].astype(object),
                            strict=True):
            per = actions.setdefault(str(cls), {})
            per[str(act)] = per.get(str(act), 0) + 1
    rows = []
    for cls, grp in tools.groupby(tools["tool_class"].astype(object), sort=True):
        held = retained.reindex(grp.index).dropna()
        typical = float(held.median()) if len(held) else 0.0
        rows.append({
            "tool_class": str(cls), "pauses": int(len(grp)),
            "wait_s": pct(grp["latency_s"].astype("float64").dropna()),
            "retained_tokens": pct(held),
            "restore_ms": {"swap": 1e3 * rates.restore_s(int(typical)),
                           "recompute": 1e3 * rates.recompute_s(int(typical))},
            "actions": actions.get(str(cls), {}),
        })
    return rows
