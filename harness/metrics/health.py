"""Run health: whether a run's numbers can be trusted, checked before anyone reads them.

Each check is {check, status, detail}: `fail` (the figures are wrong or incomplete), `warn` (they
hold, with a caveat the reader must know), `ok`, or `info` (context: the host, the server build).
`run_health` lists the problems first. Pure: a function of the frames and run.json.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from harness.metrics.frames import Frames
from harness.records.host import host_key
from harness.records.manifest import RunManifest

FAIL, WARN, OK, INFO = "fail", "warn", "ok", "info"
_ORDER = {FAIL: 0, WARN: 1, OK: 2, INFO: 3}
# The client woke this late to a tool's end (P99): its timers, or a busy loop.
CLIENT_LAG_WARN_MS = 1.0
# Up to this much, the lag is what a millisecond timer gives; beyond it, the client was busy.
TIMER_LAG_MS = 3.0
CALIBRATION_WARN_DAYS = 7.0  # a calibration older than this may no longer fit the server
TOP_REASONS = 5


def lag_cause(p99_ms: float) -> str:
    """Why the client woke late to tool ends, from the P99 of its lag."""
    return ("the event loop's millisecond timers" if p99_ms <= TIMER_LAG_MS
            else "an overloaded client")


def _check(name: str, status: str, detail: str) -> dict[str, str]:
    return {"check": name, "status": status, "detail": detail}


def end_reasons(frames: Frames) -> list[tuple[str, str, int]]:
    """(status, reason, count) of agent trajectories that did not complete, most common first."""
    traj = frames.trajectories
    traj = traj[~traj["bystander"]]
    if "reason" not in traj.columns:
        return []
    status = traj["status"].astype(object)
    bad = traj[status.notna() & (status != "completed")]
    if bad.empty:
        return []
    reason = bad["reason"].astype(object).where(bad["reason"].notna(), "no reason recorded")
    pairs = zip(bad["status"].astype(object), reason, strict=True)
    rows = [(str(s), str(r), n) for (s, r), n in Counter(pairs).items()]
    return sorted(rows, key=lambda x: (-x[2], x[0], x[1]))


def _run_state(run: RunManifest) -> dict[str, str]:
    if run.status in (None, "finished"):
        return _check("run", OK, f"finished in {run.duration_s or 0:.1f} s"
                      if run.status else "no run.json status (written by hand)")
    why = f": {run.stop_reason}" if run.stop_reason else ""
    return _check("run", FAIL, f"incomplete (status {run.status}){why}; the figures cover what "
                               "was measured until it stopped")


def _policy(run: RunManifest) -> list[dict[str, str]]:
    asked = run.policy or "?"
    decided = run.harness_policy or asked
    server = run.server_policy or "as requested"
    unsupported = run.outcome.unsupported_actions if run.outcome else 0
    changed = decided != asked or unsupported > 0
    out = [_check("policy", WARN if changed else OK,
                  f"requested {asked}; the harness decided {decided} at each pause; on the "
                  f"server: {server}")]
    if unsupported:
        out.append(_check("unsupported actions", WARN,
                          f"{unsupported} pause actions this runtime cannot do were recorded "
                          "unsupported (nothing was done; the context stayed where it was)"))
    return out


def _trajectories(frames: Frames) -> dict[str, str]:
    agent = frames.trajectories[~frames.trajectories["bystander"]]
    total = len(agent)
    reasons = end_reasons(frames)
    not_done = sum(n for _, _, n in reasons)
    if not reasons:
        return _check("trajectories", OK if total else WARN,
                      f"{total} of {total} completed" if total else "no agent trajectories")
    top = "; ".join(f"{s} {r} x{n}" for s, r, n in reasons[:TOP_REASONS])
    more = f"; {len(reasons) - TOP_REASONS} more reasons" if len(reasons) > TOP_REASONS else ""
    failed = sum(n for s, _, n in reasons if s == "failed")
    status = FAIL if failed == total else WARN if failed else OK
    return _check("trajectories", status, f"{not_done} of {total} did not complete: {top}{more}")


OUTCOMES = ("completed", "cancelled", "failed", "interrupted")
# Events may be stamped a little after the run's own end (its cleanup); far later is a clock
# or an edit, not a run.
RECORD_SPAN_SLACK = 1.5


def _records(frames: Frames, run: RunManifest) -> dict[str, str] | None:
    """Whether the records agree with themselves and with run.json (a run that has ended):
    every started call ended, and the trajectories' ends counted as run.json counts them.
    Records edited or damaged by hand (a part deleted, rows removed) show here; None while
    the run still runs (or nothing says how it ended)."""
    if run.status in (None, "running") or run.outcome is None:
        return None
    found = []
    open_calls = int(frames.calls["end_ns"].isna().sum())
    if open_calls:
        found.append(f"{open_calls} call(s) started and never ended")
    agent = frames.trajectories[~frames.trajectories["bystander"]]
    counted = agent["status"].astype(object).value_counts()
    for name in OUTCOMES:
        recorded, said = int(counted.get(name, 0)), int(getattr(run.outcome, name))
        if recorded != said:
            found.append(f"{recorded} trajectories ended {name} in the records, run.json "
                         f"counts {said}")
    span_s = frames.t_max_ns / 1e9 if len(frames.calls) else 0.0
    if run.duration_s is not None and span_s > RECORD_SPAN_SLACK * run.duration_s + 10.0:
        found.append(f"events at {span_s:,.0f} s into a run that lasted "
                     f"{run.duration_s:,.0f} s")
    if not found:
        return _check("records", OK, "every started call ended; the trajectories' ends match "
                                     "run.json")
    return _check("records", WARN, "; ".join(found[:4]) + " (records damaged or edited?)")


def _cleanup(run: RunManifest) -> dict[str, str]:
    c = run.cleanup
    if c is None:
        return _check("cleanup", INFO, "not checked (no live server, or the run did not end)")
    if undone := c.problems():
        return _check("cleanup", FAIL, "; ".join(undone))
    if c.remote_dumps_left:
        return _check("cleanup", WARN, f"{len(c.remote_dumps_left)} swap dumps left on the "
                                       "remote server's disk (run.json cleanup.remote_dumps_left)")
    idle = "slots idle" if c.slots_idle else "slots not visible"
    dumps = "no dump files left" if c.dump_files_left == [] else "dump folder not visible"
    return _check("cleanup", OK, f"{idle}, {dumps}")


def _client(run: RunManifest, lag: dict[str, Any]) -> list[dict[str, str]]:
    out = []
    p99 = lag.get("p99")
    if p99 is not None:
        late = p99 > CLIENT_LAG_WARN_MS
        cause = f" ({lag_cause(p99)}: the load was offered late by that much)" if late else ""
        out.append(_check("client lag", WARN if late else OK,
                          f"P99 {p99:.2f} ms late to tool ends{cause}"))
    err = run.instrument_error
    if isinstance(err, dict):
        res = err.get("resume_ms") if isinstance(err.get("resume_ms"), dict) else {}
        mean, top = (res or {}).get("mean"), (res or {}).get("p99")
        figures = (f"resume error mean {mean:+.2f} / P99 {top:+.2f} ms"
                   if isinstance(mean, int | float) and isinstance(top, int | float)
                   else "recorded")
        out.append(_check("instrument error", INFO, f"{figures}, measured "
                                                    f"{err.get('measured_at') or '?'}"))
    else:
        out.append(_check("instrument error", INFO, "not measured (harness selftest, then "
                                                    "--selftest FILE)"))
    return out


def _pinning(run: RunManifest) -> dict[str, str] | None:
    if run.runtime == "simulator":
        return None
    pin = run.cpu_pinning
    if pin is not None:
        return _check("pinning", OK, f"harness on CPUs {pin.harness}, server on {pin.server}")
    if run.server_flags is not None:  # a server the harness started, on the same CPUs
        return _check("pinning", WARN, "the harness and its local server shared CPUs")
    return _check("pinning", INFO, "not pinned (a server the harness did not start)")


def _calibration(run: RunManifest) -> dict[str, str] | None:
    cal = run.calibration
    if not cal:
        return None
    measured = str(cal.get("measured_at") or "")
    try:
        age = (datetime.fromisoformat(str(run.started_at)) -
               datetime.fromisoformat(measured)).total_seconds() / 86400
    except (TypeError, ValueError):
        return _check("calibration", INFO, f"measured {measured or '?'}")
    old = age > CALIBRATION_WARN_DAYS
    return _check("calibration", WARN if old else OK,
                  f"measured {age:.1f} days before the run" + (" (re-run harness calibrate)"
                                                                if old else ""))


def _usage(run: RunManifest) -> dict[str, str] | None:
    """Calls whose usage report the client could not believe (the OpenAI client's count in
    server_extra.impossible_usage): their cached and processed prompt tokens are unknown, and
    the server's other cache figures come from the same counter."""
    bad = (run.server_extra or {}).get("impossible_usage")
    if not isinstance(bad, dict):
        return None
    calls = bad.get("calls")
    if not isinstance(calls, int) or isinstance(calls, bool) or calls <= 0:
        return None
    return _check("usage reports", WARN,
                  f"{calls} calls reported impossible usage (first: {bad.get('first')}); those "
                  "figures are recorded unknown (cached and processed prompt tokens), and the "
                  "server's other cache figures are suspect")


