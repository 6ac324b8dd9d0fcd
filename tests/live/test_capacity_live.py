"""`harness capacity` on real llama-servers it starts and stops per point: the search runs its
points as bounded replays (ordinary results directories `report` reads), confirms what it
found, writes capacity.json and the report, and leaves no server running."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from harness.cli import main
from tests.live.processes import alive

pytestmark = pytest.mark.live


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cap") / "t.parquet"
    r = CliRunner().invoke(main, ["traces", "gen", "--profile", "bench-small",
                                  "--trajectories", "12", "--seed", "1", "--out", str(path)])
    assert r.exit_code == 0, r.output
    return path


def _capacity(trace: Path, out: Path, *args: str) -> tuple[Any, dict[str, Any]]:
    r = CliRunner().invoke(main, [
        "capacity", "--trace", str(trace), "--slots", "2", "--ctx-per-slot", "2048",
        "--token-scale", "0.5", "--point-duration", "8s", "--warmup", "2s", "--budget", "3m",
        "--max-agents", "1", "--out", str(out), *args])
    doc = json.loads((out / "capacity.json").read_text())
    return r, doc


def test_capacity_finds_and_confirms_on_a_real_server(trace: Path, tmp_path: Path) -> None:
    r, doc = _capacity(trace, tmp_path / "c", "--slo", "resume_p95=60s", "--policies", "keep")
    assert r.exit_code == 0, r.output
    keep = doc["policies"]["keep"]
    # One agent at most: a verdict on goodput between two counts would hang on a few tasks
    # in 6-s windows (the search itself is tested on fakes).
    assert [(p["phase"], p["agents"]) for p in keep["points"]] == [
        ("search", 1), ("confirm", 1)]
    assert (keep["capacity"], keep["failing_above"], keep["reason"]) == (1, None, "max-agents")
    assert keep["confirm"]["confirmed"] is True and keep["confirm"]["above"] is None
    assert keep["at_capacity"]["resume_latency_ms"]["n"] > 0
    for p in keep["points"]:
        d = Path(p["dir"])
        run = json.loads((d / "run.json").read_text())
        assert run["window"] == {"warmup_s": 2.0, "duration_s": 8.0}
        assert run["arrivals"]["concurrency"] == p["agents"]
        assert run["trace"]["copies"] >= 1
        assert (d / "window.json").is_file() and (d / "summary.json").is_file()
        assert not alive(run["server_process"]["pid"])
    assert "keep" in r.output and "yes (max-agents)" in r.output
    html = (tmp_path / "c" / "report.html").read_text()
    assert "Capacity under the SLO" in html and "data:image/png;base64," in html
    point = Path(keep["points"][0]["dir"])
    rep = CliRunner().invoke(main, ["report", str(point), "--out", str(tmp_path / "p.html")])
    assert rep.exit_code == 0, rep.output


def test_a_slo_no_count_meets_ends_after_one_point(trace: Path, tmp_path: Path) -> None:
    r, doc = _capacity(trace, tmp_path / "c", "--slo", "resume_p95=5ms", "--policies",
                       "recompute")
    assert r.exit_code == 0, r.output
    rec = doc["policies"]["recompute"]
    assert (rec["capacity"], rec["failing_above"], rec["reason"]) == (0, 1, "none-pass")
    assert rec["confirm_skipped"] == "nothing passed"
    assert [(p["phase"], p["agents"]) for p in rec["points"]] == [("search", 1)]
    run = json.loads((Path(rec["points"][0]["dir"]) / "run.json").read_text())
    assert not alive(run["server_process"]["pid"])
