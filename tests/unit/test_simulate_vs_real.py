"""The simulator against a real llama.cpp replay of one trace (tests/data/llamacpp-bench-small).

The reference: `harness calibrate` (prefill tok/s by context, decode tok/s by context, the rate of
a 32-token prompt appended to each cached context, slot save/restore), then right after it
`harness bench --policies keep,recompute --calibration` replaying traces/bench-small.parquet (24
trajectories, 6 agents in a closed loop, 4 slots x 4096 tokens, one llama-server thread pinned to
its own core, slots handed out first come first served) on the otherwise idle 2-core development
machine. The simulator replays the same trace with the same policy, arrivals and capacity, its
server costs fitted from that calibration only (never from the replay).

Target: simulated P95 resume latency within 15% of the measured one. Reached: keep -0.2%,
recompute +0.1% (P50 -29% / -8%). A second calibration taken right after the replay gave keep
+1% and recompute -2%. What made the difference is measuring what a kept request's resume
computes: a short prompt appended to a cached context runs attention row by row at about the
same cost per cell as a decode token here, so the append rate prices it directly. A reference
taken while this VM's speed drifted (decode 30 -> 48 ms/token for the same request within two
minutes, seen while building this test) misses the target whatever the model: the rates must be
measured next to the replay they predict. The measured P95s are themselves uncertain (32 resumes
per policy; bootstrap 95% intervals keep -26%..+6%, recompute -12%..+20%).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from harness.model.calibration import read_calibration
from harness.simulate.options import SimOptions
from harness.simulate.run import Arrivals, check_capacity, run_simulation

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "llamacpp-bench-small"
TRACE = ROOT / "traces" / "bench-small.parquet"
TARGET = 0.15  # |simulated / measured - 1| of P95 resume latency


def measured(policy: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((DATA / policy / "summary.json").read_text())
    return data


def simulated(policy: str, tmp: Path) -> dict[str, Any]:
    real_run = json.loads((DATA / policy / "run.json").read_text())
    assert real_run["runtime"] == "llamacpp" and real_run["policy"] == policy
    assert real_run["trace"]["sha256"] == _sha(TRACE), "the trace changed since the reference"
    arrivals = real_run["arrivals"]
    out = tmp / policy
    cap = check_capacity(None, real_run["slots"], real_run["ctx_per_slot"])
    run_simulation(SimOptions(TRACE, policy, {}, cap, DATA / "calibration.json",
                              Arrivals(arrivals["mode"], arrivals["concurrency"]),
                              real_run["seed"], out),
                   read_calibration(DATA / "calibration.json"))
    data: dict[str, Any] = json.loads((out / "summary.json").read_text())
    return data


def _sha(path: Path) -> str:
    from harness.traces.schema import file_sha256

    return file_sha256(path)


def errors(policy: str, tmp: Path) -> dict[str, float]:
    sim = simulated(policy, tmp)["resume_latency_ms"]
    real = measured(policy)["resume_latency_ms"]
    assert sim["n"] == real["n"], "the same pauses resume in both"
    return {q: sim[q] / real[q] - 1 for q in ("p50", "p95")}


@pytest.mark.parametrize("policy", ["keep", "recompute"])
def test_simulated_p95_resume_latency_within_15_percent_of_the_real_run(policy: str,
                                                                       tmp_path: Path) -> None:
    err = errors(policy, tmp_path)
    print(f"{policy}: simulated vs measured resume latency P50 {err['p50']:+.1%}, "
          f"P95 {err['p95']:+.1%}")
    assert abs(err["p95"]) <= TARGET, err


def test_the_reference_calibration_was_measured_next_to_the_replay() -> None:
    cal = read_calibration(DATA / "calibration.json")
    assert cal.append_points and cal.decode_points, "the reference predates append_points"
    for policy in ("keep", "recompute"):
        real_run = json.loads((DATA / policy / "run.json").read_text())
        assert real_run["calibration"]["measured_at"] == cal.measured_at
