"""`harness bench`: the main job. One trace, several policies, one local server per policy.

Prints a headline table (resume latency P50/P95/P99, outcomes, tokens recomputed, bytes moved,
cache mismatches per policy), and writes one HTML report comparing the policies.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

from harness.adapters.base import Runtime
from harness.adapters.runtimes import RUNTIMES, get_runtime
from harness.errors import InputError
from harness.limits import MAX_SEED
from harness.metrics.health import problems
from harness.metrics.registry import metric
from harness.model.calibration import read_calibration
from harness.plan.injection import load_injection
from harness.policies import POLICIES, make_policy, parse_policy_args
from harness.records.manifest import CpuPinning, RunManifest, read_manifest
from harness.records.store import SUMMARY_JSON, read_json, write_json
from harness.replay import pinning
from harness.replay.cli import (
    RunOptions,
    arrivals_from_flags,
    auth_options,
    check_run_flags,
    check_url,
    ensure_out_dir,
    execute_run,
    exit_on_server_failures,
    headers_from_flags,
    timeout_options,
    timeouts_from_flags,
    token_scale_option,
)
from harness.replay.named_policies import per_pause_policy, policy_names, policy_params
from harness.replay.runner import redact_url
from harness.report.repeats import REPEATS_JSON, format_spread, repeat_dirs, write_repeats
from harness.selftest.result import read_selftest
from harness.traces.scale import check_token_scale
from harness.traces.validate import load_trajectories

DEFAULT_POLICIES = ("keep", "swap", "recompute")
DEFAULT_PICK_SLO = "resume_p95=2000ms"


def shipped_trace(name: str = "bench-small") -> Path:
    """A sample trace shipped in the repository's traces/ folder (made by the generator)."""
    repo = Path(__file__).resolve().parents[2]
    path = repo / "traces" / f"{name}.parquet"
    if not path.exists():
        raise InputError(f"shipped trace {path} not found; pass --trace FILE")
    return path


def predict(trace: Path, policy: str, calibration: Path) -> dict[str, Any]:
    """The analytical model's figures for one policy over the trace's pauses, keyed so the
    report can set them beside the measured ones: the restore part of resume latency (swap-in
    or re-prefill; queueing and the appended tokens' prefill are not modelled), bytes moved,
    tokens recomputed."""
    from harness.model.analytical import Rates, evaluate
    from harness.model.inputs import pauses_from_trace
    from harness.plan.injection import Injection

    cal = read_calibration(calibration)
    pauses = pauses_from_trace(trace, Injection().default_deadline_s)
    rates = Rates(prefill_tok_s=cal.prefill_tok_s, swap_out_bytes_per_s=cal.swap_out_bytes_per_s,
                  swap_in_bytes_per_s=cal.swap_in_bytes_per_s,
                  prefill_points=cal.prefill_points, source="calibration")
    totals = evaluate({policy: make_policy(policy)}, pauses, cal.kv_bytes_per_token,
                      rates)[policy].totals()
    resume = totals["resume_ms"]
    return {policy: {"restore_ms_p50": resume["p50"], "restore_ms_p95": resume["p95"],
                     "restore_ms_p99": resume["p99"],
                     "bytes_moved": totals["bytes_moved"]["total"],
                     "tokens_recomputed": totals["tokens_recomputed"]["total"],
                     "source": f"harness model, calibration {calibration}"}}


def simulate_like(real_dir: Path, trace: Path, policy: str, policy_args: dict[str, str],
                  calibration: Path, out: Path) -> RunManifest:
    """The simulator on what a llama.cpp replay in `real_dir` ran: the same trace, policy,
    slots x context, closed-loop agents and seed, its costs from `calibration` only."""
    from harness.simulate.run import Arrivals, check_capacity, run_simulation

    real = read_manifest(real_dir)
    if real.arrivals is None or real.seed is None:
        raise InputError(f"{real_dir}: run.json lacks the arrivals or seed to simulate it")
    cap = check_capacity(None, real.slots, real.ctx_per_slot)
    arrivals = Arrivals("closed", int(real.arrivals.concurrency))
    return run_simulation(trace, policy, policy_args, cap, read_calibration(calibration),
                          calibration, arrivals, int(real.seed), out,
                          token_scale=real.trace.token_scale if real.trace else 1.0)


