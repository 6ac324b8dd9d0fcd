"""The hardening sweep's cases and how one is judged.

A case is one use of the product as a careless or hostile user would make it: a `harness`
command line with crafted inputs (`Case.argv`), or a scripted exchange with a running
process (`Case.driver`: the recording proxy fed malformed requests, a run sent a signal).
Every case is judged by the same rules the product promises, besides its own check:

- the exit code is the documented one (`expect`): 0, 2 for bad input, 3 for a server
  problem, 130 for SIGINT, 143 for SIGTERM;
- no traceback anywhere in what the command printed, and on exit 2 or 3 exactly one `error:`
  line, which names what is wrong (`must_say`);
- nothing left running: every case starts its command in a session of its own, and any
  process still in it after the command ended is a failure (then killed);
- nothing left behind in its TMPDIR, a fresh folder per case;
- the case's own check (`check`), given what the command printed and its work folder.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HARNESS = str(Path(sys.executable).with_name("harness"))


@dataclass(frozen=True)
class Result:
    """What one command did: its exit code, output and the folder it ran in."""

    rc: int
    stdout: str
    stderr: str
    work: Path
    elapsed_s: float
    peak_kib: int = 0  # the command's peak resident memory (0: not measured)


# A check returns None when the case held, else what went wrong (one line).
Check = Callable[[Result], str | None]
# A driver performs a whole case itself (for exchanges a command line cannot express) in its
# work folder, with the session's TMPDIR in `env`; it returns None or what went wrong.
Driver = Callable[[Path, dict[str, str]], str | None]


@dataclass(frozen=True)
class Case:
    """One sweep case (see the module docstring)."""

    family: str
    name: str
    argv: tuple[str, ...] = ()
    expect: frozenset[int] = frozenset({2})
    must_say: tuple[str, ...] = ()
    check: Check | None = None
    driver: Driver | None = None
    setup: Callable[[Path], None] | None = None  # writes the case's inputs into its folder
    signal_after_s: tuple[int, float] | None = None  # (signal, seconds after start)
    max_rss_kib: int | None = None  # a bound on the command's peak resident memory
    timeout_s: float = 120.0
    solo: bool = False  # run alone: timing-sensitive, or heavy on the machine
    one_error_line: bool = True

    @property
    def key(self) -> str:
        return f"{self.family}/{self.name}"


def expect(*codes: int) -> frozenset[int]:
    return frozenset(codes)


def _left_running(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _run_command(case: Case, work: Path, env: dict[str, str]) -> tuple[Result, list[str]]:
    problems: list[str] = []
    t0 = time.monotonic()
    out_path, err_path = work / ".stdout", work / ".stderr"
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        proc = subprocess.Popen([HARNESS, *case.argv], cwd=work, env=env, stdout=out,
                                stderr=err, stdin=subprocess.DEVNULL, start_new_session=True)
        sent = False
        deadline = t0 + case.timeout_s
        peak_kib = 0
        while time.monotonic() < deadline:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)  # its peak memory too
            if pid:
                proc.returncode = os.waitstatus_to_exitcode(status)
                peak_kib = usage.ru_maxrss
                break
            if not sent and case.signal_after_s is not None:
                sig, after = case.signal_after_s
                if time.monotonic() - t0 >= after:
                    proc.send_signal(sig)
                    sent = True
            time.sleep(0.02)
        if proc.returncode is None:
            problems.append(f"still running after {case.timeout_s:g} s")
            _kill_group(proc.pid)
            proc.wait()
    # A process a signal ended is reported by a shell as 128 + the signal, the code the
    # product promises for a stop signal: the same to its users.
    rc = 128 - proc.returncode if proc.returncode < 0 else proc.returncode
    time.sleep(0.05)  # children that exit with their parent get a moment to go
    if _left_running(proc.pid):
        problems.append("processes of its session still running after it ended")
        _kill_group(proc.pid)
    res = Result(rc, out_path.read_text(errors="replace"), err_path.read_text(errors="replace"),
                 work, time.monotonic() - t0, peak_kib)
    out_path.unlink()
    err_path.unlink()
    return res, problems


def judge(case: Case, res: Result) -> list[str]:
    """The product's promises (the module docstring) for one finished command."""
    problems = []
    if res.rc not in case.expect:
        tail = (res.stderr.strip().splitlines() or [""])[-1][:200]
        problems.append(f"exit {res.rc}, expected {sorted(case.expect)} ({tail!r})")
    text = res.stdout + res.stderr
    if "Traceback" in text:
        problems.append("a traceback was printed")
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    if res.rc in (2, 3) and case.one_error_line and len(errors) != 1:
        problems.append(f"{len(errors)} 'error:' lines on exit {res.rc}")
    for word in case.must_say:
        if word not in res.stderr:
            problems.append(f"stderr does not name {word!r}")
    if case.max_rss_kib is not None and res.peak_kib > case.max_rss_kib:
        problems.append(f"peak RSS {res.peak_kib >> 10} MiB, over {case.max_rss_kib >> 10} MiB")
    if case.check is not None:
        msg = case.check(res)
        if msg:
            problems.append(msg)
    return problems


def run_case(case: Case, base: Path) -> list[str]:
    """Runs one case in a fresh folder under `base`; returns what went wrong (empty: held)."""
    work = base / case.family / case.name.replace("/", "_")
    tmp = work / ".tmp"
    tmp.mkdir(parents=True)
    env = {**os.environ, "TMPDIR": str(tmp), "PYTHONUNBUFFERED": "1"}
    env.pop("PYTEST_CURRENT_TEST", None)
    try:
        if case.setup is not None:
            case.setup(work)
        if case.driver is not None:
            msg = case.driver(work, env)
            problems = [msg] if msg else []
        else:
            res, problems = _run_command(case, work, env)
            problems += judge(case, res)
    except Exception as exc:  # the sweep's own failure is reported as the case's, never lost
        problems = [f"the sweep itself failed: {type(exc).__name__}: {exc}"]
    left = sorted(p.name for p in tmp.iterdir()) if tmp.is_dir() else []
    if left:
        problems.append(f"left in TMPDIR: {', '.join(left[:5])}")
    if not problems:
        shutil.rmtree(work, ignore_errors=True)
    return problems


@dataclass
class Tally:
    """Cases held and failed, per family."""

    held: dict[str, int] = field(default_factory=dict)
    failed: dict[str, list[tuple[str, list[str]]]] = field(default_factory=dict)

    def add(self, case: Case, problems: Sequence[str]) -> None:
        self.held.setdefault(case.family, 0)
        self.failed.setdefault(case.family, [])
        if problems:
            self.failed[case.family].append((case.name, list(problems)))
        else:
            self.held[case.family] += 1
