"""What every local server launcher shares: waiting for health, reading its log's tail, stopping
its process group and removing the shared memory it leaked."""

from __future__ import annotations

import contextlib
import http.client
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Collection
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from harness import signals
from harness.errors import ServerError


def log_tail(path: Path, n: int = 15, keep: Callable[[str], bool] = lambda _: True) -> str:
    """The last `n` lines of a server log that `keep` accepts; '(no log)' if unreadable."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join([ln for ln in lines if keep(ln)][-n:])


# What an HTTP probe of a server (urllib) meets while the server is not up, or when the port
# answers something other than HTTP (e.g. a ZMQ socket's greeting: http.client.BadStatusLine).
PROBE_ERRORS: tuple[type[Exception], ...] = (urllib.error.URLError, ConnectionError,
                                             TimeoutError, http.client.HTTPException)


# What a server's log says when its listening port was taken (uvicorn for vLLM and SGLang,
# llama-server): some go on running without listening, so start-up stops at once on it.
PORT_TAKEN_MARKERS = ("address already in use", "couldn't bind http server socket")


def port_taken(tail: str, port: str) -> bool:
    """Whether a log's tail says the server could not listen on `port` (a line naming both
    the failure and the port: another socket's failure is the server's own business)."""
    return any(port in line and any(m in line.lower() for m in PORT_TAKEN_MARKERS)
               for line in tail.splitlines())


def wait_healthy(proc: subprocess.Popen[bytes], url: str, name: str, timeout_s: float,
                 tail: Callable[[], str], poll_s: float = 0.5, probe_timeout_s: float = 2.0
                 ) -> None:
    """Poll `url` until HTTP 200; ServerError with the log's tail if the process exits first,
    its log says its port was taken, or `timeout_s` passes."""
    deadline = time.monotonic() + timeout_s
    address = urllib.parse.urlsplit(url)
    port = str(address.port)
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ServerError(f"{name} exited with code {proc.returncode} during start-up; "
                              f"last log lines:\n{tail()}")
        if port_taken(last := tail(), port):
            raise ServerError(f"{name} could not listen on {address.netloc}: another process "
                              f"took the port during start-up; last log lines:\n{last}")
        try:
            with urllib.request.urlopen(url, timeout=probe_timeout_s) as r:
                if r.status == 200:
                    return
        except PROBE_ERRORS:
            pass  # not up yet, or not (yet) an HTTP server on that port
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


SHM_DIR = Path("/dev/shm")
# The process groups of the servers this process started and has not stopped yet: a forced
# exit (a second Ctrl-C or SIGTERM) kills them before it leaves.
LIVE_GROUPS: set[int] = set()
# Each live group's private folder (slot dumps): a forced exit removes it too.
LIVE_DIRS: dict[int, Path] = {}
# How long a server gets to stop on SIGTERM when the run itself is being interrupted.
INTERRUPTED_TERM_WAIT_S = 3.0


def kill_live_groups() -> None:
    """SIGKILL every server group still registered and remove its private folder (the
    forced-exit path)."""
    for pgid in list(LIVE_GROUPS):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
        LIVE_GROUPS.discard(pgid)
        if (folder := LIVE_DIRS.pop(pgid, None)) is not None:
            shutil.rmtree(folder, ignore_errors=True)


signals.at_force_exit(kill_live_groups)


# Servers listen on ports below the kernel's ephemeral range: a port the kernel handed out
# (bind to port 0) goes back into that range when its test socket closes, and any outgoing
# connection made before the server binds it (a server's own processes open dozens while
# they start) may take it as its source port; below the range only a listener can.
# 32767 at most: Dynamo reads its port settings as 16-bit signed integers.
LOW_PORT_FLOOR = 20000
LOW_PORT_CEILING = 32767
EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def low_port_range(range_file: Path = EPHEMERAL_RANGE_FILE) -> tuple[int, int]:
    """The ports servers are given: from LOW_PORT_FLOOR up to the first ephemeral port (or
    LOW_PORT_CEILING) exclusive, where the kernel never picks a port by itself."""
    try:
        first_ephemeral = int(range_file.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        first_ephemeral = LOW_PORT_CEILING + 1  # Linux's default range starts at 32768
    ceiling = min(LOW_PORT_CEILING, first_ephemeral - 1)
    if ceiling < LOW_PORT_FLOOR + 100:  # an unusually wide ephemeral range: no room below it
        return LOW_PORT_FLOOR, LOW_PORT_CEILING
    return LOW_PORT_FLOOR, ceiling


def free_port(rng: random.Random | None = None, taken: Collection[int] = ()) -> int:
    """A TCP port on 127.0.0.1 below the ephemeral range that nothing listens on now and
    that is not one of `taken` (ports already handed to a server that has not bound them)."""
    rng = rng or random.SystemRandom()  # not a measurement: no seed wanted
    low, high = low_port_range()
    for _ in range(200):
        if (port := rng.randint(low, high)) in taken:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise ServerError(f"no free port in {low}-{high} on 127.0.0.1")


def shm_entries(shm_dir: Path = SHM_DIR) -> set[str]:
    """The names in the shared-memory folder now (none where there is no such folder)."""
    try:
        return {p.name for p in shm_dir.iterdir()}
    except OSError:
        return set()


def mapped_shm(shm_dir: Path = SHM_DIR) -> set[str]:
    """Names in the shared-memory folder that a live process maps (from /proc/*/maps)."""
    prefix = str(shm_dir) + "/"
    found: set[str] = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        with contextlib.suppress(OSError):
            for line in maps.read_text(errors="replace").splitlines():
                at = line.find(prefix)
                if at >= 0:
                    found.add(line[at + len(prefix):].split(" (deleted)")[0].strip())
    return found


def remove_leaked_shm(before: set[str], prefixes: tuple[str, ...],
                      shm_dir: Path = SHM_DIR) -> list[str]:
    """Remove the shared-memory entries with these prefixes that appeared since `before` and
    that no live process maps: what a server's processes left when they were killed (SIGKILL
    skips their own clean-up). Returns the names removed."""
    new = sorted(n for n in shm_entries(shm_dir) - before if n.startswith(prefixes))
    if not new:
        return []
    in_use = mapped_shm(shm_dir)
    removed = []
    for name in new:
        if name not in in_use:
            with contextlib.suppress(OSError):
                (shm_dir / name).unlink()
                removed.append(name)
    return removed


def _masked(umask: int) -> Callable[[], None]:
    def preexec() -> None:
        os.umask(umask)

    return preexec


def pinned(cmd: list[str], cpus: str | None) -> list[str]:
    """`cmd` run on the CPUs `cpus` (a taskset list) when given and taskset is installed."""
    if cpus and shutil.which("taskset"):
        return ["taskset", "-c", cpus, *cmd]
    return cmd


class ServerProcess:
    """One local server run as a process group of its own: its port on 127.0.0.1 (`url`), its
    log file, its private temporary folder (`tmp_dir`, named `tmp_prefix`...), start-up until
    healthy, and a stop that leaves nothing behind (the group ended, the shared memory its
    killed processes left removed, the folder deleted). Each runtime's launcher is this with
    its command line; as context managers they stop on exit."""

    def __init__(self, name: str, log_path: Path, tmp_prefix: str, leaked_shm: tuple[str, ...],
                 log_keep: Callable[[str], bool] = lambda _: True) -> None:
        self.name = name
        self.log_path = log_path
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.tmp_dir = Path(tempfile.mkdtemp(prefix=tmp_prefix))
        os.chmod(self.tmp_dir, 0o700)
        self.leaked_shm = leaked_shm
        self.log_keep = log_keep
        self.start_s: float | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._pgid: int | None = None
        self._log: IO[bytes] | None = None
        self._shm_before: set[str] = set()

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def start(self, cmd: list[str], env: dict[str, str], health_url: str, timeout_s: float,
              probe_timeout_s: float = 2.0, poll_s: float = 0.5,
              umask: int | None = None) -> None:
        """Start `cmd` (environment: ours plus `env`; files it creates masked by `umask` when
        given) and wait until `health_url` answers 200; on failure the server is stopped and
        ServerError names it with its log's tail."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        t0 = time.monotonic()
        self._shm_before = shm_entries()
        self._proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL, env={**os.environ, **env},
                                      start_new_session=True,
                                      preexec_fn=None if umask is None else _masked(umask))
        self._pgid = self._proc.pid  # start_new_session: the group id is the leader's pid
        LIVE_GROUPS.add(self._pgid)
        LIVE_DIRS[self._pgid] = self.tmp_dir
        try:
            wait_healthy(self._proc, health_url, self.name, timeout_s, self.log_tail,
                         poll_s=poll_s, probe_timeout_s=probe_timeout_s)
        except BaseException:
            self.stop()
            raise
        self.start_s = round(time.monotonic() - t0, 3)

    def process_record(self) -> dict[str, Any]:
        """The server's pid, process group and private folder, for run.json."""
        return {"pid": self.pid, "pgid": self._pgid, "tmp_dir": str(self.tmp_dir)}

    def exit_reason(self) -> str | None:
        """None while the server runs; once it has exited, one line: its code and last log
        line."""
        proc = self._proc
        if proc is None or proc.poll() is None:
            return None
        last = self.log_tail(1).strip() or "(no log)"
        return f"{self.name} exited mid-run (code {proc.returncode}); its log ends: {last}"[:400]

    def log_tail(self, n: int = 15) -> str:
        """The server log's last `n` lines (those `log_keep` keeps)."""
        return log_tail(self.log_path, n, self.log_keep)

    def group_alive(self) -> bool:
        """Whether any process of the server's process group is still running."""
        return group_alive(self._pgid)

    def stop(self, term_wait_s: float = 20.0) -> None:
        """SIGTERM the process group, SIGKILL what is left after `term_wait_s`; remove what it
        left."""
        proc, self._proc = self._proc, None
        if proc is not None:
            stop_group(proc, term_wait_s, linger_s=min(5.0, term_wait_s))
            LIVE_GROUPS.discard(proc.pid)
            LIVE_DIRS.pop(proc.pid, None)
            remove_leaked_shm(self._shm_before, self.leaked_shm)
        if self._log is not None:
            self._log.close()
            self._log = None
        shutil.rmtree(self.tmp_dir, ignore_errors=True)

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        # Interrupted (Ctrl-C, SIGTERM: not an Exception): the whole stop fits in a few seconds.
        interrupted = exc is not None and not isinstance(exc, Exception)
        self.stop(INTERRUPTED_TERM_WAIT_S if interrupted else 20.0)


HARNESS_TMP_PREFIXES = ("harness-slots-", "harness-sglang-", "harness-vllm-", "harness-dynamo-",
                        "harness-ray-")


def _mentions(pid: int, needle: str) -> bool:
    """Whether process `pid`'s command line or environment names `needle` (so a reused pid is
    never taken for the server)."""
    for part in ("cmdline", "environ"):
        try:
            if needle.encode() in Path(f"/proc/{pid}/{part}").read_bytes():
                return True
        except OSError:
            continue
    return False


def _group_members(pgid: int) -> list[int]:
    """The pids of process group `pgid` (from /proc: the leader may be gone, its children not)."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and fields[2] == str(pgid):
            members.append(int(stat.parent.name))
    return members


def reap_leftover(record: dict[str, Any], wait_s: float = 3.0) -> list[str]:
    """Stop the server process group and remove the private folder a dead run left, as its
    run.json recorded them (`server_process`: pid, pgid, tmp_dir). Returns what was done, one
    line each; a process that does not name the folder is left alone (not ours)."""
    done: list[str] = []
    pgid, tmp = record.get("pgid"), str(record.get("tmp_dir") or "")
    ours = bool(tmp) and Path(tmp).name.startswith(HARNESS_TMP_PREFIXES)
    if isinstance(pgid, int) and group_alive(pgid):
        if ours and any(_mentions(pid, tmp) for pid in _group_members(pgid)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGTERM)
            deadline = time.monotonic() + wait_s
            while group_alive(pgid) and time.monotonic() < deadline:
                time.sleep(0.1)
            if group_alive(pgid):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pgid, signal.SIGKILL)
            done.append(f"stopped the server process group {pgid}")
        else:
            done.append(f"left process group {pgid} alone: it is not the run's server")
    if ours and Path(tmp).is_dir():
        shutil.rmtree(tmp, ignore_errors=True)
        done.append(f"removed {tmp}")
    return done


def processes_of(folder: str) -> list[dict[str, int]]:
    """The processes that name `folder` in their command line or environment, and all their
    descendants (a helper that renamed itself, as Ray's agents do, no longer names it), each
    as {pid, start} (its start time in clock ticks since boot, so a reused pid is never taken
    for it)."""
    stats: dict[int, tuple[int, int]] = {}  # pid -> (ppid, start)
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            stats[int(stat.parent.name)] = (int(fields[1]), int(fields[19]))
        except (OSError, IndexError, ValueError):
            continue
    me = os.getpid()
    found = {pid for pid in stats if pid != me and _mentions(pid, folder)}
    grew = True
    while grew:
        more = {pid for pid, (ppid, _) in stats.items() if ppid in found} - found
        found |= more
        grew = bool(more)
    return [{"pid": pid, "start": stats[pid][1]} for pid in sorted(found)]


def reap_recorded(folder: str, processes: list[dict[str, int]], wait_s: float = 3.0
                  ) -> list[str]:
    """Stop the recorded `processes` that still run (the same pid with the same start time)
    and remove `folder`, one of the harness's private folders: what a killed run's helper
    processes (a local Ray instance) left. Returns what was done, one line each; a folder that
    is not one of the harness's is left alone, with its processes."""
    if not folder or not Path(folder).name.startswith(HARNESS_TMP_PREFIXES):
        return []
    pids = [p["pid"] for p in processes if _start_time(p.get("pid")) == p.get("start")]
    found = len(pids)
    for sig in (signal.SIGTERM, signal.SIGKILL):  # Ray's agents ignore SIGTERM
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and any(_running(p) for p in pids):
            time.sleep(0.1)
        pids = [p for p in pids if _running(p)]
        if not pids:
            break
    done = [f"stopped {found - len(pids)} process(es) of {folder}"] if found else []
    done += [f"could not stop pid {p}" for p in pids]
    if Path(folder).is_dir():
        shutil.rmtree(folder, ignore_errors=True)
        done.append(f"removed {folder}")
    return done


def _start_time(pid: Any) -> int | None:
    try:
        return int(Path(f"/proc/{int(pid)}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError, TypeError):
        return None


def _running(pid: int) -> bool:
    """Whether `pid` runs (a zombie counts as ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"
