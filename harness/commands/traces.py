"""`harness traces`: validate, describe, import and generate trajectory files."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import click

from harness.commands.options import Group, check_out_file
from harness.commands.specopts import checked_option
from harness.errors import InputError
from harness.records.atomic import write_text_atomic
from harness.specs.shared import SEED
from harness.traces.compare_views import compare_views, render
from harness.traces.generator import generate, provenance_for
from harness.traces.importers import FORMATS, import_to_file
from harness.traces.profiles import builtin_profiles, load_profile
from harness.traces.scale import check_token_scale
from harness.traces.schema import read_provenance, write_trajectories
from harness.traces.stats import describe
from harness.traces.validate import load_trajectories, validate_file


@click.group("traces", cls=Group)
def traces_command() -> None:
    """Trajectory files: validate, describe, import real traces, generate synthetic ones."""


@traces_command.command("validate")
@click.argument("file", type=click.Path(path_type=Path))
def validate_command(file: Path) -> None:
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


@traces_command.command("describe")
@click.argument("file", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def describe_command(file: Path, as_json: bool) -> None:
    """Trajectories, calls, tool latency by class, abandoned tools, retained tokens at pauses,
    sub-agents, and the ideal prefix reuse (overall, per policy, by pause length)."""
    d = describe(load_trajectories(file), read_provenance(file))
    if as_json:
        click.echo(json.dumps(d, indent=2, sort_keys=True))
        return
    click.echo(f"{file}")
    click.echo(f"  trajectories {d['trajectories']}, steps {d['steps']}, "
               f"LLM calls {d['llm_calls']}, tool calls {d['tool_calls']}"
               + (f" (and {d['gap_steps']} gap steps between back-to-back calls)"
                  if d["gap_steps"] else ""))
    click.echo(f"  turns per trajectory p50/p95/p99: {_fmt_q(d['turns_per_trajectory'])}")
    click.echo(f"  abandoned (never return): {d['abandoned']} "
               f"({100 * d['abandoned_fraction']:.2f}% of tool calls)")
    click.echo(f"  tool latency p50/p95/p99: {_fmt_q(d['tool_latency_s'], ' s')}")
    for cls, v in d["tool_latency_s_by_class"].items():
        click.echo(f"    {cls:<14} {v['calls']:>8} calls  {_fmt_q(v['latency_s'], ' s')}"
                   f"  never-return {v['never_return']}, errors {v['errors']}")
    r = d["retained_tokens"]
    click.echo(f"  retained tokens at pauses p50/p95/p99: {_fmt_q(r)}, max {r['max']}")
    sa = d["subagents"]
    if sa["children"] or sa["subagent_steps"]:
        click.echo(f"  sub-agents: {sa['children']} started by {sa['subagent_steps']} subagent "
                   f"steps, at most {sa['max_fanout']} at once")
    _echo_reuse(d["ideal_reuse"])
    if "import" in d:
        _echo_import(d["import"])


def _load_view(file: Path) -> Any:
    """A trajectory file's frame; a file that is not one is one line (the first problem)."""
    try:
        return load_trajectories(file)
    except InputError as exc:
        problems = str(exc).splitlines()[1:] or [str(exc)]
        more = f" (+{len(problems) - 1} more: harness traces validate lists them)" \
            if len(problems) > 1 else ""
        raise InputError(f"not a trajectory file: {problems[0]}{more}") from None


@traces_command.command("compare-views")
@click.argument("file_a", metavar="A", type=click.Path(path_type=Path))
@click.argument("file_b", metavar="B", type=click.Path(path_type=Path))
@click.option("--json", "json_out", type=click.Path(path_type=Path),
              help="Also write the comparison to this JSON file.")
def compare_views_command(file_a: Path, file_b: Path, json_out: Path | None) -> None:
    """Where two imports of the same sessions disagree, tree by tree (a proxy recording's and
    the agent's own log): calls, tool calls, sub-agents and their parent links, prompt tokens,
    tool latency, each with a verdict. Exit 0 whether or not they differ."""
    if json_out is not None and (json_out.is_dir() or not json_out.parent.is_dir()):
        raise InputError(f"--json {json_out}: give a JSON file to write in an existing folder")
    result = compare_views(_load_view(file_a), _load_view(file_b))
    for line in render(result, str(file_a), str(file_b)):
        click.echo(line)
    if json_out is not None:
        doc = {"a": str(file_a), "b": str(file_b), **result}
        write_text_atomic(json_out, json.dumps(doc, indent=2, sort_keys=True) + "\n")
        click.echo(f"wrote {json_out}")


def _pct(rate: float | None) -> str:
    return "-" if rate is None else f"{100 * rate:.1f}%"


def _echo_reuse(u: dict[str, Any]) -> None:
    """The ideal prefix reuse and each policy's, overall and by the pause before the call."""
    pol = u["policies"]
    click.echo(f"  ideal prefix reuse (unlimited cache): {_pct(u['hit_rate'])} of "
               f"{u['prompt_tokens']:,} prompt tokens in {u['calls']:,} calls")
    click.echo(f"    keep {_pct(pol['keep'])}, swap {_pct(pol['swap'])}, recompute "
               f"{_pct(pol['recompute'])}, ttl {_pct(pol['ttl'])} (tau {u['tau_s']:g} s, then "
               f"{u['ttl_after']})")
    click.echo(f"    {'pause before call':<17} {'calls':>8} {'prompt tokens':>15} {'ideal':>6} "
               f"{'keep':>6} {'swap':>6} {'recompute':>9} {'ttl':>6}")
    for b in u["by_bucket"]:
        if not b["calls"]:
            continue
        p = b["policies"]
        click.echo(f"    {b['bucket']:<17} {b['calls']:>8,} {b['prompt_tokens']:>15,} "
                   f"{_pct(b['hit_rate']):>6} {_pct(p['keep']):>6} {_pct(p['swap']):>6} "
                   f"{_pct(p['recompute']):>9} {_pct(p['ttl']):>6}")


