"""`harness traces`: validate, describe, import and generate trajectory files."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import click

from harness.errors import InputError
from harness.limits import MAX_SEED
from harness.traces.generator import generate, provenance_for
from harness.traces.importers import FORMATS, import_trace
from harness.traces.profiles import builtin_profiles, load_profile
from harness.traces.schema import write_trajectories
from harness.traces.stats import describe
from harness.traces.validate import check_frame, load_trajectories, validate_file


@click.group()
def traces() -> None:
    """Trajectory files: validate, describe, import real traces, generate synthetic ones."""


@traces.command()
@click.argument("file", type=click.Path(path_type=Path))
def validate(file: Path) -> None:
    """Exit 0 when FILE is a valid trajectory file; else one line per problem, exit 2."""
    problems = validate_file(file)
    if not problems:
        click.echo(f"{file}: valid")
        return
    for p in problems:
        click.echo(str(p), err=True)
    raise SystemExit(2)


def _fmt_q(q: dict[str, Any], unit: str = "") -> str:
    if not q.get("n"):
        return "-"
    return " / ".join(f"{q[k]:.4g}{unit}" for k in ("p50", "p95", "p99"))


@traces.command("describe")
@click.argument("file", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def describe_cmd(file: Path, as_json: bool) -> None:
    """Trajectories, calls, tool latency by class, abandoned tools, retained tokens at pauses."""
    d = describe(load_trajectories(file))
    if as_json:
        click.echo(json.dumps(d, indent=2, sort_keys=True))
        return
    click.echo(f"{file}")
    click.echo(f"  trajectories {d['trajectories']}, steps {d['steps']}, "
               f"LLM calls {d['llm_calls']}, tool calls {d['tool_calls']}")
    click.echo(f"  turns per trajectory p50/p95/p99: {_fmt_q(d['turns_per_trajectory'])}")
    click.echo(f"  abandoned (never return): {d['abandoned']} "
               f"({100 * d['abandoned_fraction']:.2f}% of tool calls)")
    click.echo(f"  tool latency p50/p95/p99: {_fmt_q(d['tool_latency_s'], ' s')}")
    for cls, v in d["tool_latency_s_by_class"].items():
        click.echo(f"    {cls:<14} {v['calls']:>8} calls  {_fmt_q(v['latency_s'], ' s')}"
                   f"  never-return {v['never_return']}, errors {v['errors']}")
    r = d["retained_tokens"]
    click.echo(f"  retained tokens at pauses p50/p95/p99: {_fmt_q(r)}, max {r['max']}")


@traces.command("import")
@click.argument("fmt", metavar="FORMAT", type=click.Choice(sorted(FORMATS)))
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--out", required=True, type=click.Path(path_type=Path), help="Parquet to write.")
@click.option("--option", "-o", "options", multiple=True, metavar="KEY=VALUE",
              help="Importer option (e.g. -o profile=flaky-tools for openai-chat).")
def import_cmd(fmt: str, path: Path, out: Path, options: tuple[str, ...]) -> None:
    """Import a real trace (FORMAT PATH) into the trajectory format."""
    check_out_file(out)
    opts: dict[str, str] = {}
    for o in options:
        if "=" not in o:
            raise InputError(f"--option {o!r}: expected KEY=VALUE")
        k, v = o.split("=", 1)
        opts[k] = v
    t0 = time.perf_counter()
    imported = import_trace(fmt, path, opts)
    problems = check_frame(imported.steps, str(out))
    if problems:
        raise InputError("the import produced an invalid workload:\n"
                         + "\n".join(str(p) for p in problems[:20]))
    write_trajectories(imported.steps, out, imported.provenance)
    for w in imported.warnings[:50]:
        click.echo(f"warning: {w}", err=True)
    if len(imported.warnings) > 50:
        click.echo(f"warning: ... and {len(imported.warnings) - 50} more", err=True)
    n = imported.steps["trajectory_id"].nunique()
    click.echo(f"wrote {out}: {n} trajectories, {len(imported.steps)} steps "
               f"({time.perf_counter() - t0:.2f} s)")


def check_out_file(out: Path) -> None:
    """InputError unless `out` can be a file: not a directory, its folder existing."""
    if out.is_dir():
        raise InputError(f"--out {out} is a directory; give the Parquet file to write")
    if not out.parent.is_dir():
        raise InputError(f"--out {out}: folder {out.parent} does not exist")


@traces.command()
@click.option("--profile", required=True, help=f"Built-in ({', '.join(builtin_profiles())}) "
                                               "or a TOML file.")
@click.option("--trajectories", type=click.IntRange(1, 10_000_000), default=10,
              show_default=True)
@click.option("--seed", type=click.IntRange(0, MAX_SEED), default=0, show_default=True)
@click.option("--out", required=True, type=click.Path(path_type=Path))
def gen(profile: str, trajectories: int, seed: int, out: Path) -> None:
    """Generate a synthetic workload from a profile; the same seed gives the same file."""
    check_out_file(out)
    prof = load_profile(profile)
    df = generate(prof, trajectories, seed)
    write_trajectories(df, out, provenance_for(prof, trajectories, seed))
    click.echo(f"wrote {out}: {df['trajectory_id'].nunique()} trajectories, {len(df)} steps")
