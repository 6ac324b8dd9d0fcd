"""`harness compare` across records versions: a results directory written by an older harness
(tests/data/llamacpp-bench-small, records version 1) against one written now (a simulation of
the same trace) gets a verdict, in either order, not an error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from harness.cli import main
from harness.records.schema import RECORDS_SCHEMA_VERSION
from harness.records.store import RECORDS_DIR, records_version

ROOT = Path(__file__).resolve().parents[2]
OLD = ROOT / "tests" / "data" / "llamacpp-bench-small" / "keep"
TRACE = ROOT / "traces" / "bench-small.parquet"


@pytest.fixture(scope="module")
def simulated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The old run's trace, policy and slots, simulated at its calibration."""
    out = tmp_path_factory.mktemp("sim") / "keep"
    res = CliRunner().invoke(main, [
        "simulate", "--trace", str(TRACE), "--policy", "keep", "--calibration",
        str(OLD.parent / "calibration.json"), "--slots", "4", "--ctx-per-slot", "4096",
        "--concurrency", "6", "--out", str(out)])
    assert res.exit_code == 0, res.output
    return out


def _version(directory: Path) -> int:
    return records_version(directory / RECORDS_DIR / "part-00000.parquet")


@pytest.mark.parametrize("order", ["old-first", "new-first"])
def test_an_old_run_compares_with_one_written_now(simulated: Path, order: str) -> None:
    assert _version(OLD) < 4 and _version(simulated) == RECORDS_SCHEMA_VERSION
    base, new = (OLD, simulated) if order == "old-first" else (simulated, OLD)
    res = CliRunner().invoke(main, ["compare", "--json", "--allow", "runtime,server",
                                    str(base), str(new)])
    assert res.exit_code in (0, 1), res.output  # a verdict; 2 would be a refusal or an error
    doc = json.loads(res.output)
    verdicts = {m["name"]: m for m in doc["metrics"]}
    # the figures of both versions' records are there, each with its verdict
    for name in ("ttft_ms.p50", "resume_latency_ms.p50"):
        assert verdicts[name]["base"] is not None and verdicts[name]["new"] is not None
        assert verdicts[name]["verdict"] in ("same", "improved", "regressed")
