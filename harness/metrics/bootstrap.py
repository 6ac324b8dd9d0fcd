"""Seeded bootstrap of quantiles, fast at any sample size.

A bootstrap resample of n values, sorted, is the data's sorted values picked at n sorted uniform
indices. The k-th smallest of n uniform draws on [0, 1) follows Beta(k, n + 1 - k), and the next one
is that value plus (1 - value) x Beta(1, n - k). Drawing those two order statistics directly gives
the exact bootstrap distribution of a linearly interpolated quantile (numpy's default) in
O(resamples), instead of O(resamples x n) for resampling whole arrays.
"""

from __future__ import annotations

import numpy as np

DEFAULT_RESAMPLES = 1000
DEFAULT_SEED = 0


def sorted_finite(values: np.ndarray | list[float]) -> np.ndarray:
    """The finite values, as float64, sorted ascending."""
    arr = np.asarray(values, dtype="float64")
    return np.sort(arr[np.isfinite(arr)])


def resampled_quantile(
    sorted_values: np.ndarray, q: float, n_resamples: int, rng: np.random.Generator
) -> np.ndarray:
    """`n_resamples` draws of the q-th percentile (0-100) of a bootstrap resample of the data.

    `sorted_values` must be sorted and non-empty. Matches `np.percentile(resample, q)` in
    distribution (linear interpolation between order statistics).
    """
    n = int(sorted_values.size)
    if n == 0:
        raise ValueError("no values to resample")
    pos = (n - 1) * q / 100.0
    lo = int(np.floor(pos))
    frac = pos - lo
    k = lo + 1  # 1-based rank of the lower order statistic
    u_lo = rng.beta(k, n + 1 - k, size=n_resamples)
    idx_lo = np.minimum((u_lo * n).astype(np.int64), n - 1)
    low = sorted_values[idx_lo]
    if frac == 0.0 or k >= n:
        return low
    u_hi = u_lo + (1.0 - u_lo) * rng.beta(1, n - k, size=n_resamples)
    idx_hi = np.minimum((u_hi * n).astype(np.int64), n - 1)
    high = sorted_values[idx_hi]
    result: np.ndarray = low + frac * (high - low)
    return result


def quantile_ci(
    values: np.ndarray | list[float],
    qs: tuple[float, ...] = (50, 95, 99),
    level: float = 0.95,
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
) -> dict[str, list[float] | None]:
    """Percentile bootstrap confidence intervals {'p50': [lo, hi], ...}; None when n < 2."""
    xs = sorted_finite(values)
    out: dict[str, list[float] | None] = {}
    rng = np.random.default_rng(seed)
    alpha = (1.0 - level) / 2.0
    for q in qs:
        key = f"p{q:g}"
        if xs.size < 2:
            out[key] = None
            continue
        draws = resampled_quantile(xs, q, n_resamples, rng)
        lo, hi = np.quantile(draws, [alpha, 1.0 - alpha])
        out[key] = [float(lo), float(hi)]
    return out


def ratio_ci(
    base: np.ndarray | list[float],
    new: np.ndarray | list[float],
    q: float,
    level: float = 0.95,
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
) -> tuple[float, float] | None:
    """Bootstrap CI of percentile(new, q) / percentile(base, q), resampling each side.

    None when either side has fewer than 2 values or the base quantile can be zero.
    """
    xb, xn = sorted_finite(base), sorted_finite(new)
    if xb.size < 2 or xn.size < 2:
        return None
    rng = np.random.default_rng(seed)
    db = resampled_quantile(xb, q, n_resamples, rng)
    dn = resampled_quantile(xn, q, n_resamples, rng)
    if np.any(db <= 0):
        return None
    alpha = (1.0 - level) / 2.0
    lo, hi = np.quantile(dn / db, [alpha, 1.0 - alpha])
    return float(lo), float(hi)
