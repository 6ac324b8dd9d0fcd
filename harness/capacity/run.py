"""A capacity search: the most concurrent agents a server holds under an SLO, per policy.

Each point is an ordinary results directory (`<out>/<policy>/n-004/`, a bounded replay with
window.json), so `report` and `compare` work on it; `<out>/capacity.json` holds the search
(rewritten after every point) and `<out>/report.html` its curve, then the runs at capacity.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from harness.adapters.base import Runtime
from harness.adapters.runtimes import get_runtime
from harness.capacity.budget import Budget
from harness.capacity.driver import (
    PointSpec,
    SearchSettings,
    SearchSpec,
    search_policy,
    verdict_line,
)
from harness.capacity.live import live_measure, nan_free
from harness.capacity.result import (
    CapacityPoint,
    CapacityResult,
    PolicyResult,
    read_capacity,
    save_capacity,
)
from harness.capacity.slo import Slo
from harness.capacity.view import capacity_section
from harness.metrics.summary_types import Quantiles
from harness.records.atomic import write_text_atomic
from harness.records.store import ensure_out_dir
from harness.replay.named_policies import policy_names, scoped_policy_args
from harness.replay.options import RunOptions
from harness.replay.run import to_stderr
from harness.report.data import load_runs
from harness.report.render import render_runs
from harness.traces.shipped import shipped_trace
from harness.traces.validate import load_trajectories


@dataclass(frozen=True)
class CapacityPlan:
    """A capacity search, validated before its first point."""

    root: Path
    trace: Path
    slo: Slo
    policies: tuple[tuple[str, dict[str, str]], ...]
    base: RunOptions
    budget_s: float
    duration_s: float
    warmup_s: float
    settings: SearchSettings


def policy_list(policies: str, policy_args: tuple[str, ...], runtime: Runtime | None = None
                ) -> list[tuple[str, dict[str, str]]]:
    """The policies to search with their arguments; InputError for an unknown or repeated one
    (`runtime`'s server policies are known too)."""
    names = policy_names(policies, runtime)
    args = scoped_policy_args(names, policy_args)
    return [(p, args[p]) for p in names]


def plan_capacity(policies: str, policy_args: tuple[str, ...], trace: Path | None,
                  search: SearchSpec, base: RunOptions, out: Path | None) -> CapacityPlan:
    """A capacity search of `policies` (comma-separated, with their `--policy-arg`s) on the
    server `base` reaches, checked: InputError for an unknown policy, a bad argument or a
    trace that cannot be read, before the first point."""
    pols = policy_list(policies, policy_args, get_runtime(base.runtime))
    trace = trace or shipped_trace()
    load_trajectories(trace)
    root = out or Path("reports") / f"capacity-{datetime.now(UTC):%Y%m%dT%H%M%SZ}"
    return CapacityPlan(root, trace, search.slo, tuple(pols), replace(base, trace=trace),
                        search.budget_s, search.duration_s, search.warmup_s, search.settings)


def run_capacity(plan: CapacityPlan, echo: Callable[[str], None] = print,
                 runtime: Runtime | None = None) -> CapacityResult:
    """Search every policy of the plan on its server (`runtime`, default the registry's);
    returns the result capacity.json holds (rewritten after every point)."""
    budget = Budget(plan.budget_s, plan.settings.clock)
    doc: dict[str, Any] = {
        "kind": "capacity", "slo": plan.slo.spec(),
        "slo_terms": [{"term": t.name, "bound": t.bound, "kind": t.kind}
                      for t in plan.slo.terms],
        "trace": str(plan.trace), "runtime": plan.base.runtime, "url": plan.base.url,
        "point": {"duration_s": plan.duration_s, "warmup_s": plan.warmup_s},
        "budget_s": plan.budget_s, "started_at": datetime.now(UTC).isoformat(),
        "slots": plan.base.slots, "ctx_per_slot": plan.base.ctx_per_slot,
        "policies": {}}
    measure = live_measure(plan.base, runtime or get_runtime(plan.base.runtime),
                           plan.duration_s, plan.warmup_s, to_stderr)
    ensure_out_dir(plan.root)

    shown: dict[str, int] = {}

    def save(entry: dict[str, Any]) -> None:
        doc["policies"][entry["policy"]] = entry
        doc["elapsed_s"] = budget.elapsed_s()
        save_capacity(plan.root, CapacityResult.from_json(nan_free(doc)))
        for p in entry["points"][shown.get(entry["policy"], 0):]:  # each point once
            echo(f"[{budget.elapsed_s():5.0f}s / {plan.budget_s:.0f}s] "
                 + verdict_line(entry["policy"], p))
        shown[entry["policy"]] = len(entry["points"])

    for i, (policy, args) in enumerate(plan.policies):
        share = budget.share_s(len(plan.policies) - i)
        echo(f"[{budget.elapsed_s():5.0f}s / {plan.budget_s:.0f}s] {policy}: searching "
             f"(up to {share:.0f}s)")
        search_policy(PointSpec(policy, args, 0), plan.slo, measure, plan.root, share,
                      plan.settings, save)
    doc["elapsed_s"] = budget.elapsed_s()
    result = CapacityResult.from_json(nan_free(doc))
    save_capacity(plan.root, result)
    write_capacity_report(plan.root, result)
    return result


def write_capacity_report(root: Path, result: CapacityResult, out: Path | None = None) -> Path:
    """report.html (or `out`): the capacity section, then the runs at each policy's
    capacity."""
    dirs = [Path(p.at_capacity.dir) for _, p in result.searched()
            if p.at_capacity is not None and p.at_capacity.dir]
    runs = load_runs([d for d in dirs if d.is_dir()])
    html = render_runs(runs, lead=capacity_section(result), title="Capacity under an SLO")
    out = out or root / "report.html"
    write_text_atomic(out, html)
    return out


def rewrite_capacity_report(root: Path, out: Path | None = None) -> Path:
    """report.html (or `out`) of the capacity search whose capacity.json is in `root`."""
    return write_capacity_report(root, read_capacity(root), out)


def _policy_line(policy: str, e: PolicyResult) -> str:
    at = e.at_capacity or CapacityPoint()
    r = at.resume_latency_ms or Quantiles()
    hi = e.failing_above
    interval = f"{e.capacity}-{hi - 1}" if hi is not None else f">={e.capacity}"
    c = e.confirm
    skipped = "off" if "confirm_skipped" in e.absent else e.confirm_skipped
    conf = "yes" if c and c.confirmed else "NO" if c else f"- ({skipped})"

    def f(v: Any, spec: str = ",.0f") -> str:
        return "-" if v is None else format(v, spec)

    return (f"{policy:<11}{e.capacity:>9}{interval:>10}{f(r.p50):>11}"
            f"{f(r.p95):>8}{f(r.p99):>8}"
            f"{f(at.success_rate, '.2f'):>8}"
            f"{f(at.goodput_per_min, '.1f'):>12}"
            f"{f(at.jobs_per_hour, ',.0f'):>8}  {conf} ({e.reason})")


def result_table(result: CapacityResult) -> str:
    """The headline: per policy, capacity, interval, figures there, confirmation."""
    head = (f"{'policy':<11}{'capacity':>9}{'interval':>10}{'resume p50':>11}{'p95':>8}"
            f"{'p99':>8}{'success':>8}{'goodput/min':>12}{'jobs/h':>8}  confirmed")
    lines = [head, "-" * len(head)]
    lines += [_policy_line(policy, e) for policy, e in result.searched()]
    lines.append("(resume latency in ms at capacity; interval: the largest count that met the "
                 "SLO to the one below the smallest that did not)")
    return "\n".join(lines)
