"""capacity.json and advice.json as typed results: what the search and the advisor write reads
back into the same type and writes again to the same bytes as the JSON they were built from,
keys unknown to this harness kept; a file of the wrong shape is one line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from harness.advise.result import AdviceResult, read_advice, save_advice
from harness.capacity.driver import PointSpec, SearchSettings, search_policy
from harness.capacity.live import nan_free
from harness.capacity.result import CapacityResult, read_capacity, save_capacity
from harness.capacity.slo import parse_slo
from harness.cli import main
from harness.errors import InputError
from harness.records.store import write_json
from tests.unit.test_capacity_driver import FakeServer
from tests.unit.test_capacity_view import advice_doc, capacity_doc


def fake_search(root: Path) -> dict[str, Any]:
    """capacity.json's content as run_capacity builds it, of three policies searched on the
    fake server: one resolved and confirmed, one stopped by its budget (confirmation
    contradicted), one without confirmation."""
    slo = parse_slo("resume_p95=2000ms,success=0.9")
    fake = FakeServer()
    doc: dict[str, Any] = {
        "kind": "capacity", "slo": slo.spec(),
        "slo_terms": [{"term": t.name, "bound": t.bound, "kind": t.kind} for t in slo.terms],
        "trace": "traces/bench-small.parquet", "runtime": "llamacpp", "url": None,
        "point": {"duration_s": 45.0, "warmup_s": 10.0}, "budget_s": 10_000.0,
        "started_at": "2026-01-02T03:04:05+00:00", "slots": 4, "ctx_per_slot": 4096,
        "policies": {}}
    for policy, args, budget, confirm in (("keep", {}, 10_000.0, True),
                                          ("ttl", {"tau": "2"}, 210.0, True),
                                          ("swap", {}, 10_000.0, False)):
        entry = search_policy(PointSpec(policy, args, 0), slo, fake.measure, root, budget,
                              SearchSettings(clock=fake.clock, confirm=confirm),
                              lambda _e: None)
        doc["policies"][policy] = entry
    doc["elapsed_s"] = fake.t
    return nan_free(doc)  # type: ignore[no-any-return]


def same_bytes_again(tmp_path: Path, doc: dict[str, Any], name: str) -> bytes:
    """The bytes of `doc` written as the harness wrote it before typed results."""
    path = tmp_path / "before" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, doc)
    return path.read_bytes()


@pytest.mark.parametrize("make", [fake_search, lambda _root: capacity_doc()])
def test_capacity_json_reads_and_writes_back_byte_for_byte(tmp_path: Path, make: Any) -> None:
    doc = make(tmp_path / "points")
    before = same_bytes_again(tmp_path, doc, "capacity.json")
    result = CapacityResult.from_json(doc)
    assert result.to_json() == doc
    save_capacity(tmp_path, result)
    assert (tmp_path / "capacity.json").read_bytes() == before
    again = read_capacity(tmp_path)
    assert again == result
    save_capacity(tmp_path, again)
    assert (tmp_path / "capacity.json").read_bytes() == before


def test_capacity_result_fields() -> None:
    result = CapacityResult.from_json(fake_search(Path("/r")))
    by = dict(result.searched())
    assert list(by) == ["keep", "ttl", "swap"]
    keep, ttl, swap = by["keep"], by["ttl"], by["swap"]
    assert (keep.capacity, keep.failing_above, keep.reason) == (4, 5, "resolved")
    assert keep.confirm is not None and keep.confirm.confirmed is True
    assert keep.at_capacity is not None and keep.at_capacity.agents == 4
    assert keep.at_capacity.resume_latency_ms is not None
    assert keep.at_capacity.resume_latency_ms.p95 == 2000.0
    assert keep.measured()[0].terms()[0].term == "resume_p95"
    assert ttl.contradicted and (ttl.capacity, ttl.reason) == (2, "budget")
    assert swap.confirm is None and "confirm_skipped" in swap.absent
    assert result.contradicted and result.slots == 4


@pytest.mark.parametrize("make", [advice_doc, lambda: {**advice_doc(), "newer": {"k": 1}}])
def test_advice_json_reads_and_writes_back_byte_for_byte(tmp_path: Path, make: Any) -> None:
    doc = make()
    before = same_bytes_again(tmp_path, doc, "advice.json")
    result = AdviceResult.from_json(doc)
    assert result.to_json() == doc
    save_advice(tmp_path, result)
    assert (tmp_path / "advice.json").read_bytes() == before
    assert read_advice(tmp_path) == result


def test_advice_result_fields() -> None:
    result = AdviceResult.from_json(advice_doc())
    assert result.recommendation is not None and result.recommendation.rests_on == "measurement"
    assert [c.rank for c in result.ranked()] == [2, 1, 3]
    first = result.confirmations()[0]
    assert first.predicted is not None and first.predicted.resume_p95_ms == 1500.0
    assert first.error_of("success_rate", "objective") == 0.0
    assert result.best_fixed is not None and result.best_fixed.label == "keep"
    assert result.objective_missed  # no confirmation says it was within the tolerance
    doc = advice_doc()
    for c in doc["confirmed"]:
        c["objective_within_tolerance"] = True
    assert not AdviceResult.from_json(doc).objective_missed
    doc["confirmed"][1]["objective_within_tolerance"] = False
    assert AdviceResult.from_json(doc).objective_missed


def test_a_file_that_is_not_the_shape_written_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "capacity.json").write_text(json.dumps({"policies": {"keep": {"points": 3}}}))
    with pytest.raises(InputError, match="points must be a list or null, got int"):
        read_capacity(tmp_path)
    r = CliRunner().invoke(main, ["report", str(tmp_path)])
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1, r.output
    assert "capacity.json" in r.output and "points" in r.output
    (tmp_path / "capacity.json").unlink()
    (tmp_path / "advice.json").write_text("[1, 2]")
    with pytest.raises(InputError, match="expected a JSON object, got list"):
        read_advice(tmp_path)
