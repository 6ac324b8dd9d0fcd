"""Step detection over a whole series, on hand-built series: exact level boundaries."""

from __future__ import annotations

import pytest

from harness.report.steps import level_starts, segment_medians


@pytest.mark.parametrize(("values", "starts"), [
    ([1, 1, 1, 5, 1, 1, 1], []),  # one outlier in the middle is not a step
    ([2, 1, 1, 1], []),  # nor at the start
    ([1, 1, 1, 2, 2, 2], [3]),  # a sustained change is one step, at its first run
    ([1, 1, 1, 1, 2], [4]),  # the newest run alone: a step, unconfirmed by its caller
    ([1.0, 1.02, 0.98, 1.01, 1.0], []),  # noise within the threshold
    ([1, 1, 1.05, 1.05], []),  # a real change, but below x1.10
    ([100, 101, 99, 150, 149, 151, 100, 100], [3, 6]),  # up, then back down
    ([0, 0, 0, 5, 5, 5], [3]),  # zeros (bytes moved under keep) compare by scale
    ([3.0], []), ([], []),
])
def test_level_starts(values: list[float], starts: list[int]) -> None:
    assert level_starts(values, 1.10) == starts


def test_a_larger_threshold_needs_a_larger_step() -> None:
    assert level_starts([1, 1, 1, 1.3, 1.3, 1.3], 1.10) == [3]
    assert level_starts([1, 1, 1, 1.3, 1.3, 1.3], 1.50) == []


def test_segment_medians() -> None:
    assert segment_medians([100, 101, 99, 150, 149, 151, 100, 100], [3, 6]) == [100, 150, 100]
