"""How a command ends when its work finished but something in it did not go as it should:
the exit codes beyond 2 (bad input) and 3 (a server problem), each with its one line."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from harness.records.manifest import Outcome, RunManifest

# The run finished, but trajectories failed because the server did (not the task's own fault).
SERVER_FAILURES_EXIT = 4
# A confirmation re-run (capacity, advise) contradicted the search or the prediction.
CONFIRM_FAILED_EXIT = 5


def exit_on_server_failures(runs: list[RunManifest]) -> None:
    """Exit SERVER_FAILURES_EXIT, with one line, when a run lost trajectories to the server."""
    lost = {str(r.policy): r.outcome.server_failed for r in runs
            if r.outcome is not None and r.outcome.server_failed}
    if lost:
        which = ", ".join(f"{p}: {n}" for p, n in lost.items())
        click.echo(f"error: trajectories failed because the server failed ({which}); "
                   "the results are kept", err=True)
        sys.exit(SERVER_FAILURES_EXIT)


def exit_confirm_failed(message: str) -> None:
    """Exit CONFIRM_FAILED_EXIT with `message` as its one line."""
    click.echo(f"error: {message}; the results are kept", err=True)
    sys.exit(CONFIRM_FAILED_EXIT)


def print_result(out: Path, run: RunManifest) -> None:
    """A run's outcome in one line, and a warning when its cleanup was incomplete."""
    o = run.outcome or Outcome()
    click.echo(f"{run.policy}: {o.completed} completed, {o.cancelled} cancelled, "
               f"{o.failed} failed in {run.duration_s or 0:.1f}s -> {out}")
    if run.cleanup and (undone := run.cleanup.problems()):
        click.echo(f"warning: cleanup incomplete: {'; '.join(undone)}; details in "
                   f"{out / 'run.json'} (cleanup)", err=True)
