"""The committed baseline is a usable reference for the CI gate."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from harness.cli import main

BASELINE = Path(__file__).resolve().parents[2] / "reports" / "baseline"


def test_baseline_against_itself_is_not_a_regression() -> None:
    keep = str(BASELINE / "keep")
    res = CliRunner().invoke(main, ["compare", keep, keep, "--json", "--fail-on-regression"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["regressed"] is False
    assert {m["verdict"] for m in out["metrics"]} == {"same"}


def test_the_gate_fails_on_a_real_regression() -> None:
    # swap resumes ~3x slower than keep on this workload: the gate must catch it, once told
    # that the policies may differ
    args = ["compare", str(BASELINE / "keep"), str(BASELINE / "swap"), "--fail-on-regression"]
    refused = CliRunner().invoke(main, args)
    assert refused.exit_code == 2 and "policy (keep vs swap)" in refused.output
    res = CliRunner().invoke(main, [*args, "--allow", "policy"])
    assert res.exit_code == 1, res.output
    assert "regressed" in res.output


def test_the_baseline_s_policies_ran_under_one_cpu_pinning() -> None:
    """The gate compares policies and commits against this baseline: all of its servers had the
    same CPUs, recorded in a run.json of the current version."""
    from harness.records.manifest import MANIFEST_VERSION, read_manifest

    runs = [read_manifest(BASELINE / p) for p in ("keep", "swap", "recompute")]
    assert {r.schema_version for r in runs} == {MANIFEST_VERSION}
    assert all(r.cpu_pinning is not None for r in runs)
    assert len({repr(r.cpu_pinning) for r in runs}) == 1
