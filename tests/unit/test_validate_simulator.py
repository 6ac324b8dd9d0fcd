"""benchmarks/validate_simulator.py's hint-outcome comparison and its tables' clipped column."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def load(name: str) -> ModuleType:
    sys.path.insert(0, str(ROOT / "benchmarks"))  # validate_simulator imports its tables so
    try:
        spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


def outcomes(hinted: int, clipped: int) -> dict[str, Any]:
    return {"hint_outcomes": {"hinted": hinted, "shares": {
        "accepted": (hinted - clipped) / hinted, "clipped": clipped / hinted}}}


def test_the_clipped_share_is_the_summarys_and_none_without_hints() -> None:
    v = load("validate_simulator")
    assert v.clipped_share(outcomes(37, 6)) == 6 / 37
    assert v.clipped_share({"hint_outcomes": {"hinted": 0, "shares": {}}}) is None
    assert v.clipped_share({"hint_outcomes": None}) is None
    assert v.clipped_share({}) is None


def row(clipped: tuple[float | None, float | None]) -> dict[str, Any]:
    q = {"p50": 100.0, "p95": 200.0, "p99": 300.0}
    return {"policy": "keep", "resumes": 111, "simulated": q, "measured": q,
            "measured_ci95": {}, "simulated_seeds": {"runs": 1}, "error": dict.fromkeys(q, 0.0),
            "reuse_measured": 0.815, "reuse_simulated": 0.837, "clipped_measured": clipped[0],
            "clipped_simulated": clipped[1], "server_time_measured_over_simulated": {},
            "preempted_calls": None, "target_met": True, "rate_factors": {
                "source": "paired", "prefill": 1.1, "decode": 1.2},
            "waits_ms": {k: {w: {"p50": 1.0, "p95": 2.0} for w in ("alone", "shared")}
                         for k in ("measured", "simulated_engine_only")},
            "pinned": {"late": 0, "pinned_events": 10, "late_max_s": 0.0},
            "at": "the calibration"}


def test_each_table_gives_the_clipped_shares_measured_and_simulated() -> None:
    t = load("validation_tables")
    for render in (t.table, t.rates_table, t.pinned_table):
        text = render([row((6 / 37, 3 / 37)), row((None, None))])
        lines = text.splitlines()
        assert "hints clipped measured / simulated" in lines[0]
        # every row has as many cells as the head
        assert len({line.count("|") for line in lines}) == 1
        assert "| 16.2% / 8.1% |" in lines[2]
        assert "| 81.5% / 83.7% | - |" in lines[3]
