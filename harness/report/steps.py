"""Step detection over a whole series of runs (asv's approach), not between neighbours.

A metric's values over commits are fitted with a piecewise-constant curve: the partition into
segments that minimises the absolute deviation of each value from its segment's median (in
log space, so a step is a ratio) plus a penalty per segment, by dynamic programming. A segment
has at least `min_size` runs, except the newest, so one outlying run in the middle of a series
is never a step: it would need to be a segment of its own. Each boundary is then kept only if
the medians on either side differ by more than the threshold. Pure: functions of numbers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

MIN_SEGMENT = 2


def _transform(values: Sequence[float], threshold: float) -> tuple[np.ndarray, float]:
    """The values and the threshold in the space the fit runs in: logs when all values are
    positive (a step is then a ratio); else values scaled by their mean magnitude (zeros:
    bytes moved under keep), the threshold as a relative change."""
    x = np.asarray(values, dtype=float)
    if np.all(x > 0):
        logs: np.ndarray = np.log(x)
        return logs, math.log(threshold)
    scale = float(np.mean(np.abs(x))) or 1.0
    return x / scale, threshold - 1


def _cost(x: np.ndarray, i: int, j: int) -> float:
    seg = x[i:j]
    return float(np.abs(seg - np.median(seg)).sum())


def level_starts(values: Sequence[float], threshold: float,
                 min_size: int = MIN_SEGMENT) -> list[int]:
    """Indices (> 0) where a new level begins, for a series of finite values: segments of at
    least `min_size` values (the last may be shorter: the newest runs are not confirmed yet),
    kept where the segment medians differ by more than `threshold` (a ratio > 1)."""
    n = len(values)
    if n < 2:
        return []
    x, gap = _transform(values, threshold)
    penalty = gap * min_size / 2
    best = [math.inf] * (n + 1)
    prev = [0] * (n + 1)
    best[0] = 0.0
    for j in range(1, n + 1):
        for i in range(j):
            size_ok = j - i >= min_size or j == n
            if not size_ok or best[i] == math.inf:
                continue
            c = best[i] + _cost(x, i, j) + (penalty if i else 0.0)
            if c < best[j]:
                best[j], prev[j] = c, i
    starts = []
    j = n
    while j > 0:
        if prev[j]:
            starts.append(prev[j])
        j = prev[j]
    starts.sort()
    return _significant(x, starts, gap)


def _significant(x: np.ndarray, starts: list[int], gap: float) -> list[int]:
    """Drop boundaries whose neighbouring segment medians differ by no more than `gap`,
    merging those segments, until every boundary left is a real change."""
    while True:
        meds = segment_medians(x, starts)
        small = [k for k in range(len(starts)) if abs(meds[k + 1] - meds[k]) <= gap]
        if not small:
            return starts
        drop = min(small, key=lambda k: abs(meds[k + 1] - meds[k]))
        starts = starts[:drop] + starts[drop + 1:]


def segment_medians(values: Sequence[float] | np.ndarray, starts: list[int]) -> list[float]:
    """The median of each segment the starts cut the series into."""
    bounds = [0, *starts, len(values)]
    x = np.asarray(values, dtype=float)
    return [float(np.median(x[a:b])) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
