"""`harness simulate`: run a trace through the discrete-event server model under one policy (one
server, or a fleet of identical servers behind a router: harness.simulate.fleet)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal

import click

from harness.commands.options import Command
from harness.errors import InputError
from harness.limits import MAX_SEED
from harness.model.calibration import DEFAULT_PRESET, resolve_calibration
from harness.policies import parse_policy_args
from harness.records.manifest import Outcome
from harness.simulate.fleet import ROUND_ROBIN, ROUTERS, check_fleet, fleet_line
from harness.simulate.run import (
    DEFAULT_DEADLINE_S,
    FIRST_TOKEN_TIMEOUT_S,
    Arrivals,
    check_capacity,
    run_simulation,
)
from harness.simulate.server import ENGINES, LLAMACPP

# The counts that size the simulator's memory, bounded: (low, high) per flag.
MAX_SERVERS = 1024
BOUNDS: dict[str, tuple[int, int]] = {
    "--servers": (1, MAX_SERVERS), "--slots": (1, 65_536), "--ctx-per-slot": (1, 16_777_216),
    "--capacity-tokens": (1, 10**12), "--concurrency": (1, 100_000),
    "--block-size": (1, 1 << 20), "--host-tokens": (0, 10**13),
    "--history-window": (0, 10**9)}


def _int(flag: str, raw: str | None) -> int | None:
    """An integer flag taken as text; InputError naming the flag for junk, or for a count
    outside its BOUNDS."""
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise InputError(f"{flag} {raw!r}: not an integer") from None
    low, high = BOUNDS.get(flag, (-(2**63), 2**63))
    if not low <= value <= high:
        raise InputError(f"{flag} must be in [{low:,}, {high:,}], got {value:,}")
    return value


def _seed(raw: str) -> int:
    seed = _int("--seed", raw) or 0
    if not 0 <= seed <= MAX_SEED:
        raise InputError(f"--seed must be in [0, {MAX_SEED}], got {seed}")
    return seed


def _float(flag: str, raw: str | None) -> float | None:
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise InputError(f"{flag} {raw!r}: not a number") from None
    if not math.isfinite(value):
        raise InputError(f"{flag} must be a finite number, got {raw!r}")
    return value


@click.command("simulate", cls=Command)
@click.option("--trace", "trace", required=True, type=click.Path(path_type=Path))
@click.option("--policy", required=True, help="keep, swap, recompute, ttl, threshold, ...")
@click.option("--policy-arg", "policy_args", multiple=True, metavar="KEY=VALUE")
@click.option("--capacity-tokens", help="KV capacity as a token pool.")
@click.option("--slots", help="KV capacity as llama.cpp slots (with --ctx-per-slot).")
@click.option("--ctx-per-slot", help="Context tokens per slot.")
@click.option("--engine", type=click.Choice(ENGINES),
              help="Memory semantics: llamacpp (slots, or a plain token pool; nothing cached "
                   "once dropped) or vllm / sglang (a paged prefix cache: what no call or pin "
                   "holds stays cached, evictable, least recently freed first). Default: the "
                   "calibration's engine, else llamacpp.")
@click.option("--block-size", help="vllm/sglang: tokens per KV block (default: the "
                                   "calibration's, else 16 for vLLM, 1 for SGLang).")
@click.option("--host-tokens", help="vllm/sglang: the host tier's capacity for swap, in tokens "
                                    "(default: unbounded); an offload that does not fit is "
                                    "refused and the context stays pinned.")
@click.option("--calibration", default=DEFAULT_PRESET, show_default=True,
              type=click.Path(path_type=Path),
              help="Rates: a file from `harness calibrate`, or a shipped preset's name "
                   "(harness calibrate --list).")
@click.option("--concurrency", help="Closed loop: N agents (default 4).")
@click.option("--rate", help="Open loop: Poisson arrivals per second.")
@click.option("--trace-timing", is_flag=True, help="Open loop: the trace's start_s.")
@click.option("--seed", default="0", show_default=True)
@click.option("--history-window", default="1000", show_default=True,
              help="Latencies per tool class a policy sees (0: all, as the replay).")
@click.option("--default-deadline-s", default=str(DEFAULT_DEADLINE_S), show_default=True,
              help="Deadline of tool steps without one.")
@click.option("--first-token-timeout", default=f"{FIRST_TOKEN_TIMEOUT_S:g}", show_default=True,
              help="The client's, in seconds, as `harness run --first-token-timeout`: a call "
                   "without its first token that long after it was sent fails its trajectory "
                   "(what it holds is released); 'none': calls wait as long as it takes.")
@click.option("--slot-handoff", default="fifo", show_default=True,
              help="Closed loop, slots: 'fifo' (as the replay: a freed slot goes to the longest "
                   "waiter) or 'agent' (an agent that ends a trajectory starts its next one on "
                   "the slot it freed, ahead of the waiters).")
@click.option("--token-scale", type=float, default=1.0, show_default=True,
              help="Multiply every token count of the trace by this (rounded up), as "
                   "`harness run --token-scale` does.")
@click.option("--servers", default="1", show_default=True,
              help="K identical servers (each with the calibration and the capacity given) "
                   f"behind --router, at most {MAX_SERVERS:,}.")
@click.option("--router", default=ROUND_ROBIN, show_default=True,
              help=f"With --servers > 1, one of {', '.join(ROUTERS)}: 'round-robin' sends each "
                   "LLM call to the next server in turn (a resumed call that moves prefills its "
                   "whole context again there; its KV on the old server is released); "
                   "'prefix-affinity' sends every call of a trajectory to the server of its "
                   "first call, a new trajectory (or sub-agent) to the server with the fewest "
                   "trajectories assigned (ties: lowest index).")
@click.option("--pinned-to", "pinned_to", type=click.Path(path_type=Path), metavar="REPLAY_DIR",
              help="The engine model alone: start every trajectory and end every tool when "
                   "this replay of the same trace (same --token-scale, copies, --concurrency "
                   "and --seed) did, never earlier than the simulation reaches them, so its "
                   "calls meet the company the replay's met; run.json counts those reached "
                   "late.")
@click.option("--no-summary", is_flag=True, help="Skip summary.json.")
@click.option("--out", required=True, type=click.Path(path_type=Path))
def simulate_command(trace: Path, policy: str, policy_args: tuple[str, ...],
                     capacity_tokens: str | None, slots: str | None,
                     ctx_per_slot: str | None, engine: str | None, block_size: str | None,
                     host_tokens: str | None, calibration: Path, concurrency: str | None,
                     rate: str | None, trace_timing: bool, seed: str, history_window: str,
                     default_deadline_s: str, first_token_timeout: str, slot_handoff: str,
                     token_scale: float,
                     servers: str, router: str, pinned_to: Path | None, no_summary: bool,
                     out: Path) -> None:
    """Simulate TRACE on a modelled server; writes the results directory a replay writes."""
    k = _servers(servers)
    check_fleet(k, router)
    if pinned_to is not None and k > 1:
        raise InputError("--pinned-to holds one server's simulation to a replay: not with "
                         "--servers")
    if sum(x is not None and x is not False for x in (concurrency, rate, trace_timing)) > 1:
        raise InputError("choose one of --concurrency, --rate, --trace-timing")
    cal = resolve_calibration(calibration, note=click.echo)
    kind = engine or (cal.engine_kind if cal.engine_kind in ENGINES else LLAMACPP)
    tokens = _int("--capacity-tokens", capacity_tokens)
    block = _int("--block-size", block_size)
    if kind != LLAMACPP:  # what the calibrated server reported, unless told otherwise
        if tokens is None and slots is None and ctx_per_slot is None:
            tokens = cal.kv_capacity_tokens
        if block is None and cal.engine_kind == kind:
            block = cal.block_size
    cap = check_capacity(tokens, _int("--slots", slots), _int("--ctx-per-slot", ctx_per_slot),
                         kind, block, _int("--host-tokens", host_tokens))
    conc = _int("--concurrency", concurrency)  # bounded: >= 1
    r = _float("--rate", rate)  # finite
    if r is not None and r <= 0:
        raise InputError("--rate must be a finite number > 0")
    mode: Literal["closed", "poisson", "trace"] = (
        "poisson" if r is not None else "trace" if trace_timing else "closed")
    arrivals = Arrivals(mode, conc or 4, r or 1.0)
    run = run_simulation(trace, policy, parse_policy_args(policy_args), cap, cal, calibration,
                         arrivals, _seed(seed), out,
                         _int("--history-window", history_window) or 0,
                         _float("--default-deadline-s", default_deadline_s) or 0.0,
                         write_summary=not no_summary, slot_handoff=slot_handoff,
                         token_scale=token_scale, servers=k, router=router,
                         first_token_timeout_s=_timeout(first_token_timeout),
                         pinned_to=pinned_to)
    o, s = run.outcome or Outcome(), run.simulator or {}
    click.echo(f"{policy}: {o.completed} completed, {o.cancelled} cancelled, "
               f"{o.failed} failed; {s['pauses']} pauses, {s['preemptions']} preemptions; "
               f"{run.duration_s or 0:.1f} s simulated in {s['wall_s']['total']:.2f} s -> {out}")
    if cap.prefix_cache:
        click.echo(f"{cap.engine} engine model, {cap.tokens:,}-token pool in blocks of "
                   f"{cap.block_size}: {s['evicted_tokens']:,} tokens evicted from its prefix "
                   f"cache, {s['swaps_refused']} offloads refused (host tier full)"
                   + (f", {s['preempted_calls']} running calls preempted for memory, "
                      f"{s['control_requests']} pause controls sent as requests"
                      if cap.engine == "vllm" else ""))
    if cal.front_end_ms or cal.front_end_cpu_ms or cal.stream_token_ms:
        click.echo(f"the server's front end (the calibration's): {cal.front_end_ms or 0.0:.2f} ms "
                   f"a request in turn, {cal.front_end_cpu_ms or 0.0:.2f} ms of the engine's "
                   f"compute a request, {cal.stream_token_ms or 0.0:.3f} ms a streamed token"
                   + ("; not modelled across a fleet's servers" if k > 1 else ""))
    if "routing" in s:
        click.echo(fleet_line(k, router, s["routing"]))
    if "pinned_to" in s:
        p = s["pinned_to"]
        click.echo(f"pinned to replay {p['replay']}: {p['pinned_events']} trajectory starts and "
                   f"tool ends held to its times, {p['late']} reached later (by up to "
                   f"{p['late_max_s']:.3f} s)")


def _timeout(raw: str) -> float:
    if raw.strip().lower() == "none":
        return math.inf
    value = _float("--first-token-timeout", raw)
    if value is None or value <= 0:
        raise InputError(f"--first-token-timeout must be seconds > 0 or 'none', got {raw!r}")
    return value


def _servers(raw: str) -> int:
    try:
        int(raw)
    except ValueError:
        raise InputError(f"--servers must be an integer >= 1, got {raw!r}") from None
    servers = _int("--servers", raw)
    assert servers is not None
    return servers
