"""summary.json as types: the one `Summary` every writer builds and every reader gets back.

`save_summary(directory, summary)` is the only writer of summary.json and
`read_summary(directory)` its only reader; reading a file and saving it again gives the same
bytes. A summary written by an older harness lacks some keys (`absent`): their fields take
their defaults and stay out of the file when it is written again. Keys this harness does not
know (a newer harness's) are kept as they were read (`extra`) and written back unchanged.
Values are kept as read (an integer stays an integer), only their kind is checked: a field of
the wrong kind is an InputError naming the file and the key.

The headline metrics read the typed fields (harness.metrics.registry). A `Summary` is also a
read-only Mapping of its JSON form, for the sections that show summary.json's breakdowns as
they are (the HTML report's tables by tool class, pause bucket, server times, reuse).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from harness.errors import InputError
from harness.jsontypes import Json, JsonType, finite_json
from harness.records.store import SUMMARY_JSON, read_json, write_json

SUMMARY_VERSION = "3"


@dataclass(frozen=True)
class Quantiles(JsonType):
    """Percentiles of a sample: n, p50/p95/p99 (None for no sample), a mean where one is
    kept (job completion), bootstrap 95% intervals by statistic where computed (`ci95`)."""

    n: int | None = 0
    p50: float | None = None
    p95: float | None = None
    p99: float | None = None
    mean: float | None = None
    ci95: dict[str, list[float] | None] | None = None

    def at(self, stat: str) -> float | None:
        """The statistic `stat` (p50, p95, p99 or mean); None where it has none."""
        return {"p50": self.p50, "p95": self.p95, "p99": self.p99, "mean": self.mean}[stat]

    def ci_at(self, stat: str) -> list[float] | None:
        """The 95% interval of `stat`; None where none was computed."""
        return (self.ci95 or {}).get(stat)


@dataclass(frozen=True)
class Trajectories(JsonType):
    """Task counts over root trajectories (harness.metrics.outcomes.trajectory_outcomes);
    `subagent_failed` and the sub-agents' own counts (`subagents`) are in `extra`."""

    total: int | None = 0
    succeeded: int | None = 0
    cancelled: int | None = 0
    failed: int | None = 0
    interrupted: int | None = 0
    slo_violating: int | None = 0
    incomplete: int | None = 0


@dataclass(frozen=True)
class Rate(JsonType):
    """A share of judged resumes (hint honoured, keep-evictable contexts kept): `rate` of
    `judged`; the counts by pause bucket and the rest in `extra`."""

    rate: float | None = None
    judged: int | None = None


@dataclass(frozen=True)
class HintTally(JsonType):
    """Hint outcomes over some hinted pauses (harness.metrics.hint_outcomes): how many, and the
    count and share of each outcome (accepted, clipped, deferred, rejected, missing)."""

    hinted: int | None = 0
    counts: dict[str, int] = field(default_factory=dict)
    shares: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class HintOutcomes(JsonType):
    """What became of the run's hints: the tally over all hinted pauses, how many accepted
    hints had their resume judged and how many of those the reuse bore out, and the tally
    per pause-length bucket."""

    hinted: int | None = 0
    counts: dict[str, int] = field(default_factory=dict)
    shares: dict[str, float] = field(default_factory=dict)
    accepted_judged: int | None = None
    accepted_and_reused: int | None = None
    by_pause_bucket: dict[str, HintTally] = field(default_factory=dict)

    def share(self, outcome: str) -> float | None:
        """The share of hinted pauses with this outcome; None where none was hinted."""
        v = self.shares.get(outcome) if self.hinted else None
        return None if v is None else float(v)


@dataclass(frozen=True)
class OutcomeIntervals(JsonType):
    """Bootstrap 95% intervals over trajectories of the outcome metrics."""

    success_rate: list[float] | None = None
    goodput_per_min: list[float] | None = None
    memory_time_token_s: list[float] | None = None
    memory_time_mib_s: list[float] | None = None


@dataclass(frozen=True)
class HealthCheck(JsonType):
    """One health check of a run: its name, status (fail, warn, ok, info) and detail."""

    check: str | None = None
    status: str | None = None
    detail: str | None = None


