"""The capacity search against deterministic fake servers: the exact counts it measures."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.capacity.search import CapacitySearch, PointVerdict, SearchResult, bounds

Fake = Callable[[int, int], PointVerdict]  # (agents, how many times measured before) -> verdict


def threshold(c: int) -> Fake:
    """A monotone server: every count up to c passes."""
    return lambda n, _k: PointVerdict(n, passed=n <= c)


def drive(search: CapacitySearch, fake: Fake, limit: int = 100) -> list[int]:
    """Measure until the search is done; the counts measured, in order."""
    seen: list[int] = []
    while (n := search.next_agents()) is not None:
        assert len(seen) < limit, f"no end after {seen}"
        assert n >= 1
        search.record(fake(n, seen.count(n)))
        seen.append(n)
    assert search.done
    return seen


def test_ramp_then_bisect_to_the_exact_capacity() -> None:
    s = CapacitySearch(start=1, growth=2.0, max_agents=64)
    assert drive(s, threshold(13)) == [1, 2, 4, 8, 16, 12, 14, 13]
    r = s.result()
    assert (r.capacity, r.failing_above, r.reason) == (13, 14, "resolved")
    assert [p.agents for p in r.points] == [1, 2, 4, 8, 16, 12, 14, 13]
    assert r.judged() == {1: True, 2: True, 4: True, 8: True, 12: True, 13: True,
                          14: False, 16: False}


def test_passing_max_agents_ends_the_search() -> None:
    s = CapacitySearch(max_agents=20)
    assert drive(s, threshold(100)) == [1, 2, 4, 8, 16, 20]
    r = s.result()
    assert (r.capacity, r.failing_above, r.reason) == (20, None, "max-agents")


def test_start_equal_to_max_agents() -> None:
    s = CapacitySearch(start=5, max_agents=5)
    assert drive(s, threshold(9)) == [5]
    assert s.result().reason == "max-agents"


def test_none_pass_when_one_agent_fails() -> None:
    s = CapacitySearch()
    assert drive(s, threshold(0)) == [1]
    r = s.result()
    assert (r.capacity, r.failing_above, r.reason) == (0, 1, "none-pass")


def test_failing_start_bisects_downward() -> None:
    s = CapacitySearch(start=8)
    assert drive(s, threshold(5)) == [8, 4, 6, 5]
    r = s.result()
    assert (r.capacity, r.failing_above, r.reason) == (5, 6, "resolved")
    s = CapacitySearch(start=8)
    assert drive(s, threshold(0)) == [8, 4, 2, 1]
    r = s.result()
    assert (r.capacity, r.failing_above, r.reason) == (0, 1, "none-pass")


def test_close_points_are_repeated_and_a_failing_repeat_fails_the_count() -> None:
    def fake(n: int, k: int) -> PointVerdict:
        if n == 12:  # passes, but close; its repeat fails
            return PointVerdict(n, passed=k == 0, close=True)
        return PointVerdict(n, passed=n <= 13)

    s = CapacitySearch()
    assert drive(s, fake) == [1, 2, 4, 8, 16, 12, 12, 10, 11]
    r = s.result()
    assert (r.capacity, r.failing_above, r.reason) == (11, 12, "resolved")
    assert r.judged()[12] is False


def test_close_repeats_stop_at_max_repeats_and_a_passing_repeat_keeps_a_fail() -> None:
    def always_close(n: int, _k: int) -> PointVerdict:
        return PointVerdict(n, passed=n <= 13, close=n in (12, 16))

    assert drive(CapacitySearch(max_repeats=3), always_close) == [
        1, 2, 4, 8, 16, 16, 16, 12, 12, 12, 14, 13]
    assert drive(CapacitySearch(max_repeats=1), always_close) == [1, 2, 4, 8, 16, 12, 14, 13]

    def flaky(n: int, k: int) -> PointVerdict:  # 12 fails close, then passes: still a fail
        return PointVerdict(n, passed=n <= 13 and not (n == 12 and k == 0), close=n == 12)

    s = CapacitySearch()
    assert drive(s, flaky) == [1, 2, 4, 8, 16, 12, 12, 10, 11]
    assert s.result().capacity == 11


def test_saturated_counts_fail_even_when_the_slo_passes() -> None:
    def fake(n: int, _k: int) -> PointVerdict:
        return PointVerdict(n, passed=n <= 13, saturated=n >= 10)

    s = CapacitySearch()
    assert drive(s, fake) == [1, 2, 4, 8, 16, 12, 10, 9]
    r = s.result()
    assert (r.capacity, r.failing_above) == (9, 10)
    assert r.points[6].passed and r.judged()[10] is False


def test_falling_goodput_fails_a_count_that_met_its_slo() -> None:
    def goodput(n: int) -> float:
        return 10.0 * n if n <= 6 else 60.0 - 4.0 * (n - 6)

    def fake(n: int, _k: int) -> PointVerdict:
        return PointVerdict(n, passed=n <= 13, goodput_per_min=goodput(n))

    s = CapacitySearch()
    # 8 (52/min) passes against 4 (40/min); 12 (36) and 10 (44) fall below 0.9 x 52
    assert drive(s, fake) == [1, 2, 4, 8, 16, 12, 10, 9]
    r = s.result()
    assert (r.capacity, r.failing_above, r.reason) == (9, 10, "resolved")
    assert r.points[5].agents == 12 and r.points[5].passed and r.judged()[12] is False
    # a tolerant drop lets the SLO decide alone
    s = CapacitySearch(goodput_drop=0.5)
    assert drive(s, fake) == [1, 2, 4, 8, 16, 12, 14, 13]

    def collapse(n: int, _k: int) -> PointVerdict:  # the ramp itself ends on falling goodput
        return PointVerdict(n, passed=True, goodput_per_min=30.0 if n >= 8 else 10.0 * n)

    s = CapacitySearch()
    assert drive(s, collapse) == [1, 2, 4, 8, 6, 7]  # 8 (30/min) is below 0.9 x 40/min at 4
    assert (s.result().capacity, s.result().failing_above) == (7, 8)


def test_non_monotone_noise_still_ends_between_two_judged_counts() -> None:
    def noisy(n: int, _k: int) -> PointVerdict:  # 12 fails, yet 13..15 pass
        return PointVerdict(n, passed=n <= 15 and n != 12)

    s = CapacitySearch()
    assert drive(s, noisy) == [1, 2, 4, 8, 16, 12, 10, 11]
    r = s.result()
    judged = r.judged()
    assert r.failing_above is not None and r.capacity < r.failing_above
    assert judged[r.capacity] is True and judged[r.failing_above] is False
    assert (r.capacity, r.failing_above) == (11, 12)
    # bounds from judged counts with a pass above a fail: lo below the smallest fail
    assert bounds({1: True, 2: True, 4: False, 6: True, 8: False}) == (2, 4)
    assert bounds({5: True, 3: False}) == (0, 3)
    assert bounds({1: True, 4: True}) == (4, None)
    assert bounds({}) == (0, None)


def test_coarser_resolution_stops_earlier() -> None:
    fine, coarse = CapacitySearch(resolution=0.1), CapacitySearch(resolution=0.25)
    assert drive(fine, threshold(40)) == [1, 2, 4, 8, 16, 32, 64, 48, 40, 44]
    assert drive(coarse, threshold(40)) == [1, 2, 4, 8, 16, 32, 64, 48, 40]
    assert (fine.result().capacity, fine.result().failing_above) == (40, 44)
    assert (coarse.result().capacity, coarse.result().failing_above) == (40, 48)


def test_growth_below_two_still_steps_by_at_least_one() -> None:
    s = CapacitySearch(growth=1.2, max_agents=12)
    assert drive(s, threshold(100)) == [1, 2, 3, 4, 5, 6, 8, 10, 12]


def test_stop_mid_way_reports_the_budget() -> None:
    s = CapacitySearch()
    for n in (1, 2):
        s.record(PointVerdict(n, passed=True))
    r = s.result()
    assert (r.capacity, r.failing_above, r.reason) == (2, None, "in-progress")
    assert not s.done and s.next_agents() == 4
    s.record(PointVerdict(4, passed=True))
    s.record(PointVerdict(8, passed=False))
    assert s.result() == SearchResult(4, 8, "in-progress", s.result().points)
    s.stop()
    assert s.done and s.next_agents() is None
    assert (s.result().capacity, s.result().failing_above, s.result().reason) == (4, 8, "budget")
    with pytest.raises(ValueError, match="done"):
        s.record(PointVerdict(6, passed=True))
    s.stop("other")  # a finished search keeps its reason
    assert s.result().reason == "budget"


@pytest.mark.parametrize("kwargs", [
    {"start": 0}, {"start": 5, "max_agents": 4}, {"growth": 1.0}, {"growth": 0.5},
    {"resolution": 0.0}, {"resolution": -0.1}, {"max_repeats": 0}, {"goodput_drop": -0.1},
    {"goodput_drop": 1.0},
])
def test_bad_arguments_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        CapacitySearch(**kwargs)  # type: ignore[arg-type]


def test_record_refuses_a_count_it_did_not_ask_for() -> None:
    s = CapacitySearch()
    with pytest.raises(ValueError, match="asked for 1"):
        s.record(PointVerdict(2, passed=True))
    s.record(PointVerdict(1, passed=True))
    with pytest.raises(ValueError, match="asked for 2"):
        s.record(PointVerdict(1, passed=True))
    drive(s, threshold(0))
    with pytest.raises(ValueError, match="done"):
        s.record(PointVerdict(2, passed=True))


@settings(max_examples=300, deadline=None)
@given(c=st.integers(0, 200), max_agents=st.integers(1, 256), data=st.data())
def test_monotone_servers_resolve_to_their_capacity(c: int, max_agents: int,
                                                    data: st.DataObject) -> None:
    start = data.draw(st.integers(1, max_agents))
    s = CapacitySearch(start=start, max_agents=max_agents, resolution=1e-9)
    seen = drive(s, threshold(c), limit=40)
    assert all(1 <= n <= max_agents for n in seen) and len(set(seen)) == len(seen)
    r = s.result()
    assert r.capacity == min(c, max_agents)
    if r.capacity < max_agents:
        assert r.failing_above == r.capacity + 1
        assert r.reason == ("none-pass" if r.capacity == 0 else "resolved")
    else:
        assert (r.failing_above, r.reason) == (None, "max-agents")
