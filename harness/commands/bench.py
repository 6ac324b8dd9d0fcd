"""`harness bench`: the main job. One trace, several policies, one local server per policy.

Prints a headline table (resume latency P50/P95/P99, outcomes, tokens recomputed, bytes moved,
cache mismatches per policy), and writes one HTML report comparing the policies.
"""

from __future__ import annotations

import click

from harness.bench.plan import BenchPlan, plan_bench
from harness.bench.run import bench_capacity, bench_pick, run_bench
from harness.bench.table import headline_table, health_lines, retention_table
from harness.calibrate.drift import drift_lines
from harness.capacity.run import result_table
from harness.commands.exits import exit_on_server_failures
from harness.commands.options import Command
from harness.commands.specopts import spec_options
from harness.model.run_rates import speed_line
from harness.report.repeats import format_spread
from harness.specs.bench import BenchSpec


@click.command("bench", cls=Command)
@spec_options(BenchSpec)
def bench_command(spec: BenchSpec) -> None:
    """Replay one trace under several policies and compare them in one report."""
    bench_job(spec)


def bench_job(spec: BenchSpec) -> None:
    """Run the bench `spec` asks for and print its tables; exits 4 when trajectories were lost
    to the server."""
    plan = plan_bench(spec)
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
        click.echo(f"\ncapacity search under {plan.slo.spec()} (budget "
                   f"{plan.capacity_s:.0f} s) ...")
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
