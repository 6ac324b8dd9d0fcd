"""Task outcomes: trajectory success, SLO violations, goodput, and cache reuse vs intent."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from harness.errors import InputError
from harness.limits import MAX_SLO
from harness.metrics.frames import NS_PER_S, Frames

# SLO keys: a trajectory violates an SLO when any of its calls (or the whole) exceeds the bound.
SLO_KEYS: dict[str, str] = {
    "ttft_ms": "time to first token of every call (ms)",
    "tpot_ms": "time per output token of every call (ms)",
    "e2e_ms": "end-to-end latency of every call (ms)",
    "resume_ms": "resume latency after every tool (ms)",
    "trajectory_s": "whole trajectory, first arrival to end (s)",
}
MISMATCH_ABS_TOKENS = 16
MISMATCH_REL = 0.02
MISMATCH_LIST_CAP = 50


def check_slo(slo: dict[str, float] | None) -> dict[str, float]:
    """The SLO bounds as floats; InputError on an unknown key or a bound that is not a number
    in (0, MAX_SLO]."""
    out: dict[str, float] = {}
    for key, value in (slo or {}).items():
        if key not in SLO_KEYS:
            raise InputError(f"unknown SLO {key!r}; known: {', '.join(SLO_KEYS)}")
        try:
            out[key] = float(value)
        except (TypeError, ValueError):
            raise InputError(f"SLO {key!r} must be a number, got {value!r}") from None
        if not 0 < out[key] <= MAX_SLO:
            raise InputError(f"SLO {key!r} must be > 0 and <= {MAX_SLO:g}, got {value!r}")
    return out


def slo_violators(frames: Frames, slo: dict[str, float]) -> pd.Index:
    """Trajectory codes (index of frames.trajectories) that break any SLO bound."""
    calls = frames.calls[~frames.calls["bystander"]]
    bad = pd.Series(False, index=frames.trajectories.index)
    for key, bound in slo.items():
        if key == "trajectory_s":
            traj = frames.trajectories
            dur = (traj["end_ns"] - traj["start_ns"]) / NS_PER_S
            bad |= (dur > bound).fillna(False)
            continue
        worst = calls[key].groupby(calls["_code"]).max()
        over = worst[worst > bound].index
        bad |= bad.index.isin(over)
    return bad[bad].index


def trajectory_outcomes(frames: Frames, slo: dict[str, float]) -> dict[str, int]:
    """Agent trajectory counts: total, succeeded, cancelled, failed, interrupted, slo_violating,
    incomplete.

    succeeded = completed within every SLO; slo_violating = completed but breaking one;
    incomplete = no trajectory_end recorded.
    """
    traj = frames.trajectories[~frames.trajectories["bystander"]]
    status = traj["status"].astype(object)
    completed = status == "completed"
    violating = traj.index.isin(slo_violators(frames, slo)) & completed.to_numpy()
    return {
        "total": int(len(traj)),
        "succeeded": int(completed.sum() - violating.sum()),
        "cancelled": int((status == "cancelled").sum()),
        "failed": int((status == "failed").sum()),
        "interrupted": int((status == "interrupted").sum()),
        "slo_violating": int(violating.sum()),
        "incomplete": int(status.isna().sum()),
    }


def goodput_per_min(succeeded: int, duration_s: float) -> float | None:
    """Successful trajectories per minute of run time; None for a zero-length run."""
    return succeeded / (duration_s / 60.0) if duration_s > 0 else None


def cache_mismatches(
    frames: Frames,
    abs_tokens: int = MISMATCH_ABS_TOKENS,
    rel: float = MISMATCH_REL,
) -> pd.DataFrame:
    """Resumed calls whose server-reported cached tokens contradict the pause decision.

    keep / swap (and ttl that was kept, or swapped out when it expired) should reuse the
    retained tokens: cached >= retained - tol; recompute (and ttl erased without a swap-out)
    should reuse nothing: cached <= tol;
    tol = max(abs_tokens, rel x retained). Calls without a cached count are not judged.
    """
    p = frames.pauses
    judged = p[p["resume_cached_tokens"].notna() & p["action"].notna()]
    action = judged["action"].astype(object)
    retained = judged["retained_tokens"].fillna(0.0)
    cached = judged["resume_cached_tokens"]
    tol = np.maximum(float(abs_tokens), rel * retained)
    discarded = judged["erased"].astype(bool) & (judged["swap_in_bytes"] <= 0)
    expect_reuse = action.isin(["keep", "swap"]) | ((action == "ttl") & ~discarded)
    expect_none = (action == "recompute") | ((action == "ttl") & discarded)
    bad = (expect_reuse & (cached < retained - tol)) | (expect_none & (cached > tol))
    out = judged[bad]
    return pd.DataFrame({
        "trajectory_id": out["tid"].astype(object),
        "step": out["step"],
        "action": out["action"].astype(object),
        "retained_tokens": out["retained_tokens"],
        "cached_tokens": out["resume_cached_tokens"],
        "expected": np.where(expect_reuse[bad], "reuse", "recompute"),
    })


def mismatch_list(mismatches: pd.DataFrame, cap: int = MISMATCH_LIST_CAP) -> list[dict[str, Any]]:
    """The first `cap` mismatches as JSON-ready dicts."""
    rows = []
    for r in mismatches.head(cap).to_dict("records"):
        rows.append({
            "trajectory_id": str(r["trajectory_id"]),
            "step": _int_or_none(r["step"]),
            "action": str(r["action"]),
            "retained_tokens": _int_or_none(r["retained_tokens"]),
            "cached_tokens": _int_or_none(r["cached_tokens"]),
            "expected": str(r["expected"]),
        })
    return rows


def _int_or_none(value: Any) -> int | None:
    try:
        f = float(value)
    except (TypeError, ValueError):
        return None
    return None if np.isnan(f) else int(f)


def trajectory_units(frames: Frames, slo: dict[str, float]) -> pd.DataFrame:
    """One row per agent trajectory (the bootstrap's unit): `success` (1.0 when it completed
    within every SLO) and `paused_token_s` (the device KV it held while paused)."""
    traj = frames.trajectories[~frames.trajectories["bystander"]]
    completed = (traj["status"].astype(object) == "completed").to_numpy()
    violating = traj.index.isin(slo_violators(frames, slo))
    kv = frames.kv
    if len(kv):
        paused = kv[kv["status"].astype(object) == "paused"]
        tok_s = (paused["kv_tokens"] * paused["dt_ns"] / NS_PER_S).groupby(paused["_code"]).sum()
    else:
        tok_s = pd.Series(dtype="float64")
    return pd.DataFrame({"success": (completed & ~violating).astype("float64"),
                         "paused_token_s": tok_s.reindex(traj.index).fillna(0.0).to_numpy(
                             dtype="float64")}, index=traj.index)
