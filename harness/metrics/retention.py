"""Whether the server did what each pause asked, measured by its own count of reused tokens.

No engine tells a client whether a retention hint was honoured. The harness judges every
resumed call against its pause's action (`outcomes.judge_resumes`) and reports:
- the hint-honoured rate: of the resumed calls whose action promises an outcome (keep and
  swap: the context reused; recompute: nothing reused), the share where the server's reuse
  matched, per run and per pause-length bucket;
- the effective retention of keep-evictable: how many paused contexts the engine's own cache
  still held at the resume, by pause length, and the longest pause one survived (the
  retention the run's load actually gave, which no setting states).
Pure functions of the judged calls.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from harness.metrics.latency import bucket_of
from harness.traces.buckets import PAUSE_BUCKETS


def _rate(k: int, n: int) -> float | None:
    return k / n if n else None


def _by_bucket(rows: pd.DataFrame, flag: str, name: str) -> dict[str, dict[str, Any]]:
    """Per pause-length bucket with any rows: judged, the count where `flag`, its rate."""
    keys = bucket_of(rows["wait_s"])
    out: dict[str, dict[str, Any]] = {}
    for label, _, _ in PAUSE_BUCKETS:
        mine = rows[(keys == label).to_numpy()]
        if len(mine):
            k = int(mine[flag].sum())
            out[label] = {"judged": int(len(mine)), name: k, "rate": _rate(k, len(mine))}
    return out


def hint_honoured(judged: pd.DataFrame) -> dict[str, Any] | None:
    """The share of resumed calls whose server-reported reuse matched a pause action that
    promises one (keep, swap, recompute, ttl); None when no call was judged."""
    rows = judged[judged["expected"] != "either"]
    if not len(rows):
        return None
    k = int(rows["honoured"].sum())
    return {"rate": _rate(k, len(rows)), "judged": int(len(rows)), "honoured": k,
            "by_pause_bucket": _by_bucket(rows, "honoured", "honoured")}


def effective_retention(judged: pd.DataFrame) -> dict[str, Any] | None:
    """How many keep-evictable contexts were still reused whole at their resume, by pause
    length; None when the run had no keep-evictable pause with a reported reuse."""
    rows = judged[judged["action"].astype(object) == "keep-evictable"]
    if not len(rows):
        return None
    survived = rows[rows["reused"]]
    lost = rows[~rows["reused"]]
    k = int(len(survived))
    return {"rate": _rate(k, len(rows)), "judged": int(len(rows)), "survived": k,
            "by_pause_bucket": _by_bucket(rows, "reused", "survived"),
            "longest_survived_s": float(survived["wait_s"].max()) if k else None,
            "shortest_lost_s": float(lost["wait_s"].min()) if len(lost) else None}
