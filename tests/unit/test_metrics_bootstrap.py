"""The order-statistic bootstrap matches brute-force resampling, and CIs behave."""

from __future__ import annotations

import numpy as np
import pytest

from harness.metrics.bootstrap import quantile_ci, ratio_ci, resampled_quantile, sorted_finite


@pytest.mark.parametrize("q", [0, 37, 50, 95, 99, 100])
def test_matches_brute_force_bootstrap(q: float) -> None:
    rng = np.random.default_rng(1)
    data = rng.lognormal(0.0, 0.8, 41)
    brute = np.percentile(rng.choice(data, size=(6000, data.size)), q, axis=1)
    fast = resampled_quantile(np.sort(data), q, 6000, np.random.default_rng(2))
    for p in (5, 25, 50, 75, 95):
        assert np.percentile(fast, p) == pytest.approx(np.percentile(brute, p), rel=0.06)
    assert fast.mean() == pytest.approx(brute.mean(), rel=0.03)


def test_quantile_ci_contains_point_and_is_seeded() -> None:
    xs = np.random.default_rng(0).normal(100, 10, 500)
    ci = quantile_ci(xs)
    for key, q in (("p50", 50), ("p95", 95), ("p99", 99)):
        lo, hi = ci[key]  # type: ignore[misc]
        assert lo <= np.percentile(xs, q) <= hi
    assert quantile_ci(xs, seed=0) == ci and quantile_ci(xs, seed=5) != ci
    assert quantile_ci([1.0]) == {"p50": None, "p95": None, "p99": None}
    assert quantile_ci([]) == {"p50": None, "p95": None, "p99": None}


def test_ratio_ci() -> None:
    rng = np.random.default_rng(0)
    base = rng.lognormal(0, 0.3, 3000)
    lo, hi = ratio_ci(base, base * 2.0, 50)  # type: ignore[misc]
    assert lo < 2.0 < hi and hi - lo < 0.3
    assert ratio_ci([1.0], [1.0, 2.0], 50) is None
    assert ratio_ci([0.0, 0.0], [1.0, 2.0], 50) is None


def test_sorted_finite_drops_nan_and_inf() -> None:
    assert sorted_finite([3.0, np.nan, 1.0, np.inf]).tolist() == [1.0, 3.0]
