"""`advise`: which pause policy (and server settings) to run, searched on the calibrated
simulator and confirmed on the live server.

The simulator ranks every candidate on the objective under the SLO (harness.advise.candidates);
the best one and the best fixed policy (keep, swap or recompute) are then measured on the
server at the recommended operating point (harness.advise.confirm). The recommendation is the
confirmed candidate with the best measured objective; where the simulator missed by more than
the tolerance the advice says so, and that the recommendation rests on measurement.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.adapters.base import Runtime
from harness.adapters.runtimes import get_runtime
from harness.advise.candidates import candidate_space, simulate_candidates, simulated_measure
from harness.advise.confirm import confirm, disagreement, recommend
from harness.advise.explain import explain
from harness.capacity.budget import Budget
from harness.capacity.driver import PointSpec, SearchSpec
from harness.capacity.live import live_measure, nan_free
from harness.model.calibration import read_calibration
from harness.records.store import ensure_out_dir, write_json
from harness.replay.options import RunOptions
from harness.replay.run import to_stderr
from harness.report.capacity_view import advice_section
from harness.report.data import load_runs
from harness.report.render import render_runs
from harness.traces.scale import scale_tokens
from harness.traces.validate import load_trajectories

ADVICE_JSON = "advice.json"


@dataclass(frozen=True)
class AdvisePlan:
    """An advice, as asked for: the trace and calibration the simulator runs on, the policy
    families and server settings searched, the objective under the search's SLO, and (with
    `search.settings.confirm`) how the live server is reached: `live` holds the runtime, URL,
    seed, token scale, timeouts and headers of the confirming runs."""

    root: Path
    trace: Path
    calibration: Path
    objective: str
    policies: tuple[str, ...]
    slots: tuple[int, ...]
    ctx_per_slot: tuple[int, ...]
    search: SearchSpec
    live: RunOptions
    agents: int | None = None  # memory-time's operating point (None: the simulator's)
    tolerance: float = 0.15


def advise(plan: AdvisePlan, echo: Callable[[str], None] = print,
           runtime: Runtime | None = None) -> dict[str, Any]:
    """Search the candidates in simulation, confirm the chosen ones on the server (unless the
    plan says not to), explain the pick, write advice.json and report.html under the plan's
    root; returns advice.json's content. InputError for bad input, before the first run."""
    cal = read_calibration(plan.calibration)
    steps = scale_tokens(load_trajectories(plan.trace), plan.live.token_scale)
    cands = candidate_space(list(plan.policies), list(plan.slots), list(plan.ctx_per_slot))
    ensure_out_dir(plan.root)
    s = plan.search
    budget = Budget(s.budget_s, s.settings.clock)
    by_key = {c.key(): c for c in cands}

    def server_of(spec: PointSpec) -> tuple[int, int]:
        c = by_key[spec.label]
        return c.slots, c.ctx_per_slot

    echo(f"simulating {len(cands)} candidates ...")
    rows = simulate_candidates(
        cands, s.slo, simulated_measure(plan.trace, cal, plan.calibration, s.duration_s,
                                        s.warmup_s, plan.live.seed, plan.live.token_scale,
                                        server_of),
        plan.root / "simulated", s.settings, plan.objective, plan.agents, echo)
    for r in rows:
        r["objective"] = plan.objective
    doc: dict[str, Any] = {"kind": "advice", "slo": s.slo.spec(), "objective": plan.objective,
                           "trace": str(plan.trace), "calibration": str(plan.calibration),
                           "tolerance": plan.tolerance, "candidates": rows, "confirmed": [],
                           "point": {"duration_s": s.duration_s, "warmup_s": s.warmup_s}}
    write_json(plan.root / ADVICE_JSON, nan_free(doc))
    if s.settings.confirm:
        _confirm(plan, doc, rows, budget, server_of, echo, runtime)
    else:
        top = rows[0]
        doc["recommendation"] = {"label": top["label"], "key": top["key"],
                                 "why": f"best {plan.objective} under the SLO in simulation "
                                        "(not confirmed on the server)",
                                 "rests_on": "simulation",
                                 "predicted_objective": top["predicted"]["objective"]}
    chosen = next((r for r in rows if r["key"] == doc["recommendation"].get("key")), rows[0])
    doc["explain"] = explain(steps, cal, Path(chosen["predicted"]["dir"])
                             if chosen["predicted"].get("dir") else None)
    doc["elapsed_s"] = budget.elapsed_s()
    write_json(plan.root / ADVICE_JSON, nan_free(doc))
    write_advice_report(plan.root, doc)
    return doc


def _confirm(plan: AdvisePlan, doc: dict[str, Any], rows: list[dict[str, Any]],
             budget: Budget, server_of: Callable[[PointSpec], tuple[int, int]],
             echo: Callable[[str], None], runtime: Runtime | None) -> None:
    """The live confirmation into `doc`: confirmed, recommendation, best_fixed, disagreement."""
    s = plan.search
    base = dataclasses.replace(plan.live, trace=plan.trace, calibration=plan.calibration)
    measure = live_measure(base, runtime or get_runtime(base.runtime), s.duration_s,
                           s.warmup_s, to_stderr,
                           lambda spec: dict(zip(("slots", "ctx_per_slot"), server_of(spec),
                                                 strict=True)))
    doc["confirmed"] = confirm(rows, s.slo, measure, plan.root / "live", budget, s.settings,
                               plan.objective, plan.tolerance, echo)
    doc["recommendation"] = recommend(doc["confirmed"], plan.objective)
    fixed = next(c for c in doc["confirmed"] if c["fixed"])
    doc["best_fixed"] = {"label": fixed["label"],
                         "measured_objective": fixed["measured"]["objective"],
                         "predicted_objective": fixed["predicted"]["objective"]}
    doc["disagreement"] = disagreement(doc["confirmed"], plan.tolerance)


def objective_missed(doc: dict[str, Any]) -> bool:
    """Whether a confirmation disagreed with the prediction by more than the tolerance on the
    objective."""
    return bool(doc["confirmed"]) and not all(c["objective_within_tolerance"]
                                              for c in doc["confirmed"])


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
    dirs = [Path(c["dir"]) for c in doc.get("confirmed") or [] if c.get("dir")]
    runs = load_runs([d for d in dirs if d.is_dir()])
    out = out or root / "report.html"
    out.write_text(render_runs(runs, lead=advice_section(doc), title="Pause-policy advice"),
                   encoding="utf-8")
    return out
