"""What became of the pauses' hints: the share of each outcome, per run and by pause length.

Every pause whose policy sends the server a hint (keep, swap, recompute, ttl) gets one outcome
(harness.policies.pin_release.HINT_OUTCOMES): accepted, clipped, deferred, rejected or missing.
The figures here count them over the run's hinted pauses (so the shares sum to 1) and per
pause-length bucket (the pause's wait, as the other breakdowns by pause length), and how many
accepted hints the resumed call's reuse bore out (`accepted_and_reused`: the accepted ones among
the resumes `retention.hint_honoured` counts honoured). A server may accept a hint and still
not reuse the context (a block evicted under it), or clip it and have the resume find the
blocks still cached: the outcome is what the server said and did, the honoured rate what the
resume measured.

None for a run without hint outcomes: records before version 6, or a policy that sends no
hint (keep-evictable). Pure functions of the frames and the judged resumes.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from harness.metrics.frames import Frames
from harness.metrics.latency import bucket_of
from harness.policies.pin_release import ACCEPTED, HINT_OUTCOMES
from harness.traces.buckets import PAUSE_BUCKETS


def _tally(status: pd.Series) -> dict[str, Any]:
    """{hinted, counts, shares} of these outcomes: every known outcome, 0 included, then any
    other the records name (a newer harness's), in order of name."""
    values = status.astype(object).fillna("missing")
    counts = {o: 0 for o in HINT_OUTCOMES}
    for name, n in values.value_counts().sort_index().items():
        counts[str(name)] = counts.get(str(name), 0) + int(n)
    hinted = int(len(values))
    return {"hinted": hinted, "counts": counts,
            "shares": {o: (n / hinted if hinted else 0.0) for o, n in counts.items()}}


def hint_outcomes(frames: Frames, judged: pd.DataFrame) -> dict[str, Any] | None:
    """The outcomes of the run's hints: {hinted, counts, shares, accepted_judged,
    accepted_and_reused, by_pause_bucket: {bucket: {hinted, counts, shares}}}; None when the
    records hold none.

    `judged`: outcomes.judge_resumes of the same frames (indexed by pause id). A hint whose
    pause has no wait (no pause of its trajectory and step) counts in the run's figures and in
    no bucket."""
    hints = frames.hints
    if not len(hints):
        return None
    out = _tally(hints["status"])
    pause = hints["pause_id"]
    accepted = pause[(hints["status"].astype(object) == ACCEPTED).to_numpy()].dropna()
    promised = judged[judged["expected"] != "either"]
    mine = promised["honoured"].reindex(accepted.to_numpy())
    out["accepted_judged"] = int(mine.notna().sum())
    out["accepted_and_reused"] = int(mine.fillna(False).astype(bool).sum())
    wait = frames.pauses["wait_s"].reindex(pause.to_numpy())
    keys = bucket_of(wait.set_axis(hints.index))
    out["by_pause_bucket"] = {
        label: _tally(hints.loc[(keys == label).to_numpy(), "status"])
        for label, _, _ in PAUSE_BUCKETS if bool((keys == label).any())}
    return out
