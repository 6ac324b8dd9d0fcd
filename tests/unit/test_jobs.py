"""Job completion time and makespan: exact values from hand-built records."""

from __future__ import annotations

import numpy as np
import pytest

from harness.metrics.frames import build_frames
from harness.metrics.jobs import jct_samples, job_completion, job_table, makespan_s
from harness.metrics.summary import summarize
from harness.records.manifest import RunManifest
from harness.report.compare import IMPROVED, SAME, mean_verdict, sample_verdict
from tests.unit.records_factory import Records


def _batch() -> Records:
    """Three jobs: `a` alone (due at 0, ends at 6.5), `b` due at 1 but started at 1.5 with a
    sub-agent that ends after b's own last call would have (b ends at 9.0), `c` cancelled."""
    b = Records()
    a = b.agent("a", at=0.0)
    a.call(ttft=0.1, decode=0.4).tool(wait=5.0).call(ttft=0.1, decode=0.9).end()
    p = b.agent("b", at=1.5, planned=1.0)
    p.call(ttft=0.1, decode=0.4)  # 1.5 -> 2.0
    kid = b.agent("b/1", at=2.0, parent="b")
    kid.call(ttft=0.2, decode=2.8).end()  # 2.0 -> 5.0
    p.tool(wait=3.0, cls="subagent").call(ttft=0.5, decode=3.5).end()  # 5.0 -> 9.0
    c = b.agent("c", at=0.5)
    c.call(ttft=0.1, decode=0.4).cancel()
    return b


def test_a_job_runs_from_its_root_s_arrival_to_its_last_end() -> None:
    frames = build_frames(_batch().frame())
    jobs = job_table(frames)
    assert len(jobs) == 3  # the sub-agent is part of b's job, not a job of its own
    by_arrival = jobs.sort_values("arrival_ns")  # a (0), c (0.5), b (due at 1, not 1.5)
    np.testing.assert_allclose(by_arrival["arrival_ns"] / 1e9, [0.0, 0.5, 1.0])
    np.testing.assert_allclose(by_arrival["jct_s"], [6.5, np.nan, 8.0])  # c was cancelled
    assert by_arrival["status"].tolist() == ["completed", "cancelled", "completed"]
    assert sorted(jct_samples(frames).round(9).tolist()) == [6.5, 8.0]
    assert makespan_s(jobs) == pytest.approx(9.0)


def test_summary_counts_jobs_that_did_not_complete_beside_the_figures() -> None:
    s = summarize(_batch().frame(), RunManifest(run_id="run"), None, n_resamples=200)
    jct = s["job_completion_s"]
    assert (jct["n"], jct["mean"], jct["p50"]) == (2, pytest.approx(7.25), pytest.approx(7.25))
    assert jct["not_completed"] == {"cancelled": 1}
    assert jct["ci95"]["mean"] is not None and jct["ci95"]["p95"] is not None
    assert s["makespan_s"] == pytest.approx(9.0)


def test_a_batch_that_did_not_finish_has_no_makespan() -> None:
    b = _batch()
    b.agent("d", at=2.0).call(ttft=0.1, decode=0.4)  # never ends
    frames = build_frames(b.frame())
    jobs = job_table(frames)
    assert makespan_s(jobs) is None
    assert job_completion(jobs, n_resamples=50)["not_completed"] == {"cancelled": 1,
                                                                     "incomplete": 1}


def test_a_batch_stopped_with_the_run_has_no_makespan() -> None:
    b = _batch()
    b.agent("d", at=2.0).call(ttft=0.1, decode=0.4).end("interrupted", "run-horizon")
    jobs = job_table(build_frames(b.frame()))
    assert makespan_s(jobs) is None
    assert job_completion(jobs, n_resamples=50)["not_completed"] == {"cancelled": 1,
                                                                     "interrupted": 1}


def test_no_jobs_no_figures() -> None:
    b = Records()
    b.bystander("x", at=0.0, ttft=0.1, decode=0.2)
    jobs = job_table(build_frames(b.frame()))
    assert jobs.empty and makespan_s(jobs) is None
    out = job_completion(jobs)
    assert (out["n"], out["mean"], out["p50"], out["ci95"]["mean"]) == (0, None, None, None)


def test_mean_verdict_needs_a_significant_ratio_beyond_the_threshold() -> None:
    rng = np.random.default_rng(1)
    base = rng.uniform(400, 500, size=200)
    ratio, ci, verdict = mean_verdict(base, base / 2.16, 1.10)
    assert ratio == pytest.approx(1 / 2.16) and ci is not None and ci[1] < 1.0
    assert verdict == IMPROVED
    assert mean_verdict(base, base * 1.02, 1.10)[2] == SAME
    assert sample_verdict(base, base / 2, None, 1.10) == mean_verdict(base, base / 2, 1.10)


def test_speedups_are_base_over_new_with_intervals_that_hold_them() -> None:
    from harness.metrics.jobs import speedups

    rng = np.random.default_rng(3)
    base = rng.uniform(100, 900, size=300)
    out = speedups(base, base / 2.0, n_resamples=300)
    for key in ("mean", "p50", "p95", "p99"):
        assert out[key]["ratio"] == pytest.approx(2.0)
        lo, hi = out[key]["ci95"]
        assert lo < 2.0 < hi and lo > 1.5
    assert speedups(base, np.array([]))["mean"] == {"ratio": None, "ci95": None}
    assert speedups(np.array([4.0]), np.array([2.0]))["p50"] == {"ratio": 2.0, "ci95": None}
