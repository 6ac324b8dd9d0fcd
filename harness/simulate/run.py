"""One simulated run: the same results directory a replay writes (records, run.json, summary).

`Arrivals` is the replay plan's (harness.plan.planner), re-exported for the simulator's callers.
"""

from __future__ import annotations

import gc
import math
import time
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd

from harness import __version__
from harness.errors import InputError
from harness.metrics.summary import summarize_dir
from harness.metrics.summary_types import save_summary
from harness.model.calibration import Calibration
from harness.model.swap_support import check_swap
from harness.plan.planner import Arrivals, poisson_arrivals
from harness.policies import (
    POLICIES,
    SLOT_MODEL_POLICIES,
    check_slot_model_action,
    make_policy,
)
from harness.policies.base import KEEP_EVICTABLE, PausePolicy
from harness.records.manifest import ArrivalsRef, Outcome, RunManifest, TraceRef, read_manifest
from harness.records.store import RECORDS_DIR, RUN_JSON, read_records
from harness.simulate import native
from harness.simulate.engine import SLOT_HANDOFFS, Engine
from harness.simulate.engine_state import LoopRules
from harness.simulate.fleet import Fleet, check_fleet
from harness.simulate.options import DEFAULT_DEADLINE_S as DEFAULT_DEADLINE_S
from harness.simulate.options import FIRST_TOKEN_TIMEOUT_S as FIRST_TOKEN_TIMEOUT_S
from harness.simulate.options import Loop, SimOptions
from harness.simulate.pins import (
    REPLAY_COLUMNS,
    Pins,
    bystander_steps,
    check_same_run,
    pins_from_records,
)
from harness.simulate.records import RecordSink
from harness.simulate.server import (
    BLOCK_SIZE,
    ENGINES,
    LLAMACPP,
    Capacity,
    Counters,
    ServerModel,
)
from harness.simulate.workload import Workload, build_workload
from harness.traces.context import trajectory_starts
from harness.traces.reuse import ideal_reuse_for
from harness.traces.scale import check_token_scale, imported_token_scale, scale_tokens
from harness.traces.schema import KIND_TOOL, file_sha256
from harness.traces.tile import tile_steps
from harness.traces.validate import load_trajectories

__all__ = ["Arrivals", "Loop", "SimOptions", "arrival_times", "check_capacity", "run_simulation",
           "summarize_into"]

SERVER_MODEL_DOC = (
    "continuous batching in iterations: one token per generating call plus prompt chunks (slot "
    "order or arrival order) up to batch_tokens; iteration cost alpha + beta * tokens + "
    "attention (tiled for prompt chunks of >= tiled_rows tokens, row by row otherwise), fitted "
    "from the calibration (harness.model.iteration); requests and control tasks (erase, slot "
    "save/restore, release at trajectory end) wait for the running iteration's end; KV reserved "
    "for prompt + output at admission (but vllm's, below); FCFS admission, resumed "
    "trajectories holding KV grow "
    "first (token pool); swap over one FIFO link per direction; preemption (drop, recompute "
    "later) only of a resumed trajectory waiting to grow while the server is idle and the first "
    "one cannot grow (token pool); a call reaches the server the calibration's "
    "request_overhead_ms after its client sent it (drawn per call, seeded, from "
    "request_overhead_samples_ms where the calibration has them; call_start: when the "
    "server admits it)")
PREFIX_CACHE_DOC = (
    "; {engine}: a token pool in blocks of {block} tokens with a prefix cache: what no call or "
    "pin holds stays cached, evictable, least recently freed first and a context's tail "
    "first; a resumed call reuses the whole blocks left of its context (at least one prompt "
    "token computed); pinned (keep, ttl) contexts hold their blocks; recompute and a TTL's "
    "expiry leave the blocks cached under a fresh salt (never matched); an offload discards "
    "the device blocks and needs room in a host tier of {host} tokens (else the context "
    "stays pinned)")
VLLM_GROWTH_DOC = (
    "; vllm's calls are admitted with their prompt's blocks (not the output's) and given a "
    "block as they decode into it, running calls first; where a running call finds none, the "
    "call admitted last is preempted: its blocks freed (cached, evictable; a pinned context "
    "stays held), readmitted first in line, recomputing what is no longer cached")