def _value(name: str, s: dict[str, Any], scale: float = 1.0, spec: str = ",.0f") -> str:
    """A registry metric's value in a summary, formatted ('-' where it has none)."""
    v = metric(name).value(s)
    return "-" if v is None else format(float(v) * scale, spec)


def headline_table(rows: list[tuple[str, dict[str, Any]]]) -> str:
    """A fixed-width table of the policies' summaries (the metrics as the registry defines
    them; the counts of resumes and trajectory outcomes beside them)."""
    head = (f"{'policy':<11}{'resume p50':>11}{'p95':>9}{'p99':>9}{'n':>5}  "
            f"{'ok':>4}{'cancel':>7}{'fail':>5}{'recomputed':>11}{'MiB moved':>10}"
            f"{'mismatch':>9}")
    lines = [head, "-" * len(head)]
    for policy, s in rows:
        r = s.get("resume_latency_ms") or {}
        t = s.get("trajectories") or {}
        lines.append(
            f"{policy:<11}{_value('resume_latency_ms.p50', s):>11}"
            f"{_value('resume_latency_ms.p95', s):>9}{_value('resume_latency_ms.p99', s):>9}"
            f"{r.get('n', 0):>5}  {t.get('succeeded', 0):>4}{t.get('cancelled', 0):>7}"
            f"{t.get('failed', 0):>5}{_value('tokens_recomputed', s):>11}"
            f"{_value('bytes_moved', s, 1 / 2**20, '.1f'):>10}"
            f"{_value('cache_mismatches', s, spec='.0f'):>9}")
    lines.append("(resume latency in ms: tool result available -> first token of the next call)")
    return "\n".join(lines)


def scoped_policy_args(policies: list[str], pairs: tuple[str, ...]
                       ) -> dict[str, dict[str, str]]:
    """Each bench policy's `--policy-arg`s: `POLICY.KEY=VALUE` goes to that policy, a plain
    `KEY=VALUE` to every policy of the bench that takes KEY. InputError for an argument that
    no policy of the bench takes, or one scoped to a policy the bench does not run."""
    out: dict[str, dict[str, str]] = {p: {} for p in policies}
    for key, value in parse_policy_args(pairs).items():
        scope, dot, name = key.partition(".")
        if dot and (scope in POLICIES or scope in out):
            if scope not in out:
                raise InputError(f"--policy-arg {key}={value}: the bench does not run {scope!r} "
                                 f"(--policies {','.join(policies)})")
            out[scope][name] = value
            continue
        takers = [p for p in policies if key in policy_params(p)]
        if not takers:
            raise InputError(f"--policy-arg {key}={value}: no policy of the bench takes "
                             f"{key!r} (--policies {','.join(policies)}); scope it as "
                             "POLICY.KEY=VALUE")
        for p in takers:
            out[p][key] = value
    return out


@dataclass(frozen=True)
class BenchPlan:
    """A bench, validated before its first replay: one RunOptions per policy (with the same
    CPU pinning), where results go, and what else runs (calibration, simulation)."""

    root: Path
    trace: Path
    runtime: Runtime
    runs: tuple[RunOptions, ...]
    calibration: Path | None  # a calibration file, or where --calibrate writes one
    calibrate_first: bool
    simulable: bool  # the simulator runs each policy too (see bench --calibration)
    pinning: CpuPinning | None
    repeats: int = 1  # rounds of every policy; above 1, each in <policy>/repeat-<k>

    def rounds(self) -> list[list[RunOptions]]:
        """The replays in the order they run: round by round, every policy in each, so a
        drift of the machine during the bench touches every policy alike."""
        if self.repeats == 1:
            return [list(self.runs)]
        return [[replace(o, out=repeat_dirs(o.out, self.repeats)[k]) for o in self.runs]
                for k in range(self.repeats)]


