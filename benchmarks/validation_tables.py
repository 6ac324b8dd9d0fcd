"""The tables benchmarks/validate_simulator.py writes (validation.md), from its rows."""

from __future__ import annotations

import math
from typing import Any

from harness.model.run_rates import IN_FLIGHT

QUANTILES = ("p50", "p95", "p99")


def _reuse(r: dict[str, Any]) -> str:
    if r["reuse_measured"] is None:
        return "-"
    return f"{r['reuse_measured'] * 100:.1f}% / {r['reuse_simulated'] * 100:.1f}%"


def _clipped(r: dict[str, Any]) -> str:
    """'measured / simulated' share of the hinted pauses clipped ('-' without hints)."""
    c0, c1 = r.get("clipped_measured"), r.get("clipped_simulated")
    if c0 is None or c1 is None:
        return "-"
    return f"{c0 * 100:.1f}% / {c1 * 100:.1f}%"


def _preempted(r: dict[str, Any]) -> str:
    p = r.get("preempted_calls")
    return "-" if p is None else f"{p[0]} / {p[1]}"


def _paired(r: dict[str, Any]) -> str:
    p = r.get("server_time_measured_over_simulated") or {}
    if not p.get("calls"):
        return "-"
    return ", ".join("-" if p.get(k) is None else f"x{p[k]:.2f}" for k in ("prompt", "decode"))


def _ms(v: float | None) -> str:
    if v is None or math.isnan(v):
        return "-"
    return f"{max(v, 0.0):,.0f}"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v * 100:+.0f}%"


def _ranges(spans: dict[str, Any] | None) -> str:
    """'a-b / c-d / e-f' of a {p50: [lo, hi], ...} mapping ('-' for a missing one)."""
    return " / ".join("-" if not (v := (spans or {}).get(q)) else f"{_ms(v[0])}-{_ms(v[1])}"
                      for q in QUANTILES)


def _seeds(r: dict[str, Any]) -> str:
    spans = r.get("simulated_seeds") or {}
    return f"{_ranges(spans)} ({spans.get('runs', 1)})"


def table(rows: list[dict[str, Any]]) -> str:
    out = ["| policy | resumes | simulated P50 / P95 / P99 ms | simulated range over draw seeds "
           "(runs) | measured P50 / P95 / P99 ms | measured 95% CI P50 / P95 / P99 | error P50 "
           "/ P95 / P99 | reuse measured / simulated | hints clipped measured / simulated | "
           "server time measured / simulated, same calls: prompt, decode | running calls "
           "preempted measured / simulated | target |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        s, m, e = r["simulated"], r["measured"], r["error"]
        out.append(f"| {r['policy']} | {r['resumes']} | {_ms(s['p50'])} / {_ms(s['p95'])} / "
                   f"{_ms(s['p99'])} | {_seeds(r)} | {_ms(m['p50'])} / {_ms(m['p95'])} / "
                   f"{_ms(m['p99'])} | {_ranges(r.get('measured_ci95'))} | {_pct(e['p50'])} / "
                   f"{_pct(e['p95'])} / {_pct(e['p99'])} | {_reuse(r)} | {_clipped(r)} | "
                   f"{_paired(r)} | "
                   f"{_preempted(r)} | {'met' if r['target_met'] else 'MISSED'} |")
    return "\n".join(out)


def _waits(w: dict[str, dict[str, Any]]) -> str:
    text = " / ".join(f"{_ms(w[k]['p50'])} ({_ms(w[k]['p95'])})" for k in ("alone", "shared"))
    if all(w[k].get("queue_p50") is not None for k in ("alone", "shared")):
        text += " [" + " / ".join(f"{_ms(w[k]['queue_p50'])} ({_ms(w[k]['queue_p95'])})"
                                  for k in ("alone", "shared")) + "]"
    return text


def rates_table(rows: list[dict[str, Any]]) -> str:
    out = ["| policy | from | server time / calibrated: prompt, decode | "
           "simulated at those rates P50 / P95 / P99 ms | simulated range over draw seeds "
           "(runs) | error P50 / P95 / P99 | "
           "reuse measured / simulated | hints clipped measured / simulated | "
           "time to first token less the server's prompt time, "
           "sent alone / with company, P50 (P95) ms: measured [of it in the engine's queue, "
           "as the server reports it]; simulated at the engine | "
           "target |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        f, s, e, w = r["rate_factors"], r["simulated"], r["error"], r["waits_ms"]
        out.append(f"| {r['policy']} | {f['source']} | x{f['prefill'] or 1:.2f}, "
                   f"x{f['decode'] or 1:.2f} | {_ms(s['p50'])} / {_ms(s['p95'])} / "
                   f"{_ms(s['p99'])} | {_seeds(r)} | {_pct(e['p50'])} / {_pct(e['p95'])} / "
                   f"{_pct(e['p99'])} | {_reuse(r)} | {_clipped(r)} | {_waits(w['measured'])}; "
                   f"{_waits(w['simulated_engine_only'])} | "
                   f"{'met' if r['target_met'] else 'MISSED'} |")
    return "\n".join(out)


def pinned_table(rows: list[dict[str, Any]]) -> str:
    out = ["| policy | at | simulated P50 / P95 / P99 ms | simulated range over draw seeds "
           "(runs) | error P50 / P95 / P99 | reuse measured / simulated | hints clipped measured "
           "/ simulated | of its times reached late (at most, s) | target |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        s, e, p = r["simulated"], r["error"], r["pinned"]
        out.append(f"| {r['policy']} | {r['at']} | {_ms(s['p50'])} / {_ms(s['p95'])} / "
                   f"{_ms(s['p99'])} | {_seeds(r)} | {_pct(e['p50'])} / {_pct(e['p95'])} / "
                   f"{_pct(e['p99'])} | {_reuse(r)} | {_clipped(r)} | "
                   f"{p['late']} of {p['pinned_events']} "
                   f"({p['late_max_s']:.2f}) | {'met' if r['target_met'] else 'MISSED'} |")
    return "\n".join(out)


def waits_table(rows: list[dict[str, Any]]) -> str:
    """Each run's waits beyond the prompt time, by what was in flight when its calls were sent
    (each run by its own company: harness.model.run_rates.waits_in_flight)."""
    out = ["| policy | " + " | ".join(
        f"{name}: measured (calls); simulated at the engine (calls), P50 (P95) ms"
        for name in ("nothing in flight", "only decoding calls", "a call's prompt in flight"))
        + " |", "|---|---|---|---|"]

    def cell(g: dict[str, Any] | None) -> str:
        return f"{_ms(g['p50'])} ({_ms(g['p95'])}) ({g['n']})" if g and g["n"] else "- (0)"

    for r in rows:
        w = r.get("waits_in_flight_ms") or {}
        m, s = w.get("measured") or {}, w.get("simulated_engine_only") or {}
        cells = [f"{cell(m.get(k))}; {cell(s.get(k))}" for k in IN_FLIGHT]
        out.append(f"| {r['policy']} | " + " | ".join(cells) + " |")
    return "\n".join(out)
