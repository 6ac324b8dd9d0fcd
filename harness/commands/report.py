"""`harness report`: one self-contained HTML report of results directories (or the report of a
capacity search or an advice, re-rendered from its capacity.json or advice.json)."""

from __future__ import annotations

from pathlib import Path

import click

from harness.advise.result import ADVICE_JSON
from harness.advise.run import rewrite_advice_report
from harness.capacity.result import CAPACITY_JSON
from harness.capacity.run import rewrite_capacity_report
from harness.commands.options import DIRS_ARGUMENT, Command, outcome_slo_option
from harness.errors import InputError
from harness.records.atomic import write_text_atomic
from harness.report.data import load_runs
from harness.report.render import render_runs


@click.command("report", cls=Command)
@DIRS_ARGUMENT
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="HTML file (default: DIR/report.html for one directory).")
@outcome_slo_option
@click.option("--baseline", type=click.Path(path_type=Path), default=None,
              help="The directory (one of DIRS) the others' differences are against "
                   "(default: the first).")
def report_command(dirs: tuple[Path, ...], out: Path | None, slo: dict[str, float],
                   baseline: Path | None) -> None:
    """Render one self-contained HTML report of DIRS (side by side) and refresh summary.json."""
    if out is None:
        if len(dirs) > 1:
            raise InputError("several directories: say where the report goes with --out")
        out = dirs[0] / "report.html"
    if len(dirs) == 1 and (written := _search_report(dirs[0], out)) is not None:
        click.echo(f"wrote {written}")
        return
    base = 0
    if baseline is not None:
        matches = [i for i, d in enumerate(dirs) if d.resolve() == baseline.resolve()]
        if not matches:
            raise InputError(f"--baseline {baseline} is not one of the directories reported")
        base = matches[0]
    # A damaged directory whose records still partly read is reported from what reads, with
    # the damage first in its health section: a report is how one finds out what is left.
    runs = load_runs(list(dirs), slo, write_summary=True, salvage=True)
    for run in runs:
        if run.damage:
            click.echo(f"warning: {run.path}: damaged, reported from what could be read: "
                       f"{run.damage[0]}" + (f" (and {len(run.damage) - 1} more problems)"
                                             if len(run.damage) > 1 else ""), err=True)
    doc = render_runs(runs, base)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out, doc)
    click.echo(f"wrote {out} ({len(doc):,} bytes)")


def _search_report(root: Path, out: Path) -> Path | None:
    """The report of a capacity search or an advice (a root with capacity.json or
    advice.json), re-rendered from it; None for any other directory."""
    for name, write in ((CAPACITY_JSON, rewrite_capacity_report),
                        (ADVICE_JSON, rewrite_advice_report)):
        if (root / name).is_file():
            try:
                return write(root, out)
            except (AttributeError, KeyError, TypeError, ValueError) as exc:
                # a file edited or damaged by hand: its shape is not the one written
                raise InputError(f"{root / name}: not the shape harness writes "
                                 f"({type(exc).__name__}: {str(exc)[:120]})") from None
    return None
