"""One load generator of a distributed run: a shard of the run, replayed by `execute_run` in
a process of its own (a Ray actor's). Ray is not imported here: the driver wraps this class
(`ray.remote`), so the class stays testable without Ray.

The actor runs its shard on one thread and answers the driver on others (`max_concurrency`
4): `wait_ready` returns once the shard is planned and connected and waits at its start gate,
`begin` gives it the run's shared start (chosen once every shard is ready, so none starts
late), and `stop` reaches the replay as SIGTERM would (harness.signals.request_stop): the shard
records what it measured, ends its trajectories (interrupted), frees its slots and writes
run.json.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import sys
import threading
from pathlib import Path
from typing import Any

from harness import signals
from harness.errors import HarnessError, Terminated
from harness.replay.options import RunOptions
from harness.replay.run import execute_run


class LoadGenerator:
    """Runs one shard (`run`), says where it runs (`where`), stops on request (`stop`) and
    hands its results over when the driver cannot see its disk (`files`)."""

    def __init__(self) -> None:
        self._stopping = threading.Event()
        self._ready = threading.Event()  # at the start gate, or ended before it
        self._at_gate = False
        self._go = threading.Event()
        self._start_at: float | None = None

    def _gate(self) -> float | None:
        """The shard is ready: wait for the driver's start (None when stopped instead)."""
        self._at_gate = True
        self._ready.set()
        self._go.wait()
        return None if self._stopping.is_set() else self._start_at

    def wait_ready(self, timeout_s: float) -> bool:
        """Whether the shard reached its start gate within `timeout_s` (False: it ended
        before, refused or failed; its `run` says why)."""
        self._ready.wait(timeout_s)
        return self._at_gate

    def begin(self, start_at: float) -> None:
        """Start the shard's replay at `start_at` (Unix seconds, every shard's alike)."""
        self._start_at = start_at
        self._go.set()

    def where(self) -> dict[str, Any]:
        """The host, process and (under Ray) node this load generator runs on."""
        node = None
        try:
            import ray

            node = ray.get_runtime_context().get_node_id()
        except Exception:  # noqa: BLE001 - outside Ray (tests): no node
            node = None
        return {"host": socket.gethostname(), "pid": os.getpid(), "node": node}

    def run(self, opts: RunOptions) -> dict[str, Any]:
        """Replay `opts.shard` of the run; returns its status, or the one-line error and exit
        code that `harness run` would have given."""
        if self._stopping.is_set():
            return {"status": "interrupted", "error": None, "exit_code": None}
        if opts.start_at is None:
            opts = dataclasses.replace(opts, start_gate=self._gate)
        try:
            run = execute_run(opts, lambda m: print(f"[shard {opts.shard}] {m}",
                                                    file=sys.stderr, flush=True))
            return {"status": run.status, "error": None, "exit_code": None}
        except HarnessError as exc:
            return {"status": "failed", "error": str(exc), "exit_code": exc.exit_code}
        except (KeyboardInterrupt, Terminated):
            return {"status": "interrupted", "error": None, "exit_code": None}
        finally:
            self._ready.set()  # a shard that ended before its gate is not ready

    def stop(self) -> bool:
        """Stop the running shard as SIGTERM would (its cleanup runs); True when one ran."""
        self._stopping.set()
        self._go.set()
        return signals.request_stop(signal.SIGTERM)

    def files(self, directory: str) -> dict[str, bytes]:
        """Every file under `directory` (the shard's results), by relative path: the driver
        writes them on its side when this load generator ran on another machine."""
        root = Path(directory)
        return {str(p.relative_to(root)): p.read_bytes()
                for p in sorted(root.rglob("*")) if p.is_file() and not p.name.endswith(".tmp")}
