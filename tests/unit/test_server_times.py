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


def test_the_servers_kv_tokens_are_its_slots_summed_at_each_sample() -> None:
    from harness.metrics.occupancy import server_kv_tokens

    frame = pd.DataFrame({
        "t_ns": [0, 0, 5, 5, 5], "source": ["slots", "slots", "slots", "slots", "metrics"],
        "name": ["n_prompt_tokens"] * 4 + ["sglang:num_used_tokens"],
        "labels": ['{"slot": 0}', '{"slot": 1}', '{"slot": 0}', '{"slot": 1}', ""],
        "value": [100.0, 50.0, 0.0, 70.0, 9.0]})
    got = server_kv_tokens(frame)
    assert got is not None and got[0] == "server: tokens in its slots (/slots)"
    assert got[1]["t_ns"].tolist() == [0, 5] and got[1]["tokens"].tolist() == [150.0, 70.0]
    sglang = server_kv_tokens(frame[frame["source"] == "metrics"])
    assert sglang is not None and sglang[1]["tokens"].tolist() == [9.0]
    assert server_kv_tokens(frame[frame["name"] == "nothing"]) is None
