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
from harness.advise.candidates import (
    Candidate,
    candidate_space,
    simulate_candidates,
    simulated_measure,
)
from harness.advise.confirm import confirm, disagreement, live_settings, recommend
from harness.advise.explain import explain
from harness.advise.result import (
    AdviceResult,
    Measured,
    Predicted,
    Recommendation,
    read_advice,
    save_advice,
)
from harness.advise.view import advice_section
from harness.capacity.budget import Budget
from harness.capacity.driver import PointSpec, SearchSpec
from harness.capacity.live import live_measure, nan_free
from harness.errors import InputError
from harness.model.calibration import (
    RUNTIME_ENGINES,
    Calibration,
    preset_names,
    resolve_calibration,
    write_calibration,
)
from harness.model.engines import BLOCK_SIZE, LLAMACPP
from harness.records.atomic import write_text_atomic
from harness.records.store import ensure_out_dir
from harness.replay.options import RunOptions
from harness.replay.run import to_stderr
from harness.report.data import load_runs
from harness.report.render import render_runs
from harness.traces.scale import scale_tokens
from harness.traces.validate import load_trajectories

CALIBRATION_COPY = "calibration.json"  # a shipped preset's copy, which the live runs read
DEFAULT_SLOTS, DEFAULT_CTX = 4, 4096  # llama.cpp's server setting when none is given


@dataclass(frozen=True)
class AdvisePlan:
    """An advice, as asked for: the trace and calibration (a file or a shipped preset's name)
    the simulator runs on, the policy families and server settings searched, the objective
    under the search's SLO, and (with `search.settings.confirm`) how the live server is
    reached: `live` holds the runtime, URL, seed, token scale, timeouts and headers of the
    confirming runs. The runtime's engine decides the space: slots x context per slot on
    llama.cpp, KV pools of `kv_tokens` (default: the calibration's kv_capacity_tokens) on vLLM
    and SGLang; `policies` empty: every one the engine executes."""

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
    kv_tokens: tuple[int, ...] = ()


@dataclass(frozen=True)
class Space:
    """What an advice searches: the engine, the calibration, its block size and candidates."""

    engine: str
    calibration: Calibration
    block_size: int
    candidates: list[Candidate]


def plan_space(plan: AdvisePlan, note: Callable[[str], object] | None = None) -> Space:
    """The engine of the plan's runtime and its candidates; InputError (one line) for a
    calibration of another engine or a server setting the engine does not have. `note` is
    told when the calibration's figures are declared, not measured."""
    engine = RUNTIME_ENGINES.get(plan.live.runtime)
    if engine is None:
        raise InputError(f"advise --runtime {plan.live.runtime}: the advisor simulates "
                         "llamacpp, vllm and sglang servers only")
    cal = resolve_calibration(plan.calibration, note=note)
    measured = cal.engine_kind
    if measured is not None and measured != engine:
        raise InputError(f"--calibration {plan.calibration} is a {measured} calibration, "
                         f"but --runtime {plan.live.runtime} is {engine}: the simulator would "
                         f"price the wrong engine; {matching(engine)}")
    if engine == LLAMACPP:
        if plan.kv_tokens:
            raise InputError("--kv-tokens sizes a vLLM or SGLang KV pool; llama.cpp's setting "
                             "is --slots x --ctx-per-slot")
        return Space(engine, cal, 1, candidate_space(
            list(plan.policies) or None, list(plan.slots) or [DEFAULT_SLOTS],
            list(plan.ctx_per_slot) or [DEFAULT_CTX], has_swap=cal.has_swap))
    if plan.slots or plan.ctx_per_slot:
        raise InputError(f"--slots and --ctx-per-slot are llama.cpp's; --runtime "
                         f"{plan.live.runtime} has a KV pool: give --kv-tokens (its size in "
                         "tokens)")
    tokens = list(plan.kv_tokens) or ([cal.kv_capacity_tokens] if cal.kv_capacity_tokens
                                      else [])
    if not tokens:
        raise InputError(f"--runtime {plan.live.runtime}: give --kv-tokens (the KV pool in "
                         "tokens; the calibration reports none)")
    block = cal.block_size or BLOCK_SIZE[engine]
    odd = [t for t in tokens if t % block]
    if odd:
        raise InputError(f"--kv-tokens {odd[0]}: {engine}'s pool is whole blocks of {block} "
                         f"tokens (the calibration's block size); give a multiple of {block}")
    if plan.live.url and len(tokens) > 1:
        raise InputError("--url: the server's own KV pool is what it has; give one "
                         "--kv-tokens (its size)")
    return Space(engine, cal, block, candidate_space(
        list(plan.policies) or None, [], [], engine, tokens, cal.has_swap))


def matching(engine: str) -> str:
    """What to use instead: the engine's shipped presets, or a calibration of it."""
    presets = [n for n in preset_names() if n.startswith(f"{engine}-")]
    measure = f"harness calibrate --runtime {engine} --out cal.json"
    return (f"use one of {engine}: a shipped preset ({', '.join(presets)}) or a measured one "
            f"({measure})" if presets else f"measure one of {engine} ({measure})")


