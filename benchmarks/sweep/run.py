"""Sweep family `run`: `harness run`, `bench`, `calibrate` and `capacity` given malformed flags,
no server or a malformed URL, and stopped by SIGINT or SIGTERM at every moment of a run, with
one load generator and with two (Ray): exit 130/143, run.json `interrupted` with counts equal
to the records', and nothing of Ray or the run left behind. The server is the project's stub
(harness.selftest.stub), a llama.cpp-like server of known delays, started once for the sweep."""

from __future__ import annotations

import atexit
import json
import signal
import threading
import time
from pathlib import Path
from typing import Any

from harness.adapters.launchers.process import free_port
from harness.selftest.measure import Stub, start_stub
from sweep.core import ROOT, Case, Result, expect

TRACE = str(ROOT / "traces" / "bench-small.parquet")
NOWHERE = "http://127.0.0.1:9"
_stub: dict[int, Stub] = {}
_lock = threading.Lock()


def _ensure_stub(port: int) -> None:
    """The stub on `port`, started by the first case that needs it, stopped at exit."""
    with _lock:
        if port not in _stub:
            _stub[port] = start_stub(50.0, port=port, slots=8)
            atexit.register(_stub[port].stop)


def _with_stub(port: int) -> Any:
    def setup(_work: Path) -> None:
        _ensure_stub(port)
    return setup


def _ray_processes() -> set[int]:
    found = set()
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            cmd = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (cmdline.parent / "stat").read_text().split()[2]
        except (OSError, IndexError):
            continue
        if (cmd.startswith("ray::") or "/ray/" in cmd) and state != "Z":
            found.add(int(cmdline.parent.name))
    return found


def _stopped_cleanly(res: Result) -> str | None:
    """run.json says how the run ended, its counts are the records', nothing of Ray is left."""
    from harness.records.store import read_records

    run_json = res.work / "o" / "run.json"
    if not run_json.is_file():  # a run that never started may leave its folder, empty
        out = res.work / "o"
        return None if res.rc != 0 and not (out.exists() and any(out.iterdir())) else (
            "no run.json")
    run = json.loads(run_json.read_text())
    # A stop signal after the run ended finds it finished; before, it must be interrupted.
    want = {0: {"finished"}, 130: {"interrupted", "finished"},
            143: {"interrupted", "finished"}}.get(res.rc, {"interrupted"})
    if run.get("status") not in want:
        return f"run.json status {run.get('status')!r} on exit {res.rc}"
    try:
        ends = int((read_records(res.work / "o")["event"] == "trajectory_end").sum())
    except Exception as exc:  # unreadable records are this case's failure
        return f"records unreadable: {exc}"
    outcome = run.get("outcome") or {}
    if sum(outcome.values()) != ends:
        return f"run.json counts {sum(outcome.values())} trajectories, the records {ends}"
    deadline = time.monotonic() + 15
    while _ray_processes() and time.monotonic() < deadline:
        time.sleep(0.2)
    if _ray_processes():
        return "Ray processes left running"
    left = list(Path("/tmp").glob("harness-ray-*")) + list(res.work.glob(".tmp/harness-ray-*"))
    return f"Ray folder left: {left[0]}" if left else None


# (flag, value): each refused before any server is reached (exit 2, naming the flag).
BAD_RUN_FLAGS: list[tuple[str, str]] = [
    *[("--concurrency", v) for v in ("0", "-1", "x")],
    *[("--rate", v) for v in ("0", "-1", "nan", "inf", "1e-300")],
    *[("--time-scale", v) for v in ("0", "-1", "nan", "inf")],
    *[("--token-scale", v) for v in ("0", "-1", "nan")],
    *[("--seed", v) for v in ("-1", "x")],
    *[("--slots", v) for v in ("0", "-1")],
    *[("--ctx-per-slot", v) for v in ("0", "-1")],
    *[("--threads", v) for v in ("0", "-1")],
    *[("--scrape-interval", v) for v in ("0", "-1", "nan")],
    *[("--duration", v) for v in ("0", "-1", "nan", "inf")],
    *[("--repeats", v) for v in ("0", "-1")],
    *[("--shard", v) for v in ("3/2", "0/0", "x", "1/0", "-1/2")],
    *[("--workers", v) for v in ("0", "-1", "x")],
    *[("--connect-timeout", v) for v in ("0", "-1", "nan")],
    *[("--first-token-timeout", v) for v in ("0", "-1", "nan")],
    *[("--stall-timeout", v) for v in ("0", "-1", "nan")],
    *[("--request-timeout", v) for v in ("0", "-1", "nan")],
    *[("--header", v) for v in ("no-colon", ": empty-name", "X-A: b\r\nX-B: c")],
    *[("--inject", v) for v in ("no-such-profile", "missing.toml")],
    *[("--policy-arg", v) for v in ("ttl_s=5", "novalue")],
    *[("--pin-expiry-s", v) for v in ("-1", "nan")],
    *[("--host-cap-bytes", v) for v in ("-1",)],
    *[("--selftest", v) for v in ("missing.json",)],
    *[("--calibration", v) for v in ("no-such-preset",)],
    *[("--ray-address", v) for v in ("not an address",)],
]
BAD_URLS = ("ftp://127.0.0.1:9", "http://", "127.0.0.1:9", "http://[::1", "http://h:99999",
            "http://127.0.0.1:9/v1 x", "")
