"""`harness bench`: the main job. One trace, several policies, one local server per policy.

Prints a headline table (resume latency P50/P95/P99, outcomes, tokens recomputed, bytes moved,
cache mismatches per policy), and writes one HTML report comparing the policies.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

from harness.adapters.runtimes import RUNTIMES
from harness.errors import InputError
from harness.policies import POLICIES, make_policy
from harness.records.store import SUMMARY_JSON, read_json, write_json
from harness.replay.cli import RunOptions, arrivals_from_flags, execute_run, parse_kv

DEFAULT_POLICIES = ("keep", "swap", "recompute")


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
    from harness.model.calibration import read_calibration
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
                  calibration: Path, out: Path) -> dict[str, Any]:
    """The simulator on what a llama.cpp replay in `real_dir` ran: the same trace, policy,
    slots x context, closed-loop agents and seed, its costs from `calibration` only."""
    from harness.model.calibration import read_calibration
    from harness.simulate.run import Arrivals, check_capacity, run_simulation

    real = read_json(real_dir / "run.json")
    cap = check_capacity(None, real["slots"], real["ctx_per_slot"])
    arrivals = Arrivals("closed", int(real["arrivals"]["concurrency"]))
    return run_simulation(trace, policy, policy_args, cap, read_calibration(calibration),
                          calibration, arrivals, int(real["seed"]), out)


def _ms(q: dict[str, Any] | None, key: str) -> str:
    v = (q or {}).get(key)
    return "-" if v is None else f"{v:,.0f}"


def headline_table(rows: list[tuple[str, dict[str, Any]]]) -> str:
    """A fixed-width table of the policies' summaries."""
    head = (f"{'policy':<11}{'resume p50':>11}{'p95':>9}{'p99':>9}{'n':>5}  "
            f"{'ok':>4}{'cancel':>7}{'fail':>5}{'recomputed':>11}{'MiB moved':>10}"
            f"{'mismatch':>9}")
    lines = [head, "-" * len(head)]
    for policy, s in rows:
        r = s.get("resume_latency_ms") or {}
        t = s.get("trajectories") or {}
        moved = (s.get("bytes_moved") or 0) / 2**20
        lines.append(
            f"{policy:<11}{_ms(r, 'p50'):>11}{_ms(r, 'p95'):>9}{_ms(r, 'p99'):>9}"
            f"{r.get('n', 0):>5}  {t.get('succeeded', 0):>4}{t.get('cancelled', 0):>7}"
            f"{t.get('failed', 0):>5}{s.get('tokens_recomputed', 0):>11,}{moved:>10.1f}"
            f"{s.get('cache_mismatches', 0):>9}")
    lines.append("(resume latency in ms: tool result available -> first token of the next call)")
    return "\n".join(lines)


@click.command("bench")
@click.option("--runtime", type=click.Choice(list(RUNTIMES)), default="llamacpp",
              show_default=True)
@click.option("--url", help="A running server (default: start a local llama-server per policy).")
@click.option("--trace", "trace_path", type=click.Path(path_type=Path),
              help="Trajectory file (default: the shipped traces/bench-small.parquet).")
@click.option("--policies", default=",".join(DEFAULT_POLICIES), show_default=True,
              help=f"Comma-separated, from: {', '.join(POLICIES)}.")
@click.option("--policy-arg", "policy_args", multiple=True, metavar="KEY=VALUE")
@click.option("--inject", default="none", show_default=True)
@click.option("--concurrency", type=int, default=6, show_default=True)
@click.option("--time-scale", type=float, default=1.0, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
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
def bench_cmd(runtime: str, url: str | None, trace_path: Path | None, policies: str,
              policy_args: tuple[str, ...], inject: str, concurrency: int, time_scale: float,
              seed: int, slots: int, ctx_per_slot: int, calibration: Path | None,
              calibrate_first: bool, server_args: tuple[str, ...], out: Path | None) -> None:
    """Replay one trace under several policies and compare them in one report."""
    names = [p.strip() for p in policies.split(",") if p.strip()]
    unknown = [p for p in names if p not in POLICIES]
    if unknown or not names:
        raise InputError(f"unknown policy {', '.join(unknown) or '(none)'}; "
                         f"one of {', '.join(POLICIES)}")
    if calibrate_first and (calibration is not None or runtime != "llamacpp"):
        raise InputError("--calibrate measures a llama.cpp server; it replaces --calibration")
    trace = trace_path or shipped_trace()
    root = out or Path("reports") / f"bench-{datetime.now(UTC):%Y%m%dT%H%M%SZ}"
    if calibrate_first:
        from harness.replay.calibrate import calibrate

        click.echo(f"calibrating {url or 'a local llama-server'} ...")
        root.mkdir(parents=True, exist_ok=True)
        calibration = root / "calibration.json"
        calibrate(calibration, url, server_args=server_args)
    arrivals = arrivals_from_flags(concurrency, None, False, time_scale)
    rows: list[tuple[str, dict[str, Any]]] = []
    dirs: list[Path] = []
    # The simulator models llama.cpp's slots, a closed loop and the trace's own tool latencies.
    simulable = runtime == "llamacpp" and inject == "none" and time_scale == 1.0
    t0 = time.monotonic()
    for policy in names:
        d = root / policy
        click.echo(f"[{time.monotonic() - t0:6.0f}s] {policy}: replaying {trace} ...")
        args = (parse_kv(policy_args, "--policy-arg")
                if policy in ("ttl", "threshold", "min-waste") else {})
        run = execute_run(RunOptions(
            trace=trace, policy=policy, out=d, runtime=runtime, url=url, policy_args=args,
            inject=inject, arrivals=arrivals, seed=seed, slots=slots,
            ctx_per_slot=ctx_per_slot, calibration=calibration, server_args=server_args),
            lambda m: click.echo(m, err=True))
        dirs.append(d)
        if calibration is not None:
            write_json(d / "prediction.json", predict(trace, policy, calibration))
            if simulable:
                simulate_like(d, trace, policy, args, calibration, root / f"{policy}-simulated")
                dirs.append(root / f"{policy}-simulated")
        summary = read_json(d / SUMMARY_JSON) if (d / SUMMARY_JSON).exists() else {}
        rows.append((policy, summary))
        o = run.get("outcome", {})
        click.echo(f"[{time.monotonic() - t0:6.0f}s] {policy}: {o.get('completed', 0)} "
                   f"completed, {o.get('cancelled', 0)} cancelled, {o.get('failed', 0)} failed")
    from harness.report.render import render_report

    report = root / "report.html"
    report.write_text(render_report(dirs), encoding="utf-8")
    click.echo("")
    click.echo(headline_table(rows))
    click.echo(f"\nresults: {root}\nreport:  {report}")
