"""The advisor's live confirmation: the best candidate and the best fixed policy measured on
the server at the recommended operating point, set beside their predictions; the recommendation
is the confirmed candidate with the best measured objective."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.advise.candidates import Candidate, better, objective_value
from harness.capacity.budget import Budget
from harness.capacity.driver import (
    PointSpec,
    SearchSettings,
    SearchSpec,
    judge_point,
    search_policy,
)
from harness.model.engines import SGLANG, VLLM
from harness.report.fidelity import relative_error

FIGURES = ("resume_latency_ms", "ttft_ms", "success_rate", "goodput_per_min",
           "kv_paused_mean_mib")


def live_settings(c: Candidate, block_size: int, url: str | None,
                  server_args: tuple[str, ...] = (), max_context: int = 4096
                  ) -> dict[str, Any]:
    """The RunOptions fields a live point of `c` runs with: llama.cpp's slots and context per
    slot; a local vLLM's KV pool as whole blocks of `block_size` (--num-gpu-blocks-override:
    the pool's blocks plus vLLM's null block, which holds no tokens) or a local SGLang's
    (--max-total-tokens), each with the longest context no more than the pool (`max_context`
    at most). A server at `url` runs its own pool: nothing is set."""
    if c.kv_tokens is None:
        return {"slots": c.slots, "ctx_per_slot": c.ctx_per_slot}
    if url is not None:
        return {}
    pool: tuple[str, ...]
    if c.engine == VLLM:
        pool = (f"--block-size={block_size}",
                f"--num-gpu-blocks-override={c.kv_tokens // block_size + 1}")
    elif c.engine == SGLANG:
        pool = (f"--max-total-tokens={c.kv_tokens}",)
    else:
        raise ValueError(f"no KV pool setting for engine {c.engine!r}")
    return {"server_args": (*server_args, *pool),
            "ctx_per_slot": min(max_context, c.kv_tokens)}


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


def confirm(rows: list[dict[str, Any]], search: SearchSpec, measure: Any, root: Path,
            budget: Budget, objective: str, tolerance: float,
            echo: Callable[[str], None]) -> list[dict[str, Any]]:
    """Measure the chosen candidates on the server under the search's SLO and settings: for
    capacity a live search started at the predicted capacity, else one point at the operating
    point."""
    slo, settings = search.slo, search.settings
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
