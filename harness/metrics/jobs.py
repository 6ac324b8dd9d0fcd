"""Job-level metrics: a task's completion time from its arrival to its end, and a batch's
makespan.

A job is a task: a root trajectory with every sub-agent it spawned, at any depth. Its
completion time (JCT) runs from the root's arrival (when it was due: the open loop's planned
time, or when a closed loop's agent took it up) to the end of the last of its trajectories,
tool waits and queueing included: what an agent's user waits for, and what Continuum's and
InferCept's headline figures measure. Pure functions of the frames.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from harness.metrics.bootstrap import (
    DEFAULT_RESAMPLES,
    DEFAULT_SEED,
    mean_ci,
    mean_ratio_ci,
    quantile_ci,
    ratio_ci,
)
from harness.metrics.frames import NS_PER_S, Frames
from harness.metrics.outcomes import family_roots
from harness.traces.stats import quantiles

# Only a job whose root trajectory ran to its last step has a completion time: one that gave
# up (cancelled at a tool's deadline), failed or was stopped ended early or never, and would
# flatter the policy that made it so. They are counted beside the figures instead.
COMPLETED = "completed"
# A job that ended by itself, whatever the outcome; `interrupted` is the run's stop, not its.
ENDED_BY_ITSELF = ("completed", "cancelled", "failed")


def job_table(frames: Frames) -> pd.DataFrame:
    """One row per job (indexed by its root's trajectory code): `arrival_ns`, `end_ns` (the
    last end among its trajectories; NaN while any has none), `status` (the root's end
    status; NaN when it has none) and `jct_s` (NaN unless the root completed)."""
    traj = frames.trajectories[~frames.trajectories["bystander"]]
    if traj.empty:
        return pd.DataFrame({"arrival_ns": [], "end_ns": [], "status": [], "jct_s": []})
    root = pd.Series(family_roots(traj), index=traj.index)
    ends = traj["end_ns"].astype("float64")
    # max() skips NaN; a family with any trajectory still open has no end yet.
    last = ends.groupby(root).max().where(ends.isna().groupby(root).sum() == 0)
    roots = root[root.index == root.to_numpy()].index
    out = pd.DataFrame({"arrival_ns": traj.loc[roots, "arrival_ns"].astype("float64"),
                        "end_ns": last.reindex(roots),
                        "status": traj.loc[roots, "status"].astype(object)}, index=roots)
    done = (out["status"] == COMPLETED) & out["end_ns"].notna()
    out["jct_s"] = ((out["end_ns"] - out["arrival_ns"]) / NS_PER_S).where(done)
    return out


def jct_samples(frames: Frames) -> np.ndarray:
    """The completion times (s) of the jobs that completed."""
    xs: np.ndarray = job_table(frames)["jct_s"].dropna().to_numpy(dtype="float64")
    return xs


def makespan_s(jobs: pd.DataFrame) -> float | None:
    """A batch's makespan: from the first job's arrival to the last job's end. None when there
    is no job or one did not run to its own end (never ended, or was stopped with the run:
    the batch did not finish)."""
    if (jobs.empty or jobs["end_ns"].isna().any()
            or not jobs["status"].isin(ENDED_BY_ITSELF).all()):
        return None
    return float((jobs["end_ns"].max() - jobs["arrival_ns"].min()) / NS_PER_S)


def job_completion(jobs: pd.DataFrame, n_resamples: int = DEFAULT_RESAMPLES,
                   seed: int = DEFAULT_SEED) -> dict[str, Any]:
    """{'n', 'mean', 'p50', 'p95', 'p99', 'ci95': {mean, p50, p95, p99}, 'not_completed':
    {status: jobs}} of a `job_table`, over the jobs that completed, in seconds (bootstrap 95%
    intervals, seeded; a job without an end status counts as 'incomplete')."""
    xs = jobs["jct_s"].dropna().to_numpy(dtype="float64")
    out = quantiles(xs)
    out["mean"] = float(xs.mean()) if xs.size else None
    ci: dict[str, list[float] | None] = {"mean": mean_ci(xs, n_resamples=n_resamples,
                                                         seed=seed)}
    ci.update(quantile_ci(xs, n_resamples=n_resamples, seed=seed))
    out["ci95"] = ci
    out["not_completed"] = not_completed(jobs)
    return out


def not_completed(jobs: pd.DataFrame) -> dict[str, int]:
    """{status: jobs} of a `job_table`'s jobs without a completion time (a job without an end
    status counts as 'incomplete')."""
    left = jobs.loc[jobs["jct_s"].isna(), "status"].fillna("incomplete")
    return {str(k): int(v) for k, v in left.value_counts().sort_index().items()}


def speedups(base: np.ndarray, new: np.ndarray, n_resamples: int = DEFAULT_RESAMPLES,
             seed: int = DEFAULT_SEED) -> dict[str, dict[str, Any]]:
    """How many times shorter NEW's completion times are than BASE's: {mean, p50, p95, p99:
    {'ratio': BASE / NEW, 'ci95': [lo, hi] or None}}, each interval a seeded bootstrap that
    resamples both sides (None with fewer than 2 jobs on a side). Above 1: NEW is faster."""
    xb = np.asarray(base, dtype="float64")
    xn = np.asarray(new, dtype="float64")
    xb, xn = xb[np.isfinite(xb)], xn[np.isfinite(xn)]
    out: dict[str, dict[str, Any]] = {}

    def inverted(ci: tuple[float, float] | None) -> list[float] | None:
        return None if ci is None or ci[0] <= 0 else [1.0 / ci[1], 1.0 / ci[0]]

    if not xb.size or not xn.size:
        return {k: {"ratio": None, "ci95": None} for k in ("mean", "p50", "p95", "p99")}
    out["mean"] = {"ratio": float(xb.mean() / xn.mean()) if xn.mean() > 0 else None,
                   "ci95": inverted(mean_ratio_ci(xb, xn, n_resamples=n_resamples, seed=seed))}
    for q in (50, 95, 99):
        qn = float(np.percentile(xn, q))
        out[f"p{q}"] = {"ratio": float(np.percentile(xb, q)) / qn if qn > 0 else None,
                        "ci95": inverted(ratio_ci(xb, xn, q, n_resamples=n_resamples,
                                                  seed=seed))}
    return out
