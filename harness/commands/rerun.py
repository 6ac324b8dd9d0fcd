"""`harness rerun`: run a results directory's job again, from the spec its run.json records."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from harness.commands.advise import advise_job
from harness.commands.bench import bench_job
from harness.commands.capacity import capacity_job
from harness.commands.options import Command
from harness.commands.run import run_job
from harness.commands.simulate import simulate_job
from harness.commands.specopts import checked_option
from harness.specs.rerun import recorded_job
from harness.specs.shared import AUTH

# Each job's command, by the name a spec records.
JOBS: dict[str, Callable[[Any], None]] = {
    "run": run_job, "simulate": simulate_job, "bench": bench_job, "capacity": capacity_job,
    "advise": advise_job}


@click.command("rerun", cls=Command)
@click.argument("results", type=click.Path(path_type=Path))
@click.option("--out", type=click.Path(path_type=Path),
              help="Results of the rerun (default: RESULTS-rerun beside RESULTS).")
@checked_option(AUTH[0])
@checked_option(AUTH[1])
def rerun_command(results: Path, out: Path | None, api_key: str | None,
                  header: tuple[str, ...]) -> None:
    """Run RESULTS's job again: the inputs its run.json records, the same seed, on the same
    trace (refused when the trace changed since). An API key or headers, never recorded, are
    given again here."""
    job = recorded_job(results, out, {"api_key": api_key, "header": header})
    click.echo(f"rerunning the {job.spec.COMMAND} job of {job.run_json} -> "
               f"{getattr(job.spec, 'out', None) or 'its default root'}")
    JOBS[job.spec.COMMAND](job.spec)