def _flat(prefix: str, value: Any) -> list[tuple[str, Any]]:
    """A nested dict's leaves as (dotted key, value)."""
    if isinstance(value, dict):
        return [kv for k, v in value.items()
                for kv in _flat(f"{prefix}.{k}" if prefix else str(k), v)]
    return [(prefix, value)]


def _fmt_count(v: Any) -> str:
    return f"{v:,}" if isinstance(v, int | float) and not isinstance(v, bool) else str(v)


SHOWN_FILES = 10  # source files listed one per line; --json has them all


def _echo_import(imp: dict[str, Any]) -> None:
    """What the importer counted over its source (provenance extra "files" and "totals")."""
    files = imp.get("files")
    if isinstance(files, list):
        click.echo(f"  imported from {len(files):,} source files")
        for f in files[:SHOWN_FILES]:
            if not isinstance(f, dict):
                click.echo(f"    {f}")
                continue
            click.echo(f"    {f.get('file', f.get('id', '?'))}")
            # Its counts that are not zero, wrapped.
            items = [f"{k} {_fmt_count(v)}" for k, v in _flat("", f)
                     if k not in ("file", "id") and v not in (0, None, "")]
            line = ""
            for item in items:
                if line and len(line) + len(item) + 10 > 100:
                    click.echo(f"      {line},")
                    line = ""
                line = f"{line}, {item}" if line else item
            if line:
                click.echo(f"      {line}")
        if len(files) > SHOWN_FILES:
            click.echo(f"    ... and {len(files) - SHOWN_FILES:,} more (--json lists them)")
    elif isinstance(files, dict):
        click.echo("  source files: " + ", ".join(f"{k} {_fmt_count(v)}"
                                                  for k, v in _flat("", files)))
    elif files is not None:
        click.echo(f"  imported from {_fmt_count(files)} source files")
    totals = imp.get("totals")
    if isinstance(totals, dict):
        click.echo("  source totals:")
        for k, v in _flat("", totals):
            click.echo(f"    {k:<40} {_fmt_count(v)}")
    elif totals is not None:
        click.echo(f"  source totals: {_fmt_count(totals)}")


@traces_command.command("import")
@click.argument("fmt", metavar="FORMAT", type=click.Choice(sorted(FORMATS)))
@click.argument("paths", metavar="PATH...", nargs=-1, required=True,
                type=click.Path(path_type=Path))
@click.option("--out", required=True, type=click.Path(path_type=Path), help="Parquet to write.")
@click.option("--option", "-o", "options", multiple=True, metavar="KEY=VALUE",
              help="Importer option (e.g. -o profile=flaky-tools for openai-chat).")
@click.option("--token-scale", type=float, default=1.0, show_default=True,
              help="Multiply every token count by this (rounded up), e.g. 0.05 to fit "
                   "100k-token sessions in a 16k context; recorded in the provenance.")
def import_command(fmt: str, paths: tuple[Path, ...], out: Path, options: tuple[str, ...],
                   token_scale: float) -> None:
    """Import a real trace or agent log (FORMAT PATH...) into the trajectory format.
    kv-cache-tester, codex, claude-code, otel-genai and atif take several paths (files or
    directories)."""
    check_out_file(out)
    check_token_scale(token_scale)
    opts: dict[str, str] = {}
    for o in options:
        if "=" not in o:
            raise InputError(f"--option {o!r}: expected KEY=VALUE")
        k, v = o.split("=", 1)
        opts[k] = v
    t0 = time.perf_counter()
    imported = import_to_file(fmt, paths, opts, out, token_scale)
    for w in imported.warnings[:50]:
        click.echo(f"warning: {w}", err=True)
    if len(imported.warnings) > 50:
        click.echo(f"warning: ... and {len(imported.warnings) - 50} more", err=True)
    n = imported.steps["trajectory_id"].nunique()
    click.echo(f"wrote {out}: {n} trajectories, {len(imported.steps)} steps "
               f"({time.perf_counter() - t0:.2f} s)")


@traces_command.command("gen")
@click.option("--profile", required=True, help=f"Built-in ({', '.join(builtin_profiles())}) "
                                               "or a TOML file.")
@click.option("--trajectories", type=click.IntRange(1, 10_000_000), default=10,
              show_default=True)
@checked_option(SEED)
@click.option("--out", required=True, type=click.Path(path_type=Path))
def gen_command(profile: str, trajectories: int, seed: int, out: Path) -> None:
    """Generate a synthetic workload from a profile; the same seed gives the same file."""
    check_out_file(out)
    prof = load_profile(profile)
    df = generate(prof, trajectories, seed)
    write_trajectories(df, out, provenance_for(prof, trajectories, seed))
    click.echo(f"wrote {out}: {df['trajectory_id'].nunique()} trajectories, {len(df)} steps")
