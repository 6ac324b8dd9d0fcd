"""The advisor's search in simulation: every candidate (a pause policy with its parameters, on
server settings the user allows) gets a capacity search on the calibrated simulator, and the
candidates are ranked on an objective under the SLO. The live confirmation is in
harness.advise.confirm.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.capacity.driver import Measure, PointSpec, SearchSettings, judge_point, search_policy
from harness.capacity.slo import Slo
from harness.errors import InputError
from harness.metrics.window import window_of_dir
from harness.model.calibration import Calibration
from harness.plan.planner import Arrivals
from harness.simulate.run import check_capacity, run_simulation
from harness.traces.scale import scale_tokens
from harness.traces.tile import copies_needed
from harness.traces.validate import load_trajectories

FIXED = ("keep", "swap", "recompute")
OBJECTIVES = ("capacity", "goodput", "memory-time")
# The policy space searched: each policy with the parameter sets tried.
SPACE: dict[str, tuple[dict[str, str], ...]] = {
    "keep": ({},), "swap": ({},), "recompute": ({},),
    "ttl": tuple({"tau": t, "after": a} for t in ("0.5", "2", "5") for a in ("swap", "recompute"))
    + ({"quantile": "0.5"}, {"quantile": "0.9"}),  # tau per tool class, from its history
    "threshold": ({"keep_max_s": "0.5"}, {"keep_max_s": "2"}),
    "min-waste": ({},),
}


@dataclass(frozen=True)
class Candidate:
    """A policy with its arguments on `slots` x `ctx_per_slot`."""

    policy: str
    args: tuple[tuple[str, str], ...]
    slots: int
    ctx_per_slot: int

    @property
    def fixed(self) -> bool:
        return self.policy in FIXED

    def label(self, with_server: bool = False) -> str:
        parts = [self.policy, *(f"{k}={v}" for k, v in self.args)]
        if with_server:
            parts.append(f"@ {self.slots}x{self.ctx_per_slot}")
        return " ".join(parts)

    def key(self) -> str:
        """A directory name: letters, digits, '-', '_' and '.'."""
        raw = "_".join([self.policy, *(f"{k}{v}" for k, v in self.args),
                        f"s{self.slots}", f"c{self.ctx_per_slot}"])
        return "".join(c if c.isalnum() or c in "-_." else "-" for c in raw)


def candidate_space(policies: list[str], slots: list[int], ctx: list[int]) -> list[Candidate]:
    """Every candidate of the space restricted to `policies`, on every slots x ctx allowed."""
    unknown = [p for p in policies if p not in SPACE]
    if unknown:
        raise InputError(f"--policies: the advisor searches {', '.join(SPACE)}, not "
                         f"{', '.join(unknown)}")
    if not any(p in FIXED for p in policies):
        raise InputError("--policies must include a fixed policy (keep, swap or recompute) to "
                         "compare the recommendation with")
    return [Candidate(p, tuple(sorted(a.items())), s, c)
            for s, c in itertools.product(slots, ctx) for p in policies for a in SPACE[p]]


def simulated_measure(trace: Path, calibration: Calibration, calibration_path: Path,
                      duration_s: float, warmup_s: float, seed: int, token_scale: float,
                      server_of: Callable[[PointSpec], tuple[int, int]]) -> Measure:
    """A Measure on the simulator: the point's agents in a closed loop over the trace repeated
    as a bounded replay would repeat it, judged over the same window. A simulation that cannot
    end (memory that paused parents hold) is a failing point, with its reason."""
    steps = scale_tokens(load_trajectories(trace), token_scale)

    def measure(spec: PointSpec, out: Path) -> dict[str, Any]:
        slots, ctx = server_of(spec)
        copies = copies_needed(steps, spec.agents, duration_s)
        try:
            run_simulation(trace, spec.policy, spec.policy_args, check_capacity(None, slots, ctx),
                           calibration, calibration_path, Arrivals("closed", spec.agents),
                           seed, out, write_summary=False, token_scale=token_scale,
                           copies=copies)
        except InputError as exc:
            return {"error": str(exc)[:300], "success_rate": 0.0}
        return window_of_dir(out, warmup_s, duration_s, calibration.kv_bytes_per_token)

    return measure


def objective_value(objective: str, figures: dict[str, Any] | None, capacity: int) -> float | None:
    """The objective's figure: agents (capacity), goodput per minute, or mean paused KV MiB."""
    if objective == "capacity":
        return float(capacity)
    if figures is None:
        return None
    v = figures.get("goodput_per_min" if objective == "goodput" else "kv_paused_mean_mib")
    return None if v is None else float(v)


