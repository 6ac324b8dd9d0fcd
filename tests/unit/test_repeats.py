"""`run --repeats N`: N ordinary results directories and the spread between them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from harness.cli import main
from harness.metrics.summary_types import Summary
from harness.report.repeats import format_spread, spread
from harness.selftest import measure


def _summary(p50: float, ok: int) -> Summary:
    return Summary.from_json({"resume_latency_ms": {"p50": p50},
                              "trajectories": {"succeeded": ok, "total": 10}})


def test_spread_exact() -> None:
    s = spread([_summary(100.0, 9), _summary(120.0, 10), _summary(110.0, 9)])
    r = s["resume_latency_ms.p50"]
    assert (r["median"], r["min"], r["max"]) == (110.0, 100.0, 120.0)
    assert r["spread"] == pytest.approx(20.0 / 110.0) and r["values"] == [100.0, 120.0, 110.0]
    assert s["success_rate"]["median"] == 0.9 and s["success_rate"]["spread"] == pytest.approx(
        0.1 / 0.9)
    assert "ttft_ms.p50" not in s  # no summary had it
    table = format_spread({"metrics": s, "summaries_read": 3})
    assert "resume_latency_ms.p50" in table and "18.2%" in table and "(3 repeats" in table


def test_run_repeats_against_the_stub(tmp_path: Path) -> None:
    trace = measure.synthetic_trace(tmp_path / "t.parquet", 2, 3, 0.01, 4)
    stub = measure.start_stub(1.0)
    try:
        res = CliRunner().invoke(main, ["run", "--url", stub.url, "--trace", str(trace),
                                        "--policy", "keep", "--out", str(tmp_path / "r"),
                                        "--repeats", "2"])
    finally:
        stub.stop()
    assert res.exit_code == 0, res.output
    doc = json.loads((tmp_path / "r" / "repeats.json").read_text())
    assert doc["summaries_read"] == 2 and len(doc["metrics"]["ttft_ms.p50"]["values"]) == 2
    for k in (1, 2):
        assert (tmp_path / "r" / f"repeat-{k}" / "run.json").exists()
    assert "spread" in res.output
    assert CliRunner().invoke(main, ["run", "--url", stub.url, "--trace", str(trace),
                                     "--policy", "keep", "--out", str(tmp_path / "x"),
                                     "--repeats", "0"]).exit_code == 2
