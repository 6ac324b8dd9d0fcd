"""Where calls were served, for runtimes that say which worker served each call (Dynamo): did a
resumed call land on the worker that served the call before its pause, where its context is
cached? And what the router itself says of its choices (Dynamo's KV router, from /metrics).
Pure: functions of the calls frame and the scraped server samples."""

from __future__ import annotations

from typing import Any

import pandas as pd

from harness.metrics.occupancy import per_sample_sum
from harness.metrics.server_times import histogram_delta

# Dynamo's KV router: its predicted hit rate per routed request (a histogram), and the cached
# prefix tokens on the workers it chose against the best it could have chosen (counters).
ROUTER_HIT_RATE = "dynamo_component_router_kv_hit_rate"
ROUTER_SELECTED = "dynamo_component_router_kv_selected_cached_prefix_tokens_total"
ROUTER_BEST = "dynamo_component_router_kv_best_eligible_cached_prefix_tokens_total"


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


def _delta(samples: pd.DataFrame, name: str) -> float | None:
    """A counter's increase between the run's first and last sample (summed over labels)."""
    series = per_sample_sum(samples[samples["name"].astype(object) == name]).dropna()
    return float(series.iloc[-1] - series.iloc[0]) if len(series) >= 2 else None


def router_report(server_metrics: pd.DataFrame | None) -> dict[str, Any] | None:
    """{source, routed, predicted_hit_rate, selected_prefix_tokens, best_prefix_tokens} from
    the KV router's own metrics over the run; None where the server exports none (another
    runtime, or a router mode that does not weigh cache overlap)."""
    if server_metrics is None or server_metrics.empty or "name" not in server_metrics.columns:
        return None
    hit_rate = histogram_delta(server_metrics, ROUTER_HIT_RATE)
    if hit_rate is None:
        return None
    routed, rate_sum = hit_rate
    return {"source": "the KV router's /metrics", "routed": int(round(routed)),
            "predicted_hit_rate": rate_sum / routed,
            "selected_prefix_tokens": _delta(server_metrics, ROUTER_SELECTED),
            "best_prefix_tokens": _delta(server_metrics, ROUTER_BEST)}