@dataclass(frozen=True, eq=False)
class Summary(JsonType, Mapping[str, Any]):
    """summary.json: the headline metrics of one run (harness.metrics.summary.summarize).

    Every field is summary.json's key of the same name. Equal to another summary, or to a
    dict, with the same JSON form."""

    JSON_NAME: ClassVar[str] = SUMMARY_JSON

    runtime: str | None = None
    policy: str | None = None
    trajectories: Trajectories = field(default_factory=Trajectories)
    resume_latency_ms: Quantiles = field(default_factory=Quantiles)
    resume_parts_ms: Json = field(default_factory=dict)
    client_lag_ms: Quantiles = field(default_factory=Quantiles)
    ttft_ms: Quantiles = field(default_factory=Quantiles)
    tpot_ms: Quantiles = field(default_factory=Quantiles)
    itl_ms: Quantiles = field(default_factory=Quantiles)
    itl_source: str | None = None
    e2e_ms: Quantiles = field(default_factory=Quantiles)
    request_throughput_per_s: float | None = None
    output_token_throughput_per_s: float | None = None
    tokens_recomputed: int | None = None
    bytes_moved: int | None = None
    cache_mismatches: int | None = None
    cache_mismatch_list: list[Json] = field(default_factory=list)
    hint_honoured: Rate | None = None
    effective_retention: Rate | None = None
    # absent from summaries of records before version 6; null where no pause sent a hint
    hint_outcomes: HintOutcomes | None = None
    job_completion_s: Quantiles = field(default_factory=Quantiles)
    makespan_s: float | None = None
    memory_time_token_s: float | None = None
    memory_time_mib_s: float | None = None
    kv_paused_peak_tokens: float | None = None
    kv_paused_mean_tokens: float | None = None
    kv_active_peak_tokens: float | None = None
    kv_active_mean_tokens: float | None = None
    goodput_per_min: float | None = None
    outcome_ci95: OutcomeIntervals = field(default_factory=OutcomeIntervals)
    bystander_ttft_ms: Quantiles = field(default_factory=Quantiles)
    by_tool_class: Json = field(default_factory=dict)
    by_pause_bucket: Json = field(default_factory=dict)
    reuse: Json | None = None
    routing: Json | None = None
    server_occupancy: Json | None = None
    server_times_ms: Json | None = None
    duration_s: float | None = None
    pauses: int | None = None
    pause_actions: dict[str, int] = field(default_factory=dict)
    slo: dict[str, float] = field(default_factory=dict)
    kv_bytes_per_token: float | None = None
    warnings: list[str] = field(default_factory=list)
    health: list[HealthCheck] = field(default_factory=list)
    run_id: str | None = None
    summary_version: str | None = SUMMARY_VERSION

    def __getitem__(self, key: str) -> Any:
        if key in self.extra:
            return self.extra[key]
        if key in _KNOWN and key not in self.absent:
            return self.json_value(key)
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        yield from (k for k in SUMMARY_KEYS if k not in self.absent)
        yield from self.extra

    def __len__(self) -> int:
        return len(SUMMARY_KEYS) - len(self.absent) + len(self.extra)


# The keys of summary.json, in order (its fields'): the stable core first, then breakdowns and
# provenance.
SUMMARY_KEYS: tuple[str, ...] = Summary.json_keys()
_KNOWN = frozenset(SUMMARY_KEYS)


def save_summary(directory: Path, summary: Summary) -> None:
    """Write `summary` as the directory's summary.json (atomically); a NaN or an infinity is
    written as null and named on stderr (finite_json)."""
    write_json(directory / SUMMARY_JSON, finite_json(summary.to_json(),
                                                     str(directory / SUMMARY_JSON)))


def read_summary(directory: Path) -> Summary:
    """The directory's summary.json; InputError when it is missing or not a summary."""
    path = directory / SUMMARY_JSON
    if not path.is_file():
        raise InputError(f"{path}: no summary (the run did not finish writing its results)")
    return Summary.from_json(read_json(path), str(path))