def better(objective: str) -> Callable[[float], float]:
    """A sort key: larger is better for capacity and goodput, smaller for memory-time."""
    return (lambda v: -v) if objective == "memory-time" else (lambda v: v)


def simulate_candidates(cands: list[Candidate], slo: Slo, measure: Measure, root: Path,
                        settings: SearchSettings, objective: str, agents: int | None,
                        echo: Callable[[str], None]) -> list[dict[str, Any]]:
    """Each candidate's simulated capacity search and, for memory-time, its point at the
    operating point (`agents`, else the best fixed candidate's capacity); ranked, best first.
    Candidates that cannot meet the SLO at the operating point rank last."""
    with_server = len({(c.slots, c.ctx_per_slot) for c in cands}) > 1
    rows = []
    for c in cands:
        spec = PointSpec(c.policy, dict(c.args), 0, label=c.key())
        entry = search_policy(spec, slo, measure, root, float("inf"),
                              dataclasses.replace(settings, confirm=False),
                              lambda e: None)
        rows.append({"label": c.label(with_server), "key": c.key(), "policy": c.policy,
                     "policy_args": dict(c.args), "slots": c.slots,
                     "ctx_per_slot": c.ctx_per_slot, "fixed": c.fixed,
                     "capacity": entry["capacity"], "reason": entry["reason"],
                     "points": entry["points"], "at_capacity": entry["at_capacity"]})
        echo(f"simulated {rows[-1]['label']}: capacity {entry['capacity']} "
             f"({len(entry['points'])} points)")
    fixed_caps = [r["capacity"] for r in rows if r["fixed"]]
    op = agents or max(max(fixed_caps, default=1), 1)
    for r, c in zip(rows, cands, strict=True):
        r["agents"] = op if objective == "memory-time" else max(r["capacity"], 1)
        point = next((p for p in r["points"] if p["agents"] == r["agents"]), None)
        if point is None:
            spec = PointSpec(c.policy, dict(c.args), r["agents"], phase="confirm",
                             label=c.key())
            out = spec.dir(root)
            point = judge_point(spec, measure(spec, out), slo, out, 0.0)
        r["predicted"] = {**{k: point.get(k) for k in ("resume_latency_ms", "ttft_ms",
                                                        "success_rate", "goodput_per_min",
                                                        "kv_paused_mean_mib", "dir")},
                          "capacity": r["capacity"], "agents": r["agents"],
                          "meets_slo": point["passed"]}
        r["predicted"]["objective"] = objective_value(objective, r["predicted"], r["capacity"])
    key = better(objective)

    def rank_key(r: dict[str, Any]) -> tuple[Any, ...]:
        # Ties (capacities are whole agents) go to more goodput, then less paused KV.
        p = r["predicted"]
        v = p["objective"]
        ok = p["meets_slo"] and v is not None
        return (not ok, -key(v) if ok else 0.0, -r["capacity"], -(p["goodput_per_min"] or 0.0),
                p["kv_paused_mean_mib"] or 0.0, r["label"])

    rows.sort(key=rank_key)
    for i, r in enumerate(rows, 1):
        r["rank"] = i
    return rows