def advise(plan: AdvisePlan, echo: Callable[[str], None] = print,
           runtime: Runtime | None = None) -> AdviceResult:
    """Search the candidates in simulation, confirm the chosen ones on the server (unless the
    plan says not to), explain the pick, write advice.json and report.html under the plan's
    root; returns the result advice.json holds. InputError for bad input, before the first
    run."""
    space = plan_space(plan, echo)
    cal, cands = space.calibration, space.candidates
    steps = scale_tokens(load_trajectories(plan.trace), plan.live.token_scale)
    ensure_out_dir(plan.root)
    if not plan.calibration.is_file():  # a shipped preset: the live runs read a copy
        plan = dataclasses.replace(plan, calibration=write_calibration(
            plan.root / CALIBRATION_COPY, cal))
    s = plan.search
    budget = Budget(s.budget_s, s.settings.clock)
    by_key = {c.key(): c for c in cands}

    def server_of(spec: PointSpec) -> Candidate:
        return by_key[spec.label]

    echo(f"simulating {len(cands)} candidates on {space.engine} ...")
    rows = simulate_candidates(
        cands, s.slo, simulated_measure(plan.trace, cal, plan.calibration, s.duration_s,
                                        s.warmup_s, plan.live.seed, plan.live.token_scale,
                                        lambda spec: server_of(spec).capacity(space.block_size)),
        plan.root / "simulated", s.settings, plan.objective, plan.agents, echo)
    for r in rows:
        r["objective"] = plan.objective
    doc: dict[str, Any] = {"kind": "advice", "slo": s.slo.spec(), "objective": plan.objective,
                           "trace": str(plan.trace), "calibration": str(plan.calibration),
                           "engine": space.engine, "block_size": space.block_size,
                           "tolerance": plan.tolerance, "candidates": rows, "confirmed": [],
                           "point": {"duration_s": s.duration_s, "warmup_s": s.warmup_s}}
    save_advice(plan.root, AdviceResult.from_json(nan_free(doc)))
    if s.settings.confirm:
        _confirm(plan, doc, rows, budget,
                 lambda spec: live_settings(server_of(spec), space.block_size, plan.live.url,
                                            plan.live.server_args, plan.live.ctx_per_slot),
                 echo, runtime)
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
    result = AdviceResult.from_json(nan_free(doc))
    save_advice(plan.root, result)
    write_advice_report(plan.root, result)
    return result


def _confirm(plan: AdvisePlan, doc: dict[str, Any], rows: list[dict[str, Any]],
             budget: Budget, settings: Callable[[PointSpec], dict[str, Any]],
             echo: Callable[[str], None], runtime: Runtime | None) -> None:
    """The live confirmation into `doc`: confirmed, recommendation, best_fixed, disagreement;
    `settings(spec)`: the server settings of a point (harness.advise.confirm.live_settings)."""
    s = plan.search
    base = dataclasses.replace(plan.live, trace=plan.trace, calibration=plan.calibration)
    measure = live_measure(base, runtime or get_runtime(base.runtime), s.duration_s,
                           s.warmup_s, to_stderr, settings)
    doc["confirmed"] = confirm(rows, s, measure, plan.root / "live", budget, plan.objective,
                               plan.tolerance, echo)
    doc["recommendation"] = recommend(doc["confirmed"], plan.objective)
    fixed = next(c for c in doc["confirmed"] if c["fixed"])
    doc["best_fixed"] = {"label": fixed["label"],
                         "measured_objective": fixed["measured"]["objective"],
                         "predicted_objective": fixed["predicted"]["objective"]}
    doc["disagreement"] = disagreement(doc["confirmed"], plan.tolerance)


def advice_text(result: AdviceResult) -> str:
    """The recommendation with predicted and measured figures side by side."""
    rec = result.recommendation or Recommendation()
    lines = [f"recommendation ({result.objective}, SLO {result.slo}): {rec.label} "
             f"- {rec.why} (rests on {rec.rests_on})"]
    if result.best_fixed:
        bf = result.best_fixed
        lines.append(f"best fixed policy: {bf.label}, measured {result.objective} "
                     f"{_num(bf.measured_objective)}")
    head = (f"{'candidate':<28}{'agents':>7}{'pred p95':>10}{'meas p95':>10}{'err':>6}"
            f"{'pred obj':>10}{'meas obj':>10}{'err':>6}")
    lines += ["", head, "-" * len(head)]
    for c in result.confirmations():
        pred, meas = c.predicted or Predicted(), c.measured or Measured()
        e = c.error or {}
        lines.append(f"{(c.label or '')[:27]:<28}{c.agents:>7}{_num(pred.resume_p95_ms):>10}"
                     f"{_num(meas.resume_p95_ms):>10}{_pct(e.get('resume_p95')):>6}"
                     f"{_num(pred.objective):>10}"
                     f"{_num(meas.objective):>10}{_pct(e.get('objective')):>6}")
    if result.disagreement:
        lines.append(f"note: {result.disagreement}")
    return "\n".join(lines)


def _num(v: Any) -> str:
    return "-" if v is None else f"{v:,.1f}" if isinstance(v, float) and v < 100 else f"{v:,.0f}"


def _pct(v: Any) -> str:
    return "-" if v is None else f"{v:.0%}"


def write_advice_report(root: Path, result: AdviceResult, out: Path | None = None) -> Path:
    """report.html (or `out`): the advice section, then the confirmed live runs side by
    side."""
    dirs = [Path(c.dir) for c in result.confirmations() if c.dir]
    runs = load_runs([d for d in dirs if d.is_dir()])
    out = out or root / "report.html"
    write_text_atomic(out, render_runs(runs, lead=advice_section(result),
                                       title="Pause-policy advice"))
    return out


def rewrite_advice_report(root: Path, out: Path | None = None) -> Path:
    """report.html (or `out`) of the advice whose advice.json is in `root`."""
    return write_advice_report(root, read_advice(root), out)