def _damage(damage: Sequence[str]) -> dict[str, str] | None:
    if not damage:
        return None
    return _check("readable", FAIL, "the results directory is damaged; these figures cover "
                                    "what could be read: " + "; ".join(damage))


def run_health(frames: Frames, run: RunManifest, lag: dict[str, Any],
               damage: Sequence[str] = ()) -> list[dict[str, str]]:
    """Every check of one run, problems first (fail, then warn), then ok and info; `damage`:
    what could not be read of the results directory and was left out."""
    checks = [c for c in (_damage(damage),) if c is not None]
    checks += [_run_state(run), *_policy(run), _trajectories(frames), _cleanup(run),
               *_client(run, lag)]
    checks += [c for c in (_records(frames, run), _pinning(run), _calibration(run), _usage(run))
               if c is not None]
    if run.bystanders_ended_s is not None:
        checks.append(_check("bystanders", WARN, f"the planned bystander traffic ran out "
                                                 f"{run.bystanders_ended_s:.0f} s into the run, "
                                                 "before the agents finished: bystander TTFT "
                                                 "covers only that span"))
    checks.append(_check("server", INFO, f"{run.runtime or '?'} "
                                         f"{run.server_build or run.server_version or '?'}"
                                         + (f", model {run.server_model}" if run.server_model
                                            else "")))
    checks.append(_check("host", INFO, host_key(run.host) or "not recorded"))
    return sorted(checks, key=lambda c: _ORDER[c["status"]])


def problems(health: list[dict[str, str]]) -> list[dict[str, str]]:
    """The checks that failed or warn."""
    return [c for c in health if c["status"] in (FAIL, WARN)]
