"""The advisor: its candidate space, the simulated ranking (the real simulator on the shipped
trace), and how confirmation decides (fake measurements, exact figures)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from harness.advise.candidates import (
    Candidate,
    candidate_space,
    objective_value,
    simulate_candidates,
    simulated_measure,
)
from harness.advise.confirm import compare, disagreement, recommend, rel_error
from harness.advise.explain import explain
from harness.capacity.driver import SearchSettings
from harness.capacity.slo import parse_slo
from harness.cli import main
from harness.errors import InputError
from harness.model.calibration import read_calibration
from harness.specs.advise import AdviseSpec
from harness.traces.validate import load_trajectories

ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT / "traces" / "bench-small.parquet"
CAL = ROOT / "tests" / "data" / "llamacpp-bench-small" / "calibration.json"


def test_candidate_space_and_labels() -> None:
    cands = candidate_space(["keep", "ttl"], [4, 8], [4096])
    assert len(cands) == 2 * (1 + 8)
    ttl = [c for c in cands if c.policy == "ttl" and c.slots == 4]
    assert ttl[0].label() == "ttl after=swap tau=0.5"
    assert ttl[-1].label(True) == "ttl quantile=0.9 @ 4x4096"
    assert ttl[0].key() == "ttl_afterswap_tau0.5_s4_c4096"
    assert Candidate("keep", (), 4, 4096).fixed and not ttl[0].fixed
    with pytest.raises(InputError, match="not oracle"):
        candidate_space(["keep", "oracle"], [4], [4096])
    with pytest.raises(InputError, match="a fixed policy"):
        candidate_space(["ttl"], [4], [4096])
    slots = {f.name: f for f in AdviseSpec.fields()}["slots"]  # a list, one parser for all
    with pytest.raises(InputError, match="not an integer"):
        slots.value("4,x", "--slots")
    with pytest.raises(InputError, match="distinct"):
        slots.value("4,4", "--slots")
    with pytest.raises(InputError, match=r"--slots must be in \[1, 65,536\], got 0"):
        slots.value("2,0", "--slots")
    assert slots.value("2, 4", "--slots") == (2, 4)


def test_objectives_and_errors() -> None:
    assert objective_value("capacity", None, 3) == 3.0
    assert objective_value("goodput", {"goodput_per_min": 2.5}, 3) == 2.5
    assert objective_value("memory-time", {"kv_paused_mean_mib": 0.5}, 3) == 0.5
    assert rel_error(110.0, 100.0) == pytest.approx(0.1)
    assert rel_error(None, 100.0) is None and rel_error(1.0, 0.0) is None


def test_simulated_ranking_on_the_shipped_trace(tmp_path: Path) -> None:
    cands = candidate_space(["keep", "recompute"], [4], [4096])
    cal = read_calibration(CAL)
    measure = simulated_measure(TRACE, cal, CAL, 30.0, 5.0, 0, 1.0,
                                lambda s: cands[0].capacity())
    rows = simulate_candidates(cands, parse_slo("resume_p95=2400ms"), measure, tmp_path,
                               SearchSettings(max_agents=8), "capacity", None, lambda m: None)
    by = {r["label"]: r for r in rows}
    # Re-prefilling every context after every tool costs more than keeping it: keep holds
    # more agents under the same bound, and ranks first.
    assert rows[0]["label"] == "keep" and [r["rank"] for r in rows] == [1, 2]
    assert by["keep"]["capacity"] > by["recompute"]["capacity"]
    p = by["keep"]["predicted"]
    assert p["agents"] == by["keep"]["capacity"] and p["meets_slo"]
    assert p["objective"] == float(by["keep"]["capacity"])
    assert Path(p["dir"]).is_dir()  # an ordinary (simulated) results directory
    rows_why = explain(load_trajectories(TRACE), cal, Path(p["dir"]))
    classes = {r["tool_class"]: r for r in rows_why}
    assert set(classes) == {"local_read", "remote_read", "sandbox"}
    assert classes["remote_read"]["pauses"] == 18
    assert set(classes["remote_read"]["actions"]) == {"keep"}
    rr = classes["remote_read"]["restore_ms"]
    assert rr["recompute"] > 0 and rr["swap"] > 0


def _row(label: str, fixed: bool, objective: float, p95: float) -> dict[str, Any]:
    return {"label": label, "key": label, "fixed": fixed, "objective": "goodput",
            "predicted": {"agents": 3, "capacity": 3, "objective": objective,
                          "resume_latency_ms": {"p50": p95 / 2, "p95": p95, "p99": p95}}}


def test_confirmation_decides_on_measurement() -> None:
    top = compare(_row("ttl tau=2", False, 12.0, 1000.0),
                  {"resume_latency_ms": {"p50": 500.0, "p95": 1000.0, "p99": 1000.0},
                   "passed": True, "dir": "a"}, 9.0, 0.15)
    fixed = compare(_row("keep", True, 10.0, 1000.0),
                    {"resume_latency_ms": {"p50": 500.0, "p95": 1100.0, "p99": 1000.0},
                     "passed": True, "dir": "b"}, 10.0, 0.15)
    assert top["error"]["objective"] == pytest.approx(3 / 9)
    assert not top["objective_within_tolerance"] and fixed["objective_within_tolerance"]
    assert fixed["error"]["resume_p95"] == pytest.approx(100 / 1100)
    rec = recommend([top, fixed], "goodput")
    # the simulator's pick measured less goodput than keep: keep is recommended, on measurement
    assert (rec["label"], rec["rests_on"], rec["measured_objective"]) == (
        "keep", "measurement", 10.0)
    text = disagreement([top, fixed], 0.15)
    assert text is not None and "ttl tau=2 objective by 33%" in text
    agree = recommend([fixed], "goodput")
    assert agree["rests_on"] == "simulation"
    assert disagreement([fixed], 0.15) is None


@pytest.mark.parametrize("args, says", [
    (["--slo", "resume_p97=1s"], "unknown term"),
    (["--slo", "success=2"], "impossible bound"),
    (["--slo", "resume_p95=2s", "--slots", "2,4", "--url", "http://127.0.0.1:9"],
     "the server's own slots"),
    (["--slo", "resume_p95=2s", "--policies", "ttl"], "a fixed policy"),
    (["--slo", "resume_p95=2s", "--warmup", "1m", "--point-duration", "30s"], "shorter"),
])
def test_advise_refuses_bad_input_in_one_line(args: list[str], says: str) -> None:
    r = CliRunner().invoke(main, ["advise", "--calibration", str(CAL), *args])
    assert r.exit_code == 2, r.output
    assert says in r.output and len(r.output.strip().splitlines()) == 1


@pytest.mark.parametrize("args, says", [
    (["--slo", "ttft_p42=1s"], "unknown term"),
    (["--slo", "resume_p95=1ms"], "impossible bound"),
    (["--slo", "resume_p95=2s", "--policies", "keep,nope"], "unknown policy"),
])
def test_capacity_refuses_bad_input_in_one_line(args: list[str], says: str) -> None:
    r = CliRunner().invoke(main, ["capacity", *args])
    assert r.exit_code == 2, r.output
    assert says in r.output and len(r.output.strip().splitlines()) == 1


def test_advise_without_confirmation_writes_advice_and_report(tmp_path: Path) -> None:
    r = CliRunner().invoke(main, ["advise", "--calibration", str(CAL), "--slo",
                                  "resume_p95=2400ms", "--policies", "keep,swap",
                                  "--no-confirm", "--max-agents", "8", "--out",
                                  str(tmp_path)])
    assert r.exit_code == 0, r.output
    assert "recommendation (capacity, SLO resume_p95=2400ms):" in r.output
    assert (tmp_path / "advice.json").is_file() and (tmp_path / "report.html").is_file()
    assert "<h2>Advice</h2>" in (tmp_path / "report.html").read_text()
