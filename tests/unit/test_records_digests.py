"""Every committed results directory reads to the same metrics through every records version.

tests/data/records_digests.json holds, per results directory, a digest of each table the frames
link its records into (calls, pauses, KV intervals, trajectories), by both readers (the whole
table, `read_records`, and part by part, `read_events`), and the summary.json figures that the
summary recomputed from its records matched. Regenerate it with
`python tests/unit/test_records_digests.py` only when a change is meant to alter the metrics.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from harness.metrics.frames import Frames, build_frames
from harness.metrics.summary import load_frames, summarize_dir
from harness.records.store import SUMMARY_JSON, read_records

ROOT = Path(__file__).resolve().parents[2]
DIGESTS = ROOT / "tests" / "data" / "records_digests.json"
RESULTS = sorted(p.parent.parent.relative_to(ROOT).as_posix()
                 for p in (ROOT / "reports").glob("**/records/part-00000.parquet")) + sorted(
    p.parent.parent.relative_to(ROOT).as_posix()
    for p in (ROOT / "tests" / "data").glob("**/records/part-00000.parquet"))
TABLES = ("calls", "pauses", "kv", "trajectories")


def table_digest(df: pd.DataFrame) -> str:
    """A digest of a table: its columns, their dtypes and every value (floats exactly)."""
    h = hashlib.sha256()
    h.update(repr([(str(c), str(df[c].dtype)) for c in df.columns]).encode())
    h.update(df.to_csv().encode())
    return h.hexdigest()


def frame_digests(frames: Frames) -> dict[str, str]:
    return {name: table_digest(getattr(frames, name)) for name in TABLES}


def _leaves(obj: Any, path: str = "") -> dict[str, Any]:
    if isinstance(obj, dict):
        out: dict[str, Any] = {}
        for k, v in obj.items():
            out.update(_leaves(v, f"{path}/{k}"))
        return out
    if isinstance(obj, list):
        out = {}
        for i, v in enumerate(obj):
            out.update(_leaves(v, f"{path}/{i}"))
        return out
    return {path: obj}


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return bool(a == b)


def matching_figures(directory: Path) -> list[str]:
    """The summary.json figures that the summary recomputed from the records reproduces."""
    stored = _leaves(json.loads((directory / SUMMARY_JSON).read_text()))
    summary: Any = summarize_dir(directory)
    # the summary as summary.json holds it (an object that writes itself, or a dict)
    as_json = summary.to_json() if hasattr(summary, "to_json") else summary
    fresh = _leaves(json.loads(json.dumps(as_json, default=str)))
    return sorted(k for k, v in stored.items() if k in fresh and _same(fresh[k], v))


def digests(directory: Path) -> dict[str, Any]:
    whole = frame_digests(build_frames(read_records(directory)))
    by_part = frame_digests(load_frames(directory)[0])
    return {"whole": whole, "by_part": by_part, "summary": matching_figures(directory)}


@pytest.mark.parametrize("name", RESULTS)
def test_records_read_to_the_metrics_they_always_did(name: str) -> None:
    expected = json.loads(DIGESTS.read_text())[name]
    got = digests(ROOT / name)
    assert got["whole"] == expected["whole"]
    assert got["by_part"] == expected["by_part"]
    fresh = set(matching_figures(ROOT / name))
    assert set(expected["summary"]) <= fresh, sorted(set(expected["summary"]) - fresh)


def test_every_committed_results_directory_has_digests() -> None:
    assert RESULTS and sorted(json.loads(DIGESTS.read_text())) == RESULTS


if __name__ == "__main__":
    DIGESTS.write_text(json.dumps({name: digests(ROOT / name) for name in RESULTS}, indent=1,
                                  sort_keys=True) + "\n")
    sys.exit(0)
