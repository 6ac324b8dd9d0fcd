"""`harness capacity`: the most concurrent agents a server holds under an SLO, per policy.

Each point is an ordinary results directory (`<out>/<policy>/n-004/`, a bounded replay with
window.json), so `report` and `compare` work on it; `<out>/capacity.json` holds the search
(rewritten after every point) and `<out>/report.html` its curve, then the runs at capacity.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

from harness.adapters.base import Runtime
from harness.adapters.runtimes import RUNTIMES, get_runtime
from harness.capacity.budget import Budget, parse_span
from harness.capacity.driver import PointSpec, SearchSettings, search_policy
from harness.capacity.live import live_measure, nan_free
from harness.capacity.slo import TERMS, Slo, parse_slo
from harness.errors import InputError
from harness.limits import MAX_SEED
from harness.plan.injection import load_injection
from harness.policies import POLICIES
from harness.records.store import write_json
from harness.replay.bench import scoped_policy_args, shipped_trace
from harness.replay.cli import (
    RunOptions,
    arrivals_from_flags,
    auth_options,
    check_run_flags,
    check_url,
    ensure_out_dir,
    headers_from_flags,
    timeout_options,
    timeouts_from_flags,
    token_scale_option,
)
from harness.replay.named_policies import policy_names
from harness.traces.scale import check_token_scale
from harness.traces.validate import load_trajectories

CAPACITY_JSON = "capacity.json"
CONFIRM_FAILED_EXIT = 5  # a confirmation re-run contradicted the search


@dataclass(frozen=True)
class CapacityPlan:
    """A capacity search, validated before its first point."""

    root: Path
    trace: Path
    slo: Slo
    policies: tuple[tuple[str, dict[str, str]], ...]
    base: RunOptions
    budget_s: float
    duration_s: float
    warmup_s: float
    settings: SearchSettings


def policy_list(policies: str, policy_args: tuple[str, ...], runtime: Runtime | None = None
                ) -> list[tuple[str, dict[str, str]]]:
    """The policies to search with their arguments; InputError for an unknown or repeated one
    (`runtime`'s server policies are known too)."""
    names = policy_names(policies, runtime)
    args = scoped_policy_args(names, policy_args)
    return [(p, args[p]) for p in names]


def run_capacity(plan: CapacityPlan, echo: Callable[[str], None] = click.echo,
                 runtime: Runtime | None = None) -> dict[str, Any]:
    """Search every policy of the plan on its server (`runtime`, default the registry's);
    returns capacity.json's content."""
    from harness.capacity.driver import verdict_line

    budget = Budget(plan.budget_s, plan.settings.clock)
    doc: dict[str, Any] = {
        "kind": "capacity", "slo": plan.slo.spec(),
        "slo_terms": [{"term": t.name, "bound": t.bound, "kind": t.kind}
                      for t in plan.slo.terms],
        "trace": str(plan.trace), "runtime": plan.base.runtime, "url": plan.base.url,
        "point": {"duration_s": plan.duration_s, "warmup_s": plan.warmup_s},
        "budget_s": plan.budget_s, "started_at": datetime.now(UTC).isoformat(),
        "slots": plan.base.slots, "ctx_per_slot": plan.base.ctx_per_slot,
        "policies": {}}
    measure = live_measure(plan.base, runtime or get_runtime(plan.base.runtime),
                           plan.duration_s, plan.warmup_s, lambda m: click.echo(m, err=True))
    ensure_out_dir(plan.root)

    shown: dict[str, int] = {}

    def save(entry: dict[str, Any]) -> None:
        doc["policies"][entry["policy"]] = entry
        doc["elapsed_s"] = budget.elapsed_s()
        write_json(plan.root / CAPACITY_JSON, nan_free(doc))
        for p in entry["points"][shown.get(entry["policy"], 0):]:  # each point once
            echo(f"[{budget.elapsed_s():5.0f}s / {plan.budget_s:.0f}s] "
                 + verdict_line(entry["policy"], p))
        shown[entry["policy"]] = len(entry["points"])

    for i, (policy, args) in enumerate(plan.policies):
        share = budget.share_s(len(plan.policies) - i)
        echo(f"[{budget.elapsed_s():5.0f}s / {plan.budget_s:.0f}s] {policy}: searching "
             f"(up to {share:.0f}s)")
        search_policy(PointSpec(policy, args, 0), plan.slo, measure, plan.root, share,
                      plan.settings, save)
    doc["elapsed_s"] = budget.elapsed_s()
    write_json(plan.root / CAPACITY_JSON, nan_free(doc))
    write_capacity_report(plan.root, doc)
    return doc


def write_capacity_report(root: Path, doc: dict[str, Any], out: Path | None = None) -> Path:
    """report.html (or `out`): the capacity section, then the runs at each policy's
    capacity."""
    from harness.report.capacity_view import capacity_section
    from harness.report.data import load_runs
    from harness.report.render import render_runs

    dirs = [Path(e["at_capacity"]["dir"]) for e in doc["policies"].values()
            if e.get("at_capacity") and e["at_capacity"].get("dir")]
    runs = load_runs([d for d in dirs if d.is_dir()])
    html = render_runs(runs, lead=capacity_section(doc), title="Capacity under an SLO")
    out = out or root / "report.html"
    out.write_text(html, encoding="utf-8")
    return out


def result_table(doc: dict[str, Any]) -> str:
    """The headline: per policy, capacity, interval, figures there, confirmation."""
    head = (f"{'policy':<11}{'capacity':>9}{'interval':>10}{'resume p50':>11}{'p95':>8}"
            f"{'p99':>8}{'success':>8}{'goodput/min':>12}{'jobs/h':>8}  confirmed")
    lines = [head, "-" * len(head)]
    for policy, e in doc["policies"].items():
        at = e.get("at_capacity") or {}
        r = at.get("resume_latency_ms") or {}
        hi = e.get("failing_above")
        interval = f"{e['capacity']}-{hi - 1}" if hi is not None else f">={e['capacity']}"
        c = e.get("confirm")
        conf = ("yes" if c and c["confirmed"] else "NO" if c else
                f"- ({e.get('confirm_skipped', 'off')})")

        def f(v: Any, spec: str = ",.0f") -> str:
            return "-" if v is None else format(v, spec)

        lines.append(f"{policy:<11}{e['capacity']:>9}{interval:>10}{f(r.get('p50')):>11}"
                     f"{f(r.get('p95')):>8}{f(r.get('p99')):>8}"
                     f"{f(at.get('success_rate'), '.2f'):>8}"
                     f"{f(at.get('goodput_per_min'), '.1f'):>12}"
                     f"{f(at.get('jobs_per_hour'), ',.0f'):>8}  {conf} ({e['reason']})")
    lines.append("(resume latency in ms at capacity; interval: the largest count that met the "
                 "SLO to the one below the smallest that did not)")
    return "\n".join(lines)


def search_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """The flags of a search: --slo, --budget, --point-duration, --warmup, --start,
    --max-agents, --resolution, --no-confirm."""
    for opt in reversed([
        click.option("--slo", "slo_spec", required=True,
                     help=f"Terms TERM=VALUE, comma-separated, from: {', '.join(TERMS)} "
                          "(e.g. resume_p95=2000ms,success=0.99)."),
        click.option("--budget", default="10m", show_default=True,
                     help="Wall time for the whole search (e.g. 10m, 1h)."),
        click.option("--point-duration", default="45s", show_default=True,
                     help="How long each point runs."),
        click.option("--warmup", default="10s", show_default=True,
                     help="The first part of each point, left out of its figures."),
        click.option("--start", type=click.IntRange(1, 100_000), default=1,
                     show_default=True, help="The first agent count measured."),
        click.option("--max-agents", type=click.IntRange(1, 100_000), default=64,
                     show_default=True),
        click.option("--resolution", type=click.FloatRange(0.0, 1.0, min_open=True),
                     default=0.1, show_default=True,
                     help="Stop bisecting when the gap is within this share of the capacity "
                          "(or 1 agent)."),
        click.option("--no-confirm", is_flag=True,
                     help="Skip re-running the capacity and the count 25% above it."),
    ]):
        f = opt(f)
    return f


def parse_search(slo_spec: str, budget: str, point_duration: str, warmup: str,
                 start: int, max_agents: int, resolution: float, no_confirm: bool
                 ) -> tuple[Slo, float, float, float, SearchSettings]:
    """The search flags, checked: InputError (one line) for the first bad one."""
    slo = parse_slo(slo_spec)
    budget_s = parse_span("--budget", budget, 10.0, 7 * 86_400.0)
    duration_s = parse_span("--point-duration", point_duration, 5.0, 86_400.0)
    warmup_s = parse_span("--warmup", warmup, 0.0, 86_400.0)
    if warmup_s >= duration_s:
        raise InputError(f"--warmup {warmup} must be shorter than --point-duration "
                         f"{point_duration}")
    if duration_s > budget_s:
        raise InputError(f"--point-duration {point_duration} is longer than --budget {budget}")
    if start > max_agents:
        raise InputError(f"--start {start} is above --max-agents {max_agents}")
    return slo, budget_s, duration_s, warmup_s, SearchSettings(
        start=start, max_agents=max_agents, resolution=resolution, confirm=not no_confirm)


@click.command("capacity")
@click.option("--runtime", type=click.Choice(list(RUNTIMES)), default="llamacpp",
              show_default=True)
@click.option("--url", help="A running server (default: a local server started per point).")
@click.option("--trace", "trace_path", type=click.Path(path_type=Path),
              help="Trajectory file (default: the shipped traces/bench-small.parquet).")
@click.option("--policies", default="keep,swap,recompute", show_default=True,
              help=f"Comma-separated, from: {', '.join(POLICIES)}.")
@click.option("--policy-arg", "policy_args", multiple=True, metavar="[POLICY.]KEY=VALUE")
@search_options
@click.option("--seed", type=click.IntRange(0, MAX_SEED), default=0, show_default=True)
@token_scale_option
@click.option("--slots", type=int, default=4, show_default=True)
@click.option("--ctx-per-slot", type=int, default=4096, show_default=True)
@click.option("--server-arg", "server_args", multiple=True)
@click.option("--out", type=click.Path(path_type=Path),
              help="Results root (default: reports/capacity-<UTC time>).")
@timeout_options
@auth_options
def capacity_cmd(runtime: str, url: str | None, trace_path: Path | None, policies: str,
                 policy_args: tuple[str, ...], slo_spec: str, budget: str,
                 point_duration: str, warmup: str, start: int, max_agents: int,
                 resolution: float, no_confirm: bool, seed: int, token_scale: float,
                 slots: int, ctx_per_slot: int, server_args: tuple[str, ...],
                 out: Path | None, connect_timeout: float, first_token_timeout: float,
                 stall_timeout: float, request_timeout: float, api_key: str | None,
                 headers: tuple[str, ...], skip_oversized: bool) -> None:
    """Find the most concurrent agents the server holds under an SLO, for each policy."""
    slo, budget_s, duration_s, warmup_s, settings = parse_search(
        slo_spec, budget, point_duration, warmup, start, max_agents, resolution, no_confirm)
    check_run_flags(slots=slots, ctx_per_slot=ctx_per_slot)
    check_token_scale(token_scale)
    check_url(url)
    pols = policy_list(policies, policy_args, get_runtime(runtime))
    trace = trace_path or shipped_trace()
    load_trajectories(trace)
    load_injection("none")
    base = RunOptions(
        trace=trace, policy="", out=Path(), runtime=runtime, url=url, seed=seed,
        slots=slots, ctx_per_slot=ctx_per_slot, server_args=server_args,
        arrivals=arrivals_from_flags(1, None, False, 1.0),
        timeouts=timeouts_from_flags(connect_timeout, first_token_timeout, stall_timeout,
                                     request_timeout),
        headers=headers_from_flags(api_key, headers, url), skip_oversized=skip_oversized,
        token_scale=token_scale)
    root = out or Path("reports") / f"capacity-{datetime.now(UTC):%Y%m%dT%H%M%SZ}"
    plan = CapacityPlan(root, trace, slo, tuple(pols), base, budget_s, duration_s, warmup_s,
                        settings)
    doc = run_capacity(plan)
    click.echo("")
    click.echo(result_table(doc))
    click.echo(f"\nresults: {root}\nreport:  {root / 'report.html'}")
    if any(e.get("confirm") and not e["confirm"]["confirmed"]
           for e in doc["policies"].values()):
        click.echo("error: a confirmation re-run contradicted the search (see 'confirmed' "
                   "above); the results are kept", err=True)
        sys.exit(CONFIRM_FAILED_EXIT)
