"""The simulator's tool-class history: its sorted window gives np.quantile's answer bit for bit,
and the built-in policies use it."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.policies.base import PauseContext
from harness.policies.builtin import Threshold, Ttl, _quantile
from harness.simulate.server import History

values = st.one_of(st.floats(min_value=-1e6, max_value=1e6, allow_nan=False),
                   st.sampled_from([0.0, 1.0, 2.5]),  # ties
                   st.just(float("nan")))


def same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


@settings(max_examples=300, deadline=None)
@given(xs=st.lists(values, min_size=1, max_size=40), window=st.integers(0, 7),
       qs=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=5))
def test_linear_quantile_is_numpys_quantile(xs: list[float], window: int,
                                            qs: list[float]) -> None:
    h = History(window)
    for k, x in enumerate(xs):
        h.add(x)
        seen = np.asarray(h, dtype=float)
        assert len(h) == len(seen) == (min(k + 1, window) if window else k + 1)
        for q in [*qs, 0.0, 0.5, 0.9, 1.0]:
            assert same(h.linear_quantile(q), float(np.quantile(seen, q))), (q, seen)


def test_linear_quantile_refuses_what_numpy_refuses() -> None:
    h = History(3)
    with pytest.raises(ValueError, match="no observations"):
        h.linear_quantile(0.5)
    h.add(1.0)
    with pytest.raises(ValueError, match="quantile must be in"):
        h.linear_quantile(1.5)


def test_policies_ask_the_window_and_get_what_a_plain_sequence_gives() -> None:
    h = History(1000)
    rng = np.random.default_rng(3)
    for x in rng.lognormal(0.0, 1.5, 2500):
        h.add(float(x))
    plain = tuple(np.asarray(h).tolist())
    for q in (0.1, 0.5, 0.9, 0.99):
        assert _quantile(h, q, 5, -1.0) == _quantile(plain, q, 5, -1.0)
    assert _quantile(History(10), 0.5, 1, 7.0) == 7.0  # too little history: the default
    for policy in (Ttl(), Threshold()):
        a, b = (policy.decide(PauseContext("r", "t", "bash", None, 4096, True, "normal", hist,
                                           2, 4)) for hist in (h, plain))
        assert a == b, policy.name
