"""The report's hint outcomes section: what the server did with the pauses' hints, one stacked
bar per run (the shares of accepted, clipped, deferred, rejected and missing, summing to 1)
and their counts beside it. Left out when no run has hint outcomes (records before version 6,
keep-evictable)."""

from __future__ import annotations

from collections.abc import Callable

from matplotlib.figure import Figure
from matplotlib.patches import Patch

from harness.metrics.summary_types import HintOutcomes
from harness.policies.pin_release import HINT_OUTCOMES
from harness.report.data import RunData
from harness.report.fmt import fmt, table
from harness.report.plots import style_axes, to_data_uri

# accepted green, the rest in the order of how far the server fell short of the hint
OUTCOME_COLORS = {"accepted": "#2ca02c", "clipped": "#ff7f0e", "deferred": "#ffe45c",
                  "rejected": "#d62728", "missing": "#7f7f7f"}
OTHER_OUTCOME = "#bbbbbb"


def _outcomes(hints: list[HintOutcomes]) -> list[str]:
    """The known outcomes, then any other a run names."""
    names = list(HINT_OUTCOMES)
    names += sorted({o for h in hints for o in h.counts} - set(names))
    return names


def outcome_bars(rows: list[tuple[str, HintOutcomes]]) -> str | None:
    """A horizontal stacked bar per run of its hint outcome shares; None without rows."""
    if not rows:
        return None
    names = _outcomes([h for _, h in rows])
    fig = Figure(figsize=(9, 0.9 + 0.45 * len(rows)))
    ax = fig.add_subplot()
    for y, (_, h) in enumerate(rows):
        left = 0.0
        for name in names:
            share = h.share(name) or 0.0
            if share > 0:
                ax.barh(y, share, left=left, height=0.6,
                        color=OUTCOME_COLORS.get(name, OTHER_OUTCOME), edgecolor="white")
                left += share
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([label for label, _ in rows], fontsize=8)
    ax.invert_yaxis()  # the first run on top, as in the tables
    ax.set_xlim(0.0, 1.0)
    ax.set_xlabel("share of hinted pauses")
    ax.legend(handles=[Patch(color=OUTCOME_COLORS.get(n, OTHER_OUTCOME), label=n)
                       for n in names], fontsize=7, frameon=False, ncol=len(names),
              loc="lower center", bbox_to_anchor=(0.5, 1.0))
    style_axes(ax)
    return to_data_uri(fig)


def hints_section(runs: list[RunData], run_label: Callable[[RunData], str]) -> str:
    """The chart and a table of counts; '' when no run has hint outcomes."""
    have = [(r, h) for r in runs if (h := r.summary.hint_outcomes) is not None and h.hinted]
    if not have:
        return ""
    names = _outcomes([h for _, h in have])
    uri = outcome_bars([(r.label, h) for r, h in have])
    rows = [[run_label(r), fmt(h.hinted),
             *(f"{fmt(h.counts.get(n, 0))} ({100 * (h.share(n) or 0.0):.1f}%)" for n in names),
             f"{fmt(h.accepted_and_reused)} of {fmt(h.accepted_judged)}"]
            for r, h in have]
    heads = ["run", "hinted pauses", *names, "accepted and reused"]
    note = ("<p class='note'>Every pause that sends the server a hint (keep, swap, recompute, "
            "ttl; keep-evictable sends none) has one outcome, from what the server did and "
            "said: accepted (carried out as asked until the resume), clipped (released early "
            "by the server's valve or an expiry), deferred (applied late, behind a busy "
            "engine), rejected (refused), missing (never acknowledged). Accepted and reused: "
            "accepted hints whose resumed call's cached tokens matched, of those judged.</p>")
    return (f"<h2 id='hints'>Hint outcomes</h2><img src='{uri}' alt='hint outcome shares'>"
            + table(heads, rows, 1) + note)
