"""The plan: pure data computed from trajectories, an injection profile, arrivals and a seed.

Everything random is drawn here from `seed` (tool slow-downs, never-returning tools, errors,
client disconnects, Poisson arrivals, bystanders), so the executor only follows orders and two runs
of one plan send the same requests.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import pandas as pd

from harness.errors import InputError
from harness.plan.injection import Injection
from harness.plan.tokens import shared_token_ids, stable_seed, token_ids
from harness.traces.schema import DEFAULT_PREFIX_TOKENS, KIND_LLM, TOOL_SUBAGENT

# The records' clock is int64 nanoseconds from the run's start (about 292 years). Planned
# arrivals must end within half of it, so that what runs after the last one still fits.
MAX_ARRIVAL_S = 2.0**62 / 1e9


def poisson_arrivals(rng: np.random.Generator, arrivals: Arrivals, n_roots: int) -> np.ndarray:
    """`n_roots` Poisson arrival times at `arrivals.rate` (s, unscaled: one draw per root from
    `rng`); InputError naming --rate where, scaled by `arrivals.time_scale`, the last would not
    fit the records' clock (a rate so low its arrivals would wrap round it)."""
    times: np.ndarray = np.cumsum(rng.exponential(1.0 / arrivals.rate, size=n_roots))
    last = float(times[-1]) * arrivals.time_scale if n_roots else 0.0
    if arrivals.mode == "poisson" and not last <= MAX_ARRIVAL_S:
        raise InputError(f"--rate {arrivals.rate:g}: {n_roots:,} arrivals at that rate span "
                         f"{last:.3g} s, past what the records' clock holds ({MAX_ARRIVAL_S:.3g} "
                         "s of int64 nanoseconds); give a higher --rate")
    return times


@dataclass(frozen=True)
class CallStep:
    """An LLM call: cut the context to `keep_tokens` (None: keep it all), append
    `append_tokens` ids, then generate exactly `output_tokens`."""

    step: int
    append_tokens: int
    append_seed: int
    output_tokens: int
    disconnect: bool = False
    shared_prefix: int = 0
    prefix_seed: int = 0
    keep_tokens: int | None = None

    def append_ids(self, vocab_size: int) -> list[int]:
        """The ids this call appends; a shared system prompt first when the trajectory has one."""
        k = min(self.shared_prefix, self.append_tokens)
        return (shared_token_ids(self.prefix_seed, k, vocab_size)
                + token_ids(self.append_seed, self.append_tokens - k, vocab_size))


@dataclass(frozen=True)
class ToolStep:
    """A tool call: its result arrives after `latency_s` (None: never) unless `deadline_s` fires.

    A step with `children` (tool_class `subagent`) starts them all when it begins and its
    result arrives once every child has ended, `latency_s` after the last; `deadline_s` (inf
    when the trace sets none) bounds the whole wait."""

    step: int
    tool_name: str
    tool_class: str
    latency_s: float | None
    deadline_s: float
    outcome: str
    mutating: bool
    resume_required: bool
    injected: str | None = None
    children: tuple[TrajectoryPlan, ...] = ()


Step = CallStep | ToolStep


@dataclass(frozen=True)
class TrajectoryPlan:
    """One trajectory; a sub-agent's names its parent (it arrives only through its parent's
    tool step, never on its own)."""

    trajectory_id: str
    arrival_s: float
    priority: str
    tenant: str
    steps: tuple[Step, ...]
    parent_id: str | None = None

    def family(self) -> list[TrajectoryPlan]:
        """This trajectory and every sub-agent under it, parents first."""
        out = [self]
        for s in self.steps:
            if isinstance(s, ToolStep):
                for c in s.children:
                    out.extend(c.family())
        return out

    def peak_slots(self) -> int:
        """The most slots this trajectory and its sub-agents hold at once when every parent
        keeps its slot while its children run (the most any pause policy can ask for)."""
        peak = 1
        for s in self.steps:
            if isinstance(s, ToolStep) and s.children:
                peak = max(peak, 1 + sum(c.peak_slots() for c in s.children))
        return peak

    def peak_requests(self) -> int:
        """The most requests this trajectory and its sub-agents have in flight at once."""
        peak = 1
        for s in self.steps:
            if isinstance(s, ToolStep) and s.children:
                peak = max(peak, sum(c.peak_requests() for c in s.children))
        return peak


@dataclass(frozen=True)
class BystanderPlan:
    """A plain single-turn request from non-agent traffic."""

    request_id: str
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    seed: int


