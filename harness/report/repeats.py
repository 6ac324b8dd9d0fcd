"""The spread between repeats of one run: how much a figure moves when nothing changed.

`harness run --repeats N` writes N ordinary results directories (OUT/repeat-1 ...) and, from
their summaries, OUT/repeats.json: per headline metric its value in each repeat, median, min,
max and spread ((max - min) / median). A difference between two runs smaller than the spread
between repeats of one is noise. Pure but for reading and writing the files.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from harness.metrics.registry import HEADLINE
from harness.metrics.summary_types import Summary, read_summary
from harness.records.store import SUMMARY_JSON, write_json
from harness.report.fmt import fmt

REPEATS_JSON = "repeats.json"


def repeat_dirs(root: Path, n: int) -> list[Path]:
    """The results directory of each repeat under `root`."""
    return [root / f"repeat-{k}" for k in range(1, n + 1)]


def spread(summaries: list[Summary]) -> dict[str, dict[str, Any]]:
    """Per headline metric: {unit, values, median, min, max, spread} over the summaries (a
    metric no summary has is left out; spread None where the median is 0)."""
    out: dict[str, dict[str, Any]] = {}
    for m in HEADLINE:
        values = [float(v) for s in summaries if (v := m.value(s)) is not None]
        if not values:
            continue
        med = statistics.median(values)
        lo, hi = min(values), max(values)
        out[m.name] = {"unit": m.unit, "values": values, "median": med, "min": lo, "max": hi,
                       "spread": (hi - lo) / abs(med) if med else None}
    return out


def write_repeats(root: Path, dirs: list[Path]) -> dict[str, Any]:
    """Read each repeat's summary.json and write root/repeats.json; returns its content."""
    summaries = [read_summary(d) for d in dirs if (d / SUMMARY_JSON).exists()]
    doc = {"repeats": [str(d) for d in dirs], "summaries_read": len(summaries),
           "metrics": spread(summaries)}
    write_json(root / REPEATS_JSON, doc)
    return doc


def format_spread(doc: dict[str, Any]) -> str:
    """A fixed-width table: metric, median, min, max, spread."""
    w = max([24, *(len(name) for name in doc["metrics"])])
    lines = [f"{'metric':<{w}} {'median':>12} {'min':>12} {'max':>12} {'spread':>8}"]
    for name, m in doc["metrics"].items():
        sp = f"{100 * m['spread']:.1f}%" if m["spread"] is not None else "-"
        lines.append(f"{name:<{w}} {fmt(m['median']):>12} {fmt(m['min']):>12} "
                     f"{fmt(m['max']):>12} {sp:>8}")
    lines.append(f"({doc['summaries_read']} repeats; spread = (max - min) / median)")
    return "\n".join(lines)
