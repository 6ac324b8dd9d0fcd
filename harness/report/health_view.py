"""The report's health section: what really ran and whether to trust it, before the numbers."""

from __future__ import annotations

import html
from collections.abc import Callable

from harness.metrics.health import FAIL, WARN
from harness.report.data import RunData
from harness.report.fmt import table

HEALTH_CSS = """
.fail{color:#b00020;font-weight:600} .warn{color:#a15c00;font-weight:600}
.ok{color:#2e7d32} .info{color:#555}
details{margin:4px 0 8px} summary{cursor:pointer;color:#444}
"""


def _row(label: str, c: dict[str, str]) -> list[str]:
    status = c["status"]
    return [label, html.escape(c["check"]), f"<span class='{status}'>{status}</span>",
            html.escape(c["detail"])]


def health_section(runs: list[RunData], run_label: Callable[[RunData], str]) -> str:
    """Problems of every run first (fail in red, warn in amber), then each run's full checks;
    `run_label` names a run in HTML."""
    problems, full = [], []
    for r in runs:
        checks = r.summary.get("health") or []
        name = run_label(r)
        problems += [_row(name, c) for c in checks if c["status"] in (FAIL, WARN)]
        rows = [_row(name, c) for c in checks]
        if rows:
            full.append(f"<details><summary>{name}: every check</summary>"
                        + table(["run", "check", "status", "detail"], rows, 4) + "</details>")
    if problems:
        top = table(["run", "check", "status", "detail"], problems, 4)
    else:
        top = "<p class='note'><span class='ok'>No problems found</span> in any run.</p>"
    note = ("<p class='note'>What ran and whether to trust it: the policy requested and "
            "what the harness and the server did with it, unsupported actions, why "
            "trajectories did not complete, the cleanup check, client lag, the instrument "
            "error, CPU pinning, calibration age, the server build and the host.</p>")
    return "<h2 id='health'>Health</h2>" + top + note + "".join(full)
