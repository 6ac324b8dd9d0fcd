"""`harness capacity`: the most concurrent agents a server holds under an SLO, per policy."""

from __future__ import annotations

from pathlib import Path

import click

from harness.adapters.http import Timeouts
from harness.capacity.driver import SearchSpec
from harness.capacity.run import plan_capacity, result_table, run_capacity
from harness.commands.exits import exit_confirm_failed
from harness.commands.options import (
    Command,
    arrivals_from_flags,
    auth_options,
    check_run_flags,
    runtime_option,
    search_options,
    seed_option,
    timeout_options,
    token_scale_option,
    url_option,
)
from harness.policies import POLICIES
from harness.replay.options import RunOptions


@click.command("capacity", cls=Command)
@runtime_option()
@url_option("A running server (default: a local server started per point).")
@click.option("--trace", "trace_path", type=click.Path(path_type=Path),
              help="Trajectory file (default: the shipped traces/bench-small.parquet).")
@click.option("--policies", default="keep,swap,recompute", show_default=True,
              help=f"Comma-separated, from: {', '.join(POLICIES)}.")
@click.option("--policy-arg", "policy_args", multiple=True, metavar="[POLICY.]KEY=VALUE")
@search_options
@seed_option
@token_scale_option
@click.option("--slots", type=int, default=4, show_default=True)
@click.option("--ctx-per-slot", type=int, default=4096, show_default=True)
@click.option("--server-arg", "server_args", multiple=True)
@click.option("--out", type=click.Path(path_type=Path),
              help="Results root (default: reports/capacity-<UTC time>).")
@timeout_options
@auth_options
def capacity_command(runtime: str, url: str | None, trace_path: Path | None, policies: str,
                     policy_args: tuple[str, ...], search: SearchSpec, seed: int,
                     token_scale: float, slots: int, ctx_per_slot: int,
                     server_args: tuple[str, ...], out: Path | None, timeouts: Timeouts,
                     headers: dict[str, str], skip_oversized: bool) -> None:
    """Find the most concurrent agents the server holds under an SLO, for each policy."""
    check_run_flags(slots=slots, ctx_per_slot=ctx_per_slot)
    base = RunOptions(
        trace=Path(), policy="", out=Path(), runtime=runtime, url=url, seed=seed,
        slots=slots, ctx_per_slot=ctx_per_slot, server_args=server_args,
        arrivals=arrivals_from_flags(1, None, False, 1.0), timeouts=timeouts, headers=headers,
        skip_oversized=skip_oversized, token_scale=token_scale)
    plan = plan_capacity(policies, policy_args, trace_path, search, base, out)
    doc = run_capacity(plan, click.echo)
    click.echo("")
    click.echo(result_table(doc))
    click.echo(f"\nresults: {plan.root}\nreport:  {plan.root / 'report.html'}")
    if any(e.get("confirm") and not e["confirm"]["confirmed"]
           for e in doc["policies"].values()):
        exit_confirm_failed("a confirmation re-run contradicted the search (see 'confirmed' "
                            "above)")
