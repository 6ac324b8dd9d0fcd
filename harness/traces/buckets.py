"""Pause-length buckets: one set of edges for every breakdown by how long a pause lasted (the
summary's by_pause_bucket, the trace's ideal reuse and the measured reuse beside it)."""

from __future__ import annotations

import numpy as np

from harness.arrays import FloatArray, IntArray

# (label, lower edge s, upper edge s): a pause of exactly an edge belongs to the bucket above it.
PAUSE_BUCKETS: tuple[tuple[str, float, float], ...] = (
    ("<0.1s", 0.0, 0.1),
    ("0.1-1s", 0.1, 1.0),
    ("1-10s", 1.0, 10.0),
    ("10-60s", 10.0, 60.0),
    (">=60s", 60.0, float("inf")),
)
PAUSE_BUCKET_LABELS: tuple[str, ...] = tuple(b[0] for b in PAUSE_BUCKETS)
# The inner edges, for searchsorted.
PAUSE_BUCKET_EDGES_S: tuple[float, ...] = tuple(b[1] for b in PAUSE_BUCKETS[1:])


def bucket_index(seconds: FloatArray) -> IntArray:
    """The bucket of each pause length (an index into PAUSE_BUCKETS); NaN gives -1."""
    arr = np.asarray(seconds, dtype="float64")
    idx: IntArray = np.searchsorted(PAUSE_BUCKET_EDGES_S, np.nan_to_num(arr), side="right")
    return np.where(np.isnan(arr), -1, idx).astype(np.int64)
