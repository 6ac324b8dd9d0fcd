"""Trend of headline metrics over commits, with detected steps (regressions / improvements).

Runs are ordered by run.json started_at (then git_commit, then path) and grouped into series by
label (runtime/policy, and the host when the runs come from more than one machine: numbers from
two machines never make one series). Each series' metric is fitted over its whole history
with a piecewise-constant curve (harness.report.steps): a step is a change of level beyond the
threshold, significant between the pooled samples of the two levels, never a single outlying
run; one in the newest run is shown as unconfirmed until the next run.
"""

from __future__ import annotations

import html
import math
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from harness.metrics.registry import HEADLINE
from harness.records.host import host_key
from harness.report.compare import (
    DEFAULT_THRESHOLD,
    IMPROVED,
    REGRESSED,
    run_samples,
    sample_verdict,
    scalar_verdict,
)
from harness.report.data import RunData, base_label, load_run
from harness.report.fmt import fmt, table
from harness.report.plots import color, compact, style_axes, to_data_uri
from harness.report.render import CSS
from harness.report.steps import MIN_SEGMENT, level_starts, segment_medians


def order_runs(runs: list[RunData]) -> list[RunData]:
    """Chronological order: started_at, then git_commit, then directory."""
    return sorted(runs, key=lambda r: (str(r.run.started_at or ""),
                                       str(r.run.git_commit or ""), str(r.path)))


def detect_steps(
    runs: list[RunData], threshold: float = DEFAULT_THRESHOLD, seed: int = 0
) -> list[dict[str, Any]]:
    """Steps fitted over each series' whole history (harness.report.steps): {series, index,
    from, to, metric, base, new, ratio, verdict, confirmed}. `base` and `new` are the medians
    of the levels before and after; a distribution metric's step must also be significant
    between the pooled samples of the two levels; `confirmed` is False while the new level
    has a single run (the newest)."""
    steps: list[dict[str, Any]] = []
    for label in dict.fromkeys(r.label for r in runs):
        idx = [i for i, r in enumerate(runs) if r.label == label]
        samples = [run_samples(runs[i]) for i in idx]
        for m in HEADLINE:
            pts = [(k, float(v)) for k, i in enumerate(idx)
                   if (v := m.value(runs[i].summary)) is not None and math.isfinite(float(v))]
            if len(pts) < 2:
                continue
            values = [v for _, v in pts]
            starts = level_starts(values, threshold)
            meds = segment_medians(values, starts)
            bounds = [0, *starts, len(pts)]
            for s, start in enumerate(starts):
                before = [pts[k][0] for k in range(bounds[s], start)]
                after = [pts[k][0] for k in range(start, bounds[s + 2])]
                ratio, verdict = scalar_verdict(meds[s], meds[s + 1], threshold,
                                                m.bigger_is_better)
                if m.sample is not None:
                    pooled = [np.concatenate([samples[k][m.sample] for k in ks])
                              for ks in (before, after)]
                    verdict = sample_verdict(pooled[0], pooled[1], m.q, threshold, seed)[2]
                if verdict not in (REGRESSED, IMPROVED):
                    continue
                first, last_before = idx[after[0]], idx[before[-1]]
                steps.append({"series": label, "index": first, "from": commit(runs[last_before]),
                              "to": commit(runs[first]), "metric": m.name, "base": meds[s],
                              "new": meds[s + 1], "ratio": ratio, "verdict": verdict,
                              "confirmed": len(after) >= MIN_SEGMENT})
    return sorted(steps, key=lambda st: (st["index"], st["series"], st["metric"]))


def commit(r: RunData) -> str:
    """Short commit (or the directory name when run.json has none)."""
    c = r.run.git_commit
    return str(c)[:9] if c else r.path.name


