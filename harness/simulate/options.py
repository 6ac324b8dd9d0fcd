"""What one simulated run is asked to do (the simulator's RunOptions): `harness simulate`, the
bench's simulated policies and the advisor's candidates all build one."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from harness.plan.planner import Arrivals
from harness.policies.pin_release import DEFAULT_PIN_RELEASE
from harness.simulate.fleet import ROUND_ROBIN, Fleet
from harness.simulate.pins import Pins
from harness.simulate.server import Capacity

DEFAULT_DEADLINE_S = 30.0  # as the replay plan's default injection
FIRST_TOKEN_TIMEOUT_S = 600.0  # as the replay client's default (adapters.http.Timeouts)


@dataclass(frozen=True)
class SimOptions:
    """One simulation of `trace` under a policy on a server of `capacity`, written to `out`.

    `slot_handoff`: how a freed slot is handed on in a closed loop (harness.simulate.run's
    `simulate`); `token_scale`: every token count of the trace times this, rounded up, as a
    replay does; `copies`: the trace repeated end to end (harness.traces.tile), as a bounded
    replay does; `servers`: K servers of `capacity` each behind `router`
    (harness.simulate.fleet); `first_token_timeout_s`: the client's (inf: none); `draws_seed`:
    the seed of the server model's draws where it is to differ from `seed`; `pinned_to`: a
    replay whose trajectory starts and tool ends the simulation keeps to; `pin_release`: the
    order in which the engine model's valve releases pinned paused contexts when they fill its
    pool (harness.simulate.valve); `spec`: the job's inputs as run.json records them
    (harness.specs), where a command asked for it."""

    trace: Path
    policy: str
    policy_args: dict[str, str]
    capacity: Capacity
    calibration_path: Path | None
    arrivals: Arrivals
    seed: int
    out: Path
    history_window: int = 1000
    default_deadline_s: float = DEFAULT_DEADLINE_S
    write_summary: bool = True
    slot_handoff: str = "fifo"
    token_scale: float = 1.0
    copies: int = 1
    servers: int = 1
    router: str = ROUND_ROBIN
    first_token_timeout_s: float = FIRST_TOKEN_TIMEOUT_S
    draws_seed: int | None = None
    pinned_to: Path | None = None
    pin_release: str = DEFAULT_PIN_RELEASE
    spec: dict[str, Any] | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Loop:
    """How `simulate` runs its event loop: `arrival_s`, one arrival time per root (None: a
    closed loop of `concurrency` agents); `slot_handoff` "fifo" or "agent"; `fleet` (None: one
    server); `seed` of the model's draws; the client's `first_token_timeout_s`; `pins` of a
    replay (None: the loop's own times); the valve's `pin_release` order."""

    arrival_s: np.ndarray | None = None
    concurrency: int = 4
    history_window: int = 1000
    slot_handoff: str = "fifo"
    fleet: Fleet | None = None
    seed: int = 0
    first_token_timeout_s: float = math.inf
    pins: Pins | None = None
    pin_release: str = DEFAULT_PIN_RELEASE
