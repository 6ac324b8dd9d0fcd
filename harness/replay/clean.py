"""Release what a killed run left behind (its local server, its private dump folder, a
distributed run's local Ray instance), using what its run.json recorded."""

from __future__ import annotations

from pathlib import Path

from harness.adapters.launchers.process import reap_leftover, reap_recorded
from harness.errors import InputError
from harness.records.manifest import RUN_JSON_RESERVE, read_manifest


def clean_dir(results_dir: Path) -> list[str]:
    """What was released for one results directory (nothing when its run ended cleanly)."""
    if not (results_dir / "run.json").is_file():
        raise InputError(f"{results_dir}: not a results directory (no run.json)")
    run = read_manifest(results_dir)
    reserve = results_dir / RUN_JSON_RESERVE  # the disk a killed run had set aside
    freed = [f"{reserve} (disk set aside for run.json)"] if reserve.is_file() else []
    reserve.unlink(missing_ok=True)
    if run.status != "running" or not (run.server_process or run.ray_instance):
        return freed
    done = freed + (reap_leftover(run.server_process) if run.server_process else [])
    if run.ray_instance:  # a distributed run's local Ray instance (its processes, its folder)
        done += reap_recorded(str(run.ray_instance.get("tmp_dir") or ""),
                              list(run.ray_instance.get("processes") or []))
    run.status = "interrupted"  # the harness died mid-run; nothing of it runs any more
    run.write(results_dir)
    return done
