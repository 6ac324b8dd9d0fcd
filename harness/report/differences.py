"""The report's table of differences: every other run against a baseline run, metric by metric.

The same judgement `harness compare` gives (the bootstrap 95% CI of NEW/BASE, then the
threshold), shown for all runs of a report at once, with the aspects in which each run differs
from the baseline listed above its table: in a bench the policy differs by design, and anything
else that differs (host, trace, server) is said, since it shares the credit for the change.
"""

from __future__ import annotations

import html
from collections.abc import Callable

from harness.report.comparable import differences
from harness.report.compare import DEFAULT_THRESHOLD, IMPROVED, REGRESSED, compare_runs
from harness.report.data import RunData
from harness.report.fmt import fmt, table

CSS = ".better{color:#1b7f3b;font-weight:600} .worse{color:#b00020;font-weight:600}"
_WORDS = {REGRESSED: "worse", IMPROVED: "better"}  # each also its CSS class


def differences_section(runs: list[RunData], label: Callable[[RunData], str],
                        baseline: int = 0, threshold: float = DEFAULT_THRESHOLD) -> str:
    """The section for `runs` against `runs[baseline]` ('' for a single run)."""
    if len(runs) < 2:
        return ""
    base = runs[baseline]
    parts = [f"<h2 id='differences'>Differences against {label(base)}</h2>",
             "<p class='note'>Each run's headline metrics over the baseline's: ratio NEW/BASE "
             "with its bootstrap 95% interval (over calls for latency percentiles, over "
             "trajectories for success, goodput and memory-time). A difference is called better "
             f"or worse only when the interval excludes 1 and the ratio is beyond x{threshold:g} "
             "(as <code>harness compare</code> judges); otherwise it is within the noise.</p>"]
    for i, run in enumerate(runs):
        if i == baseline:
            continue
        result = compare_runs(base, run, threshold)
        diffs = differences(base.run, run.run)
        said = "; ".join(html.escape(d.describe()) for d in diffs) or "nothing recorded"
        parts.append(f"<h3>{label(run)}</h3><p class='note'>differs from the baseline in: "
                     f"{said}</p>")
        rows = []
        for m in result["metrics"]:
            ci = m["ci95"]
            word = _WORDS.get(m["verdict"])
            verdict = (f"<span class='{word}'>{word}</span>" if word
                       else html.escape(m["verdict"]))
            rows.append([html.escape(m["name"]), html.escape(m["unit"]), fmt(m["base"]),
                         fmt(m["new"]),
                         f"{m['ratio']:.3f}" if m["ratio"] is not None else "-",
                         f"[{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "-", verdict])
        parts.append(table(["metric", "unit", "baseline", "this run", "ratio", "95% CI",
                            "verdict"], rows, text_cols=2))
    return "".join(parts)
