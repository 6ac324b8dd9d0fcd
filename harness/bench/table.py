"""The bench's headline: a fixed-width table of the policies' summaries, and their health."""

from __future__ import annotations

from harness.metrics.health import FAIL, WARN
from harness.metrics.registry import metric
from harness.metrics.summary_types import Quantiles, Rate, Summary


def _value(name: str, s: Summary, scale: float = 1.0, spec: str = ",.0f") -> str:
    """A registry metric's value in a summary, formatted ('-' where it has none)."""
    v = metric(name).value(s)
    return "-" if v is None else format(float(v) * scale, spec)


def _lag(s: Summary) -> str:
    """The client's lag P99 (how late it woke to tool ends), ms, one decimal ('-': none)."""
    v = s.client_lag_ms.at("p99")
    return "-" if v is None else f"{float(v):.1f}"


def headline_table(rows: list[tuple[str, Summary]]) -> str:
    """A fixed-width table of the policies' summaries (the metrics as the registry defines
    them; the counts of resumes and trajectory outcomes beside them)."""
    head = (f"{'policy':<15}{'resume p50':>11}{'p95':>9}{'p99':>9}{'lag p99':>8}{'n':>5}  "
            f"{'ok':>4}{'cancel':>7}{'fail':>5}{'recomputed':>11}{'MiB moved':>10}"
            f"{'mismatch':>9}{'JCT mean s':>11}{'makespan s':>11}")
    lines = [head, "-" * len(head)]
    for policy, s in rows:
        t = s.trajectories
        lines.append(
            f"{policy:<15}{_value('resume_latency_ms.p50', s):>11}"
            f"{_value('resume_latency_ms.p95', s):>9}{_value('resume_latency_ms.p99', s):>9}"
            f"{_lag(s):>8}"
            f"{s.resume_latency_ms.n or 0:>5}  {t.succeeded or 0:>4}{t.cancelled or 0:>7}"
            f"{t.failed or 0:>5}{_value('tokens_recomputed', s):>11}"
            f"{_value('bytes_moved', s, 1 / 2**20, '.1f'):>10}"
            f"{_value('cache_mismatches', s, spec='.0f'):>9}"
            f"{_value('job_completion_s.mean', s, spec=',.1f'):>11}"
            f"{_value('makespan_s', s, spec=',.1f'):>11}")
    lines.append("(resume latency in ms: tool result available -> first token of the next call; "
                 "lag: how late the harness itself woke to tool results, ms, its own error "
                 "beside the resume figures; JCT: a task's arrival -> its last trajectory's "
                 "end, over completed tasks)")
    return "\n".join(lines)


def _rate(share: Rate | None) -> str:
    v = share.rate if share is not None else None
    return "-" if v is None else f"{100 * float(v):.0f}%"


def _ms(stats: Quantiles, q: str) -> str:
    v = stats.at(q)
    return "-" if v is None else f"{float(v):,.0f}"


def _share(s: Summary, outcome: str) -> str:
    h = s.hint_outcomes
    v = h.share(outcome) if h is not None else None
    return "-" if v is None else f"{100 * v:.0f}%"


def retention_table(rows: list[tuple[str, Summary]]) -> str | None:
    """What each policy's retention cost the run and others: whether the server honoured the
    pause's action, how many keep-evictable contexts survived, the bystanders' time to first
    token (their queue behind held contexts), goodput and the paused KV; where a run recorded
    what became of its hints, the share of hinted pauses the server clipped. None when no run
    has any of it (no judged resume, no bystander)."""
    if not any(s.hint_honoured is not None or s.effective_retention is not None
               or s.hint_outcomes is not None or s.bystander_ttft_ms.n for _, s in rows):
        return None
    # the column only where some run has hint outcomes (records before version 6 have none)
    clipped = any(s.hint_outcomes is not None for _, s in rows)
    head = (f"{'policy':<15}{'honoured':>9}{'evict kept':>11}{'byst TTFT p50':>14}{'p95':>9}"
            f"{'goodput/min':>12}{'paused KV':>11}" + (f"{'clipped':>9}" if clipped else ""))
    lines = [head, "-" * len(head)]
    for policy, s in rows:
        lines.append(
            f"{policy:<15}{_rate(s.hint_honoured):>9}{_rate(s.effective_retention):>11}"
            f"{_ms(s.bystander_ttft_ms, 'p50'):>14}{_ms(s.bystander_ttft_ms, 'p95'):>9}"
            f"{_value('goodput_per_min', s, spec='.2f'):>12}"
            f"{_value('memory_time_mib_s', s, spec=',.1f'):>11}"
            + (f"{_share(s, 'clipped'):>9}" if clipped else ""))
    lines.append("(honoured: resumes whose server-reported reuse matched the action; evict kept: "
                 "keep-evictable contexts still cached at the resume; bystander TTFT in ms; "
                 "paused KV in MiB·s, token·s where the bytes per token are unknown"
                 + ("; clipped: hinted pauses whose hint the server released early"
                    if clipped else "") + ")")
    return "\n".join(lines)


def health_lines(rows: list[tuple[str, Summary]]) -> list[str]:
    """Each policy's health problems (summary.json `health`: fail and warn), one line each."""
    out = []
    for policy, summary in rows:
        for c in summary.health:
            status = c.status or ""
            if status in (FAIL, WARN):
                out.append(f"health, {policy}: {status.upper()} {c.check}: {c.detail}")
    return out or ["health: no problems found"]
