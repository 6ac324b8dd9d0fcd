"""The report's 'Simulated vs measured' section: pairs, exact errors, and its absence."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from harness.model.calibration import read_calibration
from harness.records.manifest import RunManifest
from harness.report.data import load_run
from harness.report.fidelity import fidelity_section, pairs, relative_error
from harness.report.render import render_runs
from harness.simulate.options import SimOptions
from harness.simulate.run import Arrivals, check_capacity, run_simulation

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "llamacpp-bench-small"
TRACE = ROOT / "traces" / "bench-small.parquet"


def test_relative_error() -> None:
    assert relative_error(110.0, 100.0) == pytest.approx(0.1)
    assert relative_error(90, 100) == pytest.approx(-0.1)
    assert relative_error(None, 100.0) is None
    assert relative_error(1.0, 0.0) is None
    assert relative_error(float("nan"), 1.0) is None


def test_a_simulated_and_a_real_run_of_one_trace_and_policy_pair_up(tmp_path: Path) -> None:
    real_dir = tmp_path / "real"
    shutil.copytree(DATA / "keep", real_dir)
    real_run = json.loads((real_dir / "run.json").read_text())
    sim_dir = tmp_path / "sim"
    cap = check_capacity(None, real_run["slots"], real_run["ctx_per_slot"])
    run_simulation(SimOptions(TRACE, "keep", {}, cap, None,
                              Arrivals("closed", real_run["arrivals"]["concurrency"]),
                              real_run["seed"], sim_dir),
                   read_calibration(DATA / "calibration.json"))
    real, sim = load_run(real_dir), load_run(sim_dir)
    found = pairs([real, sim])
    assert [(p.simulated.path, p.measured.path) for p in found] == [(sim_dir, real_dir)]
    section = fidelity_section([real, sim])
    sim_p95 = sim.summary["resume_latency_ms"]["p95"]
    real_p95 = real.summary["resume_latency_ms"]["p95"]
    assert f"{sim_p95 / real_p95 - 1:+.1%}" in section
    assert "Simulated vs measured" in render_runs([real, sim])
    # another policy, or the real run alone: no pair, no section
    recompute = load_run(DATA / "recompute")
    assert pairs([recompute, sim]) == [] and fidelity_section([recompute, sim]) == ""
    assert "Simulated vs measured" not in render_runs([real])


def test_bench_simulates_what_a_replay_ran(tmp_path: Path) -> None:
    from harness.bench.run import simulate_like

    run = simulate_like(DATA / "recompute", TRACE, "recompute", {}, DATA / "calibration.json",
                        tmp_path / "recompute-simulated").to_dict()
    real = json.loads((DATA / "recompute" / "run.json").read_text())
    assert run["runtime"] == "simulator" and run["policy"] == "recompute"
    assert (run["slots"], run["ctx_per_slot"], run["seed"]) == (real["slots"],
                                                                 real["ctx_per_slot"],
                                                                 real["seed"])
    assert run["arrivals"]["concurrency"] == real["arrivals"]["concurrency"]
    assert run["trace"]["sha256"] == real["trace"]["sha256"]
    assert pairs([load_run(DATA / "recompute"), load_run(tmp_path / "recompute-simulated")])


def test_calibration_age() -> None:
    from harness.report.fidelity import calibration_age_s

    sim = RunManifest(calibration={"measured_at": "2026-11-30T00:44:55+00:00"})
    assert calibration_age_s(sim, RunManifest(started_at="2026-11-30T00:46:55+00:00")) == 120.0
    assert calibration_age_s(sim, RunManifest(started_at="2026-11-30T00:43:55+00:00")) == -60.0
    assert calibration_age_s(RunManifest(),
                             RunManifest(started_at="2026-11-30T00:43:55+00:00")) is None
    assert calibration_age_s(sim, RunManifest(started_at="not a time")) is None
