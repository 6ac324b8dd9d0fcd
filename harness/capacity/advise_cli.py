"""`harness advise`: which pause policy (and server settings) to run, searched on the calibrated
simulator and confirmed on the live server.

The simulator ranks every candidate on the objective under the SLO (harness.capacity.advise);
the best one and the best fixed policy (keep, swap or recompute) are then measured on the
server at the recommended operating point. The recommendation is the confirmed candidate with
the best measured objective; where the simulator missed by more than the tolerance the
advisor says so, says that the recommendation rests on measurement, and exits non-zero.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

from harness.adapters.runtimes import RUNTIMES, get_runtime
from harness.capacity.advise import (
    OBJECTIVES,
    SPACE,
    better,
    candidate_space,
    objective_value,
    simulate_candidates,
    simulated_measure,
)
from harness.capacity.budget import Budget
from harness.capacity.cli import CONFIRM_FAILED_EXIT, parse_search, search_options
from harness.capacity.driver import PointSpec, SearchSettings, judge_point, search_policy
from harness.capacity.explain import explain
from harness.capacity.live import live_measure, nan_free
from harness.capacity.slo import Slo
from harness.errors import InputError
from harness.limits import MAX_SEED
from harness.model.calibration import read_calibration
from harness.records.store import write_json
from harness.replay.bench import shipped_trace
from harness.replay.cli import (
    RunOptions,
    arrivals_from_flags,
    auth_options,
    check_url,
    ensure_out_dir,
    headers_from_flags,
    timeout_options,
    timeouts_from_flags,
    token_scale_option,
)
from harness.report.fidelity import relative_error
from harness.traces.scale import check_token_scale, scale_tokens
from harness.traces.validate import load_trajectories

ADVICE_JSON = "advice.json"
FIGURES = ("resume_latency_ms", "ttft_ms", "success_rate", "goodput_per_min",
           "kv_paused_mean_mib")


def int_list(flag: str, text: str, low: int, high: int) -> list[int]:
    """'4' or '2,4,8' as integers in [low, high]; InputError naming `flag` otherwise."""
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise InputError(f"{flag} {text!r}: expected whole numbers, comma-separated") from None
    if not out or any(not low <= v <= high for v in out) or len(set(out)) != len(out):
        raise InputError(f"{flag} {text!r}: expected distinct whole numbers in [{low}, {high}]")
    return out


def rel_error(predicted: float | None, measured: float | None) -> float | None:
    """|predicted - measured| / measured (None when either is unknown or measured is 0)."""
    err = relative_error(predicted, measured)
    return None if err is None else abs(err)


def compare(row: dict[str, Any], measured: dict[str, Any], measured_objective: float | None,
            tolerance: float) -> dict[str, Any]:
    """A confirmed candidate: predicted and measured figures side by side, and the errors."""
    pred = row["predicted"]
    err: dict[str, float | None] = {}
    for q in ("p50", "p95", "p99"):
        err[f"resume_{q}"] = rel_error((pred.get("resume_latency_ms") or {}).get(q),
                                       (measured.get("resume_latency_ms") or {}).get(q))
    err["objective"] = (rel_error(pred["objective"], max(measured_objective or 0.0, 1.0))
                        if row["objective"] == "capacity"
                        else rel_error(pred["objective"], measured_objective))
    return {"label": row["label"], "key": row["key"], "fixed": row["fixed"],
            "agents": pred["agents"], "dir": measured.get("dir"), "predicted": pred,
            "measured": {**{k: measured.get(k) for k in FIGURES},
                         "meets_slo": measured.get("passed"), "objective": measured_objective,
                         "agents": pred["agents"]},
            "error": err,
            "objective_within_tolerance": err["objective"] is None
            or err["objective"] <= tolerance,
            "within_tolerance": all(e is None or e <= tolerance for e in err.values())}


def pick_confirmed(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The best candidate and the best fixed policy (and the runner-up when they are one)."""
    best = rows[0]
    fixed = next(r for r in rows if r["fixed"])
    if fixed is not best:
        return [best, fixed]
    return [best, *[r for r in rows[1:2]]]


