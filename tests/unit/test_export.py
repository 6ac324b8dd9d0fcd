"""Export for github-action-benchmark: a customSmallerIsBetter list of {name, unit, value}."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from records_factory import Records, default_run

from harness.cli import main
from harness.report.export import export


def one_run(tmp_path: Path, name: str, policy: str, kv: bool = True) -> Path:
    b = Records()
    b.agent("a").call(ttft=0.1, decode=0.4).tool(wait=5.0, action="keep", retained=4096).call(
        ttft=0.05, decode=0.2).end()
    b.agent("b").call().tool(wait=1.0, action="keep").cancel()
    run = default_run(policy=policy)
    if not kv:
        run["model"] = {"name": "m"}
    return b.write(tmp_path / name, run)


def test_entries_exact(tmp_path: Path) -> None:
    entries = export([one_run(tmp_path, "r", "keep")])
    by_name = {e["name"]: e for e in entries}
    assert all(set(e) == {"name", "unit", "value"} for e in entries)
    assert by_name["llama.cpp/keep resume_latency_ms.p50"] == {
        "name": "llama.cpp/keep resume_latency_ms.p50", "unit": "ms",
        "value": pytest.approx(50.0)}
    assert by_name["llama.cpp/keep failure_rate"]["value"] == 50.0
    assert by_name["llama.cpp/keep failure_rate"]["unit"] == "%"
    assert by_name["llama.cpp/keep bytes_moved"]["value"] == 0.0
    assert "llama.cpp/keep goodput_per_min" not in by_name
    mem = by_name["llama.cpp/keep memory_time_mib_s"]
    assert mem["unit"] == "MiB·s" and mem["value"] > 720.0


def test_token_seconds_without_geometry(tmp_path: Path) -> None:
    entries = export([one_run(tmp_path, "r", "keep", kv=False)])
    (mem,) = [e for e in entries if e["name"].endswith("memory_time_mib_s")]
    assert mem["unit"] == "token·s"


def test_cli_export(tmp_path: Path) -> None:
    dirs = [str(one_run(tmp_path, "a", "keep")), str(one_run(tmp_path, "b", "swap"))]
    res = CliRunner().invoke(main, ["export", "--format", "github-action-benchmark", *dirs])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert isinstance(doc, list) and {e["name"].split()[0] for e in doc} == {
        "llama.cpp/keep", "llama.cpp/swap"}
    assert CliRunner().invoke(main, ["export", str(tmp_path / "none")]).exit_code == 2
    assert CliRunner().invoke(main, ["export", "--format", "csv", dirs[0]]).exit_code == 2
