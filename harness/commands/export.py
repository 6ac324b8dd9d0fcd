"""`harness export DIR...`: headline metrics in a CI benchmark tracker's format."""

from __future__ import annotations

import json
from pathlib import Path

import click

from harness.commands.options import DIRS_ARGUMENT, Command, outcome_slo_option
from harness.report.export import FORMATS, export


@click.command("export", cls=Command)
@DIRS_ARGUMENT
@click.option("--format", "fmt", type=click.Choice(FORMATS), default=FORMATS[0],
              show_default=True)
@outcome_slo_option
def export_command(dirs: tuple[Path, ...], fmt: str, slo: dict[str, float]) -> None:
    """Print headline metrics as a github-action-benchmark customSmallerIsBetter JSON list."""
    click.echo(json.dumps(export(list(dirs), fmt, slo), indent=2))
