"""A bench, checked before its first replay: one RunOptions per policy under one CPU pinning."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

from harness.adapters.base import Runtime
from harness.adapters.runtimes import get_runtime
from harness.calibrate.measure import CALIBRATED_RUNTIMES
from harness.capacity.slo import Slo, parse_slo
from harness.errors import InputError
from harness.model.calibration import resolve_calibration
from harness.model.engines import PREFIX_CACHE_ENGINES
from harness.plan.injection import load_injection
from harness.policies import make_policy
from harness.records.manifest import CpuPinning
from harness.replay import pinning
from harness.replay.named_policies import per_pause_policy, policy_names, scoped_policy_args
from harness.replay.options import RunOptions
from harness.replay.preflight import check_subagent_slots
from harness.replay.run import plan_run
from harness.report.repeats import repeat_dirs
from harness.specs.bench import DEFAULT_PICK_SLO, BenchSpec
from harness.traces.shipped import shipped_trace
from harness.traces.validate import load_trajectories


@dataclass(frozen=True)
class BenchPlan:
    """A bench, validated before its first replay: one RunOptions per policy (with the same
    CPU pinning), where results go, and what else runs (calibration, simulation, the advisor's
    pick under `slo`, a capacity search of `capacity_s` seconds)."""

    root: Path
    trace: Path
    runtime: Runtime
    runs: tuple[RunOptions, ...]
    calibration: Path | None  # a calibration file, or where --calibrate writes one
    calibrate_first: bool
    simulable: bool  # the simulator runs each policy too (see bench --calibration)
    pinning: CpuPinning | None
    repeats: int = 1  # rounds of every policy; above 1, each in <policy>/repeat-<k>
    slo: Slo = parse_slo(DEFAULT_PICK_SLO)
    capacity_s: float | None = None  # a capacity search after the replays, this long
    # --calibration named a shipped preset: written to `calibration` before the first replay
    preset: str | None = None

    def rounds(self) -> list[list[RunOptions]]:
        """The replays in the order they run: round by round, every policy in each, so a
        drift of the machine during the bench touches every policy alike."""
        if self.repeats == 1:
            return [list(self.runs)]
        return [[replace(o, out=repeat_dirs(o.out, self.repeats)[k]) for o in self.runs]
                for k in range(self.repeats)]


def plan_bench(spec: BenchSpec, runtimes: Callable[[str], Runtime] = get_runtime) -> BenchPlan:
    """Check every input of a bench (policies and their arguments, the trace, the injection
    profile, the calibration file) and decide its CPU pinning once; InputError on the first
    problem, before anything is started. `runtimes`: the runtime registry (a test's stand-in)."""
    runtime, url, policy_args, out = spec.runtime, spec.url, spec.policy_args, spec.out
    calibration, calibrate_first, base = spec.calibration, spec.calibrate_first, spec.base()
    rt = runtimes(runtime)
    # an empty --policies names none: refused (policy_names), never read as the default
    names = policy_names(",".join(rt.default_policies) if spec.policies is None
                         else spec.policies, rt)
    if calibrate_first and (calibration is not None or rt.name not in CALIBRATED_RUNTIMES):
        raise InputError(f"--calibrate measures {', '.join(CALIBRATED_RUNTIMES)} servers; it "
                         "replaces --calibration")
    args = scoped_policy_args(names, policy_args)
    for p in names:
        make_policy(per_pause_policy(p, rt), args[p])
    trace = spec.trace or shipped_trace()
    load_trajectories(trace)
    load_injection(base.inject)
    preset = None
    if calibration is not None:
        resolve_calibration(calibration)
        if not calibration.is_file():  # a shipped preset: the bench keeps a copy of it
            preset = str(calibration)
    root = out or Path("reports") / f"bench-{datetime.now(UTC):%Y%m%dT%H%M%SZ}"
    pin = pinning.decide(pinning.available_cpus(), url is None, rt.pins_local_server)
    if calibrate_first or preset is not None:
        calibration = root / "calibration.json"
    runs = tuple(replace(base, trace=trace, policy=p, out=root / p, runtime=runtime, url=url,
                         policy_args=args[p], calibration=calibration, pinning=pin)
                 for p in names)
    if rt.per_slot_control and url is None:
        # the local server gets --slots: too few for kept parents beside their sub-agents is
        # refused now, not after a calibration of minutes
        check_subagent_slots(plan_run(runs[0], rt).plan, base.slots)
    # The simulator models slots the harness controls, or the engine a calibration of the
    # same engine describes (vLLM, SGLang), a closed loop and the trace's own tools.
    engine_ok = rt.per_slot_control or (
        rt.name in PREFIX_CACHE_ENGINES and (calibrate_first or (
            calibration is not None and resolve_calibration(calibration).engine_kind == rt.name)))
    simulable = engine_ok and base.inject == "none" and base.arrivals.time_scale == 1.0
    return BenchPlan(root, trace, rt, runs, calibration, calibrate_first, simulable, pin,
                     spec.repeats, spec.pick_slo(), spec.capacity_s(), preset)
