"""`harness compare BASE NEW`: a noise-aware verdict on two results directories, for CI."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from harness.commands.options import Command, outcome_slo_option
from harness.errors import InputError
from harness.report.comparable import ASPECTS, parse_allow
from harness.report.compare import DEFAULT_THRESHOLD, compare_dirs, format_text


@click.command("compare", cls=Command)
@click.argument("base", type=click.Path(path_type=Path))
@click.argument("new", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--fail-on-regression", is_flag=True, help="Exit 1 when a metric regressed.")
@click.option("--threshold", type=float, default=DEFAULT_THRESHOLD, show_default=True,
              help="Ratio NEW/BASE beyond which a significant change counts.")
@outcome_slo_option
@click.option("--allow", "allow_items", multiple=True, metavar="ASPECT[,ASPECT]",
              help=f"Aspects in which the runs may differ: {', '.join(ASPECTS)}. Without it, "
                   "runs that differ in any are refused (exit 2) with the differences listed.")
def compare_command(base: Path, new: Path, as_json: bool, fail_on_regression: bool,
                    threshold: float, slo: dict[str, float],
                    allow_items: tuple[str, ...]) -> None:
    """Compare NEW against BASE (results directories) with a noise-aware verdict."""
    if not 1.0 < threshold < float("inf"):
        raise InputError(f"--threshold must be above 1, got {threshold}")
    result = compare_dirs(base, new, threshold, slo, allow=parse_allow(allow_items))
    if as_json:
        keys = ("name", "unit", "base", "new", "ratio", "ci95", "verdict")
        doc = {"metrics": [{k: m[k] for k in keys} for m in result["metrics"]],
               "regressed": result["regressed"], "differences": result["differences"]}
        click.echo(json.dumps(doc, indent=2))
    else:
        click.echo(format_text(result))
    if fail_on_regression and result["regressed"]:
        sys.exit(1)
