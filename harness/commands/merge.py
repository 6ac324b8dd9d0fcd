"""`harness merge`: join the results of a run's shards into one results directory."""

from __future__ import annotations

from pathlib import Path

import click

from harness.commands.options import Command
from harness.distributed.merge import merge_results


@click.command("merge", cls=Command)
@click.argument("dirs", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--out", required=True, type=click.Path(path_type=Path),
              help="The merged results directory (records, run.json, summary.json).")
def merge_command(dirs: tuple[Path, ...], out: Path) -> None:
    """Merge DIRS, the results of every shard of one run (`harness run --shard i/n
    --start-at T`), into OUT as one run's results. A shard whose load generator died (its
    run.json still reads `running`) has its unfinished trajectories recorded failed, reason
    worker-lost."""
    result = merge_results(list(dirs), out)
    o = result.run.outcome
    assert o is not None
    click.echo(f"{result.run.policy}: {len(dirs)} shards, {result.records} records: "
               f"{o.completed} completed, {o.cancelled} cancelled, {o.failed} failed -> {out}")
    if result.lost_shards:
        click.echo(f"warning: shard(s) {', '.join(result.lost_shards)} lost their load "
                   "generator: unfinished trajectories recorded failed (worker-lost)", err=True)
    if result.unnamed_lost:
        click.echo(f"warning: {result.unnamed_lost} planned trajectories of the lost shard(s) "
                   "never started and are not in the records", err=True)
