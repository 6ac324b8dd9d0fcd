"""`harness history DIR... --out FILE`: headline metrics over commits, steps marked."""

from __future__ import annotations

from pathlib import Path

import click

from harness.commands.options import DIRS_ARGUMENT, Command, outcome_slo_option
from harness.records.atomic import write_text_atomic
from harness.report.compare import DEFAULT_THRESHOLD
from harness.report.history import history


@click.command("history", cls=Command)
@DIRS_ARGUMENT
@click.option("--out", type=click.Path(path_type=Path), required=True, help="HTML file.")
@click.option("--threshold", type=float, default=DEFAULT_THRESHOLD, show_default=True)
@outcome_slo_option
def history_command(dirs: tuple[Path, ...], out: Path, threshold: float,
                    slo: dict[str, float]) -> None:
    """Trend of headline metrics over commits (run.json git_commit, started_at), steps marked."""
    doc = history(list(dirs), threshold, slo)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out, doc)
    click.echo(f"wrote {out} ({len(doc):,} bytes)")
