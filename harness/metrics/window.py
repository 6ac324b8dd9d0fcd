"""The figures of a run's measurement window: what a steady-state point of a capacity search is
judged on. Pure functions of the linked frames.

A bounded run (`harness run --duration D --warmup W`, or a capacity point) is measured over
[W, D): the first W seconds, while the agents' first trajectories line up, are left out, and so
is whatever the horizon cut short. Resume latency counts the resumes whose tool returned in the
window; TTFT the calls sent in it; success and goodput the tasks (root trajectories with their
sub-agents) that ended in it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from harness.metrics import latency, outcomes
from harness.metrics.frames import NS_PER_S, Frames
from harness.metrics.summary import load_frames

WINDOW_JSON = "window.json"
# A point saturates when its second half's mean TTFT is this many times its first half's, and
# longer by this many ms: queues that grow through the window, not a steady state (the floor
# keeps millisecond jitter on a fast server from reading as a queue).
QUEUE_GROWTH_SATURATED = 1.5
QUEUE_GROWTH_MIN_MS = 250.0
HORIZON_REASON = "run-horizon"


def _in(ns: pd.Series, start_s: float, end_s: float) -> pd.Series:
    t = ns.astype("float64") / NS_PER_S
    return (t >= start_s) & (t < end_s)


def mean_paused_tokens(frames: Frames, start_s: float, end_s: float) -> float:
    """The mean KV tokens held by paused requests over [start_s, end_s)."""
    kv = frames.kv
    if not len(kv) or end_s <= start_s:
        return 0.0
    paused = kv[kv["status"].astype(object) == "paused"]
    t0 = paused["t_ns"].to_numpy(dtype="float64") / NS_PER_S
    t1 = t0 + paused["dt_ns"].to_numpy(dtype="float64") / NS_PER_S
    overlap = np.clip(np.minimum(t1, end_s) - np.maximum(t0, start_s), 0.0, None)
    tokens = paused["kv_tokens"].to_numpy(dtype="float64")
    return float(np.nansum(tokens * overlap) / (end_s - start_s))


# Fewer calls than this in either half of a window say nothing about a trend.
MIN_TREND_CALLS = 5


def ttft_halves(calls: pd.DataFrame, start_s: float, end_s: float
                ) -> tuple[float, float] | None:
    """Mean TTFT (ms) of the calls sent in the window's first half and in its second (None
    with fewer than MIN_TREND_CALLS calls in either half)."""
    mid = (start_s + end_s) / 2
    first = calls.loc[_in(calls["start_ns"], start_s, mid), "ttft_ms"].dropna()
    second = calls.loc[_in(calls["start_ns"], mid, end_s), "ttft_ms"].dropna()
    if min(len(first), len(second)) < MIN_TREND_CALLS:
        return None
    return float(first.mean()), float(second.mean())


def queue_growth(calls: pd.DataFrame, start_s: float, end_s: float) -> float | None:
    """The second half's mean TTFT over the first half's (ttft_halves): above 1 the queue grew
    while the window was measured."""
    halves = ttft_halves(calls, start_s, end_s)
    if halves is None or halves[0] <= 0:
        return None
    return halves[1] / halves[0]


def window_figures(frames: Frames, warmup_s: float, end_s: float | None,
                   bpt: float | None = None, n_resamples: int = 1000,
                   seed: int = 0) -> dict[str, Any]:
    """Resume latency (with bootstrap CIs), TTFT, task success, goodput, jobs per hour, mean
    paused KV and queue growth over [warmup_s, end_s) (end_s None: the run's end). The
    window is cut to what the run measured (a run whose work ran out early)."""
    ran = frames.duration_s
    end = ran if end_s is None else min(end_s, ran)
    start = min(warmup_s, end)
    span = max(end - start, 0.0)
    calls = frames.calls[~frames.calls["bystander"]]
    resumed = calls[_in(calls["tool_end_ns"], start, end)]
    resume = latency.resume_latency(resumed, n_resamples, seed)
    sent = calls[_in(calls["start_ns"], start, end)]
    traj = frames.trajectories
    units = outcomes.trajectory_units(frames, {})
    roots = traj.reindex(units.index)
    ended = _in(roots["end_ns"].fillna(np.inf), start, end) & (
        roots["reason"].astype(object) != HORIZON_REASON)
    done = units[ended.to_numpy()]
    succeeded = int(done["success"].sum())
    per_min = succeeded / (span / 60.0) if span > 0 else None
    paused = mean_paused_tokens(frames, start, end)
    return {
        "window_s": [start, end],
        "measured_s": span,
        "resume_latency_ms": resume,
        "ttft_ms": latency.pct(sent["ttft_ms"]),
        "calls": int(len(sent)),
        "tasks": {"ended": int(len(done)), "succeeded": succeeded,
                  "cut_at_horizon": int((roots["reason"].astype(object)
                                         == HORIZON_REASON).sum())},
        "success_rate": float(done["success"].mean()) if len(done) else None,
        "goodput_per_min": per_min,
        "jobs_per_hour": None if per_min is None else 60.0 * per_min,
        "kv_paused_mean_tokens": paused,
        "kv_paused_mean_mib": None if bpt is None else paused * bpt / 2**20,
        "queue_growth": queue_growth(sent, start, end),
        "ttft_halves_ms": ttft_halves(sent, start, end),
    }


def window_of_dir(results_dir: Any, warmup_s: float, end_s: float | None,
                  bpt: float | None = None) -> dict[str, Any]:
    """`window_figures` of a results directory's records."""
    frames, _, _ = load_frames(results_dir)
    return window_figures(frames, warmup_s, end_s, bpt)
