"""The advisor's search in simulation: every candidate (a pause policy with its parameters, on
server settings the user allows) gets a capacity search on the calibrated simulator, and the
candidates are ranked on an objective under the SLO. The live confirmation is in
harness.advise.confirm.

The space depends on the engine. llama.cpp's server setting is its slots x context per slot and
its pause actions are the harness's own (keep, swap, recompute). vLLM and SGLang have a token
pool with a prefix cache: the setting is the pool's size in tokens, and leaving a paused
context to the engine's evictable cache (keep-evictable, what both engines do by default) is an
action and a fixed baseline; vLLM pins, swaps (to host memory) and drops through the project's
KV connector, SGLang pins (a streaming session) and drops, and has no per-request swap.
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
from harness.model.engines import LLAMACPP, SGLANG, VLLM
from harness.plan.planner import Arrivals
from harness.policies.base import KEEP, KEEP_EVICTABLE, RECOMPUTE, SWAP
from harness.simulate.options import SimOptions
from harness.simulate.run import check_capacity, run_simulation
from harness.simulate.server import Capacity
from harness.traces.scale import scale_tokens
from harness.traces.tile import copies_needed
from harness.traces.validate import load_trajectories

# The pause actions each engine executes per pause (docs/runtimes.md): a static table, so the
# space is known before any server starts.
ENGINE_ACTIONS: dict[str, frozenset[str]] = {
    LLAMACPP: frozenset({KEEP, SWAP, RECOMPUTE}),
    VLLM: frozenset({KEEP, KEEP_EVICTABLE, SWAP, RECOMPUTE}),  # through the project's connector
    SGLANG: frozenset({KEEP, KEEP_EVICTABLE, RECOMPUTE}),  # CPU engine: no per-request swap
}
# The fixed policies of each engine (one action at every pause), which the recommendation is
# compared with: the engine's own default (keep-evictable) among them where it has one.
FIXED_BY_ENGINE: dict[str, tuple[str, ...]] = {
    LLAMACPP: ("keep", "swap", "recompute"),
    VLLM: ("keep-evictable", "keep", "swap", "recompute"),
    SGLANG: ("keep-evictable", "keep", "recompute"),
}
FIXED = FIXED_BY_ENGINE[LLAMACPP]
OBJECTIVES = ("capacity", "goodput", "memory-time")
TTL_TAUS = ("0.5", "2", "5")
TTL_QUANTILES = ("0.5", "0.9")  # tau per tool class, from its history
# llama.cpp's policy space: each policy with the parameter sets tried.
SPACE: dict[str, tuple[dict[str, str], ...]] = {
    "keep": ({},), "swap": ({},), "recompute": ({},),
    "ttl": tuple({"tau": t, "after": a} for t in TTL_TAUS for a in ("swap", "recompute"))
    + tuple({"quantile": q} for q in TTL_QUANTILES),  # after=swap, ttl's default
    "threshold": ({"keep_max_s": "0.5"}, {"keep_max_s": "2"}),
    "min-waste": ({},),
}
# Policies that choose among keep, swap and recompute by their prices.
PRICED = ("threshold", "min-waste")


def engine_space(engine: str, has_swap: bool = True) -> dict[str, tuple[dict[str, str], ...]]:
    """The policies the advisor searches on `engine` (ENGINE_ACTIONS), each with its parameter
    sets: fixed ones per action it executes; ttl with each `after` it executes; threshold and
    min-waste where their choice stays within its actions (they swap only where the
    calibration prices a swap: `has_swap`). What must swap is left out where the calibration
    has no swap rates."""
    acts = ENGINE_ACTIONS[engine]
    swaps = SWAP in acts and has_swap
    fixed: dict[str, tuple[dict[str, str], ...]] = {
        p: ({},) for p in FIXED_BY_ENGINE[engine] if p != "swap" or swaps}
    afters = tuple(a for a in (SWAP, RECOMPUTE) if a in acts and (a != SWAP or has_swap))
    ttl = (tuple({"tau": t, "after": a} for t in TTL_TAUS for a in afters)
           + tuple({"quantile": q} if SWAP in afters else {"quantile": q, "after": RECOMPUTE}
                   for q in TTL_QUANTILES))
    space: dict[str, tuple[dict[str, str], ...]] = {**fixed, "ttl": ttl}
    if swaps or not has_swap:  # a swap they may pick runs, or they never pick one
        space.update({p: SPACE[p] for p in PRICED})
    return space


def why_not(engine: str, has_swap: bool, policy: str) -> str:
    """Why the advisor does not search `policy` on `engine` (one clause)."""
    if policy == "swap" and SWAP not in ENGINE_ACTIONS[engine]:
        return "SGLang's CPU engine has no per-request swap"
    if policy == "keep-evictable" and engine == LLAMACPP:
        return "llama.cpp's slots are the harness's, with no evictable cache"
    if policy == "swap" and not has_swap:
        return "the calibration has no swap rates"
    if policy in PRICED:
        return "its choice could swap, which the engine cannot"
    return "not a policy the advisor searches"


@dataclass(frozen=True)
class Candidate:
    """A policy with its arguments on a server setting: `slots` x `ctx_per_slot` (llama.cpp)
    or a KV pool of `kv_tokens` (vLLM, SGLang)."""

    policy: str
    args: tuple[tuple[str, str], ...]
    slots: int | None
    ctx_per_slot: int | None
    kv_tokens: int | None = None
    engine: str = LLAMACPP

    @property
    def fixed(self) -> bool:
        return self.policy in FIXED_BY_ENGINE[self.engine]

    def server(self) -> str:
        """The server setting: '4x4096' or '2560 tokens'."""
        if self.kv_tokens is not None:
            return f"{self.kv_tokens} tokens"
        return f"{self.slots}x{self.ctx_per_slot}"

    def label(self, with_server: bool = False) -> str:
        parts = [self.policy, *(f"{k}={v}" for k, v in self.args)]
        if with_server:
            parts.append(f"@ {self.server()}")
        return " ".join(parts)

    def key(self) -> str:
        """A directory name: letters, digits, '-', '_' and '.'."""
        server = ([f"t{self.kv_tokens}"] if self.kv_tokens is not None
                  else [f"s{self.slots}", f"c{self.ctx_per_slot}"])
        raw = "_".join([self.policy, *(f"{k}{v}" for k, v in self.args), *server])
        return "".join(c if c.isalnum() or c in "-_." else "-" for c in raw)

    def capacity(self, block_size: int | None = None) -> Capacity:
        """The simulated server: its slots, or its token pool in blocks of `block_size` (None:
        the engine's default) with an unbounded host tier."""
        if self.kv_tokens is not None:
            return check_capacity(self.kv_tokens, None, None, self.engine, block_size)
        return check_capacity(None, self.slots, self.ctx_per_slot)


def candidate_space(policies: list[str] | None, slots: list[int], ctx: list[int],
                    engine: str = LLAMACPP, kv_tokens: list[int] | None = None,
                    has_swap: bool = True) -> list[Candidate]:
    """Every candidate of `engine`'s space (engine_space) restricted to `policies` (None: all
    of it), on every slots x ctx allowed (llama.cpp) or every KV pool of `kv_tokens` (vLLM,
    SGLang)."""
    space = engine_space(engine, has_swap)
    names = list(space) if policies is None else policies
    unknown = [p for p in names if p not in space]
    if unknown:
        said = [f"{p} ({why_not(engine, has_swap, p)})" if p in (*SPACE, "keep-evictable")
                else p for p in unknown]
        raise InputError(f"--policies: the advisor searches {', '.join(space)} on {engine}, "
                         f"not {', '.join(said)}")
    fixed = [p for p in FIXED_BY_ENGINE[engine] if p in space]
    if not any(p in fixed for p in names):
        raise InputError(f"--policies must include a fixed policy ({' or '.join(fixed)}) to "
                         "compare the recommendation with")
    pools: list[tuple[int | None, int | None, int | None]]
    if engine == LLAMACPP:
        pools = [(s, c, None) for s, c in itertools.product(slots, ctx)]
    else:
        pools = [(None, None, t) for t in kv_tokens or []]
    return [Candidate(p, tuple(sorted(a.items())), s, c, t, engine)
            for s, c, t in pools for p in names for a in space[p]]


def simulated_measure(trace: Path, calibration: Calibration, calibration_path: Path,
                      duration_s: float, warmup_s: float, seed: int, token_scale: float,
                      capacity_of: Callable[[PointSpec], Capacity]) -> Measure:
    """A Measure on the simulator: the point's agents in a closed loop over the trace repeated
    as a bounded replay would repeat it, judged over the same window, on the server
    `capacity_of(spec)` (its engine's semantics). A simulation that cannot end (memory that
    paused parents hold) is a failing point, with its reason."""
    steps = scale_tokens(load_trajectories(trace), token_scale)

    def measure(spec: PointSpec, out: Path) -> dict[str, Any]:
        copies = copies_needed(steps, spec.agents, duration_s)
        try:
            run_simulation(SimOptions(trace, spec.policy, spec.policy_args, capacity_of(spec),
                                      calibration_path, Arrivals("closed", spec.agents), seed,
                                      out, write_summary=False, token_scale=token_scale,
                                      copies=copies), calibration)
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
    with_server = len({c.server() for c in cands}) > 1
    rows = []
    for c in cands:
        spec = PointSpec(c.policy, dict(c.args), 0, label=c.key())
        entry = search_policy(spec, slo, measure, root, float("inf"),
                              dataclasses.replace(settings, confirm=False),
                              lambda e: None)
        rows.append({"label": c.label(with_server), "key": c.key(), "policy": c.policy,
                     "policy_args": dict(c.args), "engine": c.engine, "slots": c.slots,
                     "ctx_per_slot": c.ctx_per_slot, "kv_tokens": c.kv_tokens,
                     "fixed": c.fixed,
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