BAD_BENCH: list[tuple[str, ...]] = [
    ("--policies", ""), ("--policies", "keep,,swap"), ("--policies", "hoard"),
    ("--policies", "keep,keep"), ("--policies", ","), ("--repeats", "0"),
    ("--concurrency", "0"), ("--slo", "p95<"), ("--slo", "nonsense"),
    ("--capacity-budget", "x"), ("--policy-arg", "hoard.ttl_s=5"),
]


def flag_cases() -> list[Case]:
    base = ("run", "--url", NOWHERE, "--trace", TRACE, "--out", "o")
    cases = []
    for flag, value in BAD_RUN_FLAGS:
        policy = ("--policy", "ttl") if flag == "--policy-arg" and value == "novalue" else (
            "--policy", "keep")
        cases.append(Case("run", f"run{flag}={value or 'empty'}",
                          (*base, *policy, flag, value)))
    for url in BAD_URLS:
        cases.append(Case("run", f"run-url-{url or 'empty'}",
                          ("run", "--url", url, "--trace", TRACE, "--policy", "keep",
                           "--out", "o"), must_say=("--url",)))
    for args in BAD_BENCH:
        cases.append(Case("run", f"bench{'='.join(args)}",
                          ("bench", "--url", NOWHERE, "--trace", TRACE, "--out", "o", *args)))
    cases += [
        Case("run", "run-no-server", (*base, "--policy", "keep"), expect=expect(3),
             check=_stopped_cleanly, timeout_s=60),
        Case("run", "bench-no-server", ("bench", "--url", NOWHERE, "--trace", TRACE,
                                        "--policies", "keep", "--out", "o"), expect=expect(3),
             timeout_s=60),
        Case("run", "calibrate-no-server", ("calibrate", "--url", NOWHERE, "--out", "c.json"),
             expect=expect(3), timeout_s=60),
        Case("run", "run-trace-missing", ("run", "--url", NOWHERE, "--trace", "nope.parquet",
                                          "--policy", "keep", "--out", "o")),
        Case("run", "run-out-a-file", ("run", "--url", NOWHERE, "--trace", TRACE, "--policy",
                                       "keep", "--out", "f"),
             setup=lambda w: (w / "f").write_text("x")),
        Case("run", "run-policy-unknown", ("run", "--url", NOWHERE, "--trace", TRACE,
                                           "--policy", "hoard", "--out", "o")),
        Case("run", "clean-nothing", ("clean", "o"),
             setup=lambda w: (w / "o").mkdir()),
    ]
    return cases


def signal_cases(port: int) -> list[Case]:
    url = f"http://127.0.0.1:{port}"
    one = ("run", "--url", url, "--trace", TRACE, "--policy", "keep", "--concurrency", "4",
           "--slots", "8", "--time-scale", "0.2", "--out", "o")
    cases = [Case("run", "stub-completes", one, expect=expect(0), check=_stopped_cleanly,
                  setup=_with_stub(port), timeout_s=300, solo=True)]
    one = tuple(v if v != "0.2" else "1" for v in one)  # a run the signals find running
    for sig, code in ((signal.SIGTERM, 143), (signal.SIGINT, 130)):
        for after in (0.3, 1.0, 2.0, 3.0, 5.0):
            cases.append(Case("run", f"stub-{sig.name}-after-{after:g}s", one,
                              expect=expect(code), check=_stopped_cleanly,
                              signal_after_s=(sig, after), setup=_with_stub(port),
                              timeout_s=120, solo=True, one_error_line=False))
    ray = (*one[:-2], "--workers", "2", "--out", "o")
    for sig, code, after in ((signal.SIGTERM, 143, 0.5), (signal.SIGTERM, 143, 2.0),
                             (signal.SIGTERM, 143, 4.0), (signal.SIGTERM, 143, 8.0),
                             (signal.SIGINT, 130, 3.0), (signal.SIGINT, 130, 6.0)):
        cases.append(Case("run", f"ray-{sig.name}-after-{after:g}s", ray, expect=expect(code),
                          check=_stopped_cleanly, signal_after_s=(sig, after),
                          setup=_with_stub(port), timeout_s=240, solo=True,
                          one_error_line=False))
    cases.append(Case("run", "ray-completes", ray, expect=expect(0), check=_stopped_cleanly,
                      setup=_with_stub(port), timeout_s=400, solo=True))
    return cases


def cases() -> list[Case]:
    return [*flag_cases(), *signal_cases(free_port())]