@dataclass(frozen=True)
class Arrivals:
    """closed: `concurrency` agents take trajectories in order; poisson: `rate` per second;
    trace: each trajectory's start_s. Times (arrivals, tool latencies, deadlines) are multiplied
    by `time_scale`."""

    mode: Literal["closed", "poisson", "trace"] = "closed"
    concurrency: int = 4
    rate: float = 1.0
    time_scale: float = 1.0

    def __post_init__(self) -> None:
        if self.mode not in ("closed", "poisson", "trace"):
            raise InputError(f"unknown arrival mode {self.mode!r}")
        if self.concurrency < 1:
            raise InputError("--concurrency must be >= 1")
        if not (self.rate > 0 and np.isfinite(self.rate)):
            raise InputError("--rate must be a finite number > 0")
        if not (self.time_scale > 0 and np.isfinite(self.time_scale)):
            raise InputError("--time-scale must be a finite number > 0")


@dataclass(frozen=True)
class Plan:
    trajectories: tuple[TrajectoryPlan, ...]  # the roots; sub-agents hang under their parents
    bystanders: tuple[BystanderPlan, ...]
    arrivals: Arrivals
    seed: int
    injection: Injection
    notes: tuple[str, ...] = field(default_factory=tuple)
    # A bounded run ends here (seconds from its start): nothing starts after it, and what is
    # still running is stopped and recorded interrupted (reason run-horizon). None: run it all.
    horizon_s: float | None = None

    def all_trajectories(self) -> list[TrajectoryPlan]:
        """Every trajectory of the plan, sub-agents included (each after its parent)."""
        return [t for root in self.trajectories for t in root.family()]


def make_plan(steps: pd.DataFrame, injection: Injection, arrivals: Arrivals,
              seed: int) -> Plan:
    """Build the plan for a validated trajectory frame. Pure and deterministic for `seed`."""
    if steps.empty:
        raise InputError("empty workload: the trace holds no steps")
    rng = np.random.default_rng(seed)
    scale = arrivals.time_scale
    steps = steps.reset_index(drop=True)
    n = len(steps)
    u_slow, u_never, u_err, u_disc = (rng.random(n) for _ in range(4))
    cols = {c: steps[c].astype(object).where(steps[c].notna(), None).tolist()
            for c in steps.columns}
    tids = cols["trajectory_id"]
    bounds = [i for i in range(n) if i == 0 or tids[i] != tids[i - 1]] + [n]
    parents = [cols["parent_id"][lo] if "parent_id" in cols else None for lo in bounds[:-1]]
    n_roots = sum(p is None for p in parents)
    poisson = poisson_arrivals(rng, arrivals, n_roots)
    built: dict[str, TrajectoryPlan] = {}
    spawns: dict[str, dict[int, list[str]]] = {}  # parent -> spawn step -> children, in order
    roots: list[str] = []
    for k in range(len(bounds) - 1):
        lo, hi = bounds[k], bounds[k + 1]
        tid = str(tids[lo])
        base = stable_seed("trajectory", tid)
        pgroup = cols["prefix_group"][lo]
        raw_prefix = cols.get("prefix_tokens", [None] * n)[lo]
        shared = ((DEFAULT_PREFIX_TOKENS if raw_prefix is None else int(raw_prefix))
                  if isinstance(pgroup, str) and pgroup else 0)
        pseed = stable_seed("prefix", pgroup) if shared else 0
        keeps = cols.get("keep_tokens", [None] * n)
        out: list[Step] = []
        for i in range(lo, hi):
            r = {c: v[i] for c, v in cols.items()}
            if r["kind"] == KIND_LLM:
                out.append(CallStep(
                    step=int(r["step"]), append_tokens=int(r["input_tokens"]),
                    append_seed=stable_seed(base, r["step"]),
                    output_tokens=int(r["output_tokens"]),
                    disconnect=bool(u_disc[i] < injection.disconnect_fraction),
                    shared_prefix=shared if i == lo else 0, prefix_seed=pseed,
                    keep_tokens=None if keeps[i] is None else int(keeps[i])))
            else:
                out.append(_tool_step(r, i + 1 < hi, injection, scale,
                                      float(u_slow[i]), float(u_never[i]), float(u_err[i])))
        parent = parents[k]
        if parent is None:
            r_idx = len(roots)
            roots.append(tid)
            if arrivals.mode == "trace":
                arrival = float(cols["start_s"][lo]) * scale
            elif arrivals.mode == "poisson":
                arrival = float(poisson[r_idx]) * scale
            else:
                arrival = 0.0
        else:
            arrival = 0.0
            spawns.setdefault(str(parent), {}).setdefault(
                int(cols["spawn_step"][lo]), []).append(tid)
        built[tid] = TrajectoryPlan(tid, arrival, str(cols["priority"][lo]),
                                    str(cols["tenant"][lo]), tuple(out),
                                    None if parent is None else str(parent))
    plans = [_with_children(tid, built, spawns) for tid in roots]
    return Plan(tuple(plans), _bystanders(injection, agent_span_s(plans, arrivals), rng, scale),
                arrivals, seed, injection)


