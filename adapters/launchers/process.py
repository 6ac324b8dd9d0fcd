"""What every local server launcher shares: waiting for health, and reading its log's tail."""

from __future__ import annotations

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
