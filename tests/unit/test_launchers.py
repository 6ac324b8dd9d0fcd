"""The launchers' shared start-up wait: a server that dies or never answers is a clear error."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from harness.adapters.launchers.process import free_port, log_tail, wait_healthy
from harness.errors import ServerError


def test_a_server_that_exits_is_reported_with_its_log(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text("loading\nfatal: no model\n")
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    proc.wait()
    with pytest.raises(ServerError, match=r"(?s)demo exited with code 3.*fatal: no model"):
        wait_healthy(proc, f"http://127.0.0.1:{free_port()}/health", "demo", 5.0,
                     lambda: log_tail(log))


def never_healthy(port: int) -> None:
    """wait_healthy on `port` for a process that runs on: a clear ServerError after 1 s."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        with pytest.raises(ServerError, match="demo not healthy after 1s"):
            wait_healthy(proc, f"http://127.0.0.1:{port}/health", "demo", 1.0,
                         lambda: "(no log)", poll_s=0.1)
    finally:
        proc.kill()
        proc.wait()


def test_a_server_that_never_answers_times_out() -> None:
    never_healthy(free_port())


def test_log_tail_filters_and_survives_a_missing_file(tmp_path: Path) -> None:
    log = tmp_path / "l.log"
    log.write_text("a\nnoise\nb\nc\n")
    assert log_tail(log, 2, lambda ln: ln != "noise") == "b\nc"
    assert log_tail(tmp_path / "missing.log") == "(no log)"


def test_llama_server_flags(tmp_path: Path) -> None:
    """What the local llama-server is started with: loopback only, slots x context, no
    host-RAM prompt cache, private dump directory, and any extra flags last."""
    from harness.adapters.launchers.llamacpp_server import LlamaServerConfig, LocalLlamaServer

    cfg = LlamaServerConfig(model=tmp_path / "m.gguf", slots=3, ctx_per_slot=2048,
                            extra_args=["-ngl", "99"])
    server = LocalLlamaServer(cfg, tmp_path / "log", binary=tmp_path / "llama-server")
    try:
        f = server.flags
        assert f[f.index("--host") + 1] == "127.0.0.1"
        assert f[f.index("-c") + 1] == str(3 * 2048) and f[f.index("-np") + 1] == "3"
        assert f[f.index("--cache-ram") + 1] == "0" and "--metrics" in f
        assert f[f.index("--slot-save-path") + 1] == str(server.dump_dir)
        assert (server.dump_dir.stat().st_mode & 0o777) == 0o700
        assert f[-2:] == ["-ngl", "99"]
        # one HTTP thread per slot + 2 at least, more when the client pools more connections
        assert f[f.index("--threads-http") + 1] == "5"
    finally:
        server.stop()
    def flags_of(cfg: LlamaServerConfig) -> list[str]:
        s = LocalLlamaServer(cfg, tmp_path / "log", binary=tmp_path / "llama-server")
        s.stop()  # removes its private folder
        return s.flags

    many = flags_of(LlamaServerConfig(model=tmp_path / "m.gguf", slots=3,
                                      client_connections=40))
    assert many[many.index("--threads-http") + 1] == "42"
    own = flags_of(LlamaServerConfig(model=tmp_path / "m.gguf",
                                     extra_args=["--threads-http", "9"]))
    assert own.count("--threads-http") == 1 and own[-2:] == ["--threads-http", "9"]
    assert not server.dump_dir.exists()


def test_stop_group_kills_a_server_that_ignores_sigterm() -> None:
    import time

    from harness.adapters.launchers.process import group_alive, stop_group

    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    time.sleep(0.5)
    assert group_alive(proc.pid)
    t0 = time.monotonic()
    stop_group(proc, term_wait_s=0.5, linger_s=0.5)
    assert proc.returncode == -9 and not group_alive(proc.pid)
    assert time.monotonic() - t0 < 5


def test_a_forced_exit_kills_live_groups_and_removes_their_folders(tmp_path: Path) -> None:
    from harness.adapters.launchers import process

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                            start_new_session=True)
    folder = tmp_path / "harness-slots-x"
    folder.mkdir()
    (folder / "dump.bin").write_bytes(b"x")
    process.LIVE_GROUPS.add(proc.pid)
    process.LIVE_DIRS[proc.pid] = folder
    process.kill_live_groups()
    assert proc.wait(timeout=10) == -9
    assert not folder.exists()
    assert proc.pid not in process.LIVE_GROUPS and proc.pid not in process.LIVE_DIRS


def test_a_port_that_answers_something_other_than_http_is_not_healthy() -> None:
    # e.g. another process's ZMQ socket on the port the server was to take: its greeting is no
    # HTTP status line (http.client.BadStatusLine), which must read as "not healthy", never
    # escape as a traceback
    srv = socket.create_server(("127.0.0.1", 0))
    port = srv.getsockname()[1]

    def greet() -> None:
        srv.settimeout(3.0)
        with contextlib.suppress(OSError):
            while True:
                conn, _ = srv.accept()
                with conn:
                    conn.sendall(b"\xff\x00\x00\x00\x00\x00\x00\x00\x01\x7f")

    threading.Thread(target=greet, daemon=True).start()
    try:
        never_healthy(port)
    finally:
        srv.close()
