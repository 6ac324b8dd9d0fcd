"""The bench's tables: exact text from summaries (pure)."""

from __future__ import annotations

from harness.bench.table import headline_table, retention_table
from harness.metrics.summary_types import Summary


def summary(**kw: object) -> Summary:
    base: dict[str, object] = {"resume_latency_ms": {"n": 4, "p50": 10.0, "p95": 20.0,
                                                     "p99": 30.0},
                               "trajectories": {"succeeded": 2}, "goodput_per_min": 1.5,
                               "memory_time_mib_s": 12.25}
    base.update(kw)
    return Summary.from_json(base)


def test_retention_table_shows_honoured_survival_and_others_queue() -> None:
    rows = [("keep", summary(hint_honoured={"rate": 1.0},
                             bystander_ttft_ms={"n": 3, "p50": 1200.0, "p95": 8060.0})),
            ("keep-evictable", summary(effective_retention={"rate": 0.25},
                                       bystander_ttft_ms={"n": 3, "p50": 60.0, "p95": 90.0}))]
    text = retention_table(rows)
    assert text is not None
    lines = text.splitlines()
    assert lines[0].split() == ["policy", "honoured", "evict", "kept", "byst", "TTFT", "p50",
                                "p95", "goodput/min", "paused", "KV"]
    assert lines[2].split() == ["keep", "100%", "-", "1,200", "8,060", "1.50", "12.2"]
    assert lines[3].split() == ["keep-evictable", "-", "25%", "60", "90", "1.50", "12.2"]


def test_no_retention_table_without_anything_to_show() -> None:
    assert retention_table([("keep", summary())]) is None


def test_headline_fits_the_longest_policy_name() -> None:
    lines = headline_table([("keep-evictable", summary())]).splitlines()
    assert lines[2].startswith("keep-evictable ") and lines[2].index("10") > 15