def confirm(rows: list[dict[str, Any]], slo: Slo, measure: Any, root: Path, budget: Budget,
            settings: SearchSettings, objective: str, tolerance: float,
            echo: Callable[[str], None]) -> list[dict[str, Any]]:
    """Measure the chosen candidates on the server: for capacity a live search started at the
    predicted capacity, else one point at the operating point."""
    out = []
    chosen = pick_confirmed(rows)
    for i, r in enumerate(chosen):
        share = budget.share_s(len(chosen) - i)
        spec = PointSpec(r["policy"], r["policy_args"], r["agents"], label=r["key"])
        if objective == "capacity":
            entry = search_policy(spec, slo, measure, root, share, SearchSettings(
                start=max(r["capacity"], 1), max_agents=settings.max_agents, growth=1.25,
                resolution=settings.resolution, confirm=False, clock=settings.clock),
                _progress(echo, r["label"]))
            first = entry["points"][0] if entry["points"] else {}
            value: float | None = float(entry["capacity"])
            out.append(compare(r, first, value, tolerance) | {
                "live_capacity": entry["capacity"], "live_reason": entry["reason"],
                "live_points": entry["points"]})
        else:
            s = PointSpec(r["policy"], r["policy_args"], r["agents"], phase="confirm",
                          label=r["key"])
            d = s.dir(root)
            point = judge_point(s, measure(s, d), slo, d, 0.0)
            value = objective_value(objective, point, 0) if point["passed"] else None
            echo(f"live {r['label']}: n={r['agents']} {point['text']}")
            out.append(compare(r, point, value, tolerance))
    return out


def _progress(echo: Callable[[str], None], label: str) -> Callable[[dict[str, Any]], None]:
    shown = [0]

    def show(entry: dict[str, Any]) -> None:
        for p in entry["points"][shown[0]:]:  # each point once
            echo(f"live {label}: n={p['agents']} {p['text']} -> "
                 f"{'pass' if p['passed'] else 'fail'}")
        shown[0] = len(entry["points"])
    return show


def recommend(confirmed: list[dict[str, Any]], objective: str) -> dict[str, Any]:
    """The confirmed candidate with the best measured objective (ties: the simulator's rank)."""
    key = better(objective)
    scored = [c for c in confirmed if c["measured"]["objective"] is not None]
    if not scored:
        return {"label": None, "why": "no confirmed candidate met the SLO on the server",
                "rests_on": "measurement"}
    best = max(scored, key=lambda c: key(c["measured"]["objective"]))
    top = confirmed[0]
    agree = best is top and all(c["within_tolerance"] for c in confirmed)
    why = (f"best {objective} under the SLO in simulation, confirmed on the server"
           if agree else f"best measured {objective} under the SLO of the candidates confirmed")
    return {"label": best["label"], "key": best["key"], "why": why,
            "rests_on": "simulation" if agree else "measurement",
            "measured_objective": best["measured"]["objective"],
            "predicted_objective": best["predicted"]["objective"]}


def disagreement(confirmed: list[dict[str, Any]], tolerance: float) -> str | None:
    """What the simulator missed by more than the tolerance, in one sentence, or None."""
    misses = []
    for c in confirmed:
        for k, e in c["error"].items():
            if e is not None and e > tolerance:
                misses.append(f"{c['label']} {k.replace('_', ' ')} by {e:.0%}")
    if not misses:
        return None
    return (f"the simulator missed by more than {tolerance:.0%}: {', '.join(misses)}; "
            "the recommendation rests on measurement")


@click.command("advise")
@click.option("--trace", "trace_path", type=click.Path(path_type=Path),
              help="Trajectory file (default: the shipped traces/bench-small.parquet).")
@click.option("--calibration", required=True, type=click.Path(path_type=Path),
              help="Rates from `harness calibrate` for the simulator (measure next to the "
                   "server confirmed on).")
@click.option("--objective", type=click.Choice(OBJECTIVES), default="capacity",
              show_default=True)
@click.option("--policies", default=",".join(SPACE), show_default=True,
              help="The policy families searched (with the parameters the advisor tries).")
@click.option("--slots", "slots_text", default="4", show_default=True,
              help="Slot counts the server may run with, e.g. 2,4,8.")
@click.option("--ctx-per-slot", "ctx_text", default="4096", show_default=True,
              help="Context per slot the server may run with, e.g. 2048,4096.")
@click.option("--agents", type=click.IntRange(1, 100_000),
              help="memory-time: the operating point (default: the best fixed policy's "
                   "simulated capacity).")
@click.option("--tolerance", type=click.FloatRange(0.0, 10.0, min_open=True), default=0.15,
              show_default=True, help="The most the prediction may miss the measurement by.")
@search_options
@click.option("--runtime", type=click.Choice(list(RUNTIMES)), default="llamacpp",
              show_default=True)
