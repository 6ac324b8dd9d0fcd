"""The launchers' shared start-up wait: a server that dies or never answers is a clear error."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from harness.adapters.launchers.llamacpp_server import free_port
from harness.adapters.launchers.process import log_tail, wait_healthy
from harness.errors import ServerError


def test_a_server_that_exits_is_reported_with_its_log(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text("loading\nfatal: no model\n")
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    proc.wait()
    with pytest.raises(ServerError, match=r"(?s)demo exited with code 3.*fatal: no model"):
        wait_healthy(proc, f"http://127.0.0.1:{free_port()}/health", "demo", 5.0,
                     lambda: log_tail(log))


def test_a_server_that_never_answers_times_out(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        with pytest.raises(ServerError, match="demo not healthy after 1s"):
            wait_healthy(proc, f"http://127.0.0.1:{free_port()}/health", "demo", 1.0,
                         lambda: "(no log)", poll_s=0.1)
    finally:
        proc.kill()
        proc.wait()


def test_log_tail_filters_and_survives_a_missing_file(tmp_path: Path) -> None:
    log = tmp_path / "l.log"
    log.write_text("a\nnoise\nb\nc\n")
    assert log_tail(log, 2, lambda ln: ln != "noise") == "b\nc"
    assert log_tail(tmp_path / "missing.log") == "(no log)"
