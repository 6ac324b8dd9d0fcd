"""One replay run as a library call: plan it, start (or reach) the server, replay, summarize.

`execute_run` runs one in this process; `RunEnvironment` is where a run executes, so the
caller that starts a run chooses it (this process, or several load generators:
harness.distributed) and nothing here knows the others. `execute_repeats` runs one N times.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import pandas as pd

from harness import __version__
from harness.adapters.base import Runtime, ServerOptions
from harness.adapters.runtimes import get_runtime
from harness.model.calibration import resolve_calibration
from harness.plan.injection import Injection, load_injection
from harness.plan.planner import Plan, make_plan
from harness.plan.shard import shard_plan
from harness.plan.tokens import stable_seed
from harness.policies import make_policy
from harness.policies.base import PausePolicy, program_order
from harness.records.host import host_identity
from harness.records.manifest import ArrivalsRef, CpuPinning, RunManifest, TraceRef
from harness.records.store import ensure_out_dir
from harness.replay import pinning
from harness.replay.named_policies import per_pause_policy
from harness.replay.options import AUTO, RunOptions
from harness.replay.runner import ReplayJob, ShardRun, run_on_runtime
from harness.report.repeats import repeat_dirs, write_repeats
from harness.traces.reuse import ideal_reuse_for
from harness.traces.scale import imported_token_scale, scale_tokens
from harness.traces.schema import file_sha256
from harness.traces.tile import copies_needed, tile_steps
from harness.traces.validate import load_trajectories

__all__ = ["RunOptions", "RunEnvironment", "IN_PROCESS", "execute_run", "execute_repeats",
           "plan_run", "server_options", "new_run_id", "shared_run_id"]

Echo = Callable[[str], None]


def to_stderr(message: str) -> None:
    """The default progress sink of a run: a line on stderr."""
    print(message, file=sys.stderr, flush=True)


def git_commit() -> str | None:
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True,
                             text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                           capture_output=True, text=True, timeout=5).stdout.strip()
    return out.stdout.strip() + ("-dirty" if dirty else "")


@dataclass(frozen=True)
class PlannedRun:
    """A run's whole plan (every shard's), and what it was made from."""

    plan: Plan
    steps: pd.DataFrame
    injection: Injection
    copies: int
    policy: PausePolicy


def plan_run(o: RunOptions, rt: Runtime) -> PlannedRun:
    """Check the policy and plan the whole run (InputError for bad input)."""
    pol = make_policy(per_pause_policy(o.policy, rt), o.policy_args)
    steps = scale_tokens(load_trajectories(o.trace), o.token_scale)
    injection = load_injection(o.inject)
    a = o.arrivals
    # A bounded closed loop never runs out of work: the trace repeats (new content per copy).
    copies = (copies_needed(steps, a.concurrency, o.duration_s, a.time_scale)
              if o.duration_s is not None and a.mode == "closed" else 1)
    plan = dataclasses.replace(make_plan(tile_steps(steps, copies), injection, a, o.seed),
                               horizon_s=o.duration_s)
    return PlannedRun(plan, steps, injection, copies, pol)


def server_options(o: RunOptions, run_id: str, pin: CpuPinning | None,
                   policy: PausePolicy | None = None) -> ServerOptions:
    """What a local server is started with (or which server is reached: `o.url`), for
    `policy` (what it asks of the server's scheduling)."""
    return ServerOptions(policy=o.policy, run_id=run_id, url=o.url, slots=o.slots,
                         ctx_per_slot=o.ctx_per_slot, threads=o.threads, model=o.model,
                         server_args=o.server_args, server_cpus=pin.server if pin else None,
                         shared=o.server_shared if o.url else None,
                         program_order=program_order(policy), pins=o.pins)


def new_run_id(policy: str) -> str:
    """A run id: the policy, the UTC time and a random tag."""
    return f"{policy}-{datetime.now(UTC):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:6]}"


def execute_run(o: RunOptions, echo: Echo = to_stderr, runtime: Runtime | None = None
                ) -> RunManifest:
    """Validate inputs, plan, replay (starting a local server unless `url`); returns run.json.
    `runtime`: the runtime to drive (default: the registry's `o.runtime`). A shard of a run
    (`o.shard`) replays its part of the whole plan on the run's shared timeline."""
    rt = runtime or get_runtime(o.runtime)
    p = plan_run(o, rt)
    whole, steps, a = p.plan, p.steps, o.arrivals
    plan = shard_plan(whole, o.shard)
    pin = (pinning.decide(pinning.available_cpus(), o.url is None, rt.pins_local_server)
           if o.pinning == AUTO else o.pinning)
    pinning.apply(pin)
    run = RunManifest(
        run_id=o.run_id or new_run_id(o.policy),
        runtime=rt.name, policy=o.policy, policy_args=dict(o.policy_args),
        policy_sees_true_latency=p.policy.sees_true_latency,
        trace=TraceRef(str(o.trace), file_sha256(o.trace), len(whole.trajectories),
                       int(len(steps)), len(whole.all_trajectories()) - len(whole.trajectories),
                       o.token_scale * imported_token_scale(o.trace),
                       ideal_reuse_for(steps, p.policy), p.copies),
        seed=o.seed, injection=p.injection.as_dict(),
        arrivals=ArrivalsRef(a.mode, a.concurrency, a.rate, a.time_scale),
        harness_version=__version__, git_commit=git_commit(), host=host_identity(),
        started_at=datetime.now(UTC).isoformat(), cpu_pinning=pin,
        instrument_error=o.instrument_error,
        window=(None if o.duration_s is None
                else {"warmup_s": o.warmup_s, "duration_s": o.duration_s}),
        shard=str(o.shard) if o.shard.count > 1 else None, start_at=o.start_at, spec=o.spec)
    cal = resolve_calibration(o.calibration) if o.calibration else None
    if o.calibration and cal:
        run.calibration = {"path": str(o.calibration), **cal.to_dict()}
    ensure_out_dir(o.out)
    server = server_options(o, str(run.run_id), pin, p.policy)
    return run_on_runtime(rt, ReplayJob(
        plan, server, o.policy_args, run, o.out, cal.rates() if cal else None,
        o.scrape_interval_s, o.timeouts, o.headers, o.skip_oversized,
        ShardRun(o.shard, o.start_at, o.start_gate)), echo)


def shared_run_id(opts: RunOptions, start_at: float | None) -> str:
    """The run id every shard of one run derives alike, without talking to the others: the
    policy, the start, and a hash of the trace, seed and start."""
    when = datetime.fromtimestamp(start_at or 0.0, UTC)
    tag = stable_seed("run", file_sha256(opts.trace) if opts.trace.is_file() else opts.trace,
                      opts.seed, repr(start_at)) % 16**6
    return f"{opts.policy}-{when:%Y%m%dT%H%M%S}-{tag:06x}"


class RunEnvironment(Protocol):
    """Where a run executes: given a run's options, replay it and return its run.json."""

    def execute(self, o: RunOptions, echo: Echo) -> RunManifest: ...


@dataclass(frozen=True)
class InProcess:
    """A run in this process (`runtime`: the runtime to drive; default the registry's)."""

    runtime: Runtime | None = None

    def execute(self, o: RunOptions, echo: Echo) -> RunManifest:
        return execute_run(o, echo, self.runtime)


IN_PROCESS = InProcess()


def execute_repeats(o: RunOptions, repeats: int, env: RunEnvironment = IN_PROCESS,
                    echo: Echo = to_stderr,
                    done: Callable[[Path, RunManifest], None] = lambda _d, _r: None
                    ) -> tuple[list[RunManifest], dict[str, Any] | None]:
    """Run `o` `repeats` times in `env`: once into `o.out`, or each repeat into
    OUT/repeat-K with the spread between them written to OUT/repeats.json (returned).
    `done` is called with each repeat's directory and run.json as it ends."""
    if repeats == 1:
        run = env.execute(o, echo)
        done(o.out, run)
        return [run], None
    ensure_out_dir(o.out)
    dirs = repeat_dirs(o.out, repeats)
    runs = []
    for k, d in enumerate(dirs, 1):
        echo(f"repeat {k} of {repeats} -> {d}")
        runs.append(env.execute(dataclasses.replace(o, out=d), echo))
        done(d, runs[-1])
    return runs, write_repeats(o.out, dirs)
