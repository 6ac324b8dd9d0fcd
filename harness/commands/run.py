"""`harness run`: replay a trace against a runtime under one pause policy."""

from __future__ import annotations

import click

from harness.commands.exits import exit_on_server_failures, print_result
from harness.commands.options import Command
from harness.commands.specopts import spec_options
from harness.distributed.driver import RayWorkers
from harness.replay.run import IN_PROCESS, RunEnvironment, execute_repeats
from harness.report.repeats import format_spread
from harness.specs.run import RunSpec


def _err(message: str) -> None:
    click.echo(message, err=True)


@click.command("run", cls=Command)
@spec_options(RunSpec)
def run_command(spec: RunSpec) -> None:
    """Replay TRACE against a runtime under POLICY and write a results directory."""
    run_job(spec)


def run_job(spec: RunSpec) -> None:
    """Run the replay (its repeats, its load generators) `spec` asks for and print what it
    did; exits 4 when trajectories were lost to the server."""
    env: RunEnvironment = (RayWorkers(spec.workers, spec.ray_address) if spec.workers > 1
                           else IN_PROCESS)
    runs, spread = execute_repeats(spec.options(), spec.repeats, env, _err, print_result)
    if spread is not None:
        click.echo(format_spread(spread))
        click.echo(f"spread between repeats -> {spec.out / 'repeats.json'}")
    exit_on_server_failures(runs)
