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


# Above this many units the bootstrap distribution of a mean is drawn from its normal limit
# (the central limit theorem holds long before; resampling 10^5 trajectories 1,000 times would
# cost seconds per summary).
NORMAL_ABOVE = 5000
_BATCH = 100  # resamples drawn at once: memory stays at _BATCH x units indices


def resampled_means(units: np.ndarray, n_resamples: int, rng: np.random.Generator
                    ) -> np.ndarray:
    """`n_resamples` bootstrap draws of the mean of `units` (resampled with replacement)."""
    x = np.asarray(units, dtype="float64")
    n = int(x.size)
    if n == 0:
        raise ValueError("no units to resample")
    if n > NORMAL_ABOVE:
        sd = float(x.std(ddof=0)) / np.sqrt(n)
        normal: np.ndarray = rng.normal(float(x.mean()), sd, size=n_resamples)
        return normal
    out = np.empty(n_resamples)
    for start in range(0, n_resamples, _BATCH):
        k = min(_BATCH, n_resamples - start)
        out[start:start + k] = x[rng.integers(0, n, size=(k, n))].mean(axis=1)
    return out


def mean_ci(units: np.ndarray | list[float], level: float = 0.95,
            n_resamples: int = DEFAULT_RESAMPLES, seed: int = DEFAULT_SEED
            ) -> list[float] | None:
    """Percentile bootstrap CI of the mean over units (trajectories); None for < 2 units.
    Multiply by the unit count for a sum's CI, divide by a duration for a rate's."""
    x = np.asarray(units, dtype="float64")
    if x.size < 2:
        return None
    draws = resampled_means(x, n_resamples, np.random.default_rng(seed))
    alpha = (1.0 - level) / 2.0
    lo, hi = np.quantile(draws, [alpha, 1.0 - alpha])
    return [float(lo), float(hi)]


def mean_ratio_ci(base: np.ndarray | list[float], new: np.ndarray | list[float],
                  scale: float = 1.0, level: float = 0.95,
                  n_resamples: int = DEFAULT_RESAMPLES, seed: int = DEFAULT_SEED
                  ) -> tuple[float, float] | None:
    """Bootstrap CI of scale x mean(new) / mean(base), resampling each side's units; `scale`
    turns the ratio of means into that of the metric (unit counts, durations). None when a
    side has < 2 units or a resampled base mean can be zero."""
    xb, xn = np.asarray(base, dtype="float64"), np.asarray(new, dtype="float64")
    if xb.size < 2 or xn.size < 2:
        return None
    rng = np.random.default_rng(seed)
    db = resampled_means(xb, n_resamples, rng)
    dn = resampled_means(xn, n_resamples, rng)
    if np.any(db <= 0):
        return None
    alpha = (1.0 - level) / 2.0
    lo, hi = np.quantile(scale * dn / db, [alpha, 1.0 - alpha])
    return float(lo), float(hi)
