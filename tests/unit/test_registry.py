"""One registry of headline metrics: each output that shows or judges them reads it."""

from __future__ import annotations

from pathlib import Path

import pytest
from report_fixtures import write_run

from harness.metrics.registry import HEADLINE, METRICS, metric
from harness.metrics.summary_types import Summary
from harness.report.compare import REGRESSED, compare_runs, scalar_verdict
from harness.report.data import load_run
from harness.report.export import benchmark_entries
from harness.report.render import HEADLINE_COLUMNS, headline
from harness.report.repeats import spread


def _summary() -> Summary:
    return Summary.from_json({"trajectories": {"succeeded": 3, "total": 4},
            "resume_latency_ms": {"n": 9, "p50": 10.0, "p95": 20.0, "p99": 30.0,
                                  "ci95": {"p50": [9.0, 11.0]}},
            "ttft_ms": {"p50": 5.0, "p95": 6.0}, "e2e_ms": {"p50": 50.0},
            "goodput_per_min": 1.5, "memory_time_mib_s": None, "memory_time_token_s": 400.0,
            "outcome_ci95": {"memory_time_token_s": [300.0, 500.0]},
            "bytes_moved": 2048, "tokens_recomputed": 7, "cache_mismatches": 1})


def test_values_units_and_intervals_come_from_one_place() -> None:
    s = _summary()
    assert [m.name for m in HEADLINE] == list(METRICS)
    assert metric("success_rate").value(s) == 0.75
    assert metric("resume_latency_ms.p50").ci is not None
    assert metric("resume_latency_ms.p50").ci(s) == [9.0, 11.0]  # type: ignore[misc]
    mem = metric("memory_time_mib_s")
    assert mem.value(s) == 400.0 and mem.unit_in(s) == "token·s" and mem.unit == "MiB·s"
    assert mem.ci is not None and mem.ci(s) == [300.0, 500.0]
    with pytest.raises(KeyError, match="known: resume_latency_ms.p50"):
        metric("nope")


def test_every_output_reads_the_registry(tmp_path: Path) -> None:
    keep = load_run(write_run(tmp_path / "keep", "keep", n_traj=6, tools=2))
    swap = load_run(write_run(tmp_path / "swap", "swap", n_traj=6, tools=2))
    measured = [m.name for m in HEADLINE if not m.optional or m.value(keep.summary) is not None
                or m.value(swap.summary) is not None]
    assert "effective_retention.rate" not in measured  # no keep-evictable pause: left out
    assert [r["name"] for r in compare_runs(keep, swap)["metrics"]] == measured
    exported = {e["name"].split(" ", 1)[1] for e in benchmark_entries(keep)}
    # every smaller-is-better metric the run measures (no hint outcomes in these records)
    assert exported == {m.name for m in HEADLINE if not m.bigger_is_better and (
        not m.optional or m.value(keep.summary) is not None)} | {"failure_rate"}
    assert set(spread([keep.summary, swap.summary])) == set(measured)
    doc = headline([keep])
    for name in HEADLINE_COLUMNS:
        assert metric(name).label in doc


def test_a_new_cache_mismatch_is_a_regression() -> None:
    """0 -> 2 mismatching resumes: worse, judged like any smaller-is-better count."""
    assert scalar_verdict(0, 2, 1.1, metric("cache_mismatches").bigger_is_better)[1] == REGRESSED
