"""After a SIGKILL of the harness, `harness clean` stops the local llama-server it left and
removes its dump folder, from what run.json recorded; a clean run needs nothing."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from harness.cli import main
from tests.live.processes import alive
from tests.live.test_signals_live import _server, _start_run

pytestmark = pytest.mark.live


def test_clean_releases_what_a_killed_run_left(tmp_path: Path) -> None:
    proc, out = _start_run(tmp_path)
    server = _server(out)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    time.sleep(0.5)
    assert alive(server["pid"]), "the server should outlive a SIGKILLed harness"
    res = CliRunner().invoke(main, ["clean", str(out)])
    assert res.exit_code == 0, res.output
    assert "stopped the server process group" in res.output
    assert not alive(server["pid"]) and not Path(server["tmp_dir"]).exists()
    assert json.loads((out / "run.json").read_text())["status"] == "interrupted"
    again = CliRunner().invoke(main, ["clean", str(out)])
    assert again.exit_code == 0 and "nothing left behind" in again.output
