"""`harness bench`: the main job. One trace, several policies, one local server per policy.

Prints a headline table (resume latency P50/P95/P99, outcomes, tokens recomputed, bytes moved,
cache mismatches per policy), and writes one HTML report comparing the policies.
"""

from __future__ import annotations

from pathlib import Path

import click

from harness.adapters.http import Timeouts
from harness.bench.plan import DEFAULT_PICK_SLO, DEFAULT_POLICIES, BenchPlan, plan_bench
from harness.bench.run import bench_capacity, bench_pick, run_bench
from harness.bench.table import headline_table, health_lines, retention_table
from harness.calibrate.drift import drift_lines
from harness.capacity.budget import parse_span
from harness.capacity.run import result_table
from harness.capacity.slo import parse_slo
from harness.commands.exits import exit_on_server_failures
from harness.commands.options import (
    Command,
    arrivals_from_flags,
    auth_options,
    check_run_flags,
    runtime_option,
    scrape_interval_option,
    seed_option,
    timeout_options,
    token_scale_option,
    url_option,
)
from harness.errors import InputError
from harness.model.run_rates import speed_line
from harness.policies import POLICIES
from harness.replay.options import RunOptions
from harness.report.repeats import format_spread
from harness.selftest.result import read_selftest


@click.command("bench", cls=Command)
@runtime_option()
@url_option("A running server (default: start a local server per policy).")
@click.option("--trace", "trace_path", type=click.Path(path_type=Path),
              help="Trajectory file (default: the shipped traces/bench-small.parquet).")
@click.option("--policies", help=f"Comma-separated, from: {', '.join(POLICIES)} and the "
              "runtime's server policies (default: the runtime's, e.g. "
              f"{','.join(DEFAULT_POLICIES)}).")
@click.option("--policy-arg", "policy_args", multiple=True, metavar="[POLICY.]KEY=VALUE",
              help="A policy argument; POLICY.KEY=VALUE for one policy (e.g. ttl.tau=2), "
                   "KEY=VALUE for every policy of the bench that takes KEY.")
@click.option("--inject", default="none", show_default=True)
@click.option("--concurrency", type=int, default=6, show_default=True)
@click.option("--time-scale", type=float, default=1.0, show_default=True)
@token_scale_option
@seed_option
@click.option("--slots", type=int, default=4, show_default=True)
@click.option("--ctx-per-slot", type=int, default=4096, show_default=True)
@scrape_interval_option
@click.option("--calibration", type=click.Path(path_type=Path),
              help="Rates from `harness calibrate`, or a shipped preset's name (harness "
                   "calibrate --list): policies price actions with them, each "
                   "policy's directory gets the analytical prediction (prediction.json), and "
                   "(llama.cpp, closed loop, no injection, time scale 1) the simulator runs "
                   "each policy too (<policy>-simulated), compared in the report.")
@click.option("--calibrate", "calibrate_first", is_flag=True,
              help="llama.cpp, vLLM, SGLang: measure the server first (harness calibrate, "
                   "written to <out>/calibration.json) and use it as --calibration: rates "
                   "measured next to the replays they predict; re-measured briefly after the "
                   "replays, each rate's drift in <out>/calibration-drift.json.")
@click.option("--server-arg", "server_args", multiple=True,
              help="Extra flag for the local server, repeatable (e.g. -ngl 99).")
@click.option("--out", type=click.Path(path_type=Path),
              help="Results root (default: reports/bench-<UTC time>).")
@click.option("--selftest", "selftest", type=click.Path(path_type=Path),
              help="A `harness selftest` file: its instrument error goes into each run.json.")
@click.option("--repeats", type=click.IntRange(1, 100), default=1, show_default=True,
              help="Run every policy N times, round by round (<policy>/repeat-1 ...); each "
                   "policy's spread between its repeats goes to <policy>/repeats.json and is "
                   "printed, and the report sets the repeats side by side.")
@click.option("--slo", "slo_spec",
              help="The SLO for --capacity and for the advisor's pick (which runs with a "
                   f"calibration; default {DEFAULT_PICK_SLO}), e.g. resume_p95=2000ms.")
