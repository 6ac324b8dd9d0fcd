"""A Runtime whose server is the in-memory adapter: the seam driven end to end without a
process, recording every ServerOptions it was started with."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from harness.adapters.base import (
    Adapter,
    PolicyRealisation,
    RuntimeSession,
    ServerDetails,
    ServerInfo,
    ServerOptions,
)
from harness.adapters.http import HttpClient
from harness.replay.clock import RealClock
from tests.fakes.memory_adapter import MemoryAdapter


class MemoryRuntime:
    name = "memory"
    pins_local_server = True
    per_slot_control = True
    server_policies: dict[str, str] = {}
    default_policies = ("keep", "swap", "recompute")

    def __init__(self, slots: int = 2, dies_after_s: float | None = None) -> None:
        self.slots = slots
        self.dies_after_s = dies_after_s  # the "server" reports itself exited after this long
        self.started: list[ServerOptions] = []
        self.stopped = 0
        self.loops: list[str] = []  # the module of the event loop each run connected on

    @contextmanager
    def start(self, options: ServerOptions, out: Path) -> Iterator[RuntimeSession]:
        self.started.append(options)

        def connect(http: HttpClient) -> Adapter:
            self.loops.append(type(asyncio.get_running_loop()).__module__)
            return MemoryAdapter(RealClock(), slots=self.slots, prefill_s_per_token=1e-5,
                                 decode_s_per_token=1e-4)

        def realise(_: ServerInfo) -> PolicyRealisation:
            return PolicyRealisation(options.policy, f"{options.policy}: in memory")

        started = time.monotonic()

        def exited() -> str | None:
            if self.dies_after_s is None or time.monotonic() - started < self.dies_after_s:
                return None
            return "memory server exited mid-run (code -9)"

        try:
            yield RuntimeSession(ServerDetails(url=options.url or "http://127.0.0.1:9",
                                               flags=[] if options.url is None else None,
                                               model={"kv_bytes_per_token": 100.0}),
                                 connect, realise, server_exited=exited)
        finally:
            self.stopped += 1
