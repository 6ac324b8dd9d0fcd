"""A run's own wake: what idle time added to its calls alone, fitted from their timings.

A calibration measures the wake after idle time (harness.calibrate.wake) minutes before a run,
and on a shared machine it moves several-fold within minutes (measured on a Xeon VM: the way
after 1 s of idle time +31 ms at a calibration, +13 ms in the replay that followed it). So the
run's own rates (harness.model.run_rates) fit the run's own curve at the calibration's idle
times: each call alone's server time is `p x + W(idle)` (x its prompt time at the calibrated
rates, p the run's prompt factor, W the curve, interpolated as the simulator does:
harness.model.iteration.curve_at) and its way there and back `o + V(idle)` (o the busy server's
way, V the way's curve). W and V are linear in their points, so each fit is a linear
regression; it minimises the absolute residuals (the median's fit, as the other run rates are
medians: a few calls slowed by the machine do not move it), with every coefficient >= 0 and
each curve non-decreasing, as a calibration's must be.

A curve point that few calls inform (less than MIN_SUPPORT calls' interpolation weight) keeps
the calibration's value, fixed in the fit, rather than a figure one or two calls decide.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import csr_matrix, hstack, identity

from harness.arrays import FloatArray

MIN_SUPPORT = 5.0  # calls' interpolation weight a curve point needs to be fitted
# The most calls one fit reads: more are thinned evenly, in the run's order (the program's
# time grows faster than its size: 0.1 s for 2,000 calls, 9.6 s for 20,000 on a 2-core VM)
MAX_FIT_CALLS = 4000


def curve_weights(idle_s: FloatArray, gaps_s: FloatArray) -> FloatArray:
    """(calls, points): each point's weight in the curve's value at each call's idle time, so
    that `weights @ ys` is harness.model.iteration.curve_at(zip(gaps_s, ys), idle) for every
    call: linear from 0 at no idle time to the first point, between points, flat past the
    last. `gaps_s` ascending and > 0."""
    n, k = len(idle_s), len(gaps_s)
    w = np.zeros((n, k))
    x = np.maximum(np.asarray(idle_s, dtype=float), 0.0)
    j = np.searchsorted(gaps_s, x, side="left")  # the first point at or past each idle time
    rows = np.arange(n)
    past = j >= k
    w[rows[past], k - 1] = 1.0
    first = (j == 0) & ~past
    w[rows[first], 0] = x[first] / gaps_s[0]
    mid = (j > 0) & ~past
    lo, hi = gaps_s[j[mid] - 1], gaps_s[j[mid]]
    t = (x[mid] - lo) / (hi - lo)
    w[rows[mid], j[mid] - 1] = 1.0 - t
    w[rows[mid], j[mid]] = t
    return w


def l1_fit(x: FloatArray, y: FloatArray, bounds: list[tuple[float, float | None]],
           rising_from: int | None = None) -> FloatArray | None:
    """The coefficients c (within `bounds`) minimising sum |y - x @ c|, by linear programming
    (each residual split into its positive and negative parts); with `rising_from`, the
    coefficients from that one on are non-decreasing. None when the solver fails."""
    n, m = x.shape
    a = hstack([csr_matrix(x), identity(n, format="csr"), -identity(n, format="csr")],
               format="csr")
    cost = np.concatenate([np.zeros(m), np.ones(2 * n)])
    a_ub = b_ub = None
    if rising_from is not None and m - rising_from > 1:
        k = m - rising_from - 1  # c[j] - c[j + 1] <= 0 for each consecutive pair
        rows = np.zeros((k, m + 2 * n))
        for i in range(k):
            rows[i, rising_from + i], rows[i, rising_from + i + 1] = 1.0, -1.0
        a_ub, b_ub = csr_matrix(rows), np.zeros(k)
    res = linprog(cost, A_ub=a_ub, b_ub=b_ub, A_eq=a, b_eq=y,
                  bounds=[*bounds, *[(0.0, None)] * (2 * n)], method="highs")
    return np.asarray(res.x[:m], dtype=float) if res.status == 0 else None


@dataclass(frozen=True)
class OwnWake:
    """A run's own fit: `factor` (p: the prompt time's, or 1 for the way) and its curve's
    values (s) at the calibration's idle times; `fitted`: which points the run's calls
    informed (the others are the calibration's)."""

    factor: float
    curve: tuple[float, ...]
    fitted: tuple[bool, ...]

    def at(self, weights: FloatArray) -> FloatArray:
        """The curve's value at each call (rows of `curve_weights`)."""
        values: FloatArray = weights @ np.array(self.curve, dtype=float)
        return values


def fit_wake(x: FloatArray, idle_s: FloatArray, y: FloatArray, gaps_s: FloatArray,
             known: FloatArray, *, scaled: bool) -> OwnWake | None:
    """Fit y ~ p x + W(idle) (`scaled`; else y ~ p + W(idle), p a constant: the busy way) with
    p >= 0 and the curve's points >= 0 and non-decreasing (a calibration's curve is: more idle
    time costs no less); a point with too little support keeps its `known` value; more than
    MAX_FIT_CALLS calls are thinned evenly. None when no call is given or the solver fails (a
    `known` value that breaks the order makes it infeasible)."""
    if len(y) == 0:
        return None
    if len(y) > MAX_FIT_CALLS:
        keep = np.unique(np.linspace(0, len(y) - 1, MAX_FIT_CALLS).round().astype(int))
        x, idle_s, y = np.asarray(x)[keep], np.asarray(idle_s)[keep], np.asarray(y)[keep]
    w = curve_weights(idle_s, gaps_s)
    support = w.sum(axis=0)
    fitted = support >= MIN_SUPPORT
    first = np.asarray(x, dtype=float).reshape(-1, 1) if scaled else np.ones((len(y), 1))
    bounds: list[tuple[float, float | None]] = [(0.0, None)]
    bounds += [(0.0, None) if f else (float(v), float(v))
               for f, v in zip(fitted, known, strict=True)]
    coef = l1_fit(np.hstack([first, w]), np.asarray(y, dtype=float), bounds, rising_from=1)
    if coef is None:
        return None
    return OwnWake(float(coef[0]), tuple(float(v) for v in coef[1:]),
                   tuple(bool(f) for f in fitted))
