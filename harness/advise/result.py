"""advice.json as types: the one `AdviceResult` `harness advise` returns and its report reads.

`save_advice(root, result)` is the only writer of advice.json and `read_advice(root)` its only
reader; reading a file and saving it again gives the same bytes. As with capacity.json
(harness.capacity.result), a key a document lacks stays out when it is written again, unknown
keys are kept as read, and a value of the wrong kind is one InputError naming the file and the
key. Every field may be None (null in the file, or absent).

The advisor builds its rows as JSON while it searches (harness.advise.candidates,
harness.advise.confirm); `AdviceResult.from_json` types them. Reading and writing is
harness.jsontypes's, by the fields' hints.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from harness.capacity.result import CapacityPoint, PointLength
from harness.jsontypes import Json, JsonType
from harness.metrics.summary_types import Quantiles
from harness.records.store import read_json, write_json

ADVICE_JSON = "advice.json"


@dataclass(frozen=True)
class Figures(JsonType):
    """A candidate's figures at its operating point: simulated (`Predicted`) or measured on
    the server (`Measured`), with the objective's value there."""

    resume_latency_ms: Quantiles | None = None
    ttft_ms: Quantiles | None = None
    success_rate: float | None = None
    goodput_per_min: float | None = None
    kv_paused_mean_mib: float | None = None
    dir: str | None = None
    capacity: int | None = None
    agents: int | None = None
    meets_slo: bool | None = None
    objective: float | None = None

    @property
    def resume_p95_ms(self) -> float | None:
        """Resume latency P95 (ms)."""
        return (self.resume_latency_ms or Quantiles()).p95


@dataclass(frozen=True)
class Predicted(Figures):
    """A candidate's simulated figures (harness.advise.candidates.simulate_candidates): every
    field."""


@dataclass(frozen=True)
class Measured(Figures):
    """A confirmed candidate's figures on the server (harness.advise.confirm.compare): no
    `dir` or `capacity`."""

    JSON_KEYS: ClassVar[tuple[str, ...] | None] = (
        "resume_latency_ms", "ttft_ms", "success_rate", "goodput_per_min", "kv_paused_mean_mib",
        "meets_slo", "objective", "agents")


@dataclass(frozen=True)
class SimulatedCandidate(JsonType):
    """A candidate searched in simulation: its policy on a server setting, its simulated
    capacity search, its operating point's figures and its rank on the objective."""

    label: str | None = None
    key: str | None = None
    policy: str | None = None
    policy_args: dict[str, str] | None = None
    engine: str | None = None
    slots: int | None = None
    ctx_per_slot: int | None = None
    kv_tokens: int | None = None
    fixed: bool | None = None
    capacity: int | None = None
    reason: str | None = None
    points: list[CapacityPoint] | None = None
    at_capacity: CapacityPoint | None = None
    agents: int | None = None
    predicted: Predicted | None = None
    rank: int | None = None
    objective: str | None = None


@dataclass(frozen=True)
class ConfirmedCandidate(JsonType):
    """A candidate measured on the server beside its prediction (harness.advise.confirm):
    the relative errors by figure, whether they are within the tolerance, and for the capacity
    objective the live search's capacity, reason and points."""

    label: str | None = None
    key: str | None = None
    fixed: bool | None = None
    agents: int | None = None
    dir: str | None = None
    predicted: Predicted | None = None
    measured: Measured | None = None
    error: dict[str, float | None] | None = None
    objective_within_tolerance: bool | None = None
    within_tolerance: bool | None = None
    live_capacity: int | None = None
    live_reason: str | None = None
    live_points: list[CapacityPoint] | None = None

    def error_of(self, *keys: str) -> float | None:
        """The first of `keys` with a numeric relative error, else None."""
        err = self.error or {}
        return next((v for k in keys if isinstance(v := err.get(k), int | float)
                     and not isinstance(v, bool)), None)


@dataclass(frozen=True)
class Recommendation(JsonType):
    """What the advisor recommends (label None: no confirmed candidate met the SLO), why,
    what the choice rests on (simulation or measurement) and its objective's values."""

    label: str | None = None
    key: str | None = None
    why: str | None = None
    rests_on: str | None = None
    measured_objective: float | None = None
    predicted_objective: float | None = None


@dataclass(frozen=True)
class BestFixed(JsonType):
    """The best fixed policy confirmed, with its objective measured and predicted."""

    label: str | None = None
    measured_objective: float | None = None
    predicted_objective: float | None = None


@dataclass(frozen=True)
class ToolClassExplain(JsonType):
    """Why, for one tool class (harness.advise.explain): its pauses, their wait and the
    context they retain (percentiles), what restoring it costs by swap and by recompute (ms),
    and the recommended policy's actions at them."""

    tool_class: str | None = None
    pauses: int | None = None
    wait_s: Json | None = None
    retained_tokens: Json | None = None
    restore_ms: Json | None = None
    actions: dict[str, int] | None = None


@dataclass(frozen=True)
class AdviceResult(JsonType):
    """advice.json: the candidates ranked in simulation, those confirmed on the server, the
    recommendation, the best fixed policy, what the simulator missed (`disagreement`), the
    explanation per tool class and the time it took (harness.advise.run.advise)."""

    JSON_NAME: ClassVar[str] = ADVICE_JSON

    kind: str | None = "advice"
    slo: str | None = None
    objective: str | None = None
    trace: str | None = None
    calibration: str | None = None
    engine: str | None = None
    block_size: int | None = None
    tolerance: float | None = None
    candidates: list[SimulatedCandidate] | None = None
    confirmed: list[ConfirmedCandidate] | None = None
    point: PointLength | None = None
    recommendation: Recommendation | None = None
    best_fixed: BestFixed | None = None
    disagreement: str | None = None
    explain: list[ToolClassExplain] | None = None
    elapsed_s: float | None = None

    def ranked(self) -> list[SimulatedCandidate]:
        """The simulated candidates, best first (as written)."""
        return list(self.candidates or [])

    def confirmations(self) -> list[ConfirmedCandidate]:
        """The candidates confirmed on the server (none without confirmation)."""
        return list(self.confirmed or [])

    def candidate(self, key: str | None) -> SimulatedCandidate | None:
        """The simulated candidate of `key`, if any."""
        return next((c for c in self.ranked() if c.key == key), None)

    @property
    def objective_missed(self) -> bool:
        """Whether a confirmation disagreed with the prediction by more than the tolerance on
        the objective."""
        confirmed = self.confirmations()
        return bool(confirmed) and not all(c.objective_within_tolerance for c in confirmed)


def save_advice(root: Path, result: AdviceResult) -> Path:
    """Write `result` as root/advice.json (the only writer of the file); returns its path."""
    path = root / ADVICE_JSON
    write_json(path, result.to_json())
    return path


def read_advice(root: Path) -> AdviceResult:
    """root/advice.json as written by save_advice (the only reader of the file); InputError
    for a file that is not a JSON object or holds a value of the wrong kind."""
    path = root / ADVICE_JSON
    return AdviceResult.from_json(read_json(path), f"{path} (not the shape harness writes)")
