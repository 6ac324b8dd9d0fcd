"""Hint outcomes in the metrics and every output: exact counts and shares per run and per
pause-length bucket from hand-built records, summary.json's typed block, the registry's shares
in compare and export, the bench's clipped column and the report's chart."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from records_factory import Records, default_run

from harness.bench.table import retention_table
from harness.metrics import hint_outcomes as ho
from harness.metrics.frames import build_frames
from harness.metrics.outcomes import judge_resumes
from harness.metrics.registry import metric
from harness.metrics.summary import summarize, summarize_dir
from harness.metrics.summary_types import HintOutcomes, Summary
from harness.records.manifest import RunManifest
from harness.report.compare import compare_runs, format_text
from harness.report.data import load_run
from harness.report.export import benchmark_entries
from harness.report.hints_view import hints_section
from harness.report.render import render_runs


def hint(b: Records, t_s: float, tid: str, step: int, action: str, status: str,
         **cols: Any) -> None:
    b.add(t_s, "hint_outcome", tid, step=step, action=action, status=status, **cols)


def hinted_run() -> Records:
    """Five hinted pauses: two accepted (one resume reused, one not), one clipped, one
    rejected, one missing; waits 0.5, 5, 20, 5 and 0.05 s."""
    b = Records()
    a = b.agent("a")
    a.call(appended=100, out=10).tool(wait=0.5, action="keep", retained=110)
    a.call(appended=20, out=5, cached=110)  # reused: honoured
    hint(b, a.t, "a", 1, "keep", "accepted")
    a.tool(wait=5.0, action="keep", retained=135).call(appended=20, out=5, cached=0)
    a.end()
    c = b.agent("c", at=0.2)
    c.call(appended=100, out=10).tool(wait=0.05, action="keep", retained=110)
    hint(b, c.t, "c", 1, "keep", "rejected", reason="refused", detail="host cap")
    c.call(appended=20, out=5, cached=110).end()
    d = b.agent("d", at=0.1)
    d.call(appended=100, out=10).tool(wait=20.0, action="swap", retained=110, swap_bytes=4096)
    d.call(appended=20, out=5, cached=0)  # accepted, yet nothing reused: not honoured
    hint(b, d.t, "d", 1, "swap", "accepted")
    d.tool(wait=5.0, action="recompute", retained=135).call(appended=20, out=5, cached=0)
    d.end()
    # reported after both trajectories ended: joined by trajectory and step, not by order
    hint(b, d.t + 1.0, "a", 3, "keep", "clipped", reason="latest-program", held_s=2.0)
    hint(b, d.t + 1.0, "d", 3, "recompute", "missing", reason="unreported")
    return b


def test_counts_shares_and_buckets_are_exact() -> None:
    frames = build_frames(hinted_run().frame())
    out = ho.hint_outcomes(frames, judge_resumes(frames))
    assert out is not None
    assert out["hinted"] == 5
    assert out["counts"] == {"accepted": 2, "clipped": 1, "deferred": 0, "rejected": 1,
                             "missing": 1}
    assert out["shares"] == {"accepted": 0.4, "clipped": 0.2, "deferred": 0.0,
                             "rejected": 0.2, "missing": 0.2}
    assert sum(out["shares"].values()) == pytest.approx(1.0)
    assert (out["accepted_judged"], out["accepted_and_reused"]) == (2, 1)
    by = out["by_pause_bucket"]
    assert list(by) == ["<0.1s", "0.1-1s", "1-10s", "10-60s"]
    assert {k: v["hinted"] for k, v in by.items()} == {
        "<0.1s": 1, "0.1-1s": 1, "1-10s": 2, "10-60s": 1}
    assert by["<0.1s"]["counts"]["rejected"] == 1 and by["<0.1s"]["shares"]["rejected"] == 1.0
    assert by["1-10s"]["shares"] == {"accepted": 0.0, "clipped": 0.5, "deferred": 0.0,
                                     "rejected": 0.0, "missing": 0.5}
    assert by["10-60s"]["counts"]["accepted"] == 1
    # the hints table links each outcome to its pause (held_s kept)
    h = frames.hints
    assert list(h["status"]) == ["accepted", "rejected", "accepted", "clipped", "missing"]
    assert h["pause_id"].notna().all()
    assert h.loc[h["status"] == "clipped", "held_s"].iloc[0] == 2.0


def test_a_hint_with_no_pause_counts_in_the_run_not_in_a_bucket() -> None:
    b = Records()
    a = b.agent("a")
    a.call().tool(wait=2.0, action="keep").call(cached=110).end()
    hint(b, a.t, "a", 1, "keep", "deferred", hint_delay_s=0.4)
    hint(b, a.t, "a", 7, "keep", "missing")  # no pause at step 7
    frames = build_frames(b.frame())
    out = ho.hint_outcomes(frames, judge_resumes(frames))
    assert out is not None
    assert (out["hinted"], out["counts"]["deferred"], out["counts"]["missing"]) == (2, 1, 1)
    assert out["shares"]["deferred"] == 0.5
    assert out["by_pause_bucket"] == {"1-10s": {
        "hinted": 1, "counts": {"accepted": 0, "clipped": 0, "deferred": 1, "rejected": 0,
                                "missing": 0},
        "shares": {"accepted": 0.0, "clipped": 0.0, "deferred": 1.0, "rejected": 0.0,
                   "missing": 0.0}}}
    assert (out["accepted_judged"], out["accepted_and_reused"]) == (0, 0)


def test_no_hint_outcome_records_is_none() -> None:
    b = Records()
    b.agent("a").call().tool(wait=2.0, action="keep").call(cached=110).end()
    frames = build_frames(b.frame())
    assert len(frames.hints) == 0
    assert ho.hint_outcomes(frames, judge_resumes(frames)) is None
    s = summarize(b.frame(), RunManifest.from_dict(default_run()), None)
    assert s.hint_outcomes is None and s["hint_outcomes"] is None
    assert metric("hint_outcomes.shares.clipped").value(s) is None


def test_summary_block_typed_and_the_same_from_either_reader(tmp_path: Path) -> None:
    b = hinted_run()
    s = summarize(b.frame(), RunManifest.from_dict(default_run()), None)
    h = s.hint_outcomes
    assert isinstance(h, HintOutcomes)
    assert (h.hinted, h.share("accepted"), h.share("clipped"), h.accepted_and_reused) == (
        5, 0.4, 0.2, 1)
    doc = s.to_json()["hint_outcomes"]
    assert list(doc) == ["hinted", "counts", "shares", "accepted_judged",
                         "accepted_and_reused", "by_pause_bucket"]
    assert Summary.from_json(s.to_json()).to_json() == s.to_json()
    assert summarize_dir(b.write(tmp_path / "run")).to_json()["hint_outcomes"] == doc
    for outcome, share in (("accepted", 0.4), ("clipped", 0.2), ("deferred", 0.0),
                           ("rejected", 0.2), ("missing", 0.2)):
        m = metric(f"hint_outcomes.shares.{outcome}")
        assert (m.value(s), m.unit, m.optional) == (share, "fraction", True)
        assert m.bigger_is_better == (outcome == "accepted")


def test_an_older_summary_reads_without_the_block_and_writes_back_without_it() -> None:
    old = {"runtime": "llama.cpp", "policy": "keep", "hint_honoured": None}
    s = Summary.from_json(old)
    assert s.hint_outcomes is None and "hint_outcomes" not in s
    assert s.to_json() == old


def test_compare_export_and_the_bench_column(tmp_path: Path) -> None:
    base = load_run(hinted_run().write(tmp_path / "base"))
    plain = Records()
    plain.agent("a").call().tool(wait=2.0, action="keep").call(cached=110).end()
    new = load_run(plain.write(tmp_path / "new"))
    rows = {r["name"]: r for r in compare_runs(base, new)["metrics"]}
    assert rows["hint_outcomes.shares.clipped"]["base"] == 0.2
    assert rows["hint_outcomes.shares.clipped"]["new"] is None
    assert rows["hint_outcomes.shares.clipped"]["verdict"] == "n/a"
    text = format_text(compare_runs(base, base))
    # the longest name sets the first column: every row's base value ends at one place
    ends = {m.end() for line in text.splitlines()[2:-1] if (m := re.match(r"\S+\s+\S+", line))}
    assert ends == {len("hint_outcomes.shares.accepted") + 1 + 12}
    exported = {e["name"].split(" ", 1)[1]: e for e in benchmark_entries(base)}
    assert exported["hint_outcomes.shares.clipped"] == {
        "name": f"{base.label} hint_outcomes.shares.clipped", "unit": "fraction", "value": 0.2}
    assert "hint_outcomes.shares.accepted" not in exported  # bigger is better: left out
    assert "hint_outcomes.shares.missing" not in {e["name"].split(" ", 1)[1]
                                                  for e in benchmark_entries(new)}
    table = retention_table([("keep", base.summary), ("plain", new.summary)])
    assert table is not None
    head, _, first, second = table.splitlines()[:4]
    assert head.endswith("  clipped") and first.endswith("20%") and second.endswith("-")
    without = retention_table([("plain", new.summary)])
    assert without is not None and "clipped" not in without


def test_the_report_draws_one_chart_of_the_shares(tmp_path: Path) -> None:
    base = load_run(hinted_run().write(tmp_path / "base"))
    plain = Records()
    plain.agent("a").call().tool(wait=2.0, action="keep").call(cached=110).end()
    new = load_run(plain.write(tmp_path / "new"))
    section = hints_section([base, new], lambda r: r.label)
    assert section.startswith("<h2 id='hints'>Hint outcomes</h2>")
    assert len(re.findall(r"src='data:image/png;base64,", section)) == 1
    assert "2 (40.0%)" in section and "1 of 2" in section
    assert section.count("<tr>") == 2  # the head and the one run with outcomes
    assert hints_section([new], lambda r: r.label) == ""
    doc = render_runs([base, new])
    assert "id='hints'" in doc and "http://" not in doc and "https://" not in doc
    assert "id='hints'" not in render_runs([new])
