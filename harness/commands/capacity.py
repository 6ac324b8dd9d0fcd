"""`harness capacity`: the most concurrent agents a server holds under an SLO, per policy."""

from __future__ import annotations

import click

from harness.capacity.run import result_table, run_capacity
from harness.commands.exits import exit_confirm_failed
from harness.commands.options import Command
from harness.commands.specopts import spec_options
from harness.specs.capacity import CapacitySpec


@click.command("capacity", cls=Command)
@spec_options(CapacitySpec)
def capacity_command(spec: CapacitySpec) -> None:
    """Find the most concurrent agents the server holds under an SLO, for each policy."""
    capacity_job(spec)


def capacity_job(spec: CapacitySpec) -> None:
    """Run the capacity job `spec` asks for and print what it found; exits 5 when a confirmation
    contradicted the search."""
    plan = spec.plan()
    result = run_capacity(plan, click.echo)
    click.echo("")
    click.echo(result_table(result))
    click.echo(f"\nresults: {plan.root}\nreport:  {plan.root / 'report.html'}")
    if result.contradicted:
        exit_confirm_failed("a confirmation re-run contradicted the search (see 'confirmed' "
                            "above)")
