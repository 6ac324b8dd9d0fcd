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

from harness.metrics.bootstrap import DEFAULT_RESAMPLES, DEFAULT_SEED, mean_ci, quantile_ci
from harness.metrics.frames import NS_PER_S, Frames
from harness.metrics.outcomes import family_roots
from harness.traces.stats import quantiles

# Only a job whose root trajectory ran to its last step has a completion time: one that gave
# up (cancelled at a tool's deadline), failed or was stopped ended early or never, and would
# flatter the policy that made it so. They are counted beside the figures instead.
COMPLETED = "completed"


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
    is no job or one never ended (the batch did not finish: an interrupted run)."""
    if jobs.empty or jobs["end_ns"].isna().any():
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
    left = jobs.loc[jobs["jct_s"].isna(), "status"].fillna("incomplete")
    out["not_completed"] = {str(k): int(v) for k, v in left.value_counts().sort_index().items()}
    return out
