"""A distributed run's Ray instance: a local one the driver starts (in a private folder) and
stops, or a cluster it connects to, with the run's load generators as its actors. However it
ends (a stop signal while Ray starts included), the actors are killed, the local instance is
stopped, what is left of its processes is killed and its folder removed."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Any

from harness import signals
from harness.adapters.launchers.process import processes_of, reap_recorded
from harness.distributed.worker import LoadGenerator
from harness.errors import InputError, ServerError

POLL_S = 0.25  # how often the main thread looks for a stop signal while Ray starts
RAY_CONNECT_S = 5.0  # for a cluster's address to accept a connection (Ray itself waits minutes)


def import_ray() -> Any:
    """The ray module; InputError naming the extra to install when it is missing."""
    try:
        import ray
    except ImportError:
        raise InputError("--workers needs Ray: install the extra, pip install "
                         "'agent-pause-harness[distributed]' (make setup does)") from None
    return ray


# Ray puts its sockets at FOLDER/session_<date>_<time>_<micros>_<pid>/sockets/<name>, and a
# Unix socket's path holds at most 107 bytes: the run's folder must leave Ray about 68 of them.
RAY_SOCKET_SUFFIX_CHARS = 68
UNIX_SOCKET_PATH_MAX = 107


def ray_temp_parent(tmp: str | None = None) -> str | None:
    """Where the local Ray instance's folder goes: the temporary folder (TMPDIR's), unless
    its path is too long for Ray's sockets, then /tmp (None: the default, to let Ray say what
    is wrong when neither fits)."""
    tmp = tmp or tempfile.gettempdir()
    folder_chars = len("/harness-ray-") + 8  # mkdtemp's random part
    if len(tmp) + folder_chars + RAY_SOCKET_SUFFIX_CHARS <= UNIX_SOCKET_PATH_MAX:
        return tmp
    return "/tmp" if os.path.isdir("/tmp") and os.access("/tmp", os.W_OK) else None


@contextmanager
def fleet(ray: Any, address: str | None, workers: int, started: Callable[[str | None], None],
           stop: Callable[[], None]) -> Iterator[list[Any]]:
    """`workers` LoadGenerator actors on a local Ray instance (started here, in a private
    folder, no dashboard) or on the cluster at `address`; every actor is killed on exit, and
    the local instance stopped, what is left of its processes killed and its folder removed,
    however it ends (a stop signal while Ray starts included: `stop` raises it once Ray has
    started). `started` is told the local instance's folder (None: a cluster's) before
    anything of it starts. Runs under signals.deferred (`stop` is its check)."""
    temp = None if address else tempfile.mkdtemp(prefix="harness-ray-", dir=ray_temp_parent())
    started(temp)
    if address:
        kwargs: dict[str, Any] = {"address": address, "include_dashboard": False,
                                  "logging_level": "ERROR", "configure_logging": True}
    else:
        # A token of the run's own for the local instance (Ray 2.59+ authenticates local
        # clusters), in the environment its processes inherit: none is written to ~/.ray.
        os.environ.setdefault("RAY_AUTH_TOKEN", secrets.token_hex(32))
        kwargs = {"num_cpus": max(workers, os.cpu_count() or 1), "include_dashboard": False,
                  "logging_level": "ERROR", "_temp_dir": temp}
    release = threading.Event()
    actors: list[Any] = []

    def reap_now() -> None:  # a second signal: the process leaves at once, Ray's with it
        if temp:
            reap_recorded(temp, processes_of(temp), wait_s=0.5)

    signals.at_force_exit(reap_now)
    try:
        try:
            _init_ray(ray, kwargs, release, stop)
        except Exception as exc:  # noqa: BLE001 - Ray's own errors vary by version
            what = f"the Ray cluster at {address}" if address else "a local Ray instance"
            hint = (" (a cluster with token authentication needs RAY_AUTH_MODE=token and its "
                    "token in RAY_AUTH_TOKEN or ~/.ray/auth_token, as on its nodes)"
                    if address else "")
            raise ServerError(f"{what} could not be started or reached: "
                              f"{type(exc).__name__}: {exc}"[:300] + hint) from None
        # Threads: the shard's run, and the driver's wait_ready, begin and stop beside it.
        actor_cls = ray.remote(num_cpus=1, max_concurrency=4, max_restarts=0)(LoadGenerator)
        actors += [actor_cls.options(scheduling_strategy="SPREAD").remote()
                   for _ in range(workers)]
        stop()
        yield actors
    finally:
        _teardown(ray, actors, temp)
        release.set()
        signals.forget_at_force_exit(reap_now)


def _init_ray(ray: Any, kwargs: dict[str, Any], release: threading.Event,
              stop: Callable[[], None]) -> None:
    """ray.init(**kwargs) on a thread of its own while the main thread waits: no signal
    handler's exception can land inside it (a half-started instance is one that
    ray.shutdown cannot stop), and Ray installs no SIGTERM handler of its own (it does only
    on the main thread: one that exits at once, 15, leaving its processes and folder). The
    thread stays until `release` is set, after ray.shutdown: the processes Ray starts die
    with the thread that started them (PR_SET_PDEATHSIG), so it must outlive the instance.
    Raises Ray's error, or (first) a stop signal noted meanwhile, once ray.init returned."""
    failed: list[BaseException] = []
    done = threading.Event()

    def init() -> None:
        try:
            ray.init(**kwargs)
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread
            failed.append(exc)
        finally:
            done.set()
        release.wait()

    threading.Thread(target=init, name="ray-init", daemon=True).start()
    while not done.wait(POLL_S):
        pass  # a signal is noted meanwhile (signals.deferred), and raised below
    # Ray's core worker sets a process-wide SIGTERM handler of its own (a stack dump on
    # stderr before Python's): Python's are put back in front.
    for signum in (signal.SIGINT, signal.SIGTERM):
        if (handler := signal.getsignal(signum)) is not None:
            signal.signal(signum, handler)
    stop()
    if failed:
        raise failed[0]


def _teardown(ray: Any, actors: list[Any], temp: str | None) -> None:
    """Kill the actors, stop Ray, then kill what is left of the local instance's processes
    (those that name its folder and their descendants, found while Ray still ran: nothing
    else) and remove its folder."""
    for a in actors:
        with suppress(Exception):
            ray.kill(a, no_restart=True)
    left = processes_of(temp) if temp else []
    with suppress(Exception):
        ray.shutdown()
    if temp:
        reap_recorded(temp, left)
        shutil.rmtree(temp, ignore_errors=True)


def check_reachable(address: str) -> None:
    """InputError unless `address` is HOST:PORT (or ray://HOST:PORT); ServerError when nothing
    accepts a connection there within RAY_CONNECT_S."""
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InputError(f"--ray-address must be HOST:PORT (or ray://HOST:PORT), got "
                         f"{address[:80]!r}")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=RAY_CONNECT_S).close()
    except OSError as exc:
        raise ServerError(f"the Ray cluster at {address} cannot be reached: "
                          f"{exc.strerror or exc}") from None
