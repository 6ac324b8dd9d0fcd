"""A stop signal while a distributed run's Ray instance starts, or while its actors start, is
noted and acted on once Ray's call has returned: Ray is stopped, its folder removed and the
signal raised; Ray's start itself runs off the main thread (no handler's exception lands in
it, and Ray sets no SIGTERM handler of its own). A fake `ray` stands in for Ray."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from harness import signals
from harness.distributed import instance
from harness.errors import ServerError, Terminated

# the signal handlers and the signals seen, as they were before each test
pytestmark = pytest.mark.usefixtures("fresh_signal_state")


class FakeRay:
    """ray.init (which may send the process a signal, or fail), remote actors, kill, shutdown;
    what happened, in order."""

    def __init__(self, signum: int | None = None, fail: bool = False) -> None:
        self.signum = signum
        self.fail = fail
        self.calls: list[str] = []
        self.init_thread: threading.Thread | None = None
        self.sigterm_handler_during_init: Any = None

    def init(self, **kwargs: Any) -> None:
        self.init_thread = threading.current_thread()
        self.calls.append("init")
        if threading.current_thread() is threading.main_thread():  # as ray.init does
            signal.signal(signal.SIGTERM, lambda signum, frame: os._exit(signum))
        if self.signum is not None:
            os.kill(os.getpid(), self.signum)  # as a signal sent while Ray starts
        time.sleep(0.3)  # Ray still starting: the main thread notes the signal meanwhile
        self.sigterm_handler_during_init = signal.getsignal(signal.SIGTERM)
        if self.fail:
            raise RuntimeError("no room for the object store")
        self.calls.append("init done")

    def remote(self, **kwargs: Any) -> Any:
        ray = self

        class Cls:
            def __init__(self, cls: type) -> None:
                pass

            def options(self, **kw: Any) -> Cls:
                return self

            def remote(self) -> str:
                ray.calls.append("actor")
                return f"actor-{ray.calls.count('actor')}"

        return Cls

    def kill(self, actor: str, no_restart: bool) -> None:
        self.calls.append(f"kill {actor}")

    def shutdown(self) -> None:
        self.calls.append("shutdown")


def _fleet(ray: FakeRay, folders: list[str | None], check: Any) -> Any:
    """The local instance's fleet of 2 (its folder told to `folders`), under `check`."""
    return instance.fleet(ray, None, 2, folders.append, check)


@pytest.mark.parametrize(("signum", "raised"), [(signal.SIGTERM, Terminated),
                                                (signal.SIGINT, KeyboardInterrupt)])
def test_a_signal_while_ray_starts_stops_ray_once_started(
        signum: int, raised: type[BaseException]) -> None:
    ray = FakeRay(signum)
    folders: list[str | None] = []
    hooks_before = list(signals._at_force_exit)
    with signals.deferred() as check, pytest.raises(raised), _fleet(ray, folders, check):
        pytest.fail("the fleet must not start after a stop signal")
    assert ray.calls == ["init", "init done", "shutdown"]  # init ran to its end, then stopped
    assert ray.init_thread is not threading.main_thread()
    assert ray.init_thread is not None and not _alive_after(ray.init_thread, 2.0)
    folder = folders[0]
    assert folder is not None and Path(folder).name.startswith("harness-ray-")
    assert not Path(folder).exists()
    assert signals._at_force_exit == hooks_before  # the second-signal hook is dropped


def test_ray_installs_no_handler_of_its_own_while_it_starts() -> None:
    ray = FakeRay()
    with signals.deferred() as check:
        noting = signal.getsignal(signal.SIGTERM)
        with _fleet(ray, [], check) as actors:
            assert actors == ["actor-1", "actor-2"]
            assert ray.init_thread is not None and ray.init_thread.is_alive()  # Ray's owner
        assert ray.sigterm_handler_during_init is noting
    assert ray.calls[-3:] == ["kill actor-1", "kill actor-2", "shutdown"]
    assert not _alive_after(ray.init_thread, 2.0)


def test_a_signal_while_the_actors_start_stops_them_and_ray() -> None:
    ray = FakeRay()
    with signals.deferred() as check, pytest.raises(Terminated), _fleet(ray, [], check):
        os.kill(os.getpid(), signal.SIGTERM)  # noted only: the fleet's body goes on
        time.sleep(0.05)
        check()
    assert ray.calls[-3:] == ["kill actor-1", "kill actor-2", "shutdown"]


def test_ray_that_fails_to_start_is_one_line_and_leaves_nothing() -> None:
    ray = FakeRay(fail=True)
    folders: list[str | None] = []
    with (signals.deferred() as check, pytest.raises(ServerError, match="no room"),
          _fleet(ray, folders, check)):
        pass
    assert ray.calls == ["init", "shutdown"]
    assert folders[0] is not None and not Path(folders[0]).exists()


def test_a_signal_beats_ray_failing_to_start() -> None:
    ray = FakeRay(signal.SIGTERM, fail=True)
    with signals.deferred() as check, pytest.raises(Terminated), _fleet(ray, [], check):
        pass


def test_forget_at_force_exit() -> None:
    def hook() -> None:
        pass

    signals.at_force_exit(hook)
    signals.forget_at_force_exit(hook)
    signals.forget_at_force_exit(hook)  # twice: no error
    assert hook not in signals._at_force_exit


def _alive_after(thread: threading.Thread, wait_s: float) -> bool:
    thread.join(wait_s)
    return thread.is_alive()


def test_the_ray_folder_goes_where_ray_s_socket_paths_fit() -> None:
    """Ray's sockets live about 68 characters below the run's folder and a Unix socket path
    holds 107 bytes: a TMPDIR too long for that sends the folder to /tmp."""
    fits = "/" + "t" * (instance.UNIX_SOCKET_PATH_MAX - instance.RAY_SOCKET_SUFFIX_CHARS
                        - len("/harness-ray-") - 8 - 1)
    assert instance.ray_temp_parent(fits) == fits
    assert instance.ray_temp_parent(fits + "x") == "/tmp"
    assert instance.ray_temp_parent("/tmp") == "/tmp"
