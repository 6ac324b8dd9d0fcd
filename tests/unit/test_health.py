"""Run health: exact checks on hand-built runs (what ran, why trajectories ended, cleanup,
client lag, calibration age), problems first."""

from __future__ import annotations

from typing import Any

from records_factory import Records, default_run

from harness.metrics.frames import build_frames
from harness.metrics.health import end_reasons, problems, run_health
from harness.records.manifest import RunManifest


def _health(recs: Records, lag: dict[str, Any] | None = None,
            **run: Any) -> list[dict[str, str]]:
    manifest = RunManifest.from_dict(default_run(**{"status": "finished", "duration_s": 12.0,
                                                    **run}))
    return run_health(build_frames(recs.frame()), manifest, lag or {"p99": 0.4})


def _by(checks: list[dict[str, str]]) -> dict[str, tuple[str, str]]:
    return {c["check"]: (c["status"], c["detail"]) for c in checks}


def _overflowing(n: int) -> Records:
    b = Records()
    for i in range(n):
        b.agent(f"t{i}", at=float(i)).call().end("failed", "context-overflow")
    return b


def test_a_healthy_run_has_no_problems_and_says_what_ran() -> None:
    b = Records()
    b.agent("a").call().tool(wait=0.5).call().end()
    checks = _health(b, cleanup={"slots_idle": True, "dump_files_left": [], "errors": []},
                     cpu_pinning={"harness": [0], "server": "1"}, server_build="b4500-abc")
    assert problems(checks) == []
    by = _by(checks)
    assert by["run"] == ("ok", "finished in 12.0 s")
    assert by["policy"] == ("ok", "requested keep; the harness decided keep at each pause; on "
                                  "the server: as requested")
    assert by["trajectories"] == ("ok", "1 of 1 completed")
    assert by["cleanup"] == ("ok", "slots idle, no dump files left")
    assert by["client lag"] == ("ok", "P99 0.40 ms late to tool ends")
    assert by["pinning"] == ("ok", "harness on CPUs [0], server on 1")
    assert by["server"] == ("info", "llama.cpp b4500-abc")
    assert by["host"] == ("info", "not recorded")
    assert [c["status"] for c in checks] == sorted(
        (c["status"] for c in checks), key=["fail", "warn", "ok", "info"].index)


def test_every_trajectory_failing_is_a_failure_with_its_reason() -> None:
    checks = _health(_overflowing(23))
    assert checks[0] == {"check": "trajectories", "status": "fail",
                         "detail": "23 of 23 did not complete: failed context-overflow x23"}
    assert end_reasons(build_frames(_overflowing(2).frame())) == [
        ("failed", "context-overflow", 2)]


def test_reasons_are_counted_most_common_first() -> None:
    b = Records()
    b.agent("ok").call().end()
    b.agent("c1").call().tool(wait=30.0, status="abandoned").cancel("tool abandoned")
    b.agent("c2").call().tool(wait=30.0, status="abandoned").cancel("tool abandoned")
    b.agent("f").call(status="error", ttft=None).end("failed", "server error: boom")
    assert end_reasons(build_frames(b.frame())) == [("cancelled", "tool abandoned", 2),
                                                    ("failed", "server error: boom", 1)]
    assert _by(_health(b))["trajectories"] == (
        "warn", "3 of 4 did not complete: cancelled tool abandoned x2; failed server error: "
                "boom x1")


def test_what_the_runtime_could_not_do_is_a_warning() -> None:
    b = Records()
    b.agent("a").call().end()
    by = _by(_health(b, policy="swap", harness_policy="keep",
                     server_policy="swap unsupported: recorded, nothing done",
                     outcome={"completed": 1, "unsupported_actions": 3}))
    assert by["policy"] == ("warn", "requested swap; the harness decided keep at each pause; "
                                    "on the server: swap unsupported: recorded, nothing done")
    assert by["unsupported actions"][0] == "warn" and by["unsupported actions"][1].startswith(
        "3 pause actions")


def test_incomplete_runs_dirty_cleanups_late_clients_and_old_calibrations() -> None:
    b = Records()
    b.agent("a").call().end()
    checks = _health(b, {"p99": 4.25}, status="interrupted", stop_reason="SIGTERM",
                     cleanup={"slots_idle": False, "dump_files_left": ["d.bin"],
                              "errors": ["a: erase failed"], "errors_total": 7},
                     calibration={"measured_at": "2024-12-02T00:00:00Z"},
                     started_at="2025-01-01T00:00:00Z", server_flags=["-np", "4"])
    by = _by(checks)
    assert by["run"] == ("fail", "incomplete (status interrupted): SIGTERM; the figures cover "
                                 "what was measured until it stopped")
    assert by["cleanup"] == ("fail", "slots still busy at the end; 1 dump file(s) left; 7 "
                                     "cleanup error(s), the first: a: erase failed")
    assert by["client lag"][0] == "warn" and by["client lag"][1].startswith("P99 4.25 ms")
    assert by["calibration"] == ("warn", "measured 30.0 days before the run (re-run harness "
                                         "calibrate)")
    assert by["pinning"] == ("warn", "the harness and its local server shared CPUs")
    assert [c["status"] for c in checks[:2]] == ["fail", "fail"]


def test_the_summary_carries_health() -> None:
    from harness.metrics.summary import summarize

    s = summarize(_overflowing(3).frame(), RunManifest.from_dict(default_run()), None)
    assert s["health"][0]["check"] == "trajectories" and s["health"][0]["status"] == "fail"


def test_bystanders_that_ran_out_are_a_warning() -> None:
    b = Records()
    b.agent("a").call().end()
    assert _by(_health(b, bystanders_ended_s=612.4))["bystanders"] == (
        "warn", "the planned bystander traffic ran out 612 s into the run, before the agents "
                "finished: bystander TTFT covers only that span")
