"""Trend of headline metrics over commits, with detected steps (regressions / improvements).

Runs are ordered by run.json started_at (then git_commit, then path) and grouped into series by
label (runtime/policy, and the host when the runs come from more than one machine: numbers from
two machines never make one series); each run is compared with the previous run of its series
using the same noise-aware verdict as `compare`, and a step is marked where that verdict is not
'same'.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from harness.records.host import host_key
from harness.report.compare import DEFAULT_THRESHOLD, HEADLINE, IMPROVED, REGRESSED, compare_runs
from harness.report.data import RunData, base_label, load_run
from harness.report.fmt import fmt, table
from harness.report.plots import color, compact, style_axes, to_data_uri
from harness.report.render import CSS


def order_runs(runs: list[RunData]) -> list[RunData]:
    """Chronological order: started_at, then git_commit, then directory."""
    return sorted(runs, key=lambda r: (str(r.run.started_at or ""),
                                       str(r.run.git_commit or ""), str(r.path)))


def detect_steps(
    runs: list[RunData], threshold: float = DEFAULT_THRESHOLD, seed: int = 0
) -> list[dict[str, Any]]:
    """Steps between consecutive runs of each series: {series, index, from, to, metric, ...}."""
    last: dict[str, tuple[int, RunData]] = {}
    steps: list[dict[str, Any]] = []
    for i, r in enumerate(runs):
        prev = last.get(r.label)
        last[r.label] = (i, r)
        if prev is None:
            continue
        result = compare_runs(prev[1], r, threshold, seed)
        for m in result["metrics"]:
            if m["verdict"] in (REGRESSED, IMPROVED):
                steps.append({"series": r.label, "index": i, "from": commit(prev[1]),
                              "to": commit(r), "metric": m["name"], "base": m["base"],
                              "new": m["new"], "ratio": m["ratio"], "verdict": m["verdict"]})
    return steps


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
                   for k, m in enumerate(HEADLINE))
    step_rows = [[html.escape(s["series"]), html.escape(s["metric"]), html.escape(s["from"]),
                  html.escape(s["to"]), fmt(s["base"]), fmt(s["new"]), fmt(s["ratio"]),
                  s["verdict"]] for s in steps]
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
            f"change from the previous run of the same series that is significant and beyond "
            f"x{threshold:g}.</p><h2 id='steps'>Detected steps</h2>{steps_html}"
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
