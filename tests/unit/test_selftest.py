"""`harness selftest`: its statistics, its file and how run/bench read it, the report's
instrument-error table, and one real run against the stub that must leave no stub behind."""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from report_fixtures import write_run

from harness.cli import main
from harness.errors import InputError, ServerError
from harness.records.manifest import RunManifest, read_manifest
from harness.report.render import render_report
from harness.selftest import measure
from harness.selftest import run as selftest_cli
from harness.selftest.measure import Stub, error_stats
from harness.selftest.result import SELFTEST_VERSION, read_selftest

STATS = {"n": 4, "mean": 0.81, "p50": 0.5, "p95": 2.0, "p99": 7.25}


def selftest_data(**over: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "selftest_version": SELFTEST_VERSION, "measured_at": "2025-01-01T00:00:00+00:00",
        "host": {"name": "h", "cpu_model": None, "cpu_count": 2}, "agents": 8,
        "stub_ttft_ms": 50.0, "calls": 40, "event_loop": "asyncio",
        "pinning": {"pinned": False},
        "instrument_error": {"ttft_ms": dict(STATS), "resume_ms": {**STATS, "mean": 3.5},
                             "client_lag_ms": {**STATS, "p99": 1.5},
                             "reference_ttft_ms": dict(STATS), "calls_per_s": 100.0}}
    data.update(over)
    return data


def write_selftest_file(path: Path, data: Any) -> Path:
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def test_error_stats_exact_values() -> None:
    s = error_stats(np.array([4.0, 1.0, np.nan, 3.0, 2.0, np.inf]))
    assert s["n"] == 4 and s["mean"] == 2.5 and s["p50"] == 2.5
    assert s["p95"] == pytest.approx(3.85) and s["p99"] == pytest.approx(3.97)
    assert error_stats(np.array([])) == {"n": 0, "mean": None, "p50": None, "p95": None,
                                         "p99": None}


@pytest.mark.parametrize("content, says", [
    ("{not json", "not valid JSON"),
    ([1, 2], "expected a JSON object"),
    (selftest_data(selftest_version=2), "selftest_version 2"),
    ({k: v for k, v in selftest_data().items() if k != "instrument_error"},
     "no 'instrument_error'"),
    (selftest_data(agents=0), "agents must be a positive integer"),
    (selftest_data(instrument_error={**selftest_data()["instrument_error"],
                                     "resume_ms": {"mean": 1.0}}), "resume_ms lacks 'p50'"),
    (selftest_data(instrument_error={**selftest_data()["instrument_error"],
                                     "ttft_ms": {**STATS, "p99": "slow"}}), "ttft_ms.p99"),
])
def test_invalid_selftest_files_are_one_line_errors(tmp_path: Path, content: Any,
                                                    says: str) -> None:
    path = write_selftest_file(tmp_path / "s.json", content)
    with pytest.raises(InputError) as info:
        read_selftest(path)
    assert says in str(info.value) and "\n" not in str(info.value)


def test_run_and_bench_refuse_a_bad_selftest_with_exit_2(tmp_path: Path) -> None:
    missing = tmp_path / "none.json"
    for args in (["run", "--trace", str(tmp_path / "t.parquet"), "--policy", "keep",
                  "--out", str(tmp_path / "o"), "--selftest", str(missing)],
                 ["bench", "--out", str(tmp_path / "b"), "--selftest", str(missing)]):
        res = CliRunner().invoke(main, args)
        assert res.exit_code == 2, res.output
        assert res.stderr.count("\n") == 1 and "no such file" in res.stderr
        assert "harness selftest" in res.stderr
    wrong = write_selftest_file(tmp_path / "v0.json", selftest_data(selftest_version=0))
    res = CliRunner().invoke(main, ["run", "--trace", "t", "--policy", "keep", "--out",
                                    str(tmp_path / "o"), "--selftest", str(wrong)])
    assert res.exit_code == 2 and "selftest_version 0" in res.stderr
    assert not (tmp_path / "o").exists()  # refused before anything ran


def test_manifest_round_trip_with_instrument_error(tmp_path: Path) -> None:
    err = read_selftest(write_selftest_file(tmp_path / "s.json", selftest_data()))
    assert err["ttft_ms"] == STATS and err["agents"] == 8
    assert err["measured_at"] == "2025-01-01T00:00:00+00:00" and err["host"]["name"] == "h"
    run = RunManifest(run_id="r", instrument_error=err)
    run.write(tmp_path)
    assert read_manifest(tmp_path) == run
    old = {k: v for k, v in run.to_dict().items() if k != "instrument_error"}
    (tmp_path / "run.json").write_text(json.dumps(old))
    assert read_manifest(tmp_path).instrument_error is None  # files written before it


