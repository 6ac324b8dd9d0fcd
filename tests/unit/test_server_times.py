"""The server's own queue and prefill time per request, from its histograms' _sum and _count."""

from __future__ import annotations

import pandas as pd
import pytest

from harness.metrics.server_times import server_times


def _samples(rows: list[tuple[int, str, str, float]]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["t_ns", "name", "labels", "value"]).assign(
        source="metrics")


def test_the_mean_is_over_the_requests_finished_between_the_first_and_last_sample() -> None:
    q = "vllm:request_queue_time_seconds"
    p = "vllm:request_prefill_time_seconds"
    rows = [(0, f"{q}_sum", "e0", 1.0), (0, f"{q}_count", "e0", 10.0),
            (5, f"{q}_sum", "e0", 1.5), (5, f"{q}_count", "e0", 20.0),
            # a second engine's label set is summed in at each instant
            (0, f"{q}_sum", "e1", 0.0), (0, f"{q}_count", "e1", 0.0),
            (5, f"{q}_sum", "e1", 0.5), (5, f"{q}_count", "e1", 10.0),
            (0, f"{p}_sum", "e0", 2.0), (0, f"{p}_count", "e0", 10.0),
            (5, f"{p}_sum", "e0", 2.0), (5, f"{p}_count", "e0", 10.0)]  # none finished
    got = server_times(_samples(rows))
    assert got == {"queue": {"source": q, "requests": 20, "mean_ms": pytest.approx(50.0)}}


def test_one_sample_or_no_family_says_nothing() -> None:
    s = "sglang:queue_time_seconds"
    assert server_times(_samples([(0, f"{s}_sum", "", 1.0), (0, f"{s}_count", "", 2.0)])) is None
    assert server_times(_samples([(0, "llamacpp:requests_processing", "", 1.0)])) is None
    assert server_times(None) is None
    two = _samples([(0, f"{s}_sum", "", 1.0), (0, f"{s}_count", "", 2.0),
                    (1, f"{s}_sum", "", 1.2), (1, f"{s}_count", "", 6.0)])
    assert server_times(two) == {"queue": {"source": s, "requests": 4,
                                           "mean_ms": pytest.approx(50.0)}}
