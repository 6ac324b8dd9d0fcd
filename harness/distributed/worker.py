"""One load generator of a distributed run: a shard of the run, replayed by `execute_run` in
a process of its own (a Ray actor's). Ray is not imported here: the driver wraps this class
(`ray.remote`), so the class stays testable without Ray.

The actor runs its shard on one thread and answers `stop` on another (`max_concurrency=2`): a
stop reaches the replay as SIGTERM would (harness.signals.request_stop), so the shard records
what it measured, ends its trajectories (interrupted), frees its slots and writes run.json.
"""

from __future__ import annotations

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


class LoadGenerator:
    """Runs one shard (`run`), says where it runs (`where`), stops on request (`stop`) and
    hands its results over when the driver cannot see its disk (`files`)."""

    def __init__(self) -> None:
        self._stopping = threading.Event()

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
        try:
            from harness.replay.cli import execute_run

            run = execute_run(opts, lambda m: print(f"[shard {opts.shard}] {m}",
                                                    file=sys.stderr, flush=True))
            return {"status": run.status, "error": None, "exit_code": None}
        except HarnessError as exc:
            return {"status": "failed", "error": str(exc), "exit_code": exc.exit_code}
        except (KeyboardInterrupt, Terminated):
            return {"status": "interrupted", "error": None, "exit_code": None}

    def stop(self) -> bool:
        """Stop the running shard as SIGTERM would (its cleanup runs); True when one ran."""
        self._stopping.set()
        return signals.request_stop(signal.SIGTERM)

    def files(self, directory: str) -> dict[str, bytes]:
        """Every file under `directory` (the shard's results), by relative path: the driver
        writes them on its side when this load generator ran on another machine."""
        root = Path(directory)
        return {str(p.relative_to(root)): p.read_bytes()
                for p in sorted(root.rglob("*")) if p.is_file() and not p.name.endswith(".tmp")}
