"""summary.json through its types: every shipped summary reads identically through the new
types (read, then written again: the same bytes), older and newer keys are kept as they were,
a value of the wrong kind is one InputError, and every writer writes the typed summary."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from records_factory import Records, default_run

from harness.errors import InputError
from harness.metrics.registry import metric
from harness.metrics.summary import summarize
from harness.metrics.summary_types import (
    SUMMARY_KEYS,
    Quantiles,
    Summary,
    read_summary,
    save_summary,
)
from harness.records.manifest import RunManifest
from harness.records.store import SUMMARY_JSON
from harness.report.data import load_run

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted([*ROOT.glob("reports/baseline/*/summary.json"),
                  *ROOT.glob("tests/data/llamacpp-bench-small/**/summary.json")])


def test_the_shipped_summaries_are_found() -> None:
    assert len(SHIPPED) >= 5  # three baselines, two of the small llama.cpp bench


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(ROOT)))
def test_shipped_summaries_read_identically_through_the_new_types(path: Path,
                                                                   tmp_path: Path) -> None:
    s = read_summary(path.parent)
    save_summary(tmp_path, s)
    assert (tmp_path / SUMMARY_JSON).read_bytes() == path.read_bytes()
    assert s == json.loads(path.read_text()) and s.to_json() == json.loads(path.read_text())
    assert isinstance(s.resume_latency_ms, Quantiles) and s.resume_latency_ms.p95 is not None
    assert s.trajectories.total == 24 and s.policy in ("keep", "swap", "recompute")


def test_older_summaries_lack_keys_that_stay_out_when_written_again(tmp_path: Path) -> None:
    old = ROOT / "tests/data/llamacpp-bench-small/keep"
    s = read_summary(old)
    assert s.summary_version == "1"
    assert {"client_lag_ms", "health", "job_completion_s", "outcome_ci95"} <= s.absent
    assert s.health == [] and s.job_completion_s == Quantiles() and s.makespan_s is None
    assert "health" not in s and "health" not in s.to_json()
    assert metric("job_completion_s.p50").value(s) is None  # a default, not a KeyError


def test_unknown_keys_are_kept_as_they_were(tmp_path: Path) -> None:
    data = {"policy": "keep", "a_newer_key": {"x": [1, 2]},
            "resume_latency_ms": {"n": 2, "p50": 1, "p95": 2.5, "p99": None, "by_x": 3}}
    s = Summary.from_json(data)
    assert s.extra == {"a_newer_key": {"x": [1, 2]}}
    assert s.resume_latency_ms.extra == {"by_x": 3}
    assert s.to_json() == data and list(s) == ["policy", "resume_latency_ms", "a_newer_key"]
    assert isinstance(s.resume_latency_ms.p50, int)  # kept as read: the same JSON
    save_summary(tmp_path, s)
    assert read_summary(tmp_path) == s


@pytest.mark.parametrize("data, key", [
    ({"trajectories": [1]}, "trajectories"),
    ({"resume_latency_ms": {"p50": "fast"}}, "p50"),
    ({"health": [{"check": 1}]}, "check"),
    ({"pauses": True}, "pauses"),
])
def test_a_value_of_the_wrong_kind_is_one_input_error(data: dict[str, object], key: str,
                                                     tmp_path: Path) -> None:
    (tmp_path / SUMMARY_JSON).write_text(json.dumps(data))
    with pytest.raises(InputError, match=f"summary.json.*{key} must be"):
        read_summary(tmp_path)


def test_a_missing_summary_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no summary"):
        read_summary(tmp_path)


def test_a_computed_summary_is_typed_and_round_trips(tmp_path: Path) -> None:
    b = Records()
    t = b.agent("a")
    t.call(ttft=0.1, decode=0.4, appended=100, out=10)
    t.tool(wait=5.0, action="keep", retained=4096, cls="sandbox")
    t.call(ttft=0.05, decode=0.2, appended=20, out=5, cached=4096)
    t.end()
    s = summarize(b.frame(), RunManifest.from_dict(default_run()), None)
    assert tuple(s) == SUMMARY_KEYS and s.absent == frozenset() and s.extra == {}
    assert s.trajectories.succeeded == 1 and s.resume_latency_ms.n == 1
    assert s.resume_latency_ms.ci_at("p50") is None and "mean" in s.resume_latency_ms.absent
    assert s.health and all(c.status for c in s.health)
    save_summary(tmp_path, s)
    assert read_summary(tmp_path) == s


def test_the_report_rewrites_a_summary_through_the_types(tmp_path: Path) -> None:
    run = tmp_path / "keep"
    shutil.copytree(ROOT / "reports/baseline/keep", run)
    data = load_run(run, write_summary=True)
    assert isinstance(data.summary, Summary)
    assert read_summary(run) == data.summary
