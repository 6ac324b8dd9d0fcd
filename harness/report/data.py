"""Load a results directory once: records linked into frames, its summary, optional extras."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from harness.errors import InputError
from harness.metrics.frames import Frames
from harness.metrics.occupancy import server_kv_tokens
from harness.metrics.outcomes import check_slo
from harness.metrics.summary import load_frames, summarize_frames
from harness.metrics.summary_types import Summary, save_summary
from harness.records.manifest import RunManifest
from harness.records.store import read_json

PREDICTION_JSON = "prediction.json"


@dataclass
class RunData:
    """One results directory, read and summarised."""

    path: Path
    run: RunManifest
    frames: Frames
    summary: Summary
    prediction: dict[str, Any] | None = None
    label: str = field(default="")
    # the server's own count of KV tokens over time (label, t_ns/tokens), where it reports one
    server_kv: tuple[str, pd.DataFrame] | None = None
    # what could not be read of a damaged directory and was left out (salvage)
    damage: list[str] = field(default_factory=list)

    @property
    def simulated(self) -> bool:
        return str(self.run.runtime or "").lower() == "simulator"


def load_run(
    path: Path | str, slo: dict[str, float] | None = None, write_summary: bool = False,
    salvage: bool = False,
) -> RunData:
    """Read a results directory; with write_summary, (re)write its summary.json. With salvage,
    a damaged directory whose records still partly read is summarised from what reads, the rest
    said in `damage` and in its health (and its summary.json left as it was)."""
    path = Path(path)
    damage: list[str] | None = [] if salvage else None
    frames, run, server = load_frames(path, damage)
    summary = summarize_frames(frames, run, server, check_slo(slo), damage=damage or ())
    if write_summary and not damage:
        save_summary(path, summary)
    prediction = None
    pred_path = path / PREDICTION_JSON
    if pred_path.is_file():
        try:
            prediction = read_json(pred_path)
        except ValueError as exc:
            raise InputError(f"{pred_path}: not valid JSON ({exc})") from None
    return RunData(path, run, frames, summary, prediction, base_label(run, path),
                   server_kv_tokens(server), damage or [])


def base_label(run: RunManifest, path: Path) -> str:
    """'runtime/policy' from run.json, or the directory name when neither is known."""
    runtime, policy = run.runtime, run.policy
    if runtime is None and policy is None:
        return path.name
    return f"{runtime or '?'}/{policy or '?'}"


def load_runs(
    paths: list[Path], slo: dict[str, float] | None = None, write_summary: bool = False,
    salvage: bool = False,
) -> list[RunData]:
    """Several directories, labels made unique by appending the directory name."""
    runs = [load_run(p, slo, write_summary, salvage) for p in paths]
    counts: dict[str, int] = {}
    for r in runs:
        counts[r.label] = counts.get(r.label, 0) + 1
    for r in runs:
        if counts[r.label] > 1:
            r.label = f"{r.label} ({r.path.name})"
    return runs
