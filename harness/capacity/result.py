"""capacity.json as types: the one `CapacityResult` a capacity search returns and its report
reads, one `PolicyResult` per policy searched, each point a `CapacityPoint`.

`save_capacity(root, result)` is the only writer of capacity.json and `read_capacity(root)` its
only reader; reading a file and saving it again gives the same bytes. As with summary.json
(harness.metrics.summary_types), a key a document lacks stays out when it is written again
(`absent`), keys this harness does not know are kept as read (`extra`), values are kept as
read and only their kind is checked: a value of the wrong kind is one InputError naming the
file and the key. Every field may be None (null in the file, or absent).

The search itself (harness.capacity.driver) builds the document as JSON while it runs;
`CapacityResult.from_json` types it. Reading and writing is harness.jsontypes's, by the fields'
hints.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from harness.jsontypes import JsonType
from harness.metrics.summary_types import Quantiles
from harness.records.store import read_json, write_json

CAPACITY_JSON = "capacity.json"


@dataclass(frozen=True)
class JudgedTerm(JsonType):
    """One SLO term judged on a point: its bound, the point's value, how far inside the bound
    (negative: broken), whether it was met, the value's 95% interval and whether the bound lies
    inside it (harness.capacity.slo.Slo.judge)."""

    term: str | None = None
    bound: float | None = None
    value: float | None = None
    margin: float | None = None
    met: bool | None = None
    ci95: list[float | None] | None = None
    bound_in_ci: bool | None = None


@dataclass(frozen=True)
class CapacityPoint(JsonType):
    """One measured point (harness.capacity.driver.judge_point): `agents` closed-loop agents,
    its verdict against the SLO and the window's figures. The figures at a policy's capacity
    (`PolicyResult.at_capacity`) are one too, with only agents, dir and the figures."""

    agents: int | None = None
    repeat: int | None = None
    phase: str | None = None
    dir: str | None = None
    passed: bool | None = None
    server_failed: int | None = None
    close: bool | None = None
    saturated: bool | None = None
    judgement: list[JudgedTerm] | None = None
    text: str | None = None
    resume_latency_ms: Quantiles | None = None
    ttft_ms: Quantiles | None = None
    success_rate: float | None = None
    goodput_per_min: float | None = None
    jobs_per_hour: float | None = None
    kv_paused_mean_mib: float | None = None
    kv_paused_mean_tokens: float | None = None
    queue_growth: float | None = None
    ttft_halves_ms: list[float] | None = None
    tasks: Any = None  # the window's task counts, as it gives them
    calls: Any = None
    measured_s: float | None = None
    wall_s: float | None = None

    def terms(self) -> list[JudgedTerm]:
        """The judged terms (none where the point has no judgement)."""
        return list(self.judgement or [])

    def verdict(self) -> bool | None:
        """Saturated fails; else `passed`, else every term met (None: unknown)."""
        if self.saturated is True:
            return False
        if self.passed is not None:
            return self.passed
        terms = self.terms()
        return all(t.met is True for t in terms) if terms else None


@dataclass(frozen=True)
class Confirmation(JsonType):
    """A policy's confirmation: its capacity measured again (`at`) and the count above it
    (`above`, None at max agents), and whether they agreed with the search."""

    at: CapacityPoint | None = None
    above: CapacityPoint | None = None
    confirmed: bool | None = None


@dataclass(frozen=True)
class PolicyResult(JsonType):
    """One policy's search (harness.capacity.driver.search_policy): every point, the capacity
    found, the smallest failing count above it, why the search stopped, its confirmation (or
    why it was skipped), the figures at capacity and the time it took."""

    policy: str | None = None
    policy_args: dict[str, str] | None = None
    points: list[CapacityPoint] | None = None
    confirm: Confirmation | None = None
    capacity: int | None = None
    failing_above: int | None = None
    reason: str | None = None
    confirm_skipped: str | None = None
    at_capacity: CapacityPoint | None = None
    elapsed_s: float | None = None

    def measured(self) -> list[CapacityPoint]:
        """The points measured (none where it has none)."""
        return list(self.points or [])

    @property
    def contradicted(self) -> bool:
        """Whether a confirmation ran and contradicted the search."""
        return self.confirm is not None and not self.confirm.confirmed


@dataclass(frozen=True)
class SloTerm(JsonType):
    """One term of the search's SLO: its name, bound (ms for a latency) and kind ('latency'
    or 'fraction')."""

    term: str | None = None
    bound: float | None = None
    kind: str | None = None


@dataclass(frozen=True)
class PointLength(JsonType):
    """How long each point ran and how much of its start was dropped as warm-up."""

    duration_s: float | None = None
    warmup_s: float | None = None


@dataclass(frozen=True)
class CapacityResult(JsonType):
    """capacity.json: a capacity search of one or more policies on a server under an SLO
    (harness.capacity.run.run_capacity), each policy's result by its name."""

    JSON_NAME: ClassVar[str] = CAPACITY_JSON

    kind: str | None = "capacity"
    slo: str | None = None
    slo_terms: list[SloTerm] | None = None
    trace: str | None = None
    runtime: str | None = None
    url: str | None = None
    point: PointLength | None = None
    budget_s: float | None = None
    started_at: str | None = None
    slots: int | None = None
    ctx_per_slot: int | None = None
    policies: dict[str, PolicyResult] | None = None
    elapsed_s: float | None = None

    def searched(self) -> list[tuple[str, PolicyResult]]:
        """(name, result) of every policy searched, in the order searched."""
        return list((self.policies or {}).items())

    @property
    def contradicted(self) -> bool:
        """Whether any policy's confirmation contradicted its search."""
        return any(p.contradicted for _, p in self.searched())


def save_capacity(root: Path, result: CapacityResult) -> Path:
    """Write `result` as root/capacity.json (the only writer of the file); returns its path."""
    path = root / CAPACITY_JSON
    write_json(path, result.to_json())
    return path


def read_capacity(root: Path) -> CapacityResult:
    """root/capacity.json as written by save_capacity (the only reader of the file);
    InputError for a file that is not a JSON object or holds a value of the wrong kind."""
    path = root / CAPACITY_JSON
    return CapacityResult.from_json(read_json(path), f"{path} (not the shape harness writes)")
