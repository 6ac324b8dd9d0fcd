"""An advice as a report section: advice.json (`harness advise`) as an HTML fragment.

A pure function of the typed result (harness.advise.result): any field may be missing or None
(shown '-'), and every text taken from the document is escaped.
"""

from __future__ import annotations

import html
from collections.abc import Callable
from typing import Any

from harness.advise.result import (
    AdviceResult,
    BestFixed,
    ConfirmedCandidate,
    Figures,
    Recommendation,
    SimulatedCandidate,
    ToolClassExplain,
)
from harness.capacity.view import RESUME, esc, esc_num, finite, percent, yes_no
from harness.metrics.summary_types import Quantiles
from harness.report.fmt import table

OBJECTIVES = {"capacity": "agents under the SLO", "memory-time": "paused KV memory-time",
              "goodput": "successful tasks per minute under the SLO"}


def _resume(q: str) -> Callable[[Figures], Any]:
    return lambda f: (f.resume_latency_ms or Quantiles()).at(q)


# Predicted vs measured: (column head, the figure, keys of its error)
COMPARED: tuple[tuple[str, Callable[[Figures], Any], tuple[str, ...]], ...] = (
    *((h, _resume(q), (f"resume_{q}",)) for h, q in RESUME),
    ("success", lambda f: f.success_rate, ("success_rate", "success")),
    ("goodput / min", lambda f: f.goodput_per_min, ("goodput_per_min", "goodput")),
    ("paused KV MiB (mean)", lambda f: f.kv_paused_mean_mib, ("kv_paused_mean_mib",)),
    ("objective", lambda f: f.objective, ("objective",)))


def _recommendation(result: AdviceResult) -> str:
    """The banner: the recommended policy, its objective and what it rests on; the best fixed."""
    rec, fixed = result.recommendation, result.best_fixed
    obj = esc(result.objective)

    def figures(x: Recommendation | BestFixed) -> str:
        return (f"<b>{esc(x.label)}</b> ({obj} {esc_num(x.measured_objective)} "
                f"measured, {esc_num(x.predicted_objective)} predicted)")

    if rec is None or not rec.to_json():
        return ""
    why = (rec.why or "").strip()
    why = f" {esc(why)}{'' if why.endswith(('.', '!', '?')) else '.'}" if why else ""
    shown = (f"Recommendation: {figures(rec)}; it rests on {esc(rec.rests_on)}.{why}"
             + (f" Best fixed policy: {figures(fixed)}." if fixed and fixed.to_json() else ""))
    return f"<p class='banner'>{shown}</p>"


def _label(c: SimulatedCandidate | ConfirmedCandidate, recommended: str | None = None) -> str:
    chosen = recommended is not None and c.label == recommended
    return (esc(c.label) + " <span class='badge'>fixed</span>" * (c.fixed is True)
            + " <span class='badge'>recommended</span>" * chosen)


def _compared(c: ConfirmedCandidate) -> list[str]:
    """Predicted / measured of each figure, the advisor's relative error beneath."""
    pred, meas = c.predicted or Figures(), c.measured or Figures()
    cells = []
    for head, figure, keys in COMPARED:
        show: Callable[[Any], str] = percent if head == "success" else esc_num
        e = finite(c.error_of(*keys))
        below = "" if e is None else f"<span class='ci'>error {100 * e:.1f}%</span>"
        cells.append(f"{show(figure(pred))} / {show(figure(meas))}{below}")
    return cells


def _candidate_row(c: SimulatedCandidate, recommended: str | None) -> list[str]:
    p = c.predicted or Figures()
    shape = (f"{esc_num(c.kv_tokens)} tokens" if c.kv_tokens is not None
             else "-" if c.slots is None and c.ctx_per_slot is None
             else f"{esc_num(c.slots)} x {esc_num(c.ctx_per_slot)}")
    return [esc_num(c.rank), _label(c, recommended), shape, yes_no(c.fixed),
            esc_num(p.capacity), esc_num(p.agents), esc_num(p.resume_p95_ms),
            esc_num(p.goodput_per_min), esc_num(p.kv_paused_mean_mib), esc_num(p.objective)]


def _explain_row(x: ToolClassExplain) -> list[str]:
    acts = sorted(((str(a), k) for a, k in (x.actions or {}).items()),
                  key=lambda ak: -(finite(ak[1]) or 0.0))
    restore = x.restore_ms or {}
    return [esc(x.tool_class), esc_num(x.pauses),
            *(esc_num((q or {}).get(p)) for q in (x.wait_s, x.retained_tokens)
              for p in ("p50", "p95")),
            esc_num(restore.get("swap")), esc_num(restore.get("recompute")),
            ", ".join(f"{html.escape(a)} {esc_num(k)}" for a, k in acts) or "-"]


def advice_section(result: AdviceResult) -> str:
    """The 'Advice' section of `harness advise`'s result (advice.json)."""
    cands, confirmed = result.ranked(), result.confirmations()
    explain = list(result.explain or [])
    rec = result.recommendation if result.recommendation and result.recommendation.to_json() \
        else None
    parts = ["<h2>Advice</h2>"]
    if not (rec or cands or confirmed or explain):
        return parts[0] + ("<p class='note'>No advice was computed (no candidate measured or "
                           "simulated).</p>")
    obj = result.objective
    words = f" ({html.escape(OBJECTIVES[obj])})" if obj in OBJECTIVES else ""
    parts += [f"<p class='note'>SLO {esc(result.slo)}; objective {esc(obj)}{words}; simulator "
              f"calibration {esc(result.calibration)}; a prediction is confirmed when within "
              f"{percent(result.tolerance)} of the measurement.</p>", _recommendation(result)]
    if result.disagreement:
        parts.append(f"<p class='banner'>{esc(result.disagreement)}</p>")
    if confirmed:
        rows = [[_label(c), esc_num(c.agents), *_compared(c), yes_no(c.within_tolerance)]
                for c in confirmed]
        parts += ["<h3>Predicted and measured</h3>",
                  table(["candidate", "agents", *(h for h, _, _ in COMPARED), "within tolerance"],
                        rows),
                  "<p class='note'>Cells: simulated / measured at the candidate's operating "
                  "point; beneath, the advisor's relative error.</p>"]
    label = rec.label if rec else None
    if cands:
        order = sorted(cands, key=lambda c: (c.rank is None, c.rank or 0))
        heads = ["rank", "candidate", "server (slots x ctx, KV pool)", "fixed",
                 "predicted capacity", "operating point (agents)", "resume P95 ms", "goodput / min",
                 "paused KV MiB (mean)", "objective"]
        parts += ["<h3>Candidates (simulated)</h3>",
                  table(heads, [_candidate_row(c, label) for c in order], 2)]
    if explain:
        heads = ["tool class", "pauses", "wait P50 s", "wait P95 s", "retained tokens P50",
                 "retained tokens P95", "restore by swap ms", "restore by recompute ms",
                 f"actions of {esc(label)}"]
        parts += ["<h3>Why, per tool class</h3>", table(heads, [_explain_row(x) for x in explain]),
                  "<p class='note'>Per tool class of the trace: its pauses, how long they wait, "
                  "the context a pause retains, what restoring it costs by swap-in and by "
                  "recompute, and what the recommended policy chose to do with it.</p>"]
    return "".join(p for p in parts if p)
