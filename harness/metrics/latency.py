"""Latency metrics: resume latency and its parts, TTFT, TPOT, ITL, E2E, bystander TTFT."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from harness.metrics.bootstrap import DEFAULT_RESAMPLES, DEFAULT_SEED, quantile_ci
from harness.metrics.frames import token_gaps_ms
from harness.traces.buckets import PAUSE_BUCKETS
from harness.traces.stats import quantiles


def pct(values: pd.Series | np.ndarray) -> dict[str, Any]:
    """{'n', 'p50', 'p95', 'p99'} of the finite values; quantiles None when n = 0."""
    return quantiles(np.asarray(values, dtype="float64"))


def resume_samples(calls: pd.DataFrame) -> np.ndarray:
    """Resume latency (ms) of every resumed agent call that produced a first token."""
    agent = calls[~calls["bystander"]]
    return agent["resume_ms"].dropna().to_numpy(dtype="float64")


def resume_latency(
    calls: pd.DataFrame, n_resamples: int = DEFAULT_RESAMPLES, seed: int = DEFAULT_SEED
) -> dict[str, Any]:
    """Resume latency percentiles with seeded bootstrap 95% confidence intervals."""
    xs = resume_samples(calls)
    out = pct(xs)
    out["ci95"] = quantile_ci(xs, n_resamples=n_resamples, seed=seed)
    return out


def resume_parts(calls: pd.DataFrame) -> dict[str, Any]:
    """Percentiles of the restore, queue, prefill and server-wait parts of resume latency
    (server wait only over calls whose server reports its prompt time), and of the part of the
    server wait spent in the engine's queue, as the server reports it (vLLM; the rest of the
    server wait is the request's way to the engine and the first token's way back)."""
    has = calls["resume_ms"].notna() & ~calls["bystander"]
    return {part: pct(calls.loc[has, f"{part}_ms"].dropna())
            for part in ("restore", "queue", "prefill", "server_wait", "engine_queue")}


def call_latency(calls: pd.DataFrame) -> dict[str, Any]:
    """TTFT, TPOT, ITL and E2E percentiles over agent calls, TTFT over bystander calls. ITL is
    over every inter-token gap the client recorded (`itl_source` "client chunk times"); over
    calls without them (a simulation, older records) it is each call's server decode time per
    token ("server decode per token")."""
    agent = calls[~calls["bystander"]]
    gaps = token_gaps_ms(agent)
    return {
        "ttft_ms": pct(agent["ttft_ms"]),
        "tpot_ms": pct(agent["tpot_ms"]),
        "itl_ms": pct(gaps) if gaps.size else pct(agent["itl_ms"]),
        "itl_source": "client chunk times" if gaps.size else "server decode per token",
        "e2e_ms": pct(agent["e2e_ms"]),
        "bystander_ttft_ms": pct(calls.loc[calls["bystander"], "ttft_ms"]),
    }


def throughput(calls: pd.DataFrame, duration_s: float) -> dict[str, float | None]:
    """Completed calls and output tokens (all traffic) per second of run time."""
    if duration_s <= 0:
        return {"request_throughput_per_s": None, "output_token_throughput_per_s": None}
    ok = calls["ok"]
    return {
        "request_throughput_per_s": float(ok.sum()) / duration_s,
        "output_token_throughput_per_s": float(calls.loc[ok, "output_tokens"].fillna(0).sum())
        / duration_s,
    }


def bucket_of(wait_s: pd.Series) -> pd.Series:
    """The pause-length bucket label of each actual tool wait (seconds)."""
    labels = [b[0] for b in PAUSE_BUCKETS]
    edges = [b[1] for b in PAUSE_BUCKETS] + [float("inf")]
    cut = pd.cut(wait_s.astype("float64"), bins=edges, right=False, labels=labels)
    return cut.astype(object)
