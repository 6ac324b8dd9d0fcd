"""The results of a run's shards, joined into one results directory (`harness merge`)."""

from __future__ import annotations

from pathlib import Path

from harness.errors import InputError
from harness.records.merge import MergeResult, ShardInput, merge_shards
from harness.records.store import ensure_out_dir
from harness.replay.runner import write_summary


def merge_results(dirs: list[Path], out: Path) -> MergeResult:
    """Merge the shards' results directories `dirs` into `out` (records, run.json) and
    summarize it; InputError for a directory that holds no run."""
    for d in dirs:
        if not (d / "run.json").is_file():
            raise InputError(f"{d}: not a results directory (no run.json)")
    ensure_out_dir(out)
    result = merge_shards([ShardInput(d) for d in dirs], out)
    write_summary(out, result.run)
    return result
