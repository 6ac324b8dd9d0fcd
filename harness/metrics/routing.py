"""Where calls were served, for runtimes that say which worker served each call (Dynamo): did a
resumed call land on the worker that served the call before its pause, where its context is
cached? Pure: a function of the calls frame."""

from __future__ import annotations

from typing import Any

import pandas as pd


def routing(calls: pd.DataFrame) -> dict[str, Any] | None:
    """{calls, workers, calls_per_worker, resumed, resumed_same_worker, same_worker_share,
    cached_same / cached_moved (mean cached tokens of resumed calls that stayed / moved)} over
    the agent calls whose worker is known; None when no call names its worker."""
    if "served_by" not in calls.columns:
        return None
    agent = calls[~calls["bystander"]].copy()
    agent["worker"] = agent["served_by"].astype(object)
    agent = agent[agent["worker"].notna()]
    if agent.empty:
        return None
    agent = agent.sort_values(["tid", "step"])
    before = agent.groupby("tid", sort=False)["worker"].shift(1)
    resumed = agent["is_resume"].to_numpy(dtype=bool) & before.notna().to_numpy()
    same = resumed & (agent["worker"].to_numpy() == before.to_numpy())
    moved = resumed & ~same
    cached = agent["cached_tokens"].astype("float64")

    def mean(mask: Any) -> float | None:
        values = cached[mask].dropna()
        return float(values.mean()) if len(values) else None

    n_resumed = int(resumed.sum())
    per_worker = agent["worker"].value_counts()
    return {"calls": int(len(agent)), "workers": int(len(per_worker)),
            "calls_per_worker": {str(k): int(v) for k, v in sorted(per_worker.items())},
            "resumed": n_resumed, "resumed_same_worker": int(same.sum()),
            "same_worker_share": float(same.sum()) / n_resumed if n_resumed else None,
            "cached_same": mean(same), "cached_moved": mean(moved)}