def plan_bench(runtime: str, url: str | None, trace: Path | None, policies: str | None,
               policy_args: tuple[str, ...], base: RunOptions, calibration: Path | None,
               calibrate_first: bool, out: Path | None,
               runtimes: Callable[[str], Runtime] = get_runtime, repeats: int = 1) -> BenchPlan:
    """Check every input of a bench (policies and their arguments, the trace, the injection
    profile, the calibration file) and decide its CPU pinning once; InputError on the first
    problem, before anything is started."""
    rt = runtimes(runtime)
    names = policy_names(policies or ",".join(rt.default_policies), rt)
    if calibrate_first and (calibration is not None or not rt.per_slot_control):
        raise InputError("--calibrate measures a server whose slots the harness controls "
                         "(llama.cpp); it replaces --calibration")
    args = scoped_policy_args(names, policy_args)
    for p in names:
        make_policy(per_pause_policy(p, rt), args[p])
    trace = trace or shipped_trace()
    load_trajectories(trace)
    load_injection(base.inject)
    if calibration is not None:
        read_calibration(calibration)
    root = out or Path("reports") / f"bench-{datetime.now(UTC):%Y%m%dT%H%M%SZ}"
    pin = pinning.decide(pinning.available_cpus(), url is None, rt.pins_local_server)
    if calibrate_first:
        calibration = root / "calibration.json"
    runs = tuple(replace(base, trace=trace, policy=p, out=root / p, runtime=runtime, url=url,
                         policy_args=args[p], calibration=calibration, pinning=pin)
                 for p in names)
    # The simulator models slots the harness controls, a closed loop and the trace's own tools.
    simulable = (rt.per_slot_control and base.inject == "none"
                 and base.arrivals.time_scale == 1.0)
    return BenchPlan(root, trace, rt, runs, calibration, calibrate_first, simulable, pin,
                     repeats)


def run_bench(plan: BenchPlan, echo: Callable[[str], None] = click.echo
              ) -> list[tuple[str, dict[str, Any]]]:
    """Run a bench plan: calibrate first if asked, replay each policy (and simulate it where
    that applies; with repeats, the first round), render one report; returns each replay's
    summary, labelled by policy (and `#k` for repeat k). With repeats, each policy's
    directory gets repeats.json, the spread between its repeats."""
    if plan.calibrate_first and plan.calibration is not None:
        from harness.replay.calibrate import calibrate

        first = plan.runs[0]
        echo(f"calibrating {redact_url(first.url) if first.url else 'a local server'} ...")
        ensure_out_dir(plan.root)
        calibrate(plan.calibration, first.runtime, first.url, server_args=first.server_args,
                  pin=plan.pinning)
    rows: list[tuple[str, dict[str, Any]]] = []
    dirs: list[Path] = []
    runs: list[RunManifest] = []
    t0 = time.monotonic()
    for k, round_runs in enumerate(plan.rounds(), 1):
        for o in round_runs:
            name = o.policy if plan.repeats == 1 else f"{o.policy}#{k}"
            echo(f"[{time.monotonic() - t0:6.0f}s] {name}: replaying {plan.trace} ...")
            run = execute_run(o, lambda m: click.echo(m, err=True), plan.runtime)
            runs.append(run)
            dirs.append(o.out)
            if plan.calibration is not None:
                write_json(o.out / "prediction.json",
                           predict(plan.trace, o.policy, plan.calibration))
                if plan.simulable and k == 1:
                    sim = plan.root / f"{o.policy}-simulated"
                    simulate_like(o.out, plan.trace, o.policy, o.policy_args,
                                  plan.calibration, sim)
                    dirs.append(sim)
            summary = read_json(o.out / SUMMARY_JSON) if (o.out / SUMMARY_JSON).exists() else {}
            rows.append((name, summary))
            c = run.outcome
            echo(f"[{time.monotonic() - t0:6.0f}s] {name}: {c.completed if c else 0} "
                 f"completed, {c.cancelled if c else 0} cancelled, {c.failed if c else 0} "
                 "failed")
    check_same_pinning(runs)
    if plan.repeats > 1:
        for o in plan.runs:
            write_repeats(o.out, repeat_dirs(o.out, plan.repeats))
    from harness.report.render import render_report

    (plan.root / "report.html").write_text(render_report(dirs), encoding="utf-8")
    return rows


