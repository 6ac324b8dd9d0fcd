"""`harness advise`: recommend a pause policy, searched in simulation and confirmed live."""

from __future__ import annotations

import click

from harness.advise.run import advice_text, advise
from harness.commands.exits import exit_confirm_failed
from harness.commands.options import Command
from harness.commands.specopts import spec_options
from harness.specs.advise import AdviseSpec


@click.command("advise", cls=Command)
@spec_options(AdviseSpec)
def advise_command(spec: AdviseSpec) -> None:
    """Recommend a pause policy: search in simulation, confirm on the live server."""
    advise_job(spec)


def advise_job(spec: AdviseSpec) -> None:
    """Run the advise job `spec` asks for and print what it found; exits 5 when a confirmation
    contradicted the search."""
    plan = spec.plan()
    result = advise(plan, click.echo)
    click.echo("")
    click.echo(advice_text(result))
    click.echo(f"\nresults: {plan.root}\nreport:  {plan.root / 'report.html'}")
    if result.objective_missed:
        exit_confirm_failed(f"the confirmation disagrees with the prediction by more than "
                            f"{spec.tolerance:.0%} on the objective")
