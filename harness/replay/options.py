"""What one replay run is asked to do, and what a runtime's entry point receives."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.plan.planner import Arrivals, Plan
from harness.policies.base import PausePolicy, ServerRates


@dataclass
class RunOptions:
    """Everything one replay run needs; `harness run` and `harness bench` both build these."""

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
    scrape_interval_s: float = 0.2
    calibration: Path | None = None
    server_args: tuple[str, ...] = ()  # extra flags for a local server (e.g. -ngl 99)


@dataclass
class RunContext:
    """Handed to a runtime's entry point: it starts (or reaches) the server, builds its adapter
    and calls harness.replay.runner.replay. `run` is run.json, to be completed with the server's
    details; `rates` are calibrated rates when a calibration file was given."""

    options: RunOptions
    plan: Plan
    policy: PausePolicy
    run: dict[str, Any]
    echo: Callable[[str], None]
    rates: ServerRates | None = None
