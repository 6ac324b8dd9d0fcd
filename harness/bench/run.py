"""A bench's work: the replays of every policy (round by round with repeats), each one's
prediction and simulation given a calibration, one report; then, on request, the advisor's pick
in simulation and a capacity search of the bench's policies."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from harness.advise.candidates import SPACE
from harness.advise.run import AdvisePlan, advise
from harness.bench.plan import BenchPlan
from harness.bench.result import BenchPick, BenchResult, Replay
from harness.calibrate.drift import recheck
from harness.calibrate.measure import CalibratedServer, calibrate, reported_kv
from harness.capacity.driver import SearchSettings, SearchSpec
from harness.capacity.result import CapacityResult
from harness.capacity.run import CapacityPlan, run_capacity
from harness.errors import InputError
from harness.metrics.summary_types import Summary, read_summary
from harness.model.analytical import Rates, evaluate
from harness.model.calibration import (
    Calibration,
    calibration_label,
    check_swap,
    read_calibration,
    resolve_calibration,
    write_calibration,
)
from harness.model.engines import PREFIX_CACHE_ENGINES
from harness.model.inputs import pauses_from_trace
from harness.model.run_rates import SERVER_SPEED_JSON, server_speed, speed_doc
from harness.plan.injection import Injection
from harness.policies import POLICIES, SLOT_MODEL_POLICIES, make_policy
from harness.records.atomic import write_text_atomic
from harness.records.manifest import RunManifest, read_manifest
from harness.records.store import SUMMARY_JSON, ensure_out_dir, read_records, write_json
from harness.replay.options import RunOptions
from harness.replay.run import execute_run, to_stderr
from harness.replay.runner import redact_url
from harness.report.render import render_report
from harness.report.repeats import repeat_dirs, write_repeats
from harness.simulate.options import SimOptions
from harness.simulate.run import FIRST_TOKEN_TIMEOUT_S, Arrivals, check_capacity, run_simulation
from harness.simulate.server import Capacity

# The advisor's pick and the capacity search judge each point over this window.
POINT_DURATION_S = 45.0
POINT_WARMUP_S = 10.0


def predict(trace: Path, policy: str, calibration: Path) -> dict[str, Any]:
    """The analytical model's figures for one policy over the trace's pauses, keyed so the
    report can set them beside the measured ones: the restore part of resume latency (swap-in
    or re-prefill; queueing and the appended tokens' prefill are not modelled), bytes moved,
    tokens recomputed."""
    cal = read_calibration(calibration)
    pauses = pauses_from_trace(trace, Injection().default_deadline_s)
    rates = Rates(prefill_tok_s=cal.prefill_tok_s, swap_out_bytes_per_s=cal.swap_out_bytes_per_s,
                  swap_in_bytes_per_s=cal.swap_in_bytes_per_s,
                  prefill_points=cal.prefill_points, source="calibration")
    totals = evaluate({policy: make_policy(policy)}, pauses, cal.kv_bytes_per_token,
                      rates)[policy].totals()
    resume = totals["resume_ms"]
    return {policy: {"restore_ms_p50": resume["p50"], "restore_ms_p95": resume["p95"],
                     "restore_ms_p99": resume["p99"],
                     "bytes_moved": totals["bytes_moved"]["total"],
                     "tokens_recomputed": totals["tokens_recomputed"]["total"],
                     "source": f"harness model, calibration {calibration}"}}


def engine_pool(real: RunManifest) -> Capacity | None:
    """The KV pool a vLLM or SGLang replay's server reported (run.json `server_extra`), as the
    engine model's capacity; None for another runtime or a server that did not say. vLLM
    counts one block more than it can use (its null block)."""
    if real.runtime not in PREFIX_CACHE_ENGINES:
        return None
    block, tokens, _ = reported_kv(real.runtime, real.server_extra or {}, real.slots,
                                   real.ctx_per_slot)
    if block is None or tokens is None:
        return None
    usable = tokens - block if real.runtime == "vllm" else tokens
    return check_capacity(usable, None, None, real.runtime, block)


def simulate_like(real_dir: Path, trace: Path, policy: str, policy_args: dict[str, str],
                  calibration: Path, out: Path, draws_seed: int | None = None,
                  pinned: bool = False) -> RunManifest:
    """The simulator on what a replay in `real_dir` ran: the same trace, policy, closed-loop
    agents and seed, and memory (llama.cpp: slots x context; vLLM, SGLang: the engine model on
    the KV pool the server reported), and the client's first-token timeout, its costs from
    `calibration` only (`draws_seed`: run_simulation's; `pinned`: held to the replay's own
    trajectory starts and tool ends, harness.simulate.pins)."""
    real = read_manifest(real_dir)
    if real.arrivals is None or real.seed is None:
        raise InputError(f"{real_dir}: run.json lacks the arrivals or seed to simulate it")
    if real.runtime in PREFIX_CACHE_ENGINES:
        pool = engine_pool(real)
        if pool is None:
            raise InputError(f"{real_dir}: run.json lacks the {real.runtime} server's KV pool "
                             "(server_extra) to simulate it")
        cap = pool
    else:
        cap = check_capacity(None, real.slots, real.ctx_per_slot)
    arrivals = Arrivals("closed", int(real.arrivals.concurrency))
    return run_simulation(SimOptions(trace, policy, policy_args, cap, calibration, arrivals,
                                     int(real.seed), out,
                                     token_scale=real.trace.token_scale if real.trace else 1.0,
                                     first_token_timeout_s=replay_first_token_timeout(real),
                                     draws_seed=draws_seed,
                                     pinned_to=real_dir if pinned else None),
                          read_calibration(calibration))


def replay_first_token_timeout(real: RunManifest) -> float:
    """The first-token timeout the replay's client ran with (run.json http.timeouts_s), or
    the client's default where run.json does not say."""
    timeouts = (real.http or {}).get("timeouts_s") or {}
    value = timeouts.get("first_byte_s")
    return float(value) if isinstance(value, int | float) and value > 0 else FIRST_TOKEN_TIMEOUT_S


def run_bench(plan: BenchPlan, echo: Callable[[str], None] = print) -> BenchResult:
    """Run a bench plan: calibrate first if asked (and re-check it after the replays: each
    rate's drift in calibration-drift.json beside it), replay each policy (and simulate it where
    that applies; with repeats, the first round), render one report; returns each replay with
    its summary, named by policy (and `#k` for repeat k), and what was measured beside them.
    With repeats, each policy's directory gets repeats.json, the spread between its repeats."""
    if plan.preset is not None and plan.calibration is not None:
        cal = resolve_calibration(plan.preset)
        ensure_out_dir(plan.root)
        write_calibration(plan.calibration, cal)
        echo(f"calibration: {calibration_label(plan.preset, cal)}, copied to "
             f"{plan.calibration}")
    if plan.calibrate_first and plan.calibration is not None:
        first = plan.runs[0]
        echo(f"calibrating {redact_url(first.url) if first.url else 'a local server'} ...")
        ensure_out_dir(plan.root)
        # the replays' server settings: a small KV pool needs their context length too
        # ... and their metrics sampling, which the server's wake after idle time depends on
        calibrate(plan.calibration, CalibratedServer(
            first.runtime, first.url, server_args=first.server_args, pin=plan.pinning,
            ctx_per_slot=first.ctx_per_slot), sampling_s=first.scrape_interval_s)
    replays: list[Replay] = []
    dirs: list[Path] = []
    t0 = time.monotonic()
    for k, round_runs in enumerate(plan.rounds(), 1):
        for o in round_runs:
            name = o.policy if plan.repeats == 1 else f"{o.policy}#{k}"
            echo(f"[{time.monotonic() - t0:6.0f}s] {name}: replaying {plan.trace} ...")
            run = execute_run(o, to_stderr, plan.runtime)
            dirs.append(o.out)
            speed = None
            if plan.calibration is not None:
                sim, speed = model_runs(plan, o, plan.calibration, simulate=k == 1)
                dirs += sim
            summary = read_summary(o.out) if (o.out / SUMMARY_JSON).exists() else Summary()
            replays.append(Replay(name, o.policy, o.out, run, summary, speed))
            c = run.outcome
            echo(f"[{time.monotonic() - t0:6.0f}s] {name}: {c.completed if c else 0} "
                 f"completed, {c.cancelled if c else 0} cancelled, {c.failed if c else 0} "
                 "failed")
    check_same_pinning([r.run for r in replays])
    drift = None
    if plan.calibrate_first and plan.calibration is not None:
        first = plan.runs[0]
        echo(f"[{time.monotonic() - t0:6.0f}s] re-checking the calibration (drift) ...")
        drift = recheck(plan.calibration, first.runtime, first.url, first.server_args,
                        plan.pinning, first.ctx_per_slot)
    spreads = {o.policy: write_repeats(o.out, repeat_dirs(o.out, plan.repeats))
               for o in plan.runs} if plan.repeats > 1 else {}
    result = BenchResult(plan.root, replays, drift, spreads)
    write_text_atomic(result.report, render_report(dirs))
    return result


def model_runs(plan: BenchPlan, o: RunOptions, calibration: Path, simulate: bool
               ) -> tuple[list[Path], dict[str, Any] | None]:
    """After a policy's replay: the analytical prediction beside it (the slot model prices
    what a slot server does: no engine's evictable cache, and swap's bandwidth, which an
    engine without swap has none of), and its simulation where the bench simulates; returns
    the simulated run's directory, if any, and beside a simulated replay the server's speed
    during it against the calibration (written to SERVER_SPEED_JSON, harness.model.run_rates),
    None elsewhere."""
    cal = read_calibration(calibration)
    if o.policy in SLOT_MODEL_POLICIES and cal.has_swap:
        write_json(o.out / "prediction.json", predict(plan.trace, o.policy, calibration))
    if not (simulate and plan.simulable
            and simulable_policy(o.policy, o.policy_args, cal, plan.runtime.name)):
        return [], None
    sim = plan.root / f"{o.policy}-simulated"
    simulate_like(o.out, plan.trace, o.policy, o.policy_args, calibration, sim)
    # How fast the server computed during the replay against the calibration the simulation
    # was priced with: the first cause to look at when the two disagree.
    doc = speed_doc(server_speed(read_records(o.out), cal), str(calibration))
    write_json(o.out / SERVER_SPEED_JSON, doc)
    return [sim], doc


def simulable_policy(policy: str, args: dict[str, str], cal: Calibration,
                     runtime: str) -> bool:
    """Whether the simulator runs `policy` as the replay did: a client policy (not a server's
    own), an action the engine model has (keep-evictable only with a prefix cache), swap only
    where the calibrated engine has it."""
    if policy not in POLICIES or (runtime not in PREFIX_CACHE_ENGINES
                                  and policy not in SLOT_MODEL_POLICIES):
        return False
    try:
        check_swap(cal, policy, args)
    except InputError:
        return False
    return True


def check_same_pinning(runs: list[RunManifest]) -> None:
    """RuntimeError when the runs of one bench did not all run under the same CPU pinning:
    their numbers would not be comparable."""
    seen = {repr(r.cpu_pinning) for r in runs}
    if len(seen) > 1:
        raise RuntimeError(f"the bench's policies ran under different CPU pinning: {seen}")


def bench_pick(plan: BenchPlan) -> BenchPick:
    """The advisor's pick on the bench's server settings, in simulation with the bench's
    calibration, under the bench's SLO (harness.advise, unconfirmed, into <out>/advice): the
    recommended candidate with its predicted capacity and resume P95 there."""
    if plan.calibration is None:
        raise InputError("the advisor's pick needs a calibration (--calibration or --calibrate)")
    o = plan.runs[0]
    search = SearchSpec(plan.slo, 7 * 86_400.0, POINT_DURATION_S, POINT_WARMUP_S,
                        SearchSettings(confirm=False))
    if plan.runtime.name in PREFIX_CACHE_ENGINES:  # the KV pool the replays' server reported
        pool = engine_pool(read_manifest(o.out))
        if pool is None or pool.tokens is None:
            raise InputError(f"{o.out}: run.json lacks the server's KV pool for the advisor")
        aplan = AdvisePlan(plan.root / "advice", plan.trace, plan.calibration, "capacity", (),
                           (), (), search, o, kv_tokens=(pool.tokens,))
    else:
        aplan = AdvisePlan(plan.root / "advice", plan.trace, plan.calibration, "capacity",
                           tuple(SPACE), (o.slots,), (o.ctx_per_slot,), search, o)
    return BenchPick.of(advise(aplan, lambda _m: None))


def bench_capacity(plan: BenchPlan, echo: Callable[[str], None] = print) -> CapacityResult:
    """A capacity search of the bench's policies on its server under the bench's SLO, for
    `plan.capacity_s` seconds (into <out>/capacity); returns its result (capacity.json)."""
    if plan.capacity_s is None:
        raise InputError("--capacity needs --slo (e.g. --slo resume_p95=2000ms)")
    o = plan.runs[0]
    cplan = CapacityPlan(plan.root / "capacity", plan.trace, plan.slo,
                         tuple((r.policy, r.policy_args) for r in plan.runs),
                         replace(o, pinning=plan.pinning), plan.capacity_s, POINT_DURATION_S,
                         POINT_WARMUP_S, SearchSettings())
    return run_capacity(cplan, echo, plan.runtime)
