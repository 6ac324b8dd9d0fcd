"""Simulated vs measured: the simulator's error where a report holds both for one trace and policy.

A simulated run and a real run pair up when they replayed the same trace file (its sha256) under
the same policy; the section compares their resume latency percentiles and TTFT, each as the
simulated value, the measured one and the relative error.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from harness.records.manifest import RunManifest
from harness.report.data import RunData
from harness.report.fmt import fmt, table

PERCENTILES = ("p50", "p95", "p99")


@dataclass(frozen=True)
class Pair:
    """One simulated run and the real run it models."""

    simulated: RunData
    measured: RunData


def _key(r: RunData) -> tuple[Any, Any]:
    return (r.run.trace.sha256 if r.run.trace else None, r.run.policy)


def pairs(runs: list[RunData]) -> list[Pair]:
    """Every (simulated, real) pair of runs with the same trace sha256 and policy, in order."""
    real = [r for r in runs if not r.simulated and _key(r)[0]]
    return [Pair(s, m) for s in runs if s.simulated and _key(s)[0]
            for m in real if _key(m) == _key(s)]


def relative_error(simulated: Any, measured: Any) -> float | None:
    """simulated / measured - 1, or None where either is missing or measured is zero."""
    if simulated is None or measured is None:
        return None
    sim, real = float(simulated), float(measured)
    if real == 0 or sim != sim or real != real:
        return None
    return sim / real - 1


def calibration_age_s(simulated_run: RunManifest, measured_run: RunManifest) -> float | None:
    """Seconds from the simulator's calibration to the start of the real run (negative: the
    calibration came after it); None where either time is unknown."""
    try:
        cal = datetime.fromisoformat(str((simulated_run.calibration or {})["measured_at"]))
        started = datetime.fromisoformat(str(measured_run.started_at))
        return (started - cal).total_seconds()
    except (KeyError, TypeError, ValueError):
        return None


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    sign, m = ("-" if seconds < 0 else ""), abs(seconds) / 60
    return f"{sign}{m:.0f} min" if m < 120 else f"{sign}{m / 60:.1f} h"


def _cell(sim_q: dict[str, Any], real_q: dict[str, Any], key: str) -> str:
    err = relative_error(sim_q.get(key), real_q.get(key))
    shown = "-" if err is None else f"{err:+.1%}"
    return (f"{fmt(sim_q.get(key))} / {fmt(real_q.get(key))}"
            f"<span class='ci'>{shown}</span>")


def fidelity_section(runs: list[RunData]) -> str:
    """The 'Simulated vs measured' table, or '' when no pair is in the report."""
    found = pairs(runs)
    if not found:
        return ""
    heads = (["policy", "simulated run", "measured run"]
             + [f"resume {q.upper()} ms" for q in PERCENTILES]
             + ["TTFT P50 ms", "resumes", "calibration before the run"])
    rows = []
    for p in found:
        sim, real = p.simulated.summary, p.measured.summary
        sr, mr = sim["resume_latency_ms"] or {}, real["resume_latency_ms"] or {}
        rows.append([html.escape(str(p.measured.run.policy)),
                     html.escape(p.simulated.label), html.escape(p.measured.label),
                     *(_cell(sr, mr, q) for q in PERCENTILES),
                     _cell(sim["ttft_ms"] or {}, real["ttft_ms"] or {}, "p50"),
                     f"{fmt(sr.get('n'))} / {fmt(mr.get('n'))}",
                     _age(calibration_age_s(p.simulated.run, p.measured.run))])
    note = ("<p class='note'>Cells: simulated / measured, and the simulator's relative error. "
            "Pairs: a simulated and a real run of the same trace file (sha256) and policy. The "
            "simulator's costs come from its calibration file only; measure it next to the "
            "replay it should predict (a machine's speed drifts: the last column says how long "
            "before the real run the calibration was measured).</p>")
    return ("<h2 id='fidelity'>Simulated vs measured</h2>"
            + table(heads, rows, text_cols=3) + note)
