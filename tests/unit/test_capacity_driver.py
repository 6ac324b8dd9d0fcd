"""The capacity search's SLO terms and its driver on a fake measurement (exact figures)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from harness.capacity.budget import Budget, parse_span
from harness.capacity.driver import PointSpec, SearchSettings, search_policy, verdict_line
from harness.capacity.live import nan_free
from harness.capacity.result import CapacityResult, read_capacity
from harness.capacity.run import policy_list, result_table
from harness.capacity.slo import parse_slo
from harness.errors import InputError
from harness.specs.shared import search_of


def test_slo_parses_units_and_judges_every_term() -> None:
    slo = parse_slo("resume_p95=2s, ttft_p99=1500, success=99%")
    assert [(t.name, t.bound) for t in slo.terms] == [
        ("resume_p95", 2000.0), ("ttft_p99", 1500.0), ("success", 0.99)]
    assert slo.spec() == "resume_p95=2000ms,ttft_p99=1500ms,success=0.99"
    window = {"resume_latency_ms": {"p95": 1900.0}, "ttft_ms": {"p99": 1000.0},
              "success_rate": 1.0}
    j = slo.judge(window)
    assert j.passed and j.close  # 1,900 is within 10% of 2,000
    assert [r["margin"] for r in j.rows] == pytest.approx([0.05, 1 / 3, 0.01 / 0.99])
    assert j.text() == ("resume_p95 1,900 ms (<= 2,000) ttft_p99 1,000 ms (<= 1,500) "
                        "success 1.00 (>= 0.99)")
    assert not slo.judge({**window, "success_rate": 0.9}).passed
    assert not slo.judge({"ttft_ms": {}, "success_rate": 1.0}).passed  # nothing to judge


@pytest.mark.parametrize("spec, says", [
    ("resume_p96=2s", "unknown term 'resume_p96'"),
    ("success=1.5", "impossible bound"),
    ("success=0", "impossible bound"),
    ("resume_p95=0ms", "impossible bound"),
    ("resume_p95=2ms", "impossible bound"),
    ("resume_p95=2%", "not %"),
    ("success=5s", "a fraction"),
    ("resume_p95=fast", "not a number"),
    ("resume_p95", "expected TERM=VALUE"),
    ("resume_p95=1s,resume_p95=2s", "given twice"),
    ("", "no term"),
])
def test_bad_slo_is_one_line(spec: str, says: str) -> None:
    with pytest.raises(InputError, match=says):
        parse_slo(spec)


def test_spans_and_budget() -> None:
    assert parse_span("--budget", "10m", 1, 1e6) == 600.0
    assert parse_span("--budget", "1.5h", 1, 1e6) == 5400.0
    assert parse_span("--budget", "90", 1, 1e6) == 90.0
    for bad in ("10 minutes", "-5s", "0s"):
        with pytest.raises(InputError):
            parse_span("--budget", bad, 1, 1e6)
    t = [100.0]
    b = Budget(60.0, lambda: t[0])
    t[0] = 130.0
    assert (b.elapsed_s(), b.left_s(), b.share_s(3)) == (30.0, 30.0, 10.0)


def test_search_flags_are_checked_together() -> None:
    with pytest.raises(InputError, match="shorter than --point-duration"):
        search_of("success=0.9", "10m", "30s", "30s", 1, 8, 0.1, False)
    with pytest.raises(InputError, match="longer than --budget"):
        search_of("success=0.9", "1m", "2m", "10s", 1, 8, 0.1, False)
    with pytest.raises(InputError, match="--start 9 is above"):
        search_of("success=0.9", "10m", "30s", "5s", 9, 8, 0.1, False)
    with pytest.raises(InputError, match="unknown policy"):
        policy_list("keep,hold", ())


class FakeServer:
    """Resume P95 grows 500 ms per agent; each point takes 50 s of a fake clock."""

    def __init__(self) -> None:
        self.t = 0.0
        self.seen: list[tuple[str, int]] = []

    def clock(self) -> float:
        return self.t

    def measure(self, spec: PointSpec, out: Path) -> dict[str, Any]:
        self.t += 50.0
        self.seen.append((spec.phase, spec.agents))
        return {"resume_latency_ms": {"p50": 100.0 * spec.agents, "p95": 500.0 * spec.agents},
                "success_rate": 1.0, "goodput_per_min": 10.0 * spec.agents,
                "queue_growth": 1.0, "tasks": {"ended": 5}}


def test_search_policy_finds_confirms_and_records(tmp_path: Path) -> None:
    fake = FakeServer()
    saved: list[dict[str, Any]] = []
    # P95 is 500 ms per agent: 4 agents sit on the 2,000 ms bound (met, but close: measured
    # twice), 5 break it.
    entry = search_policy(PointSpec("keep", {}, 0), parse_slo("resume_p95=2000ms"),
                          fake.measure, tmp_path, 10_000.0,
                          SearchSettings(clock=fake.clock), lambda e: saved.append(e))
    assert fake.seen == [("search", 1), ("search", 2), ("search", 4), ("search", 4),
                         ("search", 8), ("search", 6), ("search", 5),
                         ("confirm", 4), ("confirm", 5)]
    assert (entry["capacity"], entry["failing_above"], entry["reason"]) == (4, 5, "resolved")
    assert entry["confirm"]["confirmed"] is True
    assert entry["at_capacity"]["agents"] == 4
    assert entry["at_capacity"]["dir"] == str(tmp_path / "keep" / "confirm" / "n-004")
    assert entry["points"][3]["dir"] == str(tmp_path / "keep" / "n-004-r2")
    assert entry["elapsed_s"] == 450.0
    assert len(saved) == 9  # after each of the 7 search points, the first confirmation, the end
    assert verdict_line("keep", entry["points"][4]) == (
        "keep n=8: resume_p95 4,000 ms (<= 2,000) -> fail")
    doc = {"policies": {"keep": entry}}
    table = result_table(CapacityResult.from_json(nan_free(doc)))
    assert "keep" in table and "4-4" in table and "yes (resolved)" in table
    json.dumps(nan_free(doc))


def test_search_policy_stops_at_the_budget_keeping_room_to_confirm(tmp_path: Path) -> None:
    fake = FakeServer()
    # 50 s per point; after 1 and 2 (100 s), 4 and its two confirmations (150 s) do not fit
    # in 210 s, the confirmations of 2 (100 s) do
    entry = search_policy(PointSpec("swap", {"x": "1"}, 0), parse_slo("resume_p95=2000ms"),
                          fake.measure, tmp_path, 210.0, SearchSettings(clock=fake.clock),
                          lambda e: None)
    assert fake.seen == [("search", 1), ("search", 2), ("confirm", 2), ("confirm", 3)]
    assert (entry["capacity"], entry["reason"]) == (2, "budget")
    assert entry["confirm"]["confirmed"] is False  # 3 agents met the SLO too


def test_saturated_or_failing_server_points_fail(tmp_path: Path) -> None:
    fake = FakeServer()
    real = fake.measure

    def measure(spec: PointSpec, out: Path) -> dict[str, Any]:
        w = real(spec, out)
        if spec.agents >= 2:  # mean TTFT 400 -> 800 ms through the window
            w["queue_growth"], w["ttft_halves_ms"] = 2.0, [400.0, 800.0]
        return w

    entry = search_policy(PointSpec("keep", {}, 0), parse_slo("success=0.5"), measure,
                          tmp_path, 10_000.0, SearchSettings(clock=fake.clock, confirm=False),
                          lambda e: None)
    assert (entry["capacity"], entry["failing_above"]) == (1, 2)
    assert entry["points"][1]["saturated"] and not entry["points"][1]["passed"]
    assert "confirm_skipped" not in entry and entry["confirm"] is None


def test_millisecond_jitter_is_not_a_growing_queue() -> None:
    from harness.capacity.driver import saturated

    assert saturated({"queue_growth": 2.0, "ttft_halves_ms": [400.0, 800.0]})
    assert not saturated({"queue_growth": 2.0, "ttft_halves_ms": [4.0, 8.0]})
    assert not saturated({"queue_growth": 1.2, "ttft_halves_ms": [4000.0, 4800.0]})
    assert not saturated({"queue_growth": None, "ttft_halves_ms": None})


def test_report_rerenders_a_search_root(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from harness.cli import main

    (tmp_path / "capacity.json").write_text(json.dumps({"kind": "capacity", "policies": {}}))
    r = CliRunner().invoke(main, ["report", str(tmp_path)])
    assert r.exit_code == 0, r.output
    assert "Capacity under the SLO" in (tmp_path / "report.html").read_text()


def test_bench_capacity_needs_an_slo() -> None:
    from click.testing import CliRunner

    from harness.cli import main

    r = CliRunner().invoke(main, ["bench", "--capacity"])
    assert r.exit_code == 2 and "--capacity needs --slo" in r.output
    r = CliRunner().invoke(main, ["bench", "--slo", "resume_p95=1ms"])
    assert r.exit_code == 2 and "impossible bound" in r.output
    r = CliRunner().invoke(main, ["bench", "--slo", "resume_p95=2s", "--capacity",
                                  "--capacity-budget", "30s"])
    assert r.exit_code == 2 and "--capacity-budget" in r.output


def test_run_capacity_end_to_end_on_the_in_memory_runtime(tmp_path: Path) -> None:
    """The live path (bounded replays, window.json, capacity.json, the report) on the
    in-memory server: 1.5-second points of a one-pause trace under a loose SLO. One agent at
    most, so nothing depends on the timing of a real clock (goodput, queue growth)."""
    import os

    from harness.capacity.run import CapacityPlan, run_capacity
    from harness.replay import pinning
    from harness.replay.options import RunOptions
    from harness.specs.shared import arrivals_of
    from tests.fakes.runtime import MemoryRuntime
    from tests.live.traces import write_one_pause_trace

    before = pinning.available_cpus()
    trace = write_one_pause_trace(tmp_path / "t.parquet")
    base = RunOptions(trace=trace, policy="", out=Path(), runtime="memory",
                      scrape_interval_s=0.05, arrivals=arrivals_of(1, None, False, 1.0),
                      pinning=None)
    plan = CapacityPlan(tmp_path / "cap", trace, parse_slo("resume_p95=30s"),
                        (("keep", {}),), base, 120.0, 1.5, 0.2,
                        SearchSettings(max_agents=1))
    runtime = MemoryRuntime()
    try:
        lines: list[str] = []
        doc = run_capacity(plan, lines.append, runtime)
    finally:
        if before and hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, set(before))
    keep = dict(doc.searched())["keep"]
    assert (keep.capacity, keep.reason) == (1, "max-agents")
    assert keep.confirm is not None
    assert keep.confirm.confirmed is True and keep.confirm.above is None
    assert read_capacity(tmp_path / "cap") == doc  # what was written reads back the same
    assert [o.policy for o in runtime.started] == ["keep"] * 2 and runtime.stopped == 2
    on_disk = json.loads((tmp_path / "cap" / "capacity.json").read_text())
    assert on_disk["policies"]["keep"]["capacity"] == 1
    assert (tmp_path / "cap" / "keep" / "n-001" / "window.json").is_file()
    assert (tmp_path / "cap" / "keep" / "confirm" / "n-001" / "window.json").is_file()
    assert "Capacity under the SLO" in (tmp_path / "cap" / "report.html").read_text()
    assert lines[0].endswith("keep: searching (up to 120s)")
    assert any("keep n=1:" in line and line.endswith("-> pass") for line in lines)
    # every point once: 1, then its confirmation
    assert sum("keep" in line and "-> " in line for line in lines) == 2
