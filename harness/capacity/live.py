"""Points measured on a server: each a bounded replay (`harness run --duration --warmup`),
an ordinary results directory with window.json beside its summary."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.adapters.base import Runtime
from harness.capacity.driver import Measure, PointSpec
from harness.errors import InputError
from harness.metrics.window import WINDOW_JSON
from harness.plan.planner import Arrivals
from harness.records.store import read_json
from harness.replay import pinning
from harness.replay.options import AUTO, RunOptions
from harness.replay.run import execute_run


def live_measure(base: RunOptions, runtime: Runtime, duration_s: float, warmup_s: float,
                 echo: Callable[[str], None],
                 settings: Callable[[PointSpec], dict[str, Any]] | None = None) -> Measure:
    """A Measure that replays `base` (its trace, server, timeouts) with the point's policy and
    agents for `duration_s`, the first `warmup_s` left out. `settings(spec)`: RunOptions
    fields that differ per point (slots, context per slot)."""

    # Decided once, before the first point pins this process: every point runs pinned alike.
    pin = (pinning.decide(pinning.available_cpus(), base.url is None, runtime.pins_local_server)
           if base.pinning == AUTO else base.pinning)

    def measure(spec: PointSpec, out: Path) -> dict[str, Any]:
        a = base.arrivals
        o = dataclasses.replace(
            base, policy=spec.policy, policy_args=dict(spec.policy_args), out=out,
            arrivals=Arrivals("closed", spec.agents, a.rate, a.time_scale),
            duration_s=duration_s, warmup_s=warmup_s, pinning=pin,
            **(settings(spec) if settings else {}))
        run = execute_run(o, echo, runtime)
        if not (out / WINDOW_JSON).exists():
            raise InputError(f"{out}: the point wrote no {WINDOW_JSON} (metrics unavailable)")
        window: dict[str, Any] = read_json(out / WINDOW_JSON)
        # Trajectories the server failed: the point cannot pass (harness.capacity.driver).
        window["server_failed"] = run.outcome.server_failed if run.outcome else 0
        return window

    return measure


def nan_free(value: Any) -> Any:
    """JSON-ready: NaN and infinities as None, recursively."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: nan_free(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [nan_free(v) for v in value]
    return value
