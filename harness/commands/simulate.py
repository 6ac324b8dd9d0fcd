"""`harness simulate`: run a trace through the discrete-event server model under one policy (one
server, or a fleet of identical servers behind a router: harness.simulate.fleet)."""

from __future__ import annotations

import click

from harness.commands.options import Command
from harness.commands.specopts import spec_options
from harness.model.calibration import resolve_calibration
from harness.records.manifest import Outcome
from harness.simulate.fleet import fleet_line
from harness.simulate.run import run_simulation
from harness.specs.simulate import SimSpec


@click.command("simulate", cls=Command)
@spec_options(SimSpec)
def simulate_command(spec: SimSpec) -> None:
    """Simulate TRACE on a modelled server; writes the results directory a replay writes."""
    simulate_job(spec)


def simulate_job(spec: SimSpec) -> None:
    """Run the simulation `spec` asks for and print what it did."""
    cal = resolve_calibration(spec.calibration, note=click.echo)
    opts = spec.options(cal)
    run = run_simulation(opts, cal)
    policy, out, cap, k, router = spec.policy, spec.out, opts.capacity, spec.servers, spec.router
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