@click.option("--url", help="A running server (then --slots and --ctx-per-slot are its own).")
@click.option("--seed", type=click.IntRange(0, MAX_SEED), default=0, show_default=True)
@token_scale_option
@click.option("--out", type=click.Path(path_type=Path),
              help="Results root (default: reports/advise-<UTC time>).")
@timeout_options
@auth_options
def advise_cmd(trace_path: Path | None, calibration: Path, objective: str, policies: str,
               slots_text: str, ctx_text: str, agents: int | None, tolerance: float,
               slo_spec: str, budget: str, point_duration: str, warmup: str, start: int,
               max_agents: int, resolution: float, no_confirm: bool, runtime: str,
               url: str | None, seed: int, token_scale: float, out: Path | None,
               connect_timeout: float, first_token_timeout: float, stall_timeout: float,
               request_timeout: float, api_key: str | None, headers: tuple[str, ...],
               skip_oversized: bool) -> None:
    """Recommend a pause policy: search in simulation, confirm on the live server."""
    slo, budget_s, duration_s, warmup_s, settings = parse_search(
        slo_spec, budget, point_duration, warmup, start, max_agents, resolution, no_confirm)
    slots = int_list("--slots", slots_text, 1, 65_536)
    ctx = int_list("--ctx-per-slot", ctx_text, 16, 16_777_216)
    if url and (len(slots) > 1 or len(ctx) > 1):
        raise InputError("--url: the server's own slots and context are what it has; give "
                         "one --slots and one --ctx-per-slot (its settings)")
    check_token_scale(token_scale)
    check_url(url)
    cal = read_calibration(calibration)
    trace = trace_path or shipped_trace()
    steps = scale_tokens(load_trajectories(trace), token_scale)
    cands = candidate_space([p.strip() for p in policies.split(",") if p.strip()], slots, ctx)
    root = out or Path("reports") / f"advise-{datetime.now(UTC):%Y%m%dT%H%M%SZ}"
    ensure_out_dir(root)
    budget_clock = Budget(budget_s, settings.clock)
    by_key = {c.key(): c for c in cands}

    def server_of(spec: PointSpec) -> tuple[int, int]:
        c = by_key[spec.label]
        return c.slots, c.ctx_per_slot

    click.echo(f"simulating {len(cands)} candidates ...")
    rows = simulate_candidates(
        cands, slo, simulated_measure(trace, cal, calibration, duration_s, warmup_s, seed,
                                      token_scale, server_of),
        root / "simulated", settings, objective, agents, click.echo)
    for r in rows:
        r["objective"] = objective
    doc: dict[str, Any] = {"kind": "advice", "slo": slo.spec(), "objective": objective,
                           "trace": str(trace), "calibration": str(calibration),
                           "tolerance": tolerance, "candidates": rows, "confirmed": [],
                           "point": {"duration_s": duration_s, "warmup_s": warmup_s}}
    write_json(root / ADVICE_JSON, nan_free(doc))
    if settings.confirm:
        base = RunOptions(
            trace=trace, policy="", out=Path(), runtime=runtime, url=url, seed=seed,
            arrivals=arrivals_from_flags(1, None, False, 1.0), token_scale=token_scale,
            timeouts=timeouts_from_flags(connect_timeout, first_token_timeout, stall_timeout,
                                         request_timeout),
            headers=headers_from_flags(api_key, headers, url), skip_oversized=skip_oversized,
            calibration=calibration)
        measure = live_measure(base, get_runtime(runtime), duration_s, warmup_s,
                               lambda m: click.echo(m, err=True),
                               lambda spec: dict(zip(("slots", "ctx_per_slot"),
                                                     server_of(spec), strict=True)))
        doc["confirmed"] = confirm(rows, slo, measure, root / "live", budget_clock, settings,
                                   objective, tolerance, click.echo)
        doc["recommendation"] = recommend(doc["confirmed"], objective)
        fixed = next(c for c in doc["confirmed"] if c["fixed"])
        doc["best_fixed"] = {"label": fixed["label"],
                             "measured_objective": fixed["measured"]["objective"],
                             "predicted_objective": fixed["predicted"]["objective"]}
        doc["disagreement"] = disagreement(doc["confirmed"], tolerance)
    else:
        top = rows[0]
        doc["recommendation"] = {"label": top["label"], "key": top["key"],
                                 "why": f"best {objective} under the SLO in simulation "
                                        "(not confirmed: --no-confirm)",
                                 "rests_on": "simulation",
                                 "predicted_objective": top["predicted"]["objective"]}
    chosen = next((r for r in rows if r["key"] == doc["recommendation"].get("key")), rows[0])
    doc["explain"] = explain(steps, cal, Path(chosen["predicted"]["dir"])
                             if chosen["predicted"].get("dir") else None)
    doc["elapsed_s"] = budget_clock.elapsed_s()
    write_json(root / ADVICE_JSON, nan_free(doc))
    write_advice_report(root, doc)
    click.echo("")
    click.echo(advice_text(doc))
    click.echo(f"\nresults: {root}\nreport:  {root / 'report.html'}")
    if doc["confirmed"] and not all(c["objective_within_tolerance"] for c in doc["confirmed"]):
        click.echo(f"error: the confirmation disagrees with the prediction by more than "
                   f"{tolerance:.0%} on the objective; the results are kept", err=True)
        sys.exit(CONFIRM_FAILED_EXIT)


