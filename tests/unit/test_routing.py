"""Where calls were served (routing): a pure function of the calls frame."""

from __future__ import annotations

import pandas as pd

from harness.metrics.routing import (
    ROUTER_BEST,
    ROUTER_HIT_RATE,
    ROUTER_SELECTED,
    router_report,
    routing,
)


def _calls(rows: list[tuple[str, int, str | None, bool, float | None]]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["tid", "step", "served_by", "is_resume",
                                       "cached_tokens"]).assign(bystander=False)


def test_resumed_calls_on_their_worker_or_moved() -> None:
    calls = _calls([
        ("a", 0, "w1", False, 0.0), ("a", 2, "w1", True, 96.0), ("a", 4, "w2", True, 0.0),
        ("b", 0, "w2", False, 0.0), ("b", 2, "w2", True, 64.0),
    ])
    assert routing(calls) == {
        "calls": 5, "workers": 2, "calls_per_worker": {"w1": 2, "w2": 3}, "resumed": 3,
        "resumed_same_worker": 2, "same_worker_share": 2 / 3, "cached_same": 80.0,
        "cached_moved": 0.0}


def test_order_is_by_step_within_a_trajectory_and_bystanders_are_left_out() -> None:
    calls = _calls([("a", 2, "w2", True, 10.0), ("a", 0, "w1", False, 0.0)])
    calls = pd.concat([calls, _calls([("x", 0, "w9", False, 0.0)]).assign(bystander=True)])
    r = routing(calls)
    assert r is not None
    assert (r["resumed"], r["resumed_same_worker"], r["workers"]) == (1, 0, 2)


def test_no_worker_named_means_no_routing() -> None:
    assert routing(_calls([("a", 0, None, False, 0.0)])) is None
    assert routing(_calls([]).drop(columns=["served_by"])) is None


def _samples(rows: list[tuple[float, str, float]]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["t_ns", "name", "value"]).assign(labels="")


def test_the_router_s_own_account_over_the_run() -> None:
    sm = _samples([
        (0.0, ROUTER_HIT_RATE + "_count", 10.0), (0.0, ROUTER_HIT_RATE + "_sum", 2.0),
        (0.0, ROUTER_SELECTED, 100.0), (0.0, ROUTER_BEST, 100.0),
        (1e9, ROUTER_HIT_RATE + "_count", 30.0), (1e9, ROUTER_HIT_RATE + "_sum", 12.0),
        (1e9, ROUTER_SELECTED, 900.0), (1e9, ROUTER_BEST, 1100.0),
    ])
    assert router_report(sm) == {"source": "the KV router's /metrics", "routed": 20,
                                 "predicted_hit_rate": 0.5, "selected_prefix_tokens": 800.0,
                                 "best_prefix_tokens": 1000.0}


def test_no_router_metrics_no_account() -> None:
    assert router_report(None) is None
    assert router_report(_samples([(0.0, "vllm:num_requests_running", 1.0)])) is None
