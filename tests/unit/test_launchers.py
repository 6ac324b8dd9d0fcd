"""The launchers' shared start-up wait: a server that dies or never answers is a clear error."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from harness.adapters.launchers.process import (
    free_port,
    log_tail,
    low_port_range,
    port_taken,
    wait_healthy,
)
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


@pytest.mark.parametrize(("content", "expected"), [
    ("32768\t60999\n", (20000, 32767)),  # Linux's default: everything up to it
    ("30000 60999\n", (20000, 29999)),  # a lower range: stop below it
    ("40000 60999\n", (20000, 32767)),  # a higher one: Dynamo's 16-bit limit still holds
    ("20050 60999\n", (20000, 32767)),  # no room below it: the usual range, best effort
    ("garbage\n", (20000, 32767)),
])
def test_servers_get_ports_below_the_ephemeral_range(tmp_path: Path, content: str,
                                                      expected: tuple[int, int]) -> None:
    f = tmp_path / "ip_local_port_range"
    f.write_text(content)
    assert low_port_range(f) == expected
    assert low_port_range(tmp_path / "missing") == (20000, 32767)


class Picks:
    """A stand-in for random.Random whose randint returns the given ports in order."""

    def __init__(self, *ports: int) -> None:
        self.ports = list(ports)

    def randint(self, low: int, high: int) -> int:
        port = self.ports.pop(0)
        assert low <= port <= high
        return port


def test_free_port_passes_over_listening_and_handed_out_ports() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy:
        busy.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        busy_port = free_port()
        busy.bind(("127.0.0.1", busy_port))
        busy.listen()
        handed_out = free_port(taken=[busy_port])
        other = free_port(taken=[busy_port, handed_out])
        assert free_port(Picks(busy_port, handed_out, other),  # type: ignore[arg-type]
                         taken=[handed_out]) == other
    low, high = low_port_range()
    assert low <= other <= high and other not in (busy_port, handed_out)


def test_port_taken_reads_only_the_servers_own_port() -> None:
    uvicorn = ("ERROR:    [Errno 98] error while attempting to bind on address "
               "('127.0.0.1', 37125): address already in use")
    llama = "couldn't bind HTTP server socket, hostname: 127.0.0.1, port: 28001"
    assert port_taken(f"starting\n{uvicorn}\nWaiting for application shutdown.", "37125")
    assert port_taken(llama, "28001")
    assert not port_taken(uvicorn, "28001")  # another socket of the server: its own business
    assert not port_taken("Uvicorn running on http://127.0.0.1:37125", "37125")


def test_a_server_whose_port_was_taken_stops_waiting_at_once(tmp_path: Path) -> None:
    """SGLang runs on after uvicorn failed to bind: the wait ends with the cause, not after
    the whole start-up timeout."""
    port = free_port()
    log = tmp_path / "server.log"
    log.write_text(f"Application startup complete.\nERROR:    [Errno 98] error while attempting "
                   f"to bind on address ('127.0.0.1', {port}): address already in use\n")
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with pytest.raises(ServerError, match=rf"demo could not listen on 127.0.0.1:{port}: "
                                              "another process took the port"):
            wait_healthy(proc, f"http://127.0.0.1:{port}/health", "demo", 50.0,
                         lambda: log_tail(log), poll_s=0.1)
        assert proc.poll() is None  # it raised while the process still ran: not a timeout
    finally:
        proc.kill()
        proc.wait()


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
