"""KV occupancy from kv_state events: paused vs active tokens over time, and memory-time."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pandas as pd

MIB = float(1 << 20)
NS_PER_S = 1e9

# Server gauges that describe KV occupancy (vLLM kv_cache_usage_perc, SGLang token_usage, slots).
KV_GAUGE = re.compile(r"kv|cache_usage|token_usage|tokens_used|n_past|slot", re.IGNORECASE)
MAX_GAUGES = 20


def kv_series(kv: pd.DataFrame) -> pd.DataFrame:
    """Total paused and active KV tokens after each instant: columns t_ns, paused, active."""
    if kv.empty:
        return pd.DataFrame({"t_ns": np.zeros(0, "int64"), "paused": np.zeros(0),
                             "active": np.zeros(0)})
    tokens = kv["kv_tokens"].to_numpy(dtype="float64")
    status = kv["status"].astype(object).to_numpy()
    frame = pd.DataFrame({
        "_code": kv["_code"].to_numpy(),
        "paused": np.where(status == "paused", tokens, 0.0),
        "active": np.where(status == "active", tokens, 0.0),
    })
    prev = frame.groupby("_code")[["paused", "active"]].shift(1).fillna(0.0)
    delta = frame[["paused", "active"]] - prev
    delta["t_ns"] = kv["t_ns"].to_numpy(dtype="int64")
    delta = delta.sort_values("t_ns", kind="stable")
    totals = delta[["paused", "active"]].cumsum()
    totals["t_ns"] = delta["t_ns"].to_numpy()
    return totals.groupby("t_ns", sort=True).last().reset_index()


def memory_time(
    kv: pd.DataFrame, duration_s: float, kv_bytes_per_token: float | None
) -> dict[str, Any]:
    """Paused KV token-seconds and MiB-seconds, and peak and time-mean paused / active tokens."""
    status = kv["status"].astype(object).to_numpy() if len(kv) else np.zeros(0, dtype=object)
    tok_s = (kv["kv_tokens"] * kv["dt_ns"] / NS_PER_S).to_numpy(dtype="float64") if len(kv) \
        else np.zeros(0)
    paused_ts = float(tok_s[status == "paused"].sum())
    active_ts = float(tok_s[status == "active"].sum())
    series = kv_series(kv)
    return {
        "memory_time_token_s": paused_ts,
        "memory_time_mib_s": to_mib(paused_ts, kv_bytes_per_token),
        "kv_paused_peak_tokens": float(series["paused"].max()) if len(series) else 0.0,
        "kv_paused_mean_tokens": paused_ts / duration_s if duration_s > 0 else None,
        "kv_active_peak_tokens": float(series["active"].max()) if len(series) else 0.0,
        "kv_active_mean_tokens": active_ts / duration_s if duration_s > 0 else None,
    }


def to_mib(token_s: float, kv_bytes_per_token: float | None) -> float | None:
    """Token-seconds -> MiB-seconds; None when the bytes per token are unknown."""
    if kv_bytes_per_token is None:
        return None
    return token_s * float(kv_bytes_per_token) / MIB


def per_sample_sum(rows: pd.DataFrame) -> pd.Series:
    """A server series' value at each sample time (sorted), summed over its label sets (slots,
    engines); samples without a number are dropped."""
    values = pd.to_numeric(rows["value"], errors="coerce")
    return values.groupby(rows["t_ns"]).sum(min_count=1).dropna()


def server_occupancy(server_metrics: pd.DataFrame | None) -> dict[str, Any] | None:
    """Stats of the runtime's KV gauges ({name: {n, mean, max, last}}); None without samples.

    Series of one name with several label sets (e.g. one per slot) are summed per instant.
    """
    if server_metrics is None or server_metrics.empty or "name" not in server_metrics.columns:
        return None
    names = server_metrics["name"].astype(object)
    keep = [n for n in names.unique() if KV_GAUGE.search(str(n))]
    picked = server_metrics[names.isin(keep)]
    out: dict[str, Any] = {}
    for name, grp in picked.groupby(picked["name"].astype(object), sort=True):
        if len(out) >= MAX_GAUGES:
            break
        per_t = per_sample_sum(grp)
        if per_t.empty:
            continue
        out[str(name)] = {"n": int(per_t.size), "mean": float(per_t.mean()),
                          "max": float(per_t.max()), "last": float(per_t.iloc[-1])}
    return out or None


# The server's own count of tokens in its KV cache, by preference: llama.cpp's /slots (each
# slot's cached prompt tokens), SGLang's token gauges. (vLLM reports a usage fraction only.)
SERVER_KV_TOKENS: tuple[tuple[str, str, str], ...] = (
    ("slots", "n_prompt_tokens", "server: tokens in its slots (/slots)"),
    ("metrics", "sglang:num_used_tokens", "server: sglang:num_used_tokens"),
    ("metrics", "sglang:kv_used_tokens", "server: sglang:kv_used_tokens"),
)


def server_kv_tokens(server_metrics: pd.DataFrame | None
                     ) -> tuple[str, pd.DataFrame] | None:
    """(label, frame of t_ns and tokens) of the first SERVER_KV_TOKENS series the server
    reported, summed over its label sets (slots) at each sample; None when it reported none."""
    if server_metrics is None or server_metrics.empty or "name" not in server_metrics.columns:
        return None
    names = server_metrics["name"].astype(object)
    sources = server_metrics["source"].astype(object)
    for source, name, label in SERVER_KV_TOKENS:
        rows = server_metrics[(sources == source) & (names == name)]
        if rows.empty:
            continue
        per_t = per_sample_sum(rows)
        if not per_t.empty:
            return label, pd.DataFrame({"t_ns": per_t.index.to_numpy(dtype="int64"),
                                        "tokens": per_t.to_numpy(dtype="float64")})
    return None