def _metric_plot(runs: list[RunData], steps: list[dict[str, Any]], metric_index: int) -> str:
    """One metric over commits (x = commit in chronological order), one line per series."""
    m = HEADLINE[metric_index]
    fig = Figure(figsize=(6.4, 3.0))
    ax = fig.add_subplot()
    commits = list(dict.fromkeys(commit(r) for r in runs))
    x = {c: i for i, c in enumerate(commits)}
    labels = list(dict.fromkeys(r.label for r in runs))
    for j, label in enumerate(labels):
        pts = [(x[commit(r)], m.value(r.summary)) for r in runs if r.label == label]
        pts = [(i, v) for i, v in pts if v is not None]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=4, lw=1.5,
                    color=color(j), label=label)
    for s in steps:
        if s["metric"] != m.name or s["new"] is None:
            continue
        bad = s["verdict"] == REGRESSED
        ax.scatter([x[s["to"]]], [s["new"]], marker="^" if bad else "v", s=110, zorder=3,
                   color="#d62728" if bad else "#2ca02c", edgecolor="black", lw=0.6)
    ax.set_title(f"{m.name} ({m.unit})", fontsize=10)
    ax.yaxis.set_major_formatter(FuncFormatter(compact))
    ax.set_xticks(range(len(commits)))
    ax.set_xticklabels(commits, rotation=45, ha="right", fontsize=7)
    style_axes(ax)
    if len(labels) > 1:
        ax.legend(fontsize=7, frameon=False)
    return to_data_uri(fig)


def render_history(runs: list[RunData], threshold: float = DEFAULT_THRESHOLD) -> str:
    """The history HTML document of already loaded runs."""
    runs = order_runs(runs)
    steps = detect_steps(runs, threshold)
    imgs = "".join(f"<div><img src='{_metric_plot(runs, steps, k)}' alt='{m.name}'></div>"
                   for k, m in enumerate(HEADLINE)
                   # a metric only some runs measure is plotted where one of them does
                   if not m.optional or any(m.value(r.summary) is not None for r in runs))
    step_rows = [[html.escape(s["series"]), html.escape(s["metric"]), html.escape(s["from"]),
                  html.escape(s["to"]), fmt(s["base"]), fmt(s["new"]), fmt(s["ratio"]),
                  s["verdict"] + ("" if s["confirmed"] else " (newest run only: unconfirmed)")]
                 for s in steps]
    names = host_names(runs)
    run_rows = [[html.escape(commit(r)), html.escape(str(r.run.started_at or "-")),
                 html.escape(r.label), html.escape(names[host_key(r.run.host)]),
                 html.escape(str(r.path))] for r in runs]
    hosts_html = table(["host", "machine"], [[html.escape(n), html.escape(k or "not recorded")]
                                             for k, n in names.items()], 2)
    steps_html = table(["series", "metric", "from", "to", "before", "after", "ratio", "verdict"],
                       step_rows, 4) if step_rows else "<p class='note'>No steps detected.</p>"
    runs_html = table(["commit", "started_at", "series", "host", "dir"], run_rows, 4)
    return (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>History</title>"
            f"<style>{CSS}</style></head><body><h1>Headline metrics over commits</h1>"
            f"<p class='note'>{len(runs)} runs; a step (red ▲ regressed, green ▼ improved) is a "
            f"change of level in a series, fitted over its whole history: beyond x{threshold:g} "
            f"between the medians of the levels and significant between their pooled samples; "
            f"a single outlying run is not a step. Before / after: the levels' medians.</p>"
            f"<h2 id='steps'>Detected steps</h2>{steps_html}"
            f"<h2 id='trends'>Trends</h2><div class='grid'>{imgs}</div>"
            f"<h2 id='runs'>Runs</h2>{runs_html}<h2 id='hosts'>Hosts</h2>{hosts_html}"
            f"</body></html>")


def host_names(runs: list[RunData]) -> dict[str | None, str]:
    """A short name per distinct host (host_key) among the runs: 'host 1', 'host 2', ... in
    order of first appearance; runs that did not record theirs share 'unknown host'."""
    names: dict[str | None, str] = {}
    known = 0
    for r in runs:
        key = host_key(r.run.host)
        if key not in names:
            known += key is not None
            names[key] = "unknown host" if key is None else f"host {known}"
    return names


def series_labels(runs: list[RunData]) -> None:
    """Set each run's label to its series: runtime/policy, and the host when there are several."""
    names = host_names(runs)
    for r in runs:
        r.label = base_label(r.run, r.path)
        if len(names) > 1:
            r.label += f" @ {names[host_key(r.run.host)]}"


def history(paths: list[Path], threshold: float = DEFAULT_THRESHOLD,
            slo: dict[str, float] | None = None) -> str:
    """Load the results directories and render their history."""
    runs = [load_run(p, slo) for p in paths]
    series_labels(runs)
    return render_history(runs, threshold)