def check_same_pinning(runs: list[RunManifest]) -> None:
    """RuntimeError when the runs of one bench did not all run under the same CPU pinning:
    their numbers would not be comparable."""
    seen = {repr(r.cpu_pinning) for r in runs}
    if len(seen) > 1:
        raise RuntimeError(f"the bench's policies ran under different CPU pinning: {seen}")


def health_lines(rows: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """Each policy's health problems (summary.json `health`: fail and warn), one line each."""
    out = []
    for policy, summary in rows:
        for c in problems(summary.get("health") or []):
            out.append(f"health, {policy}: {c['status'].upper()} {c['check']}: {c['detail']}")
    return out or ["health: no problems found"]


@click.command("bench")
@click.option("--runtime", type=click.Choice(list(RUNTIMES)), default="llamacpp",
              show_default=True)
@click.option("--url", help="A running server (default: start a local server per policy).")
@click.option("--trace", "trace_path", type=click.Path(path_type=Path),
              help="Trajectory file (default: the shipped traces/bench-small.parquet).")
@click.option("--policies", help=f"Comma-separated, from: {', '.join(POLICIES)} and the "
              "runtime's server policies (default: the runtime's, e.g. "
              f"{','.join(DEFAULT_POLICIES)}).")
@click.option("--policy-arg", "policy_args", multiple=True, metavar="[POLICY.]KEY=VALUE",
              help="A policy argument; POLICY.KEY=VALUE for one policy (e.g. ttl.tau=2), "
                   "KEY=VALUE for every policy of the bench that takes KEY.")
@click.option("--inject", default="none", show_default=True)
@click.option("--concurrency", type=int, default=6, show_default=True)
@click.option("--time-scale", type=float, default=1.0, show_default=True)
@token_scale_option
@click.option("--seed", type=click.IntRange(0, MAX_SEED), default=0, show_default=True)
@click.option("--slots", type=int, default=4, show_default=True)
@click.option("--ctx-per-slot", type=int, default=4096, show_default=True)
@click.option("--calibration", type=click.Path(path_type=Path),
              help="Rates from `harness calibrate`: policies price actions with them, each "
                   "policy's directory gets the analytical prediction (prediction.json), and "
                   "(llama.cpp, closed loop, no injection, time scale 1) the simulator runs "
                   "each policy too (<policy>-simulated), compared in the report.")
@click.option("--calibrate", "calibrate_first", is_flag=True,
              help="llama.cpp: measure the server first (harness calibrate, written to "
                   "<out>/calibration.json) and use it as --calibration: rates measured next "
                   "to the replays they predict.")
@click.option("--server-arg", "server_args", multiple=True,
              help="Extra flag for the local server, repeatable (e.g. -ngl 99).")
@click.option("--out", type=click.Path(path_type=Path),
              help="Results root (default: reports/bench-<UTC time>).")
@click.option("--selftest", "selftest", type=click.Path(path_type=Path),
              help="A `harness selftest` file: its instrument error goes into each run.json.")
@click.option("--repeats", type=click.IntRange(1, 100), default=1, show_default=True,
              help="Run every policy N times, round by round (<policy>/repeat-1 ...); each "
                   "policy's spread between its repeats goes to <policy>/repeats.json and is "
                   "printed, and the report sets the repeats side by side.")
@click.option("--slo", "slo_spec",
              help="The SLO for --capacity and for the advisor's pick (which runs with a "
                   f"calibration; default {DEFAULT_PICK_SLO}), e.g. resume_p95=2000ms.")
@click.option("--capacity", "capacity_search", is_flag=True,
              help="After the replays, a capacity search of every policy under --slo "
                   "(harness capacity, into <out>/capacity).")
@click.option("--capacity-budget", default="10m", show_default=True,
              help="Wall time for the --capacity search.")
@timeout_options
@auth_options
def bench_cmd(runtime: str, url: str | None, trace_path: Path | None, policies: str | None,
              policy_args: tuple[str, ...], inject: str, concurrency: int, time_scale: float,
              seed: int, slots: int, ctx_per_slot: int, calibration: Path | None,
              calibrate_first: bool, server_args: tuple[str, ...], out: Path | None,
              selftest: Path | None, repeats: int, connect_timeout: float,
              first_token_timeout: float,
              stall_timeout: float, request_timeout: float, api_key: str | None,
              headers: tuple[str, ...], skip_oversized: bool, token_scale: float,
              slo_spec: str | None, capacity_search: bool, capacity_budget: str) -> None:
    """Replay one trace under several policies and compare them in one report."""
    from harness.capacity.budget import parse_span
    from harness.capacity.slo import parse_slo

    if capacity_search and not slo_spec:
        raise InputError("--capacity needs --slo (e.g. --slo resume_p95=2000ms)")
    slo = parse_slo(slo_spec or DEFAULT_PICK_SLO)
    capacity_s = parse_span("--capacity-budget", capacity_budget, 60.0, 7 * 86_400.0)
    check_run_flags(slots=slots, ctx_per_slot=ctx_per_slot, time_scale=time_scale)
    check_token_scale(token_scale)
    check_url(url)
    timeouts = timeouts_from_flags(connect_timeout, first_token_timeout, stall_timeout,
                                   request_timeout)
    base = RunOptions(trace=Path(), policy="", out=Path(), inject=inject, timeouts=timeouts,
                      headers=headers_from_flags(api_key, headers, url),
                      skip_oversized=skip_oversized, token_scale=token_scale,
                      arrivals=arrivals_from_flags(concurrency, None, False, time_scale),
                      seed=seed, slots=slots, ctx_per_slot=ctx_per_slot,
                      server_args=server_args,
                      instrument_error=read_selftest(selftest) if selftest else None)
    plan = plan_bench(runtime, url, trace_path, policies, policy_args, base, calibration,
                      calibrate_first, out, repeats=repeats)
    rows = run_bench(plan)
    click.echo("")
    click.echo(headline_table(rows))
    for line in health_lines(rows):
        click.echo(line)
    if plan.repeats > 1:
        for o in plan.runs:
            click.echo(f"\nspread between the {plan.repeats} repeats of {o.policy}:")
            click.echo(format_spread(read_json(o.out / REPEATS_JSON)))
    if plan.calibration is not None and plan.simulable:
        show_pick(plan, slo, token_scale, seed)
    if capacity_search:
        bench_capacity(plan, slo, capacity_s)
    click.echo(f"\nresults: {plan.root}\nreport:  {plan.root / 'report.html'}")
    exit_on_server_failures([read_manifest(o.out) for r in plan.rounds() for o in r
                             if (o.out / "run.json").exists()])


def show_pick(plan: BenchPlan, slo: Any, token_scale: float, seed: int) -> None:
    """The advisor's pick on the bench's server settings, in simulation with the bench's
    calibration (<out>/advice/advice.json); `harness advise` confirms one on the server."""
    from harness.capacity.advise_cli import simulated_pick

    assert plan.calibration is not None
    o = plan.runs[0]
    rec = simulated_pick(plan.trace, plan.calibration, slo, o.slots, o.ctx_per_slot,
                         token_scale, seed, plan.root / "advice")
    p = rec["predicted"]
    p95 = (p.get("resume_latency_ms") or {}).get("p95")
    click.echo(f"\nadvisor's pick (simulated with {plan.calibration}, SLO {slo.spec()}): "
               f"{rec['label']}, predicted capacity {p['capacity']} agents"
               + (f", resume P95 {p95:,.0f} ms there" if p95 is not None else "")
               + "; not confirmed on the server (harness advise confirms it)")


def bench_capacity(plan: BenchPlan, slo: Any, budget_s: float) -> None:
    """bench --capacity: a capacity search of the bench's policies on its server."""
    from harness.capacity.cli import CapacityPlan, result_table, run_capacity
    from harness.capacity.driver import SearchSettings

    o = plan.runs[0]
    cplan = CapacityPlan(plan.root / "capacity", plan.trace, slo,
                         tuple((r.policy, r.policy_args) for r in plan.runs),
                         replace(o, pinning=plan.pinning), budget_s, 45.0, 10.0,
                         SearchSettings())
    click.echo(f"\ncapacity search under {slo.spec()} (budget {budget_s:.0f} s) ...")
    doc = run_capacity(cplan, runtime=plan.runtime)
    click.echo(result_table(doc))
    click.echo(f"capacity report: {cplan.root / 'report.html'}")
