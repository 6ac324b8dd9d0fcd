"""The one registry of headline metrics: name, unit, good direction, where the summary keeps the
value (and its 95% interval), and the samples a comparison bootstraps.

Every output that shows or judges a headline metric reads it from here: the bench table, the
report's headline and differences, `compare`, `history`, `export` and the spread between
repeats. A metric is added once, here, and appears in all of them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from harness.metrics.summary_types import Quantiles, Rate, Summary
from harness.policies.pin_release import ACCEPTED, HINT_OUTCOMES


def _success_rate(s: Summary) -> float | None:
    tr = s.trajectories
    return tr.succeeded / tr.total if tr.total and tr.succeeded is not None else None


def _memory_time(s: Summary) -> float | None:
    mib = s.memory_time_mib_s
    return float(mib) if mib is not None else s.memory_time_token_s


def _q(stats: Callable[[Summary], Quantiles], q: str) -> Callable[[Summary], float | None]:
    return lambda s: stats(s).at(q)


def _q_ci(stats: Callable[[Summary], Quantiles], q: str
          ) -> Callable[[Summary], list[float] | None]:
    return lambda s: stats(s).ci_at(q)


def _rate(share: Callable[[Summary], Rate | None]) -> Callable[[Summary], float | None]:
    return lambda s: r.rate if (r := share(s)) is not None else None


def _hint_share(outcome: str) -> Callable[[Summary], float | None]:
    return lambda s: h.share(outcome) if (h := s.hint_outcomes) is not None else None


def _hint(outcome: str) -> Metric:
    # What the server did with the pauses' hints (metrics.hint_outcomes): the share of hinted
    # pauses with this outcome; accepted is the good one, every other a hint not carried out.
    return Metric(f"hint_outcomes.shares.{outcome}", "fraction", _hint_share(outcome),
                  f"hint {outcome}", bigger_is_better=outcome == ACCEPTED, optional=True)


def _memory_ci(s: Summary) -> list[float] | None:
    ci = s.outcome_ci95
    return ci.memory_time_mib_s if s.memory_time_mib_s is not None else ci.memory_time_token_s


@dataclass(frozen=True)
class Metric:
    """A headline metric.

    `name`: its key (a summary path such as resume_latency_ms.p50); `label`: how tables head
    it; `value` / `ci`: its value and 95% interval in a summary (ci None: the summary has
    none); `sample`, `q`: the samples (per call, or per job for "jct") and the percentile a
    comparison bootstraps (q None with a sample: their mean);
    `units`: the per-trajectory values it is a mean or sum of (bootstrapped over trajectories);
    `bigger_is_better`: its good direction."""

    name: str
    unit: str
    value: Callable[[Summary], Any]
    label: str = ""
    sample: str | None = None  # "resume" | "ttft" | "e2e" | "jct"
    q: float | None = None
    bigger_is_better: bool = False
    units: str | None = None
    ci: Callable[[Summary], list[float] | None] | None = None
    # Measured only by some runs (a rate over keep-evictable pauses): a comparison leaves it
    # out where neither run has it, instead of a verdict of n/a.
    optional: bool = False

    def unit_in(self, s: Summary) -> str:
        """The unit this summary's value is in (memory-time falls back to token-seconds where
        the bytes per token are unknown)."""
        if self.name == "memory_time_mib_s" and s.memory_time_mib_s is None:
            return "token·s"
        return self.unit


def _resume_latency(s: Summary) -> Quantiles:
    return s.resume_latency_ms


def _job_completion(s: Summary) -> Quantiles:
    return s.job_completion_s


def _resume(q: str, n: int) -> Metric:
    return Metric(f"resume_latency_ms.{q}", "ms", _q(_resume_latency, q), f"resume {q.upper()}",
                  "resume", n, ci=_q_ci(_resume_latency, q))


def _jct(q: str, n: float | None) -> Metric:
    return Metric(f"job_completion_s.{q}", "s", _q(_job_completion, q),
                  f"JCT {q if q == 'mean' else q.upper()}", "jct", n,
                  ci=_q_ci(_job_completion, q))


HEADLINE: tuple[Metric, ...] = (
    _resume("p50", 50), _resume("p95", 95), _resume("p99", 99),
    Metric("ttft_ms.p50", "ms", _q(lambda s: s.ttft_ms, "p50"), "TTFT P50", "ttft", 50),
    Metric("ttft_ms.p95", "ms", _q(lambda s: s.ttft_ms, "p95"), "TTFT P95", "ttft", 95),
    Metric("e2e_ms.p50", "ms", _q(lambda s: s.e2e_ms, "p50"), "E2E P50", "e2e", 50),
    # A task (root trajectory with its sub-agents) from arrival to its last end; over the
    # jobs that completed (harness.metrics.jobs).
    _jct("mean", None), _jct("p50", 50), _jct("p95", 95), _jct("p99", 99),
    # The whole batch, first arrival to last end; None for a run that did not finish.
    Metric("makespan_s", "s", lambda s: s.makespan_s, "makespan"),
    Metric("success_rate", "fraction", _success_rate, "success", bigger_is_better=True,
           units="success"),
    Metric("goodput_per_min", "trajectories/min", lambda s: s.goodput_per_min,
           "goodput", bigger_is_better=True, units="success",
           ci=lambda s: s.outcome_ci95.goodput_per_min),
    Metric("memory_time_mib_s", "MiB·s", _memory_time, "paused KV", units="paused_token_s",
           ci=_memory_ci),
    Metric("bytes_moved", "bytes", lambda s: s.bytes_moved, "bytes moved"),
    Metric("tokens_recomputed", "tokens", lambda s: s.tokens_recomputed,
           "tokens recomputed"),
    Metric("cache_mismatches", "calls", lambda s: s.cache_mismatches,
           "cache mismatches"),
    # The share of resumed calls whose server-reported reuse matched the pause's action
    # (metrics.retention): whether the server honoured what the harness asked.
    Metric("hint_honoured.rate", "fraction", _rate(lambda s: s.hint_honoured), "hint honoured",
           bigger_is_better=True, optional=True),
    # keep-evictable only: the share of paused contexts the engine's cache still held.
    Metric("effective_retention.rate", "fraction", _rate(lambda s: s.effective_retention),
           "evictable kept", bigger_is_better=True, optional=True),
    *(_hint(o) for o in HINT_OUTCOMES),
)
METRICS: dict[str, Metric] = {m.name: m for m in HEADLINE}


def metric(name: str) -> Metric:
    """The registered metric `name` (KeyError naming the known ones otherwise)."""
    try:
        return METRICS[name]
    except KeyError:
        raise KeyError(f"no metric {name!r}; known: {', '.join(METRICS)}") from None
