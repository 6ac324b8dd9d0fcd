"""The hint-honoured rate and keep-evictable's effective retention: exact values from judged
resumed calls (pure functions)."""

from __future__ import annotations

import pandas as pd

from harness.metrics.retention import effective_retention, hint_honoured


def judged(rows: list[tuple[str, float, str, bool, bool]]) -> pd.DataFrame:
    """(action, wait_s, expected, reused, honoured) per resumed call."""
    return pd.DataFrame(rows, columns=["action", "wait_s", "expected", "reused", "honoured"])


def test_hint_honoured_counts_only_actions_that_promise_an_outcome() -> None:
    j = judged([("keep", 0.5, "reuse", True, True), ("keep", 5.0, "reuse", False, False),
                ("recompute", 5.0, "none", False, True), ("swap", 30.0, "reuse", True, True),
                ("keep-evictable", 30.0, "either", False, False)])
    out = hint_honoured(j)
    assert out is not None
    assert (out["judged"], out["honoured"], out["rate"]) == (4, 3, 0.75)
    by = out["by_pause_bucket"]
    assert {k: (v["judged"], v["honoured"]) for k, v in by.items()} == {
        "0.1-1s": (1, 1), "1-10s": (2, 1), "10-60s": (1, 1)}
    assert by["1-10s"]["rate"] == 0.5


def test_no_judged_call_is_no_rate() -> None:
    assert hint_honoured(judged([("keep-evictable", 1.0, "either", True, False)])) is None
    assert effective_retention(judged([("keep", 1.0, "reuse", True, True)])) is None


def test_effective_retention_by_pause_length() -> None:
    j = judged([("keep-evictable", 0.5, "either", True, False),
                ("keep-evictable", 4.0, "either", True, False),
                ("keep-evictable", 8.0, "either", False, False),
                ("keep-evictable", 20.0, "either", False, False),
                ("keep", 20.0, "reuse", True, True)])
    out = effective_retention(j)
    assert out is not None
    assert (out["judged"], out["survived"], out["rate"]) == (4, 2, 0.5)
    assert (out["longest_survived_s"], out["shortest_lost_s"]) == (4.0, 8.0)
    assert {k: (v["judged"], v["survived"]) for k, v in out["by_pause_bucket"].items()} == {
        "0.1-1s": (1, 1), "1-10s": (2, 1), "10-60s": (1, 0)}
