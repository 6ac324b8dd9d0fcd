"""One policy's capacity search: points measured one after another (each a bounded run whose
window figures are judged against the SLO), within a time budget, then confirmed.

`Measure` is injected: the live one replays on a server (`harness capacity`), the simulated one
runs the simulator (`harness advise`), and tests pass a function of the agent count.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.capacity.search import CapacitySearch, PointVerdict
from harness.capacity.slo import Slo
from harness.metrics.window import QUEUE_GROWTH_MIN_MS, QUEUE_GROWTH_SATURATED

CONFIRM_ABOVE = 1.25  # the count the confirmation expects to fail: this much above capacity
# The figures of a window a point keeps (harness.metrics.window.window_figures).
POINT_FIGURES = ("resume_latency_ms", "ttft_ms", "success_rate", "goodput_per_min",
                 "jobs_per_hour", "kv_paused_mean_mib", "kv_paused_mean_tokens", "queue_growth",
                 "ttft_halves_ms", "tasks", "calls", "measured_s")


@dataclass(frozen=True)
class PointSpec:
    """One measurement: `agents` closed-loop agents under a policy (`repeat` counts the
    measurements of that count; `phase` search or confirm)."""

    policy: str
    policy_args: dict[str, str]
    agents: int
    repeat: int = 1
    phase: str = "search"
    label: str = ""  # the directory the policy's points go under (default: the policy)

    def dir(self, root: Path) -> Path:
        name = f"n-{self.agents:03d}" + (f"-r{self.repeat}" if self.repeat > 1 else "")
        group = root / (self.label or self.policy)
        return group / "confirm" / name if self.phase == "confirm" else group / name


# measure(spec, out_dir) -> the window figures of that point (window.json's content)
Measure = Callable[[PointSpec, Path], dict[str, Any]]


def saturated(window: dict[str, Any]) -> bool:
    """Queues grew through the window (mean TTFT up QUEUE_GROWTH_SATURATED times and by
    QUEUE_GROWTH_MIN_MS from its first half to its second): not a steady state."""
    growth, halves = window.get("queue_growth"), window.get("ttft_halves_ms")
    return (growth is not None and growth >= QUEUE_GROWTH_SATURATED
            and halves is not None and halves[1] - halves[0] >= QUEUE_GROWTH_MIN_MS)


def judge_point(spec: PointSpec, window: dict[str, Any], slo: Slo, out: Path,
                wall_s: float) -> dict[str, Any]:
    """The point as capacity.json records it: verdict, each term, the window's figures."""
    j = slo.judge(window)
    sat = saturated(window)
    return {"agents": spec.agents, "repeat": spec.repeat, "phase": spec.phase,
            "dir": str(out), "passed": j.passed and not sat and not window.get("server_failed"),
            "server_failed": window.get("server_failed") or 0, "close": j.close,
            "saturated": sat, "judgement": list(j.rows), "text": j.text(),
            **{k: window.get(k) for k in POINT_FIGURES}, "wall_s": wall_s}


@dataclass
class SearchSettings:
    """How one policy's search runs (flags of `harness capacity`)."""

    start: int = 1
    max_agents: int = 64
    growth: float = 2.0
    resolution: float = 0.1
    confirm: bool = True
    clock: Callable[[], float] = field(default=time.monotonic)


@dataclass(frozen=True)
class SearchSpec:
    """A search as asked for: the SLO, the wall-time budget, each point's length and warm-up,
    and how each policy's search proceeds."""

    slo: Slo
    budget_s: float
    duration_s: float
    warmup_s: float
    settings: SearchSettings


def verdict_line(policy: str, p: dict[str, Any]) -> str:
    """One progress line: 'keep  n=4  resume_p95 2,300 ms (<= 2,000) -> fail'."""
    verdict = "pass" if p["passed"] else "fail (saturated)" if p["saturated"] else "fail"
    phase = " confirm" if p["phase"] == "confirm" else ""
    rep = f" #{p['repeat']}" if p["repeat"] > 1 else ""
    return f"{policy}{phase} n={p['agents']}{rep}: {p['text']} -> {verdict}"


def search_policy(spec: PointSpec, slo: Slo, measure: Measure, root: Path, budget_s: float,
                  settings: SearchSettings, on_point: Callable[[dict[str, Any]], None]
                  ) -> dict[str, Any]:
    """Search one policy (spec gives its name and arguments); returns its capacity.json entry.

    A point is started only while the budget has room for it and, with confirmation, for two
    more (the estimate of a point is the longest one so far); `on_point` is called after every
    point with the entry as it stands, so an interrupted search leaves what it measured."""
    clock = settings.clock
    t0 = clock()
    search = CapacitySearch(settings.start, settings.max_agents, settings.growth,
                            settings.resolution)
    entry: dict[str, Any] = {"policy": spec.policy, "policy_args": dict(spec.policy_args),
                             "points": [], "confirm": None}
    points: list[dict[str, Any]] = entry["points"]
    longest: list[float] = []

    def fits(n: int) -> bool:
        return not longest or clock() - t0 + n * max(longest) <= budget_s

    def run(agents: int, phase: str) -> dict[str, Any]:
        repeat = 1 + sum(p["agents"] == agents and p["phase"] == phase for p in points)
        s = PointSpec(spec.policy, spec.policy_args, agents, repeat, phase, spec.label)
        out = s.dir(root)
        began = clock()
        window = measure(s, out)
        p = judge_point(s, window, slo, out, clock() - began)
        longest.append(p["wall_s"])
        points.append(p)
        return p

    reserve = 2 if settings.confirm else 0
    while (n := search.next_agents()) is not None:
        if not fits(1 + reserve):
            search.stop("budget")
            break
        p = run(n, "search")
        search.record(PointVerdict(n, p["passed"], p["close"], p["saturated"],
                                   p["goodput_per_min"]))
        _update(entry, search)
        on_point(entry)
    _update(entry, search)
    cap = entry["capacity"]
    if settings.confirm and cap >= 1 and fits(2 if cap < settings.max_agents else 1):
        at = run(cap, "confirm")
        on_point(entry)
        above_n = max(cap + 1, math.ceil(CONFIRM_ABOVE * cap))
        above = run(above_n, "confirm") if cap < settings.max_agents else None
        entry["confirm"] = {"at": at, "above": above,
                            "confirmed": at["passed"] and (above is None or not above["passed"])}
    elif settings.confirm:
        entry["confirm_skipped"] = ("nothing passed" if cap < 1 else
                                    "the budget had no room for the two confirmation points")
    entry["at_capacity"] = _at_capacity(entry)
    entry["elapsed_s"] = clock() - t0
    on_point(entry)
    return entry


def _update(entry: dict[str, Any], search: CapacitySearch) -> None:
    r = search.result()
    entry.update({"capacity": r.capacity, "failing_above": r.failing_above,
                  "reason": r.reason})


def _at_capacity(entry: dict[str, Any]) -> dict[str, Any] | None:
    """The figures at the capacity found: its confirmation re-run, else its last search point."""
    cap = entry["capacity"]
    confirm = entry.get("confirm") or {}
    found = confirm.get("at") or next((p for p in reversed(entry["points"])
                                       if p["agents"] == cap), None)
    if found is None:
        return None
    return {"agents": cap, **{k: found.get(k) for k in ("dir", *POINT_FIGURES)}}
