"""Export headline metrics for github-action-benchmark ('customSmallerIsBetter' JSON list)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.metrics.registry import HEADLINE
from harness.report.data import RunData, load_runs

FORMATS = ("github-action-benchmark",)


def benchmark_entries(run: RunData) -> list[dict[str, Any]]:
    """[{name, unit, value}] of one run, every entry smaller-is-better.

    Bigger-is-better metrics are turned around: success rate becomes the failure rate (%), and
    goodput is left out (its inverse has no useful unit). Missing values are skipped.
    """
    out: list[dict[str, Any]] = []
    for m in HEADLINE:
        value = m.value(run.summary)
        if value is None:
            continue
        if m.name == "success_rate":
            out.append({"name": f"{run.label} failure_rate", "unit": "%",
                        "value": round(100.0 * (1.0 - float(value)), 6)})
            continue
        if m.bigger_is_better:
            continue
        out.append({"name": f"{run.label} {m.name}", "unit": m.unit_in(run.summary),
                    "value": float(value)})
    return out


def export(paths: list[Path], fmt: str = "github-action-benchmark",
           slo: dict[str, float] | None = None) -> list[dict[str, Any]]:
    """The entries of every directory, in order (labels made unique across directories)."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown export format {fmt!r}")
    entries: list[dict[str, Any]] = []
    for run in load_runs(paths, slo):
        entries.extend(benchmark_entries(run))
    return entries