@click.option("--capacity", "capacity_search", is_flag=True,
              help="After the replays, a capacity search of every policy under --slo "
                   "(harness capacity, into <out>/capacity).")
@click.option("--capacity-budget", default="10m", show_default=True,
              help="Wall time for the --capacity search.")
@timeout_options
@auth_options
def bench_command(runtime: str, url: str | None, trace_path: Path | None,
                  policies: str | None, policy_args: tuple[str, ...], inject: str,
                  concurrency: int, time_scale: float, seed: int, slots: int,
                  ctx_per_slot: int, scrape_interval: float, calibration: Path | None,
                  calibrate_first: bool,
                  server_args: tuple[str, ...], out: Path | None, selftest: Path | None,
                  repeats: int, timeouts: Timeouts, headers: dict[str, str],
                  skip_oversized: bool, token_scale: float, slo_spec: str | None,
                  capacity_search: bool, capacity_budget: str) -> None:
    """Replay one trace under several policies and compare them in one report."""
    if capacity_search and not slo_spec:
        raise InputError("--capacity needs --slo (e.g. --slo resume_p95=2000ms)")
    slo = parse_slo(slo_spec or DEFAULT_PICK_SLO)
    capacity_s = parse_span("--capacity-budget", capacity_budget, 60.0, 7 * 86_400.0)
    check_run_flags(slots=slots, ctx_per_slot=ctx_per_slot, time_scale=time_scale,
                    scrape_interval=scrape_interval)
    base = RunOptions(trace=Path(), policy="", out=Path(), inject=inject, timeouts=timeouts,
                      headers=headers, skip_oversized=skip_oversized, token_scale=token_scale,
                      arrivals=arrivals_from_flags(concurrency, None, False, time_scale),
                      seed=seed, slots=slots, ctx_per_slot=ctx_per_slot,
                      scrape_interval_s=scrape_interval, server_args=server_args,
                      instrument_error=read_selftest(selftest) if selftest else None)
    plan = plan_bench(runtime, url, trace_path, policies, policy_args, base, calibration,
                      calibrate_first, out, repeats=repeats, slo=slo,
                      capacity_s=capacity_s if capacity_search else None)
    result = run_bench(plan, click.echo)
    rows = result.rows()
    click.echo("")
    click.echo(headline_table(rows))
    retained = retention_table(rows)
    if retained is not None:
        click.echo(retained)
    for line in health_lines(rows):
        click.echo(line)
    if result.drift is not None:
        click.echo("")
        for line in drift_lines(result.drift):
            click.echo(line)
    speeds = result.server_speeds()
    if speeds:
        click.echo("\nserver speed during each replay against the calibration (calls that ran "
                   "alone; x2.00: half as fast as calibrated):")
        for policy, doc in speeds:
            click.echo(speed_line(policy, doc))
    for policy, spread in result.spreads.items():
        click.echo(f"\nspread between the {plan.repeats} repeats of {policy}:")
        click.echo(format_spread(spread))
    if plan.calibration is not None and plan.simulable:
        _show_pick(plan)
    if plan.capacity_s is not None:
        click.echo(f"\ncapacity search under {slo.spec()} (budget {plan.capacity_s:.0f} s) ...")
        click.echo(result_table(bench_capacity(plan, click.echo)))
        click.echo(f"capacity report: {plan.root / 'capacity' / 'report.html'}")
    click.echo(f"\nresults: {plan.root}\nreport:  {result.report}")
    exit_on_server_failures([r.run for r in result.replays])


def _show_pick(plan: BenchPlan) -> None:
    """The advisor's pick on the bench's server settings, in simulation with the bench's
    calibration (<out>/advice/advice.json); `harness advise` confirms one on the server."""
    pick = bench_pick(plan)
    p95 = pick.resume_p95_ms
    click.echo(f"\nadvisor's pick (simulated with {plan.calibration}, SLO {plan.slo.spec()}): "
               f"{pick.label}, predicted capacity {pick.capacity} agents"
               + (f", resume P95 {p95:,.0f} ms there" if p95 is not None else "")
               + "; not confirmed on the server (harness advise confirms it)")
