"""What every local server launcher shares: waiting for health, and reading its log's tail."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from harness.errors import ServerError


def log_tail(path: Path, n: int = 15, keep: Callable[[str], bool] = lambda _: True) -> str:
    """The last `n` lines of a server log that `keep` accepts; '(no log)' if unreadable."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join([ln for ln in lines if keep(ln)][-n:])


def wait_healthy(proc: subprocess.Popen[bytes], url: str, name: str, timeout_s: float,
                 tail: Callable[[], str], poll_s: float = 0.5, probe_timeout_s: float = 2.0
                 ) -> None:
    """Poll `url` until HTTP 200; ServerError with the log's tail if the process exits first
    or `timeout_s` passes."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ServerError(f"{name} exited with code {proc.returncode} during start-up; "
                              f"last log lines:\n{tail()}")
        try:
            with urllib.request.urlopen(url, timeout=probe_timeout_s) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(poll_s)
    raise ServerError(f"{name} not healthy after {timeout_s:.0f}s; last log lines:\n{tail()}")


def group_alive(pgid: int | None) -> bool:
    """Whether any process of the process group `pgid` is still running."""
    if pgid is None:
        return False
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def stop_group(proc: subprocess.Popen[bytes], term_wait_s: float = 20.0,
               linger_s: float = 5.0) -> None:
    """SIGTERM the process group `proc` leads (started with start_new_session), wait for it,
    and SIGKILL whatever of the group is left after `linger_s` more seconds."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=term_wait_s)
    deadline = time.monotonic() + linger_s
    while group_alive(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if group_alive(proc.pid):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
