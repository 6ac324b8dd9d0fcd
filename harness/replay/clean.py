"""Release what a killed run left behind (its local server, its
private dump folder), using what its run.json recorded."""

from __future__ import annotations

from pathlib import Path

from harness.adapters.launchers.process import reap_leftover
from harness.errors import InputError
from harness.records.manifest import read_manifest


def clean_dir(results_dir: Path) -> list[str]:
    """What was released for one results directory (nothing when its run ended cleanly)."""
    if not (results_dir / "run.json").is_file():
        raise InputError(f"{results_dir}: not a results directory (no run.json)")
    run = read_manifest(results_dir)
    if run.status != "running" or not run.server_process:
        return []
    done = reap_leftover(run.server_process)
    run.status = "interrupted"  # the harness died mid-run; nothing of it runs any more
    run.write(results_dir)
    return done