def arrival_times(arrivals: Arrivals, w: Workload, n_steps: int, seed: int
                  ) -> np.ndarray | None:
    """Arrival times of the roots, in order (None for a closed loop; sub-agents arrive with
    their parents' steps); Poisson draws follow harness.plan's order, so a simulation and a
    replay of one trace and seed see the same arrivals."""
    if arrivals.mode == "closed":
        return None
    roots = w.roots
    if arrivals.mode == "trace":
        start_s: np.ndarray = np.asarray(w.start_s, dtype=float)[roots]
        return start_s
    rng = np.random.default_rng(seed)
    for _ in range(4):  # the planner draws four per-step uniforms first
        rng.random(n_steps)
    return poisson_arrivals(rng, arrivals, len(roots))


def check_capacity(tokens: int | None, slots: int | None, ctx_per_slot: int | None,
                   engine: str = LLAMACPP, block_size: int | None = None,
                   host_tokens: int | None = None) -> Capacity:
    """Exactly one of a token pool or slots x context, all positive; slots are llama.cpp's
    only. `block_size` (default: the engine's) and `host_tokens` (default: unbounded) apply to
    the engines with a prefix cache."""
    if engine not in ENGINES:
        raise InputError(f"--engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    if tokens is not None and (slots is not None or ctx_per_slot is not None):
        raise InputError("give --capacity-tokens or --slots with --ctx-per-slot, not both")
    if engine != LLAMACPP:
        if tokens is None:
            raise InputError(f"--engine {engine} has a token pool: give --capacity-tokens N "
                             "(its KV cache in tokens; a calibration of the engine that "
                             "measured it gives it), not slots")
        block = BLOCK_SIZE[engine] if block_size is None else block_size
        if block < 1 or (host_tokens is not None and host_tokens < 0) or tokens <= 0:
            raise InputError("--capacity-tokens and the block size must be > 0, the host "
                             "tier's tokens >= 0")
        return Capacity(tokens=tokens, engine=engine, block_size=block, host_tokens=host_tokens)
    if block_size not in (None, 1) or host_tokens is not None:
        raise InputError("a block size and a host tier capacity apply to --engine vllm or "
                         "sglang only")
    if tokens is not None:
        if tokens <= 0:
            raise InputError(f"--capacity-tokens must be > 0, got {tokens}")
        return Capacity(tokens=tokens)
    if slots is None or ctx_per_slot is None:
        raise InputError("give --capacity-tokens N, or --slots S with --ctx-per-slot C")
    if slots <= 0 or ctx_per_slot <= 0:
        raise InputError("--slots and --ctx-per-slot must be > 0")
    return Capacity(slots=slots, ctx_per_slot=ctx_per_slot)


def simulate(w: Workload, server: ServerModel, cap: Capacity, policy: PausePolicy,
             sink: RecordSink, run_id: str, loop: Loop | None = None) -> Counters:
    """Run every trajectory to its end; events go to `sink`; `loop` (default: Loop()) says how.
    `arrival_s`: one arrival time per root (w.roots, in order), None: a closed loop of
    `concurrency` agents taking the roots in order. Sub-agents never arrive on their own: their
    parent's tool step starts them.

    `slot_handoff` (slot mode, closed loop): "fifo", as the replay's slot pool does it: every
    freed slot goes to the longest waiter; "agent": the agent that ends a trajectory starts its
    next one on the slot it just freed, ahead of the calls waiting for a slot.
    `fleet`: K servers like `server` and `cap` each, behind a router (None: one server).
    `seed`: the draws of request overheads where the server model has their distribution.
    `first_token_timeout_s`: the client's (harness.simulate.client; inf: none).
    `pins`: a replay's trajectory starts and tool ends to hold the run to
    (harness.simulate.pins; None: the closed loop's own times).
    """
    lp = loop or Loop()
    arrival_s, concurrency = lp.arrival_s, lp.concurrency
    if lp.slot_handoff not in SLOT_HANDOFFS:
        raise ValueError(f"slot_handoff must be one of {SLOT_HANDOFFS}, got {lp.slot_handoff!r}")
    n = len(w.roots)
    if arrival_s is not None and len(arrival_s) != n:
        raise ValueError(f"{len(arrival_s)} arrival times for {n} root trajectories")
    times = [0.0] * min(concurrency, n) if arrival_s is None else arrival_s.tolist()
    # The cyclic collector would only rescan the loop's objects (and, while the engine builds
    # its 100k+ objects, the whole workload, again and again): the loop makes no garbage
    # cycles. The engine and its scheduler are one cycle, freed when the collector next runs.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    engine: Engine | None = None
    try:
        engine = Engine(w, server, cap, policy, sink, run_id, LoopRules(
            arrival_s is not None, lp.history_window, lp.slot_handoff == "agent", lp.seed,
            lp.first_token_timeout_s, lp.pins, lp.pin_release))
        if lp.fleet is not None:
            lp.fleet.bind(engine)  # sets engine.fleet
        return engine.run(times)
    finally:
        if engine is not None:
            sink.total = engine.cnt
            sink.last_steps = engine.steps_touched()
        if gc_was_enabled:
            gc.enable()


def run_simulation(opts: SimOptions, calibration: Calibration) -> RunManifest:
    """Simulate `opts.trace` under a policy on a server of `calibration`'s rates and write a
    results directory at `opts.out` (harness.simulate.options.SimOptions); returns run.json."""
    o = opts
    trace, policy_name, policy_args, capacity = o.trace, o.policy, o.policy_args, o.capacity
    arrivals, seed, out, servers, router = o.arrivals, o.seed, o.out, o.servers, o.router
    history_window, slot_handoff = o.history_window, o.slot_handoff
    default_deadline_s, first_token_timeout_s = o.default_deadline_s, o.first_token_timeout_s
    token_scale, copies, pinned_to = o.token_scale, o.copies, o.pinned_to
    check_fleet(servers, router)
    if slot_handoff not in SLOT_HANDOFFS:
        raise InputError(f"--slot-handoff must be one of {', '.join(SLOT_HANDOFFS)}")
    if history_window < 0:
        raise InputError("--history-window must be >= 0 (0: every observation)")
    if not (math.isfinite(default_deadline_s) and default_deadline_s > 0):
        raise InputError("--default-deadline-s must be a finite number > 0")
    if not first_token_timeout_s > 0:
        raise InputError("--first-token-timeout must be a number of seconds > 0")
    if arrivals.time_scale != 1.0:
        raise InputError("the simulator runs the trace's own times: time scale 1 only")
    policy = make_policy(policy_name, policy_args)
    check_swap(calibration, policy_name, policy_args, "simulate")
    if (policy_name not in SLOT_MODEL_POLICIES and policy_name in POLICIES
            and not capacity.prefix_cache):
        check_slot_model_action(policy_name, "simulate --engine llamacpp")
    if getattr(policy, "after", None) == KEEP_EVICTABLE and not capacity.prefix_cache:
        check_slot_model_action(KEEP_EVICTABLE, f"simulate --engine llamacpp ({policy_name}'s "
                                "after=keep-evictable)")
    if any((out / RECORDS_DIR).glob("part-*.parquet")):
        raise InputError(f"{out} already holds records; choose a new --out directory")
    t0 = time.perf_counter()
    once = scale_tokens(load_trajectories(trace), check_token_scale(token_scale))
    df = tile_steps(once, copies)
    n_steps = len(df)
    starts = trajectory_starts(df["trajectory_id"].astype(object).to_numpy())
    roots = int(df.loc[starts, "parent_id"].isna().sum())
    agents = int(starts.sum())
    records = replay_records(pinned_to) if pinned_to is not None else None
    bystanders = (replay_bystanders(records, df, starts) if records is not None
                  else df.iloc[:0])
    if len(bystanders):
        df = pd.concat([df, bystanders], ignore_index=True)
    w = replace(build_workload(df, default_deadline_s), bystanders=len(bystanders))
    arrival_s = arrival_times(arrivals, w, n_steps, seed)
    server = server_model(calibration)
    ref = TraceRef(str(trace), file_sha256(trace), roots, n_steps, agents - roots,
                   token_scale * imported_token_scale(trace), ideal_reuse_for(once, policy),
                   copies)
    run = _manifest(o, ref, policy.sees_true_latency, calibration)
    pins = (replay_pins(pinned_to, records, w, run)
            if pinned_to is not None and records is not None else None)
    draws = seed if o.draws_seed is None else o.draws_seed  # the server model's noise, overheads
    # a fleet's own loop (harness.simulate.fleet) is Python around the engine's transitions
    loop = "heapq event loop" if servers == 1 else "heapq event loop of a fleet (python)"
    doc = SERVER_MODEL_DOC
    if capacity.prefix_cache:
        doc += PREFIX_CACHE_DOC.format(
            engine=capacity.engine, block=capacity.block_size,
            host="unbounded" if capacity.host_tokens is None else f"{capacity.host_tokens:,}")
        if capacity.engine == "vllm":
            doc += VLLM_GROWTH_DOC
    run.simulator = {"engine": f"{loop}, {native.ENGINE}",
                     "engine_semantics": capacity.engine,
                     "server_model": doc,
                     "iteration_costs": server.iteration_costs().to_dict(),
                     "history_window": history_window, "slot_handoff": slot_handoff,
                     "default_deadline_s": default_deadline_s,
                     "first_token_timeout_s": (first_token_timeout_s
                                               if math.isfinite(first_token_timeout_s) else None),
                     "servers": servers, "router": router if servers > 1 else None,
                     "draws_seed": draws}
    if pins is not None:
        run.simulator["pinned_to"] = {"replay": pins.source, "path": str(pinned_to),
                                      "pinned_events": pins.pinned,
                                      "bystanders": w.bystanders}
    out.mkdir(parents=True, exist_ok=True)
    run.write(out)
    del df, once
    t_load = time.perf_counter() - t0
    sink = RecordSink(out / RECORDS_DIR, str(run.run_id), w, calibration.kv_bytes_per_token,
                      capacity.context_limit)
    fleet = Fleet(servers, router) if servers > 1 else None
    t1 = time.perf_counter()
    try:
        counters: Counters = simulate(w, server, capacity, policy, sink, str(run.run_id), Loop(
            arrival_s, arrivals.concurrency, history_window, slot_handoff, fleet, draws,
            first_token_timeout_s, pins, o.pin_release))
    finally:
        t_loop = time.perf_counter() - t1
        sink.close()  # whatever was simulated is on disk, even when the loop failed
    if counters.stalled:  # run.json stays as it started ("running"), as for a failed loop
        raise InputError(
            f"{counters.stalled} trajectories never ended: they waited for something that never "
            "came (sub-agents waiting for KV memory that their paused parents keep, without a "
            "deadline and with --first-token-timeout none, or a tool that never returns "
            "without one); give the server more capacity, lower --concurrency, set a "
            "first-token timeout or choose a policy that frees KV during pauses")
    _record_end(run, counters, sink, (t_load, t_loop, time.perf_counter() - t0), fleet)
    run.write(out)
    if o.write_summary:
        summarize_into(out, run)
    return run


def replay_records(replay: Path) -> pd.DataFrame:
    """What pinning to the replay at `replay` reads of its records (its pins, its
    bystanders), read once."""
    if not (replay / RUN_JSON).exists():
        raise InputError(f"--pinned-to {replay}: not a results directory (no {RUN_JSON})")
    return read_records(replay, REPLAY_COLUMNS)


def replay_bystanders(records: pd.DataFrame, df: pd.DataFrame,
                      starts: np.ndarray) -> pd.DataFrame:
    """A replay's bystander requests (its `records`) as one-call trajectories in `df`'s
    columns (`starts`: where its trajectories start; harness.simulate.pins.bystander_steps;
    empty: it had none)."""
    first = df.index[starts & df["parent_id"].isna().to_numpy()
                     & (df["kind"] != KIND_TOOL).to_numpy()]
    if not len(first):
        return df.iloc[:0]
    return bystander_steps(records, df.loc[first[:1]])


def replay_pins(replay: Path, records: pd.DataFrame, w: Workload, sim: RunManifest) -> Pins:
    """The pins of a replay's results directory (its `records`) onto `w`
    (harness.simulate.pins), refused unless the replay ran what the simulation `sim` (its
    run.json) runs."""
    run = read_manifest(replay)
    if run.runtime == "simulator":
        raise InputError(f"--pinned-to {replay}: a simulation; pin to a replay of a server")
    check_same_run(run, sim, f"--pinned-to {replay}")
    return pins_from_records(records, w, str(run.run_id))


def server_model(calibration: Calibration) -> ServerModel:
    """The simulated server's rates, with the calibration's iteration token budget where it
    measured one (else the default)."""
    batch = getattr(calibration, "batch_tokens", None)
    return ServerModel(calibration.prefill_tok_s, calibration.decode_tok_s,
                       calibration.swap_out_bytes_per_s, calibration.swap_in_bytes_per_s,
                       calibration.kv_bytes_per_token, calibration.prefill_points,
                       calibration.decode_points, calibration.append_points,
                       **({"batch_tokens": int(batch)} if batch else {}),
                       request_overhead_s=(calibration.request_overhead_ms or 0.0) / 1000.0,
                       request_overhead_samples_s=tuple(
                           q / 1000.0 for q in calibration.request_overhead_samples_ms),
                       long_append_points=calibration.long_append_points,
                       wake=calibration.wake(), wake_curve=calibration.wake_curve(way=False),
                       way_wake_curve=calibration.way_wake_curve(),
                       noise_samples=calibration.iteration_noise_samples,
                       front_end_s=(calibration.front_end_ms or 0.0) / 1000.0,
                       front_end_cpu_s=(calibration.front_end_cpu_ms or 0.0) / 1000.0,
                       stream_token_s=(calibration.stream_token_ms or 0.0) / 1000.0,
                       free_tokens=calibration.free_tokens or 0)


def _manifest(o: SimOptions, ref: TraceRef, sees_true_latency: bool,
              calibration: Calibration) -> RunManifest:
    """run.json of a simulation as it starts."""
    policy_name, capacity, arrivals, seed = o.policy, o.capacity, o.arrivals, o.seed
    return RunManifest(
        run_id=f"sim-{policy_name}-{ref.sha256[:8]}-s{seed}", runtime="simulator",
        server_version=f"harness-simulator {__version__}",
        model={"name": calibration.model, "kv_bytes_per_token": calibration.kv_bytes_per_token,
               "source": "calibration"},
        policy=policy_name, policy_args=dict(o.policy_args),
        policy_sees_true_latency=sees_true_latency,
        capacity={"mode": "slots" if capacity.slot_mode else "tokens",
                  "tokens": capacity.tokens, "slots": capacity.slots,
                  "ctx_per_slot": capacity.ctx_per_slot, "engine": capacity.engine,
                  **({"block_size": capacity.block_size, "host_tokens": capacity.host_tokens}
                     if capacity.prefix_cache else {})},
        slots=capacity.slots, ctx_per_slot=capacity.ctx_per_slot,
        calibration={**calibration.to_dict(),
                     "path": str(o.calibration_path) if o.calibration_path else None},
        trace=ref, seed=seed,
        # reuse is in whole blocks: up to one block of a kept context is computed again, which
        # the mismatch check tolerates as it does a live run's
        cache_block_tokens=capacity.block_size if capacity.prefix_cache else None,
        arrivals=ArrivalsRef(arrivals.mode, arrivals.concurrency, arrivals.rate, 1.0),
        harness_version=__version__, started_at=datetime.now(UTC).isoformat(),
        status="running", spec=o.spec)


def _record_end(run: RunManifest, counters: Counters, sink: RecordSink,
                wall_s: tuple[float, float, float], fleet: Fleet | None) -> None:
    run.status, run.duration_s = "finished", counters.sim_time_s
    run.outcome = Outcome(counters.completed, counters.cancelled, counters.failed, 0)
    load, loop, total = wall_s
    assert run.simulator is not None
    run.simulator.update({
        "pauses": counters.pauses, "preemptions": counters.preemptions,
        "preempted_calls": counters.preempted_calls,
        "control_requests": counters.control_requests,
        "evicted_tokens": counters.evicted_tokens, "swaps_refused": counters.swaps_refused,
        "pins_released": counters.pins_released,
        "events": counters.events, "records": sink.n_rows, "record_writer": sink.writer,
        "wall_s": {"load": round(load, 3), "loop": round(loop, 3), "total": round(total, 3)},
    })
    pinned = run.simulator.get("pinned_to")
    if pinned is not None:  # the pinned events the simulation reached after the replay's time
        pinned.update({"late": counters.late, "late_s": round(counters.late_s, 6),
                       "late_max_s": round(counters.late_max_s, 6)})
    if fleet is not None:  # what the router did (summary.json's `routing` has it per call)
        run.simulator["routing"] = fleet.report()


def summarize_into(out: Path, run: RunManifest) -> None:
    """summary.json from the records."""
    save_summary(out, summarize_dir(out, run=run))
