"""`harness clean DIR...`: release what a killed run left behind (its local server, its
private dump folder), using what its run.json recorded."""

from __future__ import annotations

from pathlib import Path

import click

from harness.commands.options import Command
from harness.replay.clean import clean_dir


@click.command("clean", cls=Command)
@click.argument("dirs", nargs=-1, required=True, type=click.Path(path_type=Path))
def clean_command(dirs: tuple[Path, ...]) -> None:
    """Stop the local server and remove the dump folder a killed run left (from its run.json)."""
    for d in dirs:
        done = clean_dir(d)
        for line in done or ["nothing left behind"]:
            click.echo(f"{d}: {line}")
