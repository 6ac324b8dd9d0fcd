"""Bootstrap intervals over trajectories for success, goodput and memory-time, and compare's
verdict on them: exact values where the bootstrap distribution is known in closed form."""

from __future__ import annotations

import numpy as np
import pytest
from records_factory import default_run
from report_fixtures import policy_run

from harness.metrics.bootstrap import NORMAL_ABOVE, mean_ci, mean_ratio_ci
from harness.metrics.frames import build_frames
from harness.metrics.outcomes import trajectory_units
from harness.metrics.summary import summarize
from harness.records.manifest import RunManifest
from harness.report.compare import IMPROVED, REGRESSED, SAME, unit_verdict


def test_mean_ci_exact_small_cases() -> None:
    # two units 0 and 1: resampled means are 0, 0.5, 1 with probabilities 1/4, 1/2, 1/4
    assert mean_ci([0.0, 1.0], n_resamples=4000) == [0.0, 1.0]
    assert mean_ci([3.0, 3.0, 3.0]) == [3.0, 3.0]
    assert mean_ci([1.0]) is None and mean_ci([]) is None


def test_mean_ci_of_many_units_is_the_normal_limit() -> None:
    units = np.tile([0.0, 1.0], (NORMAL_ABOVE + 2) // 2 + 1)
    lo, hi = mean_ci(units)  # type: ignore[misc]
    half = 1.96 * 0.5 / np.sqrt(units.size)
    assert lo == pytest.approx(0.5 - half, abs=0.15 * half)
    assert hi == pytest.approx(0.5 + half, abs=0.15 * half)


def test_mean_ratio_ci() -> None:
    assert mean_ratio_ci([2.0, 2.0, 2.0], [3.0, 3.0, 3.0]) == (1.5, 1.5)
    assert mean_ratio_ci([2.0, 2.0], [3.0, 3.0], scale=2.0) == (3.0, 3.0)
    assert mean_ratio_ci([0.0, 0.0], [1.0, 1.0]) is None  # a zero base mean
    assert mean_ratio_ci([1.0], [1.0, 2.0]) is None


def test_unit_verdicts() -> None:
    half = np.array([1.0, 0.0] * 50)
    most = np.array([1.0] * 90 + [0.0] * 10)
    ratio, ci, verdict = unit_verdict(half, most, 0.5, 0.9, 1.10, bigger_is_better=True)
    assert ratio == pytest.approx(1.8) and verdict == IMPROVED and ci is not None and ci[0] > 1
    assert unit_verdict(most, half, 0.9, 0.5, 1.10, True)[2] == REGRESSED
    assert unit_verdict(half, half.copy(), 0.5, 0.5, 1.10, True)[2] == SAME
    # memory-time, smaller is better: twice the paused memory is a regression
    mem = np.linspace(1.0, 3.0, 40)
    assert unit_verdict(mem, 2 * mem, 80.0, 160.0, 1.10, False)[2] == REGRESSED
    # no units to resample: the threshold alone
    assert unit_verdict(np.array([1.0]), np.array([1.0]), 1.0, 2.0, 1.10, False)[1] is None


def test_units_add_up_to_the_summary() -> None:
    recs = policy_run("keep", n_traj=12, tools=3, seed=2)
    run = RunManifest.from_dict(default_run())
    s = summarize(recs.frame(), run, None)
    units = trajectory_units(build_frames(recs.frame()), {})
    assert len(units) == s["trajectories"]["total"]
    assert int(units["success"].sum()) == s["trajectories"]["succeeded"]
    assert units["paused_token_s"].sum() == pytest.approx(s["memory_time_token_s"])
    ci = s["outcome_ci95"]
    rate = s["trajectories"]["succeeded"] / s["trajectories"]["total"]
    assert ci["success_rate"][0] <= rate <= ci["success_rate"][1]
    assert ci["goodput_per_min"][0] <= s["goodput_per_min"] <= ci["goodput_per_min"][1]
    lo, hi = ci["memory_time_mib_s"]
    assert lo <= s["memory_time_mib_s"] <= hi
