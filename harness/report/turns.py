"""Turn by turn: small multiples of the longest trajectories, one bar per LLM call.

On the run-time timeline a 50-turn trajectory is 50 slivers of a few pixels each. Here every
turn gets the same width whatever its duration: its bar stacks the tool wait before it
(coloured by what the policy did with the paused KV), the time to its first token (the resume,
for a call after a tool; the prefill, for a first call) and its decode, in seconds, so a turn
whose resume was slow stands out wherever it fell in the run.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.artist import Artist
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from harness.metrics.frames import NS_PER_S, Frames
from harness.report.plots import (
    ACTION_COLORS,
    OTHER_ACTION,
    PART_COLORS,
    RESUME_PARTS,
    style_axes,
    to_data_uri,
)

TURNS_CAP = 4  # trajectories shown
MIN_TURNS = 10  # below this the timeline reads well enough


def turn_table(frames: Frames, code: int) -> pd.DataFrame:
    """One trajectory's calls in order, in seconds: the tool wait before each (and its
    action); its time to first token as the slot wait and restore of a resume, then the rest
    (`first_s`: a resume's prefill, a first call's whole time to first token); its decode."""
    calls = frames.calls[frames.calls["_code"] == code].sort_values("start_ns")
    pauses = frames.pauses[frames.pauses["_code"] == code].sort_values("start_ns")
    wait = np.zeros(len(calls))
    action = [""] * len(calls)
    # the k-th pause precedes the (k+1)-th call
    for k, (_, p) in enumerate(pauses.iterrows()):
        if k + 1 < len(calls):
            wait[k + 1] = max(float(p["end_ns"] - p["start_ns"]) / NS_PER_S, 0.0) \
                if pd.notna(p["end_ns"]) else 0.0
            action[k + 1] = str(p["action"]).split("(")[0] if pd.notna(p["action"]) else ""
    first = (calls["ft_ns"] - calls["start_ns"]) / NS_PER_S
    resumed = calls["tool_end_ns"].notna() & calls["ft_ns"].notna()
    first = first.where(~resumed, (calls["ft_ns"] - calls["tool_end_ns"]) / NS_PER_S)
    decode = (calls["end_ns"] - calls["ft_ns"]) / NS_PER_S
    first = first.fillna(0.0).clip(lower=0.0)
    # a resume's slot wait and restore, the rest of its time to first token its prefill
    queue = (calls["queue_ms"].fillna(0.0).clip(lower=0.0) / 1e3).where(resumed, 0.0)
    queue = queue.where(queue < first, first)
    restore = (calls["restore_ms"].fillna(0.0).clip(lower=0.0) / 1e3).where(resumed, 0.0)
    restore = restore.where(restore < first - queue, first - queue)
    return pd.DataFrame({"wait_s": wait, "action": action, "queue_s": queue.to_numpy(),
                         "restore_s": restore.to_numpy(),
                         "first_s": (first - queue - restore).to_numpy(),
                         "decode_s": decode.fillna(0.0).clip(lower=0.0).to_numpy(),
                         "resumed": resumed.to_numpy()})


def turns(frames: Frames, cap: int = TURNS_CAP, min_turns: int = MIN_TURNS) -> str | None:
    """The `cap` agent trajectories with the most calls, one panel each; None when none has
    `min_turns` calls."""
    agent = frames.calls[~frames.calls["bystander"]]
    counts = agent.groupby("_code").size().sort_values(ascending=False, kind="stable")
    counts = counts[counts >= min_turns].head(cap)
    if counts.empty:
        return None
    names = frames.trajectories["tid"]
    fig = Figure(figsize=(11, 0.6 + 1.7 * len(counts)))
    axes = fig.subplots(len(counts), 1, squeeze=False)[:, 0]
    seen: dict[str, str] = {}
    for ax, code in zip(axes, counts.index, strict=True):
        t = turn_table(frames, int(code))
        x = np.arange(1, len(t) + 1)
        colours = [ACTION_COLORS.get(a, OTHER_ACTION) if a else OTHER_ACTION for a in t["action"]]
        for a, c in zip(t["action"], colours, strict=True):
            if a:
                seen.setdefault(a, c)
        bottom = np.zeros(len(t))
        first_colour = list(np.where(t["resumed"], PART_COLORS["resume_prefill"],
                                     PART_COLORS["prefill"]))
        for col, colour in (("wait_s", colours), ("queue_s", PART_COLORS["queue"]),
                            ("restore_s", PART_COLORS["restore"]), ("first_s", first_colour),
                            ("decode_s", PART_COLORS["decode"])):
            ax.bar(x, t[col], bottom=bottom, color=colour, width=0.8, lw=0)
            bottom = bottom + t[col].to_numpy()
        label = str(names.get(code, code))
        ax.set_title(f"{label[:40]}: {len(t)} calls", fontsize=8, loc="left")
        ax.set_ylabel("s", fontsize=8)
        ax.set_xlim(0.3, len(t) + 0.7)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        style_axes(ax)
    axes[-1].set_xlabel("turn (LLM call)")
    handles: list[Artist] = [Patch(color=c, label=f"tool wait: {a}") for a, c in seen.items()]
    handles += [Patch(color=PART_COLORS[k], label=lbl) for k, lbl in RESUME_PARTS]
    handles += [Patch(color=PART_COLORS["prefill"], label="first call's prefill"),
                Patch(color=PART_COLORS["decode"], label="decode")]
    axes[0].legend(handles=handles, loc="lower left", bbox_to_anchor=(0.0, 1.15), ncol=6,
                   fontsize=8, frameon=False)
    fig.tight_layout()
    return to_data_uri(fig)
