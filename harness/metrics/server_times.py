"""The server's own account of where a request's time went: queue and prefill, from its
Prometheus histograms (their _sum and _count), over the run.

The harness's resume parts split what the client sees: its own slot wait ("queue"), the
server's reported prompt time where it reports one per request (llama.cpp `timings`), and the
rest ("server wait"). vLLM and SGLang report no per-request prompt time in their stream, but
their /metrics keep histograms of every request's queue time (and vLLM's prefill time): the
difference between the first and the last sample of a run, sum over count, is the mean per
request the server finished in between, every request included (agents, bystanders, the
harness's probes). Labelled by the metric it came from, never mixed with the client's parts.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from harness.metrics.occupancy import per_sample_sum

# histogram family -> the part of a request's time it measures
FAMILIES: dict[str, str] = {
    "vllm:request_queue_time_seconds": "queue",
    "vllm:request_prefill_time_seconds": "prefill",
    "sglang:queue_time_seconds": "queue",
}


def _totals(samples: pd.DataFrame, name: str) -> pd.Series:
    """One counter's value at each sample time, summed over its label sets (engines)."""
    return per_sample_sum(samples[samples["name"].astype(object) == name])


def server_times(server_metrics: pd.DataFrame | None) -> dict[str, Any] | None:
    """{part: {source, requests, mean_ms}} for each family the server exported with at least
    two samples and requests finished between them; None when there is none."""
    if server_metrics is None or server_metrics.empty or "name" not in server_metrics.columns:
        return None
    out: dict[str, Any] = {}
    for family, part in FAMILIES.items():
        delta = histogram_delta(server_metrics, family)
        if delta is not None:
            n, total = delta
            out[part] = {"source": family, "requests": int(round(n)),
                         "mean_ms": 1e3 * total / n}
    return out or None


def histogram_delta(server_metrics: pd.DataFrame, family: str) -> tuple[float, float] | None:
    """(observations, their sum) a Prometheus histogram gained between the first and the last
    sample holding both its _count and its _sum (summed over label sets); None with fewer than
    two such samples or nothing observed between them (or a server restart)."""
    sums, counts = _totals(server_metrics, family + "_sum"), \
        _totals(server_metrics, family + "_count")
    both = pd.concat([sums.rename("sum"), counts.rename("count")], axis=1).dropna()
    if len(both) < 2:
        return None
    first, last = both.iloc[0], both.iloc[-1]
    n = float(last["count"] - first["count"])
    if n <= 0:
        return None
    return n, float(last["sum"] - first["sum"])