def _with_children(tid: str, built: dict[str, TrajectoryPlan],
                   spawns: dict[str, dict[int, list[str]]]) -> TrajectoryPlan:
    """Trajectory `tid` with its sub-agents (and theirs) attached to the steps that spawn them
    (a validated frame has no cycles)."""
    plan = built[tid]
    mine = spawns.get(tid)
    if not mine:
        return plan
    steps = tuple(
        dataclasses.replace(s, children=tuple(_with_children(c, built, spawns)
                                              for c in mine[s.step]))
        if isinstance(s, ToolStep) and s.step in mine else s
        for s in plan.steps)
    return dataclasses.replace(plan, steps=steps)


# Bystander arrivals are planned for this many times the agents' tool time, at least: LLM
# calls add to a run's length what the trace cannot say (the executor records it if they run
# out before the agents are done).
BYSTANDER_MARGIN = 3.0


def agent_span_s(plans: list[TrajectoryPlan], arrivals: Arrivals) -> float:
    """A lower bound on how long the agents run, from the plan alone: the last arrival plus the
    longest trajectory's tool time, or, in a closed loop, every trajectory's tool time shared
    among the agents (tools that never return count their deadline)."""
    tool_s = [sum((s.latency_s if s.latency_s is not None else s.deadline_s)
                  for s in p.steps if isinstance(s, ToolStep)) for p in plans]
    longest = max(tool_s, default=0.0)
    last = max((p.arrival_s for p in plans), default=0.0)
    if arrivals.mode == "closed":
        agents = max(1, min(arrivals.concurrency, len(plans)))
        return max(sum(tool_s) / agents, longest)
    return last + longest


def _tool_step(r: dict[str, object], has_next: bool, inj: Injection, scale: float,
               u_slow: float, u_never: float, u_err: float) -> ToolStep:
    raw_latency = r["latency_s"]
    latency = None if raw_latency is None else float(str(raw_latency))
    outcome = str(r["outcome"])
    injected = None
    spawns = r["tool_class"] == TOOL_SUBAGENT
    if spawns:
        pass  # its wait is its sub-agents': faults are injected into their own tools
    elif latency is not None and u_never < inj.never_return_fraction:
        latency, outcome, injected = None, "abandoned", "never-return"
    elif latency is not None and u_slow < inj.slow_fraction:
        latency, injected = latency * inj.slow_factor, "slow"
    if not spawns and latency is not None and outcome == "ok" and u_err < inj.error_fraction:
        outcome, injected = "error", (injected + "+error" if injected else "error")
    raw_deadline = r["deadline_s"]
    # A parent waits for its sub-agents as long as they run, unless the trace bounds it: the
    # default deadline is for single tools.
    default = math.inf if r["tool_class"] == TOOL_SUBAGENT else inj.default_deadline_s
    deadline = default if raw_deadline is None else float(str(raw_deadline))
    return ToolStep(
        step=int(str(r["step"])), tool_name=str(r["tool_name"] or r["tool_class"]),
        tool_class=str(r["tool_class"]),
        latency_s=None if latency is None else latency * scale,
        deadline_s=deadline * scale, outcome=outcome, mutating=bool(r["mutating"]),
        resume_required=has_next, injected=injected)


def _bystanders(inj: Injection, horizon_s: float, rng: np.random.Generator,
                scale: float) -> tuple[BystanderPlan, ...]:
    if inj.bystander_rate_per_s <= 0:
        return ()
    # Enough arrivals to outlast the agents; the executor stops issuing them when agents finish.
    span = max(BYSTANDER_MARGIN * horizon_s, 600.0 * scale)
    count = int(inj.bystander_rate_per_s * span / scale) + 1
    times = np.cumsum(rng.exponential(1.0 / inj.bystander_rate_per_s, size=count)) * scale
    return tuple(
        BystanderPlan(f"bystander-{i}", float(t), inj.bystander_prompt_tokens,
                      inj.bystander_output_tokens, stable_seed("bystander", i))
        for i, t in enumerate(times)
    )
