"""History: runs ordered by started_at, steps detected between consecutive runs, HTML trend."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from report_fixtures import write_run

from harness.cli import main
from harness.metrics.registry import HEADLINE
from harness.report.data import load_run
from harness.report.history import detect_steps, history, order_runs


@pytest.fixture(scope="module")
def commits(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("hist")
    slow = {"c1": 1.0, "c2": 1.0, "c3": 1.7, "c4": 1.0}
    # written out of order: history must sort by started_at
    return [write_run(root / c, "keep", n_traj=10, tools=3, seed=5, slow=slow[c],
                      run={"git_commit": c + "0" * 38,
                           "started_at": f"2025-01-0{c[1]}T00:00:00Z"})
            for c in ("c3", "c1", "c4", "c2")]


def test_order_and_an_outlier_is_no_step(commits: list[Path]) -> None:
    runs = order_runs([load_run(p) for p in commits])
    assert [r.path.name for r in runs] == ["c1", "c2", "c3", "c4"]
    # c3 alone is 1.7x slower, c4 is back: one outlying run, not two steps
    assert [s for s in detect_steps(runs) if s["metric"].startswith("resume")] == []


def _series(root: Path, slow: list[float]) -> list[Path]:
    return [write_run(root / f"s{i}", "keep", n_traj=10, tools=3, seed=5, slow=x,
                      run={"git_commit": f"s{i}" + "0" * 38,
                           "started_at": f"2025-01-0{i + 1}T00:00:00Z"})
            for i, x in enumerate(slow)]


def test_a_sustained_change_is_one_confirmed_step(tmp_path: Path) -> None:
    runs = order_runs([load_run(p) for p in _series(tmp_path, [1.0, 1.0, 1.7, 1.7])])
    resume = [s for s in detect_steps(runs) if s["metric"] == "resume_latency_ms.p50"]
    assert [(s["from"][:2], s["to"][:2], s["verdict"], s["confirmed"]) for s in resume] == [
        ("s1", "s2", "regressed", True)]
    assert resume[0]["ratio"] == pytest.approx(resume[0]["new"] / resume[0]["base"])


def test_a_change_in_the_newest_run_is_an_unconfirmed_step(tmp_path: Path) -> None:
    dirs = _series(tmp_path, [1.0, 1.0, 1.0, 1.7])
    resume = [s for s in detect_steps(order_runs([load_run(p) for p in dirs]))
              if s["metric"] == "resume_latency_ms.p50"]
    assert [(s["to"][:2], s["verdict"], s["confirmed"]) for s in resume] == [
        ("s3", "regressed", False)]
    assert "unconfirmed" in history(dirs)


def test_history_html_and_cli(commits: list[Path], tmp_path: Path) -> None:
    doc = history(commits)
    assert "id='steps'" in doc and "id='trends'" in doc and "regressed" in doc
    assert "https://" not in doc and "http://" not in doc
    srcs = re.findall(r"src='([^']*)'", doc)
    # one trend plot per registered headline metric the runs measure (no keep-evictable
    # pause here: its effective retention is left out; these records have no hint outcomes:
    # their five shares are left out)
    assert len(srcs) == len(HEADLINE) - 6 == 18
    assert all(s.startswith("data:image/png;base64,") for s in srcs)
    out = tmp_path / "h.html"
    res = CliRunner().invoke(main, ["history", *map(str, commits), "--out", str(out)])
    assert res.exit_code == 0 and out.read_text().startswith("<!DOCTYPE html>")
    res = CliRunner().invoke(main, ["history", str(tmp_path / "x"), "--out", str(out)])
    assert res.exit_code == 2


def test_runs_from_two_hosts_are_two_series(tmp_path: Path) -> None:
    from harness.report.history import series_labels

    xeon = {"cpu_model": "Xeon", "logical_cpus": 2, "memory_bytes": 1 << 34}
    epyc = {**xeon, "cpu_model": "EPYC"}
    dirs = [write_run(tmp_path / f"r{i}", "keep", n_traj=6, tools=2, seed=5,
                      slow=1.0 if host is xeon else 1.7,
                      run={"git_commit": f"c{i}" + "0" * 38, "host": host,
                           "started_at": f"2025-01-0{i + 1}T00:00:00Z"})
            for i, host in enumerate((xeon, epyc, xeon, epyc))]
    runs = order_runs([load_run(p) for p in dirs])
    series_labels(runs)
    assert [r.label.split(" @ ")[1] for r in runs] == ["host 1", "host 2", "host 1", "host 2"]
    # the slower machine is its own series: alternating hosts is no step
    assert [s for s in detect_steps(runs) if s["metric"] == "resume_latency_ms.p50"] == []
    doc = history(dirs)
    assert "id='hosts'" in doc and "Xeon" in doc and "EPYC" in doc


def test_one_host_keeps_plain_series(commits: list[Path]) -> None:
    from harness.report.history import series_labels

    runs = [load_run(p) for p in commits]
    series_labels(runs)
    assert all(" @ " not in r.label for r in runs)