def simulated_pick(trace: Path, calibration: Path, slo: Slo, slots: int, ctx_per_slot: int,
                   token_scale: float, seed: int, root: Path, duration_s: float = 45.0,
                   warmup_s: float = 10.0, objective: str = "capacity") -> dict[str, Any]:
    """The advisor's pick in simulation alone (what `bench` shows when it has a calibration):
    advice.json under `root` without a live confirmation; returns its recommendation."""
    cal = read_calibration(calibration)
    cands = candidate_space(list(SPACE), [slots], [ctx_per_slot])
    by_key = {c.key(): (c.slots, c.ctx_per_slot) for c in cands}
    rows = simulate_candidates(
        cands, slo, simulated_measure(trace, cal, calibration, duration_s, warmup_s, seed,
                                      token_scale, lambda spec: by_key[spec.label]),
        root / "simulated", SearchSettings(), objective, None, lambda m: None)
    top = rows[0]
    rec = {"label": top["label"], "key": top["key"], "rests_on": "simulation",
           "why": f"best {objective} under the SLO in simulation (not confirmed)",
           "predicted_objective": top["predicted"]["objective"],
           "predicted": top["predicted"]}
    write_json(root / ADVICE_JSON, nan_free({
        "kind": "advice", "slo": slo.spec(), "objective": objective, "trace": str(trace),
        "calibration": str(calibration), "candidates": rows, "confirmed": [],
        "recommendation": rec}))
    return rec


def advice_text(doc: dict[str, Any]) -> str:
    """The recommendation with predicted and measured figures side by side."""
    rec = doc["recommendation"]
    lines = [f"recommendation ({doc['objective']}, SLO {doc['slo']}): {rec.get('label')} "
             f"- {rec['why']} (rests on {rec['rests_on']})"]
    if doc.get("best_fixed"):
        bf = doc["best_fixed"]
        lines.append(f"best fixed policy: {bf['label']}, measured {doc['objective']} "
                     f"{_num(bf['measured_objective'])}")
    head = (f"{'candidate':<28}{'agents':>7}{'pred p95':>10}{'meas p95':>10}{'err':>6}"
            f"{'pred obj':>10}{'meas obj':>10}{'err':>6}")
    lines += ["", head, "-" * len(head)]
    for c in doc.get("confirmed") or []:
        p95 = [((c[k].get("resume_latency_ms") or {}).get("p95")) for k in ("predicted",
                                                                             "measured")]
        e = c["error"]
        lines.append(f"{c['label'][:27]:<28}{c['agents']:>7}{_num(p95[0]):>10}"
                     f"{_num(p95[1]):>10}{_pct(e.get('resume_p95')):>6}"
                     f"{_num(c['predicted']['objective']):>10}"
                     f"{_num(c['measured']['objective']):>10}{_pct(e.get('objective')):>6}")
    if doc.get("disagreement"):
        lines.append(f"note: {doc['disagreement']}")
    return "\n".join(lines)


def _num(v: Any) -> str:
    return "-" if v is None else f"{v:,.1f}" if isinstance(v, float) and v < 100 else f"{v:,.0f}"


def _pct(v: Any) -> str:
    return "-" if v is None else f"{v:.0%}"


def write_advice_report(root: Path, doc: dict[str, Any], out: Path | None = None) -> Path:
    """report.html (or `out`): the advice section, then the confirmed live runs side by
    side."""
    from harness.report.capacity_view import advice_section
    from harness.report.data import load_runs
    from harness.report.render import render_runs

    dirs = [Path(c["dir"]) for c in doc.get("confirmed") or [] if c.get("dir")]
    runs = load_runs([d for d in dirs if d.is_dir()])
    out = out or root / "report.html"
    out.write_text(render_runs(runs, lead=advice_section(doc), title="Pause-policy advice"),
                   encoding="utf-8")
    return out
