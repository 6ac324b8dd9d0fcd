"""`harness report | compare | history | export`: reports over results directories."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from harness.errors import InputError
from harness.metrics.outcomes import SLO_KEYS, check_slo
from harness.report.comparable import ASPECTS, parse_allow
from harness.report.compare import DEFAULT_THRESHOLD, compare_dirs, format_text
from harness.report.export import FORMATS, export
from harness.report.history import history
from harness.report.render import render_report

_DIRS = click.argument("dirs", nargs=-1, required=True, type=click.Path(path_type=Path))
_SLO = click.option("--slo", "slo_items", multiple=True, metavar="KEY=VALUE",
                    help=f"SLO bound, repeatable; keys: {', '.join(SLO_KEYS)}.")


def parse_slo(items: tuple[str, ...]) -> dict[str, float]:
    """('ttft_ms=500', ...) -> {'ttft_ms': 500.0}; InputError on a malformed item, an unknown
    key or a bound out of range."""
    out: dict[str, float] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise InputError(f"--slo {item!r}: expected KEY=VALUE")
        try:
            out[key.strip()] = float(value)
        except ValueError:
            raise InputError(f"--slo {item!r}: {value!r} is not a number") from None
    return check_slo(out)


@click.command("report")
@_DIRS
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="HTML file (default: DIR/report.html for one directory).")
@_SLO
@click.option("--baseline", type=click.Path(path_type=Path), default=None,
              help="The directory (one of DIRS) the others' differences are against "
                   "(default: the first).")
def report(dirs: tuple[Path, ...], out: Path | None, slo_items: tuple[str, ...],
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
    doc = render_report(list(dirs), parse_slo(slo_items), baseline=base)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(doc, encoding="utf-8")
    click.echo(f"wrote {out} ({len(doc):,} bytes)")


def _search_report(root: Path, out: Path) -> Path | None:
    """The report of a capacity search or an advice (a root with capacity.json or
    advice.json), re-rendered from it; None for any other directory."""
    from harness.records.store import read_json

    if (root / "capacity.json").is_file():
        from harness.capacity.cli import write_capacity_report

        return write_capacity_report(root, read_json(root / "capacity.json"), out)
    if (root / "advice.json").is_file():
        from harness.capacity.advise_cli import write_advice_report

        return write_advice_report(root, read_json(root / "advice.json"), out)
    return None


@click.command("compare")
@click.argument("base", type=click.Path(path_type=Path))
@click.argument("new", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--fail-on-regression", is_flag=True, help="Exit 1 when a metric regressed.")
@click.option("--threshold", type=float, default=DEFAULT_THRESHOLD, show_default=True,
              help="Ratio NEW/BASE beyond which a significant change counts.")
@_SLO
@click.option("--allow", "allow_items", multiple=True, metavar="ASPECT[,ASPECT]",
              help=f"Aspects in which the runs may differ: {', '.join(ASPECTS)}. Without it, "
                   "runs that differ in any are refused (exit 2) with the differences listed.")
def compare(base: Path, new: Path, as_json: bool, fail_on_regression: bool, threshold: float,
            slo_items: tuple[str, ...], allow_items: tuple[str, ...]) -> None:
    """Compare NEW against BASE (results directories) with a noise-aware verdict."""
    if not 1.0 < threshold < float("inf"):
        raise InputError(f"--threshold must be above 1, got {threshold}")
    result = compare_dirs(base, new, threshold, parse_slo(slo_items),
                          allow=parse_allow(allow_items))
    if as_json:
        keys = ("name", "unit", "base", "new", "ratio", "ci95", "verdict")
        doc = {"metrics": [{k: m[k] for k in keys} for m in result["metrics"]],
               "regressed": result["regressed"], "differences": result["differences"]}
        click.echo(json.dumps(doc, indent=2))
    else:
        click.echo(format_text(result))
    if fail_on_regression and result["regressed"]:
        sys.exit(1)


@click.command("history")
@_DIRS
@click.option("--out", type=click.Path(path_type=Path), required=True, help="HTML file.")
@click.option("--threshold", type=float, default=DEFAULT_THRESHOLD, show_default=True)
@_SLO
def history_cmd(dirs: tuple[Path, ...], out: Path, threshold: float,
                slo_items: tuple[str, ...]) -> None:
    """Trend of headline metrics over commits (run.json git_commit, started_at), steps marked."""
    doc = history(list(dirs), threshold, parse_slo(slo_items))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(doc, encoding="utf-8")
    click.echo(f"wrote {out} ({len(doc):,} bytes)")


@click.command("export")
@_DIRS
@click.option("--format", "fmt", type=click.Choice(FORMATS), default=FORMATS[0],
              show_default=True)
@_SLO
def export_cmd(dirs: tuple[Path, ...], fmt: str, slo_items: tuple[str, ...]) -> None:
    """Print headline metrics as a github-action-benchmark customSmallerIsBetter JSON list."""
    click.echo(json.dumps(export(list(dirs), fmt, parse_slo(slo_items)), indent=2))
