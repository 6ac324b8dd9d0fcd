"""The HTML report: sections, inline images only, summary.json rewritten, CLI, and a real render."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner
from records_factory import Records, default_run
from report_fixtures import write_run

from harness.cli import main
from harness.records.store import SUMMARY_JSON
from harness.report.fmt import fmt
from harness.report.render import render_report

SECTIONS = ("headline", "cdf", "grid", "parts", "occupancy", "timeline", "tools", "by-class",
            "metadata")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("rep")
    keep = write_run(root / "keep", "keep", n_traj=8, tools=3)
    swap = write_run(root / "swap", "swap", n_traj=8, tools=3)
    sim = write_run(root / "sim", "recompute", n_traj=8, tools=3, run={"runtime": "simulator"})
    (swap / "prediction.json").write_text(json.dumps(
        {"swap": {"resume_ms_p50": 40.0, "resume_ms_p95": 50.0, "bytes_moved": 1000}}))
    return [keep, swap, sim]


def check_self_contained(doc: str) -> None:
    assert "http://" not in doc and "https://" not in doc
    assert "<script" not in doc.lower()
    srcs = re.findall(r"src='([^']*)'", doc)
    assert srcs and all(s.startswith("data:image/png;base64,") for s in srcs)


def test_single_run_report(runs: list[Path]) -> None:
    summary = runs[0] / SUMMARY_JSON
    summary.unlink(missing_ok=True)
    doc = render_report([runs[0]])
    for sec in SECTIONS:
        assert f"id='{sec}'" in doc
    check_self_contained(doc)
    assert len(re.findall(r"<img ", doc)) == 4  # CDF, occupancy, timeline, tool latency
    assert json.loads(summary.read_text())["policy"] == "keep"
    assert "llama.cpp/keep" in doc and "simulated" not in doc and "id='prediction'" not in doc


def test_comparison_report_labels_simulator_and_prediction(runs: list[Path]) -> None:
    doc = render_report(runs)
    check_self_contained(doc)
    assert "Tool-pause replay comparison" in doc
    for label in ("llama.cpp/keep", "llama.cpp/swap", "simulator/recompute"):
        assert label in doc
    assert "class='badge'>simulated" in doc
    assert "id='prediction'" in doc and "resume_ms_p95" in doc


def test_cli_report(runs: list[Path], tmp_path: Path) -> None:
    res = CliRunner().invoke(main, ["report", str(runs[0]), "--slo", "resume_ms=1"])
    assert res.exit_code == 0, res.output
    assert (runs[0] / "report.html").is_file()
    slo = json.loads((runs[0] / SUMMARY_JSON).read_text())
    assert slo["slo"] == {"resume_ms": 1.0} and slo["trajectories"]["succeeded"] == 0
    out = tmp_path / "cmp.html"
    res = CliRunner().invoke(main, ["report", *map(str, runs[:2]), "--out", str(out)])
    assert res.exit_code == 0 and out.is_file()
    res = CliRunner().invoke(main, ["report", *map(str, runs[:2])])
    assert res.exit_code == 2 and "--out" in res.output
    res = CliRunner().invoke(main, ["report", str(tmp_path / "missing")])
    assert res.exit_code == 2 and res.output.startswith("error: ")
    res = CliRunner().invoke(main, ["report", str(runs[0]), "--slo", "bogus=3"])
    assert res.exit_code == 2 and "unknown SLO" in res.output
    res = CliRunner().invoke(main, ["report", str(runs[0]), "--slo", "ttft_ms"])
    assert res.exit_code == 2 and "KEY=VALUE" in res.output


@pytest.mark.skipif(shutil.which("chromium") is None, reason="chromium not installed")
def test_chromium_renders_report(runs: list[Path], tmp_path: Path) -> None:
    html_path = tmp_path / "report.html"
    html_path.write_text(render_report(runs[:2]))
    shot = tmp_path / "shot.png"
    cmd = ["chromium", "--headless", "--no-sandbox", "--disable-gpu",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           "--no-first-run", f"--user-data-dir={tempfile.mkdtemp()}", f"--screenshot={shot}",
           "--window-size=1400,4000", html_path.as_uri()]
    subprocess.run(cmd, capture_output=True, timeout=90, check=False)
    assert shot.is_file() and shot.stat().st_size > 50_000
    from PIL import Image

    with Image.open(shot) as im:
        assert im.size == (1400, 4000)
        colors = im.convert("RGB").resize((140, 400)).getcolors(maxcolors=100_000)
        assert colors is not None and len(colors) > 50  # tables and plots, not a blank page


def test_report_of_edge_runs(tmp_path: Path) -> None:
    from records_factory import Records, default_run

    no_pause = Records()
    no_pause.agent("a").call().end()
    only_by = Records()
    only_by.bystander("bystander-0", at=0.0, ttft=0.1, decode=0.5)
    dirs = [no_pause.write(tmp_path / "np", default_run()),
            only_by.write(tmp_path / "by", {"runtime": "vllm"})]
    doc = render_report(dirs)
    check_self_contained(doc)
    assert "No resumed calls." in doc and "No agent trajectories." in doc


def test_the_report_shows_client_lag_and_warns_about_it(tmp_path: Path) -> None:
    from records_factory import Records

    late = Records()
    late.agent("a").call().tool(wait=0.5, lag=0.006).call().end()
    html = render_report([late.write(tmp_path / "late")])
    assert "client lag P99" in html
    assert "<b>warning</b>" in html and "client lag P99 6.0 ms" in html
    ok = Records()
    ok.agent("a").call().tool(wait=0.5, lag=0.0001).call().end()
    assert "<b>warning</b>" not in render_report([ok.write(tmp_path / "ok")])


def test_one_tool_box_per_class_when_every_run_planned_the_same_tools(tmp_path: Path) -> None:
    from harness.report.data import load_run
    from harness.report.render import same_tool_waits, tools_section

    keep = write_run(tmp_path / "keep", "keep", n_traj=6, tools=3, seed=4)
    # the same trace's tools, a slower server
    swap = write_run(tmp_path / "slow", "keep", n_traj=6, tools=3, seed=4, slow=1.5)
    other = write_run(tmp_path / "other", "keep", n_traj=6, tools=3, seed=9)
    same = [load_run(keep), load_run(swap)]
    assert same_tool_waits(same) and "stands for all" in tools_section(same)
    mixed = [load_run(keep), load_run(other)]
    assert not same_tool_waits(mixed) and "stands for all" not in tools_section(mixed)


def test_differences_against_the_baseline_run(runs: list[Path], tmp_path: Path) -> None:
    """One table per other run, each metric's ratio and interval as compare judges them, the
    aspects that differ listed; --baseline picks the run the others are against."""
    from harness.report.compare import compare_runs
    from harness.report.data import load_run
    from harness.report.differences import differences_section

    keep, swap = load_run(runs[0]), load_run(runs[1])
    section = differences_section([keep, swap], lambda r: r.label)
    assert "Differences against llama.cpp/keep" in section and section.count("<table>") == 1
    assert "policy (keep vs swap)" in section
    for m in compare_runs(keep, swap)["metrics"]:
        assert f"<td class='t'>{m['name']}</td>" in section
        if m["ratio"] is not None:
            assert f"<td>{m['ratio']:.3f}</td>" in section
        if m["ci95"]:
            assert f"[{m['ci95'][0]:.3f}, {m['ci95'][1]:.3f}]" in section
    assert differences_section([keep], lambda r: r.label) == ""
    out = tmp_path / "d.html"
    res = CliRunner().invoke(main, ["report", *map(str, runs[:2]), "--out", str(out),
                                    "--baseline", str(runs[1])])
    assert res.exit_code == 0, res.output
    assert "Differences against llama.cpp/swap" in out.read_text()
    res = CliRunner().invoke(main, ["report", *map(str, runs[:2]), "--out", str(out),
                                    "--baseline", str(runs[2])])
    assert res.exit_code == 2 and "not one of the directories" in res.output


def test_the_headline_gives_the_harness_lag_beside_the_resume_figures(tmp_path: Path) -> None:
    b = Records("lag")
    t = b.agent("a")
    t.call(ttft=0.05, decode=0.2, appended=500, out=20)
    for lag in (0.001, 0.003):  # the harness woke 1 and 3 ms after the tools' ends
        t.tool(wait=0.5, cls="local_read", action="keep", lag=lag)
        t.call(ttft=0.02, decode=0.2, appended=60, cached=t.context, out=20)
    t.end()
    run = b.write(tmp_path / "keep", default_run(policy="keep", run_id="lag"))
    doc = render_report([run])
    head = doc[doc.index("id='headline'"):doc.index("</table>", doc.index("id='headline'"))]
    cells = re.findall(r"<th>([^<]*)</th>", head)
    at = cells.index("client lag P99 ms")
    assert cells[at - 1] == "resume P99 ms"
    row = re.findall(r"<td>([^<]*)", head[head.index("<td>"):])
    # P99 of 1 and 3 ms, linear: 2.98 ms
    assert row[at] == fmt(2.98) and json.loads((run / SUMMARY_JSON).read_text())[
        "client_lag_ms"]["p99"] == pytest.approx(2.98)
