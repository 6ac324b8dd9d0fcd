"""What a bench returns: every replay with its summary, and what was measured beside them (the
calibration's drift, the server's speed, the spread between repeats, the advisor's pick), so
that the caller shows it without reading back the files the bench wrote."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.advise.result import AdviceResult
from harness.metrics.summary_types import Summary
from harness.records.manifest import RunManifest


@dataclass(frozen=True)
class Replay:
    """One replay of the bench: its name (the policy, `#k` for repeat k), policy, results
    directory, run.json and summary.json; where it was simulated, the server's speed during it
    against the calibration (SERVER_SPEED_JSON's content, harness.model.run_rates)."""

    name: str
    policy: str
    out: Path
    run: RunManifest
    summary: Summary
    server_speed: dict[str, Any] | None = None


@dataclass(frozen=True)
class BenchPick:
    """The advisor's pick on the bench's server settings, in simulation (unconfirmed): the
    candidate's label and key, its predicted capacity (agents) and resume P95 there (ms)."""

    label: str
    key: str
    capacity: float
    resume_p95_ms: float | None

    @classmethod
    def of(cls, advice: AdviceResult) -> BenchPick:
        """The recommended candidate of an unconfirmed advice; ValueError where the advice
        recommends no simulated candidate with a predicted capacity."""
        rec = advice.recommendation
        chosen = advice.candidate(rec.key) if rec is not None and rec.key else None
        predicted = chosen.predicted if chosen is not None else None
        if rec is None or predicted is None or predicted.capacity is None:
            raise ValueError("the advice recommends no simulated candidate")
        return cls(str(rec.label), str(rec.key), predicted.capacity, predicted.resume_p95_ms)


@dataclass(frozen=True)
class BenchResult:
    """A bench's replays in the order they ran, and what was measured beside them: `drift`
    (calibration-drift.json, with --calibrate), `spreads` (each policy's repeats.json, with
    repeats). The advisor's pick is asked for apart (harness.bench.run.bench_pick), once the
    replays' tables are shown."""

    root: Path
    replays: list[Replay]
    drift: dict[str, Any] | None = None
    spreads: dict[str, dict[str, Any]] = field(default_factory=dict)

    def rows(self) -> list[tuple[str, Summary]]:
        """(name, summary) of every replay, for the tables."""
        return [(r.name, r.summary) for r in self.replays]

    def server_speeds(self) -> list[tuple[str, dict[str, Any]]]:
        """(policy, server speed) of the replays whose speed was measured."""
        return [(r.policy, r.server_speed) for r in self.replays if r.server_speed is not None]

    @property
    def report(self) -> Path:
        """The bench's HTML report."""
        return self.root / "report.html"
