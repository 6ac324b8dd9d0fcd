"""What one replay run is asked to do: `harness run` and `harness bench` both build these."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from harness.adapters.http import Timeouts
from harness.plan.planner import Arrivals
from harness.plan.shard import WHOLE, Shard
from harness.policies.pin_release import PinSettings
from harness.records.manifest import CpuPinning

AUTO: Literal["auto"] = "auto"
SCRAPE_INTERVAL_S = 0.2  # a replay's server-metrics sampling, by default (s)


@dataclass
class RunOptions:
    """Everything one replay run needs.

    `pinning`: AUTO decides from the CPUs this process may use now (a lone `harness run`);
    a bench decides once and passes the same decision (or None) to every run."""

    trace: Path
    policy: str
    out: Path
    runtime: str = "llamacpp"
    url: str | None = None
    policy_args: dict[str, str] = field(default_factory=dict)
    inject: str = "none"
    arrivals: Arrivals = field(default_factory=Arrivals)
    seed: int = 0
    slots: int = 4
    ctx_per_slot: int = 4096
    threads: int = 1
    model: Path | None = None
    scrape_interval_s: float = SCRAPE_INTERVAL_S
    calibration: Path | None = None
    server_args: tuple[str, ...] = ()  # extra flags for a local server (e.g. -ngl 99)
    pinning: CpuPinning | None | Literal["auto"] = AUTO
    # a `harness selftest` file's figures, read and checked up front (--selftest)
    instrument_error: dict[str, Any] | None = None
    timeouts: Timeouts = field(default_factory=Timeouts)
    skip_oversized: bool = False  # skip (and record) trajectories that cannot fit a slot
    pins: PinSettings = field(default_factory=PinSettings)  # the server's pin release valve
    token_scale: float = 1.0  # every token count of the trace times this, rounded up
    # A bounded run: stop at duration_s (harness.plan.planner.Plan.horizon_s); the figures of
    # its window (harness.metrics.window) leave out the first warmup_s.
    duration_s: float | None = None
    warmup_s: float = 0.0
    # sent with every request (--api-key, --header): never written to run.json or a log
    headers: dict[str, str] = field(default_factory=dict, repr=False)
    # One load generator of several acting as one run (harness.plan.shard): this one replays
    # `shard` of the plan, on a timeline whose origin is `start_at` (Unix seconds, the same for
    # every shard), under `run_id` (the same for every shard; None: a new id).
    shard: Shard = WHOLE
    start_at: float | None = None
    run_id: str | None = None
    # Instead of `start_at`: called (on a thread) once the shard is ready to start, it returns
    # the shared start that the driver chose once every shard was ready (None: stop instead).
    start_gate: Callable[[], float | None] | None = field(default=None, repr=False,
                                                           compare=False)
    # with `url`: what the process that started that server on this machine passes on
    # (harness.adapters.base.ServerOptions.shared)
    server_shared: dict[str, Any] | None = None
    # the job's inputs as run.json records them (harness.specs: the command and its values, no
    # secret), for `harness rerun`; None where no command asked for it
    spec: dict[str, Any] | None = field(default=None, compare=False)
