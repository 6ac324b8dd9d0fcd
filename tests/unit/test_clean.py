"""`harness clean` never touches a process that is not the run's server."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from harness.adapters.launchers.process import group_alive, reap_leftover
from harness.records.manifest import RUN_JSON_RESERVE, RunManifest
from harness.replay.clean import clean_dir


def test_a_process_that_does_not_name_the_folder_is_left_alone() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="harness-slots-"))
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"],
                             start_new_session=True)
    try:
        done = reap_leftover({"pid": other.pid, "pgid": other.pid, "tmp_dir": str(tmp)})
        assert group_alive(other.pid) and "left process group" in done[0]
        assert not tmp.exists() and done[-1] == f"removed {tmp}"
    finally:
        other.kill()
        other.wait()


def test_a_folder_that_is_not_the_harness_s_is_never_removed(tmp_path: Path) -> None:
    assert reap_leftover({"pid": None, "pgid": None, "tmp_dir": str(tmp_path)}) == []
    assert tmp_path.exists()


def test_the_run_s_server_is_stopped() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="harness-slots-"))
    server = subprocess.Popen([sys.executable, "-c", "import time, sys; time.sleep(30)",
                               str(tmp)], start_new_session=True)
    try:
        done = reap_leftover({"pid": server.pid, "pgid": server.pid, "tmp_dir": str(tmp)})
        server.wait(timeout=5)
        assert done == [f"stopped the server process group {server.pid}", f"removed {tmp}"]
    finally:
        if server.poll() is None:
            server.kill()


def test_the_disk_a_killed_run_set_aside_is_freed(tmp_path: Path) -> None:
    RunManifest(status="finished").write(tmp_path)
    (tmp_path / RUN_JSON_RESERVE).write_bytes(bytes(1024))
    assert clean_dir(tmp_path) == [f"{tmp_path / RUN_JSON_RESERVE} (disk set aside for run.json)"]
    assert not (tmp_path / RUN_JSON_RESERVE).exists()
    assert clean_dir(tmp_path) == []