def test_report_shows_the_instrument_error_or_says_it_is_missing(tmp_path: Path) -> None:
    err = read_selftest(write_selftest_file(tmp_path / "s.json", selftest_data()))
    measured = write_run(tmp_path / "keep", "keep", n_traj=3, tools=2,
                         run={"instrument_error": err})
    plain = write_run(tmp_path / "swap", "swap", n_traj=3, tools=2)
    doc = render_report([measured])
    assert "id='instrument'" in doc and "not measured" not in doc
    for cell in ("+0.81", "+7.25", "+3.50", "+1.50", "2025-01-01T00:00:00+00:00"):
        assert f"<td>{cell}</td>" in doc
    assert "instrument error not measured (harness selftest)" in render_report([plain])
    both = render_report([measured, plain])
    assert "+0.81" in both and "llama.cpp/swap: instrument error not measured" in both


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[Stub]:
    """Every stub the selftest command starts."""
    stubs: list[Stub] = []
    real = selftest_cli.start_stub

    def spy(*args: Any, **kw: Any) -> Stub:
        stubs.append(real(*args, **kw))
        return stubs[-1]

    monkeypatch.setattr(selftest_cli, "start_stub", spy)
    return stubs


def assert_gone(stubs: list[Stub]) -> None:
    assert stubs
    for stub in stubs:
        assert stub.proc.returncode is not None
        with pytest.raises(ProcessLookupError):
            os.kill(stub.proc.pid, 0)  # killed and reaped


def test_selftest_end_to_end_writes_the_file_and_stops_the_stub(
        tmp_path: Path, started: list[Stub]) -> None:
    cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    out = tmp_path / "selftest.json"
    res = CliRunner().invoke(main, ["selftest", "--agents", "2", "--calls", "5", "--ttft-ms",
                                    "5", "--out", str(out), "--keep-results",
                                    str(tmp_path / "kept")])
    assert res.exit_code == 0, res.output
    assert_gone(started)
    data = json.loads(out.read_text())
    assert {"selftest_version", "measured_at", "host", "agents", "stub_ttft_ms", "calls",
            "event_loop", "pinning", "instrument_error"} <= set(data)
    assert (data["agents"], data["calls"], data["stub_ttft_ms"]) == (2, 5, 5.0)
    err = data["instrument_error"]
    for key in ("ttft_ms", "resume_ms", "client_lag_ms", "reference_ttft_ms"):
        assert {"mean", "p50", "p95", "p99"} <= set(err[key])
    assert err["ttft_ms"]["n"] == 10 and err["reference_ttft_ms"]["n"] == 10
    assert err["resume_ms"]["n"] == 8 and err["client_lag_ms"]["n"] == 8  # 4 pauses per agent
    assert err["calls_per_s"] > 0
    if data["pinning"]["pinned"]:
        assert set(data["pinning"]["stub_cpus"]).isdisjoint(data["pinning"]["harness_cpus"])
    assert cpus is None or os.sched_getaffinity(0) == cpus  # the caller's CPUs given back
    assert read_selftest(out)["agents"] == 2
    assert (tmp_path / "kept" / "run.json").is_file()
    assert "TTFT error" in res.stdout and "client lag" in res.stdout


def test_the_stub_is_stopped_when_the_replay_fails(
        tmp_path: Path, started: list[Stub], monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*args: Any, **kw: Any) -> None:
        raise ServerError("the replay failed")

    monkeypatch.setattr(selftest_cli, "harness_replay", boom)
    res = CliRunner().invoke(main, ["selftest", "--agents", "1", "--calls", "1", "--ttft-ms",
                                    "0", "--out", str(tmp_path / "s.json")])
    assert res.exit_code == 3 and res.stderr == "error: the replay failed\n"
    assert_gone(started)
    assert not (tmp_path / "s.json").exists()

    def interrupt(*args: Any, **kw: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(selftest_cli, "harness_replay", interrupt)
    with pytest.raises(KeyboardInterrupt):
        selftest_cli.run_selftest(selftest_cli.SelftestConfig(1, 0.0, 1, 0.0,
                                                              out=tmp_path / "s.json"))
    assert len(started) == 2
    assert_gone(started)


def test_a_port_in_use_and_a_stub_that_dies_are_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        res = CliRunner().invoke(main, ["selftest", "--port", str(port), "--out",
                                        str(tmp_path / "s.json")])
    assert res.exit_code == 2 and res.stderr.count("\n") == 1
    assert f"port {port} is in use" in res.stderr
    monkeypatch.setattr(measure, "_stub_command", lambda *a: [
        sys.executable, "-c", "import sys; sys.exit('cannot listen')"])
    with pytest.raises(ServerError, match="the stub exited at start .*cannot listen"):
        measure.start_stub(5.0)
    res = CliRunner().invoke(main, ["selftest", "--agents", "0"])
    assert res.exit_code == 2  # click's own usage error
