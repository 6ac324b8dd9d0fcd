"""Measured prefix reuse: the share of agent prompt tokens the server reported cached, overall and
by the length of the pause before each call, in the buckets the trace's ideal uses
(harness.traces.reuse), so a report can set the two side by side."""

from __future__ import annotations

from typing import Any

import numpy as np

from harness.metrics.frames import Frames
from harness.traces.buckets import PAUSE_BUCKET_LABELS, bucket_index
from harness.traces.reuse import FIRST_CALL


def _rate(cached: float, prompt: float) -> float | None:
    return cached / prompt if prompt else None


def measured_reuse(frames: Frames) -> dict[str, Any] | None:
    """{calls, prompt_tokens, cached_tokens, hit_rate, by_bucket: [...]} over the agent calls
    that completed with a cached-token count; a resumed call goes in the bucket of the pause
    before it as it was measured (tool wait, sub-agents included), a trajectory's first call in
    FIRST_CALL. None when the server reported no cached counts."""
    calls = frames.calls[~frames.calls["bystander"] & frames.calls["ok"]
                         & frames.calls["cached_tokens"].notna()]
    if calls.empty:
        return None
    prompt = calls["prompt_tokens"].fillna(0.0).to_numpy(dtype="float64")
    cached = np.minimum(calls["cached_tokens"].to_numpy(dtype="float64"), prompt)
    wait = frames.pauses["wait_s"].reindex(calls["pause_id"]).to_numpy(dtype="float64") \
        if "pause_id" in calls.columns else np.full(len(calls), np.nan)
    resumed = calls["is_resume"].to_numpy(dtype=bool) & ~np.isnan(wait)
    first = ~calls["is_resume"].to_numpy(dtype=bool)
    bucket = np.where(resumed, bucket_index(wait), -1)

    def row(label: str, mask: np.ndarray) -> dict[str, Any]:
        p, c = float(prompt[mask].sum()), float(cached[mask].sum())
        return {"bucket": label, "calls": int(mask.sum()), "prompt_tokens": int(p),
                "cached_tokens": int(c), "hit_rate": _rate(c, p)}

    by_bucket = [row(FIRST_CALL, first)]
    by_bucket += [row(label, resumed & (bucket == b))
                  for b, label in enumerate(PAUSE_BUCKET_LABELS)]
    total = row("all", np.ones(len(calls), dtype=bool))
    del total["bucket"]
    return {**total, "by_bucket": by_bucket}


def reuse_rows(measured: dict[str, Any] | None, ideal: dict[str, Any] | None,
               policy: str | None) -> list[dict[str, Any]]:
    """One row per bucket with calls: measured hit rate beside the trace's ideal and the run's
    policy's unlimited-memory rate (None where unknown)."""
    ideal_by = {b["bucket"]: b for b in (ideal or {}).get("by_bucket", [])}
    rows = []
    for m in (measured or {}).get("by_bucket", []):
        i = ideal_by.get(m["bucket"], {})
        if not m["calls"] and not i.get("calls"):
            continue
        rows.append({"bucket": m["bucket"], "calls": m["calls"], "measured": m["hit_rate"],
                     "ideal": i.get("hit_rate"),
                     "policy_ideal": (i.get("policies") or {}).get(policy or "")})
    return rows

